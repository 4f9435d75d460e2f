//! Rows 7, 10 and 11: the versions of an endpoint, and the OpenAPI document of one.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use domain::Scope;

use super::authorize;
use crate::error::ApiError;
use crate::{openapi, render, AppState};

pub(crate) async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let param = |key: &str| query.get(key).map(String::as_str);
    let page = state.endpoints.versions(project, &name, param("limit"), param("offset")).await?;
    Ok(HttpResponse::Ok().json(render::page(&req, &page, render::version)))
}

pub(crate) async fn retrieve(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project, name, number) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let version = state.endpoints.version(project, &name, &number).await?;
    Ok(HttpResponse::Ok().json(render::version(&version)))
}

/// Row 7: the OpenAPI document of the current version, or of `?version=N`.
pub(crate) async fn openapi(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let (endpoint, version) =
        state.endpoints.with_version(project, &name, query.get("version").map(String::as_str)).await?;
    let info = req.connection_info();
    let base_url = format!("{}://{}", info.scheme(), info.host());
    Ok(HttpResponse::Ok().json(openapi::document(&endpoint, &version, &base_url)))
}
