//! Running a planned query: typed parameter values, the page window, the guards (time, memory, concurrency)
//! and the rows as one JSON array written straight from the Arrow batches.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::DataFusionError;
use datafusion::execution::cache::cache_manager::{
    CacheManager, CacheManagerConfig, FileMetadataCache, FileStatisticsCache,
};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::GreedyMemoryPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::scalar::ScalarValue;
use domain::{BoundValue, EngineError, ProjectId, QueryResult, Statistics};
use futures_util::TryStreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::compile::Compiled;
use crate::memory::{QueryPool, SERVER_MEMORY_IN_USE};

/// Limits every live query runs under.
#[derive(Debug, Clone)]
pub struct EngineLimits {
    /// A query still running after this is cancelled (`query_timeout`).
    pub query_timeout: Duration,
    /// Memory one query may hold for sorts, joins and aggregations, and scalar functions' output while they
    /// write it (`query_memory_limit`).
    pub memory_limit: usize,
    /// Memory every query of the process may hold together (the share of `--max-memory` left to queries); a
    /// query that needs more while others hold it waits its turn (429).
    pub server_memory: usize,
    /// Live queries one project may run at once; more are refused with 429.
    pub max_concurrent_per_project: usize,
    /// What a refused caller is told to wait.
    pub retry_after: Duration,
    /// A materialization refresh still running after this is cancelled and recorded as failed.
    pub refresh_timeout: Duration,
    /// The largest page of rows, as JSON, one run may answer (`result_too_large` past it).
    pub result_bytes: usize,
    /// The largest page one run may write in another format (`result_too_large` past it): each is written to a
    /// temporary file, in one of the project's query slots.
    pub export_bytes: u64,
    /// The temporary files of written pages whose bodies are still being sent, every project's together (at least
    /// `export_bytes`; one project's at most half, see [`Spool`]): a page gives its query slot back once written and holds its size of this until its body
    /// is sent; a page that does not fit now is refused (429) and its file dropped.
    pub export_spool_bytes: u64,
    /// The most rows a rollup may store; a refresh that would store more fails, saying so.
    pub rollup_rows: u64,
    /// Stored results (rollups or not) of at most this many rows are held decoded once read, so that a run
    /// reads no file.
    pub stored_rows_in_memory: usize,
    /// Partitions a live query's plan is split into (its scans, aggregations and joins run that many streams
    /// at once); `None`: one per core, DataFusion's default.
    pub partitions: Option<std::num::NonZeroUsize>,
}

impl Default for EngineLimits {
    fn default() -> Self {
        Self {
            query_timeout: Duration::from_secs(30),
            memory_limit: 512 * 1024 * 1024,
            server_memory: 1536 * 1024 * 1024,
            max_concurrent_per_project: 4,
            retry_after: Duration::from_secs(1),
            refresh_timeout: Duration::from_secs(600),
            result_bytes: 32 * 1024 * 1024,
            export_bytes: 256 * 1024 * 1024,
            export_spool_bytes: 1024 * 1024 * 1024,
            rollup_rows: 10_000_000,
            stored_rows_in_memory: 100_000,
            partitions: None,
        }
    }
}

/// One of a project's query slots, held while its query runs.
pub(crate) type Slot = OwnedSemaphorePermit;

/// The room written pages take until their bodies are sent ([`EngineLimits::export_spool_bytes`]), in KiB: every
/// project's pages together, and one project's at most half of it (at least a page's worth), so that one
/// project's slow readers leave room for the others'.
#[derive(Debug)]
pub(crate) struct Spool {
    all: Arc<Semaphore>,
    per_project: Mutex<ProjectSemaphores>,
}

impl Spool {
    const UNIT: u64 = 1024;

    pub(crate) fn new(limits: &EngineLimits) -> Self {
        let units = |bytes: u64| usize::try_from(bytes.div_ceil(Self::UNIT)).unwrap_or(usize::MAX);
        let all = units(limits.export_spool_bytes.max(limits.export_bytes)).min(Semaphore::MAX_PERMITS);
        let share = units(limits.export_bytes).max(all / 2).min(all);
        Self { all: Arc::new(Semaphore::new(all)), per_project: Mutex::new(ProjectSemaphores::new(share)) }
    }

    /// Takes the room of `project`'s page of `bytes`, held until the permits are dropped; [`EngineError::Busy`]
    /// when the pages being sent (the project's, or everyone's) leave too little now.
    pub(crate) fn take(
        &self,
        project: ProjectId,
        bytes: u64,
        retry_after: Duration,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), EngineError> {
        let units = u32::try_from(bytes.div_ceil(Self::UNIT).max(1)).unwrap_or(u32::MAX);
        let busy = |_| EngineError::Busy { retry_after };
        let share = self.per_project.lock().unwrap_or_else(PoisonError::into_inner).of(project);
        let own = share.try_acquire_many_owned(units).map_err(busy)?;
        let all = Arc::clone(&self.all).try_acquire_many_owned(units).map_err(busy)?;
        Ok((own, all))
    }
}

/// One semaphore of `permits` per project, created on first use and forgotten once idle: the map holds the
/// projects that hold or wait for a permit, plus at most as many idle ones again, whatever number of projects
/// ever came.
#[derive(Debug)]
struct ProjectSemaphores {
    semaphores: HashMap<ProjectId, Arc<Semaphore>>,
    permits: usize,
    /// The size at which idle projects are dropped next: twice what was left the last time (at least
    /// [`ProjectSemaphores::FIRST_PRUNE`]), so that the dropping costs a constant per call on average.
    prune_at: usize,
}

impl ProjectSemaphores {
    const FIRST_PRUNE: usize = 64;

    fn new(permits: usize) -> Self {
        Self { semaphores: HashMap::new(), permits, prune_at: 0 }
    }

    /// The project's semaphore, after dropping the projects nobody holds or waits for a permit of: only the map
    /// holds their semaphore (a permit and a waiter each hold it too), so a new one with every permit free is
    /// the same.
    fn of(&mut self, project: ProjectId) -> Arc<Semaphore> {
        if self.semaphores.len() >= self.prune_at.max(Self::FIRST_PRUNE) {
            self.semaphores.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
            self.prune_at = 2 * self.semaphores.len();
        }
        let permits = self.permits;
        Arc::clone(self.semaphores.entry(project).or_insert_with(|| Arc::new(Semaphore::new(permits))))
    }
}

/// A project's query slots ([`EngineLimits::max_concurrent_per_project`]).
#[derive(Debug)]
pub(crate) struct Slots {
    per_project: Mutex<ProjectSemaphores>,
}

impl Slots {
    pub(crate) fn new(limits: &EngineLimits) -> Self {
        Self { per_project: Mutex::new(ProjectSemaphores::new(limits.max_concurrent_per_project)) }
    }

    fn of(&self, project: ProjectId) -> Arc<Semaphore> {
        self.per_project.lock().unwrap_or_else(PoisonError::into_inner).of(project)
    }

    /// How many projects' semaphores are kept.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.per_project.lock().unwrap_or_else(PoisonError::into_inner).semaphores.len()
    }

    /// Waits for one of the project's slots (the caller bounds the wait).
    pub(crate) async fn acquire(&self, project: ProjectId) -> Option<OwnedSemaphorePermit> {
        // The semaphores are never closed.
        self.of(project).acquire_owned().await.ok()
    }

    pub(crate) fn try_acquire(
        &self,
        project: ProjectId,
        limits: &EngineLimits,
    ) -> Result<OwnedSemaphorePermit, EngineError> {
        self.of(project)
            .try_acquire_owned()
            .map_err(|_| EngineError::Busy { retry_after: limits.retry_after })
    }
}

/// The value bound to each numbered parameter, in order.
pub(crate) fn parameter_values(
    compiled: &Compiled,
    variables: &BTreeMap<String, BoundValue>,
) -> Result<Vec<ScalarValue>, EngineError> {
    compiled
        .params
        .iter()
        .map(|(name, _)| {
            let value = variables
                .get(name)
                .ok_or_else(|| EngineError::Internal(format!("variable '{name}' was not bound").into()))?;
            Ok(scalar(value))
        })
        .collect()
}

const UNIX_EPOCH_JULIAN_DAY: i32 = 2_440_588;

pub(crate) fn scalar(value: &BoundValue) -> ScalarValue {
    match value {
        BoundValue::String(s) => ScalarValue::Utf8(Some(s.clone())),
        BoundValue::Number(n) => ScalarValue::Float64(Some(*n)),
        BoundValue::Integer(i) => ScalarValue::Int64(Some(*i)),
        BoundValue::Boolean(b) => ScalarValue::Boolean(Some(*b)),
        BoundValue::Date(d) => ScalarValue::Date32(Some(d.to_julian_day() - UNIX_EPOCH_JULIAN_DAY)),
        BoundValue::DateTime(t) => {
            let micros = i64::try_from(t.unix_timestamp_nanos() / 1_000).unwrap_or(i64::MAX);
            ScalarValue::TimestampMicrosecond(Some(micros), None)
        }
        BoundValue::List(items) => {
            let items: Vec<ScalarValue> = items.iter().map(|s| ScalarValue::Utf8(Some(s.clone()))).collect();
            ScalarValue::List(ScalarValue::new_list_nullable(&items, &DataType::Utf8))
        }
    }
}

/// A per-query runtime whose memory pool refuses allocations past the query's limit or past what every query
/// holds together (`memory`), sharing the engine's `files` caches.
pub(crate) fn runtime(
    limits: &EngineLimits,
    files: &FileCaches,
    memory: &Arc<GreedyMemoryPool>,
) -> Result<Arc<datafusion::execution::runtime_env::RuntimeEnv>, EngineError> {
    // No spilling: a query over its memory limit fails with `query_memory_limit` instead of filling the disk.
    RuntimeEnvBuilder::new()
        .with_disk_manager_builder(DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled))
        .with_memory_pool(Arc::new(QueryPool::new(limits.memory_limit, Arc::clone(memory))))
        .with_cache_manager(files.config())
        .build_arc()
        .map_err(|e| EngineError::Internal(Box::new(e)))
}

/// What the runtimes of every query share: the Parquet footers (with their page indexes) and the statistics of
/// the files they read, so that a run decodes a table's footers only the first time, as an engine with a
/// long-lived catalog does. A new runtime per query would start them empty.
///
/// A cached entry cannot hide a change: table files are never rewritten in place (a write adds files, or
/// switches the table to a new directory), and both caches check a file's size and modification time at
/// each use. Both are bounded, the least recently used entries leaving first. Listings are not cached: an
/// append's new file is seen by the next run.
#[derive(Debug, Clone)]
pub(crate) struct FileCaches {
    metadata: Option<Arc<FileMetadataCache>>,
    statistics: Option<Arc<FileStatisticsCache>>,
}

impl FileCaches {
    /// Bytes of Parquet footers kept (DataFusion's default is 50 MiB).
    const METADATA_LIMIT: usize = 32 * 1024 * 1024;

    pub(crate) fn new() -> Self {
        // Building DataFusion's default caches cannot fail; if it did, each runtime would make its own.
        let shared = CacheManager::try_new(&Self::none().config()).ok();
        Self {
            metadata: shared.as_ref().map(|caches| caches.get_file_metadata_cache()),
            statistics: shared.and_then(|caches| caches.get_file_statistic_cache()),
        }
    }

    fn none() -> Self {
        Self { metadata: None, statistics: None }
    }

    fn config(&self) -> CacheManagerConfig {
        CacheManagerConfig::default()
            .with_file_metadata_cache(self.metadata.clone())
            .with_metadata_cache_limit(Self::METADATA_LIMIT)
            .with_file_statistics_cache(self.statistics.clone())
    }

    /// Files whose footers are kept.
    #[cfg(test)]
    pub(crate) fn footers(&self) -> usize {
        self.metadata.as_ref().map_or(0, |cache| cache.len())
    }
}

/// Maps an execution error: memory exhaustion and plan errors are the caller's; the rest is ours.
pub(crate) fn execution_error(err: DataFusionError) -> EngineError {
    #[cfg(feature = "ballista")]
    if crate::distributed::is_unreachable(&err) {
        return EngineError::Unavailable(Box::new(err));
    }
    match err.find_root() {
        // Not the query's fault: the server's memory is held by other queries now.
        DataFusionError::ResourcesExhausted(reason) if reason.starts_with(SERVER_MEMORY_IN_USE) => {
            EngineError::Busy { retry_after: Duration::from_secs(1) }
        }
        DataFusionError::ResourcesExhausted(reason) => EngineError::MemoryLimit(reason.clone()),
        DataFusionError::Plan(_) | DataFusionError::SQL(..) | DataFusionError::SchemaError(..) => {
            EngineError::InvalidQuery(crate::message(&err))
        }
        // Casts of bad data, division by zero and the like: the query's own failure, reported to its caller.
        DataFusionError::ArrowError(..) | DataFusionError::Execution(_) => {
            EngineError::InvalidQuery(crate::message(&err))
        }
        // A file of an external source that resolves outside the folders the operator allowed.
        DataFusionError::ObjectStore(e) if matches!(**e, object_store::Error::PermissionDenied { .. }) => {
            EngineError::InvalidQuery(crate::message(&err))
        }
        DataFusionError::ObjectStore(_) => EngineError::Unavailable(Box::new(err)),
        _ => EngineError::Internal(Box::new(err)),
    }
}

/// Maps an error reading stored files outside a query (registering a table, reading a schema): an unreachable
/// storage is unavailable, anything else (a corrupt file) is ours.
pub(crate) fn storage_error(err: DataFusionError) -> EngineError {
    match err.find_root() {
        DataFusionError::ObjectStore(_) => EngineError::Unavailable(Box::new(err)),
        _ => EngineError::Internal(Box::new(err)),
    }
}

/// Adds the page window: `limit + 1` rows are fetched so that `hasMore` needs no count query.
pub(crate) fn window(
    plan: datafusion::logical_expr::LogicalPlan,
    limit: u32,
    offset: u64,
) -> Result<datafusion::logical_expr::LogicalPlan, EngineError> {
    let skip = usize::try_from(offset).unwrap_or(usize::MAX);
    LogicalPlanBuilder::from(plan)
        .limit(skip, Some(limit as usize + 1))
        .and_then(LogicalPlanBuilder::build)
        .map_err(|e| EngineError::Internal(Box::new(e)))
}

/// Runs the stream to its end. The caller bounds the whole query (planning included) by the time limit, and
/// dropping the stream on timeout cancels the query.
pub(crate) async fn collect(
    stream: datafusion::physical_plan::SendableRecordBatchStream,
) -> Result<Vec<RecordBatch>, EngineError> {
    stream.try_collect::<Vec<_>>().await.map_err(execution_error)
}

/// Rows are written in slices of this many, so that a page over the byte limit is caught within one slice.
const JSON_SLICE_ROWS: usize = 512;

/// The first `limit` rows as a JSON array of objects, straight from Arrow, and whether a row was left over.
///
/// # Errors
/// [`EngineError::ResultTooLarge`] as soon as the JSON passes `max_bytes`; the rest is never written.
pub(crate) fn to_json(
    batches: &[RecordBatch],
    limit: u32,
    max_bytes: usize,
) -> Result<(String, usize, bool), EngineError> {
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let keep = total.min(limit as usize);
    let mut writer = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::JsonArray>(Vec::with_capacity((keep * 64).min(max_bytes)));
    let mut remaining = keep;
    for batch in batches {
        let mut start = 0;
        while remaining > 0 && start < batch.num_rows() {
            let take = remaining.min(batch.num_rows() - start).min(JSON_SLICE_ROWS);
            writer.write(&batch.slice(start, take)).map_err(|e| EngineError::Internal(Box::new(e)))?;
            if writer.get_ref().len() > max_bytes {
                return Err(EngineError::ResultTooLarge { limit_bytes: max_bytes });
            }
            start += take;
            remaining -= take;
        }
    }
    writer.finish().map_err(|e| EngineError::Internal(Box::new(e)))?;
    let bytes = writer.into_inner();
    let json = if bytes.is_empty() {
        "[]".to_owned()
    } else {
        String::from_utf8(bytes).map_err(|e| EngineError::Internal(Box::new(e)))?
    };
    Ok((json, keep, total > keep))
}

pub(crate) fn result(
    columns: Vec<domain::Column>,
    batches: &[RecordBatch],
    limit: u32,
    max_bytes: usize,
    statistics: Statistics,
) -> Result<QueryResult, EngineError> {
    let (rows_json, row_count, has_more) = to_json(batches, limit, max_bytes)?;
    Ok(QueryResult { columns, rows_json, row_count, has_more, statistics, read: Vec::new() })
}

/// What an executed plan read, from the metrics of its leaves (the scans): the rows they produced and the bytes
/// their files gave. A leaf that reads nothing (`SELECT 1`) counts 0; a leaf that is not a scan (a plan executed
/// on Ballista's workers, which keep their metrics) makes the figures unknown, as does a scan that reports rows
/// but not bytes.
pub(crate) fn statistics(plan: &Arc<dyn ExecutionPlan>, elapsed: Duration) -> Statistics {
    let (mut rows, mut bytes) = (Some(0_u64), Some(0_u64));
    let mut pending = vec![Arc::clone(plan)];
    while let Some(node) = pending.pop() {
        let children = node.children();
        if !children.is_empty() {
            pending.extend(children.into_iter().cloned());
            continue;
        }
        if node.is::<EmptyExec>() || node.is::<PlaceholderRowExec>() {
            continue;
        }
        // Any other leaf (Ballista's, which hands the plan to its executors) says what it returned, not read.
        match node.metrics().filter(|_| node.is::<DataSourceExec>()) {
            Some(metrics) => {
                let produced = metrics.output_rows().unwrap_or(0) as u64;
                rows = rows.map(|r| r + produced);
                bytes = match metrics.sum_by_name("bytes_scanned") {
                    Some(scanned) => bytes.map(|b| b + scanned.as_usize() as u64),
                    None if produced == 0 => bytes,
                    None => None,
                };
            }
            None => (rows, bytes) = (None, None),
        }
    }
    Statistics { rows_read: rows, bytes_read: bytes, elapsed }
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    #[tokio::test]
    async fn idle_projects_are_forgotten_and_busy_ones_keep_their_slots() {
        let limits = EngineLimits { max_concurrent_per_project: 2, ..EngineLimits::default() };
        let slots = Slots::new(&limits);
        let project = |id| ProjectId::new(id).expect("a project id");
        // Project 1 holds both its slots; project 2 waits for one of its own after holding the only other.
        let held = [
            slots.try_acquire(project(1), &limits).unwrap(),
            slots.try_acquire(project(1), &limits).unwrap(),
        ];
        let other = slots.try_acquire(project(2), &limits).unwrap();
        let _second = slots.try_acquire(project(2), &limits).unwrap();
        let waiting = tokio::spawn({
            let semaphore = slots.of(project(2));
            async move { semaphore.acquire_owned().await.map(drop) }
        });
        // Ten thousand projects run one query each, one after the other.
        for id in 3..10_003 {
            drop(slots.try_acquire(project(id), &limits).unwrap());
        }
        assert!(slots.kept() < 200, "idle projects are forgotten: {} kept", slots.kept());
        assert!(
            matches!(slots.try_acquire(project(1), &limits), Err(EngineError::Busy { .. })),
            "still full"
        );
        drop(other);
        waiting.await.unwrap().unwrap();
        drop(held);
        assert!(slots.try_acquire(project(1), &limits).is_ok());
    }
}
