//! Endpoints: named, versioned saved queries with their cache and sync settings, the store they live in, and
//! the rules of creating, changing and deleting them. Last execution times are kept here too: they are part of
//! the endpoint record.

mod commands;
mod executions;
mod model;
mod ports;
mod service;
mod settings;

pub use commands::{CreateEndpoint, EndpointPatch, CONFIRM_BREAKING, ENDPOINT_FIELDS};
pub use executions::ExecutionTracker;
pub use model::{
    BreakingChange, ByEndpoint, ColumnChange, Endpoint, EndpointChange, EndpointFilter, EndpointName,
    EndpointVersion, NewEndpoint, NewVersion, PlannedQuery, Replanned, TableReader,
};
pub use ports::{EndpointChanges, EndpointStore, TableReadersChanged};
#[cfg(any(test, feature = "mocks"))]
pub use ports::{MockEndpointChanges, MockEndpointStore, MockTableReadersChanged};
pub use service::{EndpointDeps, EndpointService, BREAKING_WINDOW};
pub use settings::{CacheAge, Freshness, Hibernation, SyncFrequency};
