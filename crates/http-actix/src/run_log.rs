//! Each run answered here is logged (contract section 19): over REST by the request middleware, once the answer
//! is known, from the caller authentication left and the run the handler left in the request's extensions; over
//! MCP by the tool call. The domain's [`LogService::answered`] makes the record from them; this adapter only
//! says who asked, what it answered and how long it took, and counts the run in the endpoint's metrics.
//!
//! A run is logged once its caller is known to be of the project it addresses: a request that is not
//! authenticated, or whose credential belongs to another project, is in no project's log (anyone could write
//! there otherwise).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use domain::{Answered, EndpointName, LogService, ProjectId, Ran, Transport};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The caller of a run route, once it is known to be of the project the path names.
#[derive(Debug, Clone)]
pub(crate) struct RunCaller {
    pub(crate) project: ProjectId,
    pub(crate) credential: Arc<str>,
}

/// The error code an error answer carried, left in the response's extensions for the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnsweredCode(pub(crate) &'static str);

/// How a transport answered a run: what its record needs besides the caller.
pub(crate) struct Answer {
    pub(crate) transport: Transport,
    pub(crate) status: u16,
    pub(crate) code: Option<&'static str>,
    pub(crate) took: Duration,
    pub(crate) ran: Option<Ran>,
    pub(crate) request_id: Option<String>,
}

impl Answer {
    /// Logs the run of `endpoint` by `caller`, and counts it in the endpoint's metrics.
    pub(crate) fn log(
        self,
        caller: &RunCaller,
        endpoint: &str,
        logs: &LogService,
        metrics: &EndpointMetrics,
    ) {
        metrics.observe(caller.project, endpoint, self.status, self.took);
        logs.answered(Answered {
            project: caller.project,
            credential: Arc::clone(&caller.credential),
            endpoint: endpoint.to_owned(),
            transport: self.transport,
            status: self.status,
            code: self.code,
            took: self.took,
            ran: self.ran,
            request_id: self.request_id,
        });
    }
}

/// An endpoint name as a path carries it, when it can be one (others name no endpoint and are not logged).
pub(crate) fn endpoint_of(raw: &str) -> Option<&str> {
    EndpointName::is_valid(raw).then_some(raw)
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
pub struct EndpointMetrics {
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
    pub const DEFAULT_CAP: usize = 1000;

    /// The endpoints of one project with series of their own.
    pub const DEFAULT_PER_PROJECT: usize = 50;

    pub fn new(cap: usize) -> Self {
        Self::with_shares(cap, Self::DEFAULT_PER_PROJECT)
    }

    /// At most `cap` series in all, `per_project` endpoints' of one project.
    pub fn with_shares(cap: usize, per_project: usize) -> Self {
        let runs = Family::default();
        let latency = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let other = series(&runs, &latency, OTHER.into(), OTHER.into());
        Self { cap, per_project, known: Mutex::default(), other, runs, latency }
    }

    /// Exposes the metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
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
