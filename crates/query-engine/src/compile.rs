//! `{variables.NAME}` placeholders to DataFusion's positional parameters.
//!
//! Each placeholder becomes `CAST($n AS <type>)`: the value is bound to `$n` as a typed parameter, and the cast
//! gives the expression its declared type however the surrounding SQL would otherwise infer it. A `List`
//! variable becomes a one-column subquery, so it is written `column IN {variables.NAME}`.

use datafusion::arrow::datatypes::DataType;
use datafusion::scalar::ScalarValue;
use domain::{EngineError, Query, VariableType};

/// SQL text with numbered parameters, and the variable bound to each number (`$1` is `params[0]`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Compiled {
    pub sql: String,
    pub params: Vec<(String, VariableType)>,
}

pub(crate) fn sql_type(ty: VariableType) -> &'static str {
    match ty {
        VariableType::String => "VARCHAR",
        VariableType::Number => "DOUBLE",
        VariableType::Integer => "BIGINT",
        VariableType::Boolean => "BOOLEAN",
        VariableType::Date => "DATE",
        VariableType::DateTime => "TIMESTAMP",
        VariableType::List => "VARCHAR[]",
    }
}

pub(crate) fn compile(query: &Query) -> Compiled {
    let mut sql = String::with_capacity(query.sql.len());
    let mut params: Vec<(String, VariableType)> = Vec::new();
    let mut last = 0;
    for placeholder in query.placeholders() {
        sql.push_str(&query.sql[last..placeholder.start]);
        let ty = query.variables.get(&placeholder.name).map_or(VariableType::String, |v| v.variable_type);
        let index = match params.iter().position(|(name, _)| *name == placeholder.name) {
            Some(i) => i + 1,
            None => {
                params.push((placeholder.name.clone(), ty));
                params.len()
            }
        };
        if ty == VariableType::List {
            sql.push_str(&format!("(SELECT UNNEST(CAST(${index} AS VARCHAR[])))"));
        } else {
            sql.push_str(&format!("CAST(${index} AS {})", sql_type(ty)));
        }
        last = placeholder.end;
    }
    sql.push_str(&query.sql[last..]);
    Compiled { sql, params }
}

impl Compiled {
    /// An error about the compiled query told in the terms of the query as written: its parameters named as
    /// the variables they stand for.
    pub(crate) fn explain(&self, err: EngineError) -> EngineError {
        match err {
            EngineError::InvalidQuery(text) => {
                let names: Vec<String> = self.params.iter().map(|(name, _)| name.clone()).collect();
                EngineError::InvalidQuery(crate::messages::name_variables(&text, &names))
            }
            other => other,
        }
    }

    /// One value of the right type per parameter, for planning without real values.
    pub(crate) fn sample_values(&self) -> Vec<ScalarValue> {
        self.params
            .iter()
            .map(|(_, ty)| match ty {
                VariableType::String => ScalarValue::Utf8(Some(String::new())),
                VariableType::Number => ScalarValue::Float64(Some(0.0)),
                VariableType::Integer => ScalarValue::Int64(Some(0)),
                VariableType::Boolean => ScalarValue::Boolean(Some(false)),
                VariableType::Date => ScalarValue::Date32(Some(0)),
                VariableType::DateTime => ScalarValue::TimestampMicrosecond(Some(0), None),
                VariableType::List => ScalarValue::List(ScalarValue::new_list_nullable(
                    &[ScalarValue::Utf8(Some(String::new()))],
                    &DataType::Utf8,
                )),
            })
            .collect()
    }
}

/// Tokens one statement may have. Deeply nested expressions are bounded by it, so planning stays within the
/// engine threads' stacks; ordinary queries, even long generated ones, are far below it.
pub(crate) const MAX_TOKENS: usize = 10_000;

/// Refuses SQL before it is parsed when it has more than [`MAX_TOKENS`] tokens (words and symbols outside
/// quotes), or a `{variables.NAME}` placeholder inside quotes: a variable is a value of its own, never a piece of
/// a string literal or a quoted name (it would be replaced by the text of its parameter there).
pub(crate) fn check_text(sql: &str) -> Result<(), domain::EngineError> {
    let mut tokens = 0_usize;
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for (at, c) in sql.char_indices() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            } else if sql[at..].starts_with(domain::PLACEHOLDER_OPEN) {
                let end = sql[at..].find('}').map_or(sql.len(), |close| at + close + 1);
                let (written, kind) =
                    (&sql[at..end], if q == '"' { "quoted name" } else { "string literal" });
                return Err(domain::EngineError::InvalidQuery(format!(
                    "{written} is inside a {kind}, where it would not be replaced by its value: write it on its \
                     own, outside quotes (name = {written}, or concat('prefix-', {written}))."
                )));
            }
            continue;
        }
        if c == '\'' || c == '"' {
            quote = Some(c);
            tokens += 1;
            in_word = false;
        } else if c.is_alphanumeric() || c == '_' || c == '.' || c == '$' {
            if !in_word {
                tokens += 1;
                in_word = true;
            }
        } else {
            in_word = false;
            if !c.is_whitespace() {
                tokens += 1;
            }
        }
    }
    if tokens > MAX_TOKENS {
        return Err(domain::EngineError::InvalidQuery(format!(
            "The query is too large: {tokens} tokens, at most {MAX_TOKENS}."
        )));
    }
    Ok(())
}

/// Property tests of the placeholder compiler (see `domain::properties` for the parsers): whatever the SQL
/// around them, placeholders become numbered, typed parameters, each variable once, and no placeholder text
/// survives. Values never pass through here at all: they are bound as parameters.
/// How deep one expression may nest or chain: `a + b + c` is as deep as it has terms, since each `+` holds the
/// ones before it. Planning time grows with the square of the depth (a 5,000-term sum took 20 s of a core), and
/// planning is not cut into turns as execution is, so it is bounded here; long lists of values belong in `IN`.
pub(crate) const MAX_EXPRESSION_DEPTH: usize = 256;

/// Refuses a parsed statement with an expression deeper than [`MAX_EXPRESSION_DEPTH`].
pub(crate) fn check_depth(statement: &datafusion::sql::sqlparser::ast::Statement) -> Result<(), EngineError> {
    use std::ops::ControlFlow;

    use datafusion::sql::sqlparser::ast::{Expr, Visit, Visitor};

    struct Depth {
        now: usize,
    }

    impl Visitor for Depth {
        type Break = ();

        fn pre_visit_expr(&mut self, _expr: &Expr) -> ControlFlow<()> {
            self.now += 1;
            if self.now > MAX_EXPRESSION_DEPTH {
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }

        fn post_visit_expr(&mut self, _expr: &Expr) -> ControlFlow<()> {
            self.now -= 1;
            ControlFlow::Continue(())
        }
    }

    match statement.visit(&mut Depth { now: 0 }) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(EngineError::InvalidQuery(format!(
            "An expression of this query nests or chains more than {MAX_EXPRESSION_DEPTH} deep (a + b + ... \
             with that many terms, say): write long lists of values as IN (...), or split the expression."
        ))),
    }
}

#[cfg(test)]
mod properties {
    use domain::Query;
    use proptest::prelude::*;
    use serde_json::json;

    fn sqlish() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                "[a-z ,*()=<>'\"0-9\\n-]{0,8}",
                "\\{variables\\.[abc]\\}",
                Just("{".to_owned()),
                Just("}".to_owned()),
                ".{0,3}",
            ],
            0..16,
        )
        .prop_map(|parts| format!("SELECT {}", parts.concat()))
    }

    proptest! {
        #[test]
        fn placeholders_become_numbered_parameters(sql in sqlish(), list in any::<bool>()) {
            let document = json!({"kind": "SQLQuery", "query": sql, "variables": {
                "a": {"type": "String"}, "b": {"type": "Integer"}, "c": {"type": if list { "List" } else { "Date" }},
            }});
            let Ok(query) = Query::try_from(&document) else { return Ok(()) };
            let compiled = super::compile(&query);
            let mut names: Vec<String> = query.placeholders().into_iter().map(|p| p.name).collect();
            names.dedup();
            let mut distinct = names.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(compiled.params.len(), distinct.len());
            for (i, (name, _)) in compiled.params.iter().enumerate() {
                let parameter = format!("${}", i + 1);
                let placeholder = format!("{{variables.{name}}}");
                prop_assert!(compiled.sql.contains(&parameter));
                prop_assert!(!compiled.sql.contains(&placeholder));
            }
            prop_assert_eq!(compiled.sample_values().len(), compiled.params.len());
        }
    }
}
