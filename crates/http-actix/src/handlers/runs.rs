//! Rows 8, 9 and 12: running an endpoint and the last execution times.

use actix_web::http::header::ContentType;
use actix_web::{web, HttpRequest, HttpResponse};
use domain::{ProjectId, RunOutcome, RunRequest, Scope};
use serde_json::{Map, Value};

use super::authorize;
use crate::body::read_json;
use crate::disconnect::unless_disconnected;
use crate::error::ApiError;
use crate::operations::AnswerSource;
use crate::{render, AppState};

/// The query string's pairs, borrowed from the request where nothing needs decoding.
fn params(req: &HttpRequest) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(req.query_string().as_bytes())
}

pub(crate) async fn run_get(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let request = RunRequest::from_query(params(&req))?;
    let outcome = run(&req, &state, project, &name, request).await?;
    Ok(HttpResponse::Ok().content_type(ContentType::json()).body(render::run(&outcome)))
}

pub(crate) async fn run_post(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let body = read_json(&req, payload, state.body_limit, state.client_timeout)
        .await?
        .unwrap_or_else(|| Value::Object(Map::new()));
    let version = params(&req).find(|(k, _)| k == "version").map(|(_, v)| v);
    let request = RunRequest::from_body(&body, version.as_deref())?;
    let outcome = run(&req, &state, project, &name, request).await?;
    Ok(HttpResponse::Ok().content_type(ContentType::json()).body(render::run(&outcome)))
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

pub(crate) async fn last_execution_times(
    req: HttpRequest,
    state: web::Data<AppState>,
    project: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let body = read_json(&req, payload, state.body_limit, state.client_timeout)
        .await?
        .unwrap_or_else(|| Value::Object(Map::new()));
    let found = state.runs.last_execution_times(project, &body).await?;
    Ok(HttpResponse::Ok().json(render::last_executions(project, &found)))
}
