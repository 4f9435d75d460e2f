//! The saved query: its kind, SQL text and declared variables, the `{variables.NAME}` placeholder scan, and the
//! canonical JSON form that decides whether an update makes a new version.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::error::Invalid;

/// The query language tag. `HogQLQuery` is accepted as an alias so exported definitions load unchanged; it is
/// kept as given so that a round trip returns what was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryKind {
    Sql,
    HogQl,
}

impl QueryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sql => "SQLQuery",
            Self::HogQl => "HogQLQuery",
        }
    }

    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "SQLQuery" => Some(Self::Sql),
            "HogQLQuery" => Some(Self::HogQl),
            _ => None,
        }
    }
}

/// The type of a declared variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariableType {
    String,
    Number,
    Integer,
    Boolean,
    Date,
    DateTime,
    List,
}

impl VariableType {
    pub const ALL: [VariableType; 7] =
        [Self::String, Self::Number, Self::Integer, Self::Boolean, Self::Date, Self::DateTime, Self::List];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::String => "String",
            Self::Number => "Number",
            Self::Integer => "Integer",
            Self::Boolean => "Boolean",
            Self::Date => "Date",
            Self::DateTime => "DateTime",
            Self::List => "List",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == raw)
    }

    /// Checks that a JSON value is a valid value of this type.
    ///
    /// # Errors
    /// A sentence saying what was expected.
    pub fn check(self, value: &Value) -> Result<(), String> {
        let ok = match self {
            Self::String => value.is_string(),
            Self::Number => value.as_f64().is_some_and(f64::is_finite),
            Self::Integer => crate::fields::integer(value).is_some(),
            Self::Boolean => value.is_boolean(),
            Self::Date => value.as_str().is_some_and(|s| parse_date(s).is_some()),
            Self::DateTime => value.as_str().is_some_and(|s| parse_datetime(s).is_some()),
            Self::List => value
                .as_array()
                .is_some_and(|items| items.iter().all(|v| v.is_string() || v.is_number() || v.is_boolean())),
        };
        if ok {
            Ok(())
        } else {
            Err(format!("expected {}", self.expectation()))
        }
    }

    fn expectation(self) -> &'static str {
        match self {
            Self::String => "a string",
            Self::Number => "a number",
            Self::Integer => "an integer (64-bit)",
            Self::Boolean => "true or false",
            Self::Date => "a date as YYYY-MM-DD",
            Self::DateTime => "an RFC 3339 date-time such as 2026-01-31T12:00:00Z",
            Self::List => "an array of strings, numbers or booleans",
        }
    }

    /// The type inferred from a value, for the `HogQLQuery` variable form that carries no type.
    fn infer(value: &Value) -> Self {
        match value {
            Value::Bool(_) => Self::Boolean,
            Value::Number(n) if n.is_i64() || n.is_u64() => Self::Integer,
            Value::Number(_) => Self::Number,
            Value::Array(_) => Self::List,
            _ => Self::String,
        }
    }
}

impl fmt::Display for VariableType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn parse_date(raw: &str) -> Option<time::Date> {
    time::Date::parse(raw, time::macros::format_description!("[year]-[month]-[day]")).ok()
}

fn parse_datetime(raw: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(raw, &time::format_description::well_known::Rfc3339).ok()
}

/// One declared variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    pub variable_type: VariableType,
    /// Checked against `variable_type`; `None` makes the variable required.
    pub default: Option<Value>,
    pub required: bool,
    pub description: Option<String>,
}

/// A saved query: one read-only SQL statement with typed variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub kind: QueryKind,
    pub sql: String,
    /// Keyed by variable name; ordered, so the canonical form is stable.
    pub variables: BTreeMap<String, Variable>,
}

/// A `{variables.NAME}` occurrence in the SQL text, as a byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    pub name: String,
    pub start: usize,
    pub end: usize,
}

const PLACEHOLDER_OPEN: &str = "{variables.";

/// Whether `name` can name a variable: an identifier of ASCII letters, digits and `_`, not starting with a digit.
pub fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 128
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Finds every `{variables.NAME}` placeholder in `sql`.
///
/// # Errors
/// A sentence naming the first malformed placeholder (`{variables.}` or `{variables.a b}`, say).
pub fn scan_placeholders(sql: &str) -> Result<Vec<Placeholder>, String> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(pos) = sql[from..].find(PLACEHOLDER_OPEN) {
        let start = from + pos;
        let name_start = start + PLACEHOLDER_OPEN.len();
        let Some(close) = sql[name_start..].find('}') else {
            return Err(format!("Unterminated placeholder at byte {start}: expected '{{variables.NAME}}'."));
        };
        let name = &sql[name_start..name_start + close];
        if !is_variable_name(name) {
            return Err(format!(
                "Malformed placeholder '{{variables.{name}}}': expected '{{variables.NAME}}'."
            ));
        }
        let end = name_start + close + 1;
        found.push(Placeholder { name: name.to_owned(), start, end });
        from = end;
    }
    Ok(found)
}

impl Query {
    /// Parses and validates a query object as a client sends it (`attr`s are relative to `query`).
    ///
    /// # Errors
    /// [`Invalid`] for a non-object, an unknown kind, a missing or empty SQL text, an unknown key, a malformed or
    /// undeclared placeholder, a bad variable declaration or a default that does not fit its type.
    pub fn from_json(value: &Value) -> Result<Self, Invalid> {
        let obj = value.as_object().ok_or_else(|| {
            Invalid::field(
                "query",
                r#"query must be an object such as {"kind": "SQLQuery", "query": "SELECT ..."}."#,
            )
        })?;
        if let Some(key) = obj.keys().find(|k| !matches!(k.as_str(), "kind" | "query" | "variables")) {
            return Err(Invalid::field(
                format!("query.{key}"),
                format!("Unknown field '{key}' in query; expected kind, query and variables."),
            ));
        }
        let kind = match obj.get("kind") {
            None | Some(Value::Null) => return Err(Invalid::required("query.kind")),
            Some(Value::String(raw)) => QueryKind::parse(raw),
            Some(_) => None,
        }
        .ok_or_else(|| {
            Invalid::field("query.kind", "query.kind must be \"SQLQuery\" (or its alias \"HogQLQuery\").")
        })?;
        let sql = match obj.get("query") {
            None | Some(Value::Null) => return Err(Invalid::required("query.query")),
            Some(Value::String(sql)) if !sql.trim().is_empty() => sql.trim().to_owned(),
            Some(_) => {
                return Err(Invalid::field("query.query", "query.query must be a non-empty SQL string."))
            }
        };
        let variables = match obj.get("variables") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(vars)) => parse_variables(vars)?,
            Some(_) => return Err(Invalid::field("query.variables", "query.variables must be an object.")),
        };
        let query = Self { kind, sql, variables };
        query.check_placeholders()?;
        Ok(query)
    }

    fn check_placeholders(&self) -> Result<(), Invalid> {
        let placeholders =
            scan_placeholders(&self.sql).map_err(|reason| Invalid::new("query", "invalid", reason))?;
        if let Some(p) = placeholders.iter().find(|p| !self.variables.contains_key(&p.name)) {
            return Err(Invalid::new(
                "query",
                "unknown_variable",
                format!("The placeholder {{variables.{}}} has no declaration in query.variables.", p.name),
            ));
        }
        Ok(())
    }

    /// Every placeholder in the SQL text. The text was scanned on parse, so this cannot fail.
    pub fn placeholders(&self) -> Vec<Placeholder> {
        scan_placeholders(&self.sql).unwrap_or_default()
    }

    /// The canonical JSON form: fixed key order, variables sorted by name, the normalized declaration form.
    pub fn to_json(&self) -> Value {
        let variables: Map<String, Value> = self
            .variables
            .iter()
            .map(|(name, var)| {
                let mut decl = Map::new();
                decl.insert("type".into(), Value::from(var.variable_type.as_str()));
                decl.insert("default".into(), var.default.clone().unwrap_or(Value::Null));
                decl.insert("required".into(), Value::Bool(var.required));
                decl.insert("description".into(), var.description.clone().map_or(Value::Null, Value::from));
                (name.clone(), Value::Object(decl))
            })
            .collect();
        let mut obj = Map::new();
        obj.insert("kind".into(), Value::from(self.kind.as_str()));
        obj.insert("query".into(), Value::from(self.sql.clone()));
        obj.insert("variables".into(), Value::Object(variables));
        Value::Object(obj)
    }

    /// The canonical text compared between versions. Two queries that mean the same save to the same text.
    pub fn canonical(&self) -> String {
        canonical_text(&self.to_json())
    }
}

/// Serializes JSON with object keys sorted at every level, whatever map order serde_json was built with.
fn canonical_text(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (key, val)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::from(key.as_str()).to_string());
                    out.push(':');
                    write(val, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn parse_variables(vars: &Map<String, Value>) -> Result<BTreeMap<String, Variable>, Invalid> {
    let mut parsed = BTreeMap::new();
    for (key, decl) in vars {
        let attr = format!("query.variables.{key}");
        let decl = decl
            .as_object()
            .ok_or_else(|| Invalid::field(&attr, "A variable declaration must be an object."))?;
        let (name, variable) = if decl.contains_key("code_name") {
            parse_hogql_variable(decl, &attr)?
        } else {
            (key.clone(), parse_declaration(decl, &attr)?)
        };
        if !is_variable_name(&name) {
            return Err(Invalid::field(
                &attr,
                format!("'{name}' is not a valid variable name: use letters, digits and '_', not starting with a digit."),
            ));
        }
        if parsed.insert(name.clone(), variable).is_some() {
            return Err(Invalid::field(&attr, format!("The variable '{name}' is declared twice.")));
        }
    }
    Ok(parsed)
}

/// The declaration form: `{"type", "default", "required", "description"}` keyed by the variable name.
fn parse_declaration(decl: &Map<String, Value>, attr: &str) -> Result<Variable, Invalid> {
    if let Some(key) =
        decl.keys().find(|k| !matches!(k.as_str(), "type" | "default" | "required" | "description"))
    {
        return Err(Invalid::field(
            format!("{attr}.{key}"),
            format!("Unknown field '{key}'; a declaration has type, default, required and description."),
        ));
    }
    let variable_type = match decl.get("type") {
        None | Some(Value::Null) => return Err(Invalid::required(format!("{attr}.type"))),
        Some(Value::String(raw)) => VariableType::parse(raw),
        Some(_) => None,
    }
    .ok_or_else(|| {
        Invalid::field(
            format!("{attr}.type"),
            format!("type must be one of {}.", VariableType::ALL.map(VariableType::as_str).join(", ")),
        )
    })?;
    let default = decl.get("default").filter(|v| !v.is_null()).cloned();
    let required = match decl.get("required") {
        None | Some(Value::Null) => default.is_none(),
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Invalid::field(format!("{attr}.required"), "required must be true or false.")),
    };
    let description = match decl.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(Invalid::field(format!("{attr}.description"), "description must be a string."))
        }
    };
    build_variable(variable_type, default, required, description, attr)
}

/// The `HogQLQuery` form: `{"code_name": NAME, "value": ..., "variableId": ...}` keyed by an id. The type is
/// taken from an optional `type` or inferred from the value; the value is the default.
fn parse_hogql_variable(decl: &Map<String, Value>, attr: &str) -> Result<(String, Variable), Invalid> {
    let name = decl
        .get("code_name")
        .and_then(Value::as_str)
        .ok_or_else(|| Invalid::field(format!("{attr}.code_name"), "code_name must be a string."))?
        .to_owned();
    let default = decl.get("value").filter(|v| !v.is_null()).cloned();
    let variable_type = match decl.get("type") {
        None | Some(Value::Null) => default.as_ref().map_or(VariableType::String, VariableType::infer),
        Some(raw) => raw.as_str().and_then(VariableType::parse).ok_or_else(|| {
            Invalid::field(
                format!("{attr}.type"),
                format!("type must be one of {}.", VariableType::ALL.map(VariableType::as_str).join(", ")),
            )
        })?,
    };
    let required = default.is_none();
    let variable = build_variable(variable_type, default, required, None, attr)?;
    Ok((name, variable))
}

fn build_variable(
    variable_type: VariableType,
    default: Option<Value>,
    required: bool,
    description: Option<String>,
    attr: &str,
) -> Result<Variable, Invalid> {
    if let Some(default) = &default {
        variable_type.check(default).map_err(|expected| {
            Invalid::field(
                format!("{attr}.default"),
                format!("The default does not fit the type {variable_type}: {expected}."),
            )
        })?;
    } else if !required {
        return Err(Invalid::field(
            format!("{attr}.required"),
            "A variable without a default must be required.",
        ));
    }
    Ok(Variable { variable_type, default, required, description })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn attr_of(value: Value) -> String {
        Query::from_json(&value).unwrap_err().attr.unwrap_or_default()
    }

    #[test]
    fn parses_a_plain_query() {
        let q = Query::from_json(&json!({"kind": "SQLQuery", "query": "  SELECT 1  "})).unwrap();
        assert_eq!(q.kind, QueryKind::Sql);
        assert_eq!(q.sql, "SELECT 1");
        assert!(q.variables.is_empty());
    }

    #[test]
    fn rejects_malformed_queries_naming_the_field() {
        assert_eq!(attr_of(json!("SELECT 1")), "query");
        assert_eq!(attr_of(json!({"query": "SELECT 1"})), "query.kind");
        assert_eq!(attr_of(json!({"kind": "EventsQuery", "query": "SELECT 1"})), "query.kind");
        assert_eq!(attr_of(json!({"kind": "SQLQuery"})), "query.query");
        assert_eq!(attr_of(json!({"kind": "SQLQuery", "query": "   "})), "query.query");
        assert_eq!(attr_of(json!({"kind": "SQLQuery", "query": 1})), "query.query");
        assert_eq!(attr_of(json!({"kind": "SQLQuery", "query": "SELECT 1", "filters": {}})), "query.filters");
        assert_eq!(
            attr_of(json!({"kind": "SQLQuery", "query": "SELECT 1", "variables": []})),
            "query.variables"
        );
    }

    #[test]
    fn declarations_are_typed_and_defaults_checked() {
        let q = Query::from_json(&json!({"kind": "SQLQuery", "query": "SELECT {variables.a}, {variables.b}",
            "variables": {"a": {"type": "Integer", "default": 3}, "b": {"type": "Date"}}}))
        .unwrap();
        assert_eq!(q.variables["a"].variable_type, VariableType::Integer);
        assert!(!q.variables["a"].required);
        assert!(q.variables["b"].required, "no default means required");

        let bad_default = json!({"kind": "SQLQuery", "query": "SELECT 1",
            "variables": {"d": {"type": "Date", "default": "31/01/2026"}}});
        assert_eq!(attr_of(bad_default), "query.variables.d.default");
        let bad_type =
            json!({"kind": "SQLQuery", "query": "SELECT 1", "variables": {"d": {"type": "Float"}}});
        assert_eq!(attr_of(bad_type), "query.variables.d.type");
        let optional_without_default = json!({"kind": "SQLQuery", "query": "SELECT 1", "variables": {"d": {"type": "String", "required": false}}});
        assert_eq!(attr_of(optional_without_default), "query.variables.d.required");
        let bad_name =
            json!({"kind": "SQLQuery", "query": "SELECT 1", "variables": {"1x": {"type": "String"}}});
        assert_eq!(attr_of(bad_name), "query.variables.1x");
    }

    #[test]
    fn every_type_checks_its_values() {
        let cases = [
            (VariableType::String, json!("x"), json!(1)),
            (VariableType::Number, json!(1.5), json!("1.5")),
            (VariableType::Integer, json!(-7), json!(1.5)),
            (VariableType::Boolean, json!(true), json!("true")),
            (VariableType::Date, json!("2026-02-28"), json!("2026-02-30")),
            (VariableType::DateTime, json!("2026-02-28T10:00:00+01:00"), json!("2026-02-28 10:00")),
            (VariableType::List, json!(["a", 1, true]), json!([["nested"]])),
        ];
        for (ty, good, bad) in cases {
            assert!(ty.check(&good).is_ok(), "{ty} should accept {good}");
            assert!(ty.check(&bad).is_err(), "{ty} should refuse {bad}");
        }
        assert!(VariableType::Integer.check(&json!(u64::MAX)).is_err(), "beyond i64");
    }

    #[test]
    fn undeclared_placeholder_is_refused() {
        let err =
            Query::from_json(&json!({"kind": "SQLQuery", "query": "SELECT {variables.x}"})).unwrap_err();
        assert_eq!(err.attr.as_deref(), Some("query"));
        assert_eq!(err.code, "unknown_variable");
    }

    #[test]
    fn scans_placeholders_and_refuses_malformed_ones() {
        let found = scan_placeholders("a = {variables.a} AND b IN {variables.b_2}").unwrap();
        assert_eq!(found.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "b_2"]);
        assert_eq!(&"a = {variables.a}"[found[0].start..found[0].end], "{variables.a}");
        assert!(scan_placeholders("{variables.}").is_err());
        assert!(scan_placeholders("{variables.a b}").is_err());
        assert!(scan_placeholders("{variables.a").is_err());
        assert!(scan_placeholders("SELECT '{variable.a}'").unwrap().is_empty());
    }

    #[test]
    fn hogql_variable_form_is_accepted() {
        let q = Query::from_json(&json!({"kind": "HogQLQuery",
            "query": "SELECT * FROM events WHERE country = {variables.country}",
            "variables": {"0190-abc": {"variableId": "0190-abc", "code_name": "country", "value": "US"}}}))
        .unwrap();
        assert_eq!(q.kind, QueryKind::HogQl);
        let var = &q.variables["country"];
        assert_eq!(var.variable_type, VariableType::String);
        assert_eq!(var.default, Some(json!("US")));
        assert!(!var.required);
        assert_eq!(q.to_json()["kind"], "HogQLQuery");
    }

    #[test]
    fn canonical_form_ignores_key_order_and_declaration_style() {
        let a = Query::from_json(
            &json!({"variables": {"b": {"type": "Integer", "default": 1}, "a": {"type": "String"}},
            "query": "SELECT {variables.a}, {variables.b}", "kind": "SQLQuery"}),
        )
        .unwrap();
        let b = Query::from_json(&json!({"kind": "SQLQuery", "query": "SELECT {variables.a}, {variables.b}",
            "variables": {"a": {"required": true, "type": "String"}, "b": {"default": 1, "type": "Integer", "required": false}}}))
        .unwrap();
        assert_eq!(a.canonical(), b.canonical());
        let c = Query::from_json(&json!({"kind": "SQLQuery", "query": "SELECT {variables.a}, {variables.b}",
            "variables": {"a": {"type": "String"}, "b": {"type": "Integer", "default": 2}}}))
        .unwrap();
        assert_ne!(a.canonical(), c.canonical(), "a different default is a different query");
        assert_eq!(Query::from_json(&a.to_json()).unwrap(), a, "the canonical form parses back");
    }
}
