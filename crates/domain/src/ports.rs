//! The capabilities the domain needs from the outside world. Adapters implement them; the binary picks one of
//! each at startup and hands them over as `Arc<dyn Port>`.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use crate::auth::{ApiKey, Project, ProjectId};
use crate::endpoint::{
    Column, Endpoint, EndpointChange, EndpointFilter, EndpointName, EndpointVersion, NewEndpoint,
};
use crate::error::BoxError;
use crate::materialization::{
    Claim, MaterializationState, MaterializedFilter, QueryOutline, StoredResult, Switch,
};
use crate::page::{Page, PageRequest};
use crate::query::Query;
use crate::run::{BoundValue, QueryResult};
use crate::Timestamp;

/// What a store adapter can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("version {0} not found")]
    VersionNotFound(u32),
    #[error("name '{0}' already taken")]
    NameTaken(String),
    #[error("store unavailable")]
    Unavailable(#[source] BoxError),
    #[error("store failure")]
    Internal(#[source] BoxError),
}

/// Endpoints and their versions.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait EndpointStore: Send + Sync {
    /// Inserts an endpoint with its version 1.
    ///
    /// # Errors
    /// [`StoreError::NameTaken`] when a live endpoint of the project has the name; `Unavailable`, `Internal`.
    async fn insert(&self, endpoint: NewEndpoint) -> Result<Endpoint, StoreError>;

    /// # Errors
    /// [`StoreError::NotFound`] when the project has no such endpoint; `Unavailable`, `Internal`.
    async fn get(&self, project: ProjectId, name: &EndpointName) -> Result<Endpoint, StoreError>;

    /// Endpoints ordered by name, and the count of all that match the filter.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn list(
        &self,
        project: ProjectId,
        filter: &EndpointFilter,
        page: PageRequest,
    ) -> Result<Page<Endpoint>, StoreError>;

    /// Applies a change atomically; a change that turns materialization off removes the materialization record
    /// with it. A query whose canonical text differs from the current version's becomes
    /// version `current + 1` (numbers stay contiguous under concurrent updates) and copies the endpoint's
    /// resulting description, cache and sync settings; otherwise the current version's settings follow the
    /// endpoint's.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; `Unavailable`, `Internal`.
    async fn update(
        &self,
        project: ProjectId,
        name: &EndpointName,
        change: EndpointChange,
        at: Timestamp,
    ) -> Result<Endpoint, StoreError>;

    /// Deletes the endpoint with all its versions and its materialization record, and returns its id; its name
    /// is free again.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; `Unavailable`, `Internal`.
    async fn delete(&self, project: ProjectId, name: &EndpointName) -> Result<Uuid, StoreError>;

    /// Versions, newest first.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown endpoint; `Unavailable`, `Internal`.
    async fn list_versions(
        &self,
        project: ProjectId,
        name: &EndpointName,
        page: PageRequest,
    ) -> Result<Page<EndpointVersion>, StoreError>;

    /// # Errors
    /// [`StoreError::NotFound`] for an unknown endpoint, [`StoreError::VersionNotFound`] for an unknown version;
    /// `Unavailable`, `Internal`.
    async fn get_version(
        &self,
        project: ProjectId,
        name: &EndpointName,
        version: u32,
    ) -> Result<EndpointVersion, StoreError>;

    /// Records last execution times in one batch; a time older than the stored one does not replace it, and
    /// endpoints deleted since are skipped.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn record_executions(
        &self,
        batch: Vec<(ProjectId, EndpointName, Timestamp)>,
    ) -> Result<(), StoreError>;

    /// Last execution times at or after `since` of those `names` that exist in the project, and the number of
    /// rows the lookup read.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn last_executions(
        &self,
        project: ProjectId,
        names: Vec<EndpointName>,
        since: Timestamp,
    ) -> Result<(Vec<(EndpointName, Timestamp)>, u64), StoreError>;
}

/// Projects, managed by the operator.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait ProjectStore: Send + Sync {
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn create(&self, name: String, at: Timestamp) -> Result<Project, StoreError>;

    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn get(&self, id: ProjectId) -> Result<Option<Project>, StoreError>;

    /// All projects by id.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn list(&self) -> Result<Vec<Project>, StoreError>;
}

/// API keys, looked up by the hash of their secret.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait ApiKeyStore: Send + Sync {
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn insert(&self, key: ApiKey) -> Result<ApiKey, StoreError>;

    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn find_by_hash(&self, secret_hash: &str) -> Result<Option<ApiKey>, StoreError>;

    /// Keys of one project, or of all, oldest first.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn list(&self, project: Option<ProjectId>) -> Result<Vec<ApiKey>, StoreError>;

    /// Marks a key revoked from `at` on. Revoking a revoked key keeps its first revocation time.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; `Unavailable`, `Internal`.
    async fn revoke(&self, id: Uuid, at: Timestamp) -> Result<(), StoreError>;
}

/// What the query engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The SQL is not a single read-only statement over the project's tables, or does not plan.
    #[error("{0}")]
    InvalidQuery(String),
    /// The query ran past its time limit and was cancelled.
    #[error("query timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The query needed more memory than its limit allows.
    #[error("{0}")]
    MemoryLimit(String),
    /// The page of rows would be larger than a response may carry (`limit_bytes`).
    #[error("the result is over {limit_bytes} bytes")]
    ResultTooLarge { limit_bytes: usize },
    /// Too many queries of the project are running; try again after the given time.
    #[error("too many concurrent queries")]
    Busy { retry_after: std::time::Duration },
    #[error("engine unavailable")]
    Unavailable(#[source] BoxError),
    #[error("engine failure")]
    Internal(#[source] BoxError),
}

/// What planning a query tells: its output columns and the facts materialization rules need.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueryDescription {
    pub columns: Vec<Column>,
    pub outline: QueryOutline,
}

/// Plans and runs queries over a project's tables.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait QueryEngine: Send + Sync {
    /// Plans the query without running it and returns its output columns. Placeholders are planned as typed
    /// parameters of their declared variables.
    ///
    /// # Errors
    /// [`EngineError::InvalidQuery`] for SQL that is not one read-only statement, names an unknown table or column,
    /// or has duplicate output column names; `Unavailable`, `Internal`.
    async fn describe(&self, project: ProjectId, query: &Query) -> Result<QueryDescription, EngineError>;

    /// Runs the query with its variables bound as typed parameters and returns the page `offset..offset+limit`
    /// of its rows, with whether more rows follow.
    ///
    /// # Errors
    /// [`EngineError::InvalidQuery`] when the query no longer plans (a table changed);
    /// [`EngineError::Timeout`], [`EngineError::MemoryLimit`], [`EngineError::Busy`]; `Unavailable`, `Internal`.
    async fn execute(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, BoundValue>,
        limit: u32,
        offset: u64,
    ) -> Result<QueryResult, EngineError>;
}

/// Materialization records: which version each materialized endpoint has stored, where, and who refreshes it.
///
/// The endpoint row is the source of truth for whether an endpoint is materialized and at which version; this
/// record follows it. Claims are leases: a claim is granted to one worker at a time, across processes sharing the
/// database, and a lease that expires (its worker crashed) can be claimed again.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait MaterializationStore: Send + Sync {
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn get(&self, endpoint_id: Uuid) -> Result<Option<MaterializationState>, StoreError>;

    /// The records of those endpoints that have one.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn get_many(&self, endpoint_ids: Vec<Uuid>) -> Result<Vec<MaterializationState>, StoreError>;

    /// Claims up to `max` refreshes that are due at `now`: active materialized endpoints whose current version
    /// has no record yet, whose record is for an older version, whose next run has come, or whose running
    /// attempt's lease has expired. Each is marked Running with a new token, leased until `lease_until`.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn claim_due(
        &self,
        now: crate::Timestamp,
        lease_until: crate::Timestamp,
        max: usize,
    ) -> Result<Vec<Claim>, StoreError>;

    /// Extends a held lease; `false` when the claim is no longer held.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn renew(
        &self,
        endpoint_id: Uuid,
        token: Uuid,
        until: crate::Timestamp,
    ) -> Result<bool, StoreError>;

    /// Switches runs to a completed result, if the claim is still held.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn complete(
        &self,
        endpoint_id: Uuid,
        token: Uuid,
        result: StoredResult,
        next_run_at: crate::Timestamp,
    ) -> Result<Switch, StoreError>;

    /// Records a failed attempt, if the claim is still held; the previous result stays readable.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn fail(
        &self,
        endpoint_id: Uuid,
        token: Uuid,
        error: String,
        next_run_at: crate::Timestamp,
    ) -> Result<bool, StoreError>;

    /// Makes a record due at `at` (a changed frequency); a running attempt keeps its lease.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn reschedule(&self, endpoint_id: Uuid, at: crate::Timestamp) -> Result<(), StoreError>;

    /// Every record, for sweeping files no record refers to. Records are removed by the endpoint store with the
    /// change that turns materialization off and with the endpoint.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn all(&self) -> Result<Vec<MaterializationState>, StoreError>;
}

/// Stored results: written from a query, read with filters and a page window, removed. Locations are relative
/// to the project and made by [`crate::materialization::location`].
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait MaterializedResults: Send + Sync {
    /// Runs the query with its variable predicates removed and stores every row, in order, at `location`.
    /// Returns the number of rows. A failed write leaves nothing at `location`.
    ///
    /// # Errors
    /// [`EngineError::InvalidQuery`] when the query no longer plans or cannot be materialized;
    /// [`EngineError::Timeout`], [`EngineError::MemoryLimit`]; `Unavailable`, `Internal` (including I/O).
    async fn write(&self, project: ProjectId, query: &Query, location: &str) -> Result<u64, EngineError>;

    /// The page `offset..offset+limit` of the stored rows that pass every filter, in stored order.
    ///
    /// # Errors
    /// [`EngineError::Busy`], [`EngineError::Timeout`]; `Internal` when the result cannot be read.
    async fn read(
        &self,
        project: ProjectId,
        location: &str,
        filters: Vec<(MaterializedFilter, BoundValue)>,
        limit: u32,
        offset: u64,
    ) -> Result<QueryResult, EngineError>;

    /// Removes a location, or with an endpoint's location every result of the endpoint. Removing what is not
    /// there succeeds.
    ///
    /// # Errors
    /// `Internal` on I/O failure.
    async fn remove(&self, project: ProjectId, location: &str) -> Result<(), EngineError>;

    /// Every result location present, with its project.
    ///
    /// # Errors
    /// `Internal` on I/O failure.
    async fn locations(&self) -> Result<Vec<(ProjectId, String)>, EngineError>;
}

/// The two ports materialization works through, held together by the services that use them.
#[derive(Clone)]
pub struct Materializations {
    pub states: Arc<dyn MaterializationStore>,
    pub results: Arc<dyn MaterializedResults>,
}

/// Identifies one cacheable answer: the endpoint, its cache generation and the canonical request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub project: ProjectId,
    pub name: EndpointName,
    /// Bumped by every update or delete of the endpoint, so older entries become unreachable at once.
    pub generation: u64,
    /// Version (or `latest`), variables as supplied, limit and offset, in one canonical text.
    pub request: String,
}

/// A computed run, as cached and as answered.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedRun {
    pub version: u32,
    pub version_created_at: Timestamp,
    pub result: QueryResult,
    pub computed_at: Timestamp,
    /// When the cache stops serving it; `None` when it was not cached.
    pub expires_at: Option<Timestamp>,
    pub query_time: std::time::Duration,
    pub endpoint_materialized: bool,
    /// When the stored result the answer was read from was computed.
    pub materialized_at: Option<Timestamp>,
    /// The bound variables, defaults included.
    pub variables: serde_json::Value,
    /// The serialized form of the fields above, written by the adapter that first answers with this run and
    /// reused by every later answer, so a cache hit writes only what differs per request.
    pub rendered: std::sync::OnceLock<Vec<u8>>,
}

impl CachedRun {
    /// Approximate memory held, for byte-bounded caches (the rendered fields included).
    pub fn weight(&self) -> usize {
        self.result.rows_json.len()
            + self.result.columns.iter().map(|c| 2 * c.name.len() + 32).sum::<usize>()
            + 512
    }
}

/// Computed runs, kept for their endpoint's cache age. Expiry is checked by the caller against the `Clock`.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
pub trait ResultCache: Send + Sync {
    /// The endpoint's current generation; part of every key.
    fn generation(&self, project: ProjectId, name: &EndpointName) -> u64;

    fn get(&self, key: &CacheKey) -> Option<Arc<CachedRun>>;

    fn put(&self, key: CacheKey, run: Arc<CachedRun>);

    /// Makes every cached run of the endpoint unreachable at once (on update and delete).
    fn invalidate(&self, project: ProjectId, name: &EndpointName);

    /// Makes every cached run unreachable at once, including those being computed now (when this process may
    /// have missed changes made elsewhere).
    fn invalidate_all(&self);
}

/// A change made by some process that every process keeping the changed thing in memory must honour at once.
/// Stores that can tell other processes (PostgreSQL's `NOTIFY`) announce these when the change commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The endpoint was updated (its query, settings or activation) or deleted.
    Endpoint { project: ProjectId, name: EndpointName },
    /// A key was revoked.
    Keys,
    /// Changes may have been missed (the channel was down): forget everything kept from the store.
    Everything,
}

/// The current time, injectable so tests control it.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    /// Now, to the microsecond: the precision every store keeps, so a value reads back as it was written.
    fn now(&self) -> Timestamp {
        let now = time::OffsetDateTime::now_utc();
        now.replace_nanosecond(now.nanosecond() / 1_000 * 1_000).unwrap_or(now)
    }
}
