//! CORS on the routes a page calls from a browser with a run token: runs and OpenAPI documents. `actix-cors`
//! answers preflights and writes the headers; which origins a project allows is the key service's to say
//! (`endpoints project update --allow-origin`). Other routes, and origins a project does not allow, get no
//! CORS header at all, so a browser keeps their answers from the page.
//!
//! Only requests from pages (with `Origin`) pass through it: the routes register each of these resources twice,
//! the other copy for every other caller (`routes::from_pages` and `routes::not_from_pages`).
//!
//! The origin check of `actix-cors` cannot wait, so a middleware in front of it reads the project's origins
//! into the key service's memory first (a store read at most once a second per project, or once per change
//! where the store announces them).

use std::sync::Arc;

use actix_cors::Cors;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web;
use domain::{ApiKeyService, ProjectId, ProjectRef};

use crate::error::ApiError;
use crate::paths::FAMILY_PREFIXES;
use crate::AppState;

/// What a page may read of an answer besides the simple headers: the run's fields that formats other than
/// JSON carry in headers, the rate limit, and the tag to send back in `If-None-Match`.
const EXPOSED: [&str; 11] = [
    "etag",
    "x-endpoint-version",
    "x-is-cached",
    "x-endpoint-materialized",
    "x-endpoint-materialized-at",
    "x-execution-id",
    "x-has-more",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

/// How long a browser may keep a preflight's answer: short, so that a removed origin stops working soon.
const PREFLIGHT_MAX_AGE_SECONDS: usize = 600;

/// The project a path of either family names by id (`/api/projects/12/...`), read as authorization reads it.
/// `@current` names none, since a browser's preflight carries no credential to resolve it.
fn path_project(path: &str) -> Option<ProjectId> {
    let rest = FAMILY_PREFIXES.iter().find_map(|family| path.strip_prefix(family))?.strip_prefix('/')?;
    match rest.split('/').next()?.parse() {
        Ok(ProjectRef::Id(project)) => Some(project),
        _ => None,
    }
}

/// The CORS policy of the run and OpenAPI routes.
pub(crate) fn policy(keys: Arc<ApiKeyService>) -> Cors {
    Cors::default()
        .allowed_origin_fn(move |origin: &HeaderValue, head| {
            let project = path_project(head.uri.path());
            match (project, origin.to_str()) {
                (Some(project), Ok(origin)) => keys.allows_origin(project, origin),
                _ => false,
            }
        })
        .allowed_methods([Method::GET, Method::POST])
        .allowed_headers([header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT, header::IF_NONE_MATCH])
        .expose_headers(EXPOSED)
        .max_age(PREFLIGHT_MAX_AGE_SECONDS)
        .block_on_origin_mismatch(false)
}

/// In front of [`policy`]: reads the path's project's origins into memory when a request comes from a page
/// (it has `Origin`), and answers a preflight of an origin the project does not allow with a JSON 403 rather
/// than the CORS layer's plain-text refusal.
pub(crate) async fn load_origins(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    // Most callers are not pages: they pay for one header lookup here.
    let origin = req.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok()).map(str::to_owned);
    if let (Some(origin), Some(state)) = (origin, req.app_data::<web::Data<AppState>>()) {
        let keys = &state.keys;
        let project = path_project(req.path());
        if let Some(project) = project {
            if let Err(err) = keys.load_origins(project).await {
                tracing::warn!(error = %err, %project, "cannot read the project's allowed origins");
            }
        }
        let preflight = req.method() == Method::OPTIONS
            && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        if preflight && !project.is_some_and(|project| keys.allows_origin(project, &origin)) {
            let refused = ApiError::from(domain::Error::PermissionDenied(format!(
                "Pages of {origin} may not call this project's runs: its allowed origins do not include it \
                 (`endpoints project update --allow-origin`), or the path names the project as @current \
                 rather than by its id."
            )));
            let (req, _) = req.into_parts();
            let response = actix_web::ResponseError::error_response(&refused).map_into_right_body();
            return Ok(ServiceResponse::new(req, response));
        }
    }
    Ok(next.call(req).await?.map_into_left_body())
}

#[cfg(test)]
mod tests {
    use super::path_project;

    #[test]
    fn the_project_is_read_from_numeric_ids_of_either_family_only() {
        assert_eq!(path_project("/api/projects/12/endpoints/a/run").map(|p| p.get()), Some(12));
        assert_eq!(path_project("/api/environments/3/endpoints/a/openapi.json").map(|p| p.get()), Some(3));
        for path in [
            "/api/projects/@current/endpoints/a/run",
            "/api/projects/0/x",
            "/api/projects12/endpoints",
            "/api/other/12/endpoints",
            "/api",
            "/",
        ] {
            assert_eq!(path_project(path), None, "{path}");
        }
    }
}
