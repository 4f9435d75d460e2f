//! Compaction of a table's small files: an `OPTIMIZE` commit of the table's Delta log (see `tables_delta`).
//!
//! The small files of the table's newest version (fewer rows than a row group) are merged into files of up to
//! [`MERGED_FILE_ROWS`] rows written beside them (`compacted-*.parquet`), and one commit removes the small files
//! and adds the merged ones without changing the data. When the table's endpoints filter on some of its columns
//! (its layout, see `layout`), the merged rows are sorted by them, and the table's full files not sorted so are
//! rewritten sorted too, a bounded number per compaction. Appends (of any process) keep committing while it
//! runs and are kept: an append's commit never conflicts with it. A replace that lands first takes the files away,
//! and the compaction's commit is refused: its files are removed and the table is as the replace left it. A
//! compaction killed at any point leaves the table at its last commit; the files it wrote are never read.
//!
//! Files no version within the table retention reads are removed by a vacuum the same worker runs now and then.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::prelude::{ident, ParquetReadOptions};
use domain::{Compaction, EngineError, ProjectId, Timestamp};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt};
use tables_delta::{Changes, CommitError, DataFile, NewFile, Snapshot};
use uuid::Uuid;

use crate::storage::{unavailable, Storage};
use crate::tables::catalog::{current, object_meta, state_of, table_error, table_prefix, Current};
use crate::tables::files::{instant_ms, rows_of, FileRows, TableLock};
use crate::tables::imports::{tagged_appends, ImportError, TableWriter, TaggedAppend};
use crate::tables::layout;

/// A file with at least this many rows is full (a row group of the table's files): it is never merged again.
pub(crate) const FULL_FILE_ROWS: u64 = 128 * 1024;
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

/// What a compaction did, and whether its table has more files to sort by its layout than one compaction takes.
pub(crate) struct Compacted {
    pub(crate) done: Option<Compaction>,
    pub(crate) more: bool,
}

/// A compaction re-sorts at most this many rows of full files (always one file at least), so that one
/// compaction's sort stays bounded; the next compaction of the table takes the rest.
const RESORT_ROWS: u64 = 2 * MERGED_FILE_ROWS;

/// Compacts a table: merges its small files once there are [`MIN_SMALL_FILES`] of them, and with `cluster_by`
/// (the columns its endpoints filter on) writes the merged rows sorted by those columns and re-sorts its full
/// files that are not (up to [`RESORT_ROWS`] rows; `more` says when others are left). The table's layout
/// property records `cluster_by` before files are sorted by it, and is removed when `cluster_by` is empty. `done` is `None` when there was nothing to merge, or a replace took
/// the files meanwhile. The caller holds the table's lease; with `sweep`, files no version within the table
/// retention reads are removed first (a vacuum).
///
/// Files with rows of an append not answered yet (`keep`), and those committed after version `after` (whose
/// appends may have been claimed after `keep` was read), keep their names, so that a retry finds them.
pub(crate) async fn compact(
    storage: &Storage,
    rows: &FileRows,
    _lock: TableLock,
    (project, table): (ProjectId, &str),
    ((keep, after), cluster_by): ((&HashSet<Uuid>, u64), &[String]),
    sweep: bool,
) -> Result<Compacted, EngineError> {
    let nothing = Compacted { done: None, more: false };
    let prefix = table_prefix(project, table);
    if sweep {
        match storage.tables().vacuum(&prefix, storage.table_retention()).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(%project, table, removed, "vacuumed a table's unread files"),
            Err(err) => tracing::warn!(%project, table, error = %err, "cannot vacuum a table"),
        }
    }
    let Some(Current::Files(mut snapshot)) = current(storage, &prefix).await? else { return Ok(nothing) };
    // Only columns the table has: a replace may have dropped one since the endpoints were planned.
    let columns: Vec<String> =
        cluster_by.iter().filter(|c| snapshot.schema.column_with_name(c).is_some()).cloned().collect();
    let recorded = layout::recorded(&snapshot);
    if columns.is_empty() && !recorded.is_empty() {
        // No endpoint filters the table any more: its files stay as they are, sorted by nothing it records.
        storage.tables().set_layout(&prefix, tables_delta::LAYOUT, None).await.map_err(table_error)?;
        tracing::info!(%project, table, "the table's layout follows no filter any more");
        let Some(Current::Files(now)) = current(storage, &prefix).await? else { return Ok(nothing) };
        snapshot = now;
    }
    let newer: HashSet<ObjectPath> = match snapshot.version.checked_sub(after) {
        None | Some(0) => HashSet::new(),
        Some(_) => match storage.tables().changes_since(&prefix, after, snapshot.version).await {
            Ok(Changes::Appended(files)) => files.into_iter().map(|file| file.location).collect(),
            // Every file is newer than the version (a replace since): the next compaction looks again.
            Ok(Changes::Rewritten) => return Ok(Compacted { done: None, more: true }),
            Err(err) => return Err(table_error(err)),
        },
    };
    let tag = layout::tag(&columns);
    let (mut small, mut unsorted, mut more) = (Vec::new(), Vec::new(), false);
    let mut unsorted_rows = 0;
    for file in &snapshot.files {
        let meta = object_meta(file);
        let file_rows = match file.rows {
            Some(rows) => rows,
            None => rows_of(storage.store().as_ref(), &meta, Some(rows)).await?,
        };
        let full = file_rows >= FULL_FILE_ROWS;
        let sorted = tag.as_ref().is_none_or(|tag| layout::is_clustered(file, COMPACTED, tag));
        if full && sorted {
            continue;
        }
        if newer.contains(&file.location) {
            more = true;
            continue;
        }
        if !keep.is_empty() && appends_in(storage, &meta).await?.iter().any(|a| keep.contains(&a.write_id)) {
            continue;
        }
        if !full {
            small.push(file.clone());
        } else if unsorted.is_empty() || unsorted_rows + file_rows <= RESORT_ROWS {
            unsorted_rows += file_rows;
            unsorted.push(file.clone());
        } else {
            more = true;
        }
    }
    if small.len() < MIN_SMALL_FILES && unsorted.is_empty() {
        return Ok(nothing);
    }
    // Recorded once files are about to be sorted by them (a table too small to have any keeps no commit).
    if !columns.is_empty() && recorded != columns {
        let property = layout::property(&columns);
        storage.tables().set_layout(&prefix, tables_delta::LAYOUT, property).await.map_err(table_error)?;
        tracing::info!(%project, table, ?columns, "the table's layout follows its endpoints' filters");
    }
    let merging: Vec<DataFile> = small.into_iter().chain(unsorted).collect();
    let locations: Vec<ObjectPath> = merging.iter().map(|f| f.location.clone()).collect();
    let merged = match merge(storage, &locations, &prefix, &columns, SORT_MEMORY).await {
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
    match storage.tables().rewrite(&prefix, &merging, &added).await {
        Ok(_) => {
            let done = Compaction {
                files_before: snapshot.files.len() as u64,
                files_after: (snapshot.files.len() - merging.len() + added.len()) as u64,
                files_merged: merging.len() as u64,
                rows_merged: merged.rows,
            };
            tracing::info!(%project, table, ?done, ?columns, "compacted a table's files");
            Ok(Compacted { done: Some(done), more })
        }
        Err(CommitError::Conflict(_) | CommitError::NoTable(_)) => {
            discard_files(storage, written).await;
            Ok(nothing)
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
pub(crate) struct Merged {
    pub(crate) files: Vec<(ObjectPath, u64)>,
    pub(crate) rows: u64,
}

/// How much memory a compaction's sort holds before it spills to disk.
const SORT_MEMORY: usize = 256 << 20;

/// Reads `files` and writes their rows under `target` in files of up to [`MERGED_FILE_ROWS`] rows: sorted by
/// `columns` when there are any (the files named with their tag), else as read; the sort holds at most `memory`
/// bytes, the rest spilled.
///
/// The files do not state their order (Parquet's `sorting_columns`): DataFusion would take it as each file's
/// order and plan aggregations by those columns to keep it through their repartitions (`preserve_order`),
/// which cost a `count(DISTINCT)` grouped by the first column 1.37x in scenario 13. The gain is the
/// statistics' pruning, which needs no declared order.
pub(crate) async fn merge(
    storage: &Storage,
    files: &[ObjectPath],
    target: &ObjectPath,
    columns: &[String],
    memory: usize,
) -> Result<Merged, ImportError> {
    let failed = |e: datafusion::error::DataFusionError| ImportError::Write(crate::message(&e));
    let ctx = crate::tables::catalog::sorting_session(storage, memory)
        .map_err(|e| ImportError::Write(e.to_string()))?;
    let urls: Vec<String> = files.iter().map(|path| storage.url_of_object(path)).collect();
    let mut frame = ctx.read_parquet(urls, ParquetReadOptions::default()).await.map_err(failed)?;
    let name = match layout::tag(columns) {
        Some(tag) => {
            let keys = columns.iter().map(|c| ident(c).sort(true, false)).collect();
            frame = frame.sort(keys).map_err(failed)?;
            layout::clustered_prefix(COMPACTED, &tag)
        }
        None => COMPACTED.to_owned(),
    };
    let schema = Arc::new(frame.schema().as_arrow().clone());
    let mut stream = frame.execute_stream().await.map_err(failed)?;
    let mut merged = Merged { files: Vec::new(), rows: 0 };
    let mut writer: Option<(ObjectPath, TableWriter)> = None;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(failed)?;
        let (_, open) = match writer.as_mut() {
            Some(open) => open,
            None => {
                let path = target.clone().join(format!("{name}{}.parquet", Uuid::new_v4()));
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

/// The append written under `write_id`, if the table's newest version has its rows. The version is the log's
/// newest, not one this process keeps from what it heard: the writer asked about may have stopped between its
/// commit and announcing it, and a retry that missed its rows would write them twice.
pub(crate) async fn find_tagged(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    write_id: Uuid,
) -> Result<Option<TaggedAppend>, EngineError> {
    let prefix = table_prefix(project, table);
    let newest = storage.tables().checked_snapshot(&prefix).await.map_err(table_error)?;
    let Some(Current::Files(snapshot)) = newest.and_then(state_of) else { return Ok(None) };
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

/// How the table's files are laid out, for its record.
pub(crate) fn layout_of(snapshot: &Snapshot) -> domain::TableLayout {
    layout::of(snapshot, COMPACTED)
}
