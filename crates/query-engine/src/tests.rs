use crate::tables::imports;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use domain::ColumnType;
use object_store::memory::InMemory;
use serde_json::json;

use super::*;

fn project(id: i64) -> ProjectId {
    ProjectId::new(id).unwrap()
}

pub(crate) fn query(sql: &str, variables: serde_json::Value) -> Query {
    Query::try_from(&json!({"kind": "SQLQuery", "query": sql, "variables": variables})).unwrap()
}

/// A temporary directory removed when the test ends.
pub(crate) struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn temp_dir(prefix: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// Writes `events(country, revenue)` for project 1 into a fresh data directory.
pub(crate) async fn engine_with_events() -> (DataFusionEngine, TempDir) {
    let dir = temp_dir("qe-test");
    // Written as tables were before versions: Parquet files directly in the table's directory.
    let table = dir.join("projects/1/tables/events");
    std::fs::create_dir_all(&table).unwrap();
    write_events(&table.join("part-0.parquet"), &[("US", 10), ("FR", 20)]);
    let engine = engine_on(Storage::local(&dir).unwrap()).await;
    // Made a Delta table in place, as `migrate` does with what an earlier release wrote.
    let upgraded = engine.upgrade_tables().await.unwrap();
    assert_eq!(upgraded.converted, vec!["1/events".to_owned()]);
    (engine, dir)
}

/// Writes `events(country, revenue)` rows as one Parquet file at `path`.
pub(crate) fn write_events(path: &std::path::Path, rows: &[(&str, i64)]) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("country", DataType::Utf8, false),
        Field::new("revenue", DataType::Int64, false),
    ]));
    let countries: StringArray = rows.iter().map(|(country, _)| Some(*country)).collect();
    let revenues: Int64Array = rows.iter().map(|(_, revenue)| Some(*revenue)).collect();
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(countries), Arc::new(revenues)]).unwrap();
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// The engine the suite runs on: in this process or, with the `ballista` feature and `TEST_ENGINE=ballista`, on a
/// Ballista scheduler with two executors started for the test (on its runtime, so they end with it).
pub(crate) async fn engine_on(storage: Storage) -> DataFusionEngine {
    let engine = DataFusionEngine::new(storage.clone());
    #[cfg(feature = "ballista")]
    if std::env::var("TEST_ENGINE").as_deref() == Ok("ballista") {
        let cluster = distributed::Cluster::start(&storage, 2, 2).await.unwrap();
        return engine.on_ballista(&cluster.url()).unwrap();
    }
    engine
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn invalid<T: std::fmt::Debug>(result: Result<T, EngineError>) -> String {
    match result {
        Err(EngineError::InvalidQuery(reason)) => reason,
        other => panic!("expected an invalid query, got {other:?}"),
    }
}

#[tokio::test]
async fn describes_output_columns_with_types() {
    let (engine, _dir) = engine_with_events().await;
    let q = query(
        "SELECT country, sum(revenue) AS total, avg(revenue) AS mean, count(*) > 0 AS any, \
         CAST('2026-01-01' AS DATE) AS d, now() AS t, [1, 2] AS arr FROM events GROUP BY country",
        json!({}),
    );
    let columns = engine.describe(project(1), &q).await.unwrap().columns;
    let described: Vec<_> = columns.iter().map(|c| (c.name.as_str(), c.column_type)).collect();
    assert_eq!(
        described,
        [
            ("country", ColumnType::String),
            ("total", ColumnType::Integer),
            ("mean", ColumnType::Float),
            ("any", ColumnType::Boolean),
            ("d", ColumnType::Date),
            ("t", ColumnType::Datetime),
            ("arr", ColumnType::Array),
        ]
    );
}

#[tokio::test]
async fn describes_the_tables_a_query_reads_in_subqueries_and_ctes_too() {
    let (engine, _dir) = engine_with_events().await;
    let read = |sql: &str| {
        let engine = engine.clone();
        let q = query(sql, json!({}));
        async move { engine.describe(project(1), &q).await.unwrap().tables }
    };
    assert_eq!(read("SELECT count(*) FROM events").await, ["events"]);
    let nested = "WITH e AS (SELECT country FROM events) SELECT count(*) AS n FROM e \
                  WHERE country IN (SELECT country FROM events WHERE revenue > 1)";
    assert_eq!(read(nested).await, ["events"], "each table once");
    assert!(read("VALUES (1)").await.is_empty());
}

#[tokio::test]
async fn variables_plan_as_typed_parameters() {
    let (engine, _dir) = engine_with_events().await;
    let q = query(
        "SELECT {variables.n} AS n, {variables.x} AS x, {variables.day} AS day, country FROM events \
         WHERE revenue > {variables.n} AND country IN {variables.countries}",
        json!({"n": {"type": "Integer", "default": 1}, "x": {"type": "Number"}, "day": {"type": "Date"},
               "countries": {"type": "List", "default": ["US"]}}),
    );
    let columns = engine.describe(project(1), &q).await.unwrap().columns;
    let types: Vec<_> = columns.iter().map(|c| c.column_type).collect();
    assert_eq!(types, [ColumnType::Integer, ColumnType::Float, ColumnType::Date, ColumnType::String]);
}

#[tokio::test]
async fn refuses_anything_but_one_read_only_query() {
    let (engine, dir) = engine_with_events().await;
    let p = project(1);
    for sql in [
        "SELECT 1; SELECT 2",
        "CREATE TABLE t AS SELECT 1",
        "INSERT INTO events VALUES ('x', 1)",
        "DROP TABLE events",
        "SET datafusion.execution.batch_size = 1",
        "COPY events TO '/tmp/out.csv'",
        "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'",
        "EXPLAIN SELECT 1",
    ] {
        invalid(engine.describe(p, &query(sql, json!({}))).await);
    }
    let file = format!("SELECT * FROM '{}'", dir.join("projects/1/tables/events/part-0.parquet").display());
    invalid(engine.describe(p, &query(&file, json!({}))).await);
    assert!(invalid(engine.describe(p, &query("SELECT nope FROM events", json!({}))).await).contains("nope"));
    assert!(invalid(engine.describe(p, &query("SELEC 1", json!({}))).await).contains("SELEC"));
    invalid(engine.describe(p, &query("SELECT 1 AS a, 2 AS a", json!({}))).await);
    // Qualified columns plan fine in DataFusion but would collide as keys of a result row.
    let joined = "SELECT x.n, y.n FROM (SELECT 1 AS n) x CROSS JOIN (SELECT 2 AS n) y";
    let dup = invalid(engine.describe(p, &query(joined, json!({}))).await);
    assert!(dup.contains("'n'"), "{dup}");
    // VALUES and WITH are read-only queries too.
    engine.describe(p, &query("VALUES (1, 'a')", json!({}))).await.unwrap();
    engine.describe(p, &query("WITH t AS (SELECT 1 AS n) SELECT n FROM t", json!({}))).await.unwrap();
}

#[tokio::test]
async fn a_project_sees_only_its_own_tables() {
    let (engine, _dir) = engine_with_events().await;
    engine.describe(project(1), &query("SELECT * FROM events", json!({}))).await.unwrap();
    let reason = invalid(engine.describe(project(2), &query("SELECT * FROM events", json!({}))).await);
    assert!(reason.contains("events"), "{reason}");
    assert_eq!(
        engine.tables(project(1)).await.unwrap().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["events"]
    );
    assert!(engine.tables(project(2)).await.unwrap().is_empty());
    // Nor can SQL name the storage, or a file, by URL.
    let events = format!("'{}/projects/1/tables/events/'", engine.storage().location());
    for table in [events.as_str(), "'/etc/passwd'", "'file:///etc/passwd'"] {
        let sql = format!("SELECT * FROM {table}");
        invalid(engine.describe(project(2), &query(&sql, json!({}))).await);
    }
}

#[test]
fn compiles_placeholders_to_numbered_parameters() {
    let q = query(
        "SELECT {variables.a}, {variables.b} WHERE x = {variables.a}",
        json!({"a": {"type": "Integer"}, "b": {"type": "String"}}),
    );
    let compiled = compile::compile(&q);
    assert_eq!(compiled.sql, "SELECT CAST($1 AS BIGINT), CAST($2 AS VARCHAR) WHERE x = CAST($1 AS BIGINT)");
    assert_eq!(compiled.params.len(), 2);
}

/// A placeholder inside quotes would be replaced by its parameter's text (`'CAST($1 AS BIGINT)'`): such a query
/// is refused, saying where to write the variable, by a dry run and by a run alike; one outside quotes beside a
/// literal that merely looks like one is not.
#[tokio::test]
async fn a_placeholder_inside_quotes_is_refused_and_one_outside_them_is_not() {
    let (engine, _dir) = engine_with_events().await;
    let x = json!({"x": {"type": "Integer", "default": 1}});
    for (sql, says) in [
        ("SELECT '{variables.x}' AS v", "inside a string literal"),
        ("SELECT 'a' || '{variables.x}' AS v", "inside a string literal"),
        ("SELECT 1 AS \"{variables.x}\"", "inside a quoted name"),
    ] {
        let reason = invalid(engine.describe(project(1), &query(sql, x.clone())).await);
        assert!(
            reason.contains(says) && reason.contains("{variables.x}") && !reason.contains("CAST"),
            "{reason}"
        );
        let run = engine.execute(project(1), &query(sql, x.clone()), &bound(&[]), 1, 0).await;
        assert!(matches!(run, Err(EngineError::InvalidQuery(_))), "{sql}: {run:?}");
    }
    let fine = query("SELECT concat('it''s ', {variables.x}) AS v, '{not a placeholder}' AS w", x);
    let result =
        engine.execute(project(1), &fine, &bound(&[("x", domain::BoundValue::Integer(7))]), 1, 0).await;
    assert_eq!(result.unwrap().rows_json, r#"[{"v":"it's 7","w":"{not a placeholder}"}]"#);
}

fn bound(pairs: &[(&str, domain::BoundValue)]) -> std::collections::BTreeMap<String, domain::BoundValue> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
}

/// A `List` variable runs as an `IN` list of its values (a hash set probed per row, statistics pruning), never
/// as a subquery joined to the table: the bound plan has no subquery left, and the answers are the same query's
/// with the values written in its SQL, `NOT IN`, an empty list and values with quotes included.
#[tokio::test]
async fn a_list_variable_runs_as_an_in_list_of_its_values() {
    let (engine, _dir) = engine_with_events().await;
    let list = |values: &[&str]| {
        bound(&[("c", domain::BoundValue::List(values.iter().map(|v| (*v).to_owned()).collect()))])
    };
    let run = |sql: &str| {
        let q = query(sql, json!({"c": {"type": "List"}}));
        let engine = &engine;
        async move { (engine, q) }
    };
    for (sql, values, expected) in [
        (
            "SELECT country FROM events WHERE country IN {variables.c} ORDER BY 1",
            vec!["US", "DE"],
            r#"[{"country":"US"}]"#,
        ),
        (
            "SELECT country FROM events WHERE country IN {variables.c} ORDER BY 1",
            vec!["US", "FR"],
            r#"[{"country":"FR"},{"country":"US"}]"#,
        ),
        (
            "SELECT country FROM events WHERE country NOT IN {variables.c} ORDER BY 1",
            vec!["US"],
            r#"[{"country":"FR"}]"#,
        ),
        ("SELECT country FROM events WHERE country IN {variables.c} ORDER BY 1", vec![], "[]"),
        (
            "SELECT country FROM events WHERE country IN {variables.c} ORDER BY 1",
            vec!["O'Brien", "US"],
            r#"[{"country":"US"}]"#,
        ),
        // A list is matched against a column of any type, as its text.
        (
            "SELECT country FROM events WHERE revenue IN {variables.c} ORDER BY 1",
            vec!["20", "30"],
            r#"[{"country":"FR"}]"#,
        ),
    ] {
        let (engine, q) = run(sql).await;
        let rows = engine.execute(project(1), &q, &list(&values), 10, 0).await.unwrap().rows_json;
        assert_eq!(rows, expected, "{sql} with {values:?}");
    }

    // The bound plan: an IN list, no subquery (which the optimizer would make a join).
    let ctx = datafusion::prelude::SessionContext::new();
    let sql = "SELECT c FROM (VALUES ('US'), ('FR')) t(c) WHERE c IN (SELECT UNNEST(CAST($1 AS VARCHAR[])))";
    let plan = ctx.state().create_logical_plan(sql).await.unwrap();
    let value = datafusion::scalar::ScalarValue::List(datafusion::scalar::ScalarValue::new_list_nullable(
        &[datafusion::scalar::ScalarValue::Utf8(Some("US".into()))],
        &DataType::Utf8,
    ));
    let bound_plan = crate::bind(plan, vec![value]).unwrap();
    let shown = bound_plan.display_indent().to_string();
    assert!(!shown.contains("<subquery>") && shown.contains(r#"IN ([Utf8("US")])"#), "{shown}");
    // Any other subquery is left as it is.
    let other = "SELECT c FROM (VALUES ('US')) t(c) WHERE c IN (SELECT c FROM (VALUES ('US')) u(c))";
    let plan = ctx.state().create_logical_plan(other).await.unwrap();
    assert!(crate::inline_lists(plan).unwrap().display_indent().to_string().contains("<subquery>"));
}

/// The physical plan `query` runs as with `variables` bound, as text (a test of what a run does, not of its
/// answer).
pub(crate) async fn physical_plan(
    engine: &DataFusionEngine,
    query: &Query,
    variables: &std::collections::BTreeMap<String, domain::BoundValue>,
) -> String {
    let compiled = compile::compile(query);
    let values = execute::parameter_values(&compiled, variables).unwrap();
    let (ctx, unbound) = engine.live_plan(project(1), &compiled).await.unwrap();
    let bound = bind(unbound, values).unwrap();
    engine.partition_for(&ctx, &bound);
    let plan = ctx.state().create_physical_plan(&bound).await.unwrap();
    let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string();
    shown
}

/// At 10,000,000 rows in 16 partitions under the default memory limit, a `List` variable's `IN` answers as the
/// same list written in the SQL does, with the same physical plan: the same operators holding the same memory
/// (the subquery it was once planned as joined the table to the list, a hash table per partition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_variable_needs_no_more_memory_than_its_literals_at_ten_million_rows() {
    const ROWS: usize = 10_000_000;
    const BATCH: usize = 500_000;
    let dir = temp_dir("qe-list");
    let table = dir.join("projects/1/tables/events");
    std::fs::create_dir_all(&table).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("country", DataType::Utf8, false),
        Field::new("revenue", DataType::Int64, false),
    ]));
    let names = ["US", "GB", "DE", "FR", "IN", "BR", "JP", "CA", "ES", "NL"];
    let countries: StringArray = (0..BATCH).map(|i| Some(names[i % names.len()])).collect();
    let revenues: Int64Array = (0..BATCH).map(|i| Some(i64::try_from(i % 100).unwrap())).collect();
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(countries), Arc::new(revenues)]).unwrap();
    // Four files, so that the scan is split across the partitions as a table's is.
    for file in 0..4 {
        let path = table.join(format!("part-{file}.parquet"));
        let mut writer =
            ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema.clone(), None).unwrap();
        for _ in 0..ROWS / BATCH / 4 {
            writer.write(&batch).unwrap();
        }
        writer.close().unwrap();
    }
    let limits = EngineLimits { partitions: std::num::NonZeroUsize::new(16), ..EngineLimits::default() };
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap()).with_limits(limits);
    engine.upgrade_tables().await.unwrap();
    let sql = "SELECT country, count(*) AS n, sum(revenue) AS r FROM events WHERE country IN {values} \
               GROUP BY country ORDER BY country";
    let listed = query(&sql.replace("{values}", "{variables.c}"), json!({"c": {"type": "List"}}));
    let literal = query(&sql.replace("{values}", "('DE', 'FR', 'JP')"), json!({}));
    let values = bound(&[("c", domain::BoundValue::List(vec!["DE".into(), "FR".into(), "JP".into()]))]);
    let none = bound(&[]);

    let from_list = engine.execute(project(1), &listed, &values, 10, 0).await.unwrap();
    let from_literals = engine.execute(project(1), &literal, &none, 10, 0).await.unwrap();
    let each = ROWS / names.len();
    // Country k (of the ten) has the revenues k, k + 10, ..., k + 90 in turn: k + 45 on average.
    let expected: Vec<String> = [("DE", 2), ("FR", 3), ("JP", 6)]
        .iter()
        .map(|(c, k)| format!(r#"{{"country":"{c}","n":{each},"r":{}}}"#, (k + 45) * each))
        .collect();
    assert_eq!(from_list.rows_json, format!("[{}]", expected.join(",")));
    assert_eq!(from_list.rows_json, from_literals.rows_json);

    let planned = physical_plan(&engine, &listed, &values).await;
    assert_eq!(planned, physical_plan(&engine, &literal, &none).await, "the same plan as the literals'");
    // Three values are compared in turn (more would be a hash set); the scan feeds 16 partitions.
    assert!(planned.contains("FilterExec: country@0 = DE OR country@0 = FR OR country@0 = JP"), "{planned}");
    assert!(planned.contains("Hash([country@0], 16)") && !planned.contains("Join"), "{planned}");
}

/// A run over small tables is planned in one partition (no repartitioning, one aggregation phase); over more
/// rows than [`crate::ONE_PARTITION_ROWS`] in all, or with the partitions set by the operator, in one per core
/// or as set. The answers are the same.
#[tokio::test]
async fn a_run_over_small_tables_is_planned_in_one_partition() {
    if on_ballista() {
        return; // the cluster's scheduler plans the stages
    }
    let dir = temp_dir("qe-partitions");
    let tables = dir.join("projects/1/tables");
    let large: Vec<(String, i64)> = (0..=crate::ONE_PARTITION_ROWS)
        .map(|i| {
            (["US", "FR", "DE"][usize::try_from(i % 3).unwrap()].to_owned(), i64::try_from(i % 7).unwrap())
        })
        .collect();
    let large: Vec<(&str, i64)> = large.iter().map(|(c, r)| (c.as_str(), *r)).collect();
    for (name, rows) in [("small", &[("US", 1), ("FR", 2), ("US", 3)][..]), ("large", &large[..])] {
        std::fs::create_dir_all(tables.join(name)).unwrap();
        write_events(&tables.join(name).join("part-0.parquet"), rows);
    }
    let storage = Storage::local(&dir).unwrap();
    let engine = DataFusionEngine::new(storage.clone());
    let cores = datafusion::prelude::SessionConfig::new().target_partitions();
    engine.upgrade_tables().await.unwrap();
    let sql = |table: &str| {
        query(
            &format!("SELECT country, sum(revenue) AS r FROM {table} GROUP BY country ORDER BY country"),
            json!({}),
        )
    };
    let none = bound(&[]);

    let small = physical_plan(&engine, &sql("small"), &none).await;
    assert!(!small.contains("RepartitionExec") && !small.contains("Partial"), "{small}");
    let answer = engine.execute(project(1), &sql("small"), &none, 10, 0).await.unwrap();
    assert_eq!(answer.rows_json, r#"[{"country":"FR","r":2},{"country":"US","r":4}]"#);
    // One row more than the bound, in one table or in two a run joins.
    if cores > 1 {
        let large = physical_plan(&engine, &sql("large"), &none).await;
        assert!(large.contains(&format!("Hash([country@0], {cores})")), "{large}");
        let joined = query(
            "SELECT s.country, count(*) AS n FROM small s JOIN large l ON s.country = l.country GROUP BY s.country",
            json!({}),
        );
        let joined = physical_plan(&engine, &joined, &none).await;
        assert!(joined.contains("RepartitionExec"), "{joined}");
    }
    // Partitions the operator set are kept whatever the rows.
    let limits = EngineLimits { partitions: std::num::NonZeroUsize::new(3), ..EngineLimits::default() };
    let set = DataFusionEngine::new(storage).with_limits(limits);
    assert!(physical_plan(&set, &sql("small"), &none).await.contains("Hash([country@0], 3)"));
    drop(dir);
}

#[tokio::test]
async fn executes_with_bound_variables_and_pages() {
    let (engine, _dir) = engine_with_events().await;
    let q = query(
        "SELECT country, revenue FROM events WHERE revenue >= {variables.min} ORDER BY revenue",
        json!({"min": {"type": "Integer"}}),
    );
    let result = engine
        .execute(project(1), &q, &bound(&[("min", domain::BoundValue::Integer(0))]), 1, 0)
        .await
        .unwrap();
    assert_eq!(result.rows_json, r#"[{"country":"US","revenue":10}]"#);
    assert!(result.has_more);
    let rest = engine
        .execute(project(1), &q, &bound(&[("min", domain::BoundValue::Integer(0))]), 5, 1)
        .await
        .unwrap();
    assert_eq!((rest.rows_json.as_str(), rest.has_more), (r#"[{"country":"FR","revenue":20}]"#, false));
    let none = engine
        .execute(project(1), &q, &bound(&[("min", domain::BoundValue::Integer(99))]), 5, 0)
        .await
        .unwrap();
    assert_eq!((none.rows_json.as_str(), none.row_count), ("[]", 0));
}

/// Whether this run of the suite executes on a Ballista cluster.
pub(crate) fn on_ballista() -> bool {
    cfg!(feature = "ballista") && std::env::var("TEST_ENGINE").as_deref() == Ok("ballista")
}

#[tokio::test]
async fn statistics_say_what_a_run_read() {
    let (engine, dir) = engine_with_events().await;
    let run = |sql: &str, limit| {
        let (engine, q) = (&engine, query(sql, json!({})));
        async move { engine.execute(project(1), &q, &bound(&[]), limit, 0).await.unwrap().statistics }
    };
    let all = run("SELECT country, revenue FROM events", 10).await;
    let constant = run("SELECT 1 AS one", 10).await;
    assert!(all.elapsed > std::time::Duration::ZERO);
    if on_ballista() {
        // The executors keep their metrics: this process cannot tell what they read.
        assert_eq!((all.rows_read, all.bytes_read), (None, None));
        return;
    }
    assert_eq!(all.rows_read, Some(2));
    let bytes = all.bytes_read.unwrap();
    let file = std::fs::metadata(dir.join("projects/1/tables/events/part-0.parquet")).unwrap().len();
    assert!(bytes > 0 && bytes <= file, "{bytes} bytes read of a {file}-byte file");
    assert_eq!((constant.rows_read, constant.bytes_read), (Some(0), Some(0)), "nothing was read");
    let one_column = run("SELECT revenue FROM events", 10).await;
    assert!(one_column.bytes_read.unwrap() < bytes, "a column not read is not counted");
}

#[tokio::test]
async fn footers_are_decoded_once_for_every_query_and_an_appended_file_once() {
    let (engine, dir) = engine_with_events().await;
    // Every file read from storage: with tables kept decoded, whether the append's rows are kept in memory (no
    // footer read) depends on whether the first file was decoded before it.
    let limits = EngineLimits { hot_tables: 0, ..engine.limits.clone() };
    let engine = engine.with_limits(limits);
    let q = query("SELECT count(*) AS n, sum(revenue) AS total FROM events", json!({}));
    let run = || async { engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap().rows_json };
    // On Ballista the executors read the files, with caches of their own.
    let here = !on_ballista();
    assert_eq!(engine.files.footers(), 0);
    assert_eq!(run().await, r#"[{"n":2,"total":30}]"#);
    assert!(!here || engine.files.footers() == 1, "the first run keeps the table's footer");
    assert_eq!(run().await, r#"[{"n":2,"total":30}]"#);
    assert!(!here || engine.files.footers() == 1, "the next run, in a new session, finds it");
    // An append adds a file: its footer is read, the first one's is not read again.
    let appended = crate::table_store_tests::upload(
        domain::TableFormat::Csv,
        domain::WriteMode::Append,
        b"country,revenue\nDE,5\n",
    );
    let events = domain::TableName::parse("events").unwrap();
    domain::TableStore::write(&engine, project(1), &events, appended).await.unwrap();
    assert_eq!(run().await, r#"[{"n":3,"total":35}]"#);
    assert!(!here || engine.files.footers() == 2, "the appended file's footer joins the first");
    drop(dir);
}

#[tokio::test]
async fn a_slow_query_times_out() {
    let (_, dir) = engine_with_events().await;
    let limits =
        EngineLimits { query_timeout: std::time::Duration::from_millis(50), ..EngineLimits::default() };
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap()).with_limits(limits);
    let q =
        query("SELECT count(*) AS n FROM generate_series(1, 20000000000) AS t(v) WHERE v % 7 = 3", json!({}));
    let err = engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::Timeout(_)), "{err:?}");
}

#[tokio::test]
async fn a_query_over_its_memory_limit_fails() {
    let (_, dir) = engine_with_events().await;
    let limits = EngineLimits { memory_limit: 64 * 1024, ..EngineLimits::default() };
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap()).with_limits(limits);
    let q = query(
        "SELECT v, count(*) AS n FROM generate_series(1, 2000000) AS t(v) GROUP BY v ORDER BY n DESC, v",
        json!({}),
    );
    let err = engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::MemoryLimit(_)), "{err:?}");
}

#[tokio::test]
async fn a_page_over_the_result_byte_limit_is_refused_and_a_smaller_page_is_not() {
    let (_, dir) = engine_with_events().await;
    let limits = EngineLimits { result_bytes: 64 * 1024, ..EngineLimits::default() };
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap()).with_limits(limits);
    // About 1 KB a row: 100 rows are over 64 KiB, 50 are not.
    let q = query(
        "SELECT v, repeat('x', 1000) AS pad FROM generate_series(1, 5000) AS t(v) ORDER BY v",
        json!({}),
    );
    let err = engine.execute(project(1), &q, &bound(&[]), 100, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::ResultTooLarge { limit_bytes: 65_536 }), "{err:?}");
    let page = engine.execute(project(1), &q, &bound(&[]), 50, 0).await.unwrap();
    assert_eq!((page.row_count, page.has_more), (50, true));
    assert!(page.rows_json.len() > 50_000 && page.rows_json.len() <= 65_536, "{}", page.rows_json.len());
}

/// A full project is told so the same way whatever it asks for (a run, a dry run, an export); its refreshes
/// take none of its slots.
#[tokio::test]
async fn a_project_runs_at_most_its_share_of_live_queries() {
    let (_, dir) = engine_with_events().await;
    let limits = EngineLimits { max_concurrent_per_project: 1, ..EngineLimits::default() };
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap()).with_limits(limits);
    let held = engine.admission.enter(project(1)).unwrap();
    let q = query("SELECT 1 AS n", json!({}));
    let err = engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::Busy { .. }), "{err:?}");
    let err = engine.describe(project(1), &q).await.unwrap_err();
    assert!(matches!(err, EngineError::Busy { .. }), "a dry run too: {err:?}");
    let err = engine.export(project(1), &q, &bound(&[]), 10, 0, ResultFormat::Csv).await.err();
    assert!(matches!(err, Some(EngineError::Busy { .. })), "an export too: {err:?}");
    let at = domain::attempt_location(uuid::Uuid::new_v4(), 1, uuid::Uuid::new_v4());
    assert_eq!(domain::ResultStorage::write(&engine, project(1), &q, &at).await.unwrap().rows, 1);
    // Other projects are not affected, and the slot is free again once released.
    engine.execute(project(2), &q, &bound(&[]), 10, 0).await.unwrap();
    engine.describe(project(2), &q).await.unwrap();
    drop(held);
    engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap();
    engine.describe(project(1), &q).await.unwrap();
}

/// The service's own planning (an endpoint planned again after its table was replaced) waits for a busy
/// project's slot instead of being refused, and gives up at the query timeout.
#[tokio::test]
async fn the_services_own_planning_waits_for_a_busy_projects_slot() {
    let (_, dir) = engine_with_events().await;
    let limits = EngineLimits {
        max_concurrent_per_project: 1,
        query_timeout: std::time::Duration::from_secs(1),
        ..EngineLimits::default()
    };
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap()).with_limits(limits);
    let q = query("SELECT 1 AS n", json!({}));
    let held = engine.admission.enter(project(1)).unwrap();
    let err = engine.describe_queued(project(1), &q).await.unwrap_err();
    assert!(matches!(err, EngineError::Timeout(_)), "held past the timeout: {err:?}");
    let waiting = tokio::spawn({
        let (engine, q) = (engine.clone(), q.clone());
        async move { engine.describe_queued(project(1), &q).await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "waits while the slot is held");
    drop(held);
    let described = waiting.await.unwrap().unwrap();
    assert_eq!(described.columns.len(), 1);
    // It held the slot while planning, and gave it back.
    engine.describe(project(1), &q).await.unwrap();
}

/// A table of this storage says how many rows it holds, from its log: an aggregation over a join with one of
/// at most `SMALL_TABLE_ROWS` is computed in two steps (see `rewrites::eager_aggregate`), with the same answer.
#[tokio::test]
async fn an_aggregation_over_a_join_with_a_small_table_aggregates_the_large_one_first() {
    let (engine, dir) = engine_with_events().await;
    let countries = crate::table_store_tests::upload(
        domain::TableFormat::Csv,
        domain::WriteMode::Replace,
        b"code,region\nUS,Americas\nFR,Europe\nDE,Europe\n",
    );
    let name = domain::TableName::parse("countries").unwrap();
    domain::TableStore::write(&engine, project(1), &name, countries).await.unwrap();
    let q = query(
        "SELECT c.region, count(*) AS n, sum(e.revenue) AS total FROM events e JOIN countries c \
         ON e.country = c.code GROUP BY c.region ORDER BY c.region",
        json!({}),
    );
    let answer = engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap().rows_json;
    assert_eq!(answer, r#"[{"region":"Americas","n":1,"total":10},{"region":"Europe","n":1,"total":20}]"#);
    if !on_ballista() {
        let plan = physical_plan(&engine, &q, &bound(&[])).await;
        let partial = plan.find("as __eager_partial_0").unwrap_or_else(|| panic!("{plan}"));
        assert!(plan.find("HashJoinExec").is_some_and(|join| join < partial), "{plan}");
    }
    drop(dir);
}

#[tokio::test]
async fn imports_csv_and_ndjson_atomically() {
    let dir = temp_dir("qe-import");
    let csv = dir.join("in.csv");
    std::fs::write(&csv, "id,name\n1,a\n2,b\n").unwrap();
    let ndjson = dir.join("more.ndjson");
    std::fs::write(&ndjson, "{\"id\": 3, \"name\": \"c\"}\n").unwrap();
    let noop = |_: imports::ImportProgress| {};
    let storage = Storage::local(&dir).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let report = imports::import_files(
        &storage,
        project(1),
        "things",
        std::slice::from_ref(&csv),
        None,
        imports::ImportMode::Replace,
        &|progress| seen.lock().unwrap().push(progress),
    )
    .await
    .unwrap();
    assert_eq!(report.rows, 2);
    // Progress counts the rows written and the bytes of the file read (schema inference reads it once more).
    let last = *seen.lock().unwrap().last().expect("progress was reported");
    assert_eq!(last.rows, 2);
    assert!((16..=32).contains(&last.bytes_read), "{last:?}");
    imports::import_files(
        &storage,
        project(1),
        "things",
        &[ndjson],
        None,
        imports::ImportMode::Append,
        &noop,
    )
    .await
    .unwrap();
    let engine = engine_on(storage.clone()).await;
    let q = query("SELECT sum(id) AS s, count(*) AS n FROM things", json!({}));
    let result = engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap();
    assert_eq!(result.rows_json, r#"[{"s":6,"n":3}]"#);

    // A malformed file fails and leaves the table as it was, with no staging files visible.
    let broken = dir.join("broken.csv");
    std::fs::write(&broken, "id,name\n1,a,extra,fields\n\"unterminated\n").unwrap();
    assert!(imports::import_files(
        &storage,
        project(1),
        "things",
        &[broken],
        None,
        imports::ImportMode::Replace,
        &noop
    )
    .await
    .is_err());
    let mismatch = dir.join("other.csv");
    std::fs::write(&mismatch, "x\n1\n").unwrap();
    let err = imports::import_files(
        &storage,
        project(1),
        "things",
        &[mismatch],
        None,
        imports::ImportMode::Append,
        &noop,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, imports::ImportError::SchemaMismatch { .. }), "{err:?}");
    let result = engine.execute(project(1), &q, &bound(&[]), 10, 0).await.unwrap();
    assert_eq!(result.rows_json, r#"[{"s":6,"n":3}]"#);
    // What is left is the table's log and its two files (the replace's and the append's): the failed imports
    // removed theirs.
    let mut leftovers: Vec<_> = std::fs::read_dir(dir.join("projects/1/tables/things"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    leftovers.sort();
    assert_eq!(leftovers.len(), 3, "{leftovers:?}");
    assert_eq!(leftovers[0], "_delta_log");
    assert!(leftovers[1..].iter().all(|name| name.ends_with(".parquet")), "{leftovers:?}");
    assert!(matches!(
        imports::import_files(
            &storage,
            project(1),
            "Bad-Name",
            &[csv],
            None,
            imports::ImportMode::Replace,
            &noop
        )
        .await,
        Err(imports::ImportError::InvalidTableName(_))
    ));
}

#[tokio::test]
async fn deeply_nested_sql_is_refused_or_planned_without_crashing() {
    let (engine, _dir) = engine_with_events().await;
    // Within the depth bound: planned (and run) on the engine's deep stacks.
    let sql = format!("SELECT {} AS x", vec!["1"; 250].join(" + "));
    let result = engine.execute(project(1), &query(&sql, json!({})), &bound(&[]), 1, 0).await.unwrap();
    assert_eq!(result.rows_json, r#"[{"x":250}]"#);
    // Past it, refused after parsing, before planning: a long chain plans in time that grows with its square.
    for sql in [
        format!("SELECT {} AS x", vec!["1"; 4_990].join(" + ")),
        format!("SELECT count(*) FROM events WHERE {}", vec!["revenue = 1"; 300].join(" OR ")),
    ] {
        let reason = invalid(engine.describe(project(1), &query(&sql, json!({}))).await);
        assert!(reason.contains("deep"), "{reason}");
    }
    // Past it: refused before parsing.
    let sql = format!("SELECT {} AS x", vec!["1"; 20_000].join(" + "));
    let reason = invalid(engine.describe(project(1), &query(&sql, json!({}))).await);
    assert!(reason.contains("too large"), "{reason}");
    let nested = format!("SELECT {}1{} AS x", "(".repeat(5_000), ")".repeat(5_000));
    assert!(matches!(
        engine.describe(project(1), &query(&nested, json!({}))).await,
        Err(EngineError::InvalidQuery(_))
    ));
}

/// Scalar functions that build large values, which no memory pool sees: each is refused before it allocates,
/// whether its size comes from a literal, a variable or a column, and a string over 2 GiB in one batch (which
/// overflows Arrow's offsets, a panic) is refused the same way.
#[tokio::test]
async fn functions_that_build_large_values_fail_with_the_memory_limit_before_allocating() {
    if on_ballista() {
        // A cluster's executors run DataFusion's own functions (docs/security.md says so): nothing to check here.
        return;
    }
    let (engine, _dir) = engine_with_events().await;
    let variable = query("SELECT length(repeat('x', {variables.n})) AS n", json!({"n": {"type": "Integer"}}));
    let huge = bound(&[("n", domain::BoundValue::Integer(1_500_000_000))]);
    let err = engine.execute(project(1), &variable, &huge, 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::MemoryLimit(_)), "{err:?}");
    // A chain of functions that each double their input, from a value well within the limit: each call holds
    // its input while it writes.
    let chain = query(
        "SELECT length(encode(encode(encode(repeat('x', {variables.n}), 'hex'), 'hex'), 'hex')) AS n",
        json!({"n": {"type": "Integer"}}),
    );
    let within = bound(&[("n", domain::BoundValue::Integer(200_000_000))]);
    let err = engine.execute(project(1), &chain, &within, 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::MemoryLimit(_)), "{err:?}");
    for sql in [
        "SELECT length(array_to_string(range(1, 1000000), repeat('x', 1000))) AS n",
        "SELECT length(concat_ws(repeat('x', 100000000), 'a', 'b', 'c', 'd', 'e', 'f')) AS n",
        "SELECT length(translate(repeat('a', 200000000), 'a', '😀')) AS n",
        "SELECT length(repeat('x', 1500000000)) AS n",
        "SELECT sum(length(repeat('x', 1000000 + v % 2))) AS n FROM generate_series(1, 2100) AS t(v)",
        "SELECT length(lpad('x', 2000000000)) AS n",
        "SELECT length(rpad('x', 2000000000, 'é')) AS n",
        "SELECT length(replace(repeat('a', 100000), 'a', repeat('b', 100000))) AS n",
        "SELECT length(regexp_replace(repeat('a', 100000), '', repeat('b', 100000), 'g')) AS n",
        "WITH a AS (SELECT repeat('x', 300000000) AS s) SELECT length(s || s || s || s || s || s) AS n FROM a",
        "WITH a AS (SELECT repeat('x', 300000000) AS s) SELECT length(concat(s, s, s, s, s, s)) AS n FROM a",
        "SELECT cardinality(range(1, 10000000000)) AS n",
        "SELECT cardinality(array_repeat(1, 2000000000)) AS n",
        "SELECT cardinality(range(DATE '1970-01-01', DATE '9999-01-01', INTERVAL '1 second')) AS n",
    ] {
        let err = engine.execute(project(1), &query(sql, json!({})), &bound(&[]), 10, 0).await.unwrap_err();
        assert!(matches!(err, EngineError::MemoryLimit(_)), "{sql}: {err:?}");
    }
    // The same functions at ordinary sizes answer as DataFusion's own do, nulls and names included.
    let small =
        "SELECT repeat('ab', 3) AS r, lpad('7', 3, '0') AS p, 'a' || NULL AS n, concat('a', NULL) AS c, \
                 country || '-' || revenue AS k, encode('ab', 'hex') AS e, upper(country) AS u, \
                 array_to_string([1, 2], '-') AS j FROM events ORDER BY revenue LIMIT 1";
    let result = engine.execute(project(1), &query(small, json!({})), &bound(&[]), 10, 0).await.unwrap();
    assert_eq!(
        result.rows_json,
        r#"[{"r":"ababab","p":"007","n":null,"c":"a","k":"US-10","e":"6162","u":"US","j":"1-2"}]"#
    );
    let unnamed = engine.describe(project(1), &query("SELECT country || 'x' FROM events", json!({}))).await;
    let columns = unnamed.unwrap().columns;
    assert_eq!(columns[0].name, "events.country || Utf8(\"x\")", "{columns:?}");
}

/// Error details say what is wrong in the query's terms: never the engine's plan text (the placeholders its
/// variables are compiled to) or where the server keeps files.
#[tokio::test]
async fn errors_name_the_query_not_the_engines_internals() {
    let (engine, dir) = engine_with_events().await;
    let int = json!({"n": {"type": "Integer"}, "s": {"type": "String"}, "d": {"type": "Date"}});
    for sql in [
        "SELECT {variables.n} + 'a' AS x",
        "SELECT {variables.s} - 1 AS x",
        "SELECT {variables.d} * 2 AS x",
        "SELECT {variables.n} FROM events WHERE revenue = {variables.s} || {variables.d}",
        "SELECT nope({variables.n})",
        "SELECT country FROM events WHERE revenue LIKE {variables.n}",
        "SELECT sum({variables.s}) FROM events",
        "SELECT * FROM missing_table",
        "SELECT missing_column FROM events",
        "SELECT * FROM generate_series(1, {variables.s})",
        "SELECT * FROM events WHERE {variables.n}",
        "SELECT date_trunc({variables.n}, {variables.d})",
    ] {
        let q = query(sql, int.clone());
        let values = bound(&[
            ("n", domain::BoundValue::Integer(1)),
            ("s", domain::BoundValue::String("x".into())),
            ("d", domain::BoundValue::Date(time::macros::date!(2026 - 01 - 01))),
        ]);
        let described = engine.describe(project(1), &q).await.err().map(|e| e.to_string());
        let executed = engine.execute(project(1), &q, &values, 10, 0).await.err().map(|e| e.to_string());
        for text in described.iter().chain(executed.iter()) {
            for internal in [
                "Placeholder",
                "Cast {",
                "data_type:",
                "$1",
                "$2",
                "bug in DataFusion",
                dir.to_str().unwrap(),
            ] {
                assert!(!text.contains(internal), "{sql}: {internal} in {text}");
            }
        }
        assert!(described.is_some() || executed.is_some(), "{sql} should fail");
    }
    let q = query("SELECT * FROM generate_series(1, {variables.s})", int);
    let reason = invalid(engine.describe(project(1), &q).await);
    assert!(reason.ends_with("got {variables.s}"), "{reason}");
}

/// One project running its most heavy queries at once, each of which alone keeps both cores busy, does not
/// starve another project: the other's small query waits a time slice for a slot, then shares the cores. That
/// holds for every kind of heavy plan: one that emits batches all along (a cross join), and ones that work for
/// long between two batches (a cross join whose filter passes no pair, an anti join over pairs, an aggregation
/// into one group). Cancelled, each stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_at_its_limit_of_heavy_queries_does_not_starve_another() {
    if on_ballista() {
        // A cluster schedules its executors' work itself, and table functions do not travel to it.
        return;
    }
    let (engine, _dir) = engine_with_events().await;
    let small = query(
        "SELECT v % 10 AS k, count(*) AS n FROM generate_series(1, 20000) AS t(v) GROUP BY k",
        json!({}),
    );
    let latency = |engine: DataFusionEngine| {
        let small = small.clone();
        async move {
            let mut took = Vec::new();
            for _ in 0..7 {
                let started = std::time::Instant::now();
                engine.execute(project(2), &small, &bound(&[]), 10, 0).await.unwrap();
                took.push(started.elapsed());
            }
            took.sort();
            took[3]
        }
    };
    let idle = latency(engine.clone()).await;
    let series = "generate_series(1, 1000000) AS a(x) CROSS JOIN generate_series(1, 1000000) AS b(y)";
    let heavy_plans = [
        format!("SELECT count(*) AS n FROM {series} WHERE (x + y) % 7 = 3"),
        format!("SELECT count(*) AS n FROM {series} WHERE x + y < 0"),
        "SELECT count(*) AS n FROM generate_series(1, 1000000) AS a(x) \
         WHERE NOT EXISTS (SELECT 1 FROM generate_series(1, 1000000) AS b(y) WHERE x + y < 0)"
            .to_owned(),
        "SELECT max(x * 2) AS n FROM generate_series(1, 100000000000) AS t(x)".to_owned(),
    ];
    for sql in heavy_plans {
        let heavy = query(&sql, json!({}));
        let running: Vec<_> = (0..engine.limits.max_concurrent_per_project)
            .map(|_| {
                let (engine, heavy) = (engine.clone(), heavy.clone());
                tokio::spawn(async move { engine.execute(project(1), &heavy, &bound(&[]), 10, 0).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let loaded = latency(engine.clone()).await;
        let mut ended = Vec::new();
        for query in running {
            if query.is_finished() {
                ended.push(format!("{:?}", query.await.map(|r| r.map(|r| r.rows_json))));
            } else {
                query.abort();
            }
        }
        assert!(ended.is_empty(), "the heavy queries run all along: {sql}: {ended:?}");
        // Their callers gone, they stop, inside a join's long step too, and leave the cores to the next.
        let waited = std::time::Instant::now();
        while engine.admission.load() != (0, 0) {
            assert!(waited.elapsed() < std::time::Duration::from_secs(60), "still running: {sql}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        println!("fairness: idle {idle:?}, beside four of {sql}: {loaded:?}");
        assert!(
            loaded < idle * 10 + std::time::Duration::from_millis(100),
            "idle {idle:?}, beside four of {sql}: {loaded:?}"
        );
    }
}

/// An in-memory store that notes what it was asked about (the paths of `HEAD`s, and the prefixes listed), and
/// holds reads of objects while told to.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    pub(crate) inner: InMemory,
    heads: std::sync::Mutex<Vec<String>>,
    listed: std::sync::Mutex<Vec<String>>,
    /// While `true`, a read of an object (not a `HEAD`) waits for it to be `false`.
    held: tokio::sync::watch::Sender<bool>,
    /// Told when a read waits.
    pub(crate) waiting: tokio::sync::Notify,
}

impl Asked {
    /// Holds reads of objects from now on (`true`), or lets them go (`false`).
    pub(crate) fn hold_reads(&self, held: bool) {
        self.held.send_replace(held);
    }

    pub(crate) fn take(&self) -> (Vec<String>, Vec<String>) {
        let heads = std::mem::take(&mut *self.heads.lock().unwrap());
        (heads, std::mem::take(&mut *self.listed.lock().unwrap()))
    }
}

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Asked({})", self.inner)
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for Asked {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        if options.head {
            self.heads.lock().unwrap().push(location.to_string());
        } else if *self.held.borrow() {
            self.waiting.notify_one();
            let _ = self.held.subscribe().wait_for(|held| !held).await;
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.listed.lock().unwrap().push(prefix.map(ToString::to_string).unwrap_or_default());
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.listed.lock().unwrap().push(prefix.map(ToString::to_string).unwrap_or_default());
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
