//! Row 6: the materialization status of an endpoint.

use actix_web::{web, HttpRequest, HttpResponse};
use domain::Scope;

use super::authorize;
use crate::error::ApiError;
use crate::{render, AppState};

pub(crate) async fn status(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let view = state.endpoints.materialization_status(project, &name).await?;
    Ok(HttpResponse::Ok().json(render::materialization(&view)))
}
