//! JSON views of domain values, exactly as the API documents them.

use actix_web::HttpRequest;
use domain::endpoint::{ColumnType, Endpoint, EndpointVersion};
use domain::ports::CachedRun;
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
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(
            form_urlencoded::parse(req.query_string().as_bytes())
                .filter(|(k, _)| k != "limit" && k != "offset"),
        )
        .append_pair("limit", &limit.to_string())
        .append_pair("offset", &offset.to_string())
        .finish();
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

/// The fields of a run response that are the same for every answer with one computed run.
#[derive(Serialize)]
struct Computed<'a> {
    cache_expires_at: Option<Rfc3339Time>,
    columns: Vec<&'a str>,
    endpoint_materialized: bool,
    endpoint_materialized_at: Option<Rfc3339Time>,
    endpoint_version: Option<u32>,
    endpoint_version_created_at: Option<Rfc3339Time>,
    #[serde(rename = "hasMore")]
    has_more: bool,
    last_refresh: Option<Rfc3339Time>,
    types: Vec<(&'a str, ColumnType)>,
}

impl Computed<'_> {
    fn of(run: Option<&CachedRun>) -> Computed<'_> {
        let result = run.map(|r| &r.result);
        Computed {
            cache_expires_at: run.and_then(|r| r.expires_at).map(Rfc3339Time),
            columns: result.map_or_else(Vec::new, |r| r.column_names()),
            endpoint_materialized: run.is_some_and(|r| r.endpoint_materialized),
            endpoint_materialized_at: run.and_then(|r| r.materialized_at).map(Rfc3339Time),
            endpoint_version: run.map(|r| r.version),
            endpoint_version_created_at: run.map(|r| Rfc3339Time(r.version_created_at)),
            has_more: result.is_some_and(|r| r.has_more),
            last_refresh: run.map(|r| Rfc3339Time(r.computed_at)),
            types: result.map_or_else(Vec::new, |r| r.types()),
        }
    }
}

/// Appends the members of `value`'s JSON object to `body`, without its braces.
fn members(body: &mut Vec<u8>, value: &impl Serialize) {
    let start = body.len();
    // Serializing plain fields into memory cannot fail; if it did, the members are left out and the body stays
    // valid JSON.
    if serde_json::to_writer(&mut *body, value).is_err() || body.len() < start + 2 {
        body.truncate(start);
        return;
    }
    body.remove(start);
    body.pop();
}

/// The run response. The rows were serialized once by the engine and the run's own fields once at its first
/// answer; both are shared by every cache hit and spliced in as they are, so a hit writes only its per-request
/// fields, into a buffer sized for the whole body.
pub(crate) fn run(outcome: &RunOutcome) -> Vec<u8> {
    let run = outcome.run.as_deref();
    let fresh;
    let computed: &[u8] = match run {
        Some(run) => run.rendered.get_or_init(|| {
            let mut fields = Vec::with_capacity(512);
            members(&mut fields, &Computed::of(Some(run)));
            fields
        }),
        None => {
            let mut fields = Vec::with_capacity(512);
            members(&mut fields, &Computed::of(None));
            fresh = fields;
            &fresh
        }
    };
    let rows = run.map_or("null", |r| r.result.rows_json.as_str());
    let mut body = Vec::with_capacity(rows.len() + computed.len() + 256);
    body.push(b'{');
    per_request(&mut body, outcome);
    if !computed.is_empty() {
        body.push(b',');
        body.extend_from_slice(computed);
    }
    body.extend_from_slice(b",\"results\":");
    body.extend_from_slice(rows.as_bytes());
    body.push(b'}');
    body
}

/// The members of a run response that differ from one request to the next, written by hand: through a derived
/// `Serialize` they cost a cached run more than all of its other JSON. Values go through `serde_json`, so their
/// text is what it writes.
fn per_request(body: &mut Vec<u8>, outcome: &RunOutcome) {
    let query_ms = match outcome.run.as_deref() {
        Some(run) if !outcome.is_cached => millis(run.query_time),
        _ => 0.0,
    };
    let mut id = uuid::Uuid::encode_buffer();
    // Writing into a Vec cannot fail.
    body.extend_from_slice(b"\"client_query_id\":");
    let _ = serde_json::to_writer(&mut *body, &outcome.client_query_id);
    body.extend_from_slice(b",\"execution_id\":\"");
    body.extend_from_slice(outcome.execution_id.hyphenated().encode_lower(&mut id).as_bytes());
    body.extend_from_slice(b"\",\"is_cached\":");
    body.extend_from_slice(if outcome.is_cached { b"true" } else { b"false" });
    body.extend_from_slice(b",\"limit\":");
    let _ = serde_json::to_writer(&mut *body, &outcome.limit);
    body.extend_from_slice(b",\"name\":");
    let _ = serde_json::to_writer(&mut *body, outcome.name.as_str());
    body.extend_from_slice(b",\"offset\":");
    let _ = serde_json::to_writer(&mut *body, &outcome.offset);
    body.extend_from_slice(b",\"timings\":{\"query_ms\":");
    let _ = serde_json::to_writer(&mut *body, &query_ms);
    body.extend_from_slice(b",\"total_ms\":");
    let _ = serde_json::to_writer(&mut *body, &millis(outcome.total));
    body.push(b'}');
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use domain::endpoint::{Column, ColumnType};
    use domain::ports::CachedRun;
    use domain::{EndpointName, QueryResult, RunOutcome};
    use serde_json::{json, Value};
    use time::macros::datetime;

    fn outcome(run: Option<Arc<CachedRun>>, is_cached: bool, client_query_id: Option<&str>) -> RunOutcome {
        RunOutcome {
            name: EndpointName::parse("sales").unwrap(),
            endpoint_materialized: false,
            run,
            is_cached,
            execution_id: uuid::Uuid::new_v4(),
            client_query_id: client_query_id.map(str::to_owned),
            limit: 10,
            offset: 20,
            total: Duration::from_micros(1500),
        }
    }

    fn parse(body: &[u8]) -> Value {
        serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
    }

    #[test]
    fn a_cache_hit_reuses_the_run_fields_and_writes_its_own() {
        let at = datetime!(2026-11-22 10:00 UTC);
        let run = Arc::new(CachedRun {
            version: 3,
            version_created_at: at,
            result: QueryResult {
                columns: vec![Column { name: "n\"x".into(), column_type: ColumnType::Integer }],
                rows_json: r#"[{"n\"x":1}]"#.into(),
                row_count: 1,
                has_more: true,
            },
            computed_at: at,
            expires_at: Some(at + Duration::from_secs(60)),
            query_time: Duration::from_millis(7),
            endpoint_materialized: false,
            materialized_at: None,
            variables: json!({}),
            rendered: std::sync::OnceLock::new(),
        });
        let first = parse(&super::run(&outcome(Some(Arc::clone(&run)), false, None)));
        assert!(run.rendered.get().is_some(), "the first answer keeps the run's fields");
        let answer = outcome(Some(Arc::clone(&run)), true, Some("q-\"1"));
        let hit = parse(&super::run(&answer));
        assert_eq!(
            hit,
            json!({
                "client_query_id": "q-\"1",
                "execution_id": answer.execution_id.hyphenated().to_string(),
                "is_cached": true,
                "limit": 10,
                "name": "sales",
                "offset": 20,
                "timings": {"query_ms": 0.0, "total_ms": 1.5},
                "cache_expires_at": "2026-11-22T10:01:00Z",
                "columns": ["n\"x"],
                "endpoint_materialized": false,
                "endpoint_materialized_at": null,
                "endpoint_version": 3,
                "endpoint_version_created_at": "2026-11-22T10:00:00Z",
                "hasMore": true,
                "last_refresh": "2026-11-22T10:00:00Z",
                "types": [["n\"x", "integer"]],
                "results": [{"n\"x": 1}],
            })
        );
        assert_eq!(
            (
                first["is_cached"].clone(),
                first["timings"]["query_ms"].clone(),
                first["client_query_id"].clone()
            ),
            (json!(false), json!(7.0), Value::Null)
        );
        assert_ne!(first["execution_id"], hit["execution_id"]);
        for field in ["columns", "types", "results", "cache_expires_at", "last_refresh"] {
            assert_eq!(first[field], hit[field], "{field}");
        }
    }

    #[test]
    fn nothing_cached_is_answered_with_empty_run_fields() {
        let body = parse(&super::run(&outcome(None, false, None)));
        assert_eq!(body["results"], Value::Null);
        assert_eq!((body["columns"].clone(), body["endpoint_version"].clone()), (json!([]), Value::Null));
        assert_eq!(body["name"], "sales");
    }
}
