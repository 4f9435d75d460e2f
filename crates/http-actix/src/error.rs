//! Every answer that is not a success: one table of error codes, each with its status and `type`, and one error
//! type that renders as `{"type", "code", "detail", "attr"}`.

use std::borrow::Cow;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use domain::{Error, Invalid, Violation};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What kind of failure an error is: the `type` of the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    ValidationError,
    AuthenticationError,
    PermissionDenied,
    NotFound,
    Conflict,
    Throttled,
    QueryError,
    ServerError,
}

/// Declares [`Code`] from one table: each code with its status, its `type` and when it is answered. A code is
/// written as its variant's name in snake case; the table repeats it where people read it, and a test holds
/// the two together.
macro_rules! error_codes {
    ($($variant:ident = ($code:literal, $status:literal, $kind:ident, $when:literal),)*) => {
        /// A stable machine code: the `code` of an error body.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum Code {
            $(#[doc = $when] $variant,)*
        }

        impl Code {
            /// Every code, in the order of the table.
            pub const ALL: &[Code] = &[$(Code::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }

            pub fn status(self) -> StatusCode {
                let status = match self { $(Code::$variant => $status,)* };
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }

            pub fn kind(self) -> ErrorType {
                match self { $(Code::$variant => ErrorType::$kind,)* }
            }

            /// When the code is answered, for the documentation.
            pub fn when(self) -> &'static str {
                match self { $(Code::$variant => $when,)* }
            }
        }
    };
}

error_codes! {
    Invalid = ("invalid", 400, ValidationError,
        "a field breaks a rule; `attr` names it (dotted: `query.variables.day.default`)"),
    Required = ("required", 400, ValidationError, "a field that must be sent is missing; `attr` names it"),
    UnknownVariable = ("unknown_variable", 400, ValidationError,
        "a run names a variable the query does not declare, or the query a placeholder it does not declare"),
    FixedVariable = ("fixed_variable", 400, ValidationError,
        "a run with a run token sends a variable the token fixes; `attr: variables.NAME`"),
    ParseError = ("parse_error", 400, ValidationError, "the body is not valid JSON"),
    QueryInvalid = ("query_invalid", 400, QueryError,
        "the version's saved query no longer plans, since a table it reads was replaced; `attr: query`, the \
         detail says why (the endpoint record's `plan_error` too)"),
    QueryTimeout = ("query_timeout", 400, QueryError,
        "the query passed its time limit (default 30 s) and was cancelled"),
    QueryMemoryLimit = ("query_memory_limit", 400, QueryError,
        "the query needed more memory than its limit (default 512 MiB)"),
    ResultTooLarge = ("result_too_large", 400, QueryError,
        "the page of rows is over `--max-result-mb` (32 MiB of JSON); `attr: limit`"),
    NotAuthenticated = ("not_authenticated", 401, AuthenticationError,
        "no key or run token, or a malformed, unknown, revoked or expired one (a run token also when forged, \
         of another project, or signed before its project's secret was rotated); with `WWW-Authenticate: Bearer`"),
    PermissionDenied = ("permission_denied", 403, PermissionDenied,
        "the key lacks the scope (the detail names it) or belongs to another project; a run token used on \
         anything but a run or the OpenAPI document of an endpoint it names"),
    NotFound = ("not_found", 404, NotFound, "unknown endpoint, version or path"),
    MethodNotAllowed = ("method_not_allowed", 405, ValidationError,
        "the method is not served on this path; `Allow` lists those that are"),
    NotAcceptable = ("not_acceptable", 406, ValidationError,
        "a run's `Accept` names no format the service writes (JSON, CSV, NDJSON, Parquet, Arrow) and no `format` is \
         given; an MCP request that does not accept both `application/json` and `text/event-stream`"),
    RequestTimeout = ("request_timeout", 408, ValidationError,
        "the request's head or body did not arrive within `--client-timeout-secs` (10 s)"),
    Unique = ("unique", 409, Conflict, "`name` is already used in the project; `attr: name`"),
    InUse = ("in_use", 409, Conflict,
        "a table that the current version of endpoints reads cannot be deleted; the detail names them"),
    IdempotencyConflict = ("idempotency_conflict", 409, Conflict,
        "an append's `Idempotency-Key` was used within 24 hours with another body, or the append first sent with \
         it is still being written (retry shortly); nothing was added"),
    BreakingChange = ("breaking_change", 409, Conflict,
        "a PATCH's new query removes or retypes output columns of an endpoint that ran within the last 7 days; \
         nothing changed, `breaking_changes` lists them; send `confirm_breaking: true` to save it"),
    CursorExpired = ("cursor_expired", 410, NotFound,
        "a run's `cursor` is older than `--cursor-ttl` (1 hour), or pinned table versions that are no longer kept; \
         run again without it for a new first page; `attr: cursor`"),
    PayloadTooLarge = ("payload_too_large", 413, ValidationError,
        "the body is over its limit: 1 MiB of JSON, or `--max-upload-mb` (1 GiB) of a table's rows"),
    UnsupportedMediaType = ("unsupported_media_type", 415, ValidationError,
        "a body whose `Content-Type` the route does not read: JSON, or a table's CSV, NDJSON or Parquet"),
    Throttled = ("throttled", 429, Throttled,
        "the project already runs its maximum of queries (`--max-queries-per-project`, 4: runs, dry runs, the \
         planning of a created or updated endpoint and exports together), the memory all queries share \
         (`--max-memory`) is held by others now, or an exported page does not fit the spool \
         (`--max-export-spool`); `Retry-After` says when to retry"),
    RateLimited = ("rate_limited", 429, Throttled,
        "the key or run token (100 requests/s), a run token's own `rate_limit_per_sec`, or the project (500/s) is \
         over its request rate, or the client's address over `--auth-failures-per-sec` failed authentications \
         (its credential is not read until it may try again); `Retry-After` says when to retry"),
    ClientClosedRequest = ("client_closed_request", 499, QueryError,
        "the client closed the connection while its query ran; the query was cancelled and nobody reads this"),
    Error = ("error", 500, ServerError, "a bug; the detail is generic and the cause is only logged"),
    Unavailable = ("unavailable", 503, ServerError,
        "the database or the engine cannot be reached; cached runs may still answer"),
}

impl From<Violation> for Code {
    fn from(violation: Violation) -> Self {
        match violation {
            Violation::Invalid => Code::Invalid,
            Violation::Required => Code::Required,
            Violation::UnknownVariable => Code::UnknownVariable,
            Violation::FixedVariable => Code::FixedVariable,
        }
    }
}

/// The body of every error answer.
// Written from borrowed parts; read back (by clients and the API tests) as owned ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody<'a> {
    #[serde(rename = "type")]
    #[schema(inline)]
    pub kind: ErrorType,
    #[schema(inline)]
    pub code: Code,
    /// A sentence for a person.
    #[schema(value_type = String)]
    pub detail: Cow<'a, str>,
    /// The offending field as a dotted path (`variables.country`), or null.
    #[schema(value_type = Option<String>, required = true)]
    pub attr: Option<Cow<'a, str>>,
    /// With `breaking_change` only: what the refused version would break, as its version record would list it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<crate::api::BreakingChange>>, inline)]
    pub breaking_changes: Option<Cow<'a, serde_json::Value>>,
}

/// An error response. Domain errors convert into it; the adapter adds its own HTTP-level ones.
#[derive(Debug)]
pub enum ApiError {
    Domain(Error),
    PayloadTooLarge {
        limit: usize,
    },
    UnsupportedMediaType,
    /// An upload in a format tables are not read from.
    UnsupportedUpload,
    /// The client accepts no format a run is written in.
    NotAcceptable,
    /// An MCP request that does not accept both of the streamable HTTP transport's answers.
    McpNotAcceptable,
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

impl ApiError {
    pub(crate) fn bad_query(err: &dyn std::fmt::Display) -> Self {
        Invalid::whole(format!("The query string could not be read: {err}.")).into()
    }

    pub fn code(&self) -> Code {
        match self {
            ApiError::Domain(err) => match err {
                Error::Invalid(invalid) => invalid.code.into(),
                Error::NotAuthenticated(_) => Code::NotAuthenticated,
                Error::PermissionDenied(_) => Code::PermissionDenied,
                Error::NotFound(_) => Code::NotFound,
                Error::NameTaken(_) => Code::Unique,
                Error::InUse(_) => Code::InUse,
                Error::IdempotencyConflict(_) => Code::IdempotencyConflict,
                Error::BreakingChange { .. } => Code::BreakingChange,
                Error::PayloadTooLarge { .. } => Code::PayloadTooLarge,
                Error::QueryInvalid(_) => Code::QueryInvalid,
                Error::QueryTimeout(_) => Code::QueryTimeout,
                Error::QueryMemoryLimit(_) => Code::QueryMemoryLimit,
                Error::ResultTooLarge { .. } => Code::ResultTooLarge,
                Error::Throttled { .. } => Code::Throttled,
                Error::CursorExpired(_) => Code::CursorExpired,
                Error::Unavailable(_) => Code::Unavailable,
                Error::Internal(_) => Code::Error,
            },
            ApiError::PayloadTooLarge { .. } => Code::PayloadTooLarge,
            ApiError::UnsupportedMediaType | ApiError::UnsupportedUpload => Code::UnsupportedMediaType,
            ApiError::NotAcceptable | ApiError::McpNotAcceptable => Code::NotAcceptable,
            ApiError::MalformedJson(_) => Code::ParseError,
            ApiError::MethodNotAllowed { .. } => Code::MethodNotAllowed,
            ApiError::RouteNotFound => Code::NotFound,
            ApiError::BodyTimeout { .. } => Code::RequestTimeout,
            ApiError::RateLimited { .. } => Code::RateLimited,
            ApiError::ClientClosed => Code::ClientClosedRequest,
        }
    }

    /// The sentence a client reads: never a cause chain, a path or SQL internals.
    pub(crate) fn detail(&self) -> Cow<'_, str> {
        match self {
            ApiError::Domain(err) => match err {
                Error::Invalid(invalid) => Cow::Borrowed(&invalid.detail),
                Error::NotAuthenticated(detail)
                | Error::PermissionDenied(detail)
                | Error::NotFound(detail)
                | Error::InUse(detail)
                | Error::IdempotencyConflict(detail)
                | Error::CursorExpired(detail)
                | Error::BreakingChange { detail, .. } => Cow::Borrowed(detail),
                Error::QueryInvalid(reason) => Cow::Owned(format!(
                    "The endpoint's query no longer plans against its tables: {}. Change the query or the table.",
                    reason.trim_end_matches('.')
                )),
                Error::QueryMemoryLimit(_) => {
                    Cow::Owned(format!("The query needed more memory than allowed: {err}"))
                }
                Error::Unavailable(_) => {
                    Cow::Borrowed("A service this request depends on is unavailable. Try again shortly.")
                }
                Error::Internal(_) => {
                    Cow::Borrowed("Something went wrong on our side. The error has been logged.")
                }
                Error::NameTaken(_)
                | Error::PayloadTooLarge { .. }
                | Error::QueryTimeout(_)
                | Error::ResultTooLarge { .. }
                | Error::Throttled { .. } => Cow::Owned(err.to_string()),
            },
            ApiError::PayloadTooLarge { limit } => {
                Cow::Owned(format!("The request body exceeds the limit of {limit} bytes."))
            }
            ApiError::UnsupportedMediaType => {
                Cow::Borrowed("The request body must be JSON, sent with 'Content-Type: application/json'.")
            }
            ApiError::UnsupportedUpload => Cow::Borrowed(
                "A table's rows are sent as 'Content-Type: text/csv' (with a header row), \
                 'application/x-ndjson' or 'application/vnd.apache.parquet'.",
            ),
            ApiError::NotAcceptable => {
                let all = domain::ResultFormat::ALL;
                Cow::Owned(format!(
                    "A run is written as {}; Accept names none of them. Accept one, or pass format={}.",
                    all.map(domain::ResultFormat::media_type).join(", "),
                    all.map(domain::ResultFormat::as_str).join("|"),
                ))
            }
            ApiError::McpNotAcceptable => Cow::Borrowed(
                "An MCP client sends 'Accept: application/json, text/event-stream' (the streamable HTTP transport).",
            ),
            ApiError::MalformedJson(reason) => {
                Cow::Owned(format!("The request body is not valid JSON: {reason}."))
            }
            ApiError::MethodNotAllowed { .. } => Cow::Borrowed("This method is not allowed on this path."),
            ApiError::RouteNotFound => Cow::Borrowed("There is nothing at this path."),
            ApiError::BodyTimeout { timeout } => {
                Cow::Owned(format!("The request body did not arrive within {} s.", timeout.as_secs_f64()))
            }
            ApiError::RateLimited { scope: "address", retry_after } => Cow::Owned(format!(
                "Too many failed authentications from this address; retry after {} s.",
                retry_seconds(*retry_after)
            )),
            ApiError::RateLimited { scope, retry_after } => Cow::Owned(format!(
                "Too many requests for this {}; retry after {} s.",
                match *scope {
                    "key" => "API key",
                    "token" => "run token",
                    _ => "project",
                },
                retry_seconds(*retry_after)
            )),
            ApiError::ClientClosed => {
                Cow::Borrowed("The client closed the connection; its query was cancelled.")
            }
        }
    }

    /// The offending field, when one is to blame.
    fn attr(&self) -> Option<&str> {
        match self {
            ApiError::Domain(Error::Invalid(invalid)) => invalid.attr.as_deref(),
            ApiError::Domain(Error::NameTaken(_)) => Some("name"),
            ApiError::Domain(Error::ResultTooLarge { .. }) => Some("limit"),
            ApiError::Domain(Error::CursorExpired(_)) => Some("cursor"),
            ApiError::Domain(Error::QueryInvalid(_) | Error::BreakingChange { .. }) => Some("query"),
            _ => None,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail())
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
    whole_seconds(wait).max(1)
}

/// A duration in whole seconds, rounded up.
pub(crate) fn whole_seconds(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
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
        self.code().status()
    }

    fn error_response(&self) -> HttpResponse {
        let code = self.code();
        self.log_server_error();
        let mut response = HttpResponse::build(code.status());
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
        response.json(self.body())
    }
}

impl ApiError {
    /// A server-side failure (500, 503) is logged with its cause, which its answer never shows.
    pub(crate) fn log_server_error(&self) {
        if let ApiError::Domain(err @ (Error::Internal(_) | Error::Unavailable(_))) = self {
            tracing::error!(status = self.code().status().as_u16(), error = %chain(err), "request failed");
        }
    }

    /// The error body (`type`, `code`, `detail`, `attr`), as every error answer and every failed MCP tool call
    /// carries it.
    pub(crate) fn body(&self) -> serde_json::Value {
        let code = self.code();
        let detail = self.detail();
        let breaking_changes = match self {
            ApiError::Domain(Error::BreakingChange { changes, .. }) => Some(changes),
            _ => None,
        };
        let body = ErrorBody {
            kind: code.kind(),
            code,
            detail: Cow::Borrowed(&detail),
            attr: self.attr().map(Cow::Borrowed),
            breaking_changes: breaking_changes.map(Cow::Borrowed),
        };
        serde_json::to_value(body).expect("an error body is plain strings and numbers")
    }
}

/// The error table of `docs/api.md`, as this table gives it.
#[cfg(test)]
pub(crate) fn markdown_table() -> String {
    let mut table = String::from("| Status | `type` | `code` | When |\n|---|---|---|---|\n");
    for code in Code::ALL {
        let kind = serde_json::to_value(code.kind()).unwrap_or_default();
        table.push_str(&format!(
            "| {} | `{}` | `{}` | {} |\n",
            code.status().as_u16(),
            kind.as_str().unwrap_or_default(),
            code.as_str(),
            code.when()
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_written_as_its_table_says() {
        for code in Code::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
        let names: std::collections::HashSet<_> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), Code::ALL.len(), "each code once");
    }

    /// The domain says a failure's code and status for records of failures no request answered (a refresh's
    /// log record): they are the ones its answer would have.
    #[test]
    fn the_domain_names_each_failure_as_it_is_answered() {
        use domain::{Invalid, Violation};
        let errors = vec![
            Error::Invalid(Invalid::field("x", "bad")),
            Error::Invalid(Invalid::required("x")),
            Error::Invalid(Invalid::new("x", Violation::UnknownVariable, "?")),
            Error::Invalid(Invalid::new("x", Violation::FixedVariable, "?")),
            Error::NotAuthenticated(String::new()),
            Error::PermissionDenied(String::new()),
            Error::NotFound(String::new()),
            Error::NameTaken(String::new()),
            Error::InUse(String::new()),
            Error::IdempotencyConflict(String::new()),
            Error::BreakingChange { detail: String::new(), changes: serde_json::Value::Null },
            Error::PayloadTooLarge { limit_bytes: 1 },
            Error::QueryInvalid(String::new()),
            Error::QueryTimeout(std::time::Duration::ZERO),
            Error::QueryMemoryLimit(String::new()),
            Error::ResultTooLarge { limit_bytes: 1 },
            Error::Throttled { retry_after: std::time::Duration::ZERO },
            Error::CursorExpired(String::new()),
            Error::Unavailable("down".into()),
            Error::Internal("bug".into()),
        ];
        for error in errors {
            let (code, status) = error.code_and_status();
            let answered = ApiError::from(error).code();
            assert_eq!((code, status), (answered.as_str(), answered.status().as_u16()));
        }
        // A run whose client went away is recorded as this adapter answers it.
        let closed = ApiError::ClientClosed.code();
        assert_eq!(domain::CANCELLED, (closed.as_str(), closed.status().as_u16()));
    }

    /// The documentation's error table is this table: a code added, removed or changed here without the
    /// documentation fails.
    #[test]
    fn the_documented_error_table_is_the_code_table() {
        let doc = include_str!("../../../docs/api.md");
        let table = markdown_table();
        assert!(doc.contains(&table), "docs/api.md must hold the error table exactly as:\n{table}");
    }
}
