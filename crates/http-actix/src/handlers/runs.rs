//! Running an endpoint (GET and POST), and the last execution times of several.

use actix_web::body::SizedStream;
use actix_web::http::header::{
    self, Accept, ContentDisposition, DispositionParam, DispositionType, HeaderValue, IfNoneMatch,
};
use actix_web::http::StatusCode;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use bytes::Bytes;
use domain::{
    Exported, LastExecutionsRequest, Principal, ProjectId, ResultFormat, RunOutcome, RunRequest, Transport,
};
use time::format_description::well_known::Rfc3339;

use super::{run_request, EndpointPath};
use crate::api::requests::{ExportBody, ExportFormat, JsonFormat, Names, RunBody};
use crate::api::{LastExecutionTimes, RunAnswer};
use crate::asking::Asking;
use crate::disconnect::unless_disconnected;
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, AuthorizedJson, EndpointRead, EndpointRun};
use crate::AppState;

/// A POST run's one query parameter, `version` (its body carries the rest).
fn url_version(req: &HttpRequest) -> Result<Option<std::borrow::Cow<'_, str>>, ApiError> {
    if req.query_string().is_empty() {
        return Ok(None);
    }
    crate::query_params::refuse_unknown(req.query_string(), &["version"])?;
    Ok(params(req).find(|(k, _)| k == "version").map(|(_, v)| v))
}

/// The query string's pairs, borrowed from the request where nothing needs decoding.
fn params(req: &HttpRequest) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(req.query_string().as_bytes())
}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/run", operation_id = "run_endpoint_get",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query), ("limit" = Option<i64>, Query),
           ("offset" = Option<i64>, Query), ("refresh" = Option<String>, Query), ("client_query_id" = Option<String>, Query),
           ("format" = Option<JsonFormat>, Query),
           ("max_staleness_seconds" = Option<i64>, Query, description = "A cached or stored answer whose data_as_of is older than this many seconds is not served"),
           ("as_of" = Option<String>, Query, description = "Read every table as it was at this RFC 3339 time"),
           ("cursor" = Option<String>, Query, description = "The `next` of an earlier answer: the page after it, of the same snapshot"),
           ("variables" = Option<String>, Query, description = "A JSON object of variables; or one `variables.NAME=value` parameter each")),
    responses((status = 200, description = "The run as JSON. The same run in another format is the export operation \
               (`.../run/{format}`); `format` or `Accept` here also switch it, for clients that are not generated", body = RunAnswer),
              (status = 304, description = "If-None-Match holds the answer's ETag"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 406, body = Error), (status = 410, body = Error),
              (status = 429, body = Error)))]
pub(crate) async fn run_get(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<EndpointRun>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let asked = (|| {
        let accepted = accepted(&req);
        // A client that accepts no format a run is written in may still name one with `format` (else 406).
        let request = run_request::from_query(params(&req), accepted.unwrap_or(ResultFormat::Json))?;
        // Parsed a second time only when the text could name it (`format` spelled out or percent-encoded).
        let query = req.query_string();
        let explicit =
            (query.contains("format") || query.contains('%')) && params(&req).any(|(key, _)| key == "format");
        writable(request, accepted.is_some() || explicit)
    })();
    respond(&req, &state, &caller.caller, caller.project, &path, asked).await
}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/{name}/run", operation_id = "run_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query)), request_body = RunBody,
    responses((status = 200, description = "The run as JSON. The same run in another format is the export operation \
               (`.../run/{format}`); `format` or `Accept` here also switch it, for clients that are not generated", body = RunAnswer),
              (status = 304, description = "If-None-Match holds the answer's ETag"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 406, body = Error), (status = 410, body = Error),
              (status = 429, body = Error)))]
pub(crate) async fn run_post(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointRun>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let asked = (|| {
        let version = url_version(&req)?;
        let accepted = accepted(&req);
        let request =
            run_request::from_body(&caller.body, version.as_deref(), accepted.unwrap_or(ResultFormat::Json))?;
        let explicit = caller.body.get("format").is_some_and(|f| !f.is_null());
        writable(request, accepted.is_some() || explicit)
    })();
    respond(&req, &state, &caller.caller, caller.project, &path, asked).await
}

/// The format an export's path names (the route admits only these).
fn export_format(req: &HttpRequest) -> Result<ResultFormat, ApiError> {
    let format = ResultFormat::parse(req.match_info().query("format"))?;
    debug_assert!(format != ResultFormat::Json, "the route admits no json");
    Ok(format)
}

/// An export names its format in the path; a `format` given besides must be the same.
fn one_format(request: &RunRequest, format: ResultFormat) -> Result<(), ApiError> {
    if request.format == format {
        return Ok(());
    }
    let detail = format!("format is {} by the path; leave it out, or run .../run for JSON.", format.as_str());
    Err(domain::Invalid::field("format", detail).into())
}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/run/{format}", operation_id = "export_endpoint_get",
    params(("project_id" = String, Path), ("name" = String, Path),
           ("format" = ExportFormat, Path),
           ("version" = Option<i64>, Query), ("limit" = Option<i64>, Query),
           ("offset" = Option<i64>, Query), ("refresh" = Option<String>, Query), ("client_query_id" = Option<String>, Query),
           ("max_staleness_seconds" = Option<i64>, Query, description = "A cached or stored answer whose data_as_of is older than this many seconds is not served"),
           ("as_of" = Option<String>, Query, description = "Read every table as it was at this RFC 3339 time"),
           ("cursor" = Option<String>, Query, description = "The `next` of an earlier answer: the page after it, of the same snapshot"),
           ("variables" = Option<String>, Query, description = "A JSON object of variables; or one `variables.NAME=value` parameter each")),
    responses((status = 200, description = "The page written in the format, its run's fields in X- headers (streamed); \
               a refresh=force_cache run with no fresh stored result is a page of no rows",
               content((String = "text/csv"), (String = "application/x-ndjson"),
                       ("application/vnd.apache.parquet"), ("application/vnd.apache.arrow.stream"))),
              (status = 304, description = "If-None-Match holds the answer's ETag"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 429, body = Error)))]
pub(crate) async fn export_get(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<EndpointRun>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let asked = (|| {
        let format = export_format(&req)?;
        let request = run_request::from_query(params(&req), format)?;
        one_format(&request, format)?;
        Ok(request)
    })();
    respond(&req, &state, &caller.caller, caller.project, &path, asked).await
}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/{name}/run/{format}", operation_id = "export_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path),
           ("format" = ExportFormat, Path), ("version" = Option<i64>, Query)),
    request_body = ExportBody,
    responses((status = 200, description = "The page written in the format, its run's fields in X- headers (streamed); \
               a refresh=force_cache run with no fresh stored result is a page of no rows",
               content((String = "text/csv"), (String = "application/x-ndjson"),
                       ("application/vnd.apache.parquet"), ("application/vnd.apache.arrow.stream"))),
              (status = 304, description = "If-None-Match holds the answer's ETag"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 429, body = Error)))]
pub(crate) async fn export_post(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointRun>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let asked = (|| {
        let format = export_format(&req)?;
        let version = url_version(&req)?;
        let request = run_request::from_body(&caller.body, version.as_deref(), format)?;
        one_format(&request, format)?;
        Ok(request)
    })();
    respond(&req, &state, &caller.caller, caller.project, &path, asked).await
}

/// The format `Accept` asks for: the first of its preferences a run is written in, JSON when it names none (or
/// anything). `None` when it names only formats the service does not write.
fn accepted(req: &HttpRequest) -> Option<ResultFormat> {
    let Some(accept) = req.get_header::<Accept>() else { return Some(ResultFormat::Json) };
    if accept.0.is_empty() {
        return Some(ResultFormat::Json);
    }
    accept.ranked().iter().find_map(|mime| match (mime.type_().as_str(), mime.subtype().as_str()) {
        ("*", "*") | ("application", "*") => Some(ResultFormat::Json),
        ("text", "*") => Some(ResultFormat::Csv),
        (kind, sub) => ResultFormat::ALL.into_iter().find(|format| {
            let named = |media: &str| media.split_once('/') == Some((kind, sub));
            named(format.media_type()) || format.aliases().iter().copied().any(named)
        }),
    })
}

/// The media type a format is written as: text says its encoding.
fn media_type(format: ResultFormat) -> &'static str {
    match format {
        ResultFormat::Csv => "text/csv; charset=utf-8",
        other => other.media_type(),
    }
}

/// The request, unless the client accepts no format a run is written in and names none.
fn writable(request: RunRequest, writable: bool) -> Result<RunRequest, ApiError> {
    if writable {
        Ok(request)
    } else {
        Err(ApiError::NotAcceptable)
    }
}

/// Runs the path's endpoint as `asked`, in JSON or the format it names, cancelling the run if the client
/// disconnects meanwhile. The run service records the run; a request refused here, before it is asked, is told
/// to it.
async fn respond(
    req: &HttpRequest,
    state: &AppState,
    caller: &Principal,
    project: ProjectId,
    path: &EndpointPath,
    asked: Result<RunRequest, ApiError>,
) -> Result<HttpResponse, ApiError> {
    let asking = Asking::current();
    let (name, request) = match path.endpoint().map_err(ApiError::from).and_then(|name| Ok((name, asked?))) {
        Ok(asked) => asked,
        Err(err) => {
            asking.refused(&state.runs, caller, Transport::Rest, project, &path.name, &err);
            return Err(err);
        }
    };
    let by = asking.by(caller, Transport::Rest);
    let format = request.format;
    if format == ResultFormat::Json {
        let outcome = unless_disconnected(req, state.runs.run(by, project, name, request)).await;
        return Ok(answer(req, &connected(req, outcome)??));
    }
    let exported = unless_disconnected(req, state.runs.export(by, project, name, request)).await;
    Ok(written(req, connected(req, exported)??, format))
}

/// What a run answered, or [`ApiError::ClientClosed`] when its client went away first (the run was cancelled).
fn connected<T>(req: &HttpRequest, answered: Option<T>) -> Result<T, ApiError> {
    answered.ok_or_else(|| {
        tracing::info!(path = req.path(), "client disconnected; run cancelled");
        ApiError::ClientClosed
    })
}

/// Whether the client already holds the answer tagged `tag` (`If-None-Match` compares weakly).
fn held(req: &HttpRequest, tag: &str) -> bool {
    if !req.headers().contains_key(header::IF_NONE_MATCH) {
        return false;
    }
    match req.get_header::<IfNoneMatch>() {
        Some(IfNoneMatch::Any) => true,
        Some(IfNoneMatch::Items(tags)) => tags.iter().any(|held| held.tag() == tag),
        None => false,
    }
}

/// A page in another format than JSON: what JSON says in its body goes in headers. Such a page is never cached,
/// by this service or (`max-age=0`) by the client. A `force_cache` run with nothing stored is a page of no rows.
fn written(req: &HttpRequest, exported: Exported, format: ResultFormat) -> HttpResponse {
    let Exported { name, version, export, materialized_at, data_as_of, execution_id } = exported;
    // Never kept: `private, max-age=0`.
    let keep = (header::CACHE_CONTROL, keep_for(std::time::Duration::ZERO));
    let tag = strong_tag(&export.digest).map(|tag| (header::ETAG, tag));
    if held(req, &export.digest) {
        let mut response = HttpResponse::NotModified();
        if let Some(tag) = tag {
            response.insert_header(tag);
        }
        return response.insert_header(keep).finish();
    }
    let mut response = HttpResponse::Ok();
    if let Some(tag) = tag {
        response.insert_header(tag);
    }
    response
        .insert_header((header::CONTENT_TYPE, media_type(format)))
        .insert_header(ContentDisposition {
            disposition: DispositionType::Attachment,
            parameters: vec![DispositionParam::Filename(format!("{name}.{}", format.as_str()))],
        })
        .insert_header(("X-Has-More", if export.has_more { "true" } else { "false" }))
        .insert_header(keep)
        .insert_header(("X-Endpoint-Version", version.to_string()))
        .insert_header(("X-Is-Cached", "false"))
        .insert_header(("X-Endpoint-Materialized", if materialized_at.is_some() { "true" } else { "false" }))
        .insert_header(("X-Execution-Id", execution_id.to_string()));
    if let Some(at) = materialized_at.and_then(|at| at.format(&Rfc3339).ok()) {
        response.insert_header(("X-Endpoint-Materialized-At", at));
    }
    if let Some(at) = data_as_of.and_then(|at| at.format(&Rfc3339).ok()) {
        response.insert_header((DATA_AS_OF, at));
    }
    response.body(SizedStream::new(export.bytes, export.body))
}

/// The answer, or 304 when the client holds it already. Every answer says how long it may be kept: what the
/// cache has left of it (`private`: it answers one key's request).
///
/// A cache hit answers through here, so its headers are written as bytes rather than through the typed headers'
/// `Display` (which cost a cached run more than its body).
fn answer(req: &HttpRequest, outcome: &RunOutcome) -> HttpResponse {
    let keep = keep_for(outcome.fresh_for);
    let (status, tag, body) = match outcome.run.as_deref() {
        None => (StatusCode::OK, None, Some(RunAnswer::of(outcome).write())),
        Some(run) if held(req, run.etag()) => (StatusCode::NOT_MODIFIED, Some(run.etag()), None),
        Some(run) => (StatusCode::OK, Some(run.etag()), Some(RunAnswer::of(outcome).write())),
    };
    let mut response = match body {
        Some(body) => HttpResponse::with_body(status, body).map_into_boxed_body(),
        None => HttpResponse::new(status),
    };
    let headers = response.headers_mut();
    if status == StatusCode::OK {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    if let Some(tag) = tag.and_then(strong_tag) {
        headers.insert(header::ETAG, tag);
    }
    if let Some(as_of) = outcome.run.as_deref().and_then(|run| HeaderValue::from_str(run.as_of_text()).ok()) {
        headers.insert(DATA_AS_OF, as_of);
    }
    headers.insert(header::CACHE_CONTROL, keep);
    response
}

/// The time up to which appended rows are in an answer.
const DATA_AS_OF: header::HeaderName = header::HeaderName::from_static("x-data-as-of");

/// `Cache-Control: private, max-age=N` for an answer the cache still serves for `fresh_for`.
fn keep_for(fresh_for: std::time::Duration) -> HeaderValue {
    let seconds = u32::try_from(fresh_for.as_secs()).unwrap_or(u32::MAX);
    let mut value = Vec::with_capacity(32);
    value.extend_from_slice(b"private, max-age=");
    value.extend_from_slice(itoa::Buffer::new().format(seconds).as_bytes());
    HeaderValue::from_maybe_shared(Bytes::from(value))
        .unwrap_or_else(|_| HeaderValue::from_static("private, max-age=0"))
}

/// `tag` as a strong entity tag's header value (`"tag"`); `None` for a tag a header cannot carry, which the
/// domain's and the exports' hex digests never are.
fn strong_tag(tag: &str) -> Option<HeaderValue> {
    let mut value = Vec::with_capacity(tag.len() + 2);
    value.push(b'"');
    value.extend_from_slice(tag.as_bytes());
    value.push(b'"');
    HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/last_execution_times", operation_id = "last_execution_times",
    params(("project_id" = String, Path)), request_body = Names,
    responses((status = 200, body = LastExecutionTimes), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error)))]
pub(crate) async fn last_execution_times(
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointRead>,
) -> Result<HttpResponse, ApiError> {
    let request = LastExecutionsRequest::try_from(&caller.body)?;
    let found = state.runs.last_execution_times(caller.project, &request).await?;
    Ok(HttpResponse::Ok().json(LastExecutionTimes::of(caller.project, found)))
}
