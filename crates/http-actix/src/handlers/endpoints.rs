//! Rows 1 to 5: list, create, retrieve, update, delete.

use std::collections::HashMap;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use domain::service::ListParams;
use domain::Scope;
use serde_json::Value;

use super::authorize;
use crate::body::read_json;
use crate::error::ApiError;
use crate::{render, AppState};

type Query = web::Query<HashMap<String, String>>;

pub(crate) async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    project: web::Path<String>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let param = |key: &str| query.get(key).map(String::as_str);
    let params = ListParams {
        limit: param("limit"),
        offset: param("offset"),
        is_active: param("is_active"),
        is_materialized: param("is_materialized"),
        search: param("search"),
    };
    let page = state.endpoints.list(project, params).await?;
    Ok(HttpResponse::Ok().json(render::page(&req, &page, render::endpoint)))
}

pub(crate) async fn create(
    req: HttpRequest,
    state: web::Data<AppState>,
    project: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let project = authorize(&req, &state, &project, Scope::EndpointWrite).await?;
    let body = read_json(&req, payload, state.body_limit, state.client_timeout)
        .await?
        .unwrap_or_else(|| Value::Object(Default::default()));
    let endpoint = state.endpoints.create(project, &body).await?;
    let location = format!("/api/projects/{}/endpoints/{}", endpoint.project_id, endpoint.name);
    Ok(HttpResponse::Created().insert_header((header::LOCATION, location)).json(render::endpoint(&endpoint)))
}

pub(crate) async fn retrieve(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointRead).await?;
    let endpoint = state.endpoints.get(project, &name).await?;
    Ok(HttpResponse::Ok().json(render::endpoint(&endpoint)))
}

pub(crate) async fn update(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointWrite).await?;
    let body = read_json(&req, payload, state.body_limit, state.client_timeout)
        .await?
        .unwrap_or_else(|| Value::Object(Default::default()));
    let endpoint = state.endpoints.update(project, &name, &body).await?;
    Ok(HttpResponse::Ok().json(render::endpoint(&endpoint)))
}

pub(crate) async fn delete(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project, name) = path.into_inner();
    let project = authorize(&req, &state, &project, Scope::EndpointWrite).await?;
    state.endpoints.delete(project, &name).await?;
    Ok(HttpResponse::NoContent().finish())
}
