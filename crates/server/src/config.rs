//! Runtime configuration, from flags and environment variables.

use std::path::PathBuf;

/// Everything the application needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// Holds the SQLite file (by default) and, unless `storage` names another place, the project tables.
    pub data_dir: PathBuf,
    /// Where project tables and stored results live: a directory, `file:///path` or `s3://bucket[/prefix]`;
    /// `None` means the data directory.
    pub storage: Option<String>,
    /// Where queries run: `None` or `embedded` in this process, `ballista://HOST:PORT` on a Ballista cluster.
    pub engine: Option<String>,
    /// `sqlite://PATH` or `postgres://...`; `None` means `sqlite://DATA_DIR/endpoints.db`.
    pub database_url: Option<String>,
    /// Address to listen on; port 0 picks a free port.
    pub bind: String,
    /// Connections in the database pool.
    pub pool_size: u32,
    /// HTTP worker threads; 0 means one per core.
    pub workers: usize,
    /// Bytes of results the in-memory cache may hold.
    pub cache_bytes: u64,
    /// Limits of live queries.
    pub limits: query_engine::EngineLimits,
    /// How often pending execution times are written to the store.
    pub flush_interval: std::time::Duration,
    /// The materialization worker of `serve`.
    pub worker: crate::worker::WorkerConfig,
    /// How long a refresh claim holds without renewal; a crashed worker's refreshes are retried after it.
    pub lease: std::time::Duration,
    /// How often the tables this process appended to are compacted; `None` leaves it to other processes.
    pub compaction_interval: Option<std::time::Duration>,
    /// How long an append under an `Idempotency-Key` may be in flight before a retry takes it for cut off.
    pub append_in_flight: std::time::Duration,
    /// How long a key read from the database is trusted before it is read again.
    pub key_cache_ttl: std::time::Duration,
    /// How long a client has to send a request's head, and then its body (slow-client protection).
    pub client_timeout: std::time::Duration,
    /// The largest upload of a table's rows, in bytes.
    pub upload_limit: u64,
    /// Prefixes of external sources tables may read besides the storage's bucket (`--allow-source`).
    pub allowed_sources: Vec<String>,
    /// How often an external Delta table is checked for a newer version (`--source-refresh-secs`).
    pub source_refresh: std::time::Duration,
    /// How long table files no version reads any more are kept (`--table-retention`).
    pub table_retention: std::time::Duration,
    /// How long a run's `next` cursor may be followed (`--cursor-ttl`).
    pub cursor_ttl: std::time::Duration,
    /// The largest page a run may write as CSV, NDJSON, Parquet or Arrow, in rows.
    pub export_limit: u32,
    /// Request rate limits per key and per project; off unless set (`serve` sets its defaults).
    pub rate_limits: http_actix::RateLimitConfig,
    /// The run log; `None` keeps none.
    pub run_log: Option<RunLogConfig>,
    /// What every part of the service tells the time by: the wall clock, or a test's.
    pub clock: ServiceClock,
}

/// The clock the service is given.
#[derive(Clone)]
pub struct ServiceClock(pub std::sync::Arc<dyn domain::Clock>);

impl std::fmt::Debug for ServiceClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceClock")
    }
}

impl Default for ServiceClock {
    fn default() -> Self {
        Self(std::sync::Arc::new(domain::SystemClock))
    }
}

/// How the run log is kept.
#[derive(Debug, Clone, Copy)]
pub struct RunLogConfig {
    /// How long records are kept.
    pub retention: std::time::Duration,
    /// How often buffered records are written (sooner when a buffer is half full).
    pub flush_interval: std::time::Duration,
    /// Records held between flushes at most (see [`query_engine::LogSettings::buffered`]).
    pub buffered: usize,
}

impl Default for RunLogConfig {
    fn default() -> Self {
        Self {
            retention: query_engine::LogSettings::default().retention,
            flush_interval: std::time::Duration::from_secs(1),
            buffered: query_engine::LogSettings::default().buffered,
        }
    }
}

impl Config {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            storage: None,
            engine: None,
            database_url: None,
            bind: "127.0.0.1:8000".into(),
            pool_size: 8,
            workers: 0,
            cache_bytes: 256 * 1024 * 1024,
            limits: query_engine::EngineLimits::default(),
            flush_interval: std::time::Duration::from_secs(5),
            worker: crate::worker::WorkerConfig::default(),
            lease: std::time::Duration::from_secs(60),
            compaction_interval: Some(std::time::Duration::from_millis(500)),
            append_in_flight: domain::APPEND_IN_FLIGHT,
            key_cache_ttl: domain::ApiKeyService::KEY_CACHE_TTL,
            client_timeout: http_actix::DEFAULT_CLIENT_TIMEOUT,
            rate_limits: http_actix::RateLimitConfig::default(),
            upload_limit: http_actix::DEFAULT_UPLOAD_LIMIT,
            export_limit: domain::RunRequest::DEFAULT_EXPORT_LIMIT,
            allowed_sources: Vec::new(),
            source_refresh: query_engine::Storage::DEFAULT_SOURCE_REFRESH,
            table_retention: query_engine::Storage::DEFAULT_TABLE_RETENTION,
            cursor_ttl: domain::RunService::DEFAULT_CURSOR_TTL,
            run_log: Some(RunLogConfig::default()),
            clock: ServiceClock::default(),
        }
    }

    /// The storage of project tables and stored results.
    ///
    /// # Errors
    /// [`query_engine::StorageError`] when the location is not usable.
    pub fn storage(&self) -> Result<query_engine::Storage, query_engine::StorageError> {
        let storage = match &self.storage {
            Some(location) => query_engine::Storage::open(location)?,
            None => query_engine::Storage::local(&self.data_dir)?,
        };
        Ok(storage
            .allowing_sources(&self.allowed_sources, self.source_refresh)?
            .retaining_tables_for(self.table_retention)
            .timed_by(std::sync::Arc::clone(&self.clock.0)))
    }

    /// The database URL in force.
    pub fn database_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.data_dir.join("endpoints.db").display()))
    }
}
