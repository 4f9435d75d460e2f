//! The run log on the storage: each project's records as Parquet files per hour, written in batches by every
//! node, read back with DataFusion (a listing, usage, and the read-only table `_logs`).
//!
//! A record is taken into memory ([`ParquetRunLog::record`], a push under a lock) and written with the others
//! by [`ParquetRunLog::flush`], which the server calls on a timer: one file per project and hour per flush,
//! `projects/{id}/logs/{YYYY-MM-DDTHH}/{node}_{level}_{first}_{last}.parquet`, its rows sorted by endpoint and
//! time so that a reader of one endpoint skips the row groups of others. `node` is drawn once per process, and
//! `first..=last` are the flush numbers the file holds: a flush writes one of level 0 (`first == last`), and
//! [`ParquetRunLog::maintain`] merges a node's newest files of an hour, [`MERGE_AT`] of one level, into one of
//! the next level holding all their numbers (a closed hour's into one), until a file reaches
//! [`LogSettings::full_file`]: a full file is never merged again, so a merge reads a bounded amount whatever the
//! traffic. Merges run on a thread of their own at the lowest scheduling priority: they take the cores queries
//! leave idle, never a query's. A reader
//! lists the hour, and leaves out each file whose numbers another file of its node holds, so a merge is seen
//! whole or not at all; the files merged are deleted only after [`GRACE`], longer than a query may run. A node
//! writes and merges its own files, so live nodes never race; a node's flushes go on while it merges (one flush
//! at a time, numbered in the order its files appear, so a merge never takes a file past one in flight). A node
//! that stopped (a restart draws a new name) leaves its last hours unmerged: [`ORPHANED_AFTER`] an hour ended,
//! any node merges the files of another node still there the same way, under that node's name, so two nodes
//! doing it at once write the same file.
//!
//! Retention: readers leave out records older than it, and whole hours past it are deleted by any node.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, RecordBatch, StringArray, StringBuilder,
    TimestampMicrosecondArray, UInt16Array, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType, UInt16Type,
    UInt32Type, UInt64Type,
};
use datafusion::common::DFSchema;
use datafusion::common::ScalarValue;
use datafusion::dataframe::DataFrame;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{col, lit, EmptyRelation, Expr, LogicalPlan, SortExpr};
use datafusion::parquet::arrow::{ArrowWriter, AsyncArrowWriter};
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use datafusion::parquet::schema::types::ColumnPath;
use datafusion::physical_plan::{execute_stream_partitioned, ExecutionPlan, SendableRecordBatchStream};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use domain::{
    unix_micros, EngineError, LogFilter, LogKind, LogRecord, LogSource, ProjectId, RunLog, StatusFilter,
    Timestamp, Transport, UsageAccumulator, UsageBucket, UsageQuery, UsageSample,
};
use futures_util::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use time::macros::format_description;
use uuid::Uuid;

use crate::fair::Held;
use crate::runtime::BackgroundRuntime;
use crate::storage::{unavailable, Storage};
pub use crate::tables::catalog::LOGS_TABLE;
use crate::DataFusionEngine;

/// How long merged files stay after the file that holds their records appears: longer than any query runs
/// (a reader that listed them before still reads them whole).
pub const GRACE: Duration = Duration::from_secs(120);

/// A node merges its files of an hour once it has written this many there.
const MERGE_AT: usize = 8;

/// An hour is closed (no node writes to it any more) this long after it ends.
const CLOSED_AFTER: Duration = Duration::from_secs(300);

/// An hour that ended this long ago and still holds several files of one node that are not full is that node's
/// left over (a live node merges its closed hour into one within minutes): any node merges them.
const ORPHANED_AFTER: time::Duration = time::Duration::HOUR;

/// How far back hours are looked at for files left over: a node that stopped is merged for by the nodes running
/// within a day of it.
const ORPHANS_WITHIN: time::Duration = time::Duration::DAY;

/// Buffers of records taken: each thread that records uses one, so request threads do not wait on each other.
const SHARDS: usize = 8;

/// The projects that can fill one buffer between flushes: each holds at most this share of it.
const PROJECT_SHARES: usize = 8;

/// Past its share of a buffer, one refused run (429) of a project in this many is kept, standing for them all
/// ([`LogRecord::runs`]): a flood of runs its rate limit refuses costs a project's log a sixty-fourth of the
/// records, and its usage still counts every run.
const SAMPLE_PAST_SHARE: u32 = 64;

/// One buffer of records taken and not yet written, with how many each project has there.
#[derive(Debug, Default)]
struct Buffer {
    records: Vec<LogRecord>,
    per_project: HashMap<ProjectId, usize>,
    /// Refused runs past a project's share left out since its last sample was kept (kept across flushes).
    left_out: HashMap<ProjectId, u32>,
}

/// The buffer the current thread records into: a number each thread draws once.
fn shard() -> usize {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static SHARD: usize = usize::try_from(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS as u64).expect("below SHARDS");
    }
    SHARD.with(|shard| *shard)
}

/// How often hours past the retention, and files left over by nodes that stopped, are looked for (a listing of
/// every project's log, and of each hour of the last day not yet found settled).
pub(crate) const PRUNE_EVERY: time::Duration = time::Duration::minutes(10);

/// The log's columns, as files hold them and `_logs` shows them.
static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let text = |name: &str, nullable| Field::new(name, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        text("id", false),
        Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        text("endpoint", false),
        Field::new("version", DataType::UInt32, true),
        text("kind", false),
        Field::new("status", DataType::UInt16, false),
        text("code", true),
        Field::new("duration_ms", DataType::Float64, false),
        Field::new("rows", DataType::UInt64, true),
        Field::new("bytes_read", DataType::UInt64, true),
        text("source", true),
        text("credential", true),
        text("transport", true),
        text("request_id", true),
        // Files written before it have no such column, and read it as null (as it was for one run until
        // 2026-12-06): such a record stands for one run.
        Field::new("runs", DataType::UInt32, true),
    ]))
});

/// What the log is kept for, and how much it holds in memory.
#[derive(Debug, Clone, Copy)]
pub struct LogSettings {
    /// Records older than this are left out and deleted (by the hour).
    pub retention: Duration,
    /// Records held between flushes at most (the last eighth kept for projects holding less than an eighth);
    /// more are dropped and counted.
    pub buffered: usize,
    /// A file of at least this many bytes is full: it is never merged again (about five million records).
    pub full_file: u64,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self { retention: Duration::from_secs(30 * 86_400), buffered: 200_000, full_file: 128 << 20 }
    }
}

/// The run log of every project, on the engine's storage. Clones share it.
#[derive(Debug, Clone)]
pub struct ParquetRunLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: LogSettings,
    /// This process's name in file names.
    node: String,
    /// Records taken and not yet written, in one buffer per recording thread (see [`shard`]).
    buffers: [Mutex<Buffer>; SHARDS],
    /// Told when a buffer fills to half its room: records are written then, however soon after the last
    /// flush, so that a busy node's buffers never fill between two flushes (see [`ParquetRunLog::filling`]).
    half_full: tokio::sync::Notify,
    /// The hours this node wrote, with its files there since its last merge.
    written_to: Mutex<HashMap<(ProjectId, Timestamp), HourFiles>>,
    /// One flush at a time, so that the node's files appear in the order of their numbers: a merge takes the
    /// node's files as listed, which are then all those numbered below the one a flush is writing.
    flushing: tokio::sync::Mutex<()>,
    /// One merge at a time. Flushes go on meanwhile: a merge runs at the lowest priority and, under load, for
    /// seconds, during which records would otherwise pile up in memory.
    merging: tokio::sync::Mutex<()>,
    next: AtomicU64,
    /// When hours past the retention were last looked for.
    pruned: Mutex<Option<Timestamp>>,
    /// Hours of the last [`ORPHANS_WITHIN`] found with nothing left over to merge or delete: not listed again.
    settled: Mutex<std::collections::BTreeSet<(Timestamp, ProjectId)>>,
    written: Counter,
    dropped: Counter,
    sampled: Counter,
    failed: Counter,
    /// The runtime merges run on: a merge reads, merges and compresses there alone, so it takes at most one
    /// core, and only what queries leave idle.
    merges: BackgroundRuntime,
    /// The runtime a flush sorts and encodes on, at niceness 10: a flush under a cached load (a few tenths of a
    /// second's records, some milliseconds of a core, a few times a second) takes a core from the request threads
    /// at a tenth of their weight rather than at theirs (cached runs' p99 4.05 against 4.45 ms, docs/logs.md),
    /// and still keeps up (none dropped at 76,500 runs a second).
    flushes: BackgroundRuntime,
    /// The engine reads are queries of: a read of a project's records (its logs, its usage) takes one of the
    /// project's query slots, runs on the engine's threads (on every core, never an HTTP server's thread) with
    /// its turns and memory there, within the query timeout, as the project's runs do.
    engine: DataFusionEngine,
}

impl ParquetRunLog {
    /// A run log in `storage` read by an engine of its own, with the default limits (a served log is its
    /// engine's: [`DataFusionEngine::run_log`]).
    pub fn new(storage: Storage, settings: LogSettings) -> Self {
        DataFusionEngine::new(storage).run_log(settings)
    }

    pub(crate) fn read_by(engine: DataFusionEngine, settings: LogSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                node: Uuid::new_v4().simple().to_string(),
                buffers: std::array::from_fn(|_| Mutex::new(Buffer::default())),
                half_full: tokio::sync::Notify::new(),
                written_to: Mutex::default(),
                flushing: tokio::sync::Mutex::default(),
                merging: tokio::sync::Mutex::default(),
                next: AtomicU64::new(0),
                pruned: Mutex::new(None),
                settled: Mutex::default(),
                written: Counter::default(),
                dropped: Counter::default(),
                sampled: Counter::default(),
                failed: Counter::default(),
                merges: BackgroundRuntime::idle("run-log-merge"),
                flushes: BackgroundRuntime::below_requests("run-log-flush"),
                engine,
            }),
        }
    }

    /// Exposes what was written, dropped and failed in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let inner = &self.inner;
        registry.register(
            "log_records_written",
            "Run log records written to the storage",
            inner.written.clone(),
        );
        registry.register(
            "log_records_dropped",
            "Run log records dropped because the buffer was full (the storage could not keep up)",
            inner.dropped.clone(),
        );
        registry.register(
            "log_records_sampled",
            "Refused runs past their project's share of the run log, left out for a record that stands for them",
            inner.sampled.clone(),
        );
        registry.register(
            "log_flush_failures",
            "Run log flushes that failed (retried at the next)",
            inner.failed.clone(),
        );
    }

    fn buffer(&self, shard: usize) -> std::sync::MutexGuard<'_, Buffer> {
        self.inner.buffers[shard].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The records one buffer holds at most.
    fn shard_room(&self) -> usize {
        self.inner.settings.buffered.div_ceil(SHARDS)
    }

    /// A project's share of one buffer: past it, a project adds records only while more than a share of the
    /// buffer is free, so that a project flooding the log (runs refused by its rate limit, say) drops its own
    /// records, never another project's.
    fn project_room(&self) -> usize {
        (self.shard_room() / PROJECT_SHARES).max(1)
    }

    /// Completes once a buffer is half full (at once if one filled so far since the last call): a flush is due
    /// then, whatever the time. Records come from the threads that serve requests, one buffer each: at tens of
    /// thousands of runs a second, a second's records may be more than a buffer holds, and would be dropped.
    pub async fn filling(&self) {
        self.inner.half_full.notified().await;
    }

    /// Writes every record taken so far, one file per project and hour. Records a failed write held are
    /// taken back, to be written by the next flush (as many as the buffer holds).
    ///
    /// # Errors
    /// The storage's failure.
    pub async fn flush(&self) -> Result<u64, EngineError> {
        let _flushing = self.inner.flushing.lock().await;
        // The next second's records likely number as many: room for them now, so a buffer does not grow (and
        // copy itself) under its lock.
        let mut taken = Vec::new();
        for shard in 0..SHARDS {
            let mut buffer = self.buffer(shard);
            let room = buffer.records.len().min(self.shard_room());
            taken.append(&mut std::mem::replace(&mut buffer.records, Vec::with_capacity(room)));
            buffer.per_project.clear();
        }
        if taken.is_empty() {
            return Ok(0);
        }
        // Sorted in place into files' order (project, hour, endpoint, time) and encoded a file per project and
        // hour, from slices of the one buffer: a second's records at ~100,000 runs/s are tens of MB, not copied.
        // Sorting and encoding are CPU work: off the runtime's threads, below the requests' (`flushes`).
        let (mut taken, files) = self
            .inner
            .flushes
            .handle()?
            .spawn_blocking(move || {
                let key = |r: &LogRecord| (r.project, hour_of(r.at));
                taken.sort_by(|a, b| {
                    key(a).cmp(&key(b)).then(a.endpoint.cmp(&b.endpoint)).then(a.at.cmp(&b.at))
                });
                let mut files = Vec::new();
                let mut first = 0;
                for group in taken.chunk_by(|a, b| key(a) == key(b)) {
                    let encoded = batch(group).and_then(|batch| parquet(&[batch], 0));
                    files.push((key(&group[0]), first..first + group.len(), encoded));
                    first += group.len();
                }
                (taken, files)
            })
            .await
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        let mut count = 0;
        for ((project, hour), records, encoded) in files {
            let number = self.inner.next.fetch_add(1, Ordering::Relaxed);
            let path = hour_prefix(project, hour).join(file_name(&self.inner.node, 0, number, number));
            let written = match encoded {
                Ok(bytes) => {
                    self.storage().store().put(&path, PutPayload::from(bytes)).await.map_err(unavailable)
                }
                Err(err) => Err(err),
            };
            if let Err(err) = written {
                self.inner.failed.inc();
                self.take_back(taken.split_off(records.start));
                return Err(err);
            }
            count += records.len() as u64;
            self.written_to()
                .entry((project, hour))
                .or_insert(HourFiles { flushed: 0, merged_left: false })
                .flushed += 1;
        }
        self.inner.written.inc_by(count);
        Ok(count)
    }

    /// Puts records a flush could not write back in front of those taken since, up to the buffer's size.
    fn take_back(&self, records: Vec<LogRecord>) {
        let mut records = records.into_iter();
        for shard in 0..SHARDS {
            let mut buffer = self.buffer(shard);
            let room = self.shard_room().saturating_sub(buffer.records.len());
            let mut back: Vec<LogRecord> = records.by_ref().take(room).collect();
            for record in &back {
                *buffer.per_project.entry(record.project).or_default() += 1;
            }
            back.append(&mut buffer.records);
            buffer.records = back;
        }
        let lost = records.count();
        if lost > 0 {
            self.inner.dropped.inc_by(lost as u64);
        }
    }

    /// Merges this node's files of an hour once it wrote [`MERGE_AT`] there (or the hour closed), deletes the
    /// files merged before [`GRACE`], and deletes the hours past the retention of every project.
    ///
    /// # Errors
    /// The storage's failure; what was not done is tried again at the next call.
    pub async fn maintain(&self, now: Timestamp) -> Result<(), EngineError> {
        let log = self.clone();
        self.merges()?.spawn(async move { log.merge_due(now).await }).await.map_err(|err| {
            EngineError::Internal(format!("the run log's merges ended abnormally: {err}").into())
        })??;
        let prune = {
            let mut pruned = self.inner.pruned.lock().unwrap_or_else(PoisonError::into_inner);
            let due = pruned.is_none_or(|at| now - at >= PRUNE_EVERY);
            if due {
                *pruned = Some(now);
            }
            due
        };
        if prune {
            self.prune(now).await?;
        }
        Ok(())
    }

    /// The merge runtime's handle, the runtime made at the first call.
    fn merges(&self) -> Result<tokio::runtime::Handle, EngineError> {
        self.inner.merges.handle()
    }

    fn written_to(&self) -> std::sync::MutexGuard<'_, HashMap<(ProjectId, Timestamp), HourFiles>> {
        self.inner.written_to.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The storage of the engine that reads the log: the log's files are written beside the tables.
    fn storage(&self) -> &Storage {
        &self.inner.engine.storage
    }

    /// Merges the hours this node wrote to that are due (see [`HourFiles::due`]), on the merge runtime. Files
    /// flushed while an hour is merged count towards its next merge.
    async fn merge_due(&self, now: Timestamp) -> Result<(), EngineError> {
        let _merging = self.inner.merging.lock().await;
        let due: Vec<_> = self
            .written_to()
            .iter()
            .filter(|((_, hour), hour_files)| hour_files.due(*hour, now))
            .map(|(key, hour_files)| (*key, hour_files.flushed))
            .collect();
        for (key @ (project, hour), seen) in due {
            let merged_left = self.merge(project, hour, now).await?;
            let mut written_to = self.written_to();
            let Some(hour_files) = written_to.get_mut(&key) else { continue };
            hour_files.flushed = hour_files.flushed.saturating_sub(seen);
            hour_files.merged_left = merged_left;
            if closed(hour, now) && !merged_left && hour_files.flushed == 0 {
                written_to.remove(&key);
            }
        }
        Ok(())
    }

    /// Merges this node's files of the hour by levels, and deletes its files that were merged before the grace;
    /// says whether files merged within the grace are left.
    ///
    /// A flush writes a file of level 0; [`MERGE_AT`] files of one level that end the node's files (in flush
    /// order) become one of the next level, so a record is written again once per level (a handful, whatever
    /// the traffic) rather than at every merge, and an hour keeps fewer than [`MERGE_AT`] files per level; a
    /// longer run is merged [`MERGE_AT`] at a time. A closed hour's files become one, after that. Only the
    /// files after the node's last full one are merged (a merge holds consecutive numbers, so one never goes
    /// around a full file).
    async fn merge(&self, project: ProjectId, hour: Timestamp, now: Timestamp) -> Result<bool, EngineError> {
        let prefix = hour_prefix(project, hour);
        let listed = self.storage().objects(&prefix).await.map_err(unavailable)?;
        self.merge_of(&prefix, split(listed), &self.inner.node, closed(hour, now), now).await
    }

    /// Merges `node`'s files of an hour (`files`: those to read, and those merged into them) as the node merges
    /// its own (all of them after its last full one when the hour is `whole`), and deletes its files merged
    /// before the grace; says whether files merged within the grace are left.
    async fn merge_of(
        &self,
        prefix: &ObjectPath,
        (visible, covered): (Vec<LogFile>, Vec<LogFile>),
        node: &str,
        whole: bool,
        now: Timestamp,
    ) -> Result<bool, EngineError> {
        let storage = self.storage();
        let mut own: Vec<LogFile> = visible.into_iter().filter(|file| file.node == node).collect();
        own.sort_by_key(|file| file.first);
        let full = |file: &LogFile| file.size >= self.inner.settings.full_file;
        let mut own = own.split_off(own.iter().rposition(full).map_or(0, |last_full| last_full + 1));
        let mut merged = false;
        while let Some(level) = own.last().filter(|file| !full(file)).map(|file| file.level) {
            let run = own.iter().rev().take_while(|file| file.level == level && !full(file)).count();
            // The files after the last full one (merges here may have made one).
            let open = own.len() - own.iter().rposition(full).map_or(0, |last_full| last_full + 1);
            if run >= MERGE_AT {
                // The run's oldest files, MERGE_AT at a time (a merge reads its parts at once, so what it holds
                // grows with their count: a busy node flushes many between two merges); the newest that do
                // not make MERGE_AT stay for the next (or for the whole hour's merge below).
                let mut parts = own.split_off(own.len() - run);
                let newest = parts.split_off(run - run % MERGE_AT);
                for parts in parts.chunks(MERGE_AT) {
                    own.push(self.merge_files(prefix, node, parts, level + 1).await?);
                }
                own.extend(newest);
            } else if whole && open > 1 {
                // Fewer than MERGE_AT of each level by now.
                let parts = own.split_off(own.len() - open);
                let level = parts.iter().map(|file| file.level).max().map_or(0, |top| top + 1);
                own.push(self.merge_files(prefix, node, &parts, level).await?);
            } else {
                break;
            }
            merged = true;
        }
        let (gone, left): (Vec<_>, Vec<_>) = covered
            .into_iter()
            .filter(|file| file.node == node)
            .partition(|file| age(file.modified, now) > GRACE);
        storage.delete(gone.into_iter().map(|file| file.location).collect()).await.map_err(unavailable)?;
        // A merge made now leaves what it merged for the grace.
        Ok(!left.is_empty() || merged)
    }

    /// Writes `parts` (consecutive files of `node` in an hour) as one file of `level` holding their numbers,
    /// its rows sorted by endpoint and time.
    async fn merge_files(
        &self,
        prefix: &ObjectPath,
        node: &str,
        parts: &[LogFile],
        level: u32,
    ) -> Result<LogFile, EngineError> {
        let storage = self.storage();
        let err = crate::execute::storage_error;
        let first = parts.iter().map(|file| file.first).min().expect("a merge of files");
        let last = parts.iter().map(|file| file.last).max().expect("a merge of files");
        // A partition per file, each in order: a streaming merge of them, whatever their ranges.
        let ctx = crate::tables::catalog::merge_session(storage, parts.len())?;
        let urls = parts.iter().map(|file| storage.url_of_object(&file.location)).collect();
        let sorted = read(&ctx, urls).await?.sort(file_order());
        let mut rows = sorted.map_err(err)?.execute_stream().await.map_err(err)?;
        // Streamed, merged batch by batch into the file as it is uploaded: a merge holds a few batches in
        // memory, whatever the files' size. The file appears whole when the writer closes, or not at all.
        let path = prefix.clone().join(file_name(node, level, first, last));
        let sink = BufWriter::new(Arc::clone(storage.store()), path.clone());
        let mut writer =
            AsyncArrowWriter::try_new(sink, SCHEMA.clone(), Some(properties(level))).map_err(internal)?;
        while let Some(batch) = rows.next().await {
            writer.write(&batch.map_err(err)?).await.map_err(internal)?;
        }
        let size = writer.bytes_written() as u64;
        writer.close().await.map_err(internal)?;
        Ok(LogFile {
            location: path,
            size,
            modified: storage.now(),
            node: node.to_owned(),
            level,
            first,
            last,
        })
    }

    /// Deletes the hours of every project that ended before the retention.
    /// Deletes the hours of every project that ended before the retention, and merges what nodes that stopped
    /// left in the hours that ended within [`ORPHANS_WITHIN`].
    async fn prune(&self, now: Timestamp) -> Result<(), EngineError> {
        let storage = self.storage();
        let cutoff = now - self.inner.settings.retention;
        self.settled().retain(|(hour, _)| *hour + time::Duration::HOUR > now - ORPHANS_WITHIN);
        let projects = storage.children(&ObjectPath::from("projects")).await.map_err(unavailable)?;
        for project in projects.iter().filter_map(|id| ProjectId::new(id.parse().ok()?).ok()) {
            let logs = logs_prefix(project);
            for name in storage.children(&logs).await.map_err(unavailable)? {
                let Some(hour) = parse_hour(&name) else { continue };
                let ended = hour + time::Duration::HOUR;
                if ended <= cutoff {
                    storage.remove_prefix(&logs.clone().join(name.as_str())).await.map_err(unavailable)?;
                } else if ended <= now - ORPHANED_AFTER && ended > now - ORPHANS_WITHIN {
                    self.merge_left_over(project, hour, now).await?;
                }
            }
        }
        Ok(())
    }

    fn settled(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<(Timestamp, ProjectId)>> {
        self.inner.settled.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Merges the files other nodes left in an hour long ended (each node's into one, under its name), and
    /// deletes the files merged before the grace, whoever merged them; an hour left with neither is not looked
    /// at again.
    async fn merge_left_over(
        &self,
        project: ProjectId,
        hour: Timestamp,
        now: Timestamp,
    ) -> Result<(), EngineError> {
        if self.settled().contains(&(hour, project)) {
            return Ok(());
        }
        let prefix = hour_prefix(project, hour);
        let listed = self.storage().objects(&prefix).await.map_err(unavailable)?;
        let (visible, covered) = split(listed);
        let full = self.inner.settings.full_file;
        // This node merges its own hours as it writes them.
        let others = visible.iter().filter(|file| file.node != self.inner.node);
        let mut nodes: Vec<String> = others.map(|file| file.node.clone()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let left_over = |node: &String| {
            visible.iter().filter(|file| file.node == *node && file.size < full).count() > 1
                || covered.iter().any(|file| file.node == *node)
        };
        let nodes: Vec<String> = nodes.into_iter().filter(left_over).collect();
        if nodes.is_empty() {
            self.settled().insert((hour, project));
            return Ok(());
        }
        for node in nodes {
            let of_node = |files: &[LogFile]| -> Vec<LogFile> {
                files.iter().filter(|file| file.node == node).map(LogFile::clone).collect()
            };
            let files = (of_node(&visible), of_node(&covered));
            self.merge_of(&prefix, files, &node, true, now).await?;
        }
        Ok(())
    }

    /// The project's records within the retention and `since..until`, as a frame (none: `None`).
    async fn frame(
        &self,
        project: ProjectId,
        endpoint: &str,
        since: Option<Timestamp>,
        until: Option<Timestamp>,
    ) -> Result<Option<DataFrame>, EngineError> {
        let since = since.max(Some(self.storage().now() - self.inner.settings.retention));
        let ctx = self.inner.engine.log_session()?;
        let Some(frame) = records_in(self.storage(), &ctx, project, since, until).await? else {
            return Ok(None);
        };
        frame.filter(col("endpoint").eq(lit(endpoint))).map(Some).map_err(crate::execute::storage_error)
    }
}

#[async_trait::async_trait]
impl RunLog for ParquetRunLog {
    fn record(&self, mut record: LogRecord) {
        let mut buffer = self.buffer(shard());
        let held = buffer.per_project.get(&record.project).copied().unwrap_or(0);
        let (len, room, share) = (buffer.records.len(), self.shard_room(), self.project_room());
        if held >= share && record.status == 429 {
            let left_out = buffer.left_out.entry(record.project).or_default();
            *left_out += 1;
            if *left_out < SAMPLE_PAST_SHARE {
                drop(buffer);
                self.inner.sampled.inc();
                return;
            }
            record.runs = *left_out;
            buffer.left_out.remove(&record.project);
        }
        // The last share of the buffer is kept for projects within their share: a project alone may fill the
        // rest, a flood of one never takes what another needs.
        if len < room && (held < share || len < room - share) {
            *buffer.per_project.entry(record.project).or_default() += 1;
            buffer.records.push(record);
            if len + 1 == room.div_ceil(2) {
                drop(buffer);
                self.inner.half_full.notify_one();
            }
        } else {
            drop(buffer);
            self.inner.dropped.inc_by(u64::from(record.runs));
        }
    }

    async fn records(
        &self,
        project: ProjectId,
        endpoint: &str,
        filter: &LogFilter,
    ) -> Result<Vec<LogRecord>, EngineError> {
        let (log, endpoint, filter) = (self.clone(), endpoint.to_owned(), filter.clone());
        let read = async move { log.read_records(project, &endpoint, &filter).await };
        self.inner.engine.in_slot(project, |_| read).await.map(|(records, _slot)| records)
    }

    async fn usage(
        &self,
        project: ProjectId,
        endpoint: &str,
        query: &UsageQuery,
    ) -> Result<Vec<UsageBucket>, EngineError> {
        let (log, endpoint, query) = (self.clone(), endpoint.to_owned(), *query);
        let read = async move { log.read_usage(project, &endpoint, &query).await };
        self.inner.engine.in_slot(project, |_| read).await.map(|(usage, _slot)| usage)
    }
}

/// Reads, on the engine's runtime.
impl ParquetRunLog {
    async fn read_records(
        &self,
        project: ProjectId,
        endpoint: &str,
        filter: &LogFilter,
    ) -> Result<Vec<LogRecord>, EngineError> {
        let until = match (filter.until, filter.cursor) {
            // Records at the cursor's instant are still to come (after its id).
            (until, Some(cursor)) => {
                let at = until.map_or(cursor.at, |until| until.min(cursor.at));
                Some(at.checked_add(time::Duration::MICROSECOND).unwrap_or(at))
            }
            (until, None) => until,
        };
        let Some(mut frame) = self.frame(project, endpoint, filter.since, until).await? else {
            return Ok(Vec::new());
        };
        let err = crate::execute::storage_error;
        if let Some(kind) = filter.kind {
            frame = frame.filter(col("kind").eq(lit(kind.as_str()))).map_err(err)?;
        }
        if let Some(status) = filter.status {
            let status_is = match status {
                StatusFilter::Exactly(status) => col("status").eq(lit(status)),
                StatusFilter::Ok => col("status").lt(lit(400_u16)),
                StatusFilter::Error => col("status").gt_eq(lit(400_u16)),
            };
            frame = frame.filter(status_is).map_err(err)?;
        }
        if let Some(cursor) = filter.cursor {
            let at = instant(cursor.at);
            let id = lit(cursor.id.to_string());
            frame = frame
                .filter(col("at").lt(at.clone()).or(col("at").eq(at).and(col("id").lt(id))))
                .map_err(err)?;
        }
        let wanted = usize::try_from(filter.limit).expect("a page's limit is at most 1000") + 1;
        // The page's oldest instant first, from the time column alone; then whole records from that instant on,
        // which the files' row-group statistics mostly skip (a busy endpoint's page is its last second).
        let newest =
            frame.clone().select_columns(&["at"]).and_then(|f| f.sort(vec![col("at").sort(false, false)]));
        let times =
            self.collect(project, newest.and_then(|f| f.limit(0, Some(wanted))).map_err(err)?).await?;
        let oldest = times
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<TimestampMicrosecondType>().values().iter())
            .min();
        if let Some(oldest) =
            oldest.filter(|_| times.iter().map(RecordBatch::num_rows).sum::<usize>() == wanted)
        {
            let at = lit(ScalarValue::TimestampMicrosecond(Some(*oldest), Some("UTC".into())));
            frame = frame.filter(col("at").gt_eq(at)).map_err(err)?;
        }
        let newest_first: Vec<SortExpr> = vec![col("at").sort(false, false), col("id").sort(false, false)];
        let batches = frame.sort(newest_first).and_then(|f| f.limit(0, Some(wanted))).map_err(err)?;
        let batches = self.collect(project, batches).await?;
        let mut found = Vec::with_capacity(wanted);
        for batch in &batches {
            records_of(project, batch, &mut found)?;
        }
        Ok(found)
    }

    /// `frame`, a read of `project`'s records, planned with its task and gated by the project's turns (held for
    /// as long as the plan executes).
    async fn planned(
        &self,
        project: ProjectId,
        frame: DataFrame,
    ) -> Result<(Arc<dyn ExecutionPlan>, Arc<TaskContext>, Held), EngineError> {
        let task = Arc::new(frame.task_ctx());
        let plan = frame.create_physical_plan().await.map_err(crate::execute::storage_error)?;
        let (plan, turns) = self.inner.engine.with_turns(project, &plan).await?;
        Ok((plan, task, turns))
    }

    /// The rows `frame`, a read of `project`'s records, finds, executed with the project's turns.
    async fn collect(&self, project: ProjectId, frame: DataFrame) -> Result<Vec<RecordBatch>, EngineError> {
        let (plan, task, _turns) = self.planned(project, frame).await?;
        datafusion::physical_plan::collect(plan, task).await.map_err(crate::execute::storage_error)
    }

    async fn read_usage(
        &self,
        project: ProjectId,
        endpoint: &str,
        query: &UsageQuery,
    ) -> Result<Vec<UsageBucket>, EngineError> {
        let mut usage = UsageAccumulator::new(*query);
        let Some(frame) = self.frame(project, endpoint, Some(query.since), Some(query.until)).await? else {
            return Ok(usage.finish());
        };
        let err = crate::execute::storage_error;
        let cache_hit = col("source").eq(lit(LogSource::Cache.as_str())).alias("cache_hit");
        let columns = vec![
            col("at"),
            col("status"),
            cache_hit,
            col("duration_ms"),
            col("rows"),
            col("bytes_read"),
            col("runs"),
        ];
        let frame = frame
            .filter(col("kind").eq(lit(LogKind::Run.as_str())))
            .and_then(|f| f.select(columns))
            .map_err(err)?;
        // Each partition of the read counted on a core of its own, the counts merged.
        let (plan, task, _turns) = self.planned(project, frame).await?;
        let mut parts = tokio::task::JoinSet::new();
        for stream in execute_stream_partitioned(plan, task).map_err(err)? {
            parts.spawn(usage_of(stream, *query));
        }
        while let Some(part) = parts.join_next().await {
            usage.merge(part.map_err(|e| EngineError::Internal(Box::new(e)))??);
        }
        Ok(usage.finish())
    }
}

/// The usage `query` counts of the records `stream` reads (the columns [`ParquetRunLog::read_usage`] selects).
async fn usage_of(
    mut stream: SendableRecordBatchStream,
    query: UsageQuery,
) -> Result<UsageAccumulator, EngineError> {
    let mut usage = UsageAccumulator::new(query);
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(crate::execute::storage_error)?;
        let at = batch.column(0).as_primitive::<TimestampMicrosecondType>();
        let status = batch.column(1).as_primitive::<UInt16Type>();
        let cache_hit = batch.column(2).as_boolean();
        let duration = batch.column(3).as_primitive::<Float64Type>();
        let rows = batch.column(4).as_primitive::<UInt64Type>();
        let bytes = batch.column(5).as_primitive::<UInt64Type>();
        let runs = batch.column(6).as_primitive::<UInt32Type>();
        for i in 0..batch.num_rows() {
            usage.add(&UsageSample {
                at_micros: at.value(i),
                status: status.value(i),
                cache_hit: cache_hit.is_valid(i) && cache_hit.value(i),
                duration_ms: duration.value(i),
                rows: rows.is_valid(i).then(|| rows.value(i)),
                bytes_read: bytes.is_valid(i).then(|| bytes.value(i)),
                runs: runs.value(i),
            });
        }
    }
    Ok(usage)
}

/// Registers the project's log as the read-only table `_logs` in `ctx`: its records within `retention`.
pub(crate) async fn register(
    storage: &Storage,
    ctx: &SessionContext,
    project: ProjectId,
    retention: Duration,
) -> Result<(), EngineError> {
    let err = crate::execute::storage_error;
    let cutoff = storage.now() - retention;
    let frame = match records_in(storage, ctx, project, Some(cutoff), None).await? {
        Some(frame) => frame,
        None => {
            // No rows of the log's columns (a relation a cluster's scheduler can be sent, as a table in memory
            // is not).
            let schema = DFSchema::try_from(SCHEMA.as_ref().clone()).map_err(err)?;
            let empty = LogicalPlan::EmptyRelation(EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(schema),
            });
            DataFrame::new(ctx.state(), empty)
        }
    };
    ctx.register_table(LOGS_TABLE, frame.into_view()).map(|_| ()).map_err(err)
}

/// The project's records in `since..until`, as a frame over the files of the hours the range touches (`None`
/// when there are none), without the files merged into another, `runs` read as 1 where a file has it null or
/// not at all (files written before it, and those until 2026-12-06, which wrote one run as null). A record is
/// in the files of the hour it began in, so only the files of an hour the range cuts through are filtered by
/// time: a query of a range of whole hours (`_logs` within the retention, which cuts through its oldest hour
/// alone) decodes and compares no row's time for the filter, and reads `at` only when it uses it.
///
/// One listing of the project's log (pages of a thousand on S3), not one per hour: a query of `_logs` over
/// 30 days costs a few requests, not 720.
async fn records_in(
    storage: &Storage,
    ctx: &SessionContext,
    project: ProjectId,
    since: Option<Timestamp>,
    until: Option<Timestamp>,
) -> Result<Option<DataFrame>, EngineError> {
    let logs = logs_prefix(project);
    let listed: Vec<ObjectMeta> =
        storage.store().list(Some(&logs)).try_collect().await.map_err(unavailable)?;
    let mut hours: BTreeMap<Timestamp, Vec<ObjectMeta>> = BTreeMap::new();
    for object in listed {
        // `{logs}/{hour}/{file}`: anything else is not a log file.
        let hour = {
            let mut parts = object.location.prefix_match(&logs).into_iter().flatten();
            match (parts.next(), parts.next(), parts.next()) {
                (Some(hour), Some(_), None) => parse_hour(hour.as_ref()),
                _ => None,
            }
        };
        let Some(hour) = hour else { continue };
        let after = since.is_some_and(|since| hour + time::Duration::HOUR <= since);
        let before = until.is_some_and(|until| hour >= until);
        if !(after || before) {
            hours.entry(hour).or_default().push(object);
        }
    }
    let (mut whole, mut cut) = (Vec::new(), Vec::new());
    for (hour, files) in hours {
        let inside = since.is_none_or(|since| hour >= since)
            && until.is_none_or(|until| hour + time::Duration::HOUR <= until);
        let urls = split(files).0.into_iter().map(|file| storage.url_of_object(&file.location));
        if inside {
            whole.extend(urls)
        } else {
            cut.extend(urls)
        }
    }
    let err = crate::execute::storage_error;
    let whole = if whole.is_empty() { None } else { Some(read(ctx, whole).await?) };
    // An hour is cut only by a bound of the range, so there is a filter whenever there are such files.
    let within =
        [since.map(|since| col("at").gt_eq(instant(since))), until.map(|until| col("at").lt(instant(until)))]
            .into_iter()
            .flatten()
            .reduce(Expr::and);
    let cut = match within {
        Some(within) if !cut.is_empty() => Some(read(ctx, cut).await?.filter(within).map_err(err)?),
        _ => None,
    };
    let records = match (whole, cut) {
        (Some(whole), Some(cut)) => whole.union(cut).map_err(err)?,
        (Some(records), None) | (None, Some(records)) => records,
        (None, None) => return Ok(None),
    };
    let runs = datafusion::functions::expr_fn::coalesce(vec![col("runs"), lit(1_u32)]);
    records.with_column("runs", runs).map(Some).map_err(err)
}

/// The order of every log file's rows.
fn file_order() -> Vec<SortExpr> {
    vec![col("endpoint").sort(true, false), col("at").sort(true, false)]
}

/// A frame over log files, which knows each is sorted by [`file_order`] (DataFusion puts files whose ranges
/// overlap in partitions of their own, so that a merge in that order is a streaming merge rather than a sort).
async fn read(ctx: &SessionContext, urls: Vec<String>) -> Result<DataFrame, EngineError> {
    let options = ParquetReadOptions::default().schema(&SCHEMA).file_sort_order(vec![file_order()]);
    ctx.read_parquet(urls, options).await.map_err(crate::execute::storage_error)
}

fn logs_prefix(project: ProjectId) -> ObjectPath {
    ObjectPath::from_iter(["projects", &project.to_string(), "logs"])
}

fn hour_prefix(project: ProjectId, hour: Timestamp) -> ObjectPath {
    let name = hour.format(format_description!("[year]-[month]-[day]T[hour]")).expect("an hour formats");
    logs_prefix(project).join(name)
}

fn parse_hour(name: &str) -> Option<Timestamp> {
    let (date, hour) = name.split_once('T')?;
    let date = time::Date::parse(date, format_description!("[year]-[month]-[day]")).ok()?;
    let hour: u8 = hour.parse().ok().filter(|h| *h < 24 && hour.len() == 2)?;
    Some(date.with_hms(hour, 0, 0).ok()?.assume_utc())
}

fn hour_of(at: Timestamp) -> Timestamp {
    at.replace_time(time::Time::from_hms(at.hour(), 0, 0).expect("an hour of a day"))
}

/// What a node knows of its files in an hour it wrote to.
#[derive(Debug, Clone, Copy)]
struct HourFiles {
    /// Files flushed there since its last merge.
    flushed: usize,
    /// Whether files it merged are still there (deleted after the grace).
    merged_left: bool,
}

impl HourFiles {
    fn due(self, hour: Timestamp, now: Timestamp) -> bool {
        self.flushed >= MERGE_AT || (self.flushed > 0 && closed(hour, now)) || self.merged_left
    }
}

fn closed(hour: Timestamp, now: Timestamp) -> bool {
    hour + time::Duration::HOUR + CLOSED_AFTER <= now
}

fn age(modified: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now - modified).unwrap_or(Duration::ZERO)
}

/// `{node}_{level}_{first}_{last}.parquet`, the numbers in hexadecimal.
fn file_name(node: &str, level: u32, first: u64, last: u64) -> String {
    format!("{node}_{level}_{first:016x}_{last:016x}.parquet")
}

/// A log file and what its name says.
#[derive(Debug, Clone)]
struct LogFile {
    location: ObjectPath,
    /// When it was written.
    modified: Timestamp,
    /// Its bytes.
    size: u64,
    node: String,
    /// How many merges its records went through: 0 for a flush's file.
    level: u32,
    first: u64,
    last: u64,
}

impl LogFile {
    fn of(meta: ObjectMeta) -> Option<Self> {
        let name = meta.location.filename()?.strip_suffix(".parquet")?.to_owned();
        let mut parts = name.rsplitn(4, '_');
        let last = u64::from_str_radix(parts.next()?, 16).ok()?;
        let first = u64::from_str_radix(parts.next()?, 16).ok()?;
        let level = parts.next()?.parse().ok()?;
        let node = parts.next()?.to_owned();
        let modified = crate::tables::files::instant(&meta);
        let size = meta.size;
        (first <= last).then_some(Self { location: meta.location, modified, size, node, level, first, last })
    }

    /// Whether `other` holds this file's records (and more).
    fn within(&self, other: &Self) -> bool {
        self.node == other.node
            && other.first <= self.first
            && self.last <= other.last
            && (other.first, other.last) != (self.first, self.last)
    }
}

/// An hour's files: those to read, and those merged into one of them.
fn split(listed: Vec<ObjectMeta>) -> (Vec<LogFile>, Vec<LogFile>) {
    let files: Vec<LogFile> = listed.into_iter().filter_map(LogFile::of).collect();
    let merged = |file: &LogFile| files.iter().any(|other| file.within(other));
    let covered: Vec<bool> = files.iter().map(merged).collect();
    let mut visible = Vec::new();
    let mut gone = Vec::new();
    for (file, covered) in files.into_iter().zip(covered) {
        if covered {
            gone.push(file)
        } else {
            visible.push(file)
        }
    }
    (visible, gone)
}

fn instant(at: Timestamp) -> Expr {
    lit(ScalarValue::TimestampMicrosecond(Some(unix_micros(at)), Some("UTC".into())))
}

fn from_micros(micros: i64) -> Result<Timestamp, EngineError> {
    Timestamp::from_unix_timestamp_nanos(i128::from(micros) * 1000)
        .map_err(|e| EngineError::Internal(format!("a log record's time: {e}").into()))
}

/// Records as one batch of the log's columns.
fn batch(records: &[LogRecord]) -> Result<RecordBatch, EngineError> {
    let text = |f: &dyn Fn(&LogRecord) -> Option<&str>| -> ArrayRef {
        Arc::new(records.iter().map(f).collect::<StringArray>())
    };
    // Written in place, without a string per id.
    let mut ids = StringBuilder::with_capacity(records.len(), records.len() * uuid::fmt::Hyphenated::LENGTH);
    let mut text_id = [0_u8; uuid::fmt::Hyphenated::LENGTH];
    for record in records {
        ids.append_value(record.id.hyphenated().encode_lower(&mut text_id));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids.finish()),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(records.iter().map(|r| unix_micros(r.at)))
                .with_timezone("UTC"),
        ),
        text(&|r| Some(r.endpoint.as_str())),
        Arc::new(records.iter().map(|r| r.version).collect::<UInt32Array>()),
        text(&|r| Some(r.kind.as_str())),
        Arc::new(UInt16Array::from_iter_values(records.iter().map(|r| r.status))),
        text(&|r| r.code.as_deref()),
        Arc::new(Float64Array::from_iter_values(records.iter().map(LogRecord::duration_ms))),
        Arc::new(records.iter().map(|r| r.rows).collect::<UInt64Array>()),
        Arc::new(records.iter().map(|r| r.bytes_read).collect::<UInt64Array>()),
        text(&|r| r.source.map(LogSource::as_str)),
        text(&|r| r.credential.as_deref()),
        text(&|r| r.transport.map(Transport::as_str)),
        text(&|r| r.request_id.as_deref()),
        Arc::new(UInt32Array::from_iter_values(records.iter().map(|r| r.runs))),
    ];
    RecordBatch::try_new(SCHEMA.clone(), columns).map_err(|e| EngineError::Internal(Box::new(e)))
}

/// Batches as the bytes of one Parquet file of `level` (a flush's, held in memory: a second of records).
fn parquet(batches: &[RecordBatch], level: u32) -> Result<Vec<u8>, EngineError> {
    let mut bytes = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut bytes, SCHEMA.clone(), Some(properties(level))).map_err(internal)?;
    for batch in batches {
        writer.write(batch).map_err(internal)?;
    }
    writer.close().map_err(internal)?;
    Ok(bytes)
}

fn internal(e: datafusion::parquet::errors::ParquetError) -> EngineError {
    EngineError::Internal(Box::new(e))
}

/// How a file of `level` is written, with statistics for pruning by endpoint and time. A flush's file (level 0)
/// is written fast (LZ4) on the serving machine every second; merged ones small (zstd). Row groups of 16,384
/// rows: a merge reads a row group of each of its files at once and writes one, and a reader of one endpoint
/// skips the others' in finer steps (docs/logs.md, Storage). The ids are random enough that no dictionary and
/// no statistics are tried on them.
fn properties(level: u32) -> WriterProperties {
    let compression = if level == 0 { Compression::LZ4_RAW } else { Compression::ZSTD(ZstdLevel::default()) };
    let mut properties =
        WriterProperties::builder().set_compression(compression).set_max_row_group_row_count(Some(16 * 1024));
    for random in ["id", "request_id"] {
        let column = ColumnPath::from(random);
        properties = properties
            .set_column_dictionary_enabled(column.clone(), false)
            .set_column_statistics_enabled(column, EnabledStatistics::None);
    }
    properties.build()
}

/// The records of a batch of every column, in the project.
fn records_of(project: ProjectId, batch: &RecordBatch, into: &mut Vec<LogRecord>) -> Result<(), EngineError> {
    let text = |i: usize| batch.column(i).as_string::<i32>();
    let (id, endpoint, kind, code, source, credential, transport, request) =
        (text(0), text(2), text(4), text(6), text(10), text(11), text(12), text(13));
    let at = batch.column(1).as_primitive::<TimestampMicrosecondType>();
    let version = batch.column(3).as_primitive::<UInt32Type>();
    let status = batch.column(5).as_primitive::<UInt16Type>();
    let duration = batch.column(7).as_primitive::<Float64Type>();
    let rows = batch.column(8).as_primitive::<UInt64Type>();
    let bytes = batch.column(9).as_primitive::<UInt64Type>();
    let runs = batch.column(14).as_primitive::<UInt32Type>();
    let optional = |column: &StringArray, i: usize| column.is_valid(i).then(|| column.value(i).to_owned());
    let broken =
        |what: &str| EngineError::Internal(format!("a log record's {what} does not read back").into());
    for i in 0..batch.num_rows() {
        into.push(LogRecord {
            id: Uuid::try_parse(id.value(i)).map_err(|_| broken("id"))?,
            at: from_micros(at.value(i))?,
            project,
            endpoint: endpoint.value(i).to_owned(),
            version: version.is_valid(i).then(|| version.value(i)),
            kind: LogKind::parse(kind.value(i)).map_err(|_| broken("kind"))?,
            status: status.value(i),
            code: optional(code, i),
            duration: Duration::try_from_secs_f64(duration.value(i) / 1000.0).unwrap_or(Duration::ZERO),
            rows: rows.is_valid(i).then(|| rows.value(i)),
            bytes_read: bytes.is_valid(i).then(|| bytes.value(i)),
            source: source
                .is_valid(i)
                .then(|| LogSource::parse(source.value(i)))
                .transpose()
                .map_err(|_| broken("source"))?,
            credential: credential.is_valid(i).then(|| Arc::from(credential.value(i))),
            transport: transport
                .is_valid(i)
                .then(|| Transport::parse(transport.value(i)))
                .transpose()
                .map_err(|_| broken("transport"))?,
            request_id: optional(request, i),
            runs: runs.value(i),
        });
    }
    Ok(())
}
