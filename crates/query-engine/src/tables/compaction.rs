//! Compaction of a table's small files: an `OPTIMIZE` commit of the table's Delta log (see `tables_delta`).
//!
//! The small files of the table's newest version (fewer rows than a row group) are merged, in order, into files
//! of up to [`MERGED_FILE_ROWS`] rows written beside them (`compacted-*.parquet`), and one commit removes the small
//! files and adds the merged ones without changing the data. Appends (of any process) keep committing while it
//! runs and are kept: an append's commit never conflicts with it. A replace that lands first takes the files away,
//! and the compaction's commit is refused: its files are removed and the table is as the replace left it. A
//! compaction killed at any point leaves the table at its last commit; the files it wrote are never read.
//!
//! Files no version within the table retention reads are removed by a vacuum the same worker runs now and then.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::prelude::ParquetReadOptions;
use domain::{Compaction, EngineError, ProjectId, Timestamp};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt};
use tables_delta::{CommitError, DataFile, NewFile, Snapshot};
use uuid::Uuid;

use crate::storage::{unavailable, Storage};
use crate::tables::catalog::{current, object_meta, table_error, table_prefix, Current};
use crate::tables::files::{instant_ms, rows_of, FileRows, TableLock};
use crate::tables::imports::{tagged_appends, ImportError, TableWriter, TaggedAppend};

/// A file with at least this many rows is full (a row group of the table's files): it is never merged again.
const FULL_FILE_ROWS: u64 = 128 * 1024;
/// Merged files close past this many rows, so one compaction of many small files still makes files a run can
/// read in parallel.
const MERGED_FILE_ROWS: u64 = 1024 * 1024;
/// A table is compacted once it has this many small files.
pub(crate) const MIN_SMALL_FILES: usize = 8;
/// The name merged files start with: the record's `last_compacted_at` is the newest of them.
const COMPACTED: &str = "compacted-";

/// The tables this process appended to and has not compacted since, and when it last vacuumed them.
#[derive(Debug, Default)]
pub(crate) struct Appended {
    tables: Mutex<HashSet<(ProjectId, String)>>,
    swept: Mutex<HashMap<(ProjectId, String), Instant>>,
}

/// How often a table is vacuumed: a vacuum lists the table's files.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);

impl Appended {
    /// Whether it is time to vacuum the table (and then not again for a while).
    pub(crate) fn sweep_due(&self, project: ProjectId, table: &str) -> bool {
        let mut swept = self.swept.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        swept.retain(|_, at| now.duration_since(*at) < SWEEP_EVERY);
        let key = (project, table.to_owned());
        if swept.contains_key(&key) {
            return false;
        }
        swept.insert(key, now);
        true
    }

    pub(crate) fn mark(&self, project: ProjectId, table: &str) {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner).insert((project, table.to_owned()));
    }

    pub(crate) fn take(&self, project: ProjectId, table: &str) {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner).remove(&(project, table.to_owned()));
    }

    pub(crate) fn all(&self) -> Vec<(ProjectId, String)> {
        let mut all: Vec<_> =
            self.tables.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect();
        all.sort();
        all
    }
}

/// Compacts a table if its newest version has [`MIN_SMALL_FILES`] small files; `None` when there was nothing to
/// do, or a replace took the files meanwhile. The caller holds the table's lease; with `sweep`, files no version
/// within the table retention reads are removed first (a vacuum).
///
/// Files with rows of an append not answered yet (`keep`) keep their names, so that a retry finds them.
pub(crate) async fn compact(
    storage: &Storage,
    rows: &FileRows,
    _lock: TableLock,
    (project, table): (ProjectId, &str),
    keep: &HashSet<Uuid>,
    sweep: bool,
) -> Result<Option<Compaction>, EngineError> {
    let prefix = table_prefix(project, table);
    if sweep {
        match storage.tables().vacuum(&prefix, storage.table_retention()).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(%project, table, removed, "vacuumed a table's unread files"),
            Err(err) => tracing::warn!(%project, table, error = %err, "cannot vacuum a table"),
        }
    }
    let Some(Current::Files(snapshot)) = current(storage, &prefix).await? else { return Ok(None) };
    let mut small = Vec::new();
    for file in &snapshot.files {
        let meta = object_meta(file);
        let file_rows = match file.rows {
            Some(rows) => rows,
            None => rows_of(storage.store().as_ref(), &meta, Some(rows)).await?,
        };
        if file_rows >= FULL_FILE_ROWS {
            continue;
        }
        if !keep.is_empty() && appends_in(storage, &meta).await?.iter().any(|a| keep.contains(&a.write_id)) {
            continue;
        }
        small.push(file.clone());
    }
    if small.len() < MIN_SMALL_FILES {
        return Ok(None);
    }
    let locations: Vec<ObjectPath> = small.iter().map(|f| f.location.clone()).collect();
    let merged = match merge(storage, &locations, &prefix).await {
        Ok(merged) => merged,
        Err(err) => return Err(EngineError::Unavailable(err.to_string().into())),
    };
    let mut added = Vec::with_capacity(merged.files.len());
    for (path, file_rows) in &merged.files {
        let meta = storage.store().head(path).await.map_err(unavailable)?;
        let modified_ms = meta.last_modified.timestamp_millis();
        added.push(NewFile { location: path.clone(), size: meta.size, rows: *file_rows, modified_ms });
    }
    let written: Vec<ObjectPath> = merged.files.iter().map(|(path, _)| path.clone()).collect();
    match storage.tables().rewrite(&prefix, &small, &added).await {
        Ok(_) => {
            let done = Compaction {
                files_before: snapshot.files.len() as u64,
                files_after: (snapshot.files.len() - small.len() + added.len()) as u64,
                files_merged: small.len() as u64,
                rows_merged: merged.rows,
            };
            tracing::info!(%project, table, ?done, "compacted a table's small files");
            Ok(Some(done))
        }
        Err(CommitError::Conflict(_) | CommitError::NoTable(_)) => {
            discard_files(storage, written).await;
            Ok(None)
        }
        // The commit may have landed (a failure after it, writing a checkpoint): the files stay.
        Err(err) => Err(table_error(err)),
    }
}

async fn discard_files(storage: &Storage, files: Vec<ObjectPath>) {
    if let Err(err) = storage.delete(files).await {
        tracing::warn!(error = %err, "cannot remove an unfinished compaction's files");
    }
}

/// What merging wrote: each file and its rows.
struct Merged {
    files: Vec<(ObjectPath, u64)>,
    rows: u64,
}

/// Reads `small` in order and writes their rows under `target` in files of up to [`MERGED_FILE_ROWS`] rows.
async fn merge(storage: &Storage, small: &[ObjectPath], target: &ObjectPath) -> Result<Merged, ImportError> {
    let ctx = crate::tables::catalog::import_session(storage, None)
        .map_err(|e| ImportError::Write(e.to_string()))?;
    let urls: Vec<String> = small.iter().map(|path| storage.url_of_object(path)).collect();
    let frame = ctx
        .read_parquet(urls, ParquetReadOptions::default())
        .await
        .map_err(|e| ImportError::Write(crate::message(&e)))?;
    let schema = Arc::new(frame.schema().as_arrow().clone());
    let mut stream = frame.execute_stream().await.map_err(|e| ImportError::Write(crate::message(&e)))?;
    let mut merged = Merged { files: Vec::new(), rows: 0 };
    let mut writer: Option<(ObjectPath, TableWriter)> = None;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| ImportError::Write(crate::message(&e)))?;
        let (_, open) = match writer.as_mut() {
            Some(open) => open,
            None => {
                let path = target.clone().join(format!("{COMPACTED}{}.parquet", Uuid::new_v4()));
                let opened = TableWriter::create(storage, path.clone(), Arc::clone(&schema))?;
                writer.insert((path, opened))
            }
        };
        if open.write(&batch).await? >= MERGED_FILE_ROWS {
            if let Some((path, full)) = writer.take() {
                let rows = full.close().await?;
                merged.rows += rows;
                merged.files.push((path, rows));
            }
        }
    }
    if let Some((path, last)) = writer {
        let rows = last.close().await?;
        merged.rows += rows;
        merged.files.push((path, rows));
    }
    Ok(merged)
}

/// The tagged appends a file's footer lists.
async fn appends_in(storage: &Storage, meta: &ObjectMeta) -> Result<Vec<TaggedAppend>, EngineError> {
    let footer = DFParquetMetadata::new(storage.store().as_ref(), meta);
    let metadata = footer.fetch_metadata().await.map_err(|e| EngineError::Internal(Box::new(e)))?;
    Ok(tagged_appends(metadata.file_metadata()))
}

/// The append written under `write_id`, if the table's newest version has its rows.
pub(crate) async fn find_tagged(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    write_id: Uuid,
) -> Result<Option<TaggedAppend>, EngineError> {
    let prefix = table_prefix(project, table);
    let Some(Current::Files(snapshot)) = current(storage, &prefix).await? else { return Ok(None) };
    for file in &snapshot.files {
        let found =
            appends_in(storage, &object_meta(file)).await?.into_iter().find(|a| a.write_id == write_id);
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// When the table's files were last compacted: the newest of its merged files.
pub(crate) fn compacted_at(snapshot: &Snapshot) -> Option<Timestamp> {
    let merged =
        snapshot.files.iter().filter(|f| f.location.filename().is_some_and(|n| n.starts_with(COMPACTED)));
    merged.map(|f: &DataFile| f.modified_ms).max().map(instant_ms)
}
