//! What a handler is given before it runs: the caller's project, once the bearer key is authenticated, within
//! its request rates and holding the scope the handler needs; and, for handlers that take one, the JSON body.
//!
//! Both come from one extractor future, in that order: actix-web polls a handler's extractors together, so a
//! separate body extractor could answer 415 or 413 to a caller whose key is not even valid.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use domain::{Error, Principal, ProjectId, ProjectRef, Scope, Transport};
use futures_util::StreamExt;
use serde_json::{Map, Value};

use crate::asking::Asking;
use crate::error::ApiError;
use crate::AppState;

/// A scope a handler needs, as a type.
pub(crate) trait Needs: 'static {
    /// `None`: any credential of the project (the domain may refuse some, as it refuses run tokens a project).
    const SCOPE: Option<Scope>;
    /// Whether the handler runs the path's endpoint (or serves what a caller needs to run it), which is all a
    /// run token may do.
    const RUNS_ENDPOINT: bool = false;
}

/// `endpoint:read`: reading endpoints.
pub(crate) struct EndpointRead;

/// `endpoint:read`, running the path's endpoint: the operations a run token naming it may also call.
pub(crate) struct EndpointRun;

/// `endpoint:write`: creating, changing and deleting endpoints.
pub(crate) struct EndpointWrite;

/// `table:read`: listing, reading and previewing tables.
pub(crate) struct TableRead;

/// `table:write`: uploading, appending to and deleting tables.
pub(crate) struct TableWrite;

/// Any key of the project: reading the project itself.
pub(crate) struct ProjectRead;

impl Needs for ProjectRead {
    const SCOPE: Option<Scope> = None;
}

impl Needs for TableRead {
    const SCOPE: Option<Scope> = Some(Scope::TableRead);
}

impl Needs for TableWrite {
    const SCOPE: Option<Scope> = Some(Scope::TableWrite);
}

impl Needs for EndpointRead {
    const SCOPE: Option<Scope> = Some(Scope::EndpointRead);
}

impl Needs for EndpointRun {
    const SCOPE: Option<Scope> = Some(Scope::EndpointRead);
    const RUNS_ENDPOINT: bool = true;
}

impl Needs for EndpointWrite {
    const SCOPE: Option<Scope> = Some(Scope::EndpointWrite);
}

/// The path's project, which the caller may use with scope `S`, and the caller.
pub(crate) struct Authorized<S> {
    pub(crate) project: ProjectId,
    pub(crate) caller: Principal,
    scope: PhantomData<S>,
}

/// [`Authorized`], with the request's JSON body (an empty body reads as `{}`) read after the key was checked.
pub(crate) struct AuthorizedJson<S> {
    pub(crate) project: ProjectId,
    pub(crate) caller: Principal,
    pub(crate) body: Value,
    scope: PhantomData<S>,
}

type Extracted<T> = Pin<Box<dyn Future<Output = Result<T, ApiError>>>>;

impl<S: Needs> FromRequest for Authorized<S> {
    type Error = ApiError;
    type Future = Extracted<Self>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let (project, caller) = authorize(&req, S::SCOPE, S::RUNS_ENDPOINT).await?;
            Ok(Self { project, caller, scope: PhantomData })
        })
    }
}

impl<S: Needs> FromRequest for AuthorizedJson<S> {
    type Error = ApiError;
    type Future = Extracted<Self>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let payload = payload.take();
        Box::pin(async move {
            let (project, caller) = authorize(&req, S::SCOPE, S::RUNS_ENDPOINT).await?;
            let state = app_state(&req)?;
            let body = match read_json(&req, payload, state).await {
                Ok(body) => body.unwrap_or_else(|| Value::Object(Map::new())),
                Err(err) => {
                    if S::RUNS_ENDPOINT {
                        refused_run(&req, state, &caller, project, &err);
                    }
                    return Err(err);
                }
            };
            Ok(Self { project, caller, body, scope: PhantomData })
        })
    }
}

fn app_state(req: &HttpRequest) -> Result<&AppState, ApiError> {
    req.app_data::<web::Data<AppState>>()
        .map(|state| &***state)
        .ok_or_else(|| Error::Internal("the application state is not registered".into()).into())
}

/// The bearer token of the request.
pub(crate) fn bearer(req: &HttpRequest) -> Result<&str, ApiError> {
    let malformed = || {
        Error::NotAuthenticated("The Authorization header must be 'Bearer <API key or run token>'.".into())
    };
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
    let (scheme, token) = value.split_once(' ').ok_or_else(malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(malformed().into());
    }
    Ok(token.trim())
}

/// The caller of a request, from its bearer credential: 429 first for a client address that failed to
/// authenticate too often lately (its credential is not even read), then 401, which counts against its address.
pub(crate) async fn authenticate(req: &HttpRequest, state: &AppState) -> Result<Principal, ApiError> {
    let address = req.peer_addr().map(|peer| peer.ip());
    state.rate_limits.admit_address(address).map_err(|exceeded| {
        req.extensions_mut().insert(exceeded.budget);
        ApiError::RateLimited { scope: exceeded.scope, retry_after: exceeded.retry_after }
    })?;
    let authenticated = match bearer(req) {
        Ok(credential) => state.keys.authenticate(credential).await.map_err(ApiError::from),
        Err(err) => Err(err),
    };
    if matches!(authenticated, Err(ApiError::Domain(Error::NotAuthenticated(_)))) {
        state.rate_limits.authentication_failed(address);
    }
    authenticated
}

/// Authenticates the caller and checks it may use `scope` on the path's project: 401, then 429, then 403. A run
/// refused past authentication is told to the run service, which records it in the caller's project when the
/// path names that project.
async fn authorize(
    req: &HttpRequest,
    scope: Option<Scope>,
    runs_endpoint: bool,
) -> Result<(ProjectId, Principal), ApiError> {
    let state = app_state(req)?;
    let principal = authenticate(req, state).await?;
    // Every route these extractors serve names a project; one that did not would be nothing to authorize.
    let project =
        req.match_info().get("project_id").ok_or(ApiError::RouteNotFound).map(str::parse::<ProjectRef>);
    let named = project.as_ref().ok().and_then(|project| project.as_ref().ok()).copied();
    match (admit(req, state, &principal, project, scope, runs_endpoint), named) {
        (Err(err), Some(named)) if runs_endpoint => {
            refused_run(req, state, &principal, named.resolve(&principal), &err);
            Err(err)
        }
        (admitted, _) => admitted.map(|project| (project, principal)),
    }
}

/// Checks the authenticated `principal` against its rates and the scope the path's project needs.
fn admit(
    req: &HttpRequest,
    state: &AppState,
    principal: &Principal,
    project: Result<Result<ProjectRef, domain::Invalid>, ApiError>,
    scope: Option<Scope>,
    runs_endpoint: bool,
) -> Result<ProjectId, ApiError> {
    // Before authorization, so probing other projects spends the caller's budget too.
    match state.rate_limits.take(principal) {
        Ok(Some(budget)) => {
            req.extensions_mut().insert(budget);
        }
        Ok(None) => {}
        Err(exceeded) => {
            req.extensions_mut().insert(exceeded.budget);
            return Err(ApiError::RateLimited { scope: exceeded.scope, retry_after: exceeded.retry_after });
        }
    }
    let project = project??;
    let runs = if runs_endpoint { req.match_info().get("name") } else { None };
    Ok(match scope {
        Some(scope) => state.keys.authorize(principal, project, scope, runs)?,
        None => domain::ApiKeyService::member(principal, project)?,
    })
}

/// Tells the run service of a REST run of the path's endpoint in `project` refused with `err`.
pub(crate) fn refused_run(
    req: &HttpRequest,
    state: &AppState,
    caller: &Principal,
    project: ProjectId,
    err: &ApiError,
) {
    let endpoint = req.match_info().get("name").unwrap_or("");
    Asking::current().refused(&state.runs, caller, Transport::Rest, project, endpoint, err);
}

pub(crate) fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
}

/// Reads the body as JSON (see [`read_body`]). An empty body is `None`; anything else must be JSON.
pub(crate) async fn read_json(
    req: &HttpRequest,
    payload: Payload,
    state: &AppState,
) -> Result<Option<Value>, ApiError> {
    let bytes = read_body(req, payload, state).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if !is_json(req) {
        return Err(ApiError::UnsupportedMediaType);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| ApiError::MalformedJson(e.to_string()))
}

/// Reads the body whole within the client timeout (a client that sends its body a byte at a time is cut off),
/// refusing it past the body limit.
pub(crate) async fn read_body(
    req: &HttpRequest,
    payload: Payload,
    state: &AppState,
) -> Result<web::Bytes, ApiError> {
    let timeout = state.client_timeout;
    tokio::time::timeout(timeout, read_within(req, payload, state.body_limit))
        .await
        .map_err(|_| ApiError::BodyTimeout { timeout })?
}

/// Reads the body whole, refusing it past `limit` bytes (by its declared length first).
async fn read_within(req: &HttpRequest, mut payload: Payload, limit: usize) -> Result<web::Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut bytes = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::MalformedJson(e.to_string()))?;
        if bytes.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.freeze())
}
