//! What the engine tells of a query: its output columns, the facts of its outermost SELECT that the
//! materialization rule reads, and the page of rows a run returns.

use serde::{Deserialize, Serialize};

use super::variables::VariableType;

/// The type of an output column, as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    Integer,
    Float,
    Decimal,
    String,
    Boolean,
    Date,
    Datetime,
    Array,
    Json,
    Unknown,
}

impl ColumnType {
    pub const ALL: [ColumnType; 10] = [
        Self::Integer,
        Self::Float,
        Self::Decimal,
        Self::String,
        Self::Boolean,
        Self::Date,
        Self::Datetime,
        Self::Array,
        Self::Json,
        Self::Unknown,
    ];
}

/// One output column of a query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    #[serde(rename = "type")]
    pub column_type: ColumnType,
}

/// What planning a query tells: its output columns and the facts materialization rules need.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueryDescription {
    pub columns: Vec<Column>,
    pub outline: QueryOutline,
    /// The project's tables the query reads, by name, each once.
    pub tables: Vec<String>,
}

/// A comparison a variable predicate may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CompareOp {
    #[serde(rename = "=")]
    Eq,
    #[serde(rename = "!=")]
    NotEq,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    LtEq,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    GtEq,
}

impl CompareOp {
    pub fn as_sql(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::NotEq => "!=",
            Self::Lt => "<",
            Self::LtEq => "<=",
            Self::Gt => ">",
            Self::GtEq => ">=",
        }
    }

    /// The same comparison with its operands swapped: `a < b` is `b > a`.
    #[must_use]
    pub fn flipped(self) -> Self {
        match self {
            Self::Eq | Self::NotEq => self,
            Self::Lt => Self::Gt,
            Self::LtEq => Self::GtEq,
            Self::Gt => Self::Lt,
            Self::GtEq => Self::LtEq,
        }
    }
}

/// A conjunct of the outermost WHERE that compares a plain column with a variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariablePredicate {
    pub variable: String,
    /// The variable's declared type.
    pub variable_type: VariableType,
    /// Written as `column <op> variable`.
    pub op: CompareOp,
    /// The compared column, as the plan names it (`events.country`).
    pub column: String,
    /// The compared column's type.
    pub column_type: ColumnType,
    /// The output column the compared column becomes, when the query outputs it unchanged.
    pub output_column: Option<String>,
    /// The compared column's position among the outermost aggregation's group keys, when it is one.
    pub group_key: Option<usize>,
}

/// An aggregate function, as the materialization rules tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    /// Any other (a median, a distinct-count estimate, an array aggregation, ...).
    Other,
}

/// An aggregate function call of the outermost aggregation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateCall {
    /// The call as the engine writes it (`count(DISTINCT events.user_id)`), for messages.
    pub text: String,
    pub function: AggregateKind,
    /// `DISTINCT` is applied to its arguments.
    pub distinct: bool,
    /// It has an `ORDER BY` of its own.
    pub ordered: bool,
    /// For a `DISTINCT` call of one argument without a `FILTER`, that argument as the engine writes it
    /// (`events.user_id`): a rollup can store its values, over which a run applies the call again.
    pub distinct_argument: Option<String>,
}

/// Facts about a query's outermost SELECT, read from the engine's plan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueryOutline {
    /// The outermost query has a LIMIT or OFFSET.
    pub limit_or_offset: bool,
    /// The outermost query aggregates (GROUP BY or aggregate functions).
    pub aggregates: bool,
    /// The outermost query computes window functions.
    pub window_functions: bool,
    /// The outermost aggregation's group keys, as the engine writes them (`events.country`): opaque to the
    /// rules, which only count and show them.
    pub group_keys: Vec<String>,
    /// The outermost aggregation groups by GROUPING SETS, ROLLUP or CUBE.
    pub grouping_sets: bool,
    /// The outermost aggregation's function calls.
    pub aggregate_calls: Vec<AggregateCall>,
    /// Conjuncts of the outermost WHERE of the form `column <op> {variables.NAME}`.
    pub predicates: Vec<VariablePredicate>,
    /// Variables used anywhere else (other conjuncts, the select list, subqueries, joins, CTEs, ...).
    pub other_uses: Vec<String>,
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
    /// What computing the page read and took.
    pub statistics: Statistics,
    /// The version of each of the project's tables it read (none for a stored result or an engine that does not
    /// say): what a cursor pins.
    pub read: Vec<super::TableVersion>,
}

/// What computing a result read and how long it took, from the engine's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Statistics {
    /// Rows read from tables or a stored result; `None` when the engine cannot tell (a plan executed on
    /// another engine's workers).
    pub rows_read: Option<u64>,
    /// Bytes read from storage for those rows; `None` when the engine cannot tell.
    pub bytes_read: Option<u64>,
    /// Planning and execution, in the engine.
    pub elapsed: std::time::Duration,
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
    use super::*;

    #[test]
    fn column_types_serialize_lowercase() {
        let col = Column { name: "n".into(), column_type: ColumnType::Datetime };
        assert_eq!(serde_json::to_string(&col).unwrap(), r#"{"name":"n","type":"datetime"}"#);
    }

    #[test]
    fn operators_flip() {
        assert_eq!(CompareOp::Lt.flipped(), CompareOp::Gt);
        assert_eq!(CompareOp::GtEq.flipped(), CompareOp::LtEq);
        assert_eq!(CompareOp::Eq.flipped(), CompareOp::Eq);
    }
}
