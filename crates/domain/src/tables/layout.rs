//! How a table's rows are laid out for the endpoints that read it. Compaction writes a table's files sorted by
//! the columns its endpoints filter on with variables (`WHERE user_id = {variables.user}`, `ts >=
//! {variables.from}`), so that the rows one run asks for sit in few row groups and pages, and the Parquet
//! statistics of the others let a run skip them without decoding them.
//!
//! The columns are chosen from the endpoints' plan outlines (the conjuncts of their outermost WHERE that compare a
//! column with a variable): the columns the most endpoints filter on first, a column compared for equality before
//! one only compared by range on a tie (a point lookup gains most, and a range stays ordered within each of its
//! values). At most [`MAX_CLUSTER_COLUMNS`], since past the first two a sort orders little.

use std::collections::BTreeMap;

use crate::error::Invalid;
use crate::fields::Fields;
use crate::query::{ColumnType, CompareOp, QueryOutline};

use super::model::TableColumn;

/// The most columns a table is sorted by.
pub const MAX_CLUSTER_COLUMNS: usize = 2;

/// How a table's files are laid out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableLayout {
    /// The columns its compacted files are sorted by, first to last; empty when no endpoint filters it.
    pub cluster_by: Vec<String>,
    /// How many of its files are sorted so (the others are appends not compacted yet, or files written before
    /// the columns were chosen).
    pub files_clustered: u64,
    /// The columns set for the table (`PATCH tables/{name}` with `cluster_by`), which its compactions sort by
    /// in place of the columns its endpoints filter on; `None` when those choose.
    pub pinned: Option<Vec<String>>,
}

/// What `PATCH tables/{name}` asks of a table's layout: its `cluster_by` field, required, a list of columns
/// (empty: the table is not sorted) or `null` (its endpoints' filters choose again).
///
/// # Errors
/// [`Invalid`] for another field, a missing `cluster_by`, or one that is neither `null` nor a list of names.
pub fn layout_pin(body: &serde_json::Value) -> Result<Option<Vec<String>>, Invalid> {
    let fields = Fields::new(body, &["cluster_by"])?;
    match fields.get("cluster_by") {
        None => Err(Invalid::required("cluster_by")),
        Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(names)) => names
            .iter()
            .map(|name| name.as_str().map(str::to_owned))
            .collect::<Option<Vec<String>>>()
            .map(Some)
            .ok_or_else(|| {
                Invalid::field("cluster_by", "cluster_by must be a list of column names, or null.")
            }),
        Some(_) => Err(Invalid::field("cluster_by", "cluster_by must be a list of column names, or null.")),
    }
}

/// `asked` as the columns a table of `columns` is to be sorted by: each one of its columns whose values have an
/// order, named once, at most [`MAX_CLUSTER_COLUMNS`].
///
/// # Errors
/// [`Invalid`] on `cluster_by`, saying which column and why.
pub fn pinned_columns(columns: &[TableColumn], asked: Vec<String>) -> Result<Vec<String>, Invalid> {
    if asked.len() > MAX_CLUSTER_COLUMNS {
        return Err(Invalid::field(
            "cluster_by",
            format!(
                "A table is sorted by at most {MAX_CLUSTER_COLUMNS} columns; {} were given.",
                asked.len()
            ),
        ));
    }
    for (at, name) in asked.iter().enumerate() {
        let Some(column) = columns.iter().find(|c| c.name == *name) else {
            let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            return Err(Invalid::field(
                "cluster_by",
                format!("The table has no column '{name}'. Its columns: {}.", names.join(", ")),
            ));
        };
        if !orderable(column.column_type) {
            return Err(Invalid::field(
                "cluster_by",
                format!("Column '{name}' holds values with no order: it cannot sort a table."),
            ));
        }
        if asked[..at].contains(name) {
            return Err(Invalid::field("cluster_by", format!("Column '{name}' is named twice.")));
        }
    }
    Ok(asked)
}

/// How the endpoints that read a table filter one of its columns.
#[derive(Debug, Default, Clone, Copy)]
struct Uses {
    /// Endpoints comparing it with `=`.
    equal: usize,
    /// Endpoints comparing it with `<`, `<=`, `>` or `>=` only.
    range: usize,
}

/// The columns `table`'s files are to be sorted by, from the outlines of the endpoints that read it
/// (`readers`). A predicate's column, as the plan names it (`events.user_id`, `e.user_id`), is the table's
/// column of that name; one the table does not have (another table's, in a join) is not counted, nor a column
/// whose values have no order (arrays, JSON).
#[must_use]
pub fn cluster_columns(columns: &[TableColumn], readers: &[QueryOutline]) -> Vec<String> {
    let mut uses: BTreeMap<&str, Uses> = BTreeMap::new();
    for outline in readers {
        let mut seen: BTreeMap<&str, bool> = BTreeMap::new();
        for predicate in &outline.predicates {
            let Some(column) = column_named(columns, &predicate.column) else { continue };
            let equal = match predicate.op {
                CompareOp::Eq => true,
                CompareOp::Lt | CompareOp::LtEq | CompareOp::Gt | CompareOp::GtEq => false,
                CompareOp::NotEq => continue,
            };
            *seen.entry(column).or_default() |= equal;
        }
        for (column, equal) in seen {
            let counted = uses.entry(column).or_default();
            if equal {
                counted.equal += 1;
            } else {
                counted.range += 1;
            }
        }
    }
    let mut ranked: Vec<(&str, Uses)> = uses.into_iter().collect();
    // The most endpoints first; on a tie, more equality uses first; then by name, so the choice is stable.
    ranked.sort_by(|(a, x), (b, y)| {
        (y.equal + y.range).cmp(&(x.equal + x.range)).then(y.equal.cmp(&x.equal)).then(a.cmp(b))
    });
    ranked.into_iter().take(MAX_CLUSTER_COLUMNS).map(|(name, _)| name.to_owned()).collect()
}

/// The table's orderable column that `planned` (a column as a plan names it, maybe qualified) is.
fn column_named<'c>(columns: &'c [TableColumn], planned: &str) -> Option<&'c str> {
    columns
        .iter()
        .filter(|c| orderable(c.column_type))
        .map(|c| c.name.as_str())
        .filter(|name| {
            planned == *name || planned.strip_suffix(name).is_some_and(|qualifier| qualifier.ends_with('.'))
        })
        // `a.b` names column `a.b` rather than column `b` of table `a` when the table has both.
        .max_by_key(|name| name.len())
}

fn orderable(column_type: ColumnType) -> bool {
    !matches!(column_type, ColumnType::Array | ColumnType::Json | ColumnType::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::{VariablePredicate, VariableType};

    fn columns() -> Vec<TableColumn> {
        [("user_id", ColumnType::String), ("ts", ColumnType::Datetime), ("amount", ColumnType::Float)]
            .into_iter()
            .chain([("tags", ColumnType::Array)])
            .map(|(name, column_type)| TableColumn { name: name.into(), column_type, nullable: true })
            .collect()
    }

    fn outline(predicates: &[(&str, CompareOp)]) -> QueryOutline {
        QueryOutline {
            predicates: predicates
                .iter()
                .map(|(column, op)| VariablePredicate {
                    variable: "v".into(),
                    variable_type: VariableType::String,
                    op: *op,
                    column: (*column).into(),
                    column_type: ColumnType::String,
                    output_column: None,
                    group_key: None,
                })
                .collect(),
            ..QueryOutline::default()
        }
    }

    #[test]
    fn no_endpoint_filtering_the_table_chooses_no_columns() {
        assert!(cluster_columns(&columns(), &[]).is_empty());
        assert!(cluster_columns(&columns(), &[outline(&[])]).is_empty());
    }

    #[test]
    fn the_columns_most_endpoints_filter_come_first() {
        let readers = [
            outline(&[("events.ts", CompareOp::GtEq), ("events.ts", CompareOp::Lt)]),
            outline(&[("e.ts", CompareOp::Gt)]),
            outline(&[("events.user_id", CompareOp::Eq)]),
        ];
        // `ts` is filtered by two endpoints (each counted once), `user_id` by one.
        assert_eq!(cluster_columns(&columns(), &readers), ["ts", "user_id"]);
    }

    #[test]
    fn on_a_tie_an_equality_comes_before_a_range_and_then_the_name_decides() {
        let readers = [outline(&[("ts", CompareOp::GtEq)]), outline(&[("user_id", CompareOp::Eq)])];
        assert_eq!(cluster_columns(&columns(), &readers), ["user_id", "ts"]);
        let readers = [outline(&[("ts", CompareOp::Eq)]), outline(&[("user_id", CompareOp::Eq)])];
        assert_eq!(cluster_columns(&columns(), &readers), ["ts", "user_id"]);
    }

    #[test]
    fn at_most_two_columns_are_chosen() {
        let readers =
            [outline(&[("amount", CompareOp::Gt), ("user_id", CompareOp::Eq), ("ts", CompareOp::Lt)])];
        assert_eq!(cluster_columns(&columns(), &readers), ["user_id", "amount"]);
    }

    #[test]
    fn columns_of_other_tables_unordered_columns_and_not_equal_are_not_counted() {
        let readers = [outline(&[
            ("users.country", CompareOp::Eq),
            ("events.tags", CompareOp::Eq),
            ("events.amount", CompareOp::NotEq),
            ("xuser_id", CompareOp::Eq),
        ])];
        assert!(cluster_columns(&columns(), &readers).is_empty());
    }

    #[test]
    fn a_pinned_layout_names_at_most_two_orderable_columns_of_the_table_once() {
        let names = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(pinned_columns(&columns(), names(&["ts", "user_id"])).unwrap(), ["ts", "user_id"]);
        assert!(pinned_columns(&columns(), Vec::new()).unwrap().is_empty());
        for (asked, says) in [
            (names(&["ts", "user_id", "amount"]), "at most 2 columns"),
            (names(&["TS"]), "no column 'TS'. Its columns: user_id, ts, amount, tags"),
            (names(&["tags"]), "'tags' holds values with no order"),
            (names(&["ts", "ts"]), "'ts' is named twice"),
        ] {
            let refused = pinned_columns(&columns(), asked.clone()).unwrap_err();
            assert_eq!(refused.attr.as_deref(), Some("cluster_by"));
            assert!(refused.detail.contains(says), "{asked:?}: {}", refused.detail);
        }
    }

    #[test]
    fn a_layout_pin_is_a_list_of_names_or_null_and_nothing_else() {
        use serde_json::json;
        assert_eq!(
            layout_pin(&json!({"cluster_by": ["a", "b"]})).unwrap(),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(layout_pin(&json!({"cluster_by": []})).unwrap(), Some(Vec::new()));
        assert_eq!(layout_pin(&json!({"cluster_by": null})).unwrap(), None);
        for (body, attr) in [
            (json!({}), Some("cluster_by")),
            (json!({"cluster_by": "a"}), Some("cluster_by")),
            (json!({"cluster_by": ["a", 1]}), Some("cluster_by")),
            (json!({"cluster_by": [], "sort": true}), Some("sort")),
            (json!([]), None),
        ] {
            assert_eq!(layout_pin(&body).unwrap_err().attr.as_deref(), attr, "{body}");
        }
    }

    #[test]
    fn a_column_whose_name_has_a_dot_is_told_from_a_qualified_one() {
        let mut columns = columns();
        columns.push(TableColumn { name: "a.ts".into(), column_type: ColumnType::Integer, nullable: false });
        let readers = [outline(&[("t.a.ts", CompareOp::Eq)])];
        assert_eq!(cluster_columns(&columns, &readers), ["a.ts"]);
    }
}
