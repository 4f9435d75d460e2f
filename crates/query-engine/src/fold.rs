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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::provider_as_source;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{JoinType, LogicalPlan, TableScan, TableSource};
use datafusion::prelude::ParquetReadOptions;
use domain::{Coverage, EngineError, ProjectId};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;

use crate::catalog::{current, table_prefix, Current};
use crate::compaction::{lineage, parquet, Lineage};
use crate::storage::{unavailable, Storage};

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

/// Why the plan of a stored result cannot follow rows appended to `table`, if it cannot: the table must be read
/// once, along projections, filters, aliases and inner joins. `aggregated` is a rollup's plan, whose outermost
/// node is the aggregation the path leads to.
pub(crate) fn unfoldable(plan: &LogicalPlan, table: &str, aggregated: bool) -> Option<String> {
    let reads = scans(plan, table, true);
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
/// version it read and the files of that version's directory it read (the full files a version lists are only
/// ever rows of earlier versions).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Covered {
    pub(crate) tables: BTreeMap<String, Read>,
}

/// What a stored result read of one table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Read {
    pub(crate) version: String,
    pub(crate) files: BTreeSet<String>,
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

/// A table's files as a run reads them now: the version, the files of its directory, and the full files.
pub(crate) struct Listed {
    pub(crate) version: String,
    pub(crate) dir: ObjectPath,
    pub(crate) names: BTreeSet<String>,
    pub(crate) full: Vec<ObjectPath>,
}

impl Listed {
    /// Every file of the table as listed: its directory's, then the full files.
    pub(crate) fn files(&self) -> Vec<ObjectPath> {
        let own = self.names.iter().map(|name| self.dir.clone().join(name.as_str()));
        own.chain(self.full.iter().cloned()).collect()
    }
}

/// The table's files now, or `None` when it is not a table of files of this layout (an external source).
pub(crate) async fn listed(
    storage: &Storage,
    project: ProjectId,
    table: &str,
) -> Result<Option<Listed>, EngineError> {
    let Some(Current::Files(version)) = current(storage, &table_prefix(project, table)).await? else {
        return Ok(None);
    };
    let Some(name) = version.name().map(str::to_owned) else { return Ok(None) };
    let names = parquet_names(storage, &version.dir).await?;
    Ok(Some(Listed { version: name, dir: version.dir, names, full: version.full }))
}

async fn parquet_names(storage: &Storage, dir: &ObjectPath) -> Result<BTreeSet<String>, EngineError> {
    let files = parquet(storage, dir).await?;
    Ok(files.iter().filter_map(|o| o.location.filename().map(str::to_owned)).collect())
}

/// Exactly these files, read with the table's `schema`, as a table source.
pub(crate) async fn files_source(
    storage: &Storage,
    ctx: &datafusion::prelude::SessionContext,
    files: &[ObjectPath],
    schema: &Schema,
) -> Result<Arc<dyn TableSource>, EngineError> {
    if files.is_empty() {
        return Ok(provider_as_source(Arc::new(EmptyTable::new(Arc::new(schema.clone())))));
    }
    let urls: Vec<String> = files.iter().map(|path| storage.url_of_object(path)).collect();
    let frame = ctx
        .read_parquet(urls, ParquetReadOptions::default().schema(schema))
        .await
        .map_err(crate::execute::storage_error)?;
    Ok(provider_as_source(frame.into_view()))
}

/// The rows appended to `table` since a stored result read `read` of it: the files that hold them, and the
/// table's files as it now is (what the result holds once they are folded in). `Err` says why they cannot be
/// told: the table was replaced, or its history since is not known (a version gone, or written by an earlier
/// release), or a file the result read never became part of the table.
///
/// Every file of a version's directory is an append to it, or was brought into it by the compaction that wrote
/// it (merged or linked), which its lineage says; the compaction after it took every file the version had (see
/// `compaction::Lineage`). So the rows appended since are: the files of the version read that its successor
/// took and the result did not read, the appends to each version after it (what its successor took of them),
/// and the appends to the current version.
pub(crate) async fn appended_since(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    read: &Read,
) -> Result<Result<(Vec<ObjectPath>, Listed), String>, EngineError> {
    let Some(now) = listed(storage, project, table).await? else {
        return Ok(Err(format!("`{table}` is not a table of files")));
    };
    let prefix = table_prefix(project, table);
    if now.version == read.version {
        if !read.files.is_subset(&now.names) {
            return Ok(Err(format!("files of `{table}` the stored result read are gone")));
        }
        let files =
            now.names.difference(&read.files).map(|name| now.dir.clone().join(name.as_str())).collect();
        return Ok(Ok((files, now)));
    }
    // Back from the current version to the one read, through the lineage of each compaction.
    let mut chain: Vec<(String, Lineage)> = Vec::new();
    let mut at = now.version.clone();
    loop {
        if chain.len() >= MAX_VERSIONS {
            return Ok(Err(format!("`{table}` was compacted more than {MAX_VERSIONS} times since")));
        }
        let Some(lineage) = lineage(storage, &prefix.clone().join(at.as_str())).await? else {
            return Ok(Err(format!(
                "the history of `{table}` since the stored result is not known (replaced)"
            )));
        };
        let base = lineage.base.clone();
        chain.push((at, lineage));
        if base == read.version {
            break;
        }
        at = base;
    }
    let mut files = Vec::new();
    let (_, first) = chain.last().expect("the loop pushes before it breaks");
    if !read.files.is_subset(&first.taken) {
        return Ok(Err(format!(
            "a file of `{table}` the stored result read was written again by its append"
        )));
    }
    let read_dir = prefix.clone().join(read.version.as_str());
    files.extend(first.taken.difference(&read.files).map(|name| read_dir.clone().join(name.as_str())));
    for i in 1..chain.len() {
        let (version, own) = &chain[i];
        let taken = &chain[i - 1].1.taken;
        let dir = prefix.clone().join(version.as_str());
        files.extend(
            taken
                .iter()
                .filter(|name| !own.brought.contains(*name))
                .map(|name| dir.clone().join(name.as_str())),
        );
    }
    let brought = &chain[0].1.brought;
    files.extend(
        now.names
            .iter()
            .filter(|name| !brought.contains(*name))
            .map(|name| now.dir.clone().join(name.as_str())),
    );
    Ok(Ok((files, now)))
}

/// How many compactions back a fold follows a table; past that, a full refresh is cheaper than reading their marks.
const MAX_VERSIONS: usize = 1_000;

/// The most parts a stored result may have: past it, a full refresh writes it again as one.
pub(crate) const MAX_PARTS: usize = 32;

/// The parts of the stored result at `from`, copied to `to` (a hard link on a local disk, a copy in the bucket on
/// S3), with the rows they hold. Returns how many parts there are and their rows; refuses past [`MAX_PARTS`].
pub(crate) async fn copy_parts(
    storage: &Storage,
    from: &ObjectPath,
    to: &ObjectPath,
) -> Result<usize, EngineError> {
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
    if parts.len() >= MAX_PARTS {
        return Err(EngineError::InvalidQuery(format!(
            "the stored result has {} parts; a full refresh writes it again as one",
            parts.len()
        )));
    }
    for (meta, name) in &parts {
        storage.store().copy(&meta.location, &to.clone().join(name.as_str())).await.map_err(unavailable)?;
    }
    Ok(parts.len())
}
