//! Runs in `/metrics`, counted from their log records: each record of a run that the run service files (every
//! transport's, refusals and cancellations included) passes through [`MeteredRunLog`] on its way to the run log,
//! which counts it by where its answer came from and per endpoint. So the metrics count the runs the log holds,
//! and no transport counts runs of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use domain::{
    EngineError, LogFilter, LogKind, LogRecord, LogSource, ProjectId, RunLog, UsageBucket, UsageQuery,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A run log that counts each run's record in the run metrics before passing it on.
pub struct MeteredRunLog {
    log: Arc<dyn RunLog>,
    metrics: Arc<RunMetrics>,
}

impl MeteredRunLog {
    pub fn new(log: Arc<dyn RunLog>, metrics: Arc<RunMetrics>) -> Self {
        Self { log, metrics }
    }
}

#[async_trait]
impl RunLog for MeteredRunLog {
    fn record(&self, record: LogRecord) {
        if record.kind == LogKind::Run {
            self.metrics.observe(&record);
        }
        self.log.record(record);
    }

    async fn records(
        &self,
        project: ProjectId,
        endpoint: &str,
        filter: &LogFilter,
    ) -> Result<Vec<LogRecord>, EngineError> {
        self.log.records(project, endpoint, filter).await
    }

    async fn usage(
        &self,
        project: ProjectId,
        endpoint: &str,
        query: &UsageQuery,
    ) -> Result<Vec<UsageBucket>, EngineError> {
        self.log.usage(project, endpoint, query).await
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabels {
    source: &'static str,
}

/// Runs by where their answers came from, and per endpoint.
pub struct RunMetrics {
    answers_by_source: Family<AnswerLabels, Counter>,
    /// Answers by source (cache, live, materialized, none), made once so counting one is a single atomic add.
    answers: [Counter; 4],
    endpoints: EndpointMetrics,
}

impl std::fmt::Debug for RunMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunMetrics").finish_non_exhaustive()
    }
}

impl Default for RunMetrics {
    fn default() -> Self {
        Self::with_endpoints(EndpointMetrics::default())
    }
}

impl RunMetrics {
    fn with_endpoints(endpoints: EndpointMetrics) -> Self {
        let answers_by_source = Family::<AnswerLabels, Counter>::default();
        let answers = ["cache", "live", "materialized", "none"]
            .map(|source| answers_by_source.get_or_create(&AnswerLabels { source }).clone());
        Self { answers_by_source, answers, endpoints }
    }

    /// Exposes the metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "run_answers",
            "Run answers by where they came from: the cache (a hit), a live query or a stored result (misses), \
             or nothing (force_cache with nothing cached)",
            self.answers_by_source.clone(),
        );
        self.endpoints.register(registry);
    }

    /// Counts the run `record` stands for: its answer by source when it answered, and its endpoint's series.
    fn observe(&self, record: &LogRecord) {
        if !record.is_error() {
            let counter = match record.source {
                Some(LogSource::Cache) => &self.answers[0],
                Some(LogSource::Live) => &self.answers[1],
                Some(LogSource::Materialized) => &self.answers[2],
                None => &self.answers[3],
            };
            counter.inc();
        }
        self.endpoints.observe(record.project, &record.endpoint, record.status, record.duration);
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    project: String,
    endpoint: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    project: String,
    endpoint: String,
    outcome: &'static str,
}

/// Runs and their latency per endpoint in `/metrics`, for at most [`EndpointMetrics::DEFAULT_CAP`] endpoints
/// (or the cap given), and at most [`EndpointMetrics::DEFAULT_PER_PROJECT`] of one project: a project's runs of
/// endpoints past its share are counted under `endpoint="_other"` of that project, and runs past the whole cap
/// under `project="_other", endpoint="_other"`. So a project creating endpoints can neither make the metrics grow
/// without bound nor take the series of other projects' endpoints.
struct EndpointMetrics {
    cap: usize,
    per_project: usize,
    /// Each counted endpoint's series, found without building its labels again.
    known: Mutex<Known>,
    other: Series,
    runs: Family<OutcomeLabels, Counter>,
    latency: Family<EndpointLabels, Histogram, fn() -> Histogram>,
}

#[derive(Default)]
struct Known {
    endpoints: HashMap<ProjectId, HashMap<Box<str>, Series>>,
    /// Each project's series of its runs past its share.
    others: HashMap<ProjectId, Series>,
    /// Every series made, `others` included.
    count: usize,
}

/// One endpoint's series (shared with the families that encode them).
#[derive(Clone)]
struct Series {
    latency: Histogram,
    ok: Counter,
    error: Counter,
}

impl std::fmt::Debug for EndpointMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointMetrics").field("cap", &self.cap).finish_non_exhaustive()
    }
}

/// 0.1 ms to about 13 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

const OTHER: &str = "_other";

impl EndpointMetrics {
    const DEFAULT_CAP: usize = 1000;

    /// The endpoints of one project with series of their own.
    const DEFAULT_PER_PROJECT: usize = 50;

    fn new(cap: usize) -> Self {
        Self::with_shares(cap, Self::DEFAULT_PER_PROJECT)
    }

    /// At most `cap` series in all, `per_project` endpoints' of one project.
    fn with_shares(cap: usize, per_project: usize) -> Self {
        let runs = Family::default();
        let latency = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let other = series(&runs, &latency, OTHER.into(), OTHER.into());
        Self { cap, per_project, known: Mutex::default(), other, runs, latency }
    }

    /// Exposes the metrics in `registry`.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "endpoint_runs",
            "Runs per endpoint (project and endpoint labels, capped; past the cap under _other) by outcome: ok or error",
            self.runs.clone(),
        );
        registry.register(
            "endpoint_run_duration_seconds",
            "How long runs took per endpoint (capped as endpoint_runs is)",
            self.latency.clone(),
        );
    }

    fn observe(&self, project: ProjectId, endpoint: &str, status: u16, took: Duration) {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = &mut *known;
        let named = known.endpoints.get(&project).map_or(0, HashMap::len);
        let found = known.endpoints.get(&project).is_some_and(|names| names.contains_key(endpoint));
        let series = if found || (named < self.per_project && known.count < self.cap) {
            if !found {
                known.count += 1;
            }
            let names = known.endpoints.entry(project).or_default();
            names.entry(endpoint.into()).or_insert_with(|| {
                series(&self.runs, &self.latency, project.to_string(), endpoint.to_owned())
            })
        } else if known.others.contains_key(&project) || known.count < self.cap {
            if !known.others.contains_key(&project) {
                known.count += 1;
            }
            known
                .others
                .entry(project)
                .or_insert_with(|| series(&self.runs, &self.latency, project.to_string(), OTHER.into()))
        } else {
            &self.other
        };
        series.latency.observe(took.as_secs_f64());
        if domain::is_error_status(status) { &series.error } else { &series.ok }.inc();
    }
}

/// The series of one endpoint, made in the families.
fn series(
    runs: &Family<OutcomeLabels, Counter>,
    latency: &Family<EndpointLabels, Histogram, fn() -> Histogram>,
    project: String,
    endpoint: String,
) -> Series {
    let outcome = |outcome| OutcomeLabels { project: project.clone(), endpoint: endpoint.clone(), outcome };
    // One statement each: a family's guard lives to the end of its statement, and the next may need to write.
    let ok = runs.get_or_create(&outcome("ok")).clone();
    let error = runs.get_or_create(&outcome("error")).clone();
    let latency = latency.get_or_create(&EndpointLabels { project, endpoint }).clone();
    Series { latency, ok, error }
}

impl Default for EndpointMetrics {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::testing::KeptRunLog;

    fn record(kind: LogKind, status: u16, source: Option<LogSource>) -> LogRecord {
        LogRecord {
            id: uuid::Uuid::nil(),
            at: domain::testing::T0,
            project: ProjectId::new(1).unwrap(),
            endpoint: "kpi".into(),
            version: Some(1),
            kind,
            status,
            code: None,
            duration: Duration::from_millis(3),
            rows: None,
            bytes_read: None,
            source,
            credential: None,
            transport: None,
            request_id: None,
            runs: 1,
        }
    }

    #[test]
    fn each_runs_record_is_counted_on_its_way_to_the_log_and_refreshes_are_not() {
        let metrics = Arc::new(RunMetrics::default());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let kept = Arc::new(KeptRunLog::default());
        let log = MeteredRunLog::new(kept.clone(), Arc::clone(&metrics));
        log.record(record(LogKind::Run, 200, Some(LogSource::Cache)));
        log.record(record(LogKind::Run, 200, Some(LogSource::Live)));
        log.record(record(LogKind::Run, 200, None));
        log.record(record(LogKind::Run, 429, None));
        log.record(record(LogKind::Refresh, 200, None));
        assert_eq!(kept.records().len(), 5, "every record reaches the log");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"run_answers_total{source="cache"} 1"#,
            r#"run_answers_total{source="live"} 1"#,
            r#"run_answers_total{source="materialized"} 0"#,
            // A force_cache run with nothing stored answered nothing; a refused run and a refresh are no answer.
            r#"run_answers_total{source="none"} 1"#,
            r#"endpoint_runs_total{project="1",endpoint="kpi",outcome="ok"} 3"#,
            r#"endpoint_runs_total{project="1",endpoint="kpi",outcome="error"} 1"#,
            r#"endpoint_run_duration_seconds_count{project="1",endpoint="kpi"} 4"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in:\n{text}");
        }
    }

    /// Counts of `endpoint_runs_total` in `registry`'s text, by a part of their labels.
    fn runs_in(registry: &Registry) -> impl Fn(&str) -> Option<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        move |labels: &str| {
            text.lines()
                .find(|line| line.starts_with("endpoint_runs_total{") && line.contains(labels))
                .and_then(|line| line.rsplit(' ').next())
                .map(str::to_owned)
        }
    }

    #[test]
    fn a_project_past_its_share_is_counted_under_its_own_other_and_leaves_the_rest_to_others() {
        let metrics = EndpointMetrics::with_shares(6, 2);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let (greedy, quiet) = (ProjectId::new(1).unwrap(), ProjectId::new(2).unwrap());
        for n in 0..500 {
            metrics.observe(greedy, &format!("e{n}"), 200, Duration::from_millis(1));
        }
        metrics.observe(quiet, "mine", 200, Duration::from_millis(1));
        let runs = runs_in(&registry);
        assert_eq!(runs(r#"project="1",endpoint="e0",outcome="ok""#).as_deref(), Some("1"));
        assert_eq!(runs(r#"project="1",endpoint="_other",outcome="ok""#).as_deref(), Some("498"));
        assert_eq!(runs(r#"project="2",endpoint="mine",outcome="ok""#).as_deref(), Some("1"), "not starved");
        assert_eq!(
            runs(r#"project="_other",endpoint="_other",outcome="ok""#).as_deref(),
            Some("0"),
            "under the cap"
        );
    }

    #[test]
    fn endpoints_past_the_cap_are_counted_together() {
        let metrics = EndpointMetrics::with_shares(2, 2);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let project = ProjectId::new(3).unwrap();
        for name in ["a", "b", "a", "c", "d"] {
            metrics.observe(project, name, 200, Duration::from_millis(2));
        }
        metrics.observe(project, "b", 500, Duration::from_millis(2));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let runs = |labels: &str| {
            text.lines()
                .find(|line| line.starts_with("endpoint_runs_total{") && line.contains(labels))
                .and_then(|line| line.rsplit(' ').next())
                .map(str::to_owned)
        };
        assert_eq!(runs(r#"project="3",endpoint="a",outcome="ok""#).as_deref(), Some("2"), "{text}");
        assert_eq!(runs(r#"project="3",endpoint="b",outcome="error""#).as_deref(), Some("1"));
        assert_eq!(runs(r#"project="_other",endpoint="_other",outcome="ok""#).as_deref(), Some("2"));
        assert!(!text.contains(r#"endpoint="c""#) && !text.contains(r#"endpoint="d""#));
        // An endpoint's error series exists from its first run (0 until it fails).
        assert_eq!(runs(r#"project="3",endpoint="a",outcome="error""#).as_deref(), Some("0"));
    }
}
