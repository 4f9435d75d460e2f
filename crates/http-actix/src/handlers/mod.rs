//! Request handlers, one file per resource group. Each is given its caller's project by the `extract`
//! extractors, calls one domain service method and answers with one body type of `api`.

pub(crate) mod endpoints;
pub(crate) mod logs;
pub(crate) mod materialization;
pub(crate) mod projects;
pub(crate) mod run_request;
pub(crate) mod runs;
pub(crate) mod tables;
pub(crate) mod tokens;
pub(crate) mod versions;

use std::collections::HashMap;

use domain::{EndpointFilter, EndpointName, Invalid};
use serde::Deserialize;

/// The endpoint a path names (`{name}`).
#[derive(Deserialize)]
pub(crate) struct EndpointPath {
    pub(crate) name: String,
}

impl EndpointPath {
    /// The endpoint's name: one that cannot be valid names no endpoint (404).
    pub(crate) fn endpoint(&self) -> Result<EndpointName, domain::Error> {
        EndpointName::from_path(&self.name)
    }
}

/// A query string's parameters by name.
pub(crate) type Query = actix_web::web::Query<HashMap<String, String>>;

/// A boolean query-string parameter: `true`/`false` (also `1`/`0`), absent when not sent.
///
/// # Errors
/// [`Invalid`] naming `key` for any other text.
pub(crate) fn bool_param(query: &HashMap<String, String>, key: &str) -> Result<Option<bool>, Invalid> {
    let Some(raw) = query.get(key) else { return Ok(None) };
    match raw.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(Some(true)),
        "false" | "0" => Ok(Some(false)),
        _ => Err(Invalid::field(key, format!("{key} must be true or false."))),
    }
}

/// The page a list's `limit` and `offset` ask for.
pub(crate) fn page_param(query: &HashMap<String, String>) -> Result<domain::PageRequest, Invalid> {
    let param = |key: &str| query.get(key).map(String::as_str);
    domain::PageRequest::parse(param("limit"), param("offset"))
}

/// The endpoint list's filters: `is_active`, `is_materialized`, `search` (blank is no filter).
pub(crate) fn endpoint_filter(query: &HashMap<String, String>) -> Result<EndpointFilter, Invalid> {
    Ok(EndpointFilter {
        is_active: bool_param(query, "is_active")?,
        is_materialized: bool_param(query, "is_materialized")?,
        search: query.get("search").map(|s| s.trim()).filter(|s| !s.is_empty()).map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn list_parameters_become_a_page_and_filters() {
        let sent = query(&[("limit", "5"), ("offset", "10"), ("is_active", "false"), ("search", " rev ")]);
        assert_eq!(page_param(&sent).unwrap(), domain::PageRequest { limit: 5, offset: 10 });
        let filter = endpoint_filter(&sent).unwrap();
        assert_eq!(
            filter,
            EndpointFilter { is_active: Some(false), search: Some("rev".into()), ..Default::default() }
        );
        assert_eq!(endpoint_filter(&query(&[("search", "  ")])).unwrap(), EndpointFilter::default());
        assert_eq!(bool_param(&query(&[("dry_run", "1")]), "dry_run").unwrap(), Some(true));
        for (sent, attr) in [
            (query(&[("limit", "0")]), "limit"),
            (query(&[("limit", "1001")]), "limit"),
            (query(&[("offset", "-3")]), "offset"),
        ] {
            assert_eq!(page_param(&sent).unwrap_err().attr.as_deref(), Some(attr));
        }
        let maybe = endpoint_filter(&query(&[("is_materialized", "maybe")])).unwrap_err();
        assert_eq!(maybe.attr.as_deref(), Some("is_materialized"));
    }
}
