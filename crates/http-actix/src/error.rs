//! One error type for every response that is not a success, rendered as
//! `{"type", "code", "detail", "attr"}` with the status contract section 2 gives it.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use domain::{Error, Invalid};
use serde::Serialize;

/// An error response. Domain errors convert into it; the adapter adds its own HTTP-level ones.
#[derive(Debug)]
pub enum ApiError {
    Domain(Error),
    PayloadTooLarge {
        limit: usize,
    },
    UnsupportedMediaType,
    MalformedJson(String),
    MethodNotAllowed {
        allow: &'static str,
    },
    RouteNotFound,
    /// The body did not arrive in time.
    BodyTimeout {
        timeout: std::time::Duration,
    },
    /// The caller's key or project is over its request rate.
    RateLimited {
        scope: &'static str,
        retry_after: std::time::Duration,
    },
    /// The client went away while its query ran; nobody reads this answer.
    ClientClosed,
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    code: &'a str,
    detail: &'a str,
    attr: Option<&'a str>,
}

impl ApiError {
    pub(crate) fn bad_query(err: &dyn std::fmt::Display) -> Self {
        ApiError::Domain(Error::Invalid(Invalid {
            attr: None,
            code: "invalid",
            detail: format!("The query string could not be read: {err}."),
        }))
    }

    fn parts(&self) -> (StatusCode, &'static str, &str, String, Option<&str>) {
        match self {
            ApiError::Domain(err) => match err {
                Error::Invalid(inv) => (
                    StatusCode::BAD_REQUEST,
                    "validation_error",
                    inv.code,
                    inv.detail.clone(),
                    inv.attr.as_deref(),
                ),
                Error::NotAuthenticated(detail) => (
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "not_authenticated",
                    detail.clone(),
                    None,
                ),
                Error::PermissionDenied(detail) => {
                    (StatusCode::FORBIDDEN, "permission_denied", "permission_denied", detail.clone(), None)
                }
                Error::NotFound(detail) => {
                    (StatusCode::NOT_FOUND, "not_found", "not_found", detail.clone(), None)
                }
                Error::NameTaken(_) => {
                    (StatusCode::CONFLICT, "conflict", "unique", err.to_string(), Some("name"))
                }
                Error::QueryTimeout(_) => {
                    (StatusCode::BAD_REQUEST, "query_error", "query_timeout", err.to_string(), None)
                }
                Error::QueryMemoryLimit(_) => (
                    StatusCode::BAD_REQUEST,
                    "query_error",
                    "query_memory_limit",
                    format!("The query needed more memory than allowed: {err}"),
                    None,
                ),
                Error::ResultTooLarge { .. } => (
                    StatusCode::BAD_REQUEST,
                    "query_error",
                    "result_too_large",
                    err.to_string(),
                    Some("limit"),
                ),
                Error::Throttled { .. } => {
                    (StatusCode::TOO_MANY_REQUESTS, "throttled", "throttled", err.to_string(), None)
                }
                Error::Unavailable(_) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "unavailable",
                    "A service this request depends on is unavailable. Try again shortly.".into(),
                    None,
                ),
                Error::Internal(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "error",
                    "Something went wrong on our side. The error has been logged.".into(),
                    None,
                ),
            },
            ApiError::PayloadTooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "validation_error",
                "payload_too_large",
                format!("The request body exceeds the limit of {limit} bytes."),
                None,
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "validation_error",
                "unsupported_media_type",
                "The request body must be JSON, sent with 'Content-Type: application/json'.".into(),
                None,
            ),
            ApiError::MalformedJson(reason) => (
                StatusCode::BAD_REQUEST,
                "validation_error",
                "parse_error",
                format!("The request body is not valid JSON: {reason}."),
                None,
            ),
            ApiError::MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                "validation_error",
                "method_not_allowed",
                "This method is not allowed on this path.".into(),
                None,
            ),
            ApiError::RouteNotFound => (
                StatusCode::NOT_FOUND,
                "not_found",
                "not_found",
                "There is nothing at this path.".into(),
                None,
            ),
            ApiError::BodyTimeout { timeout } => (
                StatusCode::REQUEST_TIMEOUT,
                "validation_error",
                "request_timeout",
                format!("The request body did not arrive within {} s.", timeout.as_secs_f64()),
                None,
            ),
            ApiError::RateLimited { scope, retry_after } => (
                StatusCode::TOO_MANY_REQUESTS,
                "throttled",
                "rate_limited",
                format!(
                    "Too many requests for this {}; retry after {} s.",
                    if *scope == "key" { "API key" } else { "project" },
                    retry_seconds(*retry_after)
                ),
                None,
            ),
            ApiError::ClientClosed => (
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
                "query_error",
                "client_closed_request",
                "The client closed the connection; its query was cancelled.".into(),
                None,
            ),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.parts().3)
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        ApiError::Domain(err)
    }
}

impl From<Invalid> for ApiError {
    fn from(err: Invalid) -> Self {
        ApiError::Domain(Error::Invalid(err))
    }
}

/// Whole seconds to wait, at least one.
fn retry_seconds(wait: std::time::Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

/// The full cause chain, for the log only.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.parts().0
    }

    fn error_response(&self) -> HttpResponse {
        let (status, kind, code, detail, attr) = self.parts();
        if let ApiError::Domain(err @ (Error::Internal(_) | Error::Unavailable(_))) = self {
            tracing::error!(status = status.as_u16(), error = %chain(err), "request failed");
        }
        let mut response = HttpResponse::build(status);
        match self {
            ApiError::Domain(Error::NotAuthenticated(_)) => {
                response.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
            }
            ApiError::MethodNotAllowed { allow } => {
                response.insert_header((header::ALLOW, HeaderValue::from_static(allow)));
            }
            ApiError::Domain(Error::Throttled { retry_after })
            | ApiError::RateLimited { retry_after, .. } => {
                response.insert_header((header::RETRY_AFTER, retry_seconds(*retry_after).to_string()));
            }
            _ => {}
        }
        response.json(Body { kind, code, detail: &detail, attr })
    }
}
