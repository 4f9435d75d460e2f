//! Endpoints: named, versioned saved queries with their cache and sync settings, the store they live in, and
//! the rules of creating, changing and deleting them. Last execution times are kept here too: they are part of
//! the endpoint record.

mod executions;
mod model;
mod ports;
mod service;
mod settings;

pub use executions::ExecutionTracker;
pub use model::{
    BreakingChange, ByEndpoint, ColumnChange, Endpoint, EndpointChange, EndpointFilter, EndpointName,
    EndpointVersion, NewEndpoint, PlannedQuery, Replanned,
};
pub use ports::{EndpointChanges, EndpointStore};
#[cfg(any(test, feature = "mocks"))]
pub use ports::{MockEndpointChanges, MockEndpointStore};
pub use service::{
    EndpointDeps, EndpointService, ListParams, BREAKING_WINDOW, CONFIRM_BREAKING, ENDPOINT_FIELDS,
};
pub use settings::{CacheAge, SyncFrequency};
