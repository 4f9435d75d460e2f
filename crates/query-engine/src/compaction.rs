//! Compaction of a table's small files, and how an append knows its file is part of the table.
//!
//! A compaction writes a new version (see `catalog`): the current version's small files merged, its full files
//! (merged or appended so) moved to the table's `full/` directory, which the pointer lists and no later
//! compaction reads or copies, and the files no merge may take linked in as they are (on a local disk a hard
//! link, on S3 a copy in the bucket). Then one write of `_current` switches the table to it. Runs read one
//! version or the other, so never a row twice or one missing.
//!
//! Appends (of any process) keep adding files to the current version while it runs. So that none is left
//! behind, the compaction first *seals* the version it read: it writes `_sealed` there, naming the new version,
//! and only then lists the files to link. An append, once its file is complete, reads `_current` and then looks
//! for the seal ([`settle`]):
//! - the version is still current and not sealed: its file is there for every run, and if a compaction seals the
//!   version later, that compaction lists (and links) the file;
//! - the version is current but sealed: a compaction is switching, so the append waits for the switch;
//! - the version is no longer current and was sealed: the new version either has the file (the compaction
//!   listed it) or not, and then the append writes its rows again, to the new version (leaving the file with
//!   the old version, which runs that started before the switch may still be reading);
//! - the version is no longer current and not sealed: a replace took the table; the append is written again.
//!
//! A compaction killed before its switch leaves `_sealed` in the table's current version: the next one (under the
//! table's lease, so no other is running) removes the version it was writing and the seal, and appends waiting
//! for the switch go on. Replaced versions are removed a while after the switch ([`GRACE`]), once runs that
//! started before it have read them.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::prelude::ParquetReadOptions;
use domain::{Compaction, EngineError, ProjectId, Timestamp};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};
use uuid::Uuid;

use crate::catalog::{
    current, current_version, is_parquet, is_version_name, pointer, table_prefix, Current, Pointer,
    TableContents, CURRENT, FULL,
};
use crate::imports::{store_error, tagged_appends, ImportError, TableWriter, TaggedAppend};
use crate::storage::{unavailable, Storage};
use crate::table_store::{instant, rows_of, FileRows, TableLock};

/// In a version a compaction replaced (or is replacing): the name of the version that replaces it.
pub(crate) const SEALED: &str = "_sealed";
/// In a version a compaction wrote: when, and from which version.
pub(crate) const COMPACTED: &str = "_compacted";

/// A file with at least this many rows is full (a row group of the table's files): it moves to `full/` and is
/// never merged again.
const FULL_FILE_ROWS: u64 = 128 * 1024;
/// Merged files close past this many rows, so one compaction of many small files still makes files a run can
/// read in parallel.
const MERGED_FILE_ROWS: u64 = 1024 * 1024;
/// A table is compacted once it has this many small files.
pub(crate) const MIN_SMALL_FILES: usize = 8;
/// How long a replaced version stays for the runs that were reading it when the table switched.
pub(crate) const GRACE: Duration = Duration::from_secs(600);
/// How often an append whose version is being switched looks again.
const SETTLE_POLL: Duration = Duration::from_millis(10);

/// The tables this process appended to and has not compacted since, and when it last looked for what their
/// compactions replaced.
#[derive(Debug, Default)]
pub(crate) struct Appended {
    tables: Mutex<HashSet<(ProjectId, String)>>,
    swept: Mutex<HashMap<(ProjectId, String), Instant>>,
}

/// How often a table's replaced versions are looked for: listing them costs one listing each.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl Appended {
    /// Whether it is time to look for what the table's compactions replaced (and then not again for a while).
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

/// Whether an append's files are part of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// They are, for every run from now on.
    Visible,
    /// A compaction moved the table on without them: write the rows again, to its current version. The files
    /// stay where they are, with the version they joined (runs that started before the switch may be reading
    /// them), and go with it.
    Moved,
    /// A replace took the table: write the rows again; the files can go.
    Replaced,
}

/// The version a sealed version's compaction switches to, if it is sealed.
async fn seal(storage: &Storage, version: &ObjectPath) -> Result<Option<String>, object_store::Error> {
    match storage.store().get(&version.clone().join(SEALED)).await {
        Ok(found) => {
            let bytes = found.bytes().await?;
            Ok(Some(String::from_utf8_lossy(&bytes).lines().next().unwrap_or("").trim().to_owned()))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the files an append wrote to `base`, a version of `table`, are part of the table (see the module's
/// comment). Waits while a compaction switches the version.
pub(crate) async fn settle(
    storage: &Storage,
    table: &ObjectPath,
    base: &str,
    written: &[ObjectPath],
) -> Result<Settled, ImportError> {
    let started = std::time::Instant::now();
    loop {
        let current = pointer(storage, table).await.map_err(|e| ImportError::Write(e.to_string()))?;
        let is_base = matches!(current.map(|p| p.target), Some(TableContents::Version(v)) if v == base);
        let sealed = seal(storage, &table.clone().join(base)).await.map_err(store_error)?;
        match (is_base, sealed) {
            (true, None) => return Ok(Settled::Visible),
            (false, None) => return Ok(Settled::Replaced),
            (false, Some(next)) => {
                if !is_version_name(&next) {
                    return Ok(Settled::Replaced);
                }
                let moved = table.clone().join(next.as_str());
                for file in written {
                    let Some(name) = file.filename() else { return Ok(Settled::Moved) };
                    match storage.store().head(&moved.clone().join(name)).await {
                        Ok(_) => {}
                        Err(object_store::Error::NotFound { .. }) => return Ok(Settled::Moved),
                        Err(e) => return Err(store_error(e)),
                    }
                }
                return Ok(Settled::Visible);
            }
            (true, Some(_)) => {
                if started.elapsed() > GRACE {
                    return Err(ImportError::Write(format!(
                        "table {table} is being compacted and did not switch in {} s",
                        GRACE.as_secs()
                    )));
                }
                tokio::time::sleep(SETTLE_POLL).await;
            }
        }
    }
}

/// Compacts a table if its current version has [`MIN_SMALL_FILES`] small files; `None` when there was nothing
/// to do. The caller holds the table's lease; `lock` is this process's lock of the table, held for the switch;
/// with `sweep`, what earlier compactions replaced is removed first once [`GRACE`] has passed.
///
/// The small files are merged; merged files of [`FULL_FILE_ROWS`] rows or more, and files appended that full,
/// become full files (`full/`, listed by the pointer) that no later compaction reads or copies again. The new
/// version's directory holds the rest: the last merged file if it is small, and the files no merge may take.
pub(crate) async fn compact(
    storage: &Storage,
    rows: &FileRows,
    lock: TableLock,
    (project, table): (ProjectId, &str),
    keep: &HashSet<Uuid>,
    sweep: bool,
) -> Result<Option<Compaction>, EngineError> {
    let prefix = table_prefix(project, table);
    let Some(Pointer { target: TableContents::Version(base), created, full }) =
        pointer(storage, &prefix).await?
    else {
        // A table of files written before versions existed, a source read where it is, or no table.
        return Ok(None);
    };
    if sweep {
        remove_replaced(storage, &prefix, &base, &full).await;
    }
    let version = prefix.clone().join(base.as_str());
    recover(storage, &prefix, &version).await?;
    let before = parquet(storage, &version).await?;
    let (mut small, mut whole) = (Vec::new(), Vec::new());
    for meta in &before {
        if rows_of(storage.store().as_ref(), meta, Some(rows)).await? >= FULL_FILE_ROWS {
            whole.push(meta.location.clone());
            continue;
        }
        // A file with rows of an append not answered yet keeps its name, so that a retry finds them.
        if !keep.is_empty() && appends_in(storage, meta).await?.iter().any(|a| keep.contains(&a.write_id)) {
            continue;
        }
        small.push(meta.location.clone());
    }
    if small.len() < MIN_SMALL_FILES {
        return Ok(None);
    }
    let next = format!("v-{}", Uuid::new_v4());
    let target = prefix.clone().join(next.as_str());
    let full_dir = prefix.clone().join(FULL);
    let mut written = Vec::new();
    let merged = async {
        let merged = merge(storage, &small, &target)
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string().into()))?;
        // Full files leave the version for good: merged ones now, appended ones by name.
        let mut promoted = Vec::new();
        for (file, file_rows) in &merged.files {
            let Some(name) = file.filename() else { continue };
            if *file_rows >= FULL_FILE_ROWS {
                let to = full_dir.clone().join(name);
                storage.store().copy(file, &to).await.map_err(unavailable)?;
                written.push(to);
                storage.delete(vec![file.clone()]).await.map_err(unavailable)?;
                promoted.push(name.to_owned());
            }
        }
        for file in &whole {
            let Some(name) = file.filename() else { continue };
            let to = full_dir.clone().join(name);
            storage.store().copy(file, &to).await.map_err(unavailable)?;
            written.push(to);
            promoted.push(name.to_owned());
        }
        Ok::<_, EngineError>((merged, promoted))
    }
    .await;
    let (merged, promoted) = match merged {
        Ok(merged) => merged,
        Err(err) => {
            discard(storage, &target).await;
            discard_files(storage, written).await;
            return Err(err);
        }
    };
    let now = domain::Clock::now(&domain::SystemClock);
    // For people reading the storage; the record's time is the mark's own.
    let stamp = now
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| now.unix_timestamp().to_string());
    let switched = async {
        put(storage, &target.clone().join(COMPACTED), format!("{stamp}\n{base}\n")).await?;
        let _held = lock.lock().await;
        put(storage, &version.clone().join(SEALED), format!("{next}\n")).await?;
        let gone: HashSet<&ObjectPath> = small.iter().chain(&whole).collect();
        let mut lineage = Lineage::default();
        lineage.taken.extend(gone.iter().filter_map(|path| path.filename().map(str::to_owned)));
        lineage
            .brought
            .extend(merged.files.iter().filter_map(|(path, _)| path.filename().map(str::to_owned)));
        let mut kept = 0_u64;
        for meta in parquet(storage, &version).await? {
            if gone.contains(&meta.location) {
                continue;
            }
            let Some(name) = meta.location.filename() else { continue };
            storage.store().copy(&meta.location, &target.clone().join(name)).await.map_err(unavailable)?;
            lineage.taken.insert(name.to_owned());
            lineage.brought.insert(name.to_owned());
            kept += 1;
        }
        // What the version holds of which, for stored results that follow the table (`fold`).
        put(storage, &target.clone().join(COMPACTED), lineage.text(&stamp, &base)).await?;
        // A replace (of another process, which takes no lease) may have switched the table meanwhile: it wins.
        if current_version(storage, &prefix).await?.as_deref() != Some(base.as_str()) {
            return Ok(None);
        }
        let full: Vec<String> = full.iter().cloned().chain(promoted.iter().cloned()).collect();
        let files = full.len() as u64;
        let text = Pointer { target: TableContents::Version(next.clone()), created, full }.text();
        storage
            .store()
            .put(&prefix.clone().join(CURRENT), PutPayload::from(text))
            .await
            .map_err(unavailable)?;
        Ok::<_, EngineError>(Some(files + kept))
    }
    .await;
    match switched {
        Ok(Some(kept)) => {
            let small_merged = merged.files.iter().filter(|(_, rows)| *rows < FULL_FILE_ROWS).count() as u64;
            let done = Compaction {
                files_before: before.len() as u64 + full.len() as u64,
                files_after: small_merged + kept,
                files_merged: small.len() as u64,
                rows_merged: merged.rows,
            };
            tracing::info!(%project, table, ?done, "compacted a table's small files");
            Ok(Some(done))
        }
        Ok(None) => {
            discard(storage, &target).await;
            discard_files(storage, written).await;
            Ok(None)
        }
        Err(err) => {
            // Sealed but not switched: unseal, so that appends waiting for the switch go on.
            discard(storage, &target).await;
            discard_files(storage, written).await;
            if let Err(unseal) = storage.delete(vec![version.clone().join(SEALED)]).await {
                tracing::warn!(%project, table, error = %unseal, "cannot unseal a table after a failed compaction");
            }
            Err(err)
        }
    }
}

async fn discard_files(storage: &Storage, files: Vec<ObjectPath>) {
    if let Err(err) = storage.delete(files).await {
        tracing::warn!(error = %err, "cannot remove an unfinished compaction's full files");
    }
}

async fn put(storage: &Storage, path: &ObjectPath, text: String) -> Result<(), EngineError> {
    storage.store().put(path, PutPayload::from(text)).await.map(|_| ()).map_err(unavailable)
}

/// The Parquet files of a version's directory, in name order.
pub(crate) async fn parquet(storage: &Storage, version: &ObjectPath) -> Result<Vec<ObjectMeta>, EngineError> {
    let mut files: Vec<ObjectMeta> = storage
        .objects(version)
        .await
        .map_err(unavailable)?
        .into_iter()
        .filter(|o| is_parquet(&o.location))
        .collect();
    files.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(files)
}

async fn discard(storage: &Storage, target: &ObjectPath) {
    if let Err(err) = storage.remove_prefix(target).await {
        tracing::warn!(location = %target, error = %err, "cannot remove an unfinished compaction's files");
    }
}

/// Undoes a compaction that sealed the current version and never switched (its process was killed): removes the
/// version it was writing and the seal.
async fn recover(storage: &Storage, prefix: &ObjectPath, version: &ObjectPath) -> Result<(), EngineError> {
    let Some(next) = seal(storage, version).await.map_err(unavailable)? else { return Ok(()) };
    tracing::warn!(table = %prefix, "undoing a compaction that did not finish");
    if is_version_name(&next) {
        storage.remove_prefix(&prefix.clone().join(next.as_str())).await.map_err(unavailable)?;
    }
    storage.delete(vec![version.clone().join(SEALED)]).await.map_err(unavailable)
}

/// Removes the versions compactions replaced, the ones they wrote but never switched to, and full files no
/// pointer lists (a compaction that stopped before its switch wrote them), once [`GRACE`] has passed since; a
/// version a replace or an import is writing has no mark and is left to it.
async fn remove_replaced(storage: &Storage, prefix: &ObjectPath, current: &str, full: &[String]) {
    let Ok(children) = storage.children(prefix).await else { return };
    let now = domain::Clock::now(&domain::SystemClock);
    for child in children.into_iter().filter(|c| c != current && is_version_name(c)) {
        let version = prefix.clone().join(child.as_str());
        let Ok(objects) = storage.objects(&version).await else { continue };
        let marked = objects.iter().filter(|o| matches!(o.location.filename(), Some(SEALED | COMPACTED)));
        if marked.map(instant).max().is_some_and(|at| now - at > GRACE) {
            if let Err(err) = storage.remove_prefix(&version).await {
                tracing::warn!(location = %version, error = %err, "cannot remove a replaced table version");
            }
        }
    }
    let Ok(written) = storage.objects(&prefix.clone().join(FULL)).await else { return };
    let orphans: Vec<ObjectPath> = written
        .into_iter()
        .filter(|o| o.location.filename().is_some_and(|name| !full.iter().any(|f| f == name)))
        .filter(|o| now - instant(o) > GRACE)
        .map(|o| o.location)
        .collect();
    if !orphans.is_empty() {
        discard_files(storage, orphans).await;
    }
}

/// What merging wrote: each file and its rows.
struct Merged {
    files: Vec<(ObjectPath, u64)>,
    rows: u64,
}

/// Reads `small` in order and writes their rows to `target` in files of up to [`MERGED_FILE_ROWS`] rows.
async fn merge(storage: &Storage, small: &[ObjectPath], target: &ObjectPath) -> Result<Merged, ImportError> {
    let ctx = crate::catalog::import_session(storage, None).map_err(|e| ImportError::Write(e.to_string()))?;
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
                let path = target.clone().join(format!("part-{}-0.parquet", Uuid::new_v4()));
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

/// What a compaction's version holds: the files of the version before it that it took (merged, moved to
/// `full/`, or linked as they are: every file the table had there, which a run of the version before read or
/// will read), and the files it brought into its own directory (merged, and linked). The files of its directory it
/// did not bring are the appends made to it. Written in its `_compacted` mark, after the time and the version
/// before, one `taken NAME` or `brought NAME` line each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Lineage {
    pub(crate) base: String,
    pub(crate) taken: BTreeSet<String>,
    pub(crate) brought: BTreeSet<String>,
}

impl Lineage {
    fn text(&self, stamp: &str, base: &str) -> String {
        let mut text = format!("{stamp}\n{base}\n");
        for name in &self.taken {
            text.push_str(&format!("taken {name}\n"));
        }
        for name in &self.brought {
            text.push_str(&format!("brought {name}\n"));
        }
        text
    }

    /// The lineage a mark says; `None` for a mark written before marks said it (or none at all).
    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let _stamp = lines.next()?;
        let base = lines.next().filter(|b| is_version_name(b))?.to_owned();
        let mut lineage = Self { base, ..Self::default() };
        for line in lines {
            match line.split_once(' ') {
                Some(("taken", name)) => lineage.taken.insert(name.to_owned()),
                Some(("brought", name)) => lineage.brought.insert(name.to_owned()),
                _ => return None,
            };
        }
        // Every compaction takes files: a mark without any is an older one.
        (!lineage.taken.is_empty()).then_some(lineage)
    }
}

/// The lineage of a version a compaction wrote, from its mark; `None` when it has none that says it (a replace
/// wrote it, a compaction of an earlier release, or it is gone).
pub(crate) async fn lineage(storage: &Storage, version: &ObjectPath) -> Result<Option<Lineage>, EngineError> {
    match storage.store().get(&version.clone().join(COMPACTED)).await {
        Ok(found) => {
            let bytes = found.bytes().await.map_err(unavailable)?;
            Ok(std::str::from_utf8(&bytes).ok().and_then(Lineage::parse))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(unavailable(e)),
    }
}

/// The append written under `write_id`, if the table's current version has its rows.
pub(crate) async fn find_tagged(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    write_id: Uuid,
) -> Result<Option<TaggedAppend>, EngineError> {
    let prefix = table_prefix(project, table);
    let Some(Current::Files(version)) = current(storage, &prefix).await? else { return Ok(None) };
    for meta in version.files(storage).await.map_err(unavailable)? {
        if let Some(found) = appends_in(storage, &meta).await?.into_iter().find(|a| a.write_id == write_id) {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// When the table's current version was written by a compaction, from its mark.
pub(crate) fn compacted_at(objects: &[ObjectMeta]) -> Option<Timestamp> {
    objects.iter().find(|o| o.location.filename() == Some(COMPACTED)).map(instant)
}
