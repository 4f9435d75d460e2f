//! JSON views of domain values, exactly as the API documents them.

use actix_web::HttpRequest;
use domain::endpoint::{ColumnType, Endpoint, EndpointVersion};
use domain::{LastExecutions, MaterializationView, Page, ProjectId, RunOutcome, Timestamp};
use serde::Serialize;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;

pub(crate) fn timestamp(at: Timestamp) -> Value {
    at.format(&Rfc3339).map_or(Value::Null, Value::String)
}

fn optional_timestamp(at: Option<Timestamp>) -> Value {
    at.map_or(Value::Null, timestamp)
}

pub(crate) fn endpoint(e: &Endpoint) -> Value {
    json!({
        "id": e.id,
        "name": e.name.as_str(),
        "description": e.description,
        "query": e.query.to_json(),
        "derived_from_insight": e.derived_from_insight,
        "is_active": e.is_active,
        "is_materialized": e.is_materialized,
        "cache_age_seconds": e.cache_age.configured(),
        "sync_frequency": e.sync_frequency.map(|f| f.as_str()),
        "current_version": e.current_version,
        "versions_count": e.versions_count,
        "columns": e.columns,
        "endpoint_path": format!("/api/projects/{}/endpoints/{}/run", e.project_id, e.name),
        "created_at": timestamp(e.created_at),
        "updated_at": timestamp(e.updated_at),
        "last_executed_at": optional_timestamp(e.last_executed_at),
        "materialization": materialization(&MaterializationView::of(e, e.materialization.as_ref())),
    })
}

/// The status object of contract section 7 (row 6, and `materialization` in the endpoint record).
pub(crate) fn materialization(view: &MaterializationView) -> Value {
    json!({
        "name": view.name.as_str(),
        "version": view.version,
        "is_materialized": view.is_materialized,
        "status": view.status.as_str(),
        "sync_frequency": view.sync_frequency.map(|f| f.as_str()),
        "last_materialized_at": optional_timestamp(view.last_materialized_at),
        "next_run_at": optional_timestamp(view.next_run_at),
        "row_count": view.row_count,
        "error": view.error,
        "can_materialize": view.can_materialize,
        "reason": view.reason,
    })
}

pub(crate) fn version(v: &EndpointVersion) -> Value {
    json!({
        "version": v.version,
        "query": v.query.to_json(),
        "description": v.description,
        "columns": v.columns,
        "cache_age_seconds": v.cache_age.configured(),
        "created_at": timestamp(v.created_at),
        "is_current": v.is_current,
    })
}

/// `{"count", "next", "previous", "results"}` with absolute page links that keep the other query parameters.
pub(crate) fn page<T>(req: &HttpRequest, page: &Page<T>, render: impl Fn(&T) -> Value) -> Value {
    let limit = u64::from(page.request.limit);
    let offset = page.request.offset;
    let next = page.has_next().then(|| page_url(req, limit, offset + limit));
    let previous = page.has_previous().then(|| page_url(req, limit, offset.saturating_sub(limit)));
    json!({
        "count": page.total,
        "next": next,
        "previous": previous,
        "results": page.items.iter().map(render).collect::<Vec<_>>(),
    })
}

fn page_url(req: &HttpRequest, limit: u64, offset: u64) -> String {
    let mut params: Vec<(String, String)> =
        serde_urlencoded::from_str::<Vec<(String, String)>>(req.query_string())
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k != "limit" && k != "offset")
            .collect();
    params.push(("limit".into(), limit.to_string()));
    params.push(("offset".into(), offset.to_string()));
    let query = serde_urlencoded::to_string(&params).unwrap_or_default();
    let info = req.connection_info();
    format!("{}://{}{}?{}", info.scheme(), info.host(), req.path(), query)
}

fn millis(duration: std::time::Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1_000.0
}

/// An instant written as RFC 3339, without building a JSON value around it.
struct Rfc3339Time(Timestamp);

impl Serialize for Rfc3339Time {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = self.0.format(&Rfc3339).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(&text)
    }
}

#[derive(Serialize)]
struct Timings {
    query_ms: f64,
    total_ms: f64,
}

/// The run response without its rows, fields in alphabetical order.
#[derive(Serialize)]
struct RunEnvelope<'a> {
    cache_expires_at: Option<Rfc3339Time>,
    client_query_id: Option<&'a str>,
    columns: Vec<&'a str>,
    endpoint_materialized: bool,
    endpoint_materialized_at: Option<Rfc3339Time>,
    endpoint_version: Option<u32>,
    endpoint_version_created_at: Option<Rfc3339Time>,
    execution_id: uuid::Uuid,
    #[serde(rename = "hasMore")]
    has_more: bool,
    is_cached: bool,
    last_refresh: Option<Rfc3339Time>,
    limit: u32,
    name: &'a str,
    offset: u64,
    timings: Timings,
    types: Vec<(&'a str, ColumnType)>,
}

/// The run response. The rows were serialized once by the engine (and are shared by every cache hit), so they
/// are spliced in as they are instead of being parsed and written again; the envelope is written straight from a
/// borrowed struct into a buffer sized for the whole body.
pub(crate) fn run(outcome: &RunOutcome) -> Vec<u8> {
    let run = outcome.run.as_deref();
    let result = run.map(|r| &r.result);
    let envelope = RunEnvelope {
        cache_expires_at: run.and_then(|r| r.expires_at).map(Rfc3339Time),
        client_query_id: outcome.client_query_id.as_deref(),
        columns: result.map_or_else(Vec::new, |r| r.column_names()),
        endpoint_materialized: outcome.endpoint_materialized,
        endpoint_materialized_at: run.and_then(|r| r.materialized_at).map(Rfc3339Time),
        endpoint_version: run.map(|r| r.version),
        endpoint_version_created_at: run.map(|r| Rfc3339Time(r.version_created_at)),
        execution_id: outcome.execution_id,
        has_more: result.is_some_and(|r| r.has_more),
        is_cached: outcome.is_cached,
        last_refresh: run.map(|r| Rfc3339Time(r.computed_at)),
        limit: outcome.limit,
        name: outcome.name.as_str(),
        offset: outcome.offset,
        timings: Timings {
            query_ms: if outcome.is_cached { 0.0 } else { run.map_or(0.0, |r| millis(r.query_time)) },
            total_ms: millis(outcome.total),
        },
        types: result.map_or_else(Vec::new, |r| r.types()),
    };
    let rows = result.map_or("null", |r| r.rows_json.as_str());
    let mut body = Vec::with_capacity(rows.len() + 1024);
    // Serializing plain fields into memory cannot fail; an empty envelope would still be valid JSON below.
    if serde_json::to_writer(&mut body, &envelope).is_err() || body.last() != Some(&b'}') {
        body.clear();
        body.push(b'{');
    } else {
        // Reopen the object and append the rows.
        body.pop();
        body.push(b',');
    }
    body.extend_from_slice(b"\"results\":");
    body.extend_from_slice(rows.as_bytes());
    body.push(b'}');
    body
}

/// Row 12's `{"query_status": {...}}`.
pub(crate) fn last_executions(project: ProjectId, found: &LastExecutions) -> Value {
    let results: Vec<Value> =
        found.results.iter().map(|(name, at)| json!([name.as_str(), timestamp(*at)])).collect();
    json!({
        "query_status": {
            "id": found.id,
            "team_id": project.get(),
            "complete": true,
            "error": false,
            "error_message": null,
            "query_async": false,
            "dashboard_id": null,
            "insight_id": null,
            "labels": null,
            "start_time": timestamp(found.start_time),
            "pickup_time": timestamp(found.start_time),
            "end_time": timestamp(found.end_time),
            "expiration_time": null,
            "task_id": null,
            "results": results,
            "query_progress": {
                "active_cpu_time": u64::try_from(found.elapsed.as_micros()).unwrap_or(u64::MAX),
                "bytes_read": found.bytes_read,
                "estimated_rows_total": found.names_requested,
                "rows_read": found.rows_read,
                "time_elapsed": millis(found.elapsed),
            },
        }
    })
}
