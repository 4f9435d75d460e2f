//! Reading an endpoint's run log: a listing of its records and its usage, for callers who may read it.

use std::sync::Arc;

use crate::access::ProjectId;
use crate::clock::{Clock, Timestamp};
use crate::endpoints::{EndpointName, EndpointStore};
use crate::error::{Error, StoreError};
use crate::logs::{Interval, LogFilter, LogPage, LogRecord, RunLog, UsageBucket, UsageQuery};

/// Reads endpoints' run logs. Records are kept by endpoint name: an endpoint deleted and created again under
/// its name shows the records of both.
pub struct LogService {
    store: Arc<dyn EndpointStore>,
    log: Arc<dyn RunLog>,
    clock: Arc<dyn Clock>,
}

impl LogService {
    pub fn new(store: Arc<dyn EndpointStore>, log: Arc<dyn RunLog>, clock: Arc<dyn Clock>) -> Self {
        Self { store, log, clock }
    }

    /// When a run answered now, after `took`, began by the service's clock, to the microsecond the log keeps:
    /// the time its record is filed under.
    pub fn began(&self, took: std::time::Duration) -> Timestamp {
        let at = self.clock.now() - took;
        at.replace_nanosecond(at.nanosecond() / 1000 * 1000).unwrap_or(at)
    }

    /// Takes a record of a run to be written (never blocks).
    pub fn record(&self, record: LogRecord) {
        self.log.record(record);
    }

    /// One page of the endpoint's records that `filter` keeps, newest first.
    ///
    /// # Errors
    /// [`Error::NotFound`] for no such endpoint; store and engine failures.
    pub async fn records(
        &self,
        project: ProjectId,
        name: &EndpointName,
        filter: &LogFilter,
    ) -> Result<LogPage, Error> {
        self.exists(project, name).await?;
        let found = self.log.records(project, name.as_str(), filter).await?;
        Ok(LogPage::of(found, filter.limit))
    }

    /// The endpoint's usage in buckets of `interval` over `since..until` (the last day by hours when not said).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a range the buckets cannot answer; [`Error::NotFound`] for no such endpoint; store
    /// and engine failures.
    pub async fn usage(
        &self,
        project: ProjectId,
        name: &EndpointName,
        since: Option<Timestamp>,
        until: Option<Timestamp>,
        interval: Option<Interval>,
    ) -> Result<(UsageQuery, Vec<UsageBucket>), Error> {
        let query = UsageQuery::new(since, until, interval, self.clock.now())?;
        self.exists(project, name).await?;
        let buckets = self.log.usage(project, name.as_str(), &query).await?;
        Ok((query, buckets))
    }

    async fn exists(&self, project: ProjectId, name: &EndpointName) -> Result<(), Error> {
        match self.store.get(project, name).await {
            Ok(_) => Ok(()),
            Err(StoreError::NotFound) => Err(Error::endpoint_not_found(name.as_str())),
            Err(other) => Err(other.into()),
        }
    }
}
