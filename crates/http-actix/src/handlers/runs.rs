//! Running an endpoint (GET and POST), and the last execution times of several.

use actix_web::http::header::{CacheControl, CacheDirective, ContentType, ETag, EntityTag, IfNoneMatch};
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use domain::{ProjectId, RunOutcome, RunRequest};

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
           ("variables" = Option<String>, Query, description = "A JSON object of variables; or one `variables.NAME=value` parameter each")),
    responses((status = 200, body = RunAnswer), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 429, body = Error)))]
pub(crate) async fn run_get(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let request = RunRequest::from_query(params(&req))?;
    let outcome = run(&req, &state, caller.project, &path.name, request).await?;
    Ok(answer(&req, &outcome))
}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/{name}/run", operation_id = "run_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query)), request_body = RunBody,
    responses((status = 200, body = RunAnswer), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 429, body = Error)))]
pub(crate) async fn run_post(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointRead>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let version = params(&req).find(|(k, _)| k == "version").map(|(_, v)| v);
    let request = RunRequest::from_body(&caller.body, version.as_deref())?;
    let outcome = run(&req, &state, caller.project, &path.name, request).await?;
    Ok(answer(&req, &outcome))
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
    let held = match req.get_header::<IfNoneMatch>() {
        Some(IfNoneMatch::Any) => true,
        Some(IfNoneMatch::Items(tags)) => tags.iter().any(|held| held.weak_eq(&tag)),
        None => false,
    };
    if held {
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
