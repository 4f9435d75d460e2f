//! The materialization status of an endpoint.

use actix_web::{web, HttpResponse};

use super::EndpointPath;
use crate::api::Materialization;
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, EndpointRead};
use crate::AppState;

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/materialization_status", operation_id = "materialization_status",
    params(("project_id" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = Materialization), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn status(
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let view = state.endpoints.materialization_status(caller.project, &path.endpoint()?).await?;
    Ok(HttpResponse::Ok().json(Materialization::from(view)))
}
