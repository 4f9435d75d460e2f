//! The HTTP adapter: actix-web routes for both path families, bearer-key authentication, JSON bodies with size
//! and type checks, the API's bodies as types with their OpenAPI schemas, and one table of error codes.
//!
//! Handlers are given an authorized caller (and body) by an extractor, call one domain service method and
//! answer with one body type. No business rule lives here, and nothing here knows which store or engine sits
//! behind the ports.

pub mod api;
mod asking;
mod console;
mod cors;
mod disconnect;
mod error;
mod extract;
mod handlers;
mod mcp;
mod normalize;
mod openapi;
mod operations;
mod paths;
mod query_params;
mod rate_limit;
mod request_context;
mod routes;
mod run_metrics;
mod service_doc;

use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::from_fn;
use actix_web::{web, App};
use domain::{ApiKeyService, EndpointService, LogService, RunService, TableService};

pub use disconnect::on_connect;
pub use error::{ApiError, Code, ErrorBody, ErrorType};
pub use operations::{Metrics, Operations, ReadinessCheck};
pub use rate_limit::{Rate, RateLimitConfig, RateLimits};
pub use request_context::RequestContext;
pub use run_metrics::{MeteredRunLog, RunMetrics};

/// Largest accepted request body.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// Largest accepted upload of a table's rows, by default.
pub const DEFAULT_UPLOAD_LIMIT: u64 = 1024 * 1024 * 1024;

/// How long a client has to send a request body, by default.
pub const DEFAULT_CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub endpoints: Arc<EndpointService>,
    pub runs: Arc<RunService>,
    pub keys: Arc<ApiKeyService>,
    pub tables: Arc<TableService>,
    /// Where runs are logged, and their logs read.
    pub logs: Arc<LogService>,
    pub body_limit: usize,
    /// Largest upload of a table's rows (413 past it).
    pub upload_limit: u64,
    /// How long a client has to send a request body (408 after it).
    pub client_timeout: std::time::Duration,
    /// Readiness checks and metrics.
    pub operations: Arc<Operations>,
    /// Request rate limits per key and per project (none by default).
    pub rate_limits: Arc<RateLimits>,
}

impl AppState {
    /// The state with no readiness checks and metrics of its own.
    pub fn new(
        endpoints: Arc<EndpointService>,
        runs: Arc<RunService>,
        keys: Arc<ApiKeyService>,
        tables: Arc<TableService>,
        logs: Arc<LogService>,
    ) -> Self {
        Self {
            endpoints,
            runs,
            keys,
            tables,
            logs,
            body_limit: DEFAULT_BODY_LIMIT,
            upload_limit: DEFAULT_UPLOAD_LIMIT,
            client_timeout: DEFAULT_CLIENT_TIMEOUT,
            operations: Arc::default(),
            rate_limits: Arc::default(),
        }
    }

    #[must_use]
    pub fn with_rate_limits(mut self, limits: Arc<RateLimits>) -> Self {
        self.rate_limits = limits;
        self
    }

    #[must_use]
    pub fn with_operations(mut self, operations: Operations) -> Self {
        self.operations = Arc::new(operations);
        self
    }
}

/// The whole HTTP application: routes of both families, with or without trailing slash.
pub fn app(
    state: AppState,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let keys = Arc::clone(&state.keys);
    let mcp = mcp::Mcp::new(&state);
    App::new()
        .app_data(web::Data::new(mcp))
        .app_data(web::Data::new(state))
        .app_data(web::QueryConfig::default().error_handler(|err, _| ApiError::bad_query(&err).into()))
        .app_data(web::PathConfig::default().error_handler(|err, _| ApiError::bad_query(&err).into()))
        .configure(move |cfg| routes::configure(cfg, &keys))
        .wrap(from_fn(request_context::request_context))
}

#[cfg(test)]
mod tests;
