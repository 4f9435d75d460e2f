//! Trailing and repeated slashes: `/endpoints/` and `//endpoints` reach the same route as `/endpoints`.
//!
//! actix-web's `NormalizePath` runs a regular expression over every path; almost no request needs a change,
//! so this checks the bytes first and rewrites only the paths that do.

use actix_web::dev::ServiceRequest;
use actix_web::http::uri::{PathAndQuery, Uri};

/// The path without trailing slashes and with runs of slashes merged, or `None` when it is already so.
pub(crate) fn normalized(path: &str) -> Option<String> {
    let needs = path.len() > 1 && (path.ends_with('/') || path.contains("//"));
    if !needs {
        return None;
    }
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    while out.len() > 1 && out.ends_with('/') {
        out.pop();
    }
    Some(out)
}

/// Rewrites the request's path when [`normalized`] changes it (the request-context middleware calls it first,
/// before routing).
pub(crate) fn trim_slashes(req: &mut ServiceRequest) {
    let Some(path) = normalized(req.path()) else { return };
    let mut parts = req.head().uri.clone().into_parts();
    let rebuilt = match parts.path_and_query.as_ref().and_then(PathAndQuery::query) {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    // A path made only of valid path characters stays valid with fewer slashes.
    if let Ok(path_and_query) = PathAndQuery::try_from(rebuilt) {
        parts.path_and_query = Some(path_and_query);
        if let Ok(uri) = Uri::from_parts(parts) {
            req.match_info_mut().get_mut().update(&uri);
            req.head_mut().uri = uri;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::normalized;

    #[test]
    fn only_paths_that_need_it_change() {
        for unchanged in ["/", "/api/projects/1/endpoints", "/api/projects/1/endpoints/kpi/run"] {
            assert_eq!(normalized(unchanged), None, "{unchanged}");
        }
        for (raw, want) in [
            ("/api/projects/1/endpoints/", "/api/projects/1/endpoints"),
            ("/api//projects/1///endpoints//", "/api/projects/1/endpoints"),
            ("//", "/"),
            ("/a/", "/a"),
        ] {
            assert_eq!(normalized(raw).as_deref(), Some(want), "{raw}");
        }
    }
}
