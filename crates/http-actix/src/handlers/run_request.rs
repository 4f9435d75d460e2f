//! A run request as the interface spells it: a GET's query parameters or a POST's JSON body, with the format
//! the client accepts (`Accept`), read into the domain's [`RunRequest`].

use domain::{Fields, Invalid, Refresh, ResultFormat, RunRequest, VersionNumber};
use serde_json::{Map, Value};

use crate::query_params::{unknown, VARIABLE_PREFIX};

/// The fields a POST body may carry.
pub(crate) const BODY_FIELDS: [&str; 12] = [
    "client_query_id",
    "format",
    "filters_override",
    "query_override",
    "refresh",
    "variables",
    "version",
    "limit",
    "offset",
    "max_staleness_seconds",
    "as_of",
    "cursor",
];

/// The parameters a GET run reads (besides `variables.NAME`), as its operations in the service's document
/// declare them.
pub(crate) const QUERY_PARAMETERS: [&str; 10] = [
    "version",
    "limit",
    "offset",
    "refresh",
    "client_query_id",
    "format",
    "max_staleness_seconds",
    "as_of",
    "cursor",
    "variables",
];

/// Reads GET query parameters: `version`, `limit`, `offset`, `refresh`, `client_query_id`, `format`,
/// `max_staleness_seconds`, `as_of`, `cursor`, `variables.NAME=value` and `variables=<JSON object>`; `accepted` is the format the client accepts, which
/// `format` overrides. Any other parameter is refused, as unknown body fields are.
///
/// # Errors
/// [`Invalid`] naming the parameter.
pub(crate) fn from_query<K: AsRef<str>, V: AsRef<str>>(
    params: impl IntoIterator<Item = (K, V)>,
    accepted: ResultFormat,
) -> Result<RunRequest, Invalid> {
    let mut request = RunRequest { format: accepted, ..RunRequest::default() };
    let mut variables = Map::new();
    let mut limit = None;
    for (key, value) in params {
        let value = value.as_ref();
        match key.as_ref() {
            "version" => request.version = Some(version(value)?),
            "limit" => limit = Some(integer("limit", value)?),
            "format" => request.format = ResultFormat::parse(value)?,
            "offset" => request.offset = RunRequest::page_offset(Some(integer("offset", value)?))?,
            "refresh" => request.refresh = Refresh::parse(value)?,
            "client_query_id" => request.client_query_id = Some(value.to_owned()),
            "as_of" => request.as_of = RunRequest::as_of(Some(value))?,
            "cursor" => request.cursor = Some(value.to_owned()),
            "max_staleness_seconds" => {
                let seconds = integer("max_staleness_seconds", value)?;
                request.max_staleness = RunRequest::max_staleness(Some(seconds))?;
            }
            "variables" => match serde_json::from_str::<Value>(value) {
                Ok(Value::Object(map)) => variables.extend(map),
                _ => {
                    return Err(Invalid::field(
                        "variables",
                        "variables must be a JSON object of NAME: value.",
                    ))
                }
            },
            "" if value.is_empty() => {}
            other => match other.strip_prefix(VARIABLE_PREFIX) {
                Some(name) => {
                    variables.insert(name.to_owned(), Value::String(value.to_owned()));
                }
                None => return Err(unknown(other, &QUERY_PARAMETERS)),
            },
        }
    }
    RunRequest::check_variable_count(&variables)?;
    request.variables = variables;
    request.limit = RunRequest::page_limit(limit, request.format)?;
    Ok(request)
}

/// Reads a POST body; `url_version` is the `?version=` of the URL (the body's `version` wins), and `accepted`
/// the format the client accepts, which the body's `format` overrides.
///
/// # Errors
/// [`Invalid`] naming the field for unknown fields, wrong types, out-of-range numbers and overrides.
pub(crate) fn from_body(
    body: &Value,
    url_version: Option<&str>,
    accepted: ResultFormat,
) -> Result<RunRequest, Invalid> {
    let fields = Fields::new(body, &BODY_FIELDS)?;
    for key in ["query_override", "filters_override"] {
        match fields.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) if map.is_empty() => {}
            Some(_) => {
                return Err(Invalid::field(
                    key,
                    format!(
                        "{key} is not supported: the saved query is the contract; pass variables instead."
                    ),
                ))
            }
        }
    }
    // A malformed `?version=` is refused even when the body names a version: it is never silently ignored.
    let url_version = url_version.map(version).transpose()?;
    let version = match fields.nullable_int("version")?.flatten() {
        Some(v) => Some(VersionNumber::from_field("version", v)?.get()),
        None => url_version,
    };
    let variables = match fields.get("variables") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(Invalid::field("variables", "variables must be an object of NAME: value.")),
    };
    RunRequest::check_variable_count(&variables)?;
    let refresh = match fields.nullable_string("refresh")?.flatten() {
        Some(raw) => Refresh::parse(&raw)?,
        None => Refresh::default(),
    };
    let format = match fields.nullable_string("format")?.flatten() {
        Some(raw) => ResultFormat::parse(&raw)?,
        None => accepted,
    };
    Ok(RunRequest {
        version,
        variables,
        limit: RunRequest::page_limit(fields.nullable_int("limit")?.flatten(), format)?,
        offset: RunRequest::page_offset(fields.nullable_int("offset")?.flatten())?,
        refresh,
        client_query_id: fields.nullable_string("client_query_id")?.flatten(),
        format,
        max_staleness: RunRequest::max_staleness(fields.nullable_int("max_staleness_seconds")?.flatten())?,
        as_of: RunRequest::as_of(fields.nullable_string("as_of")?.flatten().as_deref())?,
        cursor: fields.nullable_string("cursor")?.flatten(),
        followed: None,
    })
}

fn integer(attr: &str, raw: &str) -> Result<i64, Invalid> {
    raw.parse().map_err(|_| Invalid::field(attr, format!("{attr} must be an integer.")))
}

fn version(raw: &str) -> Result<u32, Invalid> {
    VersionNumber::parse_field("version", raw).map(VersionNumber::get)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    #[test]
    fn post_bodies_are_strict() {
        let ok = from_body(
            &json!({"variables": {"a": 1}, "version": 2, "limit": 10, "offset": 5, "refresh": "direct",
                    "client_query_id": "x", "query_override": {}, "filters_override": null}),
            Some("9"),
            ResultFormat::Json,
        )
        .unwrap();
        assert_eq!(
            (ok.version, ok.limit, ok.offset, ok.refresh),
            (Some(2), 10, 5, Refresh::Direct),
            "the body's version wins"
        );
        assert_eq!(from_body(&json!({}), Some("3"), ResultFormat::Json).unwrap().version, Some(3));
        let both = from_body(&json!({"version": 1}), Some("0"), ResultFormat::Json).unwrap_err();
        assert_eq!(
            both.attr.as_deref(),
            Some("version"),
            "a bad ?version= is refused even beside the body's"
        );
        let defaults = from_body(&json!({}), None, ResultFormat::Json).unwrap();
        assert_eq!((defaults.limit, defaults.offset, defaults.refresh), (100, 0, Refresh::Blocking));
        // An empty query string asks for what an empty body does.
        assert_eq!(from_query(Vec::<(&str, &str)>::new(), ResultFormat::Json).unwrap(), defaults);
        assert_eq!(RunRequest::default(), defaults);
        let floats =
            from_body(&json!({"version": 2.0, "limit": 10.0, "offset": 0.0}), None, ResultFormat::Json)
                .unwrap();
        assert_eq!((floats.version, floats.limit, floats.offset), (Some(2), 10, 0), "JSON Schema integers");
        let pinned = from_body(
            &json!({"as_of": "2026-11-27T09:30:00+01:00", "cursor": "abc"}),
            None,
            ResultFormat::Json,
        )
        .unwrap();
        assert_eq!(pinned.as_of.map(|at| at.unix_timestamp()), Some(1_795_768_200));
        assert_eq!(pinned.cursor.as_deref(), Some("abc"));
        let bounded = from_body(&json!({"max_staleness_seconds": 30}), None, ResultFormat::Json).unwrap();
        assert_eq!(bounded.max_staleness, Some(std::time::Duration::from_secs(30)));
        let csv = from_body(&json!({"format": "csv", "limit": 50_000}), None, ResultFormat::Json).unwrap();
        assert_eq!((csv.format, csv.limit), (ResultFormat::Csv, 50_000), "other formats page past 10,000");
        for (body, attr) in [
            (json!({"extra": 1}), "extra"),
            (json!({"limit": 10.5}), "limit"),
            (json!({"limit": 0}), "limit"),
            (json!({"limit": 10_001}), "limit"),
            (json!({"offset": -1}), "offset"),
            (json!({"version": 0}), "version"),
            (json!({"version": "1"}), "version"),
            (json!({"variables": [1]}), "variables"),
            (json!({"query_override": {"kind": "SQLQuery"}}), "query_override"),
            (json!({"filters_override": {"date_from": "-7d"}}), "filters_override"),
            (json!({"refresh": "async"}), "refresh"),
            (json!({"format": "xml"}), "format"),
            (json!({"max_staleness_seconds": -1}), "max_staleness_seconds"),
            (json!({"max_staleness_seconds": "10"}), "max_staleness_seconds"),
            (json!({"as_of": "yesterday"}), "as_of"),
            (json!({"as_of": 1_700_000_000}), "as_of"),
            (json!({"cursor": 5}), "cursor"),
        ] {
            assert_eq!(
                from_body(&body, None, ResultFormat::Json).unwrap_err().attr.as_deref(),
                Some(attr),
                "{body}"
            );
        }
    }

    #[test]
    fn query_parameters_carry_variables() {
        let params = [
            ("variables.country", "US"),
            ("variables", r#"{"n": 3}"#),
            ("limit", "7"),
            ("version", "2"),
            ("", ""),
        ];
        let request = from_query(params, ResultFormat::Json).unwrap();
        assert_eq!(request.variables["country"], json!("US"));
        assert_eq!(request.variables["n"], json!(3));
        assert_eq!((request.limit, request.version), (7, Some(2)));
        let many: Vec<(String, String)> =
            (0..=RunRequest::MAX_VARIABLES).map(|i| (format!("variables.v{i}"), "1".into())).collect();
        assert_eq!(from_query(many, ResultFormat::Json).unwrap_err().attr.as_deref(), Some("variables"));
        let many: Map<String, Value> =
            (0..=RunRequest::MAX_VARIABLES).map(|i| (format!("v{i}"), json!(1))).collect();
        let body = json!({"variables": many});
        assert_eq!(
            from_body(&body, None, ResultFormat::Json).unwrap_err().attr.as_deref(),
            Some("variables")
        );
        let bounded = from_query([("max_staleness_seconds", "0")], ResultFormat::Json).unwrap();
        assert_eq!(bounded.max_staleness, Some(std::time::Duration::ZERO));
        for (key, value) in [
            ("variables", "[1]"),
            ("limit", "x"),
            ("offset", "-1"),
            ("version", "v2"),
            ("max_staleness_seconds", "-5"),
            ("max_staleness_seconds", "soon"),
            ("as_of", "2026-13-01T00:00:00Z"),
            ("limti", "10"),
            ("utm_source", "newsletter"),
        ] {
            let attr = from_query([(key, value)], ResultFormat::Json).unwrap_err().attr;
            assert_eq!(attr.as_deref(), Some(key), "{key}={value}");
        }
    }

    #[test]
    fn the_documented_query_has_exactly_the_parameters_read() {
        let declared = |path: &str| -> std::collections::BTreeSet<&str> {
            let names = crate::query_params::declared(path, &actix_web::http::Method::GET).unwrap();
            names.iter().map(String::as_str).collect()
        };
        let read: std::collections::BTreeSet<&str> = QUERY_PARAMETERS.into_iter().collect();
        assert_eq!(declared("/api/projects/{project_id}/endpoints/{name}/run"), read);
        // An export's path names its format.
        let mut exported = declared("/api/environments/{project_id}/endpoints/{name}/run/{format}");
        exported.insert("format");
        assert_eq!(exported, read);
    }

    #[test]
    fn the_documented_body_has_exactly_the_fields_read() {
        use crate::api::requests::{run_body, BodyOf};
        let object = run_body(utoipa::openapi::ObjectBuilder::new().into(), BodyOf::Run).build();
        let documented: std::collections::BTreeSet<&str> =
            object.properties.keys().map(String::as_str).collect();
        assert_eq!(documented, BODY_FIELDS.into_iter().collect());
        // An export's is the same but `format`, which its path names, and `as_of` and `cursor`, which it
        // refuses (it reads the newest data).
        let export = run_body(utoipa::openapi::ObjectBuilder::new().into(), BodyOf::Export).build();
        let mut exported: std::collections::BTreeSet<&str> =
            export.properties.keys().map(String::as_str).collect();
        exported.extend(["format", "as_of", "cursor"]);
        assert_eq!(exported, documented);
    }

    /// A JSON value of any shape, a few levels deep.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(
                    "variables|version|limit|offset|refresh|format|[a-z]{1,3}",
                    inner,
                    0..5
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_query_string_is_read_or_refused(pairs in prop::collection::vec(("(variables\\.)?.{0,12}|limit|offset|version|refresh|variables", ".{0,16}"), 0..12)) {
            if let Ok(request) = from_query(pairs, ResultFormat::Json) {
                prop_assert!((1..=RunRequest::MAX_LIMIT).contains(&request.limit));
                prop_assert!(request.variables.len() <= RunRequest::MAX_VARIABLES);
                prop_assert!(request.version.is_none_or(|v| v >= 1));
            }
        }

        #[test]
        fn any_run_body_is_read_or_refused(body in any_json(), version in prop::option::of(".{0,6}")) {
            if let Ok(request) = from_body(&body, version.as_deref(), ResultFormat::Json) {
                prop_assert!((1..=RunRequest::MAX_LIMIT).contains(&request.limit));
                prop_assert!(request.variables.len() <= RunRequest::MAX_VARIABLES);
            }
        }
    }
}
