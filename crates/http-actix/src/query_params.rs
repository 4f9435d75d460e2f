//! Unknown query parameters are refused (400 naming the first), as unknown body fields are: a misspelt
//! `?limti=10` would otherwise be ignored and its client never learn why its page is not ten rows.
//!
//! What a route reads is what its operation declares in the service's own document ([`crate::service_doc`]), so
//! that the documented parameters and the accepted ones are one list. The check is one middleware on each
//! family's scope, for every route but runs; a GET run's parameters are refused by the run's own reader
//! ([`crate::handlers::run_request::from_query`]) as it reads them, which spares the hot path a second
//! matching of its route, and a POST run's by [`refuse_unknown`] with its one declared parameter.

use std::collections::HashMap;
use std::sync::LazyLock;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::ResponseError;
use domain::Invalid;
use utoipa::openapi::path::ParameterIn;

use crate::error::ApiError;

/// A GET run's variables may also come one per parameter, `variables.NAME=value`, wherever `variables` is read.
pub(crate) const VARIABLE_PREFIX: &str = "variables.";

/// Each operation's query parameters by its path pattern (as the router writes it) and method.
static DECLARED: LazyLock<HashMap<(String, Method), Vec<String>>> = LazyLock::new(|| {
    let doc = crate::service_doc::document();
    let mut declared = HashMap::new();
    for (path, item) in doc.paths.paths {
        let operations = [
            (Method::GET, item.get),
            (Method::POST, item.post),
            (Method::PUT, item.put),
            (Method::PATCH, item.patch),
            (Method::DELETE, item.delete),
        ];
        for (method, operation) in operations {
            let Some(operation) = operation else { continue };
            let names = operation
                .parameters
                .into_iter()
                .flatten()
                .filter(|parameter| parameter.parameter_in == ParameterIn::Query)
                .map(|parameter| parameter.name)
                .collect();
            declared.insert((path.clone(), method), names);
        }
    }
    declared
});

/// The query parameters the operation at `pattern` (a route's pattern, `/api/projects/{project_id}/...`) with
/// `method` declares; `None` for a route the document does not describe.
pub(crate) fn declared(pattern: &str, method: &Method) -> Option<&'static [String]> {
    DECLARED.get(&(pattern.to_owned(), method.clone())).map(Vec::as_slice)
}

/// Refuses the first parameter of `query` (a raw query string) that `allowed` does not name.
///
/// # Errors
/// [`Invalid`] naming the parameter and listing the allowed ones.
pub(crate) fn refuse_unknown<S: AsRef<str>>(query: &str, allowed: &[S]) -> Result<(), Invalid> {
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if !known(&key, &value, allowed) {
            return Err(unknown(&key, allowed));
        }
    }
    Ok(())
}

/// Whether a parameter is one of `allowed`: by name, or as one variable where `variables` is allowed. A bare
/// `&` (an empty name without a value) is no parameter.
fn known<S: AsRef<str>>(key: &str, value: &str, allowed: &[S]) -> bool {
    (key.is_empty() && value.is_empty())
        || allowed.iter().any(|name| {
            let name = name.as_ref();
            name == key || (name == "variables" && key.starts_with(VARIABLE_PREFIX))
        })
}

/// The answer to a parameter no operation of the route reads.
pub(crate) fn unknown<S: AsRef<str>>(key: &str, allowed: &[S]) -> Invalid {
    let shown: String = key.chars().take(64).collect();
    let detail = if allowed.is_empty() {
        format!("Unknown query parameter '{shown}'. This operation reads no query parameters.")
    } else {
        let names: Vec<&str> = allowed.iter().map(AsRef::as_ref).collect();
        format!("Unknown query parameter '{shown}'. Allowed parameters: {}.", names.join(", "))
    };
    Invalid::field(shown, detail)
}

/// In front of each family's routes (runs excepted): a request naming a parameter its operation does not
/// declare is answered 400 before it reaches its handler. A request without a query string costs nothing.
pub(crate) async fn known_only(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    if !req.query_string().is_empty() {
        let allowed = req.match_pattern().and_then(|pattern| declared(&pattern, req.method()));
        if let Some(allowed) = allowed {
            if let Err(invalid) = refuse_unknown(req.query_string(), allowed) {
                let response = ApiError::from(invalid).error_response();
                return Ok(req.into_response(response).map_into_right_body());
            }
        }
    }
    Ok(next.call(req).await?.map_into_left_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_known_by_name_or_as_a_variable() {
        let allowed = ["limit", "variables"];
        assert!(refuse_unknown("limit=5&variables.region=eu&&", &allowed).is_ok());
        let err = refuse_unknown("limit=5&limti=10", &allowed).unwrap_err();
        assert_eq!(err.attr.as_deref(), Some("limti"));
        assert!(err.detail.contains("Allowed parameters: limit, variables."), "{}", err.detail);
        let err = refuse_unknown("variables.x=1", &["limit"]).unwrap_err();
        assert_eq!(err.attr.as_deref(), Some("variables.x"));
        let err = refuse_unknown("%6Cimti=1", &[] as &[&str]).unwrap_err();
        assert_eq!(err.attr.as_deref(), Some("limti"), "names are decoded before they are compared");
        assert!(err.detail.contains("reads no query parameters"), "{}", err.detail);
        let long = "x".repeat(10_000);
        let err = refuse_unknown(&format!("{long}=1"), &["limit"]).unwrap_err();
        assert!(err.detail.len() < 200, "a huge name is not echoed whole");
        assert!(refuse_unknown("=1", &["limit"]).is_err(), "an empty name with a value is not a parameter");
    }

    #[test]
    fn the_document_declares_every_routes_parameters() {
        let list = declared("/api/projects/{project_id}/endpoints", &Method::GET).unwrap();
        for name in ["limit", "offset", "is_active", "is_materialized", "search"] {
            assert!(list.iter().any(|n| n == name), "{name} in {list:?}");
        }
        assert!(declared("/api/environments/{project_id}/endpoints", &Method::GET).is_some());
        let retrieve = declared("/api/projects/{project_id}/endpoints/{name}", &Method::GET).unwrap();
        assert!(retrieve.is_empty(), "{retrieve:?}");
        assert!(declared("/metrics", &Method::GET).is_none());
    }
}
