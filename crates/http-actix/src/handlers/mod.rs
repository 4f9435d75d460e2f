//! Request handlers, one file per resource group, and the authentication step they share.

pub(crate) mod endpoints;
pub(crate) mod materialization;
pub(crate) mod runs;
pub(crate) mod versions;

use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest};
use domain::{Error, ProjectId, Scope};

use crate::error::ApiError;
use crate::AppState;

/// The bearer token of the request.
fn bearer(req: &HttpRequest) -> Result<&str, ApiError> {
    let value = req
        .headers()
        .get(header::AUTHORIZATION)
        .ok_or_else(|| {
            Error::NotAuthenticated(
                "Authentication credentials were not provided: send 'Authorization: Bearer <API key>'."
                    .into(),
            )
        })?
        .to_str()
        .map_err(|_| Error::NotAuthenticated("The Authorization header is malformed.".into()))?;
    let (scheme, token) = value.split_once(' ').ok_or_else(|| {
        Error::NotAuthenticated("The Authorization header must be 'Bearer <API key>'.".into())
    })?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(
            Error::NotAuthenticated("The Authorization header must be 'Bearer <API key>'.".into()).into()
        );
    }
    Ok(token.trim())
}

/// Authenticates the caller and checks it may use `scope` on the path's project: 401, then 403.
pub(crate) async fn authorize(
    req: &HttpRequest,
    state: &AppState,
    project: &str,
    scope: Scope,
) -> Result<ProjectId, ApiError> {
    let principal = state.keys.authenticate(bearer(req)?).await?;
    // Before authorization, so probing other projects spends the caller's budget too.
    match state.rate_limits.take(&principal) {
        Ok(Some(budget)) => {
            req.extensions_mut().insert(budget);
        }
        Ok(None) => {}
        Err(exceeded) => {
            req.extensions_mut().insert(exceeded.budget);
            return Err(ApiError::RateLimited { scope: exceeded.scope, retry_after: exceeded.retry_after });
        }
    }
    let project = state.keys.authorize(&principal, project, scope)?;
    Ok(project)
}
