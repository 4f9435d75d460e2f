//! Declared variables: their types, and the two declaration forms a query may use.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use super::model::is_variable_name;
use crate::error::Invalid;

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

    /// Checks that a JSON value is a valid value of this type, as a declared default must be.
    ///
    /// # Errors
    /// A sentence saying what was expected.
    pub fn check(self, value: &Value) -> Result<(), String> {
        super::binding::read_value(self, value, super::binding::ValueForm::Json).map(|_| ())
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

/// One declared variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    pub variable_type: VariableType,
    /// Checked against `variable_type`; `None` makes the variable required.
    pub default: Option<Value>,
    pub required: bool,
    pub description: Option<String>,
}

pub(super) fn parse_variables(vars: &Map<String, Value>) -> Result<BTreeMap<String, Variable>, Invalid> {
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
        check_name(&name, &attr)?;
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
    let variable = Variable { variable_type, default, required, description };
    check_default(&variable, attr)?;
    Ok(variable)
}

/// A declaration's rules, for one built in code rather than read from a body: a variable name, a default of
/// its type, required when it has none. `attr` names the declaration in errors.
pub(super) fn check_declaration(name: &str, variable: &Variable, attr: &str) -> Result<(), Invalid> {
    check_name(name, attr)?;
    check_default(variable, attr)
}

fn check_name(name: &str, attr: &str) -> Result<(), Invalid> {
    if is_variable_name(name) {
        return Ok(());
    }
    Err(Invalid::field(
        attr,
        format!(
            "'{name}' is not a valid variable name: use letters, digits and '_', not starting with a digit."
        ),
    ))
}

fn check_default(variable: &Variable, attr: &str) -> Result<(), Invalid> {
    let variable_type = variable.variable_type;
    match &variable.default {
        Some(default) => variable_type.check(default).map_err(|expected| {
            Invalid::field(
                format!("{attr}.default"),
                format!("The default does not fit the type {variable_type}: {expected}."),
            )
        }),
        None if !variable.required => {
            Err(Invalid::field(format!("{attr}.required"), "A variable without a default must be required."))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::model::Query;
    use super::*;

    fn attr_of(value: Value) -> String {
        Query::try_from(&value).unwrap_err().attr.unwrap_or_default()
    }
    #[test]
    fn a_query_built_in_code_keeps_the_rules_of_one_read_from_a_body() {
        let int = |default: Option<Value>, required| Variable {
            variable_type: VariableType::Integer,
            default,
            required,
            description: None,
        };
        let with = |name: &str, variable| BTreeMap::from([(name.to_owned(), variable)]);
        let q = Query::sql(" SELECT {variables.n} ", with("n", int(Some(json!(3)), false))).unwrap();
        assert_eq!(q.sql, "SELECT {variables.n}");
        for (sql, variables, attr) in [
            ("  ", BTreeMap::new(), "query.query"),
            ("SELECT {variables.m}", BTreeMap::new(), "query"),
            ("SELECT 1", with("n", int(Some(json!("x")), false)), "query.variables.n.default"),
            ("SELECT 1", with("n", int(None, false)), "query.variables.n.required"),
            ("SELECT 1", with("1n", int(None, true)), "query.variables.1n"),
        ] {
            assert_eq!(Query::sql(sql, variables).unwrap_err().attr.as_deref(), Some(attr), "{sql}");
        }
    }

    #[test]
    fn declarations_are_typed_and_defaults_checked() {
        let q = Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT {variables.a}, {variables.b}",
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
}
