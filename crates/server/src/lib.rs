//! The `endpoints` binary's library: configuration, the wiring of adapters into a running application, and the
//! operator's commands (projects, keys, migrations, demo setup).
//!
//! This is the only crate that knows every adapter. It holds no business rule: it builds ports, hands them to
//! the domain services and serves them over HTTP.

pub mod cli;
pub mod config;
pub mod operations;
pub mod startup;
pub mod telemetry;
pub mod worker;

pub use config::{Config, RunLogConfig, ServiceClock};
pub use startup::{Application, StartupError};
