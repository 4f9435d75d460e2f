use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DfStatement;

use super::{new, plan, take};

fn lean() -> SessionContext {
    new(SessionConfig::new(), Arc::new(RuntimeEnv::default()))
}

fn full() -> SessionContext {
    super::with_every_function()
}

fn parse(ctx: &SessionContext, sql: &str) -> DfStatement {
    let state = ctx.state();
    let dialect = state.config().options().sql_parser.dialect;
    state.sql_to_statement(sql, &dialect).unwrap()
}

async fn answer(ctx: &SessionContext, plan: LogicalPlan) -> String {
    let batches = ctx.execute_logical_plan(plan).await.unwrap().collect().await.unwrap();
    pretty_format_batches(&batches).unwrap().to_string()
}

/// Syntax whose functions the planner finds without their names in the statement, or by names of its own:
/// each plans with only the functions its statement names (no second planning), and answers as a session
/// with every function does.
#[tokio::test]
async fn each_statement_plans_with_the_functions_it_names_and_answers_as_with_every_function() {
    let statements = [
        "SELECT TRIM('  a '), TRIM(LEADING 'x' FROM 'xxa'), TRIM(TRAILING 'x' FROM 'axx'), TRIM(BOTH 'x' FROM 'xax')",
        "SELECT CEIL(1.5), FLOOR(1.5), 2 ^ 10, -7 % 3",
        "SELECT DISTINCT ON (a) a, b FROM (VALUES (1, 2), (1, 3), (2, 5)) AS t(a, b) ORDER BY a, b DESC",
        "SELECT EXTRACT(YEAR FROM DATE '2024-03-04'), POSITION('b' IN 'abc'), SUBSTRING('abcdef' FROM 2 FOR 3), \
         OVERLAY('abcdef' PLACING 'X' FROM 2 FOR 1)",
        "SELECT [1, 2, 3], [1] || [2], 'a' || 'b' || 1, MAP {'k': 1}, named_struct('a', 1)['a'], struct(1, 'x')",
        "SELECT count(*), sum(x), avg(x), \"min\"(x), MAX(x), approx_distinct(x), array_agg(x ORDER BY x DESC), \
         string_agg(CAST(x AS VARCHAR), ',' ORDER BY x) FROM (VALUES (1), (2), (2)) AS t(x)",
        "SELECT x, row_number() OVER (ORDER BY x), sum(x) OVER (), lag(x) OVER (ORDER BY x), \
         first_value(x) OVER (ORDER BY x) FROM (VALUES (1), (2)) AS t(x) ORDER BY x",
        "SELECT * FROM generate_series(1, 3)",
        "SELECT value FROM range(2) ORDER BY value",
        "SELECT current_date IS NOT NULL, now() IS NOT NULL, \"upper\"('a') AS q, UPPER('a') AS u, list_to_string([1, 2], '-')",
        "SELECT x FROM (VALUES (1), (3)) AS t(x) WHERE x IN (SELECT unnest([1, 2])) AND EXISTS (SELECT 1)",
        "SELECT unnest([1, 2]) AS u ORDER BY u",
        "SELECT CAST('1' AS INT), TRY_CAST('x' AS INT), 'ab' LIKE 'a_', 'a' ILIKE 'A', 1 IS DISTINCT FROM 2, \
         CASE WHEN 1 > 0 THEN 'y' END, coalesce(NULL, 1), nullif(1, 1), greatest(1, 2)",
        "SELECT date_trunc('day', TIMESTAMP '2024-01-01 10:00:00'), DATE '2024-01-01' + INTERVAL '1 day', \
         TIMESTAMP '2024-01-01 00:00:00' AT TIME ZONE 'UTC', to_timestamp(0)",
        "SELECT a, grouping(a), count(*) FROM (VALUES (1), (2)) AS t(a) GROUP BY ROLLUP(a) ORDER BY a",
        "SELECT approx_percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM (VALUES (1.0), (2.0), (3.0)) AS t(x)",
        "SELECT (SELECT count(*) FROM (VALUES (1)) AS s(y)) AS n, array_has([1, 2], 2)",
    ];
    for sql in statements {
        let full = full();
        let expected = answer(&full, full.state().create_logical_plan(sql).await.unwrap()).await;
        let ctx = lean();
        let statement = parse(&ctx, sql);
        take(&ctx, super::named(&statement).iter().map(String::as_str));
        let planned = ctx.state().statement_to_plan(statement).await;
        let planned =
            planned.unwrap_or_else(|e| panic!("{sql} does not plan with the functions it names: {e}"));
        assert_eq!(answer(&ctx, planned).await, expected, "{sql}");
    }
}

/// A session has the functions its statements named, and no others: the functions that can write more than
/// they read bound to its memory pool.
#[tokio::test]
async fn a_session_takes_what_its_statement_names() {
    let ctx = lean();
    let statement = parse(&ctx, "SELECT upper('a'), abs(-1), sum(1)");
    plan(&ctx, statement).await.unwrap();
    let state = ctx.state();
    let mut scalar: Vec<&str> = state.scalar_functions().values().map(|f| f.name()).collect();
    scalar.sort_unstable();
    scalar.dedup();
    assert_eq!(scalar, ["abs", "upper"]);
    assert!(
        state.aggregate_functions().contains_key("sum") && !state.aggregate_functions().contains_key("avg")
    );
    let upper = format!("{:?}", state.scalar_functions()["upper"].inner());
    assert!(upper.starts_with("Bounded"), "{upper}");
    assert!(!format!("{:?}", state.scalar_functions()["abs"].inner()).starts_with("Bounded"));
}

/// A statement that does not plan with what it names is planned with every function, so its error is the
/// one a session with every function gives (a misspelt function's suggestion too).
#[tokio::test]
async fn a_statement_that_does_not_plan_fails_as_with_every_function() {
    for sql in
        ["SELECT sqrtt(4)", "SELECT nope FROM (VALUES (1)) AS t(x)", "SELECT sum(1) OVER (ORDER BY nope)"]
    {
        let expected = full().state().create_logical_plan(sql).await.unwrap_err().to_string();
        let ctx = lean();
        let statement = parse(&ctx, sql);
        assert_eq!(plan(&ctx, statement).await.unwrap_err().to_string(), expected, "{sql}");
    }
    let suggested = full().state().create_logical_plan("SELECT sqrtt(4)").await.unwrap_err().to_string();
    assert!(suggested.contains("sqrt"), "{suggested}");
}

/// A plan kept from one session runs in another that planned nothing: `DISTINCT ON` needs `first_value`,
/// which the optimizer looks up by name.
#[tokio::test]
async fn a_kept_plan_runs_in_a_new_session() {
    let sql = "SELECT DISTINCT ON (a) a, b FROM (VALUES (1, 2), (1, 3)) AS t(a, b) ORDER BY a, b";
    let first = lean();
    let statement = parse(&first, sql);
    let kept = plan(&first, statement).await.unwrap();
    let full = full();
    let expected = answer(&full, full.state().create_logical_plan(sql).await.unwrap()).await;
    assert_eq!(answer(&lean(), kept).await, expected);
}
