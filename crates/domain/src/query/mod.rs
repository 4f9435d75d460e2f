//! Queries: the saved SQL with its typed variables, binding the values a run supplies, and what the engine
//! tells of a query when it plans or runs it.

mod binding;
mod export;
mod model;
mod plan;
mod ports;
mod snapshot;
mod variables;

pub use binding::{bind, coerce, read_value, BoundValue, ValueForm};
pub use export::{Export, ResultFormat};
pub use model::{is_variable_name, scan_placeholders, Placeholder, Query, QueryKind, PLACEHOLDER_OPEN};
pub use plan::{
    AggregateCall, AggregateKind, Column, ColumnType, CompareOp, QueryDescription, QueryOutline, QueryResult,
    Statistics, VariablePredicate,
};
#[cfg(any(test, feature = "mocks"))]
pub use ports::MockQueryEngine;
pub use ports::QueryEngine;
pub use snapshot::{ReadAt, TableVersion};
pub use variables::{Variable, VariableType};
