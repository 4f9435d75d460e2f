//! The endpoint service's business rules: endpoint names, queries and their variables, versions, settings,
//! API keys and scopes, materialization and runs, and the services that apply them through trait ports.
//!
//! This crate owns every rule of the product and must not know how it is served or stored: it depends on no web
//! framework, database driver, query engine or async runtime. Adapters implement its ports; the binary wires
//! them.
//!
//! It is laid out in subdomains, each with its model, its ports and its service, and each using only those
//! before it: `access` (projects, keys, scopes), `query` (the saved SQL, its variables, what the engine tells
//! of it), `logs` (the record of runs and refreshes), `endpoints`, `materialization`, `tables`, `runs`. Beneath them all sit `error`, `clock`, `fields`,
//! `page`, `version`, `recent` (what is read from the store, kept for a short while) and `propagation` (how a
//! change saved here is waited for on the other processes); above them `changes`,
//! which clears what a process keeps in memory. One edge goes back: `endpoints` reads `materialization`'s model and ports,
//! because an endpoint record carries its materialization and deleting an endpoint removes its stored results
//! (docs/architecture.md). `make lint` checks the order.
//!
//! Services take typed commands (`CreateEndpoint`, `EndpointPatch`, `EndpointFilter` with a `PageRequest`,
//! `VersionNumber`, `RunRequest`, `ProjectRef`) and answer domain values; adapters read their wire formats into
//! them (the interface's JSON bodies through `TryFrom<&serde_json::Value>`). The rules are decided here and only
//! carried out by adapters: a changed query becomes a `NewVersion` the store saves, the engine reports a query's
//! outline as domain types (`AggregateKind`, opaque key names) and lays out the `StoredColumn`s the rule names,
//! and `Principal::permits` says who may do what.
//!
//! `examples/embedded.rs` embeds the services with in-memory adapters (a store, a cache and a small engine) and
//! creates, versions and runs an endpoint: `cargo run -p domain --example embedded`.
//!
//! Everything public is re-exported here, and adapters name it from here: `domain::Endpoint`, not a
//! subdomain's path, which stays private.

mod access;
mod changes;
mod clock;
mod endpoints;
mod error;
mod fields;
mod logs;
mod materialization;
mod page;
mod propagation;
mod query;
mod recent;
mod runs;
mod tables;
#[cfg(any(test, feature = "mocks"))]
pub mod testing;
mod version;

pub use access::*;
pub use changes::*;
pub use clock::*;
pub use endpoints::*;
pub use error::*;
pub use fields::*;
pub use logs::*;
pub use materialization::*;
pub use page::*;
pub use propagation::*;
pub use query::*;
pub use runs::*;
pub use tables::*;
pub use version::*;

#[cfg(test)]
mod properties;
