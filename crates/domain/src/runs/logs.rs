//! An endpoint's run log: each run's record, built here from what the run answered and who asked for it, and
//! the listing of records and usage, for callers who may read it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::model::{Exported, RunOutcome};
use crate::access::ProjectId;
use crate::clock::{Clock, Timestamp};
use crate::endpoints::{EndpointName, EndpointStore};
use crate::error::{Error, StoreError};
use crate::logs::{
    Interval, LogFilter, LogKind, LogPage, LogRecord, LogSource, RunLog, Transport, UsageBucket, UsageQuery,
};

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

/// A run as its transport answered it: who asked (a caller of the project it addresses: anyone could write in a
/// project's log otherwise), with what status and error code, after how long, and what ran (`None` for a run
/// refused or failed before it ran).
#[derive(Debug, Clone)]
pub struct Answered {
    pub project: ProjectId,
    /// The caller's credential as records name it ([`crate::access::Principal::label`]).
    pub credential: Arc<str>,
    pub endpoint: String,
    pub transport: Transport,
    pub status: u16,
    pub code: Option<&'static str>,
    pub took: Duration,
    pub ran: Option<Ran>,
    pub request_id: Option<String>,
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

    /// When a run answered now, after `took`, began by the service's clock, to the microsecond the log keeps:
    /// the time its record is filed under.
    fn began(&self, took: Duration) -> Timestamp {
        let at = self.clock.now() - took;
        at.replace_nanosecond(at.nanosecond() / 1000 * 1000).unwrap_or(at)
    }

    /// Records a run answered now (never blocks): the one place a run's record is made.
    pub fn answered(&self, run: Answered) {
        let Answered { project, credential, endpoint, transport, status, code, took, ran, request_id } = run;
        self.log.record(LogRecord {
            id: record_id(),
            at: self.began(took),
            project,
            endpoint,
            version: ran.and_then(|ran| ran.version),
            kind: LogKind::Run,
            status,
            code: code.map(str::to_owned),
            duration: took,
            rows: ran.map(|ran| ran.rows),
            bytes_read: ran.and_then(|ran| ran.bytes_read),
            source: ran.and_then(|ran| ran.source),
            credential: Some(credential),
            transport: Some(transport),
            request_id,
            runs: 1,
        });
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

/// A record's id: a UUID of version 8 (its bits are the service's) holding 64 random bits drawn once per process
/// and a counter, so ids are unique across processes and nodes without a random draw per run, and a process's
/// ids follow its runs' order.
fn record_id() -> uuid::Uuid {
    static PROCESS: LazyLock<u64> = LazyLock::new(rand::random);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let next = NEXT.fetch_add(1, Ordering::Relaxed);
    let bits = (u128::from(*PROCESS) << 64) | u128::from(next);
    uuid::Builder::from_custom_bytes(bits.to_be_bytes()).into_uuid()
}
