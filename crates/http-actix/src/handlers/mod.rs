//! Request handlers, one file per resource group. Each is given its caller's project by the `extract`
//! extractors, calls one domain service method and answers with one body type of `api`.

pub(crate) mod endpoints;
pub(crate) mod materialization;
pub(crate) mod runs;
pub(crate) mod tables;
pub(crate) mod tokens;
pub(crate) mod versions;

use serde::Deserialize;

/// The endpoint a path names (`{name}`).
#[derive(Deserialize)]
pub(crate) struct EndpointPath {
    pub(crate) name: String,
}
