//! Issuing run tokens.

use actix_web::{web, HttpResponse};
use domain::RunTokenRequest;

use crate::api::requests::RunTokenBody;
use crate::api::RunToken;
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{AuthorizedJson, EndpointWrite};
use crate::AppState;

#[utoipa::path(post, path = "/api/projects/{project_id}/run_tokens", operation_id = "create_run_token",
    params(("project_id" = String, Path)), request_body = RunTokenBody,
    responses((status = 201, body = RunToken, description = "The token, shown once: the service does not keep it"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error, description = "A name that is not an active endpoint of the project"),
              (status = 415, body = Error), (status = 429, body = Error)))]
pub(crate) async fn issue(
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointWrite>,
) -> Result<HttpResponse, ApiError> {
    let request = RunTokenRequest::try_from(&caller.body)?;
    let issued = state.runs.issue_run_token(&state.keys, &caller.caller, caller.project, request).await?;
    Ok(HttpResponse::Created().json(RunToken::from(issued)))
}
