//! The endpoint service's business rules: endpoint names, queries and their variables, versions, settings,
//! API keys and scopes, and the services that apply them through trait ports.
//!
//! This crate owns every rule of the product and must not know how it is served or stored: it depends on no web
//! framework, database driver, query engine or async runtime. Adapters implement [`ports`]; the binary wires them.

pub mod auth;
pub mod changes;
pub mod endpoint;
pub mod error;
pub mod executions;
pub mod fields;
pub mod materialization;
pub mod materializer;
pub mod page;
pub mod ports;
pub mod query;
pub mod run;
pub mod run_service;
pub mod service;
pub mod settings;

pub use auth::{ApiKey, ApiKeyService, NewApiKey, Principal, Project, ProjectId, Scope};
pub use changes::KeptState;
pub use endpoint::{ByEndpoint, Column, ColumnType, Endpoint, EndpointName, EndpointVersion};
pub use error::{Error, Invalid};
pub use executions::ExecutionTracker;
pub use materialization::{Eligibility, MaterializationStatus, MaterializationView};
pub use materializer::Materializer;
pub use page::{Page, PageRequest};
pub use query::{Query, QueryKind, Variable, VariableType};
pub use run::{BoundValue, QueryResult, Refresh, RunRequest};
pub use run_service::{LastExecutions, RunOutcome, RunService};
pub use service::EndpointService;
pub use settings::{CacheAge, SyncFrequency};

/// Timestamps are UTC instants throughout the domain.
pub type Timestamp = time::OffsetDateTime;

#[cfg(test)]
mod properties;
