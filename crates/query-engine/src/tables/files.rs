//! A table's files as this process knows them: the lock its writes to a table take, the rows of Parquet files
//! (from their footers, remembered), and the times of files and of log entries as timestamps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use domain::{EngineError, ProjectId, Timestamp};
use object_store::path::Path as ObjectPath;
use object_store::ObjectMeta;

/// One lock per table this process writes, so its writes to one table follow each other: a replace never
/// removes the version an append of this process is adding to.
#[derive(Debug, Default)]
pub(crate) struct TableLocks {
    locks: Mutex<HashMap<(ProjectId, String), TableLock>>,
}

pub(crate) type TableLock = Arc<tokio::sync::Mutex<()>>;

impl TableLocks {
    pub(crate) fn of(&self, project: ProjectId, table: &str) -> TableLock {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        // Locks nobody holds or waits for are dropped, so the map stays as small as the writes under way.
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        Arc::clone(locks.entry((project, table.to_owned())).or_default())
    }
}

pub(crate) fn instant(meta: &ObjectMeta) -> Timestamp {
    let micros = meta.last_modified.timestamp_micros();
    Timestamp::from_unix_timestamp_nanos(i128::from(micros) * 1_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// When a time of the Delta log (milliseconds since the Unix epoch) was.
pub(crate) fn instant_ms(ms: i64) -> Timestamp {
    Timestamp::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The rows of each of a table's files this process has read the footer of, by location and size: a table's
/// file is never changed once written, so describing a table reads only the footers of its new files.
pub(crate) type FileRows = moka::sync::Cache<(ObjectPath, u64), u64>;

/// Files whose rows are remembered: far more than the tables of a deployment have between compactions.
pub(crate) fn file_rows() -> FileRows {
    moka::sync::Cache::new(1_000_000)
}

/// The rows of a Parquet file, from its footer (the first time only, for a file of the storage: `known`).
pub(crate) async fn rows_of(
    store: &dyn object_store::ObjectStore,
    meta: &ObjectMeta,
    known: Option<&FileRows>,
) -> Result<u64, EngineError> {
    let key = (meta.location.clone(), meta.size);
    if let Some(rows) = known.and_then(|known| known.get(&key)) {
        return Ok(rows);
    }
    let footer = DFParquetMetadata::new(store, meta);
    let metadata = footer.fetch_metadata().await.map_err(|e| EngineError::Internal(Box::new(e)))?;
    let rows = u64::try_from(metadata.file_metadata().num_rows()).unwrap_or(0);
    if let Some(known) = known {
        known.insert(key, rows);
    }
    Ok(rows)
}
