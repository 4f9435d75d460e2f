//! Materialization on real DataFusion: the facts read from plans, and the invariant that a stored result read
//! with the run's variables answers exactly what the live query answers.

use crate::tables::imports;
use std::collections::BTreeMap;

use domain::{
    attempt_location, BoundValue, CompareOp, Eligibility, MaterializedFilter, QueryEngine, ResultFormat,
    ResultStorage,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use uuid::Uuid;

use super::*;

fn project() -> ProjectId {
    ProjectId::new(1).unwrap()
}

fn query(sql: &str, variables: serde_json::Value) -> Query {
    Query::try_from(&json!({"kind": "SQLQuery", "query": sql, "variables": variables})).unwrap()
}

/// A storage with 20,000 demo events in project 1: a data directory removed at the end, or an in-memory object
/// store, which has no directories (as S3 has none).
struct Demo(Option<std::path::PathBuf>, DataFusionEngine);

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The rows of the demo's `events` table.
const DEMO_ROWS: usize = 20_000;

async fn demo_on(dir: Option<std::path::PathBuf>) -> Demo {
    let storage = match &dir {
        Some(dir) => Storage::local(dir).unwrap(),
        None => Storage::from_store(Arc::new(object_store::memory::InMemory::new()), "memory:///"),
    };
    imports::write_table(
        &storage,
        project(),
        "events",
        demo::events_schema(),
        demo::events(DEMO_ROWS, 11),
        &|_| (),
    )
    .await
    .unwrap();
    Demo(dir, crate::tests::engine_on(storage).await)
}

async fn demo() -> Demo {
    demo_on(Some(std::env::temp_dir().join(format!("qe-materialize-{}", Uuid::new_v4())))).await
}

async fn eligibility(engine: &DataFusionEngine, sql: &str, variables: serde_json::Value) -> Eligibility {
    let description = engine.describe(project(), &query(sql, variables)).await.unwrap();
    Eligibility::decide(&description.outline)
}

fn string_var() -> serde_json::Value {
    json!({"type": "String", "default": "US"})
}

#[tokio::test]
async fn plans_tell_which_queries_can_be_materialized() {
    let demo = demo().await;
    let e = &demo.1;
    let vars = json!({"c": string_var(), "m": {"type": "Number", "default": 1}});
    let eligible = [
        (
            "SELECT country AS land, revenue FROM events WHERE {variables.m} < revenue AND event = 'purchase'",
            vec![("revenue", CompareOp::Gt, "m")],
        ),
        (
            "SELECT e.country AS land FROM events e WHERE e.country != {variables.c} ORDER BY land",
            vec![("land", CompareOp::NotEq, "c")],
        ),
        ("SELECT DISTINCT country FROM events WHERE country <= {variables.c}", vec![("country", CompareOp::LtEq, "c")]),
        ("SELECT * FROM events WHERE country = {variables.c}", vec![("country", CompareOp::Eq, "c")]),
        // An aggregate a rollup cannot recombine: the final rows, filtered on the group key.
        (
            "SELECT country, median(revenue) AS n FROM events WHERE country = {variables.c} GROUP BY country",
            vec![("country", CompareOp::Eq, "c")],
        ),
        (
            "SELECT country, count(DISTINCT distinct_id) FILTER (WHERE event = 'purchase') AS n FROM events \
             WHERE country = {variables.c} GROUP BY country",
            vec![("country", CompareOp::Eq, "c")],
        ),
    ];
    for (sql, expected) in eligible {
        let decided = eligibility(e, sql, vars.clone()).await;
        let expected: Vec<MaterializedFilter> = expected
            .into_iter()
            .map(|(column, op, variable)| MaterializedFilter {
                column: domain::StoredColumn::Output(column.into()),
                op,
                variable: variable.into(),
            })
            .collect();
        assert_eq!(decided, Eligibility::Eligible { filters: expected, rollup: None }, "{sql}");
    }
    let vars = json!({"c": string_var(), "m": {"type": "Number", "default": 1}, "d": {"type": "Date", "default": "2026-01-01"}});
    let rollups = [
        // Aggregations filtered on their group keys, or not at all, are rollups of their keys, so that they fold.
        (
            "SELECT country, count(*) AS n FROM events WHERE country = {variables.c} GROUP BY country",
            vec!["events.country"],
        ),
        (
            "SELECT country, count(*) AS n FROM events WHERE country = {variables.c} GROUP BY 1 ORDER BY n DESC, 1",
            vec!["events.country"],
        ),
        (
            "WITH d AS (SELECT CAST(timestamp AS DATE) AS day, revenue FROM events) \
             SELECT day, sum(revenue) AS r FROM d WHERE day >= CAST('2026-01-05' AS DATE) GROUP BY day \
             HAVING sum(revenue) > 0 ORDER BY day",
            vec!["d.day"],
        ),
        ("SELECT count(*) AS n FROM events WHERE country = {variables.c}", vec!["events.country"]),
        (
            "SELECT browser, count(*) AS n FROM events WHERE country = {variables.c} GROUP BY browser",
            vec!["events.browser", "events.country"],
        ),
        (
            "SELECT country, sum(revenue) AS r FROM events WHERE timestamp >= {variables.d} \
             AND timestamp < {variables.d} AND revenue > {variables.m} GROUP BY country ORDER BY r DESC",
            vec!["events.country", "events.timestamp (by day)", "events.revenue"],
        ),
        ("SELECT count(*) AS n FROM events WHERE timestamp > {variables.d}", vec!["events.timestamp"]),
        // DISTINCT counts, sums and averages store their argument's values, each argument once.
        (
            "SELECT country, count(DISTINCT distinct_id) AS n, avg(DISTINCT revenue) AS a FROM events \
             WHERE country = {variables.c} GROUP BY country",
            vec!["events.country", "events.distinct_id", "events.revenue"],
        ),
        (
            "SELECT browser, count(DISTINCT distinct_id) AS u, sum(DISTINCT revenue) AS s, \
             count(DISTINCT revenue) AS c, min(DISTINCT revenue) AS low FROM events \
             WHERE country = {variables.c} GROUP BY browser",
            vec!["events.browser", "events.country", "events.distinct_id", "events.revenue"],
        ),
    ];
    for (sql, grouping) in rollups {
        let decided = eligibility(e, sql, vars.clone()).await;
        assert_eq!(
            decided.rollup().map(crate::stored::rollup::grouping),
            Some(grouping.iter().map(|g| g.to_string()).collect()),
            "{sql}: {decided:?}"
        );
    }
    let ineligible = [
        ("SELECT country FROM events WHERE country = {variables.c} LIMIT 5", "LIMIT"),
        ("SELECT country FROM events WHERE country = {variables.c} OR revenue > 1", "used outside"),
        (
            "SELECT browser, count(DISTINCT distinct_id) FILTER (WHERE revenue > 0) AS u FROM events \
             WHERE country = {variables.c} GROUP BY browser",
            "cannot be recombined",
        ),
        (
            "SELECT browser, median(revenue) AS m FROM events WHERE country = {variables.c} GROUP BY browser",
            "`median(events.revenue)` cannot be recombined",
        ),
        (
            "SELECT browser, count(*) AS n FROM events WHERE country = {variables.c} GROUP BY ROLLUP (browser)",
            "GROUPING SETS",
        ),
        ("SELECT upper(country) AS u FROM events WHERE country = {variables.c}", "does not output"),
        ("SELECT revenue FROM events WHERE country = {variables.c}", "does not output"),
        (
            "SELECT country, row_number() OVER (ORDER BY revenue) AS r FROM events WHERE country = {variables.c}",
            "window",
        ),
        ("SELECT country FROM (SELECT * FROM events WHERE country = {variables.c}) t", "used outside"),
        (
            "SELECT country, count(*) AS n FROM events GROUP BY country HAVING count(*) > {variables.m}",
            "used outside",
        ),
        ("SELECT {variables.c} AS c, country FROM events WHERE country = {variables.c}", "used outside"),
        (
            "SELECT country FROM events WHERE country IN (SELECT country FROM events WHERE browser = {variables.c})",
            "used outside",
        ),
    ];
    for (sql, reason) in ineligible {
        let decided = eligibility(e, sql, vars.clone()).await;
        assert!(decided.reason().is_some_and(|r| r.contains(reason)), "{sql}: {decided:?}");
    }
}

/// An endpoint of the invariant test and how to draw its variables.
struct Case {
    sql: &'static str,
    variables: serde_json::Value,
    draw: fn(&mut StdRng) -> BTreeMap<String, BoundValue>,
}

const COUNTRIES: [&str; 5] = ["US", "DE", "NL", "JP", "ZZ"];
const BROWSERS: [&str; 4] = ["Chrome", "Safari", "Opera", "Lynx"];

fn pick(rng: &mut StdRng, from: &[&str]) -> String {
    from[rng.random_range(0..from.len())].to_owned()
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            sql: "SELECT country, browser, count(*) AS n, sum(revenue) AS revenue FROM events \
                  WHERE country = {variables.country} AND browser != {variables.browser} \
                  GROUP BY country, browser ORDER BY country, browser",
            variables: json!({"country": string_var(), "browser": {"type": "String", "default": "Chrome"}}),
            draw: |rng| {
                BTreeMap::from([
                    ("country".into(), BoundValue::String(pick(rng, &COUNTRIES))),
                    ("browser".into(), BoundValue::String(pick(rng, &BROWSERS))),
                ])
            },
        },
        Case {
            sql: "SELECT timestamp, distinct_id, revenue FROM events \
                  WHERE revenue >= {variables.min} AND {variables.before} > timestamp AND event = 'purchase' \
                  ORDER BY timestamp, distinct_id, revenue",
            variables: json!({"min": {"type": "Number", "default": 0}, "before": {"type": "DateTime", "default": "2026-02-01T00:00:00Z"}}),
            draw: |rng| {
                let day = rng.random_range(0..95);
                let before =
                    time::macros::datetime!(2026-01-01 00:00 UTC) + time::Duration::hours(day * 24 + 7);
                BTreeMap::from([
                    ("min".into(), BoundValue::Number(f64::from(rng.random_range(0_u32..25_000)) / 100.0)),
                    ("before".into(), BoundValue::DateTime(before)),
                ])
            },
        },
        Case {
            sql: "WITH daily AS (SELECT CAST(timestamp AS DATE) AS day, country, revenue FROM events) \
                  SELECT day, country AS land, count(*) AS events, sum(revenue) AS revenue FROM daily \
                  WHERE day >= {variables.since} AND day < {variables.until} AND {variables.land} <= country \
                  GROUP BY day, country ORDER BY day, land",
            variables: json!({
                "since": {"type": "Date", "default": "2026-01-01"},
                "until": {"type": "Date", "default": "2026-02-01"},
                "land": string_var(),
            }),
            draw: |rng| {
                let start = time::macros::date!(2025 - 12 - 25);
                let since = start + time::Duration::days(rng.random_range(0..100));
                let until = since + time::Duration::days(rng.random_range(0..40));
                BTreeMap::from([
                    ("since".into(), BoundValue::Date(since)),
                    ("until".into(), BoundValue::Date(until)),
                    ("land".into(), BoundValue::String(pick(rng, &COUNTRIES))),
                ])
            },
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_materialized_answer_equals_the_live_answer() {
    let demo = demo().await;
    // Stored rows held in memory once read (as the default keeps a few), and read from the file each time (as
    // on Ballista, where every query is a job of the cluster's: there once).
    materialized_answers_as_live(&demo.1, 2026).await;
    if !crate::tests::on_ballista() {
        let from_files =
            demo.1.clone().with_limits(EngineLimits { stored_rows_in_memory: 0, ..EngineLimits::default() });
        materialized_answers_as_live(&from_files, 2027).await;
    }
}

async fn materialized_answers_as_live(engine: &DataFusionEngine, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for case in cases() {
        let q = query(case.sql, case.variables.clone());
        let filters = match eligibility(engine, case.sql, case.variables.clone()).await {
            Eligibility::Eligible { filters, .. } => filters,
            other => panic!("{}: {other:?}", case.sql),
        };
        assert!(!filters.is_empty());
        let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        let stored = ResultStorage::write(engine, project(), &q, &at).await.unwrap().rows;
        assert!(stored > 0);
        // Every query is a job of the cluster on Ballista, about a quarter of a second each: fewer there.
        let rounds = if crate::tests::on_ballista() { 12 } else { 40 };
        for round in 0..rounds {
            let variables = (case.draw)(&mut rng);
            let (limit, offset) =
                if round % 4 == 0 { (10_000, 0) } else { (rng.random_range(1..50), rng.random_range(0..80)) };
            let live = engine.execute(project(), &q, &variables, limit, offset).await.unwrap();
            let bound = filters.iter().map(|f| (f.clone(), variables[&f.variable].clone())).collect();
            let mut read = engine.read(project(), &at, bound, limit, offset).await.unwrap();
            // What each read differs; the stored result never needs more rows than the live tables, nor than it
            // holds (rows held in memory are read whole, where the tables' bounds may skip every row).
            let (stored_read, live_read) = (read.statistics.rows_read, live.statistics.rows_read);
            assert!(
                stored_read <= live_read.max(Some(stored)),
                "{stored_read:?} rows read from the stored result of {stored}, {live_read:?} live"
            );
            read.statistics = live.statistics;
            // A stored result pins no table versions; the live run says which it read.
            assert_eq!(read.read, Vec::new());
            assert_eq!(live.read, [domain::TableVersion { table: "events".into(), version: 0 }]);
            read.read = live.read.clone();
            assert_eq!(read, live, "{} with {variables:?}, limit {limit}, offset {offset}", case.sql);
        }
        ResultStorage::remove(engine, project(), &at).await.unwrap();
    }
    assert!(ResultStorage::locations(engine).await.unwrap().is_empty(), "every location was removed");
}

fn date(rng: &mut StdRng) -> time::Date {
    // The events span 2026-01-01 to 2026-03-31: some days fall before or after them.
    time::macros::date!(2025 - 12 - 20) + time::Duration::days(rng.random_range(0..110))
}

/// A `since` and an `until` day, sometimes the same day or in the wrong order (an empty range).
fn range(rng: &mut StdRng) -> BTreeMap<String, BoundValue> {
    let since = date(rng);
    let until =
        if rng.random_bool(0.2) { date(rng) } else { since + time::Duration::days(rng.random_range(0..30)) };
    BTreeMap::from([("since".into(), BoundValue::Date(since)), ("until".into(), BoundValue::Date(until))])
}

fn rollup_cases() -> Vec<Case> {
    let range_vars = || json!({"since": {"type": "Date", "default": "2026-01-01"}, "until": {"type": "Date", "default": "2026-02-01"}});
    vec![
        // The demo's own endpoint: totals per key, filtered by a day on a timestamp.
        Case {
            sql: "SELECT country, count(*) AS events, round(sum(revenue), 2) AS revenue FROM events \
                  WHERE timestamp >= {variables.since} GROUP BY country ORDER BY events DESC, country",
            variables: json!({"since": {"type": "Date", "default": "2026-01-01"}}),
            draw: |rng| BTreeMap::from([("since".into(), BoundValue::Date(date(rng)))]),
        },
        // Every recombinable aggregate, NULLs among the aggregated values and as a group key, a key the query
        // does not output, a range of days, an equality on another column (with values absent from the data),
        // HAVING and ORDER BY on aggregates.
        Case {
            sql: "SELECT NULLIF(browser, 'Opera') AS b, count(*) AS n, \
                  count(CASE WHEN event = 'purchase' THEN revenue END) AS purchases, \
                  sum(CASE WHEN event = 'purchase' THEN revenue END) AS total, \
                  min(CASE WHEN event = 'purchase' THEN revenue END) AS low, max(timestamp) AS last, \
                  avg(revenue) AS mean, avg(length(distinct_id)) AS id_length, \
                  sum(CAST(revenue * 100 AS BIGINT)) AS cents, min(DISTINCT country) AS first_country, \
                  sum(CAST(revenue * 2 AS DECIMAL(12, 2))) AS exact_total, avg(CAST(revenue * 2 AS DECIMAL(12, 2))) AS exact_mean \
                  FROM events \
                  WHERE timestamp >= {variables.since} AND timestamp < {variables.until} AND country = {variables.country} \
                  GROUP BY NULLIF(browser, 'Opera'), event HAVING count(*) > 1 \
                  ORDER BY n DESC, total DESC NULLS LAST, b NULLS FIRST, last",
            variables: json!({
                "since": {"type": "Date", "default": "2026-01-01"},
                "until": {"type": "Date", "default": "2026-02-01"},
                "country": string_var(),
            }),
            draw: |rng| {
                let mut variables = range(rng);
                variables.insert("country".into(), BoundValue::String(pick(rng, &COUNTRIES)));
                variables
            },
        },
        // No GROUP BY: one row even when no event passes (a count of 0, a sum of NULL).
        Case {
            sql: "SELECT count(*) AS n, sum(revenue) AS total, avg(revenue) AS mean, max(revenue) AS top FROM events \
                  WHERE timestamp >= {variables.since} AND timestamp < {variables.until}",
            variables: range_vars(),
            draw: range,
        },
        // DISTINCT counts, sums and averages, their values stored: filtered on other columns (a range of days and
        // a string), and on the group key alone.
        Case {
            sql: "SELECT country, count(DISTINCT distinct_id) AS users, count(DISTINCT event) AS kinds, \
                  sum(DISTINCT revenue) AS distinct_revenue, avg(DISTINCT revenue) AS distinct_mean, \
                  count(DISTINCT CASE WHEN event = 'purchase' THEN distinct_id END) AS buyers, count(*) AS n \
                  FROM events WHERE timestamp >= {variables.since} AND timestamp < {variables.until} \
                  AND browser != {variables.b} GROUP BY country ORDER BY users DESC, country",
            variables: json!({
                "since": {"type": "Date", "default": "2026-01-01"},
                "until": {"type": "Date", "default": "2026-02-01"},
                "b": string_var(),
            }),
            draw: |rng| {
                let mut variables = range(rng);
                variables.insert("b".into(), BoundValue::String(pick(rng, &["Chrome", "Safari", "none"])));
                variables
            },
        },
        Case {
            sql: "SELECT country, count(DISTINCT distinct_id) AS users, sum(revenue) AS total FROM events \
                  WHERE country = {variables.c} GROUP BY country",
            variables: json!({"c": string_var()}),
            draw: |rng| BTreeMap::from([("c".into(), BoundValue::String(pick(rng, &COUNTRIES)))]),
        },
        // A timestamp bounded by a date-time and a number: stored as they are.
        Case {
            sql: "SELECT country, max(revenue) AS top, count(*) AS n FROM events \
                  WHERE timestamp < {variables.before} AND revenue >= {variables.min} \
                  GROUP BY country ORDER BY top DESC, country",
            variables: json!({"min": {"type": "Number", "default": 0}, "before": {"type": "DateTime", "default": "2026-02-01T00:00:00Z"}}),
            draw: |rng| {
                let before = time::macros::datetime!(2025-12-30 00:00 UTC)
                    + time::Duration::minutes(rng.random_range(0..100 * 24 * 60));
                BTreeMap::from([
                    ("min".into(), BoundValue::Number(f64::from(rng.random_range(0_u32..30_000)) / 100.0)),
                    ("before".into(), BoundValue::DateTime(before)),
                ])
            },
        },
    ]
}

/// Relative difference allowed between a float of a rollup's answer and the live one: sums of partial sums add
/// the same numbers in another order, which may change the last units of a double's 53 bits (about 1e-16 of
/// the value each).
const FLOAT_TOLERANCE: f64 = 1e-9;

/// Whether two JSON values are equal, floats to within [`FLOAT_TOLERANCE`].
fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
            x == y || (x - y).abs() <= FLOAT_TOLERANCE * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((kx, x), (ky, y))| kx == ky && close(x, y))
        }
        _ => a == b,
    }
}

/// A version saved before aggregations filtered on their group keys were stored as rollups recorded its filters
/// by output column; its result, now refreshed as a rollup of its keys, answers those filters as the live query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollup_of_keys_answers_the_filters_a_version_recorded_before() {
    let demo = demo().await;
    let engine = &demo.1;
    let sql = "SELECT country, count(*) AS n, sum(revenue) AS total FROM events \
               WHERE country != {variables.c} GROUP BY country ORDER BY total DESC, country";
    let q = query(sql, json!({"c": string_var()}));
    let decided = eligibility(engine, sql, json!({"c": string_var()})).await;
    assert!(decided.rollup().is_some(), "{decided:?}");
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    ResultStorage::write(engine, project(), &q, &at).await.unwrap();
    let recorded = MaterializedFilter {
        column: domain::StoredColumn::Output("country".into()),
        op: CompareOp::NotEq,
        variable: "c".into(),
    };
    for country in ["US", "DE", "nowhere"] {
        let value = BoundValue::String(country.into());
        let variables = BTreeMap::from([("c".to_owned(), value.clone())]);
        let live = engine.execute(project(), &q, &variables, 100, 0).await.unwrap();
        let read = engine.read(project(), &at, vec![(recorded.clone(), value)], 100, 0).await.unwrap();
        assert!(live.row_count > 0);
        assert_eq!((&read.columns, &read.rows_json), (&live.columns, &live.rows_json), "{country}");
    }
    ResultStorage::remove(engine, project(), &at).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollups_answer_equals_the_live_answer() {
    let demo = demo().await;
    // On Ballista every query is a job of the cluster's (and a rollup is always read from its file there): the
    // same checks, fewer rounds.
    if crate::tests::on_ballista() {
        rollups_answer_as_live(&demo.1, 13, 5).await;
        return;
    }
    // Stored rows held in memory once read (as the default keeps a few), and read from the file each time.
    rollups_answer_as_live(&demo.1, 13, 30).await;
    let from_files =
        demo.1.clone().with_limits(EngineLimits { stored_rows_in_memory: 0, ..EngineLimits::default() });
    rollups_answer_as_live(&from_files, 14, 30).await;
}

async fn rollups_answer_as_live(engine: &DataFusionEngine, seed: u64, rounds: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut compared = 0;
    for case in rollup_cases() {
        let q = query(case.sql, case.variables.clone());
        let decided = eligibility(engine, case.sql, case.variables.clone()).await;
        let (Some(rollup), Some(filters)) = (decided.rollup(), decided.filters()) else {
            panic!("{} is a rollup: {decided:?}", case.sql)
        };
        let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        let stored = ResultStorage::write(engine, project(), &q, &at).await.unwrap().rows;
        assert!(
            stored > 0 && stored <= 20_000,
            "{stored} rows stored, grouped by {:?}",
            crate::stored::rollup::grouping(rollup)
        );
        for round in 0..rounds {
            let variables = (case.draw)(&mut rng);
            let (limit, offset) =
                if round % 3 == 0 { (10_000, 0) } else { (rng.random_range(1..8), rng.random_range(0..12)) };
            let live = engine.execute(project(), &q, &variables, limit, offset).await.unwrap();
            let bound = filters.iter().map(|f| (f.clone(), variables[&f.variable].clone())).collect();
            let read = engine.read(project(), &at, bound, limit, offset).await.unwrap();
            let context = format!("{} with {variables:?}, limit {limit}, offset {offset}", case.sql);
            assert_eq!(read.columns, live.columns, "{context}");
            assert_eq!((read.row_count, read.has_more), (live.row_count, live.has_more), "{context}");
            let parse = |json: &str| serde_json::from_str::<serde_json::Value>(json).unwrap();
            let (read_rows, live_rows) = (parse(&read.rows_json), parse(&live.rows_json));
            assert!(close(&read_rows, &live_rows), "{context}:\n{read_rows}\n{live_rows}");
            compared += live.row_count;
        }
        // An export of a rollup is the same page.
        let variables = (case.draw)(&mut rng);
        let bound = filters.iter().map(|f| (f.clone(), variables[&f.variable].clone())).collect();
        let export =
            ResultStorage::export(engine, project(), &at, bound, 100, 0, ResultFormat::Csv).await.unwrap();
        let live = engine.execute(project(), &q, &variables, 100, 0).await.unwrap();
        assert_eq!((export.rows, &export.columns), (live.row_count as u64, &live.columns), "{}", case.sql);
        ResultStorage::remove(engine, project(), &at).await.unwrap();
    }
    assert!(compared > 10 * rounds, "the answers compared hold rows ({compared})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_plan_of_rows_held_in_memory_is_kept_and_each_run_binds_its_own_values() {
    // On Ballista stored rows are read from their files by the cluster: nothing is held here.
    if crate::tests::on_ballista() {
        return;
    }
    let demo = demo().await;
    let engine = &demo.1;
    let day = |d: &str| {
        BoundValue::Date(
            time::Date::parse(d, time::macros::format_description!("[year]-[month]-[day]")).unwrap(),
        )
    };
    // A rollup (its keys and a day filtered), final rows filtered on an output, and a query whose answer
    // changes with time: the last is planned for each run.
    let sqls = [
        (rollup_cases().remove(0).sql, true),
        ("SELECT country, count(*) AS n FROM events WHERE country >= {variables.c} GROUP BY country ORDER BY country", true),
        ("SELECT country, count(*) AS n, max(timestamp) < now() AS past FROM events \
          WHERE timestamp >= {variables.since} GROUP BY country ORDER BY country", false),
    ];
    for (sql, kept) in sqls {
        let variables = if sql.contains("variables.c}") {
            json!({"c": string_var()})
        } else {
            json!({"since": {"type": "Date", "default": "2026-01-01"}})
        };
        let q = query(sql, variables.clone());
        let decided = eligibility(engine, sql, variables).await;
        let filters = decided.filters().unwrap_or_else(|| panic!("{sql}: {decided:?}")).to_vec();
        let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        ResultStorage::write(engine, project(), &q, &at).await.unwrap();
        let values: Vec<BTreeMap<String, BoundValue>> = if sql.contains("variables.c}") {
            ["A", "DE", "FR", "US", "ZZ"]
                .iter()
                .map(|c| BTreeMap::from([("c".into(), BoundValue::String((*c).into()))]))
                .collect()
        } else {
            ["2025-12-01", "2026-01-15", "2026-02-10", "2026-03-20", "2027-01-01"]
                .iter()
                .map(|d| BTreeMap::from([("since".into(), day(d))]))
                .collect()
        };
        // The first read prepares the result (planning the query a rollup rolls up) and plans its read.
        let bound = filters.iter().map(|f| (f.clone(), values[0][&f.variable].clone())).collect();
        engine.read(project(), &at, bound, 100, 0).await.unwrap();
        let mut answers = std::collections::BTreeSet::new();
        let (mut kept_plans, mut new_plans) = (0, 0);
        for variables in &values {
            let live = engine.execute(project(), &q, variables, 100, 0).await.unwrap();
            let bound = filters.iter().map(|f| (f.clone(), variables[&f.variable].clone())).collect();
            let before = engine.metrics.plans();
            let read = engine.read(project(), &at, bound, 100, 0).await.unwrap();
            let after = engine.metrics.plans();
            (kept_plans, new_plans) = (kept_plans + after.0 - before.0, new_plans + after.1 - before.1);
            let parse = |json: &str| serde_json::from_str::<serde_json::Value>(json).unwrap();
            let context = format!("{sql} with {variables:?}");
            assert_eq!((read.columns, read.row_count), (live.columns, live.row_count), "{context}");
            assert!(close(&parse(&read.rows_json), &parse(&live.rows_json)), "{context}");
            answers.insert(read.rows_json);
        }
        assert!(answers.len() >= 3, "{sql}: the values chose different rows ({answers:?})");
        // Kept: planned at the first run, executed again by every later run with its values.
        let runs = values.len() as u64;
        let expected = if kept { (runs, 0) } else { (0, runs) };
        assert_eq!((kept_plans, new_plans), expected, "{sql}: (kept, new) read plans");
        // The cache weighs each prepared result with the read plans it keeps.
        engine.prepared.run_pending_tasks();
        let weights: usize = engine.prepared.iter().map(|(_, prepared)| prepared.weight()).sum();
        assert_eq!(engine.prepared.weighted_size(), weights as u64, "{sql}");
        ResultStorage::remove(engine, project(), &at).await.unwrap();
    }
}

#[tokio::test]
async fn a_rollup_past_its_row_limit_is_refused_saying_why() {
    let demo = demo().await;
    let engine = demo.1.clone().with_limits(EngineLimits { rollup_rows: 100, ..EngineLimits::default() });
    let q = query(
        "SELECT country, count(*) AS n FROM events WHERE timestamp < {variables.before} GROUP BY country",
        json!({"before": {"type": "DateTime", "default": "2026-02-01T00:00:00Z"}}),
    );
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    let refused = ResultStorage::write(&engine, project(), &q, &at).await;
    assert!(
        matches!(&refused, Err(EngineError::InvalidQuery(reason))
            if reason.contains("more than 100 rows, grouped by events.country, events.timestamp")),
        "{refused:?}"
    );
    assert!(ResultStorage::locations(&engine).await.unwrap().is_empty(), "nothing is left of it");
    // By day, the same totals fit.
    let by_day = query(
        "SELECT country, count(*) AS n FROM events WHERE timestamp >= {variables.since} GROUP BY country",
        json!({"since": {"type": "Date", "default": "2026-02-01"}}),
    );
    assert!(ResultStorage::write(&engine, project(), &by_day, &at)
        .await
        .is_err_and(|e| e.to_string().contains("more than 100")));
    let few =
        query("SELECT count(*) AS n FROM events WHERE country = {variables.c}", json!({"c": string_var()}));
    assert_eq!(ResultStorage::write(&engine, project(), &few, &at).await.unwrap().rows, 10);
    ResultStorage::remove(&engine, project(), &at).await.unwrap();
    // A rollup of the keys alone stores the query's own groups, however many: as its final rows would.
    let keys = query(
        "SELECT distinct_id, count(*) AS n FROM events WHERE distinct_id != {variables.c} GROUP BY distinct_id",
        json!({"c": string_var()}),
    );
    assert!(ResultStorage::write(&engine, project(), &keys, &at).await.unwrap().rows > 100);
    ResultStorage::remove(&engine, project(), &at).await.unwrap();

    // Too many DISTINCT values with the keys alone: the query's final rows are stored instead, as before such
    // rollups, filtered on the outputs the rollup's filters name; refreshed in full, and the status says why.
    let sql =
        "SELECT country, count(DISTINCT distinct_id) AS users FROM events WHERE country = {variables.c} \
               GROUP BY country";
    let users = query(sql, json!({"c": string_var()}));
    let decided = eligibility(&engine, sql, json!({"c": string_var()})).await;
    let filters = decided.filters().unwrap();
    assert_eq!(filters[0].column, domain::StoredColumn::Key(0));
    let stored = ResultStorage::write(&engine, project(), &users, &at).await.unwrap();
    assert!(stored.rows < 100, "the final rows: {stored:?}");
    let reason = stored.fold.reason().unwrap_or_default().to_owned();
    assert!(reason.contains("more than --max-rollup-rows (100)"), "{reason}");
    for country in ["US", "DE", "nowhere"] {
        let value = BoundValue::String(country.into());
        let variables = BTreeMap::from([("c".to_owned(), value.clone())]);
        let live = engine.execute(project(), &users, &variables, 100, 0).await.unwrap();
        let read = engine.read(project(), &at, vec![(filters[0].clone(), value)], 100, 0).await.unwrap();
        assert_eq!((&read.columns, &read.rows_json), (&live.columns, &live.rows_json), "{country}");
    }
    let result = stored_at(&at, stored);
    self::refused(&engine, &users, &result, &reason).await;
    ResultStorage::remove(&engine, project(), &at).await.unwrap();
    // Filtered on other columns too, final rows cannot answer: refused as any rollup too fine.
    let by_browser = query(
        "SELECT country, count(DISTINCT distinct_id) AS users FROM events WHERE browser = {variables.c} \
         GROUP BY country",
        json!({"c": string_var()}),
    );
    let refused = ResultStorage::write(&engine, project(), &by_browser, &at).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("events.browser, events.distinct_id")),
        "{refused:?}"
    );
    assert!(ResultStorage::locations(&engine).await.unwrap().is_empty(), "nothing is left of it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_exported_from_a_stored_result_equals_the_live_page() {
    let demo = demo().await;
    let engine = &demo.1;
    let mut rng = StdRng::seed_from_u64(7);
    let mut rows = 0;
    for case in cases().into_iter().take(2) {
        let q = query(case.sql, case.variables.clone());
        let Eligibility::Eligible { filters, .. } =
            eligibility(engine, case.sql, case.variables.clone()).await
        else {
            panic!("{} can be materialized", case.sql)
        };
        let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        ResultStorage::write(engine, project(), &q, &at).await.unwrap();
        for format in [ResultFormat::Csv, ResultFormat::NdJson] {
            for _ in 0..5 {
                let variables = (case.draw)(&mut rng);
                let (limit, offset) = (rng.random_range(1..200), rng.random_range(0..40));
                let live = QueryEngine::export(engine, project(), &q, &variables, limit, offset, format)
                    .await
                    .unwrap();
                let bound = filters.iter().map(|f| (f.clone(), variables[&f.variable].clone())).collect();
                let stored = ResultStorage::export(engine, project(), &at, bound, limit, offset, format)
                    .await
                    .unwrap();
                rows += live.rows;
                assert_eq!(
                    (&stored.digest, stored.bytes, stored.rows, stored.has_more),
                    (&live.digest, live.bytes, live.rows, live.has_more),
                    "{} as {format:?} with {variables:?}, limit {limit}, offset {offset}",
                    case.sql
                );
                assert_eq!(stored.columns, live.columns);
            }
        }
        ResultStorage::remove(engine, project(), &at).await.unwrap();
    }
    assert!(rows > 100, "the pages compared hold rows ({rows})");
}

#[tokio::test]
async fn locations_are_listed_and_removed_per_attempt_or_per_endpoint() {
    let local = demo().await;
    locations_are_listed_and_removed(&local).await;
    let endpoints = local.0.as_ref().unwrap().join("projects/1/materializations");
    assert!(!endpoints.exists(), "removing the last result leaves no empty directories");
    locations_are_listed_and_removed(&demo_on(None).await).await;
}

async fn locations_are_listed_and_removed(demo: &Demo) {
    let engine = &demo.1;
    let q = query("SELECT country, count(*) AS n FROM events GROUP BY country ORDER BY country", json!({}));
    let endpoint = Uuid::new_v4();
    let first = attempt_location(endpoint, 1, Uuid::new_v4());
    let second = attempt_location(endpoint, 2, Uuid::new_v4());
    assert_eq!(ResultStorage::write(engine, project(), &q, &first).await.unwrap().rows, 10);
    ResultStorage::write(engine, project(), &q, &second).await.unwrap();
    let mut found: Vec<String> =
        ResultStorage::locations(engine).await.unwrap().into_iter().map(|(_, l)| l).collect();
    found.sort();
    let mut expected = vec![first.clone(), second.clone()];
    expected.sort();
    assert_eq!(found, expected);

    ResultStorage::remove(engine, project(), &first).await.unwrap();
    assert_eq!(ResultStorage::locations(engine).await.unwrap(), vec![(project(), second.clone())]);
    ResultStorage::remove(engine, project(), &endpoint.to_string()).await.unwrap();
    assert!(ResultStorage::locations(engine).await.unwrap().is_empty());
    // Removing what is gone succeeds; a location that could leave the project's directory is refused.
    ResultStorage::remove(engine, project(), &first).await.unwrap();
    assert!(ResultStorage::remove(engine, project(), "../../tables").await.is_err());
    assert!(ResultStorage::write(engine, project(), &q, "x/../../y").await.is_err());
}

#[tokio::test]
async fn a_failed_write_leaves_nothing_behind() {
    let demo = demo().await;
    let engine = &demo.1;
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    let limited =
        query("SELECT country FROM events WHERE country = {variables.c} LIMIT 3", json!({"c": string_var()}));
    assert!(matches!(
        ResultStorage::write(engine, project(), &limited, &at).await,
        Err(EngineError::InvalidQuery(reason)) if reason.contains("LIMIT")
    ));
    let failing = query("SELECT CAST(event AS INT) AS n FROM events", json!({}));
    assert!(ResultStorage::write(engine, project(), &failing, &at).await.is_err());
    assert!(ResultStorage::locations(engine).await.unwrap().is_empty());
}

/// The table's files as paths relative to the project.
async fn table_files(engine: &DataFusionEngine, table: &str) -> std::collections::BTreeSet<String> {
    let prefix = catalog::table_prefix(project(), table);
    let Some(catalog::Current::Files(snapshot)) = catalog::current(engine.storage(), &prefix).await.unwrap()
    else {
        panic!("{table} has files")
    };
    let base = format!("projects/{}/", project());
    snapshot
        .files
        .iter()
        .map(|file| file.location.to_string().strip_prefix(&base).unwrap().to_owned())
        .collect()
}

/// Appends `rows` demo events (drawn from `seed`) as one Parquet body, and returns the files the append added.
async fn append_events(engine: &DataFusionEngine, rows: usize, seed: u64) -> Vec<String> {
    append_events_as(engine, domain::TableFormat::Parquet, rows, seed).await
}

/// [`append_events`] with a body of `format`: Parquet (staged, read by the engine's reader) or NDJSON (held in
/// memory, as small appends are).
async fn append_events_as(
    engine: &DataFusionEngine,
    format: domain::TableFormat,
    rows: usize,
    seed: u64,
) -> Vec<String> {
    let before = table_files(engine, "events").await;
    let mut body = Vec::new();
    if format == domain::TableFormat::NdJson {
        let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(&mut body);
        for batch in demo::events(rows, seed) {
            writer.write(&batch).unwrap();
        }
        writer.finish().unwrap();
    } else {
        let mut writer =
            datafusion::parquet::arrow::ArrowWriter::try_new(&mut body, demo::events_schema(), None).unwrap();
        for batch in demo::events(rows, seed) {
            writer.write(&batch).unwrap();
        }
        writer.close().unwrap();
    }
    let upload = domain::Upload {
        format,
        mode: domain::WriteMode::Append,
        body: Box::pin(futures_util::stream::iter([Ok(bytes::Bytes::from(body))])),
        limit_bytes: 1 << 24,
        tag: None,
        quarantine: false,
    };
    let events = domain::TableName::parse("events").unwrap();
    assert_eq!(
        domain::TableStore::write(engine, project(), &events, upload).await.unwrap().rows,
        rows as u64
    );
    table_files(engine, "events").await.difference(&before).cloned().collect()
}

/// A small dimension table `regions(country, region)` for joins.
async fn regions(engine: &DataFusionEngine) {
    use datafusion::arrow::array::{RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("country", DataType::Utf8, false),
        Field::new("region", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(StringArray::from(vec!["US", "DE", "NL", "JP", "FR", "GB"])),
            Arc::new(StringArray::from(vec!["Americas", "Europe", "Europe", "Asia", "Europe", "Europe"])),
        ],
    )
    .unwrap();
    imports::write_table(engine.storage(), project(), "regions", schema, std::iter::once(batch), &|_| ())
        .await
        .unwrap();
}

/// Endpoints whose stored results follow appended rows: every rollup of the invariant test, one joined with a
/// table that does not change, and rows (without an ORDER BY: their order is not defined, so they are compared
/// sorted).
fn foldable_cases() -> Vec<(Case, bool)> {
    let mut cases: Vec<(Case, bool)> = rollup_cases().into_iter().map(|case| (case, true)).collect();
    cases.push((
        Case {
            sql: "SELECT r.region, count(*) AS n, sum(e.revenue) AS total, max(e.timestamp) AS last \
                  FROM events e JOIN regions r ON e.country = r.country \
                  WHERE e.timestamp >= {variables.since} AND e.timestamp < {variables.until} \
                  GROUP BY r.region ORDER BY r.region",
            variables: json!({"since": {"type": "Date", "default": "2026-01-01"}, "until": {"type": "Date", "default": "2026-02-01"}}),
            draw: range,
        },
        true,
    ));
    // Aggregations filtered on their group keys only, or not at all: rollups of their keys, with the ORDER BY,
    // HAVING and expressions above the aggregates applied when a run reads them.
    cases.push((
        Case {
            sql: "SELECT country, sum(revenue) AS total, count(*) AS n, min(revenue) AS low, max(revenue) AS high, \
                  avg(revenue) AS mean FROM events WHERE country >= {variables.c} GROUP BY country \
                  ORDER BY total DESC, country",
            variables: json!({"c": string_var()}),
            draw: |rng| BTreeMap::from([("c".into(), BoundValue::String(pick(rng, &COUNTRIES)))]),
        },
        true,
    ));
    cases.push((
        Case {
            sql: "SELECT browser, count(*) AS n, round(sum(revenue) / count(*), 2) AS per_event FROM events \
                  GROUP BY browser HAVING count(*) > 1 ORDER BY n DESC, browser",
            variables: json!({}),
            draw: |_| BTreeMap::new(),
        },
        true,
    ));
    cases.push((
        Case {
            // `replace` and `lpad` are deterministic, though the engine's memory bound marks them volatile.
            sql: "SELECT timestamp, distinct_id, country, revenue, revenue * 2 AS double, \
                  lpad(replace(country, 'U', 'u'), 4, '*') AS padded FROM events \
                  WHERE revenue >= {variables.min} AND country = {variables.country} AND event = 'purchase'",
            variables: json!({"min": {"type": "Number", "default": 0}, "country": string_var()}),
            draw: |rng| {
                BTreeMap::from([
                    ("min".into(), BoundValue::Number(f64::from(rng.random_range(0_u32..25_000)) / 100.0)),
                    ("country".into(), BoundValue::String(pick(rng, &COUNTRIES))),
                ])
            },
        },
        false,
    ));
    // Rows in the query's ORDER BY of output columns: each part is in that order, a read merges them. Its keys
    // are every column, so that the live answer's order is defined up to equal rows.
    cases.push((
        Case {
            sql: "SELECT revenue, country, browser, timestamp, distinct_id FROM events \
                  WHERE revenue >= {variables.min} AND browser = {variables.browser} \
                  ORDER BY revenue DESC NULLS FIRST, country, timestamp DESC, distinct_id",
            variables: json!({"min": {"type": "Number", "default": 0}, "browser": string_var()}),
            draw: |rng| {
                BTreeMap::from([
                    ("min".into(), BoundValue::Number(f64::from(rng.random_range(0_u32..25_000)) / 100.0)),
                    ("browser".into(), BoundValue::String(pick(rng, &BROWSERS))),
                ])
            },
        },
        true,
    ));
    // A DISTINCT's rows, in an ORDER BY: parts may repeat a row, a read keeps it once.
    cases.push((
        Case {
            sql: "SELECT DISTINCT country, browser, event FROM events WHERE browser = {variables.browser} \
                  ORDER BY country DESC, event, browser",
            variables: json!({"browser": string_var()}),
            draw: |rng| BTreeMap::from([("browser".into(), BoundValue::String(pick(rng, &BROWSERS)))]),
        },
        true,
    ));
    cases
}

/// The rows of an answer as JSON, sorted when their order is not the query's.
fn rows_of_answer(result: &domain::QueryResult, ordered: bool) -> serde_json::Value {
    let mut rows: Vec<serde_json::Value> = serde_json::from_str(&result.rows_json).unwrap();
    if !ordered {
        rows.sort_by_key(|row| row.to_string());
    }
    serde_json::Value::Array(rows)
}

/// Compares the stored result at each location with the live answer, for three variable sets.
async fn answers_as_live(
    engine: &DataFusionEngine,
    case: &Case,
    ordered: bool,
    locations: &[(&str, &str)],
    rng: &mut StdRng,
    context: &str,
) -> usize {
    let q = query(case.sql, case.variables.clone());
    let decided = eligibility(engine, case.sql, case.variables.clone()).await;
    let filters = decided.filters().unwrap_or_else(|| panic!("{}: {decided:?}", case.sql)).to_vec();
    let mut compared = 0;
    for _ in 0..3 {
        let variables = (case.draw)(rng);
        let bound: Vec<_> = filters.iter().map(|f| (f.clone(), variables[&f.variable].clone())).collect();
        let live = engine.execute(project(), &q, &variables, 10_000, 0).await.unwrap();
        // Read as a prepared result held in memory, and from its files (as on Ballista, or past the limit).
        let from_files =
            engine.clone().with_limits(EngineLimits { stored_rows_in_memory: 0, ..EngineLimits::default() });
        for ((name, location), reader) in locations.iter().flat_map(|l| [(l, engine), (l, &from_files)]) {
            let read = reader.read(project(), location, bound.clone(), 10_000, 0).await.unwrap();
            let context = format!("{name}: {} {context}, with {variables:?}", case.sql);
            assert_eq!((&read.columns, read.row_count), (&live.columns, live.row_count), "{context}");
            let (read_rows, live_rows) = (rows_of_answer(&read, ordered), rows_of_answer(&live, ordered));
            assert!(close(&read_rows, &live_rows), "{context}:\n{read_rows}\n{live_rows}");
        }
        compared += live.row_count;
    }
    compared
}

/// On Ballista the executors list a table's files themselves, so a result cannot say which rows it holds: it is
/// refreshed in full, never folded.
async fn never_folded_on_a_cluster(engine: &DataFusionEngine) -> bool {
    if !crate::tests::on_ballista() {
        return false;
    }
    let q =
        query("SELECT count(*) AS n FROM events WHERE browser = {variables.c}", json!({"c": string_var()}));
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    let stored = ResultStorage::write(engine, project(), &q, &at).await.unwrap();
    assert_eq!(stored.coverage, None);
    assert!(stored.fold.reason().is_some_and(|r| r.contains("cannot tell which rows")), "{:?}", stored.fold);
    refused(engine, &q, &stored_at(&at, stored), "cannot tell which rows").await;
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folded_result_equals_a_full_refresh_and_the_live_answer() {
    let demo = demo().await;
    let engine = &demo.1;
    if never_folded_on_a_cluster(engine).await {
        return;
    }
    regions(engine).await;
    let events = domain::TableName::parse("events").unwrap();
    let mut rng = StdRng::seed_from_u64(36);
    let (mut compared, mut compactions, mut table_rows) = (0, 0, DEMO_ROWS as u64);
    for (case, ordered) in foldable_cases() {
        let q = query(case.sql, case.variables.clone());
        let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        let written = ResultStorage::write(engine, project(), &q, &at).await.unwrap();
        assert_eq!(written.fold, domain::Fold::Incremental, "{}", case.sql);
        let mut result = stored_at(&at, written);
        // Appends of random sizes, folded one after the other, with compactions of the table between them
        // (which merge what was folded with what was not): each fold's result equals a full refresh of the
        // table as it then is, and the live answer. The table grows past `ONE_PARTITION_ROWS` on the way, so
        // folds are checked over plans in one partition and in several.
        for round in 0..3 {
            let mut appended = 0;
            for batch in 0..rng.random_range(1..12) {
                let rows = [1, 7, 300, 1_000][rng.random_range(0..4)];
                append_events(engine, rows, rng.random()).await;
                appended += rows as u64;
                table_rows += rows as u64;
                if rng.random_bool(0.3) || (round == 2 && batch == 0) {
                    // Compactions sort the table by a layout of its columns, or by none.
                    let layouts: [&[&str]; 3] = [&[], &["country"], &["distinct_id", "timestamp"]];
                    let layout: Vec<String> =
                        layouts[rng.random_range(0..3)].iter().map(|c| (*c).to_owned()).collect();
                    let keep = || async {
                        let after = domain::TableStore::newest_version(engine, project(), &events).await;
                        domain::Findable { pending: Vec::new(), after: after.unwrap().expect("a table") }
                    };
                    while domain::TableStore::compact(
                        engine,
                        project(),
                        &events,
                        keep().await,
                        layout.clone(),
                    )
                    .await
                    .unwrap()
                    .is_some()
                    {
                        compactions += 1;
                    }
                }
            }
            let folded = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
            let stored = engine.fold(project(), &q, &result, &folded).await.unwrap();
            let added = stored.folded.unwrap_or(u64::MAX);
            assert!(added <= appended * 4, "{added} rows added for {appended} appended: {}", case.sql);
            assert_eq!(stored.rows, result.row_count + added, "{}", case.sql);
            let full = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
            ResultStorage::write(engine, project(), &q, &full).await.unwrap();
            let locations = [("folded", folded.as_str()), ("refreshed", full.as_str())];
            let context = format!("after round {round}");
            compared += answers_as_live(engine, &case, ordered, &locations, &mut rng, &context).await;
            ResultStorage::remove(engine, project(), &full).await.unwrap();
            // The result folded from stays as it was (runs may be reading it) until it is removed.
            ResultStorage::remove(engine, project(), &result.location).await.unwrap();
            result = stored_at(&folded, stored);
        }
        // Nothing appended: the fold adds nothing.
        let again = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        let unchanged = engine.fold(project(), &q, &result, &again).await.unwrap();
        assert_eq!((unchanged.rows, unchanged.folded), (result.row_count, Some(0)));
        ResultStorage::remove(engine, project(), &again).await.unwrap();
        ResultStorage::remove(engine, project(), &result.location).await.unwrap();
    }
    assert!(compared > 500, "the answers compared hold rows ({compared})");
    assert!(compactions > 10, "folds followed the table through compactions ({compactions})");
    assert!(
        table_rows > crate::ONE_PARTITION_ROWS + DEMO_ROWS as u64,
        "more rows were appended than one partition holds ({table_rows} rows, {DEMO_ROWS} at first)"
    );
    assert!(ResultStorage::locations(engine).await.unwrap().is_empty(), "every location was removed");
}

/// A fold runs the plan the last fold of its query ran while the tables only had rows appended, rather than
/// planning the query again at each fold; a result holding other versions (a full refresh's, another endpoint's)
/// is folded with a plan made again.
#[tokio::test]
async fn a_fold_runs_the_plan_the_last_fold_ran_for_the_versions_it_left() {
    let demo = demo().await;
    let engine = &demo.1;
    if never_folded_on_a_cluster(engine).await {
        return;
    }
    let q = query(
        "SELECT country, count(*) AS n FROM events WHERE country = {variables.country} GROUP BY country",
        json!({"country": string_var()}),
    );
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    let mut result = stored_at(&at, ResultStorage::write(engine, project(), &q, &at).await.unwrap());
    let fold = |from: domain::StoredResult| {
        let q = q.clone();
        async move {
            append_events(engine, 50, 7).await;
            let to = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
            let before = engine.metrics.plans();
            let stored = engine.fold(project(), &q, &from, &to).await.unwrap();
            let (kept, new) = engine.metrics.plans();
            (stored_at(&to, stored), (kept - before.0, new - before.1))
        }
    };
    let (first, planned) = fold(result.clone()).await;
    assert_eq!(planned, (0, 1), "the first fold plans the query at the table's newest version");
    result = first;
    let physical = engine.fold_plans.physical(project(), &q).expect("the physical plan of one table's fold");
    for _ in 0..3 {
        let (next, planned) = fold(result.clone()).await;
        assert_eq!(planned, (1, 0), "each next fold runs the plan the last one ran");
        assert!(next.row_count > result.row_count, "the appended rows' partial rows were added");
        let kept = engine.fold_plans.physical(project(), &q).expect("kept");
        assert!(Arc::ptr_eq(&kept, &physical), "the same physical plan, each fold binding its own files");
        result = next;
    }
    // Each fold read the files appended since the one before, and only those: the stored counts are the live ones.
    let filter = MaterializedFilter {
        column: domain::StoredColumn::Output("country".into()),
        op: CompareOp::Eq,
        variable: "country".into(),
    };
    for country in ["US", "DE", "nowhere"] {
        let value = BoundValue::String(country.into());
        let variables = BTreeMap::from([("country".to_owned(), value.clone())]);
        let live = engine.execute(project(), &q, &variables, 100, 0).await.unwrap();
        let read =
            engine.read(project(), &result.location, vec![(filter.clone(), value)], 100, 0).await.unwrap();
        assert_eq!((&read.columns, &read.rows_json), (&live.columns, &live.rows_json), "{country}");
    }
    // A result of other versions (a full refresh after more rows) is folded with a plan made again.
    append_events(engine, 50, 8).await;
    let full = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    let refreshed = stored_at(&full, ResultStorage::write(engine, project(), &q, &full).await.unwrap());
    let (_, planned) = fold(refreshed).await;
    assert_eq!(planned, (0, 1), "not the last fold's plan");
}

/// Rows appended to a table kept decoded are kept by the append too, and a fold reads them from there instead
/// of opening the file just written: with that file gone from storage, the fold still answers as live runs do
/// (which read it from memory as well), and nothing was decoded for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_reads_the_rows_an_append_kept_decoded_from_memory() {
    let demo = demo().await;
    let engine = &demo.1;
    if never_folded_on_a_cluster(engine).await {
        return;
    }
    let hot = engine.hot.as_deref().expect("tables are kept decoded by default");
    let q = query(
        "SELECT country, date_trunc('day', timestamp) AS day, count(*) AS n, sum(revenue) AS total, \
         max(distinct_id) AS last FROM events GROUP BY country, day ORDER BY country, day",
        json!({}),
    );
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    let mut result = stored_at(&at, ResultStorage::write(engine, project(), &q, &at).await.unwrap());
    // Not yet kept: an append's rows are kept only beside the table's other files.
    let appended = append_events_as(engine, domain::TableFormat::NdJson, 30, 3).await;
    assert_eq!((appended.len(), hot.kept().1), (1, 0), "nothing kept before a run had the table decoded");
    engine.execute(project(), &q, &BTreeMap::new(), 1000, 0).await.unwrap();
    hot.settled().await;
    let (decoded, kept) = (hot.decodes(), hot.kept().1);
    assert_eq!(kept, table_files(engine, "events").await.len(), "the table's files decoded after a run");
    for (round, seed) in (0..3).zip(20..) {
        let appended = append_events_as(engine, domain::TableFormat::NdJson, 40, seed).await;
        assert_eq!(hot.kept().1, kept + round + 1, "each append's file kept at once");
        assert_eq!(hot.decodes(), decoded, "without decoding it");
        for file in &appended {
            let path = object_store::path::Path::from(format!("projects/{}/{file}", project()));
            engine.storage().delete(vec![path]).await.unwrap();
        }
        let to = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        let folded = engine.fold(project(), &q, &result, &to).await.unwrap();
        assert!(folded.folded.is_some_and(|added| added > 0), "round {round}: folded");
        result = stored_at(&to, folded);
        let live = engine.execute(project(), &q, &BTreeMap::new(), 1000, 0).await.unwrap();
        let read = engine.read(project(), &result.location, Vec::new(), 1000, 0).await.unwrap();
        assert_eq!((&read.columns, &read.rows_json), (&live.columns, &live.rows_json), "round {round}");
    }
}

/// A fold that finds a result of [`fold::MAX_PARTS`] parts merges them into one first (a rollup's partials per
/// group, rows in their order), instead of a full refresh: the result stays equal to the live answer, its parts
/// and (for a rollup) its rows stay bounded however many folds follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_merges_the_parts_of_a_result_that_has_too_many() {
    use crate::stored::fold;
    let demo = demo().await;
    let engine = &demo.1;
    if never_folded_on_a_cluster(engine).await {
        return;
    }
    regions(engine).await;
    let mut rng = StdRng::seed_from_u64(52);
    let cases = foldable_cases();
    // A rollup filtered on other columns, one of DISTINCT values, rows, rows in an ORDER BY, and a DISTINCT's.
    let rows = &cases[cases.len() - 3..];
    let chosen = [&cases[1], &cases[3], &rows[0], &rows[1], &rows[2]];
    for (case, ordered) in chosen {
        let q = query(case.sql, case.variables.clone());
        let rollup = eligibility(engine, case.sql, case.variables.clone()).await.rollup().is_some();
        let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
        let mut result = stored_at(&at, ResultStorage::write(engine, project(), &q, &at).await.unwrap());
        let parts = |location: &str| {
            let dir =
                demo.0.as_ref().unwrap().join(format!("projects/{}/materializations/{location}", project()));
            std::fs::read_dir(dir)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("part-"))
                .count()
        };
        let mut merged = 0;
        for round in 0..fold::MAX_PARTS + 3 {
            append_events(engine, 3, rng.random()).await;
            let folded = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
            let before = parts(&result.location);
            let stored = engine.fold(project(), &q, &result, &folded).await.unwrap();
            let after = parts(&folded);
            let covered = fold::Covered::of(stored.coverage.as_ref().unwrap()).unwrap();
            assert_eq!(covered.parts, Some(after), "the coverage counts the parts: {}", case.sql);
            if before >= fold::MAX_PARTS {
                // The earlier parts merged into one, and the appended rows' part after it.
                assert_eq!(after, 2, "{} round {round}", case.sql);
                merged += 1;
                let full = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
                let refreshed = ResultStorage::write(engine, project(), &q, &full).await.unwrap();
                if rollup || case.sql.contains("DISTINCT") {
                    // A rollup's merged part holds one row per stored group, as a full refresh does; a
                    // DISTINCT's each row once, the appended part's rows may repeat them.
                    assert!(stored.rows <= refreshed.rows + stored.folded.unwrap_or(0), "{}", case.sql);
                } else {
                    assert_eq!(stored.rows, refreshed.rows, "rows keep their count: {}", case.sql);
                }
                let locations = [("merged", folded.as_str()), ("refreshed", full.as_str())];
                let context = format!("after merging {before} parts");
                answers_as_live(engine, case, *ordered, &locations, &mut rng, &context).await;
                ResultStorage::remove(engine, project(), &full).await.unwrap();
            } else {
                assert_eq!(after, before + 1, "{} round {round}", case.sql);
            }
            ResultStorage::remove(engine, project(), &result.location).await.unwrap();
            result = stored_at(&folded, stored);
            if round == 5 {
                // A result of an earlier release, whose coverage does not count its parts: they are listed.
                let coverage = fold::Covered { parts: None, ..covered };
                result.coverage = Some(coverage.coverage());
            }
        }
        assert_eq!(merged, 1, "{}", case.sql);
        let locations = [("folded", result.location.as_str())];
        answers_as_live(engine, case, *ordered, &locations, &mut rng, "after the last fold").await;
        ResultStorage::remove(engine, project(), &result.location).await.unwrap();
    }
}

/// The stored result written at `location` (`stored`), as a record keeps it.
fn stored_at(location: &str, stored: domain::Stored) -> domain::StoredResult {
    let at = time::OffsetDateTime::UNIX_EPOCH;
    domain::StoredResult {
        version: 1,
        location: location.into(),
        row_count: stored.rows,
        materialized_at: at,
        data_as_of: at,
        coverage: stored.coverage,
        fold: Some(stored.fold),
    }
}

/// Whether folding into `from` is refused with a reason that says `why`, leaving nothing behind.
async fn refused(engine: &DataFusionEngine, q: &Query, from: &domain::StoredResult, why: &str) {
    let to = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    match engine.fold(project(), q, from, &to).await {
        Err(EngineError::InvalidQuery(detail)) => assert!(detail.contains(why), "{}: {detail}", q.sql),
        other => panic!("{}: {other:?}", q.sql),
    }
    let left: Vec<String> =
        ResultStorage::locations(engine).await.unwrap().into_iter().map(|(_, l)| l).collect();
    assert_eq!(left, std::slice::from_ref(&from.location), "nothing at {to}");
}

#[tokio::test]
async fn a_query_a_fold_cannot_follow_is_refused_with_the_reason_and_leaves_nothing() {
    let demo = demo().await;
    let engine = &demo.1;
    if never_folded_on_a_cluster(engine).await {
        return;
    }
    regions(engine).await;
    let vars = json!({"c": string_var()});
    let cases = [
        // An aggregate no rollup recombines is stored as its final rows.
        (
            "SELECT country, median(revenue) AS n FROM events WHERE country = {variables.c} GROUP BY country",
            "aggregate `median(events.revenue)` cannot be recombined",
        ),
        // A read sorts by output columns only.
        ("SELECT country FROM events WHERE country = {variables.c} ORDER BY revenue", "an ORDER BY"),
        (
            "SELECT country, browser FROM (SELECT DISTINCT country, browser FROM events) AS d \
             WHERE country = {variables.c}",
            "DISTINCT",
        ),
        (
            "SELECT a.country, count(*) AS n FROM events a JOIN events b ON a.distinct_id = b.distinct_id \
             WHERE a.browser = {variables.c} GROUP BY a.country",
            "reads `events` 2 times",
        ),
        (
            "SELECT country, count(*) AS n FROM events WHERE browser = {variables.c} \
             AND distinct_id IN (SELECT distinct_id FROM events WHERE event = 'purchase') GROUP BY country",
            "reads `events` 2 times",
        ),
        (
            "SELECT r.region, count(*) AS n FROM events e LEFT JOIN regions r ON e.country = r.country \
             WHERE e.browser = {variables.c} GROUP BY r.region",
            "Left join",
        ),
        // The rows a fold would add are chosen at another time than those stored before.
        (
            "SELECT distinct_id, country, timestamp FROM events WHERE country = {variables.c} \
             AND timestamp > now() - INTERVAL '15 seconds'",
            "`now()`",
        ),
        (
            "SELECT country, count(*) AS n FROM events WHERE browser = {variables.c} AND random() < 0.5 \
             GROUP BY country",
            "`random()`",
        ),
        (
            "SELECT distinct_id, country FROM events WHERE country = {variables.c} \
             AND CAST(timestamp AS DATE) = current_date",
            "`current_date()`",
        ),
    ];
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    for (sql, reason) in cases {
        let q = query(sql, vars.clone());
        let stored = ResultStorage::write(engine, project(), &q, &at).await.unwrap();
        // A result that changes with time says so, to be computed again within its freshness; and is not
        // folded even when no rows were appended.
        let changes_with_time = reason.starts_with("`");
        assert_eq!(stored.changes_with_time, changes_with_time, "{sql}");
        // The status says it is refreshed in full, and why: the reason a fold gives.
        assert!(stored.fold.reason().is_some_and(|r| r.contains(reason)), "{sql}: {:?}", stored.fold);
        let result = stored_at(&at, stored);
        if changes_with_time {
            refused(engine, &q, &result, reason).await;
        }
        append_events(engine, 5, 1).await;
        refused(engine, &q, &result, reason).await;
        ResultStorage::remove(engine, project(), &at).await.unwrap();
    }
    // Two tables changed, or one replaced: refreshed in full.
    let joined = "SELECT r.region, count(*) AS n FROM events e JOIN regions r ON e.country = r.country \
                  WHERE e.browser = {variables.c} GROUP BY r.region";
    let q = query(joined, vars.clone());
    let result = stored_at(&at, ResultStorage::write(engine, project(), &q, &at).await.unwrap());
    append_events(engine, 5, 2).await;
    regions(engine).await;
    refused(engine, &q, &result, "replaced").await;
    let result = stored_at(&at, ResultStorage::write(engine, project(), &q, &at).await.unwrap());
    append_events(engine, 5, 3).await;
    let upload = domain::Upload {
        format: domain::TableFormat::Csv,
        mode: domain::WriteMode::Append,
        body: Box::pin(futures_util::stream::iter([Ok(bytes::Bytes::from("country,region\nIT,Europe\n"))])),
        limit_bytes: 1 << 20,
        tag: None,
        quarantine: false,
    };
    let regions_table = domain::TableName::parse("regions").unwrap();
    domain::TableStore::write(engine, project(), &regions_table, upload).await.unwrap();
    refused(engine, &q, &result, "changed").await;
    // A result that does not say what it holds, or says it in a way that does not read, is refreshed in full.
    refused(engine, &q, &domain::StoredResult { coverage: None, ..result.clone() }, "does not say").await;
    let unreadable = Some(domain::Coverage("{".into()));
    refused(engine, &q, &domain::StoredResult { coverage: unreadable, ..result }, "coverage").await;
    ResultStorage::remove(engine, project(), &at).await.unwrap();
}

/// `min` and `max` of floats follow IEEE 754's total order (NaN above every number, -0.0 below 0.0, infinities
/// as themselves) grouped and ungrouped, and a rollup's stored result answers as the live query. DataFusion's own
/// grouped functions answer the `max` of {2.5, NaN, -3.0} as -3.0 and the `min` of {inf} as `f64::MAX`.
#[tokio::test]
async fn min_and_max_of_floats_follow_one_order_grouped_ungrouped_and_stored() {
    use datafusion::arrow::array::{Array, Float64Array, RecordBatch, StringArray};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    // A Ballista cluster's executors run DataFusion's own functions (docs/materialization.md says so).
    if crate::tests::on_ballista() {
        return;
    }
    let demo = demo().await;
    let engine = &demo.1;
    let groups: [(&str, &[Option<f64>], f64, f64); 6] = [
        ("a-nan", &[Some(2.5), Some(f64::NAN), Some(-3.0)], -3.0, f64::NAN),
        ("b-nan-first", &[Some(f64::NAN), Some(1.0)], 1.0, f64::NAN),
        ("c-inf", &[Some(f64::INFINITY)], f64::INFINITY, f64::INFINITY),
        ("d-minus-inf", &[Some(f64::NEG_INFINITY), None], f64::NEG_INFINITY, f64::NEG_INFINITY),
        ("e-zeros", &[Some(0.0), Some(-0.0), Some(0.0)], -0.0, 0.0),
        ("f-zeros", &[Some(-0.0), Some(0.0), Some(-0.0)], -0.0, 0.0),
    ];
    let (names, values): (Vec<&str>, Vec<Option<f64>>) =
        groups.iter().flat_map(|(g, xs, _, _)| xs.iter().map(move |x| (*g, *x))).unzip();
    let schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Utf8, false),
        Field::new("k", DataType::Utf8, false),
        Field::new("x", DataType::Float64, true),
    ]));
    let kinds = StringArray::from(vec!["one"; names.len()]);
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(StringArray::from(names)), Arc::new(kinds), Arc::new(Float64Array::from(values))],
    )
    .unwrap();
    imports::write_table(engine.storage(), project(), "floats", schema, std::iter::once(batch), &|_| ())
        .await
        .unwrap();
    // The expected answers as text, written by arrow's own cast (as the queries write theirs).
    let text = |values: Vec<f64>| -> Vec<String> {
        let cast = cast(&Float64Array::from(values), &DataType::Utf8).unwrap();
        let strings = cast.as_any().downcast_ref::<StringArray>().unwrap();
        (0..strings.len()).map(|i| strings.value(i).to_owned()).collect()
    };
    let lows = text(groups.iter().map(|(_, _, lo, _)| *lo).collect());
    let highs = text(groups.iter().map(|(_, _, _, hi)| *hi).collect());
    let answer = |json: &str| -> Vec<(String, String, String)> {
        let rows: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
        let text = |v: &serde_json::Value| v.as_str().unwrap().to_owned();
        rows.iter().map(|r| (text(&r["g"]), text(&r["lo"]), text(&r["hi"]))).collect()
    };
    let expected: Vec<(String, String, String)> = groups
        .iter()
        .zip(lows.into_iter().zip(highs))
        .map(|((g, ..), (lo, hi))| ((*g).to_owned(), lo, hi))
        .collect();
    let none = BTreeMap::new();

    let grouped = query(
        "SELECT g, CAST(min(x) AS VARCHAR) AS lo, CAST(max(x) AS VARCHAR) AS hi FROM floats GROUP BY g ORDER BY g",
        json!({}),
    );
    let live = engine.execute(project(), &grouped, &none, 100, 0).await.unwrap();
    assert_eq!(answer(&live.rows_json), expected, "grouped");

    // The whole table, without GROUP BY or WHERE (which an engine may answer from the files' statistics).
    let whole = "SELECT CAST(min(x) AS VARCHAR) AS lo, CAST(max(x) AS VARCHAR) AS hi FROM floats";
    let whole = engine.execute(project(), &query(whole, json!({})), &none, 100, 0).await.unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&whole.rows_json).unwrap();
    let ends = text(vec![f64::NEG_INFINITY, f64::NAN]);
    assert_eq!(
        (rows[0]["lo"].as_str(), rows[0]["hi"].as_str()),
        (Some(ends[0].as_str()), Some(ends[1].as_str()))
    );
    // Each group alone, without GROUP BY.
    for (g, lo, hi) in &expected {
        let alone = format!(
            "SELECT CAST(min(x) AS VARCHAR) AS lo, CAST(max(x) AS VARCHAR) AS hi FROM floats WHERE g = '{g}'"
        );
        let alone = engine.execute(project(), &query(&alone, json!({})), &none, 100, 0).await.unwrap();
        let rows: Vec<serde_json::Value> = serde_json::from_str(&alone.rows_json).unwrap();
        assert_eq!(
            (rows[0]["lo"].as_str(), rows[0]["hi"].as_str()),
            (Some(lo.as_str()), Some(hi.as_str())),
            "{g}"
        );
    }
    // A rollup (stored grouped by `g` and the filtered `k`, its partials aggregated again when read).
    let rolled = "SELECT g, CAST(min(x) AS VARCHAR) AS lo, CAST(max(x) AS VARCHAR) AS hi FROM floats \
                  WHERE k = {variables.k} GROUP BY g ORDER BY g";
    let variables = json!({"k": {"type": "String", "default": "one"}});
    let decided = eligibility(engine, rolled, variables.clone()).await;
    let (Some(_), Some(filters)) = (decided.rollup(), decided.filters()) else {
        panic!("a rollup: {decided:?}")
    };
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    ResultStorage::write(engine, project(), &query(rolled, variables), &at).await.unwrap();
    let bound: Vec<_> = filters.iter().map(|f| (f.clone(), BoundValue::String("one".into()))).collect();
    let stored = engine.read(project(), &at, bound.clone(), 100, 0).await.unwrap();
    assert_eq!(answer(&stored.rows_json), expected, "stored");
    // DISTINCT values of floats (NaN, both zeros, infinities, NULL) stored and counted, summed and averaged
    // again: as the live query counts them.
    let distinct = "SELECT g, count(DISTINCT x) AS n, CAST(sum(DISTINCT x) AS VARCHAR) AS s, \
                    CAST(avg(DISTINCT x) AS VARCHAR) AS m FROM floats WHERE k = {variables.k} GROUP BY g ORDER BY g";
    let variables = json!({"k": {"type": "String", "default": "one"}});
    let decided = eligibility(engine, distinct, variables.clone()).await;
    assert_eq!(
        decided.rollup().map(|r| r.distinct.clone()),
        Some(vec!["floats.x".to_owned()]),
        "{decided:?}"
    );
    let distinct = query(distinct, variables);
    // A location of its own, as every refresh has (a result read once is kept by its location).
    ResultStorage::remove(engine, project(), &at).await.unwrap();
    let at = attempt_location(Uuid::new_v4(), 1, Uuid::new_v4());
    ResultStorage::write(engine, project(), &distinct, &at).await.unwrap();
    let one = BTreeMap::from([("k".to_owned(), BoundValue::String("one".into()))]);
    let live = engine.execute(project(), &distinct, &one, 100, 0).await.unwrap();
    let stored = engine.read(project(), &at, bound, 100, 0).await.unwrap();
    assert_eq!((&stored.columns, &stored.rows_json), (&live.columns, &live.rows_json), "DISTINCT values");
    ResultStorage::remove(engine, project(), &at).await.unwrap();
}
