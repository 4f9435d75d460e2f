//! The API's bodies as Rust types, one per shape, as `crates_io_api_types` keeps them: responses are built
//! `From` domain values and serialized as they are, and their `utoipa` schemas are the ones `/api/schema` and
//! each endpoint's own document publish. Request bodies are read by the domain; their schemas are in
//! `requests`. The error body is with the error codes, in `crate::error`.
//!
//! The endpoint and table records, their pages, a table's preview, a run's answer ([`RunResult`]) and an
//! endpoint's log and usage are read back too (`Deserialize`, public):
//! the `endpoints code` CLI reads the server's answers as these types, so that it never holds a copy of them,
//! and the API tests decode answers into them.

mod endpoint;
mod last_executions;
mod log;
pub(crate) mod names;
mod page;
mod project;
pub(crate) mod requests;
mod run;
mod table;
mod token;

pub use endpoint::{BreakingChange, Column, Endpoint, Materialization, Query, Variable, Version};
pub use last_executions::{LastExecutionTimes, QueryProgress, QueryStatus};
pub use log::{LogEntry, LogKindName, LogList, LogSourceName, TransportName, Usage, UsageBucketBody};
pub use page::EndpointPage;
pub use page::{TablePage, TableVersionPage, VersionPage};
pub use project::Project;
pub(crate) use run::RunAnswer;
pub use run::{Computed, PerRequest, RunResult, RunStatistics, Timings};
pub use table::{Appended, Column as TableColumn, Layout as TableLayout, Preview, Table, TableVersion};
pub use token::RunToken;

/// A duration in milliseconds, to the microsecond.
fn millis(duration: std::time::Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1_000.0
}
