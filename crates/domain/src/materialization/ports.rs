//! What materialization needs from outside: a store of materialization records (with leases for claims), and
//! a place for stored results that the engine writes and reads.

use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::model::{Claim, MaterializationState, MaterializedFilter, Stored, StoredResult, Switch};
use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::error::{EngineError, StoreError};
use crate::query::{BoundValue, Export, Query, QueryResult, ResultFormat};

/// Materialization records: which version each materialized endpoint has stored, where, and who refreshes it.
///
/// The endpoint row is the source of truth for whether an endpoint is materialized and at which version; this
/// record follows it. Claims are leases: a claim is granted to one worker at a time, across processes sharing the
/// database, and a lease that expires (its worker crashed) can be claimed again.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait MaterializationRecords: Send + Sync {
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn get(&self, endpoint_id: Uuid) -> Result<Option<MaterializationState>, StoreError>;

    /// The records of those endpoints that have one.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn get_many(&self, endpoint_ids: Vec<Uuid>) -> Result<Vec<MaterializationState>, StoreError>;

    /// Claims up to `max` refreshes that are due at `now`: active materialized endpoints that do not hibernate
    /// at `now` ([`Endpoint::hibernates_at`](crate::endpoints::Endpoint::hibernates_at), by the times the store
    /// holds) whose current version has no record yet, whose record is for an older version, whose next run has
    /// come, whose pending appends are `freshness_seconds` old, or whose running attempt's lease has expired.
    /// Each is marked Running with a new token, leased until `lease_until`.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn claim_due(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        max: usize,
    ) -> Result<Vec<Claim>, StoreError>;

    /// Extends a held lease; `false` when the claim is no longer held.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn renew(&self, endpoint_id: Uuid, token: Uuid, until: Timestamp) -> Result<bool, StoreError>;

    /// Switches runs to a completed result, if the claim is still held, and counts it: a full refresh, or a fold
    /// that `folded` rows into the previous result. Appends recorded since the claim stay pending. Other
    /// processes are told that the endpoint changed as the switch commits (so they drop runs cached from the
    /// result before).
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn complete(
        &self,
        endpoint_id: Uuid,
        token: Uuid,
        result: StoredResult,
        next_run_at: Timestamp,
        folded: Option<u64>,
    ) -> Result<Switch, StoreError>;

    /// Records that rows were appended at `at` to a table these endpoints read (or that one was replaced):
    /// each record with no pending appends gets `at` as the time they are pending since, which makes its
    /// refresh due `freshness_seconds` later. Endpoints without a record have their first refresh due already.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn appended(&self, endpoint_ids: Vec<Uuid>, at: Timestamp) -> Result<(), StoreError>;

    /// Records a failed attempt, if the claim is still held; the previous result stays readable.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn fail(
        &self,
        endpoint_id: Uuid,
        token: Uuid,
        error: String,
        next_run_at: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Makes a record due at `at` (a changed frequency); a running attempt keeps its lease.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn reschedule(&self, endpoint_id: Uuid, at: Timestamp) -> Result<(), StoreError>;

    /// Every record, for sweeping files no record refers to. Records are removed by the endpoint store with the
    /// change that turns materialization off and with the endpoint.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn all(&self) -> Result<Vec<MaterializationState>, StoreError>;
}

/// Stored results: written from a query, read with filters and a page window, removed. Locations are relative
/// to the project and made by [`attempt_location`](super::attempt_location).
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait ResultStorage: Send + Sync {
    /// Runs the query with its variable predicates removed and stores every row, in order, at `location`.
    /// Returns the number of rows, and what of the tables it read. A failed write leaves nothing at
    /// `location`.
    ///
    /// # Errors
    /// [`EngineError::InvalidQuery`] when the query no longer plans or cannot be materialized;
    /// [`EngineError::Timeout`], [`EngineError::MemoryLimit`]; `Unavailable`, `Internal` (including I/O).
    async fn write(&self, project: ProjectId, query: &Query, location: &str) -> Result<Stored, EngineError>;

    /// Folds the rows appended to the query's tables since the stored result `from` (what of them it holds is
    /// its coverage) into a new result at `to` that nothing reads yet: the query over the appended rows alone
    /// (its variable predicates removed), added after a stored result of rows, or as more partial aggregates of
    /// a rollup (which runs aggregate again). The result `from` is left as it is. Returns the rows the new
    /// result holds and those it added, and what of the tables it holds. A failed fold leaves nothing at `to`.
    ///
    /// # Errors
    /// [`EngineError::InvalidQuery`] with the reason when the rows appended cannot be folded in, and a full
    /// refresh is needed: `from` has no coverage; the query reads the table more than once, or under an
    /// aggregation, a sort, DISTINCT, a window, a limit, a union, an outer join or a subquery; more than one
    /// table changed; a table was replaced or its history since is not known.
    /// [`EngineError::Timeout`], [`EngineError::MemoryLimit`]; `Unavailable` when a file is gone; `Internal` on
    /// I/O.
    async fn fold(
        &self,
        project: ProjectId,
        query: &Query,
        from: &StoredResult,
        to: &str,
    ) -> Result<Stored, EngineError>;

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

    /// The same page as [`ResultStorage::read`], written in `format` without holding it in memory.
    ///
    /// # Errors
    /// As [`ResultStorage::read`].
    async fn export(
        &self,
        project: ProjectId,
        location: &str,
        filters: Vec<(MaterializedFilter, BoundValue)>,
        limit: u32,
        offset: u64,
        format: ResultFormat,
    ) -> Result<Export, EngineError>;

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
pub struct MaterializationPorts {
    pub states: Arc<dyn MaterializationRecords>,
    pub results: Arc<dyn ResultStorage>,
}
