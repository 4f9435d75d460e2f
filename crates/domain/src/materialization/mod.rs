//! Materialization: which queries can be stored as a pre-computed result, the records and stored results of
//! those that are, and the refresh side that keeps them current.

mod model;
mod ports;
mod service;

pub use model::{
    attempt_location, endpoint_location, Claim, Coverage, Eligibility, Fold, MaterializationState,
    MaterializationStatus, MaterializationView, MaterializedFilter, Rollup, RollupColumn, Stored,
    StoredColumn, StoredResult, Switch,
};
pub use ports::{MaterializationPorts, MaterializationRecords, ResultStorage};
#[cfg(any(test, feature = "mocks"))]
pub use ports::{MockMaterializationRecords, MockResultStorage};
pub use service::{RefreshDeps, RefreshOutcome, RefreshService, RETRY_AFTER_FAILURE};
