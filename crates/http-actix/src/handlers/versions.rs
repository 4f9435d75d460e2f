//! An endpoint's versions, one version, and the OpenAPI document of one.

use actix_web::{web, HttpRequest, HttpResponse};
use domain::{EndpointName, VersionNumber};
use serde::Deserialize;

use super::{page_param, EndpointPath, Query};
use crate::api::{Version, VersionPage};
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, EndpointRead, EndpointRun};
use crate::{openapi, AppState};

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/versions", operation_id = "list_versions",
    params(("project_id" = String, Path), ("name" = String, Path), ("limit" = Option<i64>, Query), ("offset" = Option<i64>, Query)),
    responses((status = 200, body = VersionPage), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let name = path.endpoint()?;
    let page = state.endpoints.versions(caller.project, &name, page_param(&query)?).await?;
    Ok(HttpResponse::Ok().json(VersionPage::of(&req, page)))
}

/// One version of an endpoint (`{version_number}`).
#[derive(Deserialize)]
pub(crate) struct VersionPath {
    name: String,
    version_number: String,
}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/versions/{version_number}", operation_id = "get_version",
    params(("project_id" = String, Path), ("name" = String, Path), ("version_number" = String, Path)),
    responses((status = 200, body = Version), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn retrieve(
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<VersionPath>,
) -> Result<HttpResponse, ApiError> {
    let name = EndpointName::from_path(&path.name)?;
    let number = VersionNumber::parse_field("version_number", &path.version_number)?;
    let version = state.endpoints.version(caller.project, &name, number).await?;
    Ok(HttpResponse::Ok().json(Version::from(version)))
}

/// The OpenAPI document of the current version, or of `?version=N`.
#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/openapi.json", operation_id = "endpoint_openapi",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query)),
    responses((status = 200, description = "An OpenAPI 3.0.3 document of the endpoint's run operation", body = Object),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn openapi(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<EndpointRun>,
    path: web::Path<EndpointPath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let raw = query.get("version");
    if let (Some(grant), Some(raw)) = (&caller.caller.grant, raw) {
        // Not a version number is not a version any token was issued for.
        grant.admit_version(&path.name, Some(raw.parse().map_or(0, VersionNumber::get)))?;
    }
    let name = path.endpoint()?;
    let version = raw.map(|raw| VersionNumber::parse_field("version", raw));
    let version = version.transpose()?;
    let (endpoint, version) = state.endpoints.endpoint_version(caller.project, &name, version).await?;
    let info = req.connection_info();
    let base_url = format!("{}://{}", info.scheme(), info.host());
    Ok(HttpResponse::Ok().json(openapi::document(&endpoint, &version, &base_url)))
}
