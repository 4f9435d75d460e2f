//! The row whose issue has not landed yet (6): they authenticate, check the endpoint exists, and answer 501 with the
//! JSON error body. Nothing here pretends to work.

use actix_web::{web, HttpRequest, HttpResponse};
use domain::Scope;

use super::authorize;
use crate::error::ApiError;
use crate::AppState;

async fn existing_endpoint(
    req: &HttpRequest,
    state: &AppState,
    project: &str,
    name: &str,
) -> Result<(), ApiError> {
    let project = authorize(req, state, project, Scope::EndpointRead).await?;
    state.endpoints.get(project, name).await?;
    Ok(())
}

pub(crate) async fn materialization_status(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    existing_endpoint(&req, &state, &project, &name).await?;
    Err(ApiError::NotImplemented("Materialization status"))
}
