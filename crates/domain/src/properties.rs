//! Property tests: the parsers and rules that take client input never panic, and what they accept keeps its
//! invariants. `make test` runs each with proptest's default 256 cases; `make fuzz` runs them with many more
//! (`PROPTEST_CASES`).

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use crate::materialization::{Eligibility, StoredColumn};
use crate::query::{
    bind, AggregateCall, AggregateKind, ColumnType, CompareOp, Query, QueryOutline, VariablePredicate,
    VariableType,
};

/// Any JSON value, nested a few levels.
pub(crate) fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// SQL-ish text with placeholders, braces and quotes where they hurt.
fn sqlish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            "[a-z ,*()=<>'\"0-9]{0,8}",
            "\\{variables\\.[a-z_]{1,4}\\}",
            Just("{variables.".to_owned()),
            Just("}".to_owned()),
            Just("--".to_owned()),
            ".{0,3}",
        ],
        0..12,
    )
    .prop_map(|parts| format!("SELECT {}", parts.concat()))
}

fn declarations() -> impl Strategy<Value = Map<String, Value>> {
    let types = prop_oneof![
        Just("String"),
        Just("Number"),
        Just("Integer"),
        Just("Boolean"),
        Just("Date"),
        Just("DateTime"),
        Just("List"),
        Just("Nonsense")
    ];
    prop::collection::btree_map("[a-z_]{1,4}", (types, prop::option::of(any_json())), 0..4).prop_map(|vars| {
        vars.into_iter()
            .map(|(name, (ty, default))| {
                let mut spec = json!({"type": ty});
                if let Some(default) = default {
                    spec["default"] = default;
                }
                (name, spec)
            })
            .collect()
    })
}

fn outline() -> impl Strategy<Value = QueryOutline> {
    let op = prop_oneof![
        Just(CompareOp::Eq),
        Just(CompareOp::NotEq),
        Just(CompareOp::Lt),
        Just(CompareOp::LtEq),
        Just(CompareOp::Gt),
        Just(CompareOp::GtEq)
    ];
    let typed = prop_oneof![
        Just((VariableType::Date, ColumnType::Datetime)),
        Just((VariableType::DateTime, ColumnType::Datetime)),
        Just((VariableType::String, ColumnType::String)),
    ];
    let predicate = ("[a-c]", op, "[p-r]", typed, prop::option::of("[x-z]"), prop::option::of(0_usize..2))
        .prop_map(|(variable, op, column, (variable_type, column_type), output_column, group_key)| {
            VariablePredicate { variable, variable_type, op, column, column_type, output_column, group_key }
        });
    let function = prop_oneof![
        Just(AggregateKind::Count),
        Just(AggregateKind::Sum),
        Just(AggregateKind::Avg),
        Just(AggregateKind::Min),
        Just(AggregateKind::Other)
    ];
    let call = (function, any::<bool>(), any::<bool>()).prop_map(|(function, distinct, one)| AggregateCall {
        text: format!("{function:?}(x)"),
        function,
        distinct,
        ordered: false,
        distinct_argument: (distinct && one).then(|| "t.x".to_owned()),
    });
    (
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        prop::collection::vec(predicate, 0..4),
        prop::collection::vec("[a-c]", 0..2),
        prop::collection::vec(call, 0..3),
    )
        .prop_map(
            |(
                (limit_or_offset, aggregates, window_functions, grouping_sets),
                predicates,
                other_uses,
                calls,
            )| {
                QueryOutline {
                    limit_or_offset,
                    aggregates,
                    window_functions,
                    group_keys: vec!["k".into(); 2],
                    grouping_sets,
                    aggregate_calls: calls,
                    predicates,
                    other_uses,
                }
            },
        )
}

proptest! {
    #[test]
    fn any_query_document_is_parsed_or_refused(sql in sqlish(), variables in declarations(), extra in any_json()) {
        for document in [
            json!({"kind": "SQLQuery", "query": sql, "variables": variables}),
            json!({"kind": "SQLQuery", "query": sql}),
            extra,
        ] {
            if let Ok(query) = Query::try_from(&document) {
                // Every placeholder sits on character boundaries and names a declared variable.
                for placeholder in query.placeholders() {
                    prop_assert!(query.sql.get(placeholder.start..placeholder.end).is_some());
                    prop_assert!(query.variables.contains_key(&placeholder.name));
                }
                // The canonical form reads back as the same query.
                prop_assert_eq!(Query::try_from(&query.to_json()).ok(), Some(query));
            }
        }
    }

    #[test]
    fn binding_accepts_only_declared_variables_of_their_type(
        variables in declarations(),
        supplied in prop::collection::btree_map("[a-z_]{1,4}", any_json(), 0..4),
    ) {
        let document = json!({"kind": "SQLQuery", "query": "SELECT 1", "variables": variables});
        let Ok(query) = Query::try_from(&document) else { return Ok(()) };
        let supplied: Map<String, Value> = supplied.into_iter().collect();
        if let Ok(bound) = bind(&query, &supplied) {
            for name in supplied.keys() {
                prop_assert!(query.variables.contains_key(name));
            }
            for name in bound.keys() {
                prop_assert!(query.variables.contains_key(name));
            }
        }
    }

    #[test]
    fn eligibility_is_decided_for_any_outline_and_keeps_the_rule(outline in outline()) {
        match Eligibility::decide(&outline) {
            Eligibility::Eligible { filters, rollup } => {
                prop_assert!(!outline.limit_or_offset);
                for filter in &filters {
                    prop_assert!(!outline.other_uses.contains(&filter.variable));
                }
                match &rollup {
                    // A plain stored result is filtered on the columns the query outputs.
                    None => for filter in &filters {
                        prop_assert!(outline.predicates.iter().any(|p| p.variable == filter.variable
                            && p.output_column.clone().map(StoredColumn::Output).as_ref() == Some(&filter.column)));
                    },
                    // A rollup is filtered on its stored grouping, and recombines every aggregate.
                    Some(rollup) => {
                        prop_assert!(outline.aggregates && !outline.grouping_sets && !outline.window_functions);
                        prop_assert!(outline.aggregate_calls.iter().all(|c| c.function != AggregateKind::Other));
                        // A DISTINCT count, sum or average is of one argument, whose values are stored.
                        for call in outline.aggregate_calls.iter().filter(|c| c.distinct) {
                            let counted = matches!(call.function, AggregateKind::Count | AggregateKind::Sum | AggregateKind::Avg);
                            prop_assert!(!counted || call.distinct_argument.as_ref().is_some_and(|a| rollup.distinct.contains(a)));
                        }
                        for (filter, predicate) in filters.iter().zip(&outline.predicates) {
                            let stored = match predicate.group_key {
                                Some(i) => StoredColumn::Key(i),
                                None => {
                                    let j = rollup.columns.iter().position(|c| c.column == predicate.column);
                                    prop_assert!(j.is_some());
                                    StoredColumn::Filtered(j.unwrap_or_default())
                                }
                            };
                            prop_assert_eq!(&filter.column, &stored);
                        }
                    }
                }
                // Every variable compared in the WHERE is applied to the stored result.
                for predicate in &outline.predicates {
                    prop_assert!(filters.iter().any(|f| f.variable == predicate.variable));
                }
            }
            Eligibility::Ineligible { reason } => prop_assert!(!reason.is_empty()),
        }
    }
}
