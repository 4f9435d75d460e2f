//! An aggregation over a join answers the same computed in two steps: random facts and dimensions (keys
//! repeated, missing and NULL on both sides), random aggregations, with the rewrite and without; and the
//! rewrite is taken exactly where it should be.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use proptest::prelude::*;

use super::eager_aggregate::SMALL_TABLE_ROWS;
use super::tests::{answer, block_on, optimized, Stating};

/// A fact row: join key, a grouping column, an integer and a float.
type Fact = (Option<i64>, i64, Option<i64>, Option<f64>);

/// A dimension row: key and name.
type Dimension = (Option<i64>, String);

fn table(schema: SchemaRef, columns: Vec<ArrayRef>) -> MemTable {
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
    // Two partitions, so that the aggregations run in parallel parts as they do over files.
    let (first, second) =
        batch.num_rows().checked_div(2).map_or((0, 0), |half| (half, batch.num_rows() - half));
    MemTable::try_new(schema, vec![vec![batch.slice(0, first)], vec![batch.slice(first, second)]]).unwrap()
}

/// `f(k, g, x, y)` of `facts` and `d(k, name)` of `dimension`, `d` saying it holds `rows` rows (`None`: it
/// does not say).
fn session(facts: &[Fact], dimension: &[Dimension], rows: Option<u64>, rewrites: bool) -> SessionContext {
    let fact_schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("g", DataType::Int64, false),
        Field::new("x", DataType::Int64, true),
        Field::new("y", DataType::Float64, true),
    ]));
    let fact_columns: Vec<ArrayRef> = vec![
        Arc::new(facts.iter().map(|f| f.0).collect::<Int64Array>()),
        Arc::new(facts.iter().map(|f| Some(f.1)).collect::<Int64Array>()),
        Arc::new(facts.iter().map(|f| f.2).collect::<Int64Array>()),
        Arc::new(facts.iter().map(|f| f.3).collect::<Float64Array>()),
    ];
    let dimension_schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("name", DataType::Utf8, false),
    ]));
    let dimension_columns: Vec<ArrayRef> = vec![
        Arc::new(dimension.iter().map(|d| d.0).collect::<Int64Array>()),
        Arc::new(dimension.iter().map(|d| Some(d.1.clone())).collect::<StringArray>()),
    ];
    let ctx = SessionContext::new();
    crate::float_order::register(&ctx);
    if rewrites {
        super::register(&ctx);
    }
    ctx.register_table("f", Arc::new(table(fact_schema, fact_columns))).unwrap();
    let dimension = table(dimension_schema, dimension_columns);
    ctx.register_table("d", Arc::new(Stating { table: dimension, exact_filters: false, rows })).unwrap();
    ctx
}

fn small(facts: &[Fact], dimension: &[Dimension], rewrites: bool) -> SessionContext {
    session(facts, dimension, Some(dimension.len() as u64), rewrites)
}

const JOINED: &str = "SELECT d.name, count(*) AS n, sum(f.x) AS s, min(f.y) AS lo, max(f.y) AS hi FROM f \
                      JOIN d ON f.k = d.k GROUP BY d.name ORDER BY d.name";

fn facts() -> Vec<Fact> {
    vec![(Some(1), 1, Some(10), Some(1.5)), (Some(1), 2, None, Some(-2.0)), (Some(2), 1, Some(5), None)]
}

fn dimension() -> Vec<Dimension> {
    vec![(Some(1), "one".into()), (Some(2), "two".into()), (Some(2), "deux".into())]
}

#[test]
fn an_aggregation_over_a_join_with_a_small_table_aggregates_the_other_side_first() {
    let ctx = small(&facts(), &dimension(), true);
    let plan = block_on(optimized(&ctx, JOINED));
    let partial = plan.find("Aggregate: groupBy=[[f.k]]").unwrap_or_else(|| panic!("{plan}"));
    assert!(
        plan.find("Inner Join").is_some_and(|join| join < partial),
        "the join reads the partials: {plan}"
    );
    assert_eq!(
        block_on(answer(&ctx, JOINED)),
        block_on(answer(&small(&facts(), &dimension(), false), JOINED)),
    );
    // The query's names and types.
    let schema = block_on(async { ctx.sql(JOINED).await.unwrap().schema().clone() });
    let names: Vec<_> = schema.fields().iter().map(|f| (f.name().clone(), f.data_type().clone())).collect();
    assert_eq!(
        names,
        [
            ("name".into(), DataType::Utf8),
            ("n".into(), DataType::Int64),
            ("s".into(), DataType::Int64),
            ("lo".into(), DataType::Float64),
            ("hi".into(), DataType::Float64),
        ]
    );
    // Grouped by the aggregated side's column too; the small table first in the query; `count(*)` alone.
    for sql in [
        "SELECT d.name, f.g, sum(f.x) FROM f JOIN d ON f.k = d.k GROUP BY d.name, f.g",
        "SELECT d.name, count(f.y) FROM d JOIN f ON d.k = f.k GROUP BY d.name",
        "SELECT d.name, count(*) FROM f JOIN d ON f.k = d.k WHERE f.g > 1 GROUP BY d.name",
        "SELECT d.name, sum(f.x) FROM f LEFT JOIN d ON f.k = d.k GROUP BY d.name",
    ] {
        let plan = block_on(optimized(&ctx, sql));
        assert!(plan.contains("__eager_partial_"), "{sql}: {plan}");
    }
}

#[test]
fn aggregations_that_would_not_combine_or_gain_are_left_as_written() {
    let written = [
        // Not combinable from partials.
        "SELECT d.name, count(DISTINCT f.x) FROM f JOIN d ON f.k = d.k GROUP BY d.name",
        "SELECT d.name, avg(f.x) FROM f JOIN d ON f.k = d.k GROUP BY d.name",
        "SELECT d.name, sum(f.x) FILTER (WHERE f.g > 1) FROM f JOIN d ON f.k = d.k GROUP BY d.name",
        // Aggregates reading both sides, or grouped by an expression.
        "SELECT d.name, sum(f.x), max(d.k) FROM f JOIN d ON f.k = d.k GROUP BY d.name",
        "SELECT d.name || '!', sum(f.x) FROM f JOIN d ON f.k = d.k GROUP BY d.name || '!'",
        // Joins that add or drop rows of the aggregated side, or compare other than by keys.
        "SELECT d.name, count(*) FROM f FULL JOIN d ON f.k = d.k GROUP BY d.name",
        "SELECT d.name, count(*) FROM f RIGHT JOIN d ON f.k = d.k GROUP BY d.name",
        "SELECT d.name, sum(f.x) FROM f JOIN d ON f.k = d.k AND f.x > d.k GROUP BY d.name",
        // `count(*)` grouped by both sides: which side it counts is not said.
        "SELECT d.name, f.g, count(*) FROM f JOIN d ON f.k = d.k GROUP BY d.name, f.g",
    ];
    let ctx = small(&facts(), &dimension(), true);
    for sql in written {
        let plan = block_on(optimized(&ctx, sql));
        assert!(!plan.contains("__eager"), "{sql}: {plan}");
    }
    // A table that does not say its rows, or says more than a small table's.
    for rows in [None, Some(SMALL_TABLE_ROWS + 1)] {
        let ctx = session(&facts(), &dimension(), rows, true);
        let plan = block_on(optimized(&ctx, JOINED));
        assert!(!plan.contains("__eager"), "{rows:?}: {plan}");
    }
}

/// Keys: a few, so that rows meet, and NULL.
fn key() -> impl Strategy<Value = Option<i64>> {
    prop::option::weighted(0.9, 0..4i64)
}

/// Floats whose sums do not depend on their order (small integers), and the special values.
fn float() -> impl Strategy<Value = Option<f64>> {
    let special = prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0]);
    prop::option::weighted(0.85, prop_oneof![6 => (-50..50i32).prop_map(f64::from), 1 => special])
}

fn fact() -> impl Strategy<Value = Fact> {
    (key(), 0..3i64, prop::option::weighted(0.85, -1000..1000i64), float())
}

fn dimension_row() -> impl Strategy<Value = Dimension> {
    (key(), prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned))
}

/// An aggregation over `f` joined with `d`: some of the combinable aggregates, a grouping, a join, a filter.
fn query() -> impl Strategy<Value = String> {
    let aggregates = prop::sample::subsequence(
        vec![
            "count(*)",
            "count(f.x)",
            "sum(f.x)",
            "min(f.x)",
            "max(f.x)",
            "sum(f.y)",
            "min(f.y)",
            "max(f.y)",
        ],
        1..5,
    );
    let grouping = prop::sample::select(vec!["d.name", "d.name, f.g", "f.g, d.k", ""]);
    let join = prop::sample::select(vec![
        "f JOIN d ON f.k = d.k",
        "d JOIN f ON d.k = f.k",
        "f LEFT JOIN d ON f.k = d.k",
        "d RIGHT JOIN f ON f.k = d.k",
        // Not taken: it adds rows of `d` alone.
        "f RIGHT JOIN d ON f.k = d.k",
    ]);
    let filter = prop::sample::select(vec!["", "WHERE f.g <> 1", "WHERE d.name <> 'b'"]);
    (aggregates, grouping, join, filter).prop_map(|(aggregates, grouping, join, filter)| {
        let (select, group_by) = match grouping {
            "" => (String::new(), String::new()),
            columns => (format!("{columns}, "), format!("GROUP BY {columns}")),
        };
        let values: Vec<String> =
            aggregates.iter().enumerate().map(|(at, a)| format!("{a} AS a{at}")).collect();
        let order: Vec<String> = (1..=grouping.split(',').filter(|c| !c.is_empty()).count()
            + aggregates.len())
            .map(|at| at.to_string())
            .collect();
        format!(
            "SELECT {select}{} FROM {join} {filter} {group_by} ORDER BY {}",
            values.join(", "),
            order.join(", ")
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// With the rewrite or without, every aggregation answers the same: the same rows, the same text of each
    /// value (NaN, infinities and signed zeros included), NULLs and empty groups included.
    #[test]
    fn answers_are_the_same_with_the_rewrite(
        facts in prop::collection::vec(fact(), 0..40),
        dimension in prop::collection::vec(dimension_row(), 0..6),
        sql in query(),
    ) {
        let (rewritten, plain) = block_on(async {
            let rewritten = answer(&small(&facts, &dimension, true), &sql).await;
            (rewritten, answer(&small(&facts, &dimension, false), &sql).await)
        });
        prop_assert_eq!(rewritten, plain, "{}", sql);
    }
}
