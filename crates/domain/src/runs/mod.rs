//! Runs: the run request and its refresh modes, the result cache, coalescing of identical computations,
//! answers from stored results, each run's record, and the last-execution-times lookup.

mod cursor;
mod last_executions;
mod logs;
mod model;
mod ports;
mod record;
mod service;

pub use cursor::Cursor;
pub use last_executions::{six_months_before, LastExecutions, LastExecutionsRequest, MAX_NAMES};
pub use logs::{LogService, Ran};
pub use model::{CacheKey, CachedRun, Exported, Refresh, RunOutcome, RunRequest};
#[cfg(any(test, feature = "mocks"))]
pub use ports::MockResultCache;
pub use ports::ResultCache;
pub use record::{RunBy, CANCELLED};
pub use service::{RunDeps, RunService};
