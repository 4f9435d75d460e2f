//! Binding the values a run supplies to a query's declared variables.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;

use super::model::Query;
use super::variables::VariableType;
use crate::clock::Timestamp;
use crate::error::{Invalid, Violation};

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

/// How a value of a variable may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueForm {
    /// JSON of the type itself: a declared default.
    Json,
    /// That, or text that parses as the type (query parameters are always text; a list may be comma-separated):
    /// a run's value.
    JsonOrText,
}

/// Binds one value to a type: the one reader of variable values, for declared defaults and run values alike.
///
/// # Errors
/// A sentence saying what was expected.
pub fn read_value(ty: VariableType, value: &Value, form: ValueForm) -> Result<BoundValue, String> {
    let text = value.as_str();
    // Text read as another type, where the form allows it.
    let parsed = text.filter(|_| form == ValueForm::JsonOrText).map(str::trim);
    let bound = match ty {
        VariableType::String => text.map(|s| BoundValue::String(s.to_owned())),
        VariableType::Number => value
            .as_f64()
            .or_else(|| parsed.and_then(|s| s.parse::<f64>().ok()))
            .filter(|n| n.is_finite())
            .map(BoundValue::Number),
        VariableType::Integer => crate::fields::integer(value)
            .or_else(|| parsed.and_then(|s| s.parse::<i64>().ok()))
            .map(BoundValue::Integer),
        VariableType::Boolean => match (value, parsed) {
            (Value::Bool(b), _) => Some(BoundValue::Boolean(*b)),
            (_, Some("true" | "1")) => Some(BoundValue::Boolean(true)),
            (_, Some("false" | "0")) => Some(BoundValue::Boolean(false)),
            _ => None,
        },
        VariableType::Date => text
            .and_then(|s| {
                time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]")).ok()
            })
            .map(BoundValue::Date),
        VariableType::DateTime => {
            text.and_then(|s| Timestamp::parse(s, &Rfc3339).ok()).map(BoundValue::DateTime)
        }
        VariableType::List => {
            let items = match (value, parsed) {
                (Value::Array(items), _) => Some(items.clone()),
                (_, Some(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(Value::Array(items)) => Some(items),
                    _ => Some(s.split(',').map(|part| Value::from(part.trim())).collect()),
                },
                _ => None,
            };
            items
                .and_then(|items| items.iter().map(scalar_text).collect::<Option<Vec<_>>>())
                .map(BoundValue::List)
        }
    };
    bound.ok_or_else(|| format!("expected {}", expectation(ty, form)))
}

/// Binds a run's value to a type (see [`read_value`]).
///
/// # Errors
/// A sentence saying what was expected.
pub fn coerce(ty: VariableType, value: &Value) -> Result<BoundValue, String> {
    read_value(ty, value, ValueForm::JsonOrText)
}

/// What a value of the type must be, in the form asked for.
fn expectation(ty: VariableType, form: ValueForm) -> &'static str {
    match (ty, form) {
        (VariableType::String, _) => "a string",
        (VariableType::Number, _) => "a number",
        (VariableType::Integer, _) => "an integer (64-bit)",
        (VariableType::Boolean, _) => "true or false",
        (VariableType::Date, _) => "a date as YYYY-MM-DD",
        (VariableType::DateTime, _) => "an RFC 3339 date-time such as 2026-01-31T12:00:00Z",
        (VariableType::List, ValueForm::Json) => "an array of strings, numbers or booleans",
        (VariableType::List, ValueForm::JsonOrText) => {
            "an array of strings, numbers or booleans (or a comma-separated list)"
        }
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
            Violation::UnknownVariable,
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
                        Violation::Required,
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn q(vars: Value) -> Query {
        Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT 1", "variables": vars})).unwrap()
    }
    #[test]
    fn binding_checks_names_requirements_and_types() {
        let query = q(json!({"a": {"type": "Integer"}, "b": {"type": "String", "default": "x"}}));
        let bound = bind(&query, json!({"a": "42"}).as_object().unwrap()).unwrap();
        assert_eq!(bound["a"], BoundValue::Integer(42));
        assert_eq!(bound["b"], BoundValue::String("x".into()), "defaults fill the rest");

        let err = bind(&query, json!({"a": 1, "zz": 1}).as_object().unwrap()).unwrap_err();
        assert_eq!((err.attr.as_deref(), err.code), (Some("variables.zz"), Violation::UnknownVariable));
        let err = bind(&query, &Map::new()).unwrap_err();
        assert_eq!((err.attr.as_deref(), err.code), (Some("variables.a"), Violation::Required));
        let err = bind(&query, json!({"a": "4x"}).as_object().unwrap()).unwrap_err();
        assert_eq!((err.attr.as_deref(), err.code), (Some("variables.a"), Violation::Invalid));
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
