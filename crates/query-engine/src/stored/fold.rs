//! Folding rows appended to a table into a stored result (see `domain::ResultStorage::fold`), without computing
//! it again.
//!
//! A stored result is the query's plan with its variable predicates removed (`materialized`), for a rollup
//! regrouped with partial aggregates (`rollup`). When that plan reads the appended table exactly once, along a
//! path of projections, filters, aliases and inner joins (to a rollup's aggregation, or to the top of a plan of
//! rows), it distributes over the union of the table's old rows and the appended ones: the plan over the
//! appended rows alone gives exactly the rows (or partial aggregates) they add. Those are written as one more
//! part of the stored result, beside the old parts, in a new location:
//! - a result of rows gets them after its own, positions continuing where the old parts end. Without an ORDER
//!   BY the live query's order is not defined beyond what a stored result keeps; with one whose keys are output
//!   columns ([`kept_order`]), each part holds its rows in that order and a read merges the parts in it (ties in
//!   the order of their positions). A `SELECT DISTINCT` ([`distinct_rows`]) gets the appended rows' distinct
//!   rows, some of which the old parts may hold: a read keeps each row once (at its first position), as a merge
//!   of the parts does;
//! - a rollup gets more partial rows, which a run's aggregation combines with the old ones (COUNT and SUM add,
//!   MIN and MAX compare, AVG is a sum over a count; a DISTINCT count, sum or average is applied to the stored
//!   values again, each counted once), as it combines the rows of one group already.
//!
//! Anything else (the table read twice, under an aggregation, any other sort, a DISTINCT below the top, a window,
//! a limit, a union, an outer join or a subquery) is refused with the reason, and a full refresh computes the
//! result instead.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::provider_as_source;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Distinct, Expr, JoinType, LogicalPlan, TableScan, TableSource, Volatility};
use domain::{Coverage, EngineError, Fold, ProjectId};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;

use tables_delta::{Changes, DataFile, Snapshot};

use crate::storage::{unavailable, Storage};
use crate::tables::catalog::{current, table_error, table_prefix, Current};

/// The name of the `n`th part of a stored result.
pub(crate) fn part_name(n: usize) -> String {
    format!("part-{n}.parquet")
}

/// The tables a plan scans, in its subqueries too, each once, with the columns of the first scan's source.
pub(crate) fn scanned(plan: &LogicalPlan) -> BTreeMap<String, Schema> {
    let mut found = BTreeMap::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            found
                .entry(scan.table_name.table().to_owned())
                .or_insert_with(|| scan.source.schema().as_ref().clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// How many scans of `table` a plan has, in its subqueries too or not.
fn scans(plan: &LogicalPlan, table: &str, subqueries: bool) -> usize {
    let mut found = 0;
    let mut count = |node: &LogicalPlan| {
        if matches!(node, LogicalPlan::TableScan(scan) if scan.table_name.table() == table) {
            found += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    };
    // Visiting a plan that is already built cannot fail.
    let _ = if subqueries { plan.apply_with_subqueries(&mut count) } else { plan.apply(&mut count) };
    found
}

/// Why a result that does not say which rows of its tables it holds is computed in full after every change.
pub(crate) const UNCOVERED: &str = "the query reads a source whose files the service does not keep, or runs \
     on the cluster, so the stored result cannot tell which rows it holds";

/// How rows appended to the tables of a stored result of `plan` (a rollup's when `aggregated`) reach it: folded
/// in, unless the query's answer changes with time, or an aggregation is stored as its final rows
/// (`final_rows`, the rules' reason), or a table is read where a fold cannot follow it ([`unfoldable`]).
/// The status shows it, and a fold refuses with its reason before it reads anything.
pub(crate) fn fold_of(plan: &LogicalPlan, aggregated: bool, final_rows: Option<String>) -> Fold {
    let reason = changes_with_time(plan)
        .or(final_rows)
        .or_else(|| scanned(plan).keys().find_map(|table| unfoldable(plan, table, aggregated)));
    match reason {
        Some(reason) => Fold::FullRefreshOnly { reason },
        None => Fold::Incremental,
    }
}

/// Why the plan of a stored result cannot follow rows appended to `table`, if it cannot: the table must be read
/// once, along projections, filters, aliases and inner joins. `aggregated` is a rollup's plan, whose outermost
/// node is the aggregation the path leads to.
fn unfoldable(plan: &LogicalPlan, table: &str, aggregated: bool) -> Option<String> {
    let reads = scans(plan, table, true);
    if reads != 1 {
        return Some(format!("the query reads `{table}` {reads} times; a fold follows a table read once"));
    }
    let mut node = match (aggregated, plan) {
        (true, LogicalPlan::Aggregate(aggregate)) => aggregate.input.as_ref(),
        (true, _) => return Some("a rollup's plan has no aggregation at its top".into()),
        // Each part is written in the query's order and without repeated rows; a read merges them in that
        // order, each row once.
        (false, plan) => match below_order(plan) {
            LogicalPlan::Distinct(Distinct::All(input)) => input.as_ref(),
            rows => rows,
        },
    };
    loop {
        let children = node.inputs();
        let reading: Vec<&LogicalPlan> =
            children.iter().copied().filter(|child| scans(child, table, false) > 0).collect();
        match node {
            LogicalPlan::TableScan(_) => return None,
            LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {}
            LogicalPlan::Join(join) if join.join_type == JoinType::Inner => {}
            LogicalPlan::Join(join) => {
                return Some(format!("`{table}` is read under a {} join", join.join_type));
            }
            other => {
                let what = match other {
                    LogicalPlan::Aggregate(_) => "an aggregation",
                    LogicalPlan::Sort(_) => "an ORDER BY",
                    LogicalPlan::Distinct(_) => "DISTINCT",
                    LogicalPlan::Window(_) => "a window function",
                    LogicalPlan::Limit(_) => "a LIMIT",
                    LogicalPlan::Union(_) => "a UNION",
                    _ => "an operator a fold cannot follow",
                };
                return Some(format!("`{table}` is read under {what}"));
            }
        }
        match reading.as_slice() {
            [next] => node = next,
            _ => return Some(format!("`{table}` is read inside a subquery")),
        }
    }
}

/// An output column a stored result of rows is ordered by.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct OrderedBy {
    pub(crate) column: String,
    pub(crate) descending: bool,
    pub(crate) nulls_first: bool,
}

/// The ORDER BY at the top of a plan of rows, when each part of a stored result can keep it: no LIMIT with it,
/// and every key one of the plan's output columns (so a read can sort by it). `None` for any other plan.
pub(crate) fn kept_order(plan: &LogicalPlan) -> Option<Vec<OrderedBy>> {
    let LogicalPlan::Sort(sort) = plan else { return None };
    if sort.fetch.is_some() {
        return None;
    }
    let schema = sort.input.schema();
    sort.expr
        .iter()
        .map(|key| match &key.expr {
            Expr::Column(column) => schema.index_of_column(column).ok().map(|i| OrderedBy {
                column: schema.field(i).name().clone(),
                descending: !key.asc,
                nulls_first: key.nulls_first,
            }),
            _ => None,
        })
        .collect()
}

/// A plan of rows under the ORDER BY that a stored result keeps ([`kept_order`]), if it has one.
fn below_order(plan: &LogicalPlan) -> &LogicalPlan {
    match plan {
        LogicalPlan::Sort(sort) if kept_order(plan).is_some() => sort.input.as_ref(),
        other => other,
    }
}

/// Whether a plan of rows is a `SELECT DISTINCT` (under the ORDER BY a stored result keeps, if any): its stored
/// parts may then hold the same row, and a read keeps each once.
pub(crate) fn distinct_rows(plan: &LogicalPlan) -> bool {
    matches!(below_order(plan), LogicalPlan::Distinct(Distinct::All(_)))
}

/// Why a result of the plan changes while its tables do not, if it does: it calls a function whose answer its
/// arguments do not fix. Such a result is never folded, even when no rows were appended.
fn changes_with_time(plan: &LogicalPlan) -> Option<String> {
    changing_function(plan).map(|function| {
        format!(
            "the query calls `{function}`, whose answer is not fixed by its arguments (the time, a random draw), so \
             the rows stored earlier were chosen under another answer"
        )
    })
}

/// The first function of a plan (its subqueries too) whose answer is not fixed by its arguments: `now()`,
/// `current_date`, `random()`, any function DataFusion does not declare immutable. A fold evaluates it for the
/// appended rows only, at another time than the rows stored before, so a result of such a plan is refreshed
/// in full.
pub(crate) fn changing_function(plan: &LogicalPlan) -> Option<String> {
    let mut found = None;
    let mut visit = |expr: &Expr| {
        if let Expr::ScalarFunction(call) = expr {
            if crate::memory::declared_volatility(&call.func) != Volatility::Immutable {
                found = Some(format!("{}()", call.func.name()));
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    };
    // Visiting a plan that is already built cannot fail.
    let _ = plan.apply_with_subqueries(|node| node.apply_expressions(|expr| expr.apply(&mut visit)));
    found
}

/// The plan with its scans of `table` reading `files` instead: the same columns, projection and filters.
pub(crate) fn reading(plan: LogicalPlan, table: &str, files: &Arc<dyn TableSource>) -> DfResult<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::TableScan(scan) if scan.table_name.table() == table => {
            let scan = TableScan { source: Arc::clone(files), ..scan };
            Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// What of its tables a stored result holds (`domain::Coverage`, as JSON): for each table of files it read, the
/// version of the table's Delta log it read. (`files` is what results of earlier releases kept, which named
/// versions of another layout: such a result is computed again in full.)
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Covered {
    pub(crate) tables: BTreeMap<String, Read>,
    /// How many parts the result has ([`part_name`] 0 on), so that a fold links them without listing them
    /// (results of earlier releases do not say: their parts are listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parts: Option<usize>,
}

/// What a stored result read of one table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Read {
    pub(crate) version: String,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) files: BTreeSet<String>,
}

impl Read {
    /// What a result reading `snapshot` holds of its table.
    pub(crate) fn of(snapshot: &Snapshot) -> Self {
        Self { version: snapshot.version.to_string(), files: BTreeSet::new() }
    }
}

impl Covered {
    pub(crate) fn coverage(&self) -> Coverage {
        Coverage(serde_json::to_string(self).expect("names and sets of names serialize"))
    }

    pub(crate) fn of(coverage: &Coverage) -> Result<Self, EngineError> {
        serde_json::from_str(&coverage.0).map_err(|e| {
            EngineError::InvalidQuery(format!("the stored result's coverage does not read: {e}"))
        })
    }
}

/// The table's newest version, or `None` when it is not a table of files (an external source).
pub(crate) async fn listed(
    storage: &Storage,
    project: ProjectId,
    table: &str,
) -> Result<Option<Arc<Snapshot>>, EngineError> {
    match current(storage, &table_prefix(project, table)).await? {
        Some(Current::Files(snapshot)) => Ok(Some(snapshot)),
        _ => Ok(None),
    }
}

/// Exactly these files of a table's log, read with the table's `schema`, as a table source: with the sizes and
/// times the log gives, so that nothing is listed or asked of the storage before the files are read.
pub(crate) fn files_source(
    storage: &Storage,
    ctx: &datafusion::prelude::SessionContext,
    files: &[DataFile],
    schema: &Schema,
) -> Arc<dyn TableSource> {
    if files.is_empty() {
        return provider_as_source(Arc::new(EmptyTable::new(Arc::new(schema.clone()))));
    }
    provider_as_source(Arc::new(crate::tables::catalog::files_scan(
        storage,
        ctx,
        files,
        Arc::new(schema.clone()),
    )))
}

/// The rows appended to `table` since a stored result read version `read` of it: the files that hold them, and
/// the table's newest version (what the result holds once they are folded in), from the table's Delta log.
/// `Err` says why they cannot be told: the table was replaced (or rows removed), or the result read a version
/// of an earlier release's layout.
pub(crate) async fn appended_since(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    read: &Read,
) -> Result<Result<(Vec<DataFile>, Arc<Snapshot>), String>, EngineError> {
    let Some(now) = listed(storage, project, table).await? else {
        return Ok(Err(format!("`{table}` is not a table of files")));
    };
    let Ok(version) = read.version.parse::<u64>() else {
        return Ok(Err(format!("the stored result read `{table}` as an earlier release kept it")));
    };
    if version == now.version {
        return Ok(Ok((Vec::new(), now)));
    }
    if version > now.version {
        return Ok(Err(format!("`{table}` is older than the stored result (written again)")));
    }
    if now.version - version > MAX_VERSIONS {
        return Ok(Err(format!("`{table}` has more than {MAX_VERSIONS} versions since")));
    }
    let prefix = table_prefix(project, table);
    match storage.tables().changes_since(&prefix, version, now.version).await.map_err(table_error)? {
        Changes::Appended(files) => Ok(Ok((files, now))),
        Changes::Rewritten => Ok(Err(format!("`{table}` was replaced since the stored result"))),
    }
}

/// How many versions back a fold follows a table; past that, a full refresh is cheaper than reading their commits.
const MAX_VERSIONS: u64 = 1_000;

/// The most parts a stored result may have: at it, a fold first merges them into one (see
/// `DataFusionEngine::compact_parts`).
pub(crate) const MAX_PARTS: usize = 32;

/// The parts of the stored result at `from`, of `count` parts when its coverage says (else listed).
pub(crate) async fn parts_of(
    storage: &Storage,
    from: &ObjectPath,
    count: Option<usize>,
) -> Result<Vec<ObjectPath>, EngineError> {
    match count {
        Some(count) => Ok((0..count).map(|n| from.clone().join(part_name(n))).collect()),
        None => parts(storage, from).await,
    }
}

/// The parts of the stored result at `from`, as listed.
pub(crate) async fn parts(storage: &Storage, from: &ObjectPath) -> Result<Vec<ObjectPath>, EngineError> {
    let mut listed = storage.store().list(Some(from));
    let mut parts = Vec::new();
    while let Some(meta) = listed.next().await {
        let meta = meta.map_err(unavailable)?;
        let name = meta.location.filename().filter(|n| n.starts_with("part-") && n.ends_with(".parquet"));
        if name.is_some() {
            parts.push(meta.location);
        }
    }
    if parts.is_empty() {
        return Err(EngineError::Unavailable(format!("the stored result at {from} has no files").into()));
    }
    Ok(parts)
}

/// Copies `parts` to the stored result at `to` (hard links on a local disk, copies in the bucket on S3).
pub(crate) async fn copy_parts(
    storage: &Storage,
    parts: &[ObjectPath],
    to: &ObjectPath,
) -> Result<(), EngineError> {
    storage.copy_into(parts, to).await.map_err(unavailable)
}
