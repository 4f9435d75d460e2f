//! A Delta table another writer keeps (a data team's lake table), read where it is through delta-rs's own
//! DataFusion table provider, and followed to its newest version at most once per refresh interval.
//!
//! Nothing here writes: the table is the team's. Its log is read with delta-rs, which also decides what it can
//! read: a table needing a reader feature delta-rs lacks is refused with the features' names, never read wrong.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::catalog::TableProvider;
use deltalake::kernel::transaction::PROTOCOL;
use deltalake::logstore::{default_logstore, StorageConfig};
use deltalake::DeltaTable;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use url::Url;

use crate::{CommitError, Snapshot};

/// One external Delta table, kept per process: its state read once, then moved forward by the log's new
/// commits when it was last read more than the refresh interval ago.
#[derive(Debug)]
pub struct ExternalTable {
    /// The table's folder from the root of `store`'s bucket (or disk).
    path: ObjectPath,
    refresh: Duration,
    table: tokio::sync::Mutex<(DeltaTable, Option<Instant>)>,
}

impl ExternalTable {
    /// The Delta table at `url` (a folder, ending in `/`) of the bucket or disk `store` holds from its root,
    /// checked for new versions at most once per `refresh`.
    ///
    /// # Errors
    /// [`CommitError::Storage`] for a URL whose path is not an object path.
    pub fn new(store: Arc<dyn ObjectStore>, url: &Url, refresh: Duration) -> Result<Self, CommitError> {
        let path = ObjectPath::from_url_path(url.path())
            .map_err(|e| CommitError::Storage { table: url.to_string(), source: e.into() })?;
        let prefixed: Arc<dyn ObjectStore> = Arc::new(PrefixStore::new(Arc::clone(&store), path.clone()));
        let log = default_logstore(prefixed, store, url, &StorageConfig::default());
        Ok(Self { path, refresh, table: tokio::sync::Mutex::new((DeltaTable::new(log), None)) })
    }

    /// The table at its newest version (as of the last check, within the refresh interval): a provider that
    /// reads it, and its files and columns.
    ///
    /// # Errors
    /// [`CommitError::NoTable`] when the folder holds no Delta table; [`CommitError::Columns`] when the table
    /// needs reader features delta-rs does not have; [`CommitError::Storage`].
    pub async fn read(&self) -> Result<(Arc<dyn TableProvider>, Snapshot), CommitError> {
        let name = self.path.to_string();
        let storage =
            |e: deltalake::DeltaTableError| CommitError::Storage { table: name.clone(), source: e.into() };
        let mut guard = self.table.lock().await;
        let (table, checked) = &mut *guard;
        if checked.is_none_or(|at| at.elapsed() >= self.refresh) {
            if table.version().is_none() && !table.verify_deltatable_existence().await.map_err(&storage)? {
                return Err(CommitError::NoTable(name));
            }
            table.update_state().await.map_err(&storage)?;
            *checked = Some(Instant::now());
        }
        let state = table.snapshot().map_err(&storage)?;
        PROTOCOL.can_read_from(state).map_err(|e| CommitError::Columns {
            table: name.clone(),
            reason: format!("this Delta table cannot be read here: {e}"),
        })?;
        let snapshot = Snapshot::of(&self.path, state).map_err(&storage)?;
        let provider = table
            .table_provider()
            .await
            .map_err(|e| CommitError::Storage { table: name.clone(), source: e.into() })?;
        Ok((provider, snapshot))
    }
}
