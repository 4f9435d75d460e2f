//! Listing, creating, reading, changing and deleting endpoints.

use std::collections::HashMap;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use domain::{CreateEndpoint, EndpointPatch};

use super::{bool_param, endpoint_filter, page_param, EndpointPath, Query};
use crate::api::requests::{EndpointCreate, EndpointUpdate};
use crate::api::{Endpoint, EndpointPage};
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, AuthorizedJson, EndpointRead, EndpointWrite};
use crate::AppState;

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints", operation_id = "list_endpoints",
    params(("project_id" = String, Path, description = "Project id or @current"),
           ("limit" = Option<i64>, Query), ("offset" = Option<i64>, Query), ("is_active" = Option<bool>, Query),
           ("is_materialized" = Option<bool>, Query), ("search" = Option<String>, Query)),
    responses((status = 200, body = EndpointPage), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error)))]
pub(crate) async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let (page, filter) = (page_param(&query), endpoint_filter(&query));
    let page = state.endpoints.list(caller.project, &filter?, page?).await?;
    Ok(HttpResponse::Ok().json(EndpointPage::of(&req, page)))
}

/// `?dry_run=true` on a create or an update: the body is checked as the call itself would check it, and the
/// answer is the endpoint it would make, but nothing is saved.
fn dry_run(query: &HashMap<String, String>) -> Result<bool, ApiError> {
    Ok(bool_param(query, "dry_run")?.unwrap_or(false))
}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints", operation_id = "create_endpoint",
    params(("project_id" = String, Path),
           ("dry_run" = Option<bool>, Query, description = "Check the body as a create would (the name included) and answer 200 with the endpoint it would make, saving nothing")),
    request_body = EndpointCreate,
    responses((status = 201, body = Endpoint, headers(("Location" = String, description = "The new endpoint's URL"))),
              (status = 200, body = Endpoint, description = "dry_run: the endpoint a create would make; nothing was saved"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 409, body = Error), (status = 413, body = Error), (status = 415, body = Error)))]
pub(crate) async fn create(
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointWrite>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let dry_run = dry_run(&query)?;
    let command = CreateEndpoint::try_from(&caller.body)?;
    if dry_run {
        let endpoint = state.endpoints.check_create(caller.project, command).await?;
        return Ok(HttpResponse::Ok().json(Endpoint::from(endpoint)));
    }
    let endpoint = state.endpoints.create(caller.project, command).await?;
    let location = format!("/api/projects/{}/endpoints/{}", endpoint.project_id, endpoint.name);
    Ok(HttpResponse::Created().insert_header((header::LOCATION, location)).json(Endpoint::from(endpoint)))
}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}", operation_id = "get_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = Endpoint), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn retrieve(
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    let endpoint = state.endpoints.get(caller.project, &path.endpoint()?).await?;
    Ok(HttpResponse::Ok().json(Endpoint::from(endpoint)))
}

#[utoipa::path(patch, path = "/api/projects/{project_id}/endpoints/{name}", operation_id = "update_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path),
           ("dry_run" = Option<bool>, Query, description = "Check the body as an update would and answer the endpoint as it would be (the next version when the query changes), saving nothing")),
    request_body = EndpointUpdate,
    responses((status = 200, body = Endpoint), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error),
              (status = 409, body = Error, description = "breaking_change: the new query breaks callers of an endpoint run within 7 days, and confirm_breaking is not true")))]
pub(crate) async fn update(
    state: web::Data<AppState>,
    caller: AuthorizedJson<EndpointWrite>,
    path: web::Path<EndpointPath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let (dry_run, name) = (dry_run(&query)?, path.endpoint()?);
    let patch = EndpointPatch::try_from(&caller.body)?;
    let endpoint = if dry_run {
        state.endpoints.check_update(caller.project, &name, patch).await?
    } else {
        state.endpoints.update(caller.project, &name, patch).await?
    };
    Ok(HttpResponse::Ok().json(Endpoint::from(endpoint)))
}

#[utoipa::path(delete, path = "/api/projects/{project_id}/endpoints/{name}", operation_id = "delete_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn delete(
    state: web::Data<AppState>,
    caller: Authorized<EndpointWrite>,
    path: web::Path<EndpointPath>,
) -> Result<HttpResponse, ApiError> {
    state.endpoints.delete(caller.project, &path.endpoint()?).await?;
    Ok(HttpResponse::NoContent().finish())
}
