//! Running a planned query: typed parameter values, the page window, the guards (time, memory, concurrency)
//! and the rows as one JSON array written straight from the Arrow batches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::DataFusionError;
use datafusion::execution::cache::cache_manager::{
    CacheManager, CacheManagerConfig, FileMetadataCache, FileStatisticsCache,
};
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::scalar::ScalarValue;
use domain::{BoundValue, EngineError, QueryResult, Statistics};
use futures_util::TryStreamExt;

use crate::compile::Compiled;
use crate::memory::SERVER_MEMORY_IN_USE;

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
    /// Queries one project may plan or run at once ([`crate::admission`]): more runs, dry runs and exports are
    /// refused with 429 (refreshes take none).
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
    /// `export_bytes`; one project's at most half, see [`crate::admission`]): a page gives its query slot back once
    /// written and holds its size of this until its body is sent; a page that does not fit now is refused (429)
    /// and its file dropped.
    pub export_spool_bytes: u64,
    /// The most rows a rollup grouped by filtered columns (beyond the query's keys) may store; a refresh that
    /// would store more fails, saying so.
    pub rollup_rows: u64,
    /// Stored results (rollups or not) of at most this many rows are held decoded once read, so that a run
    /// reads no file.
    pub stored_rows_in_memory: usize,
    /// Partitions a live query's plan is split into (its scans, aggregations and joins run that many streams
    /// at once); `None`: one per core, DataFusion's default, and one for a run over few rows
    /// ([`crate::ONE_PARTITION_ROWS`]).
    pub partitions: Option<std::num::NonZeroUsize>,
    /// Bytes of table files kept decoded for runs (`--hot-tables-mb`, see `hot_tables`); 0: none.
    pub hot_tables: usize,
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
            hot_tables: 512 * 1024 * 1024,
        }
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

    /// The footers alone, for the run log's reads: with the statistics cache too, a page of an endpoint's
    /// newest records (`logs?limit=100`, its files declared sorted by endpoint and time) took 107-132 ms once
    /// a load's files were merged, against 25-30 ms with the footers alone and 37-48 ms with neither (usage
    /// 75-95 ms with the footers against 94-121 with neither); why the statistics slow that plan is not known.
    pub(crate) fn footers_only(&self) -> Self {
        Self { metadata: self.metadata.clone(), statistics: None }
    }

    pub(crate) fn config(&self) -> CacheManagerConfig {
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
/// their files gave (or, for a scan of decoded files, the rows and bytes of the slices it read). A leaf that reads nothing (`SELECT 1`) counts 0; a leaf that is not a scan (a plan executed
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
        if let Some((decoded_rows, decoded_bytes)) = crate::hot_tables::read(node.as_ref()) {
            rows = rows.map(|r| r + decoded_rows);
            bytes = bytes.map(|b| b + decoded_bytes);
            continue;
        }
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
