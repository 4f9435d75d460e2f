//! `endpoints serve`

use std::time::Duration;

use bytesize::ByteSize;
use clap::builder::RangedU64ValueParser;
use clap::Args;

use super::CliError;
use crate::config::Config;
use crate::startup::{shutdown_signal, Application};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (the chosen address is logged).
    #[arg(long, env = "ENDPOINTS_BIND", default_value = "127.0.0.1:8000")]
    pub bind: String,
    /// HTTP worker threads (default: one per core).
    #[arg(long, env = "ENDPOINTS_WORKERS", default_value_t = 0)]
    pub workers: usize,
    /// Database connections in the pool.
    #[arg(long, env = "ENDPOINTS_DB_POOL_SIZE", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub pool_size: u32,
    /// Seconds a live query may run before it is cancelled (400 query_timeout).
    #[arg(long, env = "ENDPOINTS_QUERY_TIMEOUT_SECS", default_value_t = 30, value_parser = positive())]
    pub query_timeout_secs: u64,
    /// Memory one live query may use, in MiB (400 query_memory_limit beyond it).
    #[arg(long, env = "ENDPOINTS_QUERY_MEMORY_MB", default_value_t = 512, value_parser = positive_usize())]
    pub query_memory_mb: usize,
    /// Partitions a query's plan is split into: its scans, aggregations and joins run that many streams at once
    /// (default: one per core, and one for a run over at most 50,000 rows; 1 to 1024). More than the cores only
    /// helps a machine whose storage is slower than its CPUs.
    #[arg(long, env = "ENDPOINTS_QUERY_PARTITIONS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub query_partitions: Option<u16>,
    /// Memory the whole process stays under (`2GiB`, `1500MiB`): queries together get what the result cache
    /// (--cache-mb) and the process's own 256 MiB leave (at least one query's worth); a query that needs memory
    /// other queries hold gets 429 with Retry-After.
    #[arg(long, env = "ENDPOINTS_MAX_MEMORY", default_value = "2GiB", value_parser = clap::value_parser!(ByteSize))]
    pub max_memory: ByteSize,
    /// The largest page of rows one run may answer, as JSON, in MiB (400 result_too_large beyond it).
    #[arg(long, env = "ENDPOINTS_MAX_RESULT_MB", default_value_t = 32, value_parser = positive_usize())]
    pub max_result_mb: usize,
    /// The largest page, in rows, a run may write as CSV, NDJSON, Parquet or Arrow (400 on limit beyond it).
    #[arg(long, env = "ENDPOINTS_MAX_EXPORT_ROWS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_export_rows: u32,
    /// The largest page a run may write as CSV, NDJSON, Parquet or Arrow (`256MiB`, `1GiB`; 400
    /// result_too_large beyond it). Each is written to a temporary file, in one of the project's query slots.
    #[arg(long, env = "ENDPOINTS_MAX_EXPORT_BYTES", default_value = "256MiB", value_parser = clap::value_parser!(ByteSize))]
    pub max_export_bytes: ByteSize,
    /// The temporary files of written pages whose bodies are still being sent, all projects together (at least
    /// --max-export-bytes), one project's at most half: a page gives its query slot back once written and holds
    /// its size of this until it is sent; one that does not fit now is 429.
    #[arg(long, env = "ENDPOINTS_MAX_EXPORT_SPOOL", default_value = "1GiB", value_parser = clap::value_parser!(ByteSize))]
    pub max_export_spool: ByteSize,
    /// The largest upload of a table's rows, in MiB (413 payload_too_large beyond it).
    #[arg(long, env = "ENDPOINTS_MAX_UPLOAD_MB", default_value_t = 1024, value_parser = positive())]
    pub max_upload_mb: u64,
    /// A place tables may read external files or databases from, besides the storage's own bucket:
    /// `s3://bucket/prefix/`, `file:///dir/` or `postgres://[user:password@]host[:port]/database` (whose
    /// credentials serve registrations that give none). Repeat it for more; the variable takes several separated
    /// by spaces.
    #[arg(
        long = "allow-source",
        env = "ENDPOINTS_ALLOW_SOURCES",
        value_delimiter = ' ',
        value_name = "PREFIX"
    )]
    pub allow_sources: Vec<String>,
    /// Seconds between checks of an external Delta table for a newer version (0: at every run).
    #[arg(long, env = "ENDPOINTS_SOURCE_REFRESH_SECS", default_value_t = 10)]
    pub source_refresh_secs: u64,
    /// How long table files no version reads any more (after a replace or a compaction), and log entries a
    /// checkpoint made unnecessary, are kept for readers of older versions (humantime: 7d, 36h; at least 1h).
    #[arg(long, env = "ENDPOINTS_TABLE_RETENTION", default_value = "7d", value_parser = table_retention)]
    pub table_retention: Duration,
    /// How long a run's `next` cursor may be followed (humantime: 1h, 30m; at most the table retention, whose
    /// vacuum removes the files of the versions it pins).
    #[arg(long, env = "ENDPOINTS_CURSOR_TTL", default_value = "1h", value_parser = super::positive_duration)]
    pub cursor_ttl: Duration,
    /// Live queries one project may run at once (429 with Retry-After beyond it).
    #[arg(long, env = "ENDPOINTS_MAX_QUERIES_PER_PROJECT", default_value_t = 4, value_parser = positive_usize())]
    pub max_queries_per_project: usize,
    /// Memory of the result cache, in MiB.
    #[arg(long, env = "ENDPOINTS_CACHE_MB", default_value_t = 256)]
    pub cache_mb: u64,
    /// Memory of the table files kept decoded for runs, in MiB (default: a quarter of --max-memory; 0 keeps
    /// none): a table's newest files, decoded after a run read them, are read from memory by later runs, the
    /// least recently read leaving first.
    #[arg(long, env = "ENDPOINTS_HOT_TABLES_MB")]
    pub hot_tables_mb: Option<u64>,
    /// Seconds between writes of the last execution times to the database.
    #[arg(long, env = "ENDPOINTS_FLUSH_SECS", default_value_t = 5, value_parser = positive())]
    pub flush_secs: u64,
    /// Materialization refreshes this process runs at once; 0 leaves refreshing to other processes.
    #[arg(long, env = "ENDPOINTS_MATERIALIZE_WORKERS", default_value_t = 2)]
    pub materialize_workers: usize,
    /// Milliseconds between looks for due materialization refreshes (appends make them due within the
    /// endpoint's `freshness_seconds`, 1 at least).
    #[arg(long, env = "ENDPOINTS_MATERIALIZE_POLL_MS", default_value_t = 500, value_parser = positive())]
    pub materialize_poll_ms: u64,
    /// Seconds a refresh claim holds without renewal; a crashed process's refreshes are retried after it.
    #[arg(long, env = "ENDPOINTS_MATERIALIZE_LEASE_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(3..))]
    pub materialize_lease_secs: u64,
    /// Milliseconds between compactions of the tables this process appended to (their small files merged into
    /// full ones); 0 leaves compaction to other processes.
    #[arg(long, env = "ENDPOINTS_COMPACTION_INTERVAL_MS", default_value_t = 500)]
    pub compaction_interval_ms: u64,
    /// Seconds an append under an `Idempotency-Key` may be in flight: a retry meanwhile gets 409, a retry after
    /// it finds the rows of an append cut off by a crash, or writes them. Longer than an append can take.
    #[arg(long, env = "ENDPOINTS_APPEND_IN_FLIGHT_SECS", default_value_t = 120, value_parser = positive())]
    pub append_in_flight_secs: u64,
    /// Milliseconds a key read from the database is trusted before it is read again: the longest a revocation
    /// made elsewhere (the CLI, another node) waits to take effect; 0 reads the key on every request.
    #[arg(long, env = "ENDPOINTS_KEY_CACHE_MS", default_value_t = 1000)]
    pub key_cache_ms: u64,
    /// The most rows a rollup materialization may store; a refresh that would store more fails, saying so.
    #[arg(long, env = "ENDPOINTS_MAX_ROLLUP_ROWS", default_value_t = 10_000_000, value_parser = positive())]
    pub max_rollup_rows: u64,
    /// Seconds a materialization refresh may run before it is cancelled and recorded as failed.
    #[arg(long, env = "ENDPOINTS_REFRESH_TIMEOUT_SECS", default_value_t = 600, value_parser = positive())]
    pub refresh_timeout_secs: u64,
    /// Seconds a client has to send a request's head, and then its body, before it gets 408 and is disconnected.
    #[arg(long, env = "ENDPOINTS_CLIENT_TIMEOUT_SECS", default_value_t = 10, value_parser = positive())]
    pub client_timeout_secs: u64,
    /// Requests per second one API key may make, with bursts of twice as many (429 beyond); 0 for no limit.
    #[arg(long, env = "ENDPOINTS_RATE_LIMIT_KEY_PER_SEC", default_value_t = 100)]
    pub rate_limit_key_per_sec: u32,
    /// Requests per second all keys of one project may make together, with bursts of twice as many; 0 for no
    /// limit.
    #[arg(long, env = "ENDPOINTS_RATE_LIMIT_PROJECT_PER_SEC", default_value_t = 500)]
    pub rate_limit_project_per_sec: u32,
    /// Failed authentications (401) per second one client address may have, with bursts of twice as many;
    /// past them its requests get 429 before any credential is read. 0 for no limit (behind a proxy that hides
    /// client addresses, where every client shares one).
    #[arg(long, env = "ENDPOINTS_AUTH_FAILURES_PER_SEC", default_value_t = 10)]
    pub auth_failures_per_sec: u32,
    /// How long the run log keeps records (humantime: 30d, 12h); older ones are left out and deleted by the
    /// hour.
    #[arg(long, env = "ENDPOINTS_LOG_RETENTION", default_value = "30d", value_parser = super::positive_duration)]
    pub log_retention: Duration,
    /// How often the run log's buffered records are written to the storage, in milliseconds (sooner when a
    /// buffer is half full).
    #[arg(long, env = "ENDPOINTS_LOG_FLUSH_MS", default_value_t = 1000, value_parser = positive())]
    pub log_flush_ms: u64,
    /// Keep no run log: runs and refreshes are not recorded, and the logs, usage and `_logs` are empty.
    #[arg(long, env = "ENDPOINTS_NO_RUN_LOG")]
    pub no_run_log: bool,
}

/// A table retention: a duration of at least an hour.
fn table_retention(raw: &str) -> Result<Duration, String> {
    let retention = super::positive_duration(raw)?;
    if retention < query_engine::Storage::MIN_TABLE_RETENTION {
        return Err(
            "the table retention is at least 1h: readers of a version before a compaction need it".into()
        );
    }
    Ok(retention)
}

/// A whole number of at least one.
fn positive() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(1..)
}

/// A whole number of at least one, as a size or a count.
fn positive_usize() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..)
}

/// The process's own memory besides queries and the result cache: code, connections, buffers, caches of plans
/// and files.
const PROCESS_MIB: u64 = 256;

const MIB: u64 = 1024 * 1024;

/// The bytes of table files kept decoded: as set, else a quarter of `--max-memory`.
fn hot_tables_bytes(max_memory: ByteSize, hot_tables_mb: Option<u64>) -> u64 {
    hot_tables_mb.map_or(max_memory.as_u64() / 4, |mb| mb.saturating_mul(MIB))
}

/// The bytes every query may hold together: `--max-memory` less the result cache, the tables kept decoded and the
/// process's own, and at least one query's worth.
fn queries_memory(max_memory: ByteSize, set_apart: u64, query_memory_mb: usize) -> usize {
    let query = u64::try_from(query_memory_mb).unwrap_or(u64::MAX).saturating_mul(MIB);
    let left = max_memory.as_u64().saturating_sub(set_apart).saturating_sub(PROCESS_MIB * MIB);
    if left < query {
        tracing::warn!(
            max_memory = %max_memory,
            set_apart_mib = set_apart / MIB,
            query_memory_mb,
            "--max-memory leaves less than one query's memory to queries beside --cache-mb and --hot-tables-mb: \
             one query at a time may use it"
        );
    }
    usize::try_from(left.max(query)).unwrap_or(usize::MAX)
}

pub(super) async fn run(mut config: Config, args: ServeArgs) -> Result<(), CliError> {
    config.bind = args.bind;
    config.workers = args.workers;
    config.pool_size = args.pool_size;
    config.limits.query_timeout = Duration::from_secs(args.query_timeout_secs);
    config.limits.memory_limit = args.query_memory_mb.saturating_mul(1024 * 1024);
    config.limits.partitions =
        args.query_partitions.and_then(|n| std::num::NonZeroUsize::new(usize::from(n)));
    let hot_tables = hot_tables_bytes(args.max_memory, args.hot_tables_mb);
    config.limits.hot_tables = usize::try_from(hot_tables).unwrap_or(usize::MAX);
    let set_apart = args.cache_mb.saturating_mul(MIB).saturating_add(hot_tables);
    config.limits.server_memory = queries_memory(args.max_memory, set_apart, args.query_memory_mb);
    config.limits.result_bytes = args.max_result_mb.saturating_mul(1024 * 1024);
    config.limits.max_concurrent_per_project = args.max_queries_per_project;
    config.upload_limit = args.max_upload_mb.saturating_mul(1024 * 1024);
    config.export_limit = args.max_export_rows;
    config.limits.export_bytes = args.max_export_bytes.as_u64();
    config.limits.export_spool_bytes = args.max_export_spool.as_u64();
    config.allowed_sources = args.allow_sources;
    config.source_refresh = Duration::from_secs(args.source_refresh_secs);
    config.table_retention = args.table_retention;
    if args.cursor_ttl > args.table_retention {
        return Err(CliError::Usage(format!(
            "--cursor-ttl ({}) is longer than --table-retention ({}): a cursor's versions would be removed before it \
             expires",
            humantime::format_duration(args.cursor_ttl),
            humantime::format_duration(args.table_retention)
        )));
    }
    config.cursor_ttl = args.cursor_ttl;
    config.cache_bytes = args.cache_mb.saturating_mul(1024 * 1024);
    config.flush_interval = Duration::from_secs(args.flush_secs);
    config.worker.parallelism = args.materialize_workers;
    config.worker.poll = Duration::from_millis(args.materialize_poll_ms);
    config.lease = Duration::from_secs(args.materialize_lease_secs);
    config.append_in_flight = Duration::from_secs(args.append_in_flight_secs);
    config.compaction_interval =
        (args.compaction_interval_ms > 0).then(|| Duration::from_millis(args.compaction_interval_ms));
    config.limits.refresh_timeout = Duration::from_secs(args.refresh_timeout_secs);
    config.limits.rollup_rows = args.max_rollup_rows;
    config.key_cache_ttl = Duration::from_millis(args.key_cache_ms);
    config.client_timeout = Duration::from_secs(args.client_timeout_secs);
    let rate =
        |per_second| std::num::NonZeroU32::new(per_second).map(|per_second| http_actix::Rate { per_second });
    config.rate_limits = http_actix::RateLimitConfig {
        per_key: rate(args.rate_limit_key_per_sec),
        per_project: rate(args.rate_limit_project_per_sec),
        failed_auth_per_address: rate(args.auth_failures_per_sec),
    };
    config.run_log = (!args.no_run_log).then(|| crate::config::RunLogConfig {
        retention: args.log_retention,
        flush_interval: Duration::from_millis(args.log_flush_ms),
        ..Default::default()
    });
    // Tables an earlier release wrote are read as Delta tables from now on (as `migrate` does; nothing to do
    // when every table is one already).
    super::migrate::upgrade_tables(&config).await?;
    let app = Application::build(&config)?;
    app.run_until(shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
