//! An endpoint's versions, one version, and the OpenAPI document of one.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::EndpointPath;
use crate::api::{Version, VersionPage};
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, EndpointRead};
use crate::{openapi, AppState};

type Query = web::Query<HashMap<String, String>>;

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
    let param = |key: &str| query.get(key).map(String::as_str);
    let page = state.endpoints.versions(caller.project, &path.name, param("limit"), param("offset")).await?;
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
    let version = state.endpoints.version(caller.project, &path.name, &path.version_number).await?;
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
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let version = query.get("version").map(String::as_str);
    if let (Some(grant), Some(raw)) = (&caller.caller.grant, version) {
        // Not a number is not a version any token was issued for.
        grant.admit_version(&path.name, Some(raw.parse().unwrap_or(0)))?;
    }
    let (endpoint, version) = state.endpoints.endpoint_version(caller.project, &path.name, version).await?;
    let info = req.connection_info();
    let base_url = format!("{}://{}", info.scheme(), info.host());
    Ok(HttpResponse::Ok().json(openapi::document(&endpoint, &version, &base_url)))
}
