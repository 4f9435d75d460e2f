//! `endpoints serve`

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
    #[arg(long, env = "ENDPOINTS_DB_POOL_SIZE", default_value_t = 8)]
    pub pool_size: u32,
    /// Seconds a live query may run before it is cancelled (400 query_timeout).
    #[arg(long, env = "ENDPOINTS_QUERY_TIMEOUT_SECS", default_value_t = 30)]
    pub query_timeout_secs: u64,
    /// Memory one live query may use, in MiB (400 query_memory_limit beyond it).
    #[arg(long, env = "ENDPOINTS_QUERY_MEMORY_MB", default_value_t = 512)]
    pub query_memory_mb: usize,
    /// The largest page of rows one run may answer, as JSON, in MiB (400 result_too_large beyond it).
    #[arg(long, env = "ENDPOINTS_MAX_RESULT_MB", default_value_t = 32)]
    pub max_result_mb: usize,
    /// Live queries one project may run at once (429 with Retry-After beyond it).
    #[arg(long, env = "ENDPOINTS_MAX_QUERIES_PER_PROJECT", default_value_t = 4)]
    pub max_queries_per_project: usize,
    /// Memory of the result cache, in MiB.
    #[arg(long, env = "ENDPOINTS_CACHE_MB", default_value_t = 256)]
    pub cache_mb: u64,
    /// Seconds between writes of the last execution times to the database.
    #[arg(long, env = "ENDPOINTS_FLUSH_SECS", default_value_t = 5)]
    pub flush_secs: u64,
    /// Materialization refreshes this process runs at once; 0 leaves refreshing to other processes.
    #[arg(long, env = "ENDPOINTS_MATERIALIZE_WORKERS", default_value_t = 2)]
    pub materialize_workers: usize,
    /// Milliseconds between looks for due materialization refreshes.
    #[arg(long, env = "ENDPOINTS_MATERIALIZE_POLL_MS", default_value_t = 5000)]
    pub materialize_poll_ms: u64,
    /// Seconds a refresh claim holds without renewal; a crashed process's refreshes are retried after it.
    #[arg(long, env = "ENDPOINTS_MATERIALIZE_LEASE_SECS", default_value_t = 60)]
    pub materialize_lease_secs: u64,
    /// Milliseconds a key read from the database is trusted before it is read again: the longest a revocation
    /// made elsewhere (the CLI, another node) waits to take effect; 0 reads the key on every request.
    #[arg(long, env = "ENDPOINTS_KEY_CACHE_MS", default_value_t = 1000)]
    pub key_cache_ms: u64,
    /// Seconds a materialization refresh may run before it is cancelled and recorded as failed.
    #[arg(long, env = "ENDPOINTS_REFRESH_TIMEOUT_SECS", default_value_t = 600)]
    pub refresh_timeout_secs: u64,
    /// Seconds a client has to send a request's head, and then its body, before it gets 408 and is disconnected.
    #[arg(long, env = "ENDPOINTS_CLIENT_TIMEOUT_SECS", default_value_t = 10)]
    pub client_timeout_secs: u64,
    /// Requests per second one API key may make, with bursts of twice as many (429 beyond); 0 for no limit.
    #[arg(long, env = "ENDPOINTS_RATE_LIMIT_KEY_PER_SEC", default_value_t = 100)]
    pub rate_limit_key_per_sec: u32,
    /// Requests per second all keys of one project may make together, with bursts of twice as many; 0 for no
    /// limit.
    #[arg(long, env = "ENDPOINTS_RATE_LIMIT_PROJECT_PER_SEC", default_value_t = 500)]
    pub rate_limit_project_per_sec: u32,
}

pub(super) async fn run(mut config: Config, args: ServeArgs) -> Result<(), CliError> {
    config.bind = args.bind;
    config.workers = args.workers;
    config.pool_size = args.pool_size;
    if args.query_timeout_secs == 0
        || args.query_memory_mb == 0
        || args.max_result_mb == 0
        || args.max_queries_per_project == 0
        || args.flush_secs == 0
        || args.materialize_poll_ms == 0
        || args.materialize_lease_secs < 3
        || args.refresh_timeout_secs == 0
        || args.client_timeout_secs == 0
    {
        return Err(CliError::Usage(
            "--query-timeout-secs, --query-memory-mb, --max-result-mb, --max-queries-per-project, --flush-secs, \
             --materialize-poll-ms, --refresh-timeout-secs and --client-timeout-secs must be positive, and --materialize-lease-secs at \
             least 3"
                .into(),
        ));
    }
    config.limits.query_timeout = std::time::Duration::from_secs(args.query_timeout_secs);
    config.limits.memory_limit = args.query_memory_mb.saturating_mul(1024 * 1024);
    config.limits.result_bytes = args.max_result_mb.saturating_mul(1024 * 1024);
    config.limits.max_concurrent_per_project = args.max_queries_per_project;
    config.cache_bytes = args.cache_mb.saturating_mul(1024 * 1024);
    config.flush_interval = std::time::Duration::from_secs(args.flush_secs);
    config.worker.parallelism = args.materialize_workers;
    config.worker.poll = std::time::Duration::from_millis(args.materialize_poll_ms);
    config.lease = std::time::Duration::from_secs(args.materialize_lease_secs);
    config.limits.refresh_timeout = std::time::Duration::from_secs(args.refresh_timeout_secs);
    config.key_cache_ttl = std::time::Duration::from_millis(args.key_cache_ms);
    config.client_timeout = std::time::Duration::from_secs(args.client_timeout_secs);
    let rate =
        |per_second| std::num::NonZeroU32::new(per_second).map(|per_second| http_actix::Rate { per_second });
    config.rate_limits = http_actix::RateLimitConfig {
        per_key: rate(args.rate_limit_key_per_sec),
        per_project: rate(args.rate_limit_project_per_sec),
    };
    let app = Application::build(&config)?;
    app.run_until(shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
