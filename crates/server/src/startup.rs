//! Builds the application from its configuration: database, engine, services, HTTP server.

use std::future::Future;
use std::net::TcpListener;
use std::sync::Arc;

use cache_moka::MemoryResultCache;
use domain::{
    ApiKeyService, EndpointDeps, EndpointService, ExecutionTracker, Invalidator, LogService, MaintenanceDeps,
    MaterializationPorts, NoRunLog, RefreshDeps, RefreshService, ResultCache, RunDeps, RunLog, RunService,
    TableDeps, TableMaintenance, TableService,
};
use http_actix::{AppState, MeteredRunLog, RunMetrics};
use query_engine::{DataFusionEngine, LogSettings, ParquetRunLog};
use store_diesel::{Backend, ChangeListener, Database, DatabaseConfig, DieselStore};

use crate::config::Config;

/// Why the application could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot open the database")]
    Database(#[source] domain::StoreError),
    #[error("the database schema is not up to date: run `endpoints migrate` first")]
    PendingMigrations,
    #[error("cannot use the engine: {0}")]
    Engine(String),
    #[error("cannot use the storage")]
    Storage(#[source] query_engine::StorageError),
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The services an operator command or the server needs, wired over one database.
pub struct Services {
    pub database: Database,
    pub store: Arc<DieselStore>,
    pub endpoints: Arc<EndpointService>,
    pub runs: Arc<RunService>,
    pub keys: Arc<ApiKeyService>,
    pub tables: Arc<TableService>,
    pub executions: Arc<ExecutionTracker>,
    pub engine: Arc<DataFusionEngine>,
    pub materializer: Arc<RefreshService>,
    pub maintenance: Arc<TableMaintenance>,
    /// What this process keeps from the store in memory, for changes other processes announce.
    pub kept: Invalidator,
    /// Where runs and refreshes are logged, and their logs read.
    pub logs: Arc<LogService>,
    /// The run log this process writes, when it keeps one: flushed and maintained by `serve`.
    pub run_log: Option<ParquetRunLog>,
    /// Runs counted from their records, on their way to the run log.
    pub run_metrics: Arc<RunMetrics>,
}

impl Services {
    /// Opens the database and wires the domain services. The embedded SQLite database is migrated here, so a
    /// new user needs no extra step; PostgreSQL is migrated only by `endpoints migrate`.
    ///
    /// # Errors
    /// [`StartupError::Database`] when the database cannot be opened or migrated, [`StartupError::Storage`] when
    /// the storage location is not usable.
    pub fn open(config: &Config) -> Result<Self, StartupError> {
        let mut db_config = DatabaseConfig::new(config.database_url());
        db_config.pool_size = config.pool_size;
        let database = Database::connect(&db_config).map_err(StartupError::Database)?;
        if database.backend() == Backend::Sqlite {
            database.migrate().map_err(StartupError::Database)?;
        }
        let storage = config.storage().map_err(StartupError::Storage)?;
        let log_retention = config.run_log.map_or(std::time::Duration::ZERO, |log| log.retention);
        let embedded = DataFusionEngine::new(storage)
            .with_limits(config.limits.clone())
            .with_log_retention(log_retention);
        let run_log = config.run_log.map(|log| {
            embedded.run_log(LogSettings {
                retention: log.retention,
                buffered: log.buffered,
                ..LogSettings::default()
            })
        });
        let engine = Arc::new(engine(embedded, config)?);
        Ok(Self::wire(config, database, engine, run_log))
    }

    /// The domain services over the opened database, engine and run log.
    fn wire(
        config: &Config,
        database: Database,
        engine: Arc<DataFusionEngine>,
        run_log: Option<ParquetRunLog>,
    ) -> Self {
        let store = Arc::new(DieselStore::new(database.clone()));
        let clock = Arc::clone(&config.clock.0);
        let logged: Arc<dyn RunLog> = match &run_log {
            Some(log) => Arc::new(log.clone()),
            None => Arc::new(NoRunLog),
        };
        let cache: Arc<dyn ResultCache> = Arc::new(MemoryResultCache::new(config.cache_bytes));
        let executions = Arc::new(ExecutionTracker::new(store.clone()));
        let materializations = MaterializationPorts { states: store.clone(), results: engine.clone() };
        let run_metrics = Arc::new(RunMetrics::default());
        // A write (an update, a delete, a revocation) is answered once every other process applied it.
        let propagation = database.propagation();
        let keys = Arc::new(
            ApiKeyService::new(store.clone(), store.clone(), clock.clone())
                .with_key_cache_ttl(config.key_cache_ttl)
                .with_propagation(propagation.clone()),
        );
        // A table write is announced with its readers; a process hearing every announcement reads the tables'
        // versions it keeps without asking the storage.
        let kept = Invalidator::new(cache.clone(), keys.clone())
            .with_propagation(propagation)
            .with_tables(engine.clone());
        let changes = Arc::new(kept.clone());
        let changes_for_refreshes: Arc<dyn domain::EndpointChanges> = changes.clone();
        let (maintenance, tables) = table_services(config, &store, &engine, changes.clone());
        let endpoints = Arc::new(
            EndpointService::new(EndpointDeps {
                store: store.clone(),
                engine: engine.clone(),
                clock: clock.clone(),
                materializations: materializations.clone(),
                executions: executions.clone(),
                changes,
            })
            .with_table_readers(maintenance.clone()),
        );
        let runs = Arc::new(RunService::new(RunDeps {
            store: store.clone(),
            engine: engine.clone(),
            cache,
            clock: clock.clone(),
            executions: executions.clone(),
            materializations,
            export_limit: config.export_limit,
            cursor_ttl: config.cursor_ttl,
            log: Arc::new(MeteredRunLog::new(Arc::clone(&logged), Arc::clone(&run_metrics))),
        }));
        let materializer = Arc::new(
            RefreshService::new(RefreshDeps {
                states: store.clone(),
                engine: engine.clone(),
                results: engine.clone(),
                clock: clock.clone(),
                changes: changes_for_refreshes,
                lease: config.lease,
            })
            .with_log(Arc::clone(&logged)),
        );
        let logs = Arc::new(LogService::new(store.clone(), logged, clock));
        Self {
            database,
            store,
            endpoints,
            runs,
            keys,
            tables,
            executions,
            engine,
            materializer,
            maintenance,
            kept,
            logs,
            run_log,
            run_metrics,
        }
    }
}

/// The tables' maintenance (compaction, layouts) and the table service, which tells it of new readers.
fn table_services(
    config: &Config,
    store: &Arc<DieselStore>,
    engine: &Arc<DataFusionEngine>,
    changes: Arc<Invalidator>,
) -> (Arc<TableMaintenance>, Arc<TableService>) {
    let clock = Arc::clone(&config.clock.0);
    let maintenance = Arc::new(TableMaintenance::new(MaintenanceDeps {
        tables: engine.clone(),
        leases: store.clone(),
        keys: store.clone(),
        announcer: store.clone(),
        endpoints: store.clone(),
        engine: engine.clone(),
        clock: clock.clone(),
        lease: config.lease,
    }));
    let tables = Arc::new(TableService::new(TableDeps {
        tables: engine.clone(),
        endpoints: store.clone(),
        engine: engine.clone(),
        changes,
        announcer: store.clone(),
        materializations: store.clone(),
        keys: store.clone(),
        layouts: maintenance.clone(),
        clock,
        append_in_flight: config.append_in_flight,
    }));
    (maintenance, tables)
}

/// The engine `--engine` names: this process, or a Ballista cluster.
fn engine(embedded: DataFusionEngine, config: &Config) -> Result<DataFusionEngine, StartupError> {
    match config.engine.as_deref() {
        None | Some("embedded") => Ok(embedded),
        #[cfg(feature = "ballista")]
        Some(url) => embedded.on_ballista(url).map_err(StartupError::Engine),
        #[cfg(not(feature = "ballista"))]
        Some(url) => Err(StartupError::Engine(format!(
            "'{url}' needs the Ballista engine, which this binary was built without \
             (build with `cargo build --release -p server --features ballista`)"
        ))),
    }
}

/// A bound, not yet running HTTP server.
pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    executions: Arc<ExecutionTracker>,
    keys: Arc<ApiKeyService>,
    flush_interval: std::time::Duration,
    materializer: Arc<RefreshService>,
    worker: crate::worker::WorkerConfig,
    maintenance: Arc<TableMaintenance>,
    compaction_interval: Option<std::time::Duration>,
    worker_metrics: crate::operations::WorkerMetrics,
    rate_limits: Arc<http_actix::RateLimits>,
    /// The run log this process writes, and how.
    run_log: Option<(ParquetRunLog, crate::config::RunLogConfig)>,
    /// What the background tasks tell the time by.
    clock: Arc<dyn domain::Clock>,
    /// On PostgreSQL: applies the changes other processes announce; stops with the application.
    _changes: Option<ChangeListener>,
}

impl Application {
    /// Opens the database, binds the listener (port 0 picks a free one) and prepares the server.
    ///
    /// # Errors
    /// [`StartupError`] when the database cannot be used or the address cannot be bound.
    pub fn build(config: &Config) -> Result<Self, StartupError> {
        let services = Services::open(config)?;
        if services.database.has_pending_migrations().map_err(StartupError::Database)? {
            return Err(StartupError::PendingMigrations);
        }
        let listener = TcpListener::bind(&config.bind)
            .map_err(|source| StartupError::Bind { address: config.bind.clone(), source })?;
        let port = listener.local_addr()?.port();
        let executions = services.executions.clone();
        let keys = services.keys.clone();
        let materializer = services.materializer.clone();
        let maintenance = services.maintenance.clone();
        let worker_metrics = crate::operations::WorkerMetrics::default();
        let operations = crate::operations::operations(
            &services.database,
            &services.engine,
            &worker_metrics,
            services.run_log.as_ref(),
            &services.run_metrics,
        );
        let run_log = services.run_log.clone().zip(config.run_log);
        let rate_limits = Arc::new(http_actix::RateLimits::new(config.rate_limits));
        let kept = services.kept.clone();
        let changes = services.database.listen_for_changes(move |change| kept.apply(&change));
        let state = AppState {
            client_timeout: config.client_timeout,
            upload_limit: config.upload_limit,
            ..AppState::new(services.endpoints, services.runs, services.keys, services.tables, services.logs)
                .with_operations(operations)
                .with_rate_limits(Arc::clone(&rate_limits))
        };
        let mut server = actix_web::HttpServer::new(move || http_actix::app(state.clone()))
            .on_connect(http_actix::on_connect)
            .disable_signals()
            .client_request_timeout(config.client_timeout)
            .shutdown_timeout(30);
        if config.workers > 0 {
            server = server.workers(config.workers);
        }
        let server = server.listen(listener)?.run();
        tracing::info!(address = %listener_address(&config.bind, port), "listening");
        Ok(Self {
            port,
            server,
            executions,
            keys,
            flush_interval: config.flush_interval,
            materializer,
            worker: config.worker.clone(),
            maintenance,
            compaction_interval: config.compaction_interval,
            worker_metrics,
            rate_limits,
            run_log,
            clock: Arc::clone(&config.clock.0),
            _changes: changes,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves until `shutdown` completes, then stops accepting connections and lets in-flight requests finish.
    ///
    /// # Errors
    /// An I/O error of the server.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let flusher =
            tokio::spawn(flush_periodically(self.executions.clone(), self.keys.clone(), self.flush_interval));
        let shrinker = tokio::spawn(shrink_rate_limits(Arc::clone(&self.rate_limits)));
        let clock = Arc::clone(&self.clock);
        let logger = self
            .run_log
            .clone()
            .map(|(log, config)| tokio::spawn(write_run_log(log, config.flush_interval, clock)));
        let (stop_worker, stop) = tokio::sync::watch::channel(false);
        let worker = (self.worker.parallelism > 0).then(|| {
            tokio::spawn(crate::worker::run(
                self.materializer.clone(),
                self.worker.clone(),
                self.worker_metrics.clone(),
                Arc::clone(&self.clock),
                stop.clone(),
            ))
        });
        let compactor = self.compaction_interval.map(|every| {
            tokio::spawn(crate::worker::maintain_tables(
                self.maintenance.clone(),
                every,
                self.worker_metrics.clone(),
                stop,
            ))
        });
        let handle = self.server.handle();
        let mut server = std::pin::pin!(self.server);
        let result = tokio::select! {
            result = &mut server => result,
            () = shutdown => {
                tracing::info!("shutting down: draining in-flight requests");
                // The server future answers the stop command, so both are driven together.
                let ((), result) = tokio::join!(handle.stop(true), &mut server);
                result
            }
        };
        flusher.abort();
        shrinker.abort();
        if let Some(logger) = logger {
            logger.abort();
        }
        let _ = stop_worker.send(true);
        if let Some(worker) = worker {
            if let Err(err) = worker.await {
                tracing::error!(error = %err, "the refresh worker ended abnormally");
            }
        }
        if let Some(compactor) = compactor {
            if let Err(err) = compactor.await {
                tracing::error!(error = %err, "the compaction loop ended abnormally");
            }
        }
        // Requests have drained: the last execution times they recorded are written now.
        if let Err(err) = self.executions.flush().await {
            tracing::error!(error = %err, "could not write the last execution times at shutdown");
        }
        if let Err(err) = self.keys.flush_usage().await {
            tracing::error!(error = %err, "could not write when keys were last used at shutdown");
        }
        // And the run log records of those requests and of the refreshes that finished.
        if let Some((log, _)) = &self.run_log {
            if let Err(err) = log.flush().await {
                tracing::error!(error = %err, "could not write the run log at shutdown");
            }
        }
        result
    }
}

/// Writes the run log's buffered records every `every`, or as soon as a buffer is half full, and merges and
/// prunes its files every ten seconds: the two go on side by side, so a merge (at the lowest priority, for
/// seconds under load) never holds up a flush.
async fn write_run_log(log: ParquetRunLog, every: std::time::Duration, clock: Arc<dyn domain::Clock>) {
    const MAINTAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
    let flush = async {
        let mut ticks = crate::worker::ticks_of(every);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = log.filling() => ticks.reset(),
            }
            match log.flush().await {
                Ok(0) => {}
                Ok(count) => tracing::debug!(count, "wrote run log records"),
                Err(err) => tracing::warn!(error = %err, "could not write the run log; will retry"),
            }
        }
    };
    let maintain = async {
        let mut ticks = crate::worker::ticks_of(MAINTAIN_EVERY);
        // Not at the start: the first flush comes first.
        ticks.tick().await;
        loop {
            ticks.tick().await;
            if let Err(err) = log.maintain(clock.now()).await {
                tracing::warn!(error = %err, "could not merge or prune the run log; will retry");
            }
        }
    };
    tokio::join!(flush, maintain);
}

/// Writes pending execution times and key uses in batches, never one write per request.
async fn flush_periodically(
    executions: Arc<ExecutionTracker>,
    keys: Arc<ApiKeyService>,
    every: std::time::Duration,
) {
    let mut ticks = crate::worker::ticks_of(every);
    loop {
        ticks.tick().await;
        match executions.flush().await {
            Ok(0) => {}
            Ok(count) => tracing::debug!(count, "wrote last execution times"),
            Err(err) => tracing::warn!(error = %err, "could not write last execution times; will retry"),
        }
        match keys.flush_usage().await {
            Ok(0) => {}
            Ok(count) => tracing::debug!(count, "wrote when keys were last used"),
            Err(err) => tracing::warn!(error = %err, "could not write when keys were last used; will retry"),
        }
    }
}

fn listener_address(bind: &str, port: u16) -> String {
    match bind.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{port}"),
        None => format!("{bind}:{port}"),
    }
}

/// Forgets the rate-limit buckets of callers that went quiet, every minute.
async fn shrink_rate_limits(limits: Arc<http_actix::RateLimits>) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        every.tick().await;
        limits.shrink();
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            // Without a handler there is no interrupt to wait for: only SIGTERM stops the server.
            tracing::warn!(error = %err, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
}
