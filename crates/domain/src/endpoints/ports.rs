//! What endpoint rules need from outside: a store of endpoints and their versions, and whatever this process
//! keeps in memory of them.

use async_trait::async_trait;
use uuid::Uuid;

use super::model::{
    Endpoint, EndpointChange, EndpointFilter, EndpointName, EndpointVersion, NewEndpoint, Replanned,
    TableReader,
};
use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::page::{Page, PageRequest};

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

    /// The endpoints of the project whose current version reads any of `tables`, and those whose tables were
    /// not recorded (which may read them). Kept as an index with every version written, so that its cost
    /// follows the readers, not the project's size.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn readers(&self, project: ProjectId, tables: &[String]) -> Result<Vec<TableReader>, StoreError>;

    /// Every table some endpoint's current version reads, with its project, from the index
    /// [`EndpointStore::readers`] reads (not those of versions whose tables were not recorded): the tables
    /// whose layout follows endpoints.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn read_tables(&self) -> Result<Vec<(ProjectId, String)>, StoreError>;

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

    /// Records what planning a version again told: its new columns, eligibility and tables with no plan error,
    /// or the plan error alone (the tables stay, so the endpoint is still found as a reader of the table).
    /// Returns false when the endpoint or version is gone.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn replan(&self, endpoint_id: Uuid, version: u32, replanned: Replanned)
        -> Result<bool, StoreError>;

    /// Tells every other process sharing this store that these endpoints changed without a change of their own
    /// (a table they read was written), so what they keep of them goes too. Nothing to do for a store that no
    /// other process shares.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn announce(&self, project: ProjectId, names: Vec<EndpointName>) -> Result<(), StoreError>;

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

/// What this process keeps in memory of endpoints outside the store (computed runs): told of every change made
/// here as soon as it is saved, so nothing kept outlives it. Changes made by other processes arrive through the
/// store's announcements instead.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait EndpointChanges: Send + Sync {
    /// The endpoint was updated (its query, settings or activation) or deleted.
    fn changed(&self, project: ProjectId, name: &EndpointName);

    /// Returns once every other process serving the store has applied the changes saved here so far (or was
    /// counted out, and distrusts what it keeps): what a writer waits for before it answers, so that the next
    /// request on any process sees the change.
    async fn settled(&self);
}

/// Told when an endpoint is saved with a version that reads tables: the layout of those tables (the columns
/// their files are sorted by) is chosen again from their readers' filters at their next compaction, which this
/// process's next pass makes.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
pub trait TableReadersChanged: Send + Sync {
    fn readers_changed(&self, project: ProjectId, tables: &[String]);
}
