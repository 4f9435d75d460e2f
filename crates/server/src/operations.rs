//! The operations side of `serve`: readiness checks over the wired adapters, and the metrics that are neither
//! HTTP's nor the engine's (the materialization worker's, the connection pool's).

use std::sync::Arc;

use async_trait::async_trait;
use domain::RefreshOutcome;
use http_actix::{Metrics, Operations, ReadinessCheck};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use query_engine::DataFusionEngine;
use store_diesel::Database;

/// The store answers a query.
struct StoreCheck(Database);

#[async_trait]
impl ReadinessCheck for StoreCheck {
    fn name(&self) -> &'static str {
        "store"
    }

    async fn check(&self) -> Result<(), String> {
        self.0.ping().await.map_err(|err| {
            tracing::warn!(error = %err, "readiness: the database does not answer");
            "The database does not answer.".to_owned()
        })
    }
}

/// The engine runs a query and its data directory is there.
struct EngineCheck(Arc<DataFusionEngine>);

#[async_trait]
impl ReadinessCheck for EngineCheck {
    fn name(&self) -> &'static str {
        "engine"
    }

    async fn check(&self) -> Result<(), String> {
        self.0.ping().await.map_err(|err| {
            tracing::warn!(error = %err, "readiness: the query engine does not answer");
            "The query engine or its data directory is not usable.".to_owned()
        })
    }
}

/// The connection pool's state, read at each scrape.
#[derive(Debug)]
struct PoolCollector(Database);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    state: &'static str,
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pool = self.0.pool_state();
        let mut connections = encoder.encode_descriptor(
            "db_pool_connections",
            "Database connections by state (in use against the maximum is the pool's saturation)",
            None,
            MetricType::Gauge,
        )?;
        for (state, value) in [("in_use", pool.open.saturating_sub(pool.idle)), ("idle", pool.idle)] {
            ConstGauge::new(i64::from(value)).encode(connections.encode_family(&PoolLabels { state })?)?;
        }
        let max = encoder.encode_descriptor(
            "db_pool_max_connections",
            "The most connections the pool opens",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(pool.max)).encode(max)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The background work's metrics: materialization refreshes and table compactions.
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    refreshes: Family<OutcomeLabels, Counter>,
    refresh_seconds: Family<OutcomeLabels, Histogram>,
    lag: Histogram,
    compactions: Family<OutcomeLabels, Counter>,
    files_merged: Counter,
    compaction_seconds: Histogram,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        Self {
            refreshes: Family::default(),
            // 1 ms to about 9 hours.
            refresh_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 25))
            }),
            // 0.1 s to about 1.8 hours.
            lag: Histogram::new(exponential_buckets(0.1, 2.0, 17)),
            compactions: Family::default(),
            files_merged: Counter::default(),
            // 10 ms to about 11 minutes.
            compaction_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 17)),
        }
    }
}

impl WorkerMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "materialization_refreshes",
            "Materialization refreshes by how they ended: completed (computed in full), folded (the rows \
             appended since folded into the result before), failed (the query), lost (the endpoint \
             changed or the lease passed on while computing), released (the server stopped, or a lease renewal \
             found the claim gone) or error (the store)",
            self.refreshes.clone(),
        );
        registry.register(
            "materialization_refresh_seconds",
            "How long refreshes took, by how they ended: completed (computed in full) or folded (the rows \
             appended since folded into the result before), failed, lost",
            self.refresh_seconds.clone(),
        );
        registry.register(
            "materialization_lag_seconds",
            "How long a refresh waited between falling due and being claimed",
            self.lag.clone(),
        );
        registry.register(
            "table_compactions",
            "Compactions of tables this process appended to, by how they ended: compacted, leased (another \
             process was compacting the table) or failed; tables with too few small files are not counted",
            self.compactions.clone(),
        );
        registry.register(
            "table_compaction_files_merged",
            "Small table files merged into full ones by compactions",
            self.files_merged.clone(),
        );
        registry.register(
            "table_compaction_seconds",
            "How long each compaction that merged files took",
            self.compaction_seconds.clone(),
        );
    }

    pub(crate) fn compacted(&self, outcome: &domain::CompactionOutcome, took: std::time::Duration) {
        let outcome = match outcome {
            domain::CompactionOutcome::Compacted(done) => {
                self.files_merged.inc_by(done.files_merged);
                self.compaction_seconds.observe(took.as_secs_f64());
                "compacted"
            }
            domain::CompactionOutcome::Leased => "leased",
            domain::CompactionOutcome::Failed(_) => "failed",
            domain::CompactionOutcome::NothingToDo => return,
        };
        self.compactions.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub(crate) fn claimed(&self, waited: std::time::Duration) {
        self.lag.observe(waited.as_secs_f64());
    }

    pub(crate) fn ended(&self, outcome: &Result<RefreshOutcome, domain::Error>, took: std::time::Duration) {
        let outcome = match outcome {
            Ok(RefreshOutcome::Completed { .. }) => "completed",
            Ok(RefreshOutcome::Folded { .. }) => "folded",
            Ok(RefreshOutcome::Failed { .. }) => "failed",
            Ok(RefreshOutcome::Lost) => "lost",
            Err(_) => "error",
        };
        self.refreshes.get_or_create(&OutcomeLabels { outcome }).inc();
        self.refresh_seconds.get_or_create(&OutcomeLabels { outcome }).observe(took.as_secs_f64());
    }

    pub(crate) fn released(&self) {
        self.refreshes.get_or_create(&OutcomeLabels { outcome: "released" }).inc();
    }
}

/// Readiness checks and one registry holding every adapter's metrics.
pub fn operations(
    database: &Database,
    engine: &Arc<DataFusionEngine>,
    worker: &WorkerMetrics,
    run_log: Option<&query_engine::ParquetRunLog>,
    runs: &http_actix::RunMetrics,
) -> Operations {
    let mut registry = Registry::with_prefix("endpoints");
    engine.register_metrics(&mut registry);
    runs.register(&mut registry);
    if let Some(log) = run_log {
        log.register(&mut registry);
    }
    worker.register(&mut registry);
    registry.register_collector(Box::new(PoolCollector(database.clone())));
    Operations {
        checks: vec![Arc::new(StoreCheck(database.clone())), Arc::new(EngineCheck(Arc::clone(engine)))],
        metrics: Metrics::new(registry),
    }
}
