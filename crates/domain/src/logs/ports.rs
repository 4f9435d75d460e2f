//! The run log port: where records go, and how they are read back.

use async_trait::async_trait;

use super::model::{LogFilter, LogRecord, UsageBucket, UsageQuery};
use crate::access::ProjectId;
use crate::error::EngineError;

/// The log of runs and refreshes, per project.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait RunLog: Send + Sync {
    /// Takes a record to be written with others later. Never blocks and never fails: a record that cannot be
    /// kept (the buffer is full) is counted as dropped by the adapter.
    fn record(&self, record: LogRecord);

    /// The endpoint's records that `filter` keeps, newest first (ties by id, descending): up to
    /// `filter.limit + 1`, so that the caller sees whether there are more.
    async fn records(
        &self,
        project: ProjectId,
        endpoint: &str,
        filter: &LogFilter,
    ) -> Result<Vec<LogRecord>, EngineError>;

    /// The usage of the endpoint's runs (not its refreshes) in the query's buckets.
    async fn usage(
        &self,
        project: ProjectId,
        endpoint: &str,
        query: &UsageQuery,
    ) -> Result<Vec<UsageBucket>, EngineError>;
}

/// A log that keeps nothing: for a service run with logging off, and for embedders that need none.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRunLog;

#[async_trait]
impl RunLog for NoRunLog {
    fn record(&self, _: LogRecord) {}

    async fn records(&self, _: ProjectId, _: &str, _: &LogFilter) -> Result<Vec<LogRecord>, EngineError> {
        Ok(Vec::new())
    }

    async fn usage(
        &self,
        _: ProjectId,
        _: &str,
        query: &UsageQuery,
    ) -> Result<Vec<UsageBucket>, EngineError> {
        Ok(super::model::UsageAccumulator::new(*query).finish())
    }
}
