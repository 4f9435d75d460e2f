//! Running an endpoint (GET and POST), and the last execution times of several.

use actix_web::body::SizedStream;
use actix_web::http::header::{
    Accept, CacheControl, CacheDirective, ContentDisposition, ContentType, DispositionParam, DispositionType,
    ETag, EntityTag, IfNoneMatch,
};
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use domain::{Exported, Principal, ProjectId, ResultFormat, RunOutcome, RunRequest};
use time::format_description::well_known::Rfc3339;

use super::EndpointPath;
use crate::api::requests::{Names, RunBody};
use crate::api::{LastExecutionTimes, RunAnswer};
use crate::disconnect::unless_disconnected;
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, AuthorizedJson, EndpointRead};
use crate::operations::AnswerSource;
use crate::AppState;

/// The query string's pairs, borrowed from the request where nothing needs decoding.
fn params(req: &HttpRequest) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(req.query_string().as_bytes())
}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/run", operation_id = "run_endpoint_get",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query), ("limit" = Option<i64>, Query),
           ("offset" = Option<i64>, Query), ("refresh" = Option<String>, Query), ("client_query_id" = Option<String>, Query),
           ("format" = Option<String>, Query, description = "json (default), csv, ndjson, parquet or arrow; overrides Accept"),
           ("variables" = Option<String>, Query, description = "A JSON object of variables; or one `variables.NAME=value` parameter each")),
    responses((status = 200, description = "The run: JSON, or the page in the format asked for, its run's fields in X- headers",
               content((RunAnswer = "application/json"), (String = "text/csv"), (String = "application/x-ndjson"),
                       ("application/vnd.apache.parquet"), ("application/vnd.apache.arrow.stream"))),
              (status = 204, description = "refresh=force_cache found no fresh stored result for a page in a format other than JSON"),
              (status = 304, description = "If-None-Match holds the answer's ETag"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 406, body = Error), (status = 429, body = Error)))]
pub(crate) async fn run_get(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let accepted = accepted(&req);
    let mut request = RunRequest::from_query(params(&req), accepted.unwrap_or_default())?;
    fix_variables(&caller.caller, &mut request)?;
    let explicit = params(&req).any(|(key, _)| key == "format");
    respond(&req, &state, caller.project, &path.name, request, accepted, explicit).await
}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/{name}/run", operation_id = "run_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query)), request_body = RunBody,
    responses((status = 200, description = "The run: JSON, or the page in the format asked for, its run's fields in X- headers",
               content((RunAnswer = "application/json"), (String = "text/csv"), (String = "application/x-ndjson"),
                       ("application/vnd.apache.parquet"), ("application/vnd.apache.arrow.stream"))),
              (status = 204, description = "refresh=force_cache found no fresh stored result for a page in a format other than JSON"),
              (status = 304, description = "If-None-Match holds the answer's ETag"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 406, body = Error), (status = 429, body = Error)))]
pub(crate) async fn run_post(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointRead>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let version = params(&req).find(|(k, _)| k == "version").map(|(_, v)| v);
    let accepted = accepted(&req);
    let mut request = RunRequest::from_body(&caller.body, version.as_deref(), accepted.unwrap_or_default())?;
    fix_variables(&caller.caller, &mut request)?;
    let explicit = caller.body.get("format").is_some_and(|f| !f.is_null());
    respond(&req, &state, caller.project, &path.name, request, accepted, explicit).await
}

/// A run token's fixed variables, set in its holder's request (which may not send them).
fn fix_variables(caller: &Principal, request: &mut RunRequest) -> Result<(), ApiError> {
    if let Some(grant) = &caller.grant {
        request.fix_variables(&grant.fixed_variables)?;
    }
    Ok(())
}

/// The format `Accept` asks for: the first of its preferences a run is written in, JSON when it names none (or
/// anything). `None` when it names only formats the service does not write.
fn accepted(req: &HttpRequest) -> Option<ResultFormat> {
    let Some(accept) = req.get_header::<Accept>() else { return Some(ResultFormat::Json) };
    if accept.0.is_empty() {
        return Some(ResultFormat::Json);
    }
    accept.ranked().iter().find_map(|mime| match (mime.type_().as_str(), mime.subtype().as_str()) {
        ("*", "*") | ("application", "*" | "json") => Some(ResultFormat::Json),
        ("text", "csv" | "*") => Some(ResultFormat::Csv),
        ("application", "x-ndjson" | "ndjson" | "jsonl") => Some(ResultFormat::NdJson),
        ("application", "vnd.apache.parquet") => Some(ResultFormat::Parquet),
        ("application", "vnd.apache.arrow.stream") => Some(ResultFormat::Arrow),
        _ => None,
    })
}

/// The media type a format is written as.
fn media_type(format: ResultFormat) -> &'static str {
    match format {
        ResultFormat::Json => "application/json",
        ResultFormat::Csv => "text/csv; charset=utf-8",
        ResultFormat::NdJson => "application/x-ndjson",
        ResultFormat::Parquet => "application/vnd.apache.parquet",
        ResultFormat::Arrow => "application/vnd.apache.arrow.stream",
    }
}

async fn respond(
    req: &HttpRequest,
    state: &AppState,
    project: ProjectId,
    name: &str,
    request: RunRequest,
    accepted: Option<ResultFormat>,
    explicit: bool,
) -> Result<HttpResponse, ApiError> {
    if accepted.is_none() && !explicit {
        return Err(ApiError::NotAcceptable);
    }
    if request.format == ResultFormat::Json {
        let outcome = run(req, state, project, name, request).await?;
        return Ok(answer(req, &outcome));
    }
    let format = request.format;
    match unless_disconnected(req, state.runs.export(project, name, request)).await {
        Some(exported) => {
            state.operations.metrics.count_answer(AnswerSource::Live);
            Ok(written(req, exported?, format))
        }
        None => {
            tracing::info!(endpoint = name, "client disconnected; run cancelled");
            Err(ApiError::ClientClosed)
        }
    }
}

/// Whether the client already holds the answer tagged `tag`.
fn held(req: &HttpRequest, tag: &EntityTag) -> bool {
    match req.get_header::<IfNoneMatch>() {
        Some(IfNoneMatch::Any) => true,
        Some(IfNoneMatch::Items(tags)) => tags.iter().any(|held| held.weak_eq(tag)),
        None => false,
    }
}

/// A page in another format than JSON: what JSON says in its body goes in headers. Such a page is never cached,
/// by this service or (`max-age=0`) by the client. A `force_cache` run with nothing stored has no page: 204.
fn written(req: &HttpRequest, exported: Exported, format: ResultFormat) -> HttpResponse {
    let Exported { name, version, export, materialized_at, execution_id } = exported;
    let keep = CacheControl(vec![CacheDirective::Private, CacheDirective::MaxAge(0)]);
    let mut response = match &export {
        None => HttpResponse::NoContent(),
        Some(export) => {
            let tag = EntityTag::new_strong(export.digest.clone());
            if held(req, &tag) {
                return HttpResponse::NotModified().insert_header(ETag(tag)).insert_header(keep).finish();
            }
            let mut response = HttpResponse::Ok();
            response
                .insert_header((actix_web::http::header::CONTENT_TYPE, media_type(format)))
                .insert_header(ETag(tag))
                .insert_header(ContentDisposition {
                    disposition: DispositionType::Attachment,
                    parameters: vec![DispositionParam::Filename(format!("{name}.{}", format.as_str()))],
                })
                .insert_header(("X-Has-More", if export.has_more { "true" } else { "false" }));
            response
        }
    };
    response
        .insert_header(keep)
        .insert_header(("X-Endpoint-Version", version.to_string()))
        .insert_header(("X-Is-Cached", "false"))
        .insert_header(("X-Endpoint-Materialized", if materialized_at.is_some() { "true" } else { "false" }))
        .insert_header(("X-Execution-Id", execution_id.to_string()));
    if let Some(at) = materialized_at.and_then(|at| at.format(&Rfc3339).ok()) {
        response.insert_header(("X-Endpoint-Materialized-At", at));
    }
    match export {
        Some(export) => response.body(SizedStream::new(export.bytes, export.body)),
        None => response.finish(),
    }
}

/// The answer, or 304 when the client holds it already. Every answer says how long it may be kept: what the
/// cache has left of it (`private`: it answers one key's request).
fn answer(req: &HttpRequest, outcome: &RunOutcome) -> HttpResponse {
    let keep = CacheControl(vec![
        CacheDirective::Private,
        CacheDirective::MaxAge(u32::try_from(outcome.fresh_for.as_secs()).unwrap_or(u32::MAX)),
    ]);
    let Some(run) = outcome.run.as_deref() else {
        return HttpResponse::Ok()
            .content_type(ContentType::json())
            .insert_header(keep)
            .body(RunAnswer::of(outcome).write());
    };
    let tag = EntityTag::new_strong(run.etag().to_owned());
    if held(req, &tag) {
        return HttpResponse::NotModified().insert_header(ETag(tag)).insert_header(keep).finish();
    }
    HttpResponse::Ok()
        .content_type(ContentType::json())
        .insert_header(ETag(tag))
        .insert_header(keep)
        .body(RunAnswer::of(outcome).write())
}

/// Runs the endpoint, cancelling the run if the client disconnects meanwhile.
async fn run(
    req: &HttpRequest,
    state: &AppState,
    project: ProjectId,
    name: &str,
    request: RunRequest,
) -> Result<RunOutcome, ApiError> {
    match unless_disconnected(req, state.runs.run(project, name, request)).await {
        Some(outcome) => {
            let outcome = outcome?;
            state.operations.metrics.count_answer(match &outcome.run {
                None => AnswerSource::Nothing,
                Some(_) if outcome.is_cached => AnswerSource::Cache,
                Some(_) if outcome.endpoint_materialized => AnswerSource::Materialized,
                Some(_) => AnswerSource::Live,
            });
            Ok(outcome)
        }
        None => {
            tracing::info!(endpoint = name, "client disconnected; run cancelled");
            Err(ApiError::ClientClosed)
        }
    }
}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/last_execution_times", operation_id = "last_execution_times",
    params(("project_id" = String, Path)), request_body = Names,
    responses((status = 200, body = LastExecutionTimes), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error)))]
pub(crate) async fn last_execution_times(
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointRead>,
) -> Result<HttpResponse, ApiError> {
    let found = state.runs.last_execution_times(caller.project, &caller.body).await?;
    Ok(HttpResponse::Ok().json(LastExecutionTimes::of(caller.project, found)))
}
