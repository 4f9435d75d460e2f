//! Black-box tests: the real application wiring on port 0, spoken to over HTTP, with projects and keys made by
//! the real `endpoints` binary. One test binary, one module per area.

// A failed step of a test fails the test: its helpers unwrap as its test functions do.
#![allow(clippy::unwrap_used)]

mod as_code;
mod auth;
mod cli;
mod console;
mod crud;
#[cfg(feature = "ballista")]
mod distributed;
mod errors;
mod faults;
mod helpers;
mod isolation;
mod logs;
mod materialization;
mod openapi;
mod operations;
mod runs;
mod scaling;
mod snapshots;
mod storage;
mod stress;
mod tables;
mod telemetry;
mod tokens;
mod upgrade;
mod versions;
