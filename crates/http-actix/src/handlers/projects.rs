//! The project a key belongs to.

use actix_web::{web, HttpResponse};
use domain::ProjectRef;

use crate::api::Project;
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, ProjectRead};
use crate::AppState;

#[utoipa::path(get, path = "/api/projects/{project_id}", operation_id = "retrieve_project",
    params(("project_id" = String, Path)),
    responses((status = 200, body = Project, description = "The project, for any API key of it (a run token may not read it)"),
              (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn retrieve(
    state: web::Data<AppState>,
    caller: Authorized<ProjectRead>,
) -> Result<HttpResponse, ApiError> {
    let project = state.keys.project(&caller.caller, ProjectRef::Id(caller.project)).await?;
    Ok(HttpResponse::Ok().json(Project::from(project)))
}
