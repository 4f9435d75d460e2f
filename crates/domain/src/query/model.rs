//! The saved query: its kind, SQL text and declared variables, the `{variables.NAME}` placeholder scan, and the
//! canonical JSON form that decides whether an update makes a new version.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::variables::{check_declaration, parse_variables, Variable};
use crate::error::{Invalid, Violation};

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

    pub const ALL: [QueryKind; 2] = [Self::Sql, Self::HogQl];

    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "SQLQuery" => Some(Self::Sql),
            "HogQLQuery" => Some(Self::HogQl),
            _ => None,
        }
    }
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

/// How a placeholder begins: `{variables.NAME}`.
pub const PLACEHOLDER_OPEN: &str = "{variables.";

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

impl TryFrom<&Value> for Query {
    type Error = Invalid;

    /// Parses and validates a query object as a client sends it (`attr`s are relative to `query`).
    ///
    /// # Errors
    /// [`Invalid`] for a non-object, an unknown kind, a missing or empty SQL text, an unknown key, a malformed or
    /// undeclared placeholder, a bad variable declaration or a default that does not fit its type.
    fn try_from(value: &Value) -> Result<Self, Invalid> {
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
}

impl Query {
    /// A SQL query with its variables, checked as [`Query::try_from`] checks a client's: the text is not empty,
    /// every placeholder is declared, and every declaration keeps the rules of one read from a body.
    ///
    /// # Errors
    /// [`Invalid`] naming what breaks a rule.
    pub fn sql(sql: &str, variables: BTreeMap<String, Variable>) -> Result<Self, Invalid> {
        if sql.trim().is_empty() {
            return Err(Invalid::field("query.query", "query.query must be a non-empty SQL string."));
        }
        for (name, variable) in &variables {
            check_declaration(name, variable, &format!("query.variables.{name}"))?;
        }
        let query = Self { kind: QueryKind::Sql, sql: sql.trim().to_owned(), variables };
        query.check_placeholders()?;
        Ok(query)
    }

    fn check_placeholders(&self) -> Result<(), Invalid> {
        let placeholders = scan_placeholders(&self.sql)
            .map_err(|reason| Invalid::new("query", Violation::Invalid, reason))?;
        if let Some(p) = placeholders.iter().find(|p| !self.variables.contains_key(&p.name)) {
            return Err(Invalid::new(
                "query",
                Violation::UnknownVariable,
                format!("The placeholder {{variables.{}}} has no declaration in query.variables.", p.name),
            ));
        }
        Ok(())
    }

    /// Every placeholder in the SQL text. The text was scanned on parse, so this cannot fail.
    pub fn placeholders(&self) -> Vec<Placeholder> {
        scan_placeholders(&self.sql).expect("the text was scanned when the query was made")
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn attr_of(value: Value) -> String {
        Query::try_from(&value).unwrap_err().attr.unwrap_or_default()
    }

    #[test]
    fn parses_a_plain_query() {
        let q = Query::try_from(&json!({"kind": "SQLQuery", "query": "  SELECT 1  "})).unwrap();
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
    fn undeclared_placeholder_is_refused() {
        let err = Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT {variables.x}"})).unwrap_err();
        assert_eq!(err.attr.as_deref(), Some("query"));
        assert_eq!(err.code, Violation::UnknownVariable);
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
        let q = Query::try_from(&json!({"kind": "HogQLQuery",
            "query": "SELECT * FROM events WHERE country = {variables.country}",
            "variables": {"0190-abc": {"variableId": "0190-abc", "code_name": "country", "value": "US"}}}))
        .unwrap();
        assert_eq!(q.kind, QueryKind::HogQl);
        let var = &q.variables["country"];
        assert_eq!(var.variable_type, crate::query::VariableType::String);
        assert_eq!(var.default, Some(json!("US")));
        assert!(!var.required);
        assert_eq!(q.to_json()["kind"], "HogQLQuery");
    }

    #[test]
    fn canonical_form_ignores_key_order_and_declaration_style() {
        let a = Query::try_from(
            &json!({"variables": {"b": {"type": "Integer", "default": 1}, "a": {"type": "String"}},
            "query": "SELECT {variables.a}, {variables.b}", "kind": "SQLQuery"}),
        )
        .unwrap();
        let b = Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT {variables.a}, {variables.b}",
            "variables": {"a": {"required": true, "type": "String"}, "b": {"default": 1, "type": "Integer", "required": false}}}))
        .unwrap();
        assert_eq!(a.canonical(), b.canonical());
        let c = Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT {variables.a}, {variables.b}",
            "variables": {"a": {"type": "String"}, "b": {"type": "Integer", "default": 2}}}))
        .unwrap();
        assert_ne!(a.canonical(), c.canonical(), "a different default is a different query");
        assert_eq!(Query::try_from(&a.to_json()).unwrap(), a, "the canonical form parses back");
    }
}
