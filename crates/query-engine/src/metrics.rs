//! What the engine reports to `/metrics`: how long live queries take, how they end, and how many run now.
//! The metrics always exist and cost an atomic update or two per query; [`EngineMetrics::register`] exposes
//! them in a registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use domain::EngineError;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

/// Where a live query's plan came from: `kept` from an earlier run of its SQL, or `new`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanSource {
    plan: &'static str,
}

/// 1 ms to about 65 s: the span between a small table and the longest query timeout.
fn query_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// How an engine call ended, as a label.
fn outcome<T>(result: &Result<T, EngineError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(EngineError::InvalidQuery(_)) => "invalid",
        Err(EngineError::Timeout(_)) => "timeout",
        Err(EngineError::MemoryLimit(_)) => "memory_limit",
        Err(EngineError::ResultTooLarge { .. }) => "result_too_large",
        Err(EngineError::Busy { .. }) => "busy",
        Err(EngineError::NoSuchVersion(_)) => "no_such_version",
        Err(EngineError::Unavailable(_) | EngineError::Internal(_)) => "error",
    }
}

/// The engine's metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    durations: Family<Outcome, Histogram, fn() -> Histogram>,
    running: Gauge,
    plans: Family<PlanSource, Counter>,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            durations: Family::new_with_constructor(query_histogram),
            running: Gauge::default(),
            plans: Family::default(),
        }
    }
}

impl EngineMetrics {
    /// Exposes the metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "live_query_duration_seconds",
            "Live queries of runs (not refreshes), by how they ended",
            self.durations.clone(),
        );
        registry.register("live_queries_running", "Live queries running now", self.running.clone());
        registry.register(
            "live_query_plans",
            "Plans of queries (live runs, exports, refreshes, folds, and reads of stored results held in memory), kept from an earlier one or new",
            self.plans.clone(),
        );
    }

    pub(crate) fn planned(&self, kept: bool) {
        self.plans.get_or_create(&PlanSource { plan: if kept { "kept" } else { "new" } }).inc();
    }

    /// How many live queries had a kept plan, and how many a new one.
    #[cfg(test)]
    pub(crate) fn plans(&self) -> (u64, u64) {
        let count = |plan| self.plans.get_or_create(&PlanSource { plan }).get();
        (count("kept"), count("new"))
    }

    /// Counts a query as running until the guard is dropped.
    pub(crate) fn running(&self) -> RunningGuard {
        self.running.inc();
        RunningGuard(self.running.clone())
    }

    pub(crate) fn finished<T>(&self, result: &Result<T, EngineError>, took: std::time::Duration) {
        self.durations.get_or_create(&Outcome { outcome: outcome(result) }).observe(took.as_secs_f64());
    }
}

/// Decrements the running gauge when the query ends, however it ends (a cancelled run included).
pub(crate) struct RunningGuard(Gauge);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
