//! What an operator and an orchestrator reach without a key: liveness (`/healthz`), readiness (`/readyz`) and
//! metrics in the Prometheus text format (`/metrics`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpResponse};
use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde_json::{json, Map, Value};

use domain::Error;

use crate::error::ApiError;
use crate::AppState;

/// Something the service needs to answer requests (the store, the engine's data directory), checked by
/// `/readyz`. Implemented where the adapters are wired.
#[async_trait]
pub trait ReadinessCheck: Send + Sync {
    /// The name in the readiness report.
    fn name(&self) -> &'static str;
    /// `Err` with a short reason safe to show anyone (details belong in the log).
    async fn check(&self) -> Result<(), String>;
}

/// How long one readiness check may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    method: &'static str,
    status: u16,
}

/// 0.1 ms to about 52 s.
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// The registry `/metrics` answers with, and the HTTP adapter's own metrics in it.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Histogram, fn() -> Histogram>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Registry::with_prefix("endpoints"))
    }
}

impl Metrics {
    /// Adds the HTTP metrics to `registry` (which other adapters may already have registered in) and serves it.
    pub fn new(mut registry: Registry) -> Self {
        let requests = Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            request_histogram as fn() -> Histogram,
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP requests by route, method and status, and how long they took",
            requests.clone(),
        );
        Self { registry, requests }
    }

    pub(crate) fn observe_request(
        &self,
        route: &'static str,
        method: &Method,
        status: StatusCode,
        took: Duration,
    ) {
        let labels = RequestLabels { route, method: method_label(method), status: status.as_u16() };
        self.requests.get_or_create(&labels).observe(took.as_secs_f64());
    }

    fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// Liveness: the process answers. Nothing else is checked, so a slow database never gets it restarted.
pub(crate) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Readiness: every dependency answers within its time. 503 names the ones that do not.
pub(crate) async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let results = futures_util::future::join_all(state.operations.checks.iter().map(|check| async move {
        let started = Instant::now();
        let outcome = match tokio::time::timeout(CHECK_TIMEOUT, check.check()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("No answer within {} s.", CHECK_TIMEOUT.as_secs())),
        };
        (check.name(), outcome, started.elapsed())
    }))
    .await;
    let ready = results.iter().all(|(_, outcome, _)| outcome.is_ok());
    let checks: Map<String, Value> = results
        .into_iter()
        .map(|(name, outcome, took)| {
            let millis = (took.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0;
            let report = match outcome {
                Ok(()) => json!({"status": "ok", "took_ms": millis}),
                Err(reason) => {
                    tracing::warn!(check = name, reason = %reason, "not ready");
                    json!({"status": "failed", "reason": reason, "took_ms": millis})
                }
            };
            (name.to_owned(), report)
        })
        .collect();
    let body = json!({"status": if ready { "ready" } else { "unavailable" }, "checks": checks});
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().insert_header(("Retry-After", "5")).json(body)
    }
}

/// The metrics in the Prometheus text format.
pub(crate) async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let text = state.operations.metrics.render().map_err(|err| Error::Internal(Box::new(err)))?;
    Ok(HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(text))
}

/// What the operations routes need: the readiness checks and the metrics.
#[derive(Default)]
pub struct Operations {
    pub checks: Vec<Arc<dyn ReadinessCheck>>,
    pub metrics: Metrics,
}
