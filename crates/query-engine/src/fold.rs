//! Folding rows appended to a table into a stored result (see `domain::ResultStorage::fold`), without computing
//! it again.
//!
//! A stored result is the query's plan with its variable predicates removed (`materialized`), for a rollup
//! regrouped with partial aggregates (`rollup`). When that plan reads the appended table exactly once, along a
//! path of projections, filters, aliases and inner joins (to a rollup's aggregation, or to the top of a plan of
//! rows), it distributes over the union of the table's old rows and the appended ones: the plan over the
//! appended rows alone gives exactly the rows (or partial aggregates) they add. Those are written as one more
//! part of the stored result, beside the old parts, in a new location:
//! - a result of rows gets them after its own, positions continuing where the old parts end (the plan has no
//!   ORDER BY, so the live query's order is not defined beyond what a stored result keeps);
//! - a rollup gets more partial rows, which a run's aggregation combines with the old ones (COUNT and SUM add,
//!   MIN and MAX compare, AVG is a sum over a count), as it combines the rows of one group already.
//!
//! Anything else (the table read twice, under an aggregation, a sort, DISTINCT, a window, a limit, a union, an
//! outer join or a subquery) is refused with the reason, and a full refresh computes the result instead.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{JoinType, LogicalPlan, TableScan, TableSource};
use datafusion::prelude::ParquetReadOptions;
use domain::{AppendedRows, EngineError, ProjectId};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;

use crate::storage::{unavailable, Storage};
use crate::table_store::rows_of;

/// The name of the `n`th part of a stored result.
pub(crate) fn part_name(n: usize) -> String {
    format!("part-{n}.parquet")
}

/// How many scans of `table` a plan has, in its subqueries too.
fn scans(plan: &LogicalPlan, table: &str) -> usize {
    let mut found = 0;
    // Visiting a plan that is already built cannot fail.
    let _ = plan.apply_with_subqueries(|node| {
        if matches!(node, LogicalPlan::TableScan(scan) if scan.table_name.table() == table) {
            found += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// How many scans of `table` a plan has outside its subqueries.
fn direct_scans(plan: &LogicalPlan, table: &str) -> usize {
    let mut found = 0;
    let _ = plan.apply(|node| {
        if matches!(node, LogicalPlan::TableScan(scan) if scan.table_name.table() == table) {
            found += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// Why the plan of a stored result cannot follow rows appended to `table`, if it cannot: the table must be read
/// once, along projections, filters, aliases and inner joins. `aggregated` is a rollup's plan, whose outermost
/// node is the aggregation the path leads to.
pub(crate) fn unfoldable(plan: &LogicalPlan, table: &str, aggregated: bool) -> Option<String> {
    let reads = scans(plan, table);
    if reads != 1 {
        return Some(format!("the query reads `{table}` {reads} times; a fold follows a table read once"));
    }
    let mut node = match (aggregated, plan) {
        (true, LogicalPlan::Aggregate(aggregate)) => aggregate.input.as_ref(),
        (true, _) => return Some("a rollup's plan has no aggregation at its top".into()),
        (false, plan) => plan,
    };
    loop {
        let children = node.inputs();
        let reading: Vec<&LogicalPlan> =
            children.iter().copied().filter(|child| direct_scans(child, table) > 0).collect();
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

/// The plan with its scans of `table` reading `appended` instead: the same columns, projection and filters.
pub(crate) fn over_appended(
    plan: LogicalPlan,
    table: &str,
    appended: &Arc<dyn TableSource>,
) -> DfResult<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::TableScan(scan) if scan.table_name.table() == table => {
            let scan = TableScan { source: Arc::clone(appended), ..scan };
            Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// The appended files of a project as a table source with `schema` (the table's): paths are relative to the
/// project, and nothing outside its `tables/` is read.
pub(crate) async fn appended_source(
    storage: &Storage,
    ctx: &datafusion::prelude::SessionContext,
    project: ProjectId,
    appended: &AppendedRows,
    schema: &datafusion::arrow::datatypes::Schema,
) -> Result<Arc<dyn TableSource>, EngineError> {
    let bad =
        |file: &str| EngineError::Internal(format!("not an appended file of the project: {file:?}").into());
    let base = ObjectPath::from_iter(["projects", &project.to_string()]);
    let mut urls = Vec::with_capacity(appended.files.len());
    for file in &appended.files {
        let path = ObjectPath::parse(file).map_err(|_| bad(file))?;
        let mut parts = path.parts();
        let inside = parts.next().is_some_and(|first| first.as_ref() == "tables")
            && file.ends_with(".parquet")
            && !file.split('/').any(|part| part == ".." || part.is_empty());
        if !inside {
            return Err(bad(file));
        }
        urls.push(storage.url_of_object(&ObjectPath::from(format!("{base}/{path}"))));
    }
    let frame = ctx
        .read_parquet(urls, ParquetReadOptions::default().schema(schema))
        .await
        .map_err(crate::execute::storage_error)?;
    Ok(provider_as_source(frame.into_view()))
}

/// The parts of the stored result at `from`, copied to `to` (a hard link on a local disk, a copy in the bucket on
/// S3), with the rows they hold. Returns how many parts there are and their rows.
pub(crate) async fn copy_parts(
    storage: &Storage,
    from: &ObjectPath,
    to: &ObjectPath,
) -> Result<(usize, u64), EngineError> {
    let mut listed = storage.store().list(Some(from));
    let mut parts = Vec::new();
    while let Some(meta) = listed.next().await {
        let meta = meta.map_err(unavailable)?;
        let name = meta.location.filename().filter(|n| n.starts_with("part-") && n.ends_with(".parquet"));
        if let Some(name) = name.map(str::to_owned) {
            parts.push((meta, name));
        }
    }
    if parts.is_empty() {
        return Err(EngineError::Unavailable(format!("the stored result at {from} has no files").into()));
    }
    let mut rows = 0;
    for (meta, name) in &parts {
        rows += rows_of(storage.store().as_ref(), meta, None).await?;
        storage.store().copy(&meta.location, &to.clone().join(name.as_str())).await.map_err(unavailable)?;
    }
    Ok((parts.len(), rows))
}
