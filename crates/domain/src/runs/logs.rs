//! An endpoint's run log: what a run's record says of the run ([`Ran`]), and the listing of records and usage,
//! for callers who may read it. Records are made by [`super::record`].

use std::sync::Arc;

use super::model::{Exported, RunOutcome};
use crate::access::ProjectId;
use crate::clock::{Clock, Timestamp};
use crate::endpoints::{EndpointName, EndpointStore};
use crate::error::{Error, StoreError};
use crate::logs::{Interval, LogFilter, LogPage, LogSource, RunLog, UsageBucket, UsageQuery};

/// What a run's record says of the run itself: the version that ran, the rows answered, the bytes read and
/// where the answer came from (none for a `force_cache` run with nothing stored, which read and answered nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ran {
    pub version: Option<u32>,
    pub rows: u64,
    pub bytes_read: Option<u64>,
    pub source: Option<LogSource>,
}

impl RunOutcome {
    /// What its record says of it: a cache hit read nothing; a `force_cache` run with nothing stored answered
    /// nothing.
    pub fn ran(&self) -> Ran {
        let Some(run) = self.run.as_deref() else {
            return Ran { version: None, rows: 0, bytes_read: None, source: None };
        };
        let (source, bytes_read) = if self.is_cached {
            (LogSource::Cache, None)
        } else if self.endpoint_materialized {
            (LogSource::Materialized, run.result.statistics.bytes_read)
        } else {
            (LogSource::Live, run.result.statistics.bytes_read)
        };
        Ran {
            version: Some(run.version),
            rows: run.result.row_count as u64,
            bytes_read,
            source: Some(source),
        }
    }
}

impl Exported {
    /// What its record says of it: a page read from the stored result or computed live.
    pub fn ran(&self) -> Ran {
        let source = if self.materialized_at.is_some() { LogSource::Materialized } else { LogSource::Live };
        Ran { version: Some(self.version), rows: self.export.rows, bytes_read: None, source: Some(source) }
    }
}

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
