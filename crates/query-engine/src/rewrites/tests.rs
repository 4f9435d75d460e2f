//! Each rewrite keeps every answer: the same queries over the same random rows, planned with the rewrites and
//! without them, answer the same; and each rewrite does take place where it should.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, Scalar, StringArray};
use datafusion::arrow::compute::{cast, kernels::comparison::like};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{Result, Statistics};
use datafusion::datasource::MemTable;
use datafusion::datasource::TableType;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use proptest::prelude::*;

use super::like::FixedPattern;

/// Characters values are made of: ASCII, two- and three-byte characters, a newline, and the pattern's own
/// special characters (which a value may hold too).
const VALUE_CHARS: &[&str] = &["a", "b", "x", "é", "日", "\n", "_", "%", "\\", "'"];

/// Pieces of patterns: text of each width, `_` alone and after text, and pieces no fixed pattern has.
const PATTERN_PIECES: &[&str] = &["a", "b", "ab", "é", "日", "\n", "_", "x_", "__", "'"];

fn value() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(VALUE_CHARS), 0..7).prop_map(|chars| chars.concat())
}

/// Mostly patterns the rewrite takes (text and `_`, a trailing `%`), and some it must leave alone (a `%`
/// inside, an escape).
fn pattern() -> impl Strategy<Value = String> {
    let fixed = (prop::collection::vec(prop::sample::select(PATTERN_PIECES), 0..5), 0..3usize)
        .prop_map(|(pieces, open)| pieces.concat() + &"%".repeat(open));
    let free =
        prop::collection::vec(prop::sample::select(&["a", "_", "%", "\\", "é", "\\_", "\\%"][..]), 0..6)
            .prop_map(|pieces| pieces.concat());
    prop_oneof![4 => fixed, 1 => free]
}

fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A table `t(id, v)` of `values`, `v` of type `text_type`.
fn session(values: &[Option<String>], text_type: &DataType, rewrites: bool) -> SessionContext {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..values.len() as i64));
    let text: ArrayRef = Arc::new(StringArray::from(values.to_vec()));
    let text = cast(&text, text_type).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", text_type.clone(), true),
    ]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![ids, text]).unwrap();
    let ctx = SessionContext::new();
    if rewrites {
        super::register(&ctx);
    }
    ctx.register_table("t", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
    ctx
}

/// `sql`'s answer as text, or its error's message.
pub(super) async fn answer(ctx: &SessionContext, sql: &str) -> String {
    let batches = match ctx.sql(sql).await {
        Ok(frame) => frame.collect().await,
        Err(error) => Err(error),
    };
    match batches {
        Ok(batches) => pretty_format_batches(&batches).unwrap().to_string(),
        Err(error) => format!("error: {error}"),
    }
}

/// The optimized plan of `sql`, as text.
pub(super) async fn optimized(ctx: &SessionContext, sql: &str) -> String {
    let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
    let text = plan.display_indent().to_string();
    text
}

pub(super) fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
}

#[test]
fn only_patterns_of_text_and_underscores_are_fixed() {
    for taken in ["user_012%", "_", "a_b", "__-__-2026", "a_%%", "日_é%"] {
        assert!(FixedPattern::parse(taken).is_some(), "{taken}");
    }
    // No `_` (arrow's kernel has a fast path), `%` before the end, escapes.
    for left in ["user%", "abc", "%a_b", "a%b_", "a\\_b%", "a_b\\", ""] {
        assert!(FixedPattern::parse(left).is_none(), "{left}");
    }
}

#[test]
fn an_underscore_is_one_character_not_one_byte() {
    let pattern = FixedPattern::parse("a_c%").unwrap();
    assert!(pattern.matches("abc"));
    assert!(pattern.matches("a日cd"));
    assert!(pattern.matches("a\nc"));
    assert!(!pattern.matches("ac"));
    assert!(!pattern.matches("a日日c"));
    let closed = FixedPattern::parse("__").unwrap();
    assert!(closed.matches("日é"));
    assert!(!closed.matches("日é!"));
    assert!(!closed.matches("日"));
}

#[test]
fn a_fixed_pattern_is_matched_without_like_and_prunes_by_its_prefix() {
    let values = vec![Some("user_01234".to_owned())];
    let ctx = session(&values, &DataType::Utf8View, true);
    let plan = block_on(optimized(&ctx, "SELECT id FROM t WHERE v LIKE 'user_012%'"));
    assert!(
        plan.contains(r#"Filter: fixed_like(t.v, Utf8View("user_012%")) AND t.v LIKE Utf8View("user%")"#),
        "matched, then its prefix kept for pruning: {plan}"
    );
    // Negated, the prefix says nothing; in a projection, the column keeps its name.
    let plan = block_on(optimized(&ctx, "SELECT v NOT LIKE 'user_012%' FROM t"));
    assert!(plan.contains(r#"NOT fixed_like(t.v, Utf8View("user_012%"))"#), "{plan}");
    assert!(!plan.contains(r#"Utf8View("user%")"#), "{plan}");
    let columns = block_on(async { ctx.sql("SELECT v LIKE 'u_er%' FROM t").await.unwrap().schema().clone() });
    assert_eq!(columns.field(0).name(), r#"t.v LIKE Utf8("u_er%")"#);
    // Left alone: no `_`, ILIKE, an escape.
    for sql in [
        "SELECT id FROM t WHERE v LIKE 'user%'",
        "SELECT id FROM t WHERE v ILIKE 'user_012%'",
        "SELECT id FROM t WHERE v LIKE 'user\\_012%'",
    ] {
        let plan = block_on(optimized(&ctx, sql));
        assert!(!plan.contains("fixed_like"), "{sql}: {plan}");
    }
}

/// Rows in memory as a table of another kind states them: one that evaluates every filter itself, as a
/// PostgreSQL source does (the filters become its SQL), or one that says how many rows it holds, as a table of
/// this service's storage does (`rows`, whatever it really holds).
#[derive(Debug)]
pub(super) struct Stating {
    pub(super) table: MemTable,
    pub(super) exact_filters: bool,
    pub(super) rows: Option<u64>,
}

#[async_trait::async_trait]
impl TableProvider for Stating {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        let answer = if self.exact_filters {
            TableProviderFilterPushDown::Exact
        } else {
            TableProviderFilterPushDown::Unsupported
        };
        Ok(vec![answer; filters.len()])
    }

    fn statistics(&self) -> Option<Statistics> {
        let mut statistics = Statistics::new_unknown(&self.schema());
        statistics.num_rows = Precision::Exact(usize::try_from(self.rows?).ok()?);
        Some(statistics)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.table.scan(state, projection, filters, limit).await
    }
}

#[test]
fn a_plan_reading_a_table_that_filters_itself_is_left_as_written() {
    let values = vec![Some("user_01234".to_owned())];
    let ctx = session(&values, &DataType::Utf8, true);
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)]));
    let remote = MemTable::try_new(Arc::clone(&schema), vec![vec![]]).unwrap();
    let remote = Stating { table: remote, exact_filters: true, rows: None };
    ctx.register_table("remote", Arc::new(remote)).unwrap();
    for sql in [
        "SELECT v FROM remote WHERE v LIKE 'user_012%'",
        "SELECT t.id FROM t JOIN remote r ON t.v = r.v WHERE t.v LIKE 'user_012%' AND r.v LIKE 'u_er%'",
    ] {
        let plan = block_on(optimized(&ctx, sql));
        assert!(!plan.contains("fixed_like") && plan.contains(r#"LIKE Utf8("user_012%")"#), "{sql}: {plan}");
    }
    // The same filter over the local table alone is rewritten.
    let plan = block_on(optimized(&ctx, "SELECT id FROM t WHERE v LIKE 'user_012%'"));
    assert!(plan.contains("fixed_like"), "{plan}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The match decides every value as arrow's `LIKE` kernel does.
    #[test]
    fn the_match_agrees_with_arrows_like(values in prop::collection::vec(value(), 1..20), written in pattern()) {
        let Some(pattern) = FixedPattern::parse(&written) else { return Ok(()) };
        let text = StringArray::from(values.clone());
        let expected = like(&text, &Scalar::new(StringArray::from(vec![written.clone()]))).unwrap();
        for (at, value) in values.iter().enumerate() {
            prop_assert_eq!(pattern.matches(value), expected.value(at), "{:?} LIKE {:?}", value, written);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Filters and projections of `LIKE` and `NOT LIKE` answer the same with the rewrite as without, over
    /// every string type a column has, NULLs included.
    #[test]
    fn answers_are_the_same_with_the_rewrite(
        values in prop::collection::vec(prop::option::weighted(0.85, value()), 0..40),
        patterns in prop::collection::vec(pattern(), 1..5),
        text_type in prop::sample::select(vec![
            DataType::Utf8View,
            DataType::Utf8,
            DataType::LargeUtf8,
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        ]),
    ) {
        let with = session(&values, &text_type, true);
        let without = session(&values, &text_type, false);
        let projected: Vec<String> = patterns
            .iter()
            .enumerate()
            .map(|(at, p)| format!("v LIKE {0} AS l{at}, v NOT LIKE {0} AS n{at}", quoted(p)))
            .collect();
        let mut queries = vec![format!("SELECT id, {} FROM t ORDER BY id", projected.join(", "))];
        for p in &patterns {
            queries.push(format!("SELECT id FROM t WHERE v LIKE {} ORDER BY id", quoted(p)));
            queries.push(format!("SELECT count(*) FROM t WHERE v NOT LIKE {} AND id % 2 = 0", quoted(p)));
        }
        for sql in &queries {
            let (rewritten, plain) = block_on(async { (answer(&with, sql).await, answer(&without, sql).await) });
            prop_assert_eq!(rewritten, plain, "{}", sql);
        }
    }
}
