//! Tables kept decoded in memory ("hot"), so that runs read their rows without reading or decoding Parquet.
//!
//! A table's files never change once written: an append adds a file, a replace or a compaction switches the
//! table to other files. So what is kept is a file's columns, those runs of the table read: decoded after a
//! run of the table's newest version found the file cold or without a column it read, in the background and
//! one file at a time, on a thread of the lowest priority (at most one core's work), beside the columns of the
//! file decoded before; that run read it from storage as before. A later run of the newest version reads the
//! files kept here with its columns from memory and the others (an append's new file, until it is decoded
//! too) from storage, in one plan ([`crate::snapshot_scan`]), and drops the table's files it no longer names (a
//! replace's or a compaction's predecessors) at once. Columns no run reads are never decoded, nor held.
//!
//! Bytes kept are bounded (`--hot-tables-mb`, set apart from the memory queries get, so `--max-memory` holds),
//! and shared between projects by what they hold: each project's files are in a byte-bounded LRU cache of
//! DataFusion's own, and a file that needs room takes it from the project holding the most (counting the file
//! to its own), its least recently read files leaving first. So a project may use all the room others leave,
//! but reading many tables never pushes another project's files out while it holds more than that project: of
//! two projects reading more than the bound, each keeps half. A file larger than the bound, or one that
//! cannot be read, is not tried again.
//!
//! Each file is kept as slices of the session's batch size (so that columns decoded at different times line
//! up), each knowing its least and greatest value of every column whose order pruning may trust, and its
//! nulls: a run's filters skip the slices that cannot hold a matching row through DataFusion's
//! `PruningPredicate`, as the Parquet reader skips row groups and pages by the same statistics. Floats have
//! none (a `NaN` sorts above every number here, and the session's comparisons must decide), so a filter on a
//! float column reads every slice.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt64Array};
use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::{Column, Result, ScalarValue, ToDFSchema};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::execution::cache::default_cache::DefaultCache;
use datafusion::execution::cache::{Cache, CacheKey, CacheValue};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::Expr;
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;
use datafusion_functions_aggregate_common::min_max::{max_batch, min_batch};
use domain::ProjectId;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectMeta;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::runtime::BackgroundRuntime;
use crate::types::cast_to;

/// The decoded files of tables, within a bound of bytes.
pub(crate) struct HotTables {
    /// Bytes kept at most, across projects.
    bound: usize,
    /// Each project's files: a cache bounded by `bound` alone, and by what [`HotTables::keep`] takes from it.
    projects: Mutex<HashMap<ProjectId, Arc<Files>>>,
    /// What became of each file a run found cold, and the files of each table (by its key) that a read of its
    /// newest version compares with those it names.
    claims: Mutex<Claims>,
    /// One file decoded at a time, on a thread of the lowest priority: decoding takes at most one core (the
    /// runs beside it still take longer: docs/storage.md, Hot tables).
    decoding: tokio::sync::Semaphore,
    decoder: BackgroundRuntime,
    metrics: HotMetrics,
    /// Told when a decoding ends, for tests that wait for a table to be hot.
    #[cfg(test)]
    decoded: tokio::sync::Notify,
    #[cfg(test)]
    decodes: std::sync::atomic::AtomicUsize,
}

/// What `/metrics` shows of the tables kept decoded.
#[derive(Debug, Default)]
struct HotMetrics {
    bytes: Gauge,
    files: Gauge,
    decodes: Counter,
}

/// One project's decoded files, the least recently read leaving first.
type Files = DefaultCache<Path, HotFile>;

/// A table whose files are kept: its project's share of the bound is what it is read against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HotTable {
    pub(crate) project: ProjectId,
    pub(crate) name: String,
}

#[derive(Default)]
struct Claims {
    files: HashMap<Path, Claim>,
    /// Each table's files, with the newest version of the table known to name each: a read of a version that
    /// does not name a file drops it only when that version is as new (a read that began before an append
    /// keeps the appended file).
    tables: HashMap<HotTable, HashMap<Path, u64>>,
    /// The columns runs of each table read, by name: what is decoded of its files, so that a file new to runs
    /// (a compaction's, another process's append) is decoded for all of them at once.
    read: HashMap<HotTable, HashSet<String>>,
}

enum Claim {
    /// Being decoded: `columns`, in `flights` decodings one after another (runs that found the file being
    /// decoded without their columns queue theirs, so a burst of runs reading different columns has them all
    /// decoded without running again). `failed` once one could not be.
    Decoding { columns: HashSet<usize>, flights: u32, failed: bool },
    /// Larger than the bound, or unreadable: not tried again.
    Refused,
    /// Decoded once (of `bytes`), and since left the cache for files read more recently: `cold_reads` runs read
    /// it from storage since.
    Decoded { bytes: usize, cold_reads: u32 },
}

impl std::fmt::Debug for HotTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (bytes, files) = self.held();
        f.debug_struct("HotTables")
            .field("files", &files)
            .field("bytes", &bytes)
            .field("limit", &self.bound)
            .finish_non_exhaustive()
    }
}

/// Claims are forgotten past this many files, so that what is remembered stays bounded.
const MAX_CLAIMS: usize = 100_000;

/// A file that left the cache is decoded again when there is room for it, or once this many runs read it from
/// storage: a table read often earns its place back, and tables that together exceed the bound and are read
/// in turn are not decoded again at every run (one core's work, for nothing).
pub(crate) const COLD_READS_TO_DECODE_AGAIN: u32 = 8;

impl HotTables {
    /// Tables kept within `bytes`; `None` for 0 (nothing is kept, and nothing decoded).
    pub(crate) fn new(bytes: usize) -> Option<Arc<Self>> {
        (bytes > 0).then(|| {
            Arc::new(Self {
                bound: bytes,
                projects: Mutex::default(),
                claims: Mutex::default(),
                decoding: tokio::sync::Semaphore::new(1),
                decoder: BackgroundRuntime::idle("hot-table-decode"),
                metrics: HotMetrics::default(),
                #[cfg(test)]
                decoded: tokio::sync::Notify::new(),
                #[cfg(test)]
                decodes: std::sync::atomic::AtomicUsize::new(0),
            })
        })
    }

    /// Exposes what is kept in `registry`.
    pub(crate) fn register_metrics(&self, registry: &mut Registry) {
        let HotMetrics { bytes, files, decodes } = &self.metrics;
        registry.register("hot_table_bytes", "Bytes of table files kept decoded for runs", bytes.clone());
        registry.register("hot_table_files", "Table files kept decoded for runs", files.clone());
        registry.register(
            "hot_table_decodes",
            "Decodings of table files' columns in the background after a run read them from storage",
            decodes.clone(),
        );
    }

    /// Sets the gauges to what the caches hold now.
    fn observe(&self) {
        let (bytes, files) = self.held();
        self.metrics.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.metrics.files.set(i64::try_from(files).unwrap_or(i64::MAX));
    }

    /// Bytes kept, and files, of every project.
    fn held(&self) -> (usize, usize) {
        let projects = self.projects.lock().unwrap_or_else(PoisonError::into_inner);
        projects
            .values()
            .fold((0, 0), |(bytes, files), held| (bytes + held.memory_used(), files + held.len()))
    }

    /// The files `project` keeps, if it keeps any.
    fn files_of(&self, project: ProjectId) -> Option<Arc<Files>> {
        self.projects.lock().unwrap_or_else(PoisonError::into_inner).get(&project).cloned()
    }

    /// Keeps `file` for `project`, making room from the project holding the most (the file counted to its own;
    /// on a tie, its own project) until it fits: a project never gives way to one that would hold more. Only
    /// a project with nothing left to give (a first file larger than its share) takes room from the next.
    fn keep(&self, project: ProjectId, location: &Path, file: HotFile) {
        let size = location.size() + file.size();
        let mut projects = self.projects.lock().unwrap_or_else(PoisonError::into_inner);
        // It replaces what was kept of the same file (fewer of its columns).
        if let Some(held) = projects.get(&project) {
            held.remove(location);
        }
        loop {
            let used: usize = projects.values().map(|held| held.memory_used()).sum();
            let over = (used + size).saturating_sub(self.bound);
            if over == 0 {
                break;
            }
            let rank = |id: &ProjectId, held: &Files| {
                let own = if *id == project { size } else { 0 };
                (held.memory_used() + own, *id == project)
            };
            let largest = projects
                .iter()
                .filter(|(_, held)| held.memory_used() > 0)
                .max_by_key(|(id, held)| rank(id, held))
                .map(|(_, held)| Arc::clone(held));
            // Nothing left to drop: the file is larger than the bound (the cache refuses it).
            let Some(largest) = largest else { break };
            // The cache drops its least recently read files until it is within the limit.
            largest.update_cache_limit(largest.memory_used().saturating_sub(over));
            largest.update_cache_limit(self.bound);
        }
        projects.retain(|_, held| held.len() > 0);
        let held = projects
            .entry(project)
            .or_insert_with(|| Arc::new(DefaultCache::new(self.bound).with_name("hot table files")));
        held.put(location, file);
    }

    /// Reading the columns `projection` names of `table`'s newest version (`version`), whose files are `files`:
    /// the ones kept here with those columns decoded, and those to read from storage. The table's files that
    /// `files` does not name are dropped, unless a newer version named them (an append's, committed since the
    /// read began).
    pub(crate) fn split(
        &self,
        table: &HotTable,
        (files, version): (&[ObjectMeta], u64),
        projection: Projection<'_>,
    ) -> (Vec<HotFile>, Vec<ObjectMeta>) {
        self.forget_other_files(table, files, version);
        self.kept_of(table, files, projection)
    }

    /// Of `files` of `table`, the ones kept here with the columns of `projection` decoded, and those to read
    /// from storage; the table's other files stay (a fold reads only the files appended since its result).
    pub(crate) fn kept_of(
        &self,
        table: &HotTable,
        files: &[ObjectMeta],
        projection: Projection<'_>,
    ) -> (Vec<HotFile>, Vec<ObjectMeta>) {
        let Some(held) = self.files_of(table.project) else { return (Vec::new(), files.to_vec()) };
        let (mut hot, mut cold) = (Vec::new(), Vec::new());
        for file in files {
            let kept = held.get(&file.location).filter(|kept| kept.is_of(file) && kept.has_all(projection));
            match kept {
                Some(kept) => hot.push(kept),
                None => cold.push(file.clone()),
            }
        }
        (hot, cold)
    }

    fn forget_other_files(&self, table: &HotTable, files: &[ObjectMeta], version: u64) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let Claims { files: claimed, tables, .. } = &mut *claims;
        let Some(kept) = tables.get_mut(table) else { return };
        let named: HashSet<&Path> = files.iter().map(|file| &file.location).collect();
        if kept.iter().all(|(path, at)| named.contains(path) || *at > version) {
            return;
        }
        let held = self.files_of(table.project);
        kept.retain(|path, at| {
            let stays = named.contains(path) || *at > version;
            if !stays {
                if let Some(held) = &held {
                    held.remove(path);
                }
                claimed.remove(path);
            }
            stays
        });
        self.observe();
    }

    /// Keeps the rows an append wrote as `file` of `table` when the table has files kept here, so that runs
    /// and folds read them from memory at once instead of from storage until a run had them decoded: an
    /// append moves a hot table forward. `rows` are the file's, in its order, kept with the columns runs of the
    /// table read (strings as views, as its scans read them); not at all when they do not cast to the columns
    /// of its kept files, or are more than the bound.
    pub(crate) fn appended(
        &self,
        table: &HotTable,
        (file, version): (&ObjectMeta, u64),
        rows: &[RecordBatch],
    ) {
        let Some(held) = self.files_of(table.project) else { return };
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(kept) = claims.tables.get(table) else { return };
        let Some(schema) = kept.keys().find_map(|path| Some(Arc::clone(held.get(path)?.schema()))) else {
            return;
        };
        let columns = claims.read.get(table).map_or_else(Vec::new, |read| places(&schema, read));
        let Some(decoded) = HotFile::of_rows(file, (&schema, &columns), rows) else { return };
        if file.location.size() + decoded.size() > self.bound {
            return;
        }
        claims.files.insert(file.location.clone(), Claim::Decoded { bytes: decoded.size(), cold_reads: 0 });
        claims.tables.entry(table.clone()).or_default().insert(file.location.clone(), version);
        self.keep(table.project, &file.location, decoded);
        drop(claims);
        self.observe();
    }

    /// The columns to decode now of `file` of `table`, which a run of its version `version` reading the
    /// columns of `projection` found cold or without them decoded: those and the ones earlier runs of the
    /// table read, that are neither decoded nor being decoded; `None` when none is to be.
    pub(crate) fn claim(
        &self,
        table: &HotTable,
        (file, version): (&ObjectMeta, u64),
        (schema, projection): (&Schema, Projection<'_>),
    ) -> Option<Vec<usize>> {
        let held = self.files_of(table.project);
        let room = self.bound.saturating_sub(self.held().0);
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if claims.files.len() >= MAX_CLAIMS {
            *claims = Claims::default();
        }
        // This run's columns, and those earlier runs of the table read.
        let names = schema.fields();
        let read = claims.read.entry(table.clone()).or_default();
        match projection {
            Some(projection) => {
                read.extend(projection.iter().filter_map(|&at| Some(names.get(at)?.name().clone())))
            }
            None => read.extend(names.iter().map(|field| field.name().clone())),
        }
        let read = places(schema, read);
        // Decoded whole, a file is never smaller than it is stored: one stored larger than the bound is not
        // decoded whole only to be refused (a transient copy of it that no memory pool sees). Some of its
        // columns may fit; a decoding stops as soon as they do not.
        let fits =
            read.len() < names.len() || usize::try_from(file.size).is_ok_and(|size| size <= self.bound);
        let kept = held.as_ref().and_then(|held| held.get(&file.location)).filter(|kept| kept.is_of(file));
        // Of the columns runs of the table read, those not decoded in what is kept of the file.
        let needed = match &kept {
            Some(kept) => read.into_iter().filter(|&at| !kept.has(at)).collect(),
            None => read,
        };
        let decode = match claims.files.get_mut(&file.location) {
            None if !fits => {
                claims.files.insert(file.location.clone(), Claim::Refused);
                return None;
            }
            Some(Claim::Refused) => return None,
            // Decoded after the decodings under way (other runs' columns, or this run's decoded already).
            Some(Claim::Decoding { columns, flights, .. }) => {
                let queued: Vec<usize> = needed.into_iter().filter(|at| !columns.contains(at)).collect();
                if queued.is_empty() {
                    return None;
                }
                columns.extend(&queued);
                *flights += 1;
                queued
            }
            // Kept since the run found it cold (its decoding ended in between), perhaps without the columns
            // runs read: those are decoded.
            Some(Claim::Decoded { .. }) if kept.is_some() => {
                if needed.is_empty() {
                    return None;
                }
                needed
            }
            Some(Claim::Decoded { bytes, cold_reads }) => {
                *cold_reads += 1;
                if *bytes > room && *cold_reads < COLD_READS_TO_DECODE_AGAIN {
                    return None;
                }
                needed
            }
            None => needed,
        };
        if !matches!(claims.files.get(&file.location), Some(Claim::Decoding { .. })) {
            let columns = decode.iter().copied().collect();
            claims
                .files
                .insert(file.location.clone(), Claim::Decoding { columns, flights: 1, failed: false });
        }
        let named = claims.tables.entry(table.to_owned()).or_default();
        named.entry(file.location.clone()).and_modify(|at| *at = (*at).max(version)).or_insert(version);
        Some(decode)
    }

    /// Decodes the `columns` of `file` (places in `schema`, the table's scan schema) by executing `plan` (a
    /// scan of that one file reading those columns, in that order) in the background, and keeps them beside
    /// the columns of the file kept already, in slices of the session's batch size.
    pub(crate) fn decode(
        self: &Arc<Self>,
        (project, file): (ProjectId, ObjectMeta),
        (schema, columns): (SchemaRef, Vec<usize>),
        plan: Arc<dyn ExecutionPlan>,
        ctx: Arc<TaskContext>,
    ) {
        let decoder = match self.decoder.handle() {
            Ok(decoder) => decoder,
            Err(err) => return self.refuse(&file, &err),
        };
        let this = Arc::clone(self);
        #[cfg(test)]
        self.decodes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        decoder.spawn(async move {
            let turn = this.decoding.acquire().await;
            let kept = this.files_of(project).and_then(|held| held.get(&file.location));
            let kept = kept.filter(|kept| kept.is_of(&file)).map_or(0, |kept| kept.size());
            let within = this.bound.saturating_sub(file.location.size() + kept);
            let decoded = HotFile::decoded(&file, (plan, ctx), (&schema, &columns), within).await;
            drop(turn);
            let decoded = match decoded {
                Ok(Some(decoded)) => Some(decoded),
                Ok(None) => {
                    let limit = this.bound;
                    tracing::info!(file = %file.location, limit, "table file larger than --hot-tables-mb");
                    None
                }
                Err(err) => {
                    tracing::warn!(file = %file.location, error = %err, "table file not kept decoded");
                    None
                }
            };
            let mut claims = this.claims.lock().unwrap_or_else(PoisonError::into_inner);
            // Unless a read of a newer version dropped the file meanwhile.
            if let Some(entry) = claims.files.get_mut(&file.location) {
                let kept = this.files_of(project).and_then(|held| held.get(&file.location));
                let mut bytes = kept.as_ref().map_or(0, HotFile::size);
                if let Some(decoded) = &decoded {
                    // With the columns decoded before, while they are still kept.
                    let decoded =
                        kept.and_then(|kept| kept.merged(decoded)).unwrap_or_else(|| decoded.clone());
                    bytes = decoded.size();
                    this.keep(project, &file.location, decoded);
                    this.metrics.decodes.inc();
                    this.observe();
                }
                // The last decoding of those queued says what became of the file (a claim refused or
                // decoded meanwhile stays so).
                if let Claim::Decoding { columns: queued, flights, failed } = entry {
                    queued.retain(|at| !columns.contains(at));
                    *flights = flights.saturating_sub(1);
                    *failed |= decoded.is_none();
                    if *flights == 0 {
                        *entry =
                            if *failed { Claim::Refused } else { Claim::Decoded { bytes, cold_reads: 0 } };
                    }
                }
            }
            drop(claims);
            #[cfg(test)]
            this.decoded.notify_waiters();
        });
    }

    /// `file`, claimed, cannot be decoded: it is not tried again.
    pub(crate) fn refuse(&self, file: &ObjectMeta, why: &dyn std::fmt::Display) {
        tracing::warn!(file = %file.location, error = %why, "table file not kept decoded");
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        match claims.files.get_mut(&file.location) {
            // Others queued: the last says so.
            Some(Claim::Decoding { flights, failed, .. }) if *flights > 1 => {
                *flights -= 1;
                *failed = true;
            }
            _ => {
                claims.files.insert(file.location.clone(), Claim::Refused);
            }
        }
    }

    /// Waits until no file is being decoded.
    #[cfg(test)]
    pub(crate) async fn settled(&self) {
        loop {
            let decoded = self.decoded.notified();
            let decoding = {
                let claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
                claims.files.values().any(|claim| matches!(claim, Claim::Decoding { .. }))
            };
            if !decoding {
                return;
            }
            let _ = tokio::time::timeout(std::time::Duration::from_millis(50), decoded).await;
        }
    }

    /// Files decoded so far.
    #[cfg(test)]
    pub(crate) fn decodes(&self) -> usize {
        self.decodes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes kept, and files.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> (usize, usize) {
        self.held()
    }

    /// Bytes `project` keeps.
    #[cfg(test)]
    pub(crate) fn kept_by(&self, project: ProjectId) -> usize {
        self.files_of(project).map_or(0, |held| held.memory_used())
    }
}

/// One table file, decoded: the columns runs of it read.
#[derive(Clone)]
pub(crate) struct HotFile(Arc<Decoded>);

struct Decoded {
    /// The file's size and time when it was decoded: a file at the same path otherwise is another.
    size: u64,
    modified: chrono::DateTime<chrono::Utc>,
    /// Every column of the table's scans (strings as views), of which `columns` holds some.
    schema: SchemaRef,
    /// The rows of each slice: consecutive rows of the file, as many as the session's batch size but in the
    /// last, so that columns decoded at different times slice the file alike.
    rows: Vec<usize>,
    /// By their place in `schema`: the columns decoded.
    columns: Vec<Option<Arc<HotColumn>>>,
    bytes: usize,
}

/// One column of a file, in slices, with what pruning needs to know of each.
struct HotColumn {
    slices: Vec<ArrayRef>,
    /// Of each slice, its least and greatest values when pruning may trust their order.
    bounds: Vec<Option<(ScalarValue, ScalarValue)>>,
    nulls: Vec<u64>,
    bytes: usize,
}

impl CacheValue for HotFile {
    fn size(&self) -> usize {
        self.0.bytes
    }
}

/// Columns of a table's scan schema, by their place in it; `None` for all of them.
pub(crate) type Projection<'a> = Option<&'a [usize]>;

impl HotFile {
    /// The `columns` of `file` (places in `schema`, the table's scan schema) decoded by executing `plan`, a scan
    /// of the file that reads those columns in that order, in slices of `slice_rows`: each batch is copied
    /// into slices of its own buffers as it comes (strings read as views point into the pages they were
    /// decoded from), so that decoding holds little more than what is kept. `None` as soon as what it would
    /// keep is more than `within` bytes.
    async fn decoded(
        file: &ObjectMeta,
        (plan, ctx): (Arc<dyn ExecutionPlan>, Arc<TaskContext>),
        (schema, columns): (&SchemaRef, &[usize]),
        within: usize,
    ) -> Result<Option<Self>> {
        let slice_rows = ctx.session_config().batch_size().max(1);
        let mut slices = BatchCoalescer::new(plan.schema(), slice_rows);
        let mut stream = datafusion::physical_plan::execute_stream(plan, ctx)?;
        let mut decoded = DecodedColumns::new(columns.len());
        loop {
            let batch = stream.try_next().await?;
            match &batch {
                Some(batch) => slices.push_batch(batch.clone())?,
                None => slices.finish_buffered_batch()?,
            }
            while let Some(slice) = slices.next_completed_batch() {
                decoded.push(&slice);
                if decoded.bytes > within {
                    return Ok(None);
                }
            }
            if batch.is_none() {
                break;
            }
        }
        Ok(Some(decoded.into_file(file, schema, columns)))
    }

    /// `rows` an append wrote as `file`, those of `columns` of `schema` (the table's scan schema: the one a
    /// kept file of the table has), in slices of a session's batch size; `None` unless the rows have the
    /// columns of `schema`, strings and binaries read as views the only difference (a table replaced with
    /// other types under the same names keeps its earlier files until a run drops them: their columns are
    /// never the ones new rows are cast to).
    fn of_rows(
        file: &ObjectMeta,
        (schema, columns): (&SchemaRef, &[usize]),
        rows: &[RecordBatch],
    ) -> Option<Self> {
        let viewed = |data_type: &DataType| match data_type {
            DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
            DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
            other => other.clone(),
        };
        let same = |batch: &RecordBatch| {
            let fields = batch.schema_ref().fields();
            fields.len() == schema.fields().len()
                && fields.iter().zip(schema.fields()).all(|(own, kept)| {
                    own.name() == kept.name()
                        && own.is_nullable() == kept.is_nullable()
                        && (own.data_type() == kept.data_type()
                            || &viewed(own.data_type()) == kept.data_type())
                })
        };
        let projected = Arc::new(schema.project(columns).ok()?);
        let mut slices =
            BatchCoalescer::new(Arc::clone(&projected), SessionConfig::new().batch_size().max(1));
        for batch in rows {
            let cast = same(batch).then(|| cast_to(batch, schema).ok()).flatten()?;
            slices.push_batch(cast.project(columns).ok()?).ok()?;
        }
        slices.finish_buffered_batch().ok()?;
        let mut decoded = DecodedColumns::new(columns.len());
        while let Some(slice) = slices.next_completed_batch() {
            decoded.push(&slice);
        }
        Some(decoded.into_file(file, schema, columns))
    }

    /// The table's scan schema, of which it holds the columns runs read.
    fn schema(&self) -> &SchemaRef {
        &self.0.schema
    }

    /// Whether its column at `at` (of the table's scan schema) is decoded.
    fn has(&self, at: usize) -> bool {
        self.0.columns.get(at).is_some_and(Option::is_some)
    }

    /// Whether the columns of `projection` are decoded (all of them for `None`).
    fn has_all(&self, projection: Projection<'_>) -> bool {
        match projection {
            Some(projection) => projection.iter().all(|&at| self.has(at)),
            None => self.0.columns.iter().all(Option::is_some),
        }
    }

    /// Whether its rows have the columns of `schema` (the table's scan schema) and those `projection` reads of
    /// them are decoded.
    pub(crate) fn reads(&self, schema: &Schema, projection: Projection<'_>) -> bool {
        self.0.schema.fields() == schema.fields() && self.has_all(projection)
    }

    /// The rows of its slices `read` keeps (by their place), in the file's order, with the columns of
    /// `projection` (decoded: see [`HotFile::reads`]).
    pub(crate) fn batches(
        &self,
        projection: Projection<'_>,
        mut read: impl FnMut(usize) -> bool,
    ) -> Result<Vec<RecordBatch>> {
        let all: Vec<usize>;
        let projection = match projection {
            Some(projection) => projection,
            None => {
                all = (0..self.0.columns.len()).collect();
                &all
            }
        };
        let schema = Arc::new(self.0.schema.project(projection)?);
        let columns = projection
            .iter()
            .map(|&at| {
                self.0.columns.get(at).cloned().flatten().ok_or_else(|| {
                    datafusion::error::DataFusionError::Internal(format!(
                        "column {at} of a hot file not decoded"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.0
            .rows
            .iter()
            .enumerate()
            .filter(|(slice, _)| read(*slice))
            .map(|(slice, &rows)| {
                let arrays = columns.iter().map(|column| Arc::clone(&column.slices[slice])).collect();
                let options = RecordBatchOptions::new().with_row_count(Some(rows));
                Ok(RecordBatch::try_new_with_options(Arc::clone(&schema), arrays, &options)?)
            })
            .collect()
    }

    /// Its columns and those of `other`, a decoding of other columns of the same file; `None` when they do not
    /// slice the file alike.
    fn merged(&self, other: &Self) -> Option<Self> {
        let (own, theirs) = (&*self.0, &*other.0);
        if own.rows != theirs.rows || own.schema.fields() != theirs.schema.fields() || !self.is_of_meta(other)
        {
            return None;
        }
        let columns: Vec<_> =
            own.columns.iter().zip(&theirs.columns).map(|(a, b)| a.clone().or_else(|| b.clone())).collect();
        let bytes = columns.iter().flatten().map(|column| column.bytes).sum();
        Some(Self(Arc::new(Decoded {
            size: own.size,
            modified: own.modified,
            schema: Arc::clone(&own.schema),
            rows: own.rows.clone(),
            columns,
            bytes,
        })))
    }

    fn is_of_meta(&self, other: &Self) -> bool {
        self.0.size == other.0.size && self.0.modified == other.0.modified
    }

    fn is_of(&self, file: &ObjectMeta) -> bool {
        self.0.size == file.size && self.0.modified == file.last_modified
    }
}

/// Columns being decoded, a slice at a time.
struct DecodedColumns {
    rows: Vec<usize>,
    columns: Vec<HotColumn>,
    bytes: usize,
}

impl DecodedColumns {
    fn new(columns: usize) -> Self {
        let column = || HotColumn { slices: Vec::new(), bounds: Vec::new(), nulls: Vec::new(), bytes: 0 };
        Self { rows: Vec::new(), columns: (0..columns).map(|_| column()).collect(), bytes: 0 }
    }

    /// Takes `slice`'s columns, in order.
    fn push(&mut self, slice: &RecordBatch) {
        self.rows.push(slice.num_rows());
        for (column, array) in self.columns.iter_mut().zip(slice.columns()) {
            // A slice's buffers are its own (copied out of the batches decoded); a buffer shared with another
            // slice, as a dictionary may be, is counted with each: more than is kept, never less.
            let bytes = array.get_array_memory_size();
            column.bytes += bytes;
            self.bytes += bytes;
            column.bounds.push(bounds(array));
            column.nulls.push(array.null_count() as u64);
            column.slices.push(Arc::clone(array));
        }
    }

    /// The file these are the `columns` (places in the table's scan schema `schema`) of.
    fn into_file(self, file: &ObjectMeta, schema: &SchemaRef, columns: &[usize]) -> HotFile {
        let mut placed: Vec<Option<Arc<HotColumn>>> = vec![None; schema.fields().len()];
        for (&at, column) in columns.iter().zip(self.columns) {
            if let Some(place) = placed.get_mut(at) {
                *place = Some(Arc::new(column));
            }
        }
        HotFile(Arc::new(Decoded {
            size: file.size,
            modified: file.last_modified,
            schema: Arc::clone(schema),
            rows: self.rows,
            columns: placed,
            bytes: self.bytes,
        }))
    }
}

/// The places in `schema` of the columns `names` names, in its order.
fn places(schema: &Schema, names: &HashSet<String>) -> Vec<usize> {
    schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, field)| names.contains(field.name()))
        .map(|(at, _)| at)
        .collect()
}

/// The least and greatest values of `column`, for types whose order the session's comparisons share.
fn bounds(column: &ArrayRef) -> Option<(ScalarValue, ScalarValue)> {
    let ordered = column.data_type().is_integer()
        || matches!(
            column.data_type(),
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Date32
                | DataType::Date64
                | DataType::Timestamp(..)
                | DataType::Decimal128(..)
                | DataType::Boolean
        );
    if !ordered {
        return None;
    }
    Some((min_batch(column).ok()?, max_batch(column).ok()?))
}

/// A scan of the decoded `files` of a table of `schema`: the slices `filters` may match, in `partitions`
/// streams, with the columns `projection` names (decoded in every file: see [`HotFile::reads`]) and at most
/// `limit` rows.
pub(crate) fn scan(
    files: &[HotFile],
    schema: &SchemaRef,
    state: &dyn datafusion::catalog::Session,
    (projection, filters, limit): (Option<&Vec<usize>>, &[Expr], Option<usize>),
) -> Result<Arc<dyn ExecutionPlan>> {
    let slices: Vec<(&Decoded, usize)> =
        files.iter().flat_map(|file| (0..file.0.rows.len()).map(|slice| (&*file.0, slice))).collect();
    let kept = match pruning(schema, state, filters) {
        // A predicate the statistics cannot evaluate keeps every slice, as the Parquet reader does.
        Some(predicate) => {
            predicate.prune(&Bounds { schema, slices: &slices }).unwrap_or_else(|_| vec![true; slices.len()])
        }
        None => vec![true; slices.len()],
    };
    // Batches of the slices kept alone (`kept` is in the order of `slices`: file by file).
    let (mut batches, mut kept) = (Vec::new(), kept.into_iter());
    for file in files {
        let keep: Vec<bool> = kept.by_ref().take(file.0.rows.len()).collect();
        batches.extend(file.batches(projection.map(Vec::as_slice), |slice| keep[slice])?);
    }
    let streams = state.config().target_partitions().max(1);
    let mut partitions: Vec<Vec<RecordBatch>> = vec![Vec::new(); streams];
    for (at, slice) in batches.into_iter().enumerate() {
        partitions[at % streams].push(slice);
    }
    partitions.retain(|partition| !partition.is_empty());
    if partitions.is_empty() {
        partitions.push(Vec::new());
    }
    let projected = datafusion::common::project_schema(schema, projection)?;
    let source =
        MemorySourceConfig::try_new(&partitions, projected, None)?.with_limit(limit).with_show_sizes(false);
    Ok(DataSourceExec::from_data_source(source))
}

/// What `filters` say of a slice's statistics, when they say anything.
fn pruning(
    schema: &SchemaRef,
    state: &dyn datafusion::catalog::Session,
    filters: &[Expr],
) -> Option<Arc<PruningPredicate>> {
    let filter = conjunction(filters.iter().cloned())?;
    let columns = Arc::clone(schema).to_dfschema().ok()?;
    let expr = state.create_physical_expr(filter, &columns).ok()?;
    let in_lists = state.config_options().execution.parquet.max_in_list_size;
    PruningPredicateBuilder::new()
        .with_file_schema(Arc::clone(schema))
        .with_max_in_list_size(in_lists)
        .build(expr)
}

/// What a scan of decoded slices read, when `node` is one: the rows of its slices (as many as its limit at
/// most), and the bytes of the columns it read of them. Such a scan keeps no metrics of its own.
pub(crate) fn read(node: &dyn ExecutionPlan) -> Option<(u64, u64)> {
    let memory = node.downcast_ref::<DataSourceExec>()?.data_source().downcast_ref::<MemorySourceConfig>()?;
    let batches = || memory.partitions().iter().flatten();
    let rows = batches().map(RecordBatch::num_rows).sum::<usize>();
    let rows = memory.fetch().map_or(rows, |limit| rows.min(limit));
    let columns = |batch: &RecordBatch| match memory.projection() {
        Some(projection) => projection.iter().filter_map(|&at| batch.columns().get(at).cloned()).collect(),
        None => batch.columns().to_vec(),
    };
    let bytes = batches()
        .flat_map(columns)
        .map(|column| column.to_data().get_slice_memory_size().unwrap_or(0) as u64)
        .sum();
    Some((rows as u64, bytes))
}

/// The statistics of slices (each a file's and its place there), as `PruningPredicate` asks for them.
struct Bounds<'a> {
    schema: &'a Schema,
    slices: &'a [(&'a Decoded, usize)],
}

impl Bounds<'_> {
    fn values(
        &self,
        column: &Column,
        pick: fn(&(ScalarValue, ScalarValue)) -> &ScalarValue,
    ) -> Option<ArrayRef> {
        let at = self.schema.index_of(&column.name).ok()?;
        let values: Option<Vec<ScalarValue>> = self
            .slices
            .iter()
            .map(|(file, slice)| file.column(at)?.bounds.get(*slice)?.as_ref().map(|b| pick(b).clone()))
            .collect();
        ScalarValue::iter_to_array(values?).ok()
    }
}

impl Decoded {
    fn column(&self, at: usize) -> Option<&HotColumn> {
        self.columns.get(at)?.as_deref()
    }
}

impl PruningStatistics for Bounds<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.values(column, |(least, _)| least)
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.values(column, |(_, greatest)| greatest)
    }

    fn num_containers(&self) -> usize {
        self.slices.len()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        let at = self.schema.index_of(&column.name).ok()?;
        let nulls: Option<Vec<u64>> =
            self.slices.iter().map(|(file, slice)| file.column(at)?.nulls.get(*slice).copied()).collect();
        Some(Arc::new(UInt64Array::from(nulls?)))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        let rows = self.slices.iter().map(|(file, slice)| file.rows[*slice] as u64);
        Some(Arc::new(UInt64Array::from_iter_values(rows)))
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}
