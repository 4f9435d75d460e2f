//! Running an endpoint: the run request, variable binding, refresh modes and the result a run returns.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;

use crate::endpoint::{Column, ColumnType};
use crate::error::Invalid;
use crate::fields::Fields;
use crate::query::{Query, VariableType};
use crate::Timestamp;

/// How a run may use cached and materialized results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Refresh {
    /// Serve a fresh cached result, else compute now.
    #[default]
    Blocking,
    /// Compute now; the result replaces the cached one.
    ForceBlocking,
    /// Only a cached result; none is `results: null`.
    ForceCache,
    /// Compute from the live tables, bypassing the cache entirely.
    Direct,
}

impl Refresh {
    /// # Errors
    /// [`Invalid`] (attr `refresh`) for the asynchronous modes and unknown values.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        match raw {
            "blocking" => Ok(Self::Blocking),
            "force_blocking" => Ok(Self::ForceBlocking),
            "force_cache" => Ok(Self::ForceCache),
            "direct" => Ok(Self::Direct),
            "async" | "lazy_async" | "force_async" => Err(Invalid::field(
                "refresh",
                format!("refresh '{raw}' is asynchronous; this service runs synchronously: use blocking, force_blocking, force_cache or direct."),
            )),
            _ => Err(Invalid::field("refresh", "refresh must be one of blocking, force_blocking, force_cache, direct.")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Blocking => "blocking",
            Self::ForceBlocking => "force_blocking",
            Self::ForceCache => "force_cache",
            Self::Direct => "direct",
        }
    }
}

/// A validated run request.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    pub version: Option<u32>,
    /// Variable values as supplied, before binding to the declarations.
    pub variables: Map<String, Value>,
    pub limit: u32,
    pub offset: u64,
    pub refresh: Refresh,
    pub client_query_id: Option<String>,
}

/// No version named (the current one), no variables, the first page of the default size, a cached answer when
/// fresh: what an empty body or query string asks for.
impl Default for RunRequest {
    fn default() -> Self {
        Self {
            version: None,
            variables: Map::new(),
            limit: Self::DEFAULT_LIMIT,
            offset: 0,
            refresh: Refresh::default(),
            client_query_id: None,
        }
    }
}

impl RunRequest {
    pub const DEFAULT_LIMIT: u32 = 100;
    pub const MAX_LIMIT: u32 = 10_000;

    /// The most variables one run may pass (a query declares far fewer; this bounds the work of refusing).
    pub const MAX_VARIABLES: usize = 100;

    /// The fields a POST body may carry.
    pub const BODY_FIELDS: [&'static str; 8] = [
        "client_query_id",
        "filters_override",
        "query_override",
        "refresh",
        "variables",
        "version",
        "limit",
        "offset",
    ];

    /// Reads a POST body; `query_version` is the `?version=` of the URL (the body's `version` wins).
    ///
    /// # Errors
    /// [`Invalid`] naming the field for unknown fields, wrong types, out-of-range numbers and overrides.
    pub fn from_body(body: &Value, query_version: Option<&str>) -> Result<Self, Invalid> {
        let fields = Fields::new(body, &Self::BODY_FIELDS)?;
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
        let query_version = query_version.map(parse_version).transpose()?;
        let version = match fields.nullable_int("version")?.flatten() {
            Some(v) => Some(positive_version(v)?),
            None => query_version,
        };
        let variables = match fields.get("variables") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => {
                return Err(Invalid::field("variables", "variables must be an object of NAME: value."))
            }
        };
        check_count(&variables)?;
        let refresh = match fields.nullable_string("refresh")?.flatten() {
            Some(raw) => Refresh::parse(&raw)?,
            None => Refresh::default(),
        };
        Ok(Self {
            version,
            variables,
            limit: limit(fields.nullable_int("limit")?.flatten())?,
            offset: offset(fields.nullable_int("offset")?.flatten())?,
            refresh,
            client_query_id: fields.nullable_string("client_query_id")?.flatten(),
        })
    }

    /// Reads GET query parameters: `version`, `limit`, `offset`, `refresh`, `client_query_id`,
    /// `variables.NAME=value` and `variables=<JSON object>`.
    ///
    /// # Errors
    /// [`Invalid`] naming the parameter.
    pub fn from_query<K: AsRef<str>, V: AsRef<str>>(
        params: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, Invalid> {
        let mut request = Self::default();
        let mut variables = Map::new();
        for (key, value) in params {
            let value = value.as_ref();
            match key.as_ref() {
                "version" => request.version = Some(parse_version(value)?),
                "limit" => request.limit = limit(Some(parse_int("limit", value)?))?,
                "offset" => request.offset = offset(Some(parse_int("offset", value)?))?,
                "refresh" => request.refresh = Refresh::parse(value)?,
                "client_query_id" => request.client_query_id = Some(value.to_owned()),
                "variables" => match serde_json::from_str::<Value>(value) {
                    Ok(Value::Object(map)) => variables.extend(map),
                    _ => {
                        return Err(Invalid::field(
                            "variables",
                            "variables must be a JSON object of NAME: value.",
                        ))
                    }
                },
                other => {
                    if let Some(name) = other.strip_prefix("variables.") {
                        variables.insert(name.to_owned(), Value::String(value.to_owned()));
                    }
                    // Other parameters (cache busters, tracking tags added by proxies) are ignored.
                }
            }
        }
        check_count(&variables)?;
        request.variables = variables;
        Ok(request)
    }
}

fn check_count(variables: &Map<String, Value>) -> Result<(), Invalid> {
    if variables.len() > RunRequest::MAX_VARIABLES {
        return Err(Invalid::field(
            "variables",
            format!("A run takes at most {} variables.", RunRequest::MAX_VARIABLES),
        ));
    }
    Ok(())
}

fn parse_int(attr: &str, raw: &str) -> Result<i64, Invalid> {
    raw.parse().map_err(|_| Invalid::field(attr, format!("{attr} must be an integer.")))
}

fn parse_version(raw: &str) -> Result<u32, Invalid> {
    positive_version(parse_int("version", raw)?)
}

fn positive_version(v: i64) -> Result<u32, Invalid> {
    u32::try_from(v)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| Invalid::field("version", "version must be a positive integer."))
}

fn limit(raw: Option<i64>) -> Result<u32, Invalid> {
    match raw {
        None => Ok(RunRequest::DEFAULT_LIMIT),
        Some(l) => u32::try_from(l)
            .ok()
            .filter(|l| (1..=RunRequest::MAX_LIMIT).contains(l))
            .ok_or_else(|| Invalid::field("limit", "limit must be an integer between 1 and 10000.")),
    }
}

fn offset(raw: Option<i64>) -> Result<u64, Invalid> {
    match raw {
        None => Ok(0),
        Some(o) => {
            u64::try_from(o).map_err(|_| Invalid::field("offset", "offset must be a non-negative integer."))
        }
    }
}

/// A variable value bound to its declared type.
#[derive(Debug, Clone, PartialEq)]
pub enum BoundValue {
    String(String),
    Number(f64),
    Integer(i64),
    Boolean(bool),
    Date(time::Date),
    DateTime(Timestamp),
    /// Scalars of a `List`, as strings: a list is matched with `IN` against any column type.
    List(Vec<String>),
}

impl BoundValue {
    /// The value as canonical JSON, for cache keys and echoing back.
    pub fn to_json(&self) -> Value {
        match self {
            Self::String(s) => Value::from(s.as_str()),
            Self::Number(n) => Value::from(*n),
            Self::Integer(i) => Value::from(*i),
            Self::Boolean(b) => Value::from(*b),
            Self::Date(d) => Value::from(d.to_string()),
            Self::DateTime(t) => t.format(&Rfc3339).map_or(Value::Null, Value::String),
            Self::List(items) => Value::from(items.clone()),
        }
    }
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Binds one value to a type. JSON of the right type is taken as is; a string is parsed (query parameters are
/// always strings).
///
/// # Errors
/// A sentence saying what was expected.
pub fn coerce(ty: VariableType, value: &Value) -> Result<BoundValue, String> {
    let text = value.as_str();
    let bad = || format!("expected {}", expectation(ty));
    match ty {
        VariableType::String => text.map(|s| BoundValue::String(s.to_owned())).ok_or_else(bad),
        VariableType::Number => value
            .as_f64()
            .or_else(|| text.and_then(|s| s.trim().parse::<f64>().ok()))
            .filter(|n| n.is_finite())
            .map(BoundValue::Number)
            .ok_or_else(bad),
        VariableType::Integer => crate::fields::integer(value)
            .or_else(|| text.and_then(|s| s.trim().parse::<i64>().ok()))
            .map(BoundValue::Integer)
            .ok_or_else(bad),
        VariableType::Boolean => match (value, text) {
            (Value::Bool(b), _) => Ok(BoundValue::Boolean(*b)),
            (_, Some("true" | "1")) => Ok(BoundValue::Boolean(true)),
            (_, Some("false" | "0")) => Ok(BoundValue::Boolean(false)),
            _ => Err(bad()),
        },
        VariableType::Date => text
            .and_then(|s| {
                time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]")).ok()
            })
            .map(BoundValue::Date)
            .ok_or_else(bad),
        VariableType::DateTime => {
            text.and_then(|s| Timestamp::parse(s, &Rfc3339).ok()).map(BoundValue::DateTime).ok_or_else(bad)
        }
        VariableType::List => {
            let items = match value {
                Value::Array(items) => items.clone(),
                Value::String(s) => match serde_json::from_str::<Value>(s) {
                    Ok(Value::Array(items)) => items,
                    _ => s.split(',').map(|part| Value::from(part.trim())).collect(),
                },
                _ => return Err(bad()),
            };
            items.iter().map(scalar_text).collect::<Option<Vec<_>>>().map(BoundValue::List).ok_or_else(bad)
        }
    }
}

fn expectation(ty: VariableType) -> &'static str {
    match ty {
        VariableType::String => "a string",
        VariableType::Number => "a number",
        VariableType::Integer => "an integer (64-bit)",
        VariableType::Boolean => "true or false",
        VariableType::Date => "a date as YYYY-MM-DD",
        VariableType::DateTime => "an RFC 3339 date-time such as 2026-01-31T12:00:00Z",
        VariableType::List => "an array of strings, numbers or booleans (or a comma-separated list)",
    }
}

/// Binds supplied values to a query's declarations: unknown names, missing required values and values that do
/// not parse are refused; defaults fill the rest.
///
/// # Errors
/// [`Invalid`] with `attr` `variables.NAME` and code `unknown_variable`, `required` or `invalid`.
pub fn bind(query: &Query, supplied: &Map<String, Value>) -> Result<BTreeMap<String, BoundValue>, Invalid> {
    if let Some(name) = supplied.keys().find(|name| !query.variables.contains_key(*name)) {
        let known = query.variables.keys().cloned().collect::<Vec<_>>().join(", ");
        return Err(Invalid::new(
            format!("variables.{name}"),
            "unknown_variable",
            format!(
                "This endpoint has no variable '{name}'. Its variables: {}.",
                if known.is_empty() { "none" } else { &known }
            ),
        ));
    }
    let mut bound = BTreeMap::new();
    for (name, declaration) in &query.variables {
        let attr = format!("variables.{name}");
        let value = match supplied.get(name).filter(|v| !v.is_null()) {
            Some(value) => value,
            None => match &declaration.default {
                Some(default) if !declaration.required => default,
                _ => {
                    return Err(Invalid::new(
                        &attr,
                        "required",
                        format!("The variable '{name}' is required."),
                    ));
                }
            },
        };
        let value = coerce(declaration.variable_type, value).map_err(|expected| {
            Invalid::field(&attr, format!("The variable '{name}' has a bad value: {expected}."))
        })?;
        bound.insert(name.clone(), value);
    }
    Ok(bound)
}

/// What a query execution returns: the columns and the page of rows as a JSON array of objects.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryResult {
    pub columns: Vec<Column>,
    /// A JSON array of row objects keyed by column name, serialized once by the engine.
    pub rows_json: String,
    pub row_count: usize,
    /// Whether rows exist after this page.
    pub has_more: bool,
}

impl QueryResult {
    pub fn column_names(&self) -> Vec<&str> {
        self.columns.iter().map(|c| c.name.as_str()).collect()
    }

    pub fn types(&self) -> Vec<(&str, ColumnType)> {
        self.columns.iter().map(|c| (c.name.as_str(), c.column_type)).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn q(vars: Value) -> Query {
        Query::from_json(&json!({"kind": "SQLQuery", "query": "SELECT 1", "variables": vars})).unwrap()
    }

    #[test]
    fn refresh_modes() {
        for mode in ["blocking", "force_blocking", "force_cache", "direct"] {
            assert_eq!(Refresh::parse(mode).unwrap().as_str(), mode);
        }
        for bad in ["async", "lazy_async", "force_async", "sometimes"] {
            assert_eq!(Refresh::parse(bad).unwrap_err().attr.as_deref(), Some("refresh"), "{bad}");
        }
    }

    #[test]
    fn post_bodies_are_strict() {
        let ok = RunRequest::from_body(
            &json!({"variables": {"a": 1}, "version": 2, "limit": 10, "offset": 5, "refresh": "direct",
                    "client_query_id": "x", "query_override": {}, "filters_override": null}),
            Some("9"),
        )
        .unwrap();
        assert_eq!(
            (ok.version, ok.limit, ok.offset, ok.refresh),
            (Some(2), 10, 5, Refresh::Direct),
            "the body's version wins"
        );
        assert_eq!(RunRequest::from_body(&json!({}), Some("3")).unwrap().version, Some(3));
        let both = RunRequest::from_body(&json!({"version": 1}), Some("0")).unwrap_err();
        assert_eq!(
            both.attr.as_deref(),
            Some("version"),
            "a bad ?version= is refused even beside the body's"
        );
        let defaults = RunRequest::from_body(&json!({}), None).unwrap();
        assert_eq!((defaults.limit, defaults.offset, defaults.refresh), (100, 0, Refresh::Blocking));
        // An empty query string asks for what an empty body does.
        assert_eq!(RunRequest::from_query(Vec::<(&str, &str)>::new()).unwrap(), defaults);
        assert_eq!(RunRequest::default(), defaults);
        let floats =
            RunRequest::from_body(&json!({"version": 2.0, "limit": 10.0, "offset": 0.0}), None).unwrap();
        assert_eq!((floats.version, floats.limit, floats.offset), (Some(2), 10, 0), "JSON Schema integers");
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
        ] {
            assert_eq!(RunRequest::from_body(&body, None).unwrap_err().attr.as_deref(), Some(attr), "{body}");
        }
    }

    #[test]
    fn query_parameters_carry_variables() {
        let params = [
            ("variables.country", "US"),
            ("variables", r#"{"n": 3}"#),
            ("limit", "7"),
            ("version", "2"),
            ("utm_source", "ignored"),
        ];
        let request = RunRequest::from_query(params).unwrap();
        assert_eq!(request.variables["country"], json!("US"));
        assert_eq!(request.variables["n"], json!(3));
        assert_eq!((request.limit, request.version), (7, Some(2)));
        let many: Vec<(String, String)> =
            (0..=RunRequest::MAX_VARIABLES).map(|i| (format!("variables.v{i}"), "1".into())).collect();
        assert_eq!(RunRequest::from_query(many).unwrap_err().attr.as_deref(), Some("variables"));
        let many: Map<String, Value> =
            (0..=RunRequest::MAX_VARIABLES).map(|i| (format!("v{i}"), json!(1))).collect();
        let body = json!({"variables": many});
        assert_eq!(RunRequest::from_body(&body, None).unwrap_err().attr.as_deref(), Some("variables"));
        let bad = [("variables", "[1]")];
        assert_eq!(RunRequest::from_query(bad).unwrap_err().attr.as_deref(), Some("variables"));
    }

    #[test]
    fn binding_checks_names_requirements_and_types() {
        let query = q(json!({"a": {"type": "Integer"}, "b": {"type": "String", "default": "x"}}));
        let bound = bind(&query, json!({"a": "42"}).as_object().unwrap()).unwrap();
        assert_eq!(bound["a"], BoundValue::Integer(42));
        assert_eq!(bound["b"], BoundValue::String("x".into()), "defaults fill the rest");

        let err = bind(&query, json!({"a": 1, "zz": 1}).as_object().unwrap()).unwrap_err();
        assert_eq!((err.attr.as_deref(), err.code), (Some("variables.zz"), "unknown_variable"));
        let err = bind(&query, &Map::new()).unwrap_err();
        assert_eq!((err.attr.as_deref(), err.code), (Some("variables.a"), "required"));
        let err = bind(&query, json!({"a": "4x"}).as_object().unwrap()).unwrap_err();
        assert_eq!((err.attr.as_deref(), err.code), (Some("variables.a"), "invalid"));
    }

    #[test]
    fn every_type_coerces_json_and_text() {
        use VariableType as T;
        let date = time::macros::date!(2026 - 02 - 28);
        let cases = [
            (T::String, json!("it's"), BoundValue::String("it's".into())),
            (T::Number, json!(1.5), BoundValue::Number(1.5)),
            (T::Number, json!("2.5"), BoundValue::Number(2.5)),
            (T::Integer, json!(-3), BoundValue::Integer(-3)),
            (T::Integer, json!("7"), BoundValue::Integer(7)),
            (T::Boolean, json!(true), BoundValue::Boolean(true)),
            (T::Boolean, json!("false"), BoundValue::Boolean(false)),
            (T::Date, json!("2026-02-28"), BoundValue::Date(date)),
            (T::DateTime, json!("2026-02-28T00:00:00Z"), BoundValue::DateTime(date.midnight().assume_utc())),
            (T::List, json!(["a", 1]), BoundValue::List(vec!["a".into(), "1".into()])),
            (T::List, json!("a, b"), BoundValue::List(vec!["a".into(), "b".into()])),
            (T::List, json!(r#"["x,y"]"#), BoundValue::List(vec!["x,y".into()])),
        ];
        for (ty, value, expected) in cases {
            assert_eq!(coerce(ty, &value).unwrap(), expected, "{ty} {value}");
        }
        for (ty, value) in [
            (T::String, json!(1)),
            (T::Number, json!("NaN")),
            (T::Integer, json!(1.5)),
            (T::Integer, json!("9223372036854775808")),
            (T::Boolean, json!("yes")),
            (T::Date, json!("2026-02-30")),
            (T::DateTime, json!("yesterday")),
            (T::List, json!([[1]])),
        ] {
            assert!(coerce(ty, &value).is_err(), "{ty} {value}");
        }
    }
}
