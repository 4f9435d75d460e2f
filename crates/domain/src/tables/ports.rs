//! Where a project's tables live: listed, described, written from an upload, deleted.

use async_trait::async_trait;

use uuid::Uuid;

use super::idempotency::{AppendKeyState, IdempotencyKey, TaggedWrite};
use super::model::{
    Compaction, ExternalSource, Findable, TableCommit, TableInfo, TableName, Upload, Written,
};
use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::endpoints::EndpointName;
use crate::error::{EngineError, StoreError, UploadError};
use crate::page::{Page, PageRequest};

/// A project's tables. Writes are atomic: a reader (a run, another request) sees a table before a write or
/// after it, never part of one, and a failed write leaves the table as it was.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait TableStore: Send + Sync {
    /// The project's tables, by name.
    ///
    /// # Errors
    /// `Unavailable` when the storage cannot be read; `Internal`.
    async fn list(&self, project: ProjectId) -> Result<Vec<TableInfo>, EngineError>;

    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn get(&self, project: ProjectId, name: &TableName) -> Result<Option<TableInfo>, EngineError>;

    /// The table's commits, newest first, paged; `None` when there is no such table.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn versions(
        &self,
        project: ProjectId,
        name: &TableName,
        request: PageRequest,
    ) -> Result<Option<Page<TableCommit>>, EngineError>;

    /// Writes an upload: a replace becomes the table's whole content (creating it), an append adds its rows to
    /// those of the table (whose columns it must have). Concurrent appends all land. An append with a tag keeps
    /// the tag's write id and body digest with its rows, for [`TableStore::holds`].
    ///
    /// # Errors
    /// [`UploadError::Invalid`] for a body that does not read as its format or rows that do not fit the table,
    /// [`UploadError::TooLarge`], [`UploadError::NoSuchTable`] for an append to a missing table,
    /// [`UploadError::CutOff`]; the engine's `Unavailable` and `Internal`.
    async fn write(
        &self,
        project: ProjectId,
        name: &TableName,
        upload: Upload,
    ) -> Result<Written, UploadError>;

    /// Makes the table read `source` where it is (creating the table, or replacing its rows), once the source
    /// is known to be allowed and readable; returns whether it created the table.
    ///
    /// # Errors
    /// [`UploadError::Rejected`] for a source outside the allowed ones or that cannot be read (attr
    /// `source.url`, or `source.table`); the engine's `Unavailable` and `Internal`.
    async fn register(
        &self,
        project: ProjectId,
        name: &TableName,
        source: ExternalSource,
    ) -> Result<bool, UploadError>;

    /// Removes the table; `false` when there was none. An external table's files or database table stay.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn delete(&self, project: ProjectId, name: &TableName) -> Result<bool, EngineError>;

    /// The tables this process appended to since it last compacted them: the candidates for compaction.
    fn appended(&self) -> Vec<(ProjectId, TableName)>;

    /// Merges the table's small files into full ones, if it has enough of them to be worth it, and switches the
    /// table to the result with one write; `None` when there was nothing to do. With `cluster_by` (see
    /// [`cluster_columns`](super::cluster_columns)), the files it writes hold their rows sorted by those columns,
    /// and its full files sorted otherwise (or not at all) are rewritten so too, a bounded number of rows per
    /// compaction (the table stays a candidate until all are); the table's layout records the columns. The
    /// rows of the tagged appends
    /// `keep` names stay findable by [`TableStore::holds`] (see [`Findable`]). The caller holds the table's lease
    /// ([`TableLeases`]), so one compaction of a table runs at a time across processes. Runs see the table
    /// before or after, never a row twice or one missing, and appends made meanwhile all land; a compaction
    /// that fails or is killed leaves the table as it was.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`. A failed table is a candidate again.
    async fn compact(
        &self,
        project: ProjectId,
        name: &TableName,
        keep: Findable,
        cluster_by: Vec<String>,
    ) -> Result<Option<Compaction>, EngineError>;

    /// The table's newest version as this process knows it (`None` for no table, or one read from an external
    /// source): read before a compaction's pending appends, to name the files committed after it.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn newest_version(&self, project: ProjectId, name: &TableName) -> Result<Option<u64>, EngineError>;

    /// Sets the columns the table's compactions sort it by in place of those its endpoints' filters choose
    /// (`None`: they choose again; an empty list: it is not sorted), kept with the table (one commit of its log,
    /// kept through a replace); `false` when there is no such table. Its rows do not change.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn pin_layout(
        &self,
        project: ProjectId,
        name: &TableName,
        columns: Option<Vec<String>>,
    ) -> Result<bool, EngineError>;

    /// The append written under `write_id` (see [`TableStore::write`]), if its rows are in the table.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn holds(
        &self,
        project: ProjectId,
        name: &TableName,
        write_id: Uuid,
    ) -> Result<Option<TaggedWrite>, EngineError>;
}

/// How a table write reaches the other processes sharing the store: the table and the endpoints that read it,
/// on the store's change channel.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait TableAnnouncer: Send + Sync {
    /// Tells every other process sharing the store that `tables` were written and that the endpoints `readers`
    /// changed with them, in one message, without waiting for them; nothing to do for a store that no other
    /// process shares.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn announce(
        &self,
        project: ProjectId,
        tables: Vec<TableName>,
        readers: Vec<EndpointName>,
    ) -> Result<(), StoreError>;

    /// As [`TableAnnouncer::announce`], and returns once every other live process applied it and every change
    /// saved here before, or was counted out (as `Propagation::settle`): a run on any process after the caller
    /// answers reads the write. Never fails: the write is made; a store that cannot announce it logs why, and
    /// the other processes find the write when they next ask the storage (within a minute).
    async fn announce_and_settle(
        &self,
        project: ProjectId,
        tables: Vec<TableName>,
        readers: Vec<EndpointName>,
    );
}

/// Leases on a table's maintenance, kept where every process sharing the database sees them: a lease is held
/// by one holder at a time until it expires (its holder crashed) or is released.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait TableLeases: Send + Sync {
    /// Grants the table's lease to `holder` until `until`, unless another holder's lease runs past `now`.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn claim(
        &self,
        project: ProjectId,
        table: &TableName,
        holder: Uuid,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Gives the lease back, if `holder` still holds it.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn release(&self, project: ProjectId, table: &TableName, holder: Uuid) -> Result<(), StoreError>;
}

/// The `Idempotency-Key`s of appends, per table, kept where every process sharing the database sees them.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait AppendKeys: Send + Sync {
    /// Records the key as pending under `write_id`, if it is new or its record was made before `expired`;
    /// otherwise answers what the record says.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn claim(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        write_id: Uuid,
        now: Timestamp,
        expired: Timestamp,
    ) -> Result<AppendKeyState, StoreError>;

    /// Makes a key pending under `write_id` from `from`, if it is still pending under `from`.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn take_over(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        from: Uuid,
        write_id: Uuid,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Records the answer of the append pending under `write_id`.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn answer(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        write_id: Uuid,
        body_sha256: &str,
        written: Written,
    ) -> Result<(), StoreError>;

    /// Forgets a key pending under `write_id` whose append wrote nothing, so that it can be used again.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn forget(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        write_id: Uuid,
    ) -> Result<(), StoreError>;

    /// The write ids of the table's pending appends.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn pending(&self, project: ProjectId, table: &TableName) -> Result<Vec<Uuid>, StoreError>;

    /// Removes the records made before `expired`; answers how many.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn sweep(&self, expired: Timestamp) -> Result<u64, StoreError>;
}
