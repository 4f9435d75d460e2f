//! Run logs: a record of every run and refresh (never a variable's value), read back per endpoint as a listing
//! and as usage buckets with latency percentiles.

mod model;
mod ports;

pub use model::{
    is_error_status, unix_micros, Interval, LogCursor, LogFilter, LogKind, LogPage, LogRecord, LogSource,
    StatusFilter, Transport, UsageAccumulator, UsageBucket, UsageQuery, UsageSample,
};
#[cfg(any(test, feature = "mocks"))]
pub use ports::MockRunLog;
pub use ports::{NoRunLog, RunLog};
