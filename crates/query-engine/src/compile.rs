//! `{variables.NAME}` placeholders to DataFusion's positional parameters.
//!
//! Each placeholder becomes `CAST($n AS <type>)`: the value is bound to `$n` as a typed parameter, and the cast
//! gives the expression its declared type however the surrounding SQL would otherwise infer it. A `List`
//! variable becomes a one-column subquery, so it is written `column IN {variables.NAME}`.

use datafusion::arrow::datatypes::DataType;
use datafusion::scalar::ScalarValue;
use domain::{Query, VariableType};

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

/// Refuses SQL with more than [`MAX_TOKENS`] tokens (words and symbols outside quotes), before it is parsed.
pub(crate) fn check_size(sql: &str) -> Result<(), domain::ports::EngineError> {
    let mut tokens = 0_usize;
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in sql.chars() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
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
        return Err(domain::ports::EngineError::InvalidQuery(format!(
            "The query is too large: {tokens} tokens, at most {MAX_TOKENS}."
        )));
    }
    Ok(())
}
