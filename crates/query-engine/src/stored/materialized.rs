//! Stored results of materialized endpoints: `projects/{id}/materializations/{endpoint}/v{n}-{token}/` in the
//! storage.
//!
//! A result is the query's rows, in the order the query produced them, with one more column at the end holding
//! each row's position, so a read returns them in that same order whatever the file layout (after the query's
//! ORDER BY, when it has one a fold keeps: each part is in that order, and a read merges them). A rollup's result
//! is its grouped partial rows (see `rollup`), and its file's metadata holds the query, which a read plans to
//! aggregate them again. Each refresh writes into a location of its own that nothing reads until the store
//! switches to it; removing a location never touches another.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::{provider_as_source, MemTable, TableProvider};
use datafusion::functions_aggregate::expr_fn::min;
use datafusion::logical_expr::{cast, Expr, LogicalPlan, LogicalPlanBuilder, SortExpr};
use datafusion::parquet::arrow::AsyncArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
#[cfg(test)]
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{col, ParquetReadOptions, SessionContext};
use datafusion::scalar::ScalarValue;
use domain::{
    BoundValue, Coverage, Eligibility, EngineError, Export, Fold, MaterializedFilter, ProjectId, Query,
    QueryResult, ReadAt, ResultFormat, ResultStorage, Rollup, Stored, StoredColumn, StoredResult,
    VariableType,
};
use futures_util::StreamExt;
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use tracing::instrument;
use uuid::Uuid;

use crate::compile::{self, Compiled};
use crate::hot_tables::HotTable;
use crate::storage::{unavailable, Storage};
use crate::stored::bound::{self, BoundFilter, BoundRows, KeptPlan, ReadShape};
use crate::stored::{fold, outline, rollup};
use crate::tables::catalog;
use crate::{execute, message, types, DataFusionEngine};

const TABLE: &str = "materialized";

/// The key of a rollup file's metadata that holds the query it rolls up, as its JSON document.
const ROLLUP_QUERY: &str = "endpoints.rollup.query";

/// The key of the metadata of a file of final rows stored in place of a rollup (see [`StoredPlan::final_rows`])
/// that names, as a JSON array, the output column each filter of the rollup compares: the runs' filters name the
/// rollup's stored columns.
const FILTERED_OUTPUTS: &str = "endpoints.rows.filtered";

/// The key of the metadata of a result of rows whose query ends in an ORDER BY of output columns (see
/// [`fold::kept_order`]) that holds that order, as a JSON array: each part holds its rows in it, and a read merges
/// them in it.
const ROWS_ORDER: &str = "endpoints.rows.order";

/// The key of the metadata of a result of a `SELECT DISTINCT`'s rows (see [`fold::distinct_rows`]), present when
/// it is one: parts folded in may repeat rows of earlier parts, and a read keeps each row once.
const ROWS_DISTINCT: &str = "endpoints.rows.distinct";

pub(crate) fn materializations_prefix(project: ProjectId) -> ObjectPath {
    ObjectPath::from_iter(["projects", &project.to_string(), "materializations"])
}

/// The prefix of a location, refusing anything that is not `{uuid}` or `{uuid}/v{n}-{uuid}`: a location
/// never reaches outside its project's prefix.
fn resolve(project: ProjectId, location: &str) -> Result<ObjectPath, EngineError> {
    let bad = || EngineError::Internal(format!("not a materialization location: {location:?}").into());
    let mut parts = location.split('/');
    let endpoint = parts.next().ok_or_else(bad)?;
    Uuid::parse_str(endpoint).map_err(|_| bad())?;
    let mut path = materializations_prefix(project).join(endpoint);
    if let Some(attempt) = parts.next() {
        let (version, token) = attempt.strip_prefix('v').and_then(|a| a.split_once('-')).ok_or_else(bad)?;
        version.parse::<u32>().map_err(|_| bad())?;
        Uuid::parse_str(token).map_err(|_| bad())?;
        path = path.join(attempt);
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(path)
}

/// The order a read returns a stored result's rows in, and each of its parts holds them in: the ORDER BY the
/// query kept, if any, then the position (`position`, the position column's name).
fn stored_order(order: &[fold::OrderedBy], position: &str) -> Vec<SortExpr> {
    order
        .iter()
        .map(|key| col(quoted(&key.column)).sort(!key.descending, key.nulls_first))
        .chain(std::iter::once(col(quoted(position)).sort(true, false)))
        .collect()
}

/// [`stored_order`] as an ORDER BY clause's keys.
fn stored_order_sql(order: &[fold::OrderedBy], position: &str) -> String {
    order
        .iter()
        .map(|key| {
            let direction = if key.descending { "DESC" } else { "ASC" };
            let nulls = if key.nulls_first { "FIRST" } else { "LAST" };
            format!("{} {direction} NULLS {nulls}", quoted(&key.column))
        })
        .chain(std::iter::once(format!("{} ASC", quoted(position))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A name for the position column that no output column has.
fn ordinal_name(schema: &Schema) -> String {
    let mut name = "__row".to_owned();
    while schema.field_with_name(&name).is_ok() {
        name.push('_');
    }
    name
}

fn variable_type(value: &BoundValue) -> VariableType {
    match value {
        BoundValue::String(_) => VariableType::String,
        BoundValue::Number(_) => VariableType::Number,
        BoundValue::Integer(_) => VariableType::Integer,
        BoundValue::Boolean(_) => VariableType::Boolean,
        BoundValue::Date(_) => VariableType::Date,
        BoundValue::DateTime(_) => VariableType::DateTime,
        BoundValue::List(_) => VariableType::List,
    }
}

fn quoted(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// A stored result ready to answer runs, kept per location (whose files never change): its rows, decoded in
/// stored order, when there are few; and for a rollup, what its read plan is built from.
#[derive(Debug)]
pub(crate) struct PreparedResult {
    rollup: Option<RolledUp>,
    /// For final rows stored in place of a rollup, the output column each of the rollup's filters compares.
    filtered_outputs: Option<Vec<String>>,
    /// The ORDER BY its rows keep, if the query has one a fold follows (see [`ROWS_ORDER`]).
    order: Vec<fold::OrderedBy>,
    /// Whether its parts may repeat a row that a read keeps once (see [`ROWS_DISTINCT`]): a DISTINCT's rows in
    /// more than one part.
    distinct: bool,
    rows: Option<Arc<MemTable>>,
    schema: Schema,
    /// Memory it holds besides its kept reads (see [`PreparedResult::weight`]).
    bytes: usize,
    /// For rows held in memory, the read plans runs executed, by their shape (at most [`KEPT_READS`]); `None`
    /// for a shape whose plan is made per run (see [`bound`]).
    reads: Mutex<HashMap<ReadShape, Option<Arc<KeptRead>>>>,
}

/// A read plan of rows held in memory, executed again by each run of its shape with the run's values.
#[derive(Debug)]
struct KeptRead {
    planned: KeptPlan,
    columns: Vec<domain::Column>,
}

/// The shapes of read whose plans a prepared result keeps, each counted as [`PLAN_BYTES`] more.
const KEPT_READS: usize = 4;

impl PreparedResult {
    /// Memory it holds, as the cache weighs it: its rows and plans, and each read plan it keeps.
    pub(crate) fn weight(&self) -> usize {
        let reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner).len();
        self.bytes + PLAN_BYTES * reads
    }

    /// A run's filters as they name this result's stored columns, with their values.
    fn resolved(
        &self,
        filters: Vec<(MaterializedFilter, BoundValue)>,
    ) -> Result<Vec<(MaterializedFilter, BoundValue)>, EngineError> {
        if let Some(RolledUp { filters: own, .. }) = &self.rollup {
            // A version recorded before aggregations filtered on their group keys were stored as rollups names
            // such filters by output column; the rollup's own filter of the same predicate (the same position:
            // one per predicate, in order, either way) names its stored key.
            return filters
                .into_iter()
                .enumerate()
                .map(|(i, (filter, value))| match filter.column {
                    StoredColumn::Output(_) => own.get(i).cloned().map(|own| (own, value)),
                    _ => Some((filter, value)),
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| EngineError::Internal("a run's filters are not the rollup's".into()));
        }
        // Final rows stored in place of a rollup are filtered on the outputs the rollup's filters compare.
        let Some(outputs) = &self.filtered_outputs else { return Ok(filters) };
        filters
            .into_iter()
            .enumerate()
            .map(|(i, (filter, value))| {
                let column = StoredColumn::Output(outputs.get(i)?.clone());
                Some((MaterializedFilter { column, ..filter }, value))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| EngineError::Internal("a run's filters are not the stored rows'".into()))
    }
}

/// A rollup's parts: the unbound plan of the query it rolls up, whose outermost SELECT above its aggregation a
/// run reuses, and the scan of its stored rows (of those held in memory, or of the file).
#[derive(Debug)]
struct RolledUp {
    query: LogicalPlan,
    scan: LogicalPlan,
    /// The rollup's filters, one per variable predicate of the query, in their order.
    filters: Vec<MaterializedFilter>,
}

/// Prepared results, by project and location: a location is never reused, so an entry never goes stale; one
/// whose result was replaced is no longer asked for, and leaves when the cache is full.
pub(crate) type PreparedResults = moka::sync::Cache<(ProjectId, String), Arc<PreparedResult>>;

/// What a prepared result is counted as besides its rows: its plans.
const PLAN_BYTES: usize = 16 * 1024;

/// Memory prepared results may hold together; the least used leave first.
const PREPARED_BYTES: u64 = 64 * 1024 * 1024;

/// The plans folds ran, kept for the next fold of the same query (see [`FoldPlan`]).
#[derive(Clone)]
pub(crate) struct FoldPlans {
    entries: moka::sync::Cache<(ProjectId, String), Arc<FoldPlan>>,
}

impl std::fmt::Debug for FoldPlans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FoldPlans").field("entries", &self.entries.entry_count()).finish()
    }
}

/// The stored plan a fold ran, and the versions of the tables its result then held. A fold replaces every scan
/// of the plan with the files it reads, so the plan serves the next fold of a result that holds those versions:
/// that fold makes sure that only rows were appended since, which leaves the tables' columns as they were. A
/// live query's kept plan names the versions it reads, which every append moves on, so without this each fold
/// planned its query again (1.7 ms of a fold's 9 ms, scenario 11's rollup). A plan that reads one table also keeps
/// its physical plan over the appended files, which the next fold binds its own to (see [`bound::AppendedFiles`]).
pub(crate) struct FoldPlan {
    versions: BTreeMap<String, String>,
    plan: LogicalPlan,
    physical: Option<Arc<KeptPlan>>,
    rollup: bool,
    metadata: HashMap<String, String>,
    fold: Fold,
    /// Whether the next fold may run it.
    reusable: bool,
}

impl FoldPlans {
    /// Plans of folds unused for this long go (a query no longer folded, with them).
    const IDLE: std::time::Duration = std::time::Duration::from_secs(600);

    pub(crate) fn new() -> Self {
        let entries = moka::sync::Cache::builder()
            .max_capacity(PREPARED_BYTES / 4)
            // A physical plan kept beside the logical one counts as one plan more.
            .weigher(|(_, query): &(ProjectId, String), kept: &Arc<FoldPlan>| {
                let plans = 1 + usize::from(kept.physical.is_some());
                u32::try_from(PLAN_BYTES * plans + 8 * query.len()).unwrap_or(u32::MAX)
            })
            .time_to_idle(Self::IDLE)
            .build();
        Self { entries }
    }

    /// The physical plan kept for the next fold of `query`, if one is.
    #[cfg(test)]
    pub(crate) fn physical(&self, project: ProjectId, query: &Query) -> Option<Arc<dyn ExecutionPlan>> {
        let kept = self.entries.get(&(project, query.to_json().to_string()))?;
        kept.physical.as_ref().map(|physical| Arc::clone(&physical.plan))
    }

    /// The plan the last fold of `query` ran, if its result held exactly what `covered` says.
    fn kept(&self, project: ProjectId, query: &str, covered: &fold::Covered) -> Option<Arc<FoldPlan>> {
        let kept = self.entries.get(&(project, query.to_owned()))?;
        let held: BTreeMap<&String, &String> =
            covered.tables.iter().map(|(table, read)| (table, &read.version)).collect();
        (!kept.versions.is_empty() && kept.versions.iter().collect::<BTreeMap<_, _>>() == held)
            .then_some(kept)
    }

    /// Keeps `plan` (and the `physical` plan a fold made of it) for the next fold of `query`, if it may run it.
    fn keep(
        &self,
        (project, query): (ProjectId, String),
        plan: &FoldPlan,
        physical: Option<Arc<KeptPlan>>,
        covered: &fold::Covered,
    ) {
        if !plan.reusable {
            return;
        }
        let versions =
            covered.tables.iter().map(|(table, read)| (table.clone(), read.version.clone())).collect();
        let kept = FoldPlan {
            versions,
            plan: plan.plan.clone(),
            physical,
            rollup: plan.rollup,
            metadata: plan.metadata.clone(),
            fold: plan.fold.clone(),
            reusable: true,
        };
        self.entries.insert((project, query), Arc::new(kept));
    }
}

pub(crate) fn prepared_results() -> PreparedResults {
    moka::sync::Cache::builder()
        .weigher(|_, prepared: &Arc<PreparedResult>| u32::try_from(prepared.weight()).unwrap_or(u32::MAX))
        .max_capacity(PREPARED_BYTES)
        .build()
}

/// Rows in order with their positions, into one Parquet object that appears whole when the writer finishes.
struct ResultWriter {
    writer: AsyncArrowWriter<BufWriter>,
    schema: SchemaRef,
    /// The position of the first row: the rows of the parts before this one.
    first: u64,
    rows: u64,
}

impl ResultWriter {
    fn create(
        storage: &Storage,
        path: ObjectPath,
        output: &Schema,
        metadata: HashMap<String, String>,
    ) -> Result<Self, EngineError> {
        let mut fields: Vec<Field> = output.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(ordinal_name(output), DataType::UInt64, false));
        let schema = Arc::new(Schema::new_with_metadata(fields, metadata));
        let props =
            WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
        let sink = BufWriter::new(Arc::clone(storage.store()), path);
        let writer = AsyncArrowWriter::try_new(sink, Arc::clone(&schema), Some(props))
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        Ok(Self { writer, schema, first: 0, rows: 0 })
    }

    /// Positions start at `first`: the part follows parts of that many rows.
    fn after(self, first: u64) -> Self {
        Self { first, ..self }
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<(), EngineError> {
        let n = batch.num_rows() as u64;
        let start = self.first + self.rows;
        let positions: ArrayRef = Arc::new(UInt64Array::from_iter_values(start..start + n));
        let mut columns = batch.columns().to_vec();
        columns.push(positions);
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        self.writer.write(&batch).await.map_err(|e| EngineError::Internal(Box::new(e)))?;
        self.rows += n;
        Ok(())
    }

    async fn finish(self) -> Result<u64, EngineError> {
        self.writer.close().await.map_err(|e| EngineError::Internal(Box::new(e)))?;
        Ok(self.rows)
    }
}

/// What writing a stored result's rows came to.
enum Written {
    /// Its rows, and what of its tables it holds.
    Rows(u64, Option<fold::Covered>),
    /// More rows than its limit: nothing usable was written.
    TooMany,
}

/// The plan whose rows a stored result of a query holds, in a session of its tables.
struct StoredPlan {
    ctx: SessionContext,
    /// The query's plan with its variable predicates removed; for a rollup, regrouped with partial aggregates.
    plan: LogicalPlan,
    rollup: Option<Rollup>,
    /// The metadata of the result's files.
    metadata: HashMap<String, String>,
    /// How rows appended to its tables reach the result (see [`fold::fold_of`]).
    fold: Fold,
    /// For a rollup of the query's keys and the values of its DISTINCT aggregates, the query's final rows and
    /// their files' metadata: stored instead when those values are more than `--max-rollup-rows`, as the query's
    /// final rows were before such rollups (so that no query that could be stored is refused for it).
    final_rows: Option<(LogicalPlan, HashMap<String, String>)>,
    /// The versions of the tables it was planned against.
    planned_at: Vec<domain::TableVersion>,
}

impl DataFusionEngine {
    /// The plan a stored result of `query` holds, and how appended rows reach it.
    async fn stored_plan_of(&self, project: ProjectId, query: &Query) -> Result<StoredPlan, EngineError> {
        let compiled = compile::compile(query);
        let (ctx, unbound, planned_at) = self.plan_at(project, &compiled, &ReadAt::Newest).await?;
        let outline =
            outline::outline(&unbound, &compiled).map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        let eligibility = Eligibility::decide(&outline);
        if let Some(reason) = eligibility.reason() {
            return Err(EngineError::InvalidQuery(reason.to_owned()));
        }
        let rollup = eligibility.rollup().cloned();
        let outputs: Option<Vec<String>> =
            outline.predicates.iter().map(|p| p.output_column.clone()).collect::<Option<_>>();
        let final_rows = match (&rollup, outputs) {
            (Some(r), Some(outputs)) if r.columns.is_empty() && !r.distinct.is_empty() => {
                let plan = outline::without_variable_predicates(unbound.clone(), &compiled)
                    .map_err(|e| EngineError::Internal(Box::new(e)))?;
                let outputs = serde_json::to_string(&outputs).expect("names serialize");
                Some((plan, HashMap::from([(FILTERED_OUTPUTS.to_owned(), outputs)])))
            }
            _ => None,
        };
        let (plan, metadata) = match &rollup {
            Some(rollup) => (
                rollup::stored_plan(&unbound, &compiled, rollup),
                HashMap::from([(ROLLUP_QUERY.to_owned(), query.to_json().to_string())]),
            ),
            None => (outline::without_variable_predicates(unbound, &compiled), HashMap::new()),
        };
        let plan = plan.map_err(|e| EngineError::Internal(Box::new(e)))?;
        let mut metadata = metadata;
        if rollup.is_none() {
            if let Some(order) = fold::kept_order(&plan) {
                metadata
                    .insert(ROWS_ORDER.to_owned(), serde_json::to_string(&order).expect("names serialize"));
            }
            if fold::distinct_rows(&plan) {
                metadata.insert(ROWS_DISTINCT.to_owned(), "true".to_owned());
            }
        }
        let fold = fold::fold_of(&plan, rollup.is_some(), Eligibility::final_rows_reason(&outline));
        Ok(StoredPlan { ctx, plan, rollup, metadata, fold, final_rows, planned_at })
    }

    /// The plan reading exactly the files its tables have now, and what it reads of them: `None` when one of
    /// them is not a table of files (an external source), or the plan runs on a cluster (whose executors list
    /// the files themselves), so that a fold cannot tell what the result holds.
    async fn pinned(
        &self,
        project: ProjectId,
        ctx: &SessionContext,
        mut plan: LogicalPlan,
    ) -> Result<(LogicalPlan, Option<fold::Covered>), EngineError> {
        if self.scheduler().is_some() {
            return Ok((plan, None));
        }
        let mut covered = fold::Covered::default();
        for (table, schema) in fold::scanned(&plan) {
            let Some(listed) = fold::listed(&self.storage, project, &table).await? else {
                return Ok((plan, None));
            };
            let source = fold::files_source(&self.storage, ctx, &listed.files, &schema);
            plan = fold::reading(plan, &table, &source).map_err(|e| EngineError::Internal(Box::new(e)))?;
            covered.tables.insert(table, fold::Read::of(&listed));
        }
        Ok((plan, Some(covered)))
    }

    async fn write_here(
        &self,
        project: ProjectId,
        query: &Query,
        prefix: &ObjectPath,
    ) -> Result<Stored, EngineError> {
        let StoredPlan { ctx, plan, rollup, metadata, fold, final_rows, .. } =
            self.stored_plan_of(project, query).await?;
        let changes_with_time = fold::changing_function(&plan).is_some();
        // A rollup of the keys alone stores the query's own groups, as its final rows would: only filtered
        // columns and DISTINCT values multiply them.
        let finer = rollup.as_ref().filter(|r| !r.columns.is_empty() || !r.distinct.is_empty());
        let limit = finer.map(|_| self.limits.rollup_rows);
        let (rows, covered) = match self.write_part(project, &ctx, plan, prefix, metadata, limit).await? {
            Written::Rows(rows, covered) => (rows, covered),
            Written::TooMany => match (final_rows, finer) {
                (Some((plan, metadata)), Some(rollup)) => {
                    // What was written of the rollup goes; the final rows are computed in its place.
                    self.storage.remove_prefix(prefix).await.map_err(unavailable)?;
                    let Written::Rows(rows, covered) =
                        self.write_part(project, &ctx, plan, prefix, metadata, None).await?
                    else {
                        return Err(EngineError::Internal("final rows are written without a limit".into()));
                    };
                    let reason = format!(
                        "the values of its DISTINCT aggregates, grouped by {}, are more than --max-rollup-rows \
                         ({}), so its final rows are stored",
                        rollup::grouping(rollup).join(", "),
                        self.limits.rollup_rows
                    );
                    let fold = Fold::FullRefreshOnly { reason: fold.reason().map_or(reason, str::to_owned) };
                    return Ok(Stored {
                        rows,
                        folded: None,
                        coverage: covered.map(|c| c.coverage()),
                        changes_with_time,
                        fold,
                    });
                }
                (_, rollup) => {
                    let grouping = rollup.map(rollup::grouping).unwrap_or_else(Vec::new);
                    return Err(EngineError::InvalidQuery(format!(
                        "The rollup would store more than {} rows, grouped by {}: too fine to be worth storing. \
                         Filter a timestamp with Date variables (stored by day), drop a filtered column's \
                         variable, or raise --max-rollup-rows.",
                        self.limits.rollup_rows,
                        grouping.join(", ")
                    )));
                }
            },
        };
        let fold = match covered {
            Some(_) => fold,
            None => Fold::FullRefreshOnly { reason: fold::UNCOVERED.into() },
        };
        Ok(Stored { rows, folded: None, coverage: covered.map(|c| c.coverage()), changes_with_time, fold })
    }

    /// Writes the rows of `plan` as the first part of a stored result at `prefix`, its files listed once (so
    /// that the result says exactly which rows it holds); stops at more than `limit` rows.
    async fn write_part(
        &self,
        project: ProjectId,
        ctx: &SessionContext,
        plan: LogicalPlan,
        prefix: &ObjectPath,
        metadata: HashMap<String, String>,
        limit: Option<u64>,
    ) -> Result<Written, EngineError> {
        let (plan, covered) = self.pinned(project, ctx, plan).await?;
        // Partitioned as a live run of the same tables is, so that it sums floats in the same order.
        self.partition_for(ctx, &plan);
        let frame = ctx.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
        // A refresh takes its turns on the cores as the project's runs do.
        let (mut stream, _held) = self.execute_fairly(project, frame).await?;
        let mut writer = ResultWriter::create(
            &self.storage,
            prefix.clone().join(fold::part_name(0)),
            stream.schema().as_ref(),
            metadata,
        )?;
        while let Some(batch) = stream.next().await {
            writer.write(&batch.map_err(execute::execution_error)?).await?;
            if limit.is_some_and(|limit| writer.rows > limit) {
                return Ok(Written::TooMany);
            }
        }
        // The one part it wrote.
        let covered = covered.map(|covered| fold::Covered { parts: Some(1), ..covered });
        Ok(Written::Rows(writer.finish().await?, covered))
    }

    /// Folds the rows appended since the stored result at `from` (of `rows` rows, holding `coverage` of its
    /// tables) into a new result at `to` (see [`crate::stored::fold`]): the old parts linked, and one part more with what
    /// the appended rows add.
    async fn fold_here(
        &self,
        project: ProjectId,
        query: &Query,
        (from, rows, coverage): (&ObjectPath, u64, &Coverage),
        to: &ObjectPath,
    ) -> Result<Stored, EngineError> {
        let refuse = |reason: String| {
            EngineError::InvalidQuery(format!("The stored result cannot follow the appended rows: {reason}."))
        };
        let mut covered = fold::Covered::of(coverage)?;
        let key = query.to_json().to_string();
        let kept = match self.fold_plans.kept(project, &key, &covered) {
            Some(kept) => {
                self.metrics.planned(true);
                kept
            }
            None => {
                let StoredPlan { plan, rollup, metadata, fold, planned_at, .. } =
                    self.stored_plan_of(project, query).await?;
                // Kept for the next fold only when planned at the versions the result read or later (a process
                // whose snapshot of a table lagged behind another's may have planned an older version, whose
                // columns this fold does not check).
                let reusable = planned_at.iter().all(|table| {
                    covered.tables.get(&table.table).and_then(|read| read.version.parse::<u64>().ok())
                        <= Some(table.version)
                });
                let (versions, physical) = (BTreeMap::new(), None);
                let rollup = rollup.is_some();
                Arc::new(FoldPlan { versions, plan, physical, rollup, metadata, fold, reusable })
            }
        };
        let (stored, metadata, fold) = (kept.plan.clone(), kept.metadata.clone(), &kept.fold);
        // Refused before anything else: with no rows appended, a fold would keep rows chosen at another time.
        if let Some(reason) = fold.reason() {
            return Err(refuse(reason.to_owned()));
        }
        let scanned = fold::scanned(&stored);
        if scanned.keys().any(|table| !covered.tables.contains_key(table)) {
            return Err(refuse("it reads a table the stored result did not".into()));
        }
        let (mut changed, mut unchanged) = (Vec::new(), Vec::new());
        for (table, schema) in scanned {
            let read = &covered.tables[&table];
            let (files, now) =
                fold::appended_since(&self.storage, project, &table, read).await?.map_err(refuse)?;
            // A table compacted since, without rows appended, holds the same rows in other files.
            if files.is_empty() {
                unchanged.push((table, schema, now));
            } else {
                changed.push((table, schema, files, now));
            }
        }
        // The earlier parts, as they are or (at the most a result has) merged into one.
        let parts = fold::parts_of(&self.storage, from, covered.parts).await?;
        let (parts, rows) = if parts.len() >= fold::MAX_PARTS {
            let stored = (&stored, kept.rollup);
            (1, self.compact_parts(project, from, to, stored, metadata.clone()).await?)
        } else {
            fold::copy_parts(&self.storage, &parts, to).await?;
            (parts.len(), rows)
        };
        for (table, _, now) in &unchanged {
            covered.tables.insert(table.clone(), fold::Read::of(now));
        }
        let Some((table, schema, files, now)) = changed.pop() else {
            covered.parts = Some(parts);
            self.fold_plans.keep((project, key), &kept, kept.physical.clone(), &covered);
            let coverage = Some(covered.coverage());
            let fold = Fold::Incremental;
            return Ok(Stored { rows, folded: Some(0), coverage, changes_with_time: false, fold });
        };
        if let Some((other, ..)) = changed.first() {
            return Err(refuse(format!("both `{table}` and `{other}` changed")));
        }
        let runtime = self.admission.runtime(&self.files)?;
        let (mut stream, _held, physical) = if unchanged.is_empty() && self.scheduler().is_none() {
            // The appended files are all it reads: its physical plan is kept, each fold binding its own files.
            let physical = match &kept.physical {
                Some(physical) => Arc::clone(physical),
                None => Arc::new(self.appended_plan(stored, (&table, &schema), Arc::clone(&runtime)).await?),
            };
            let hot = self.hot_here().map(|hot| (hot, HotTable { project, name: table.clone() }));
            let appended = catalog::appended(&self.storage, hot.as_ref(), &files, &schema);
            let (plan, task) = physical.bind(appended, runtime).map_err(execute::execution_error)?;
            let (stream, held) = self.execute_planned(project, plan, task).await?;
            (stream, held, Some(physical))
        } else {
            // Its sources are the plan's own: a session of one partition runs it, as the appended rows are few.
            let small = catalog::small_session(&self.storage, Some(runtime), self.scheduler())?;
            // The appended rows, joined with the other tables as the result read them (rows appended to one of
            // them from now on are the next fold's).
            let source = fold::files_source(&self.storage, &small, &files, &schema);
            let mut plan =
                fold::reading(stored, &table, &source).map_err(|e| EngineError::Internal(Box::new(e)))?;
            for (other, schema, listed) in unchanged {
                let source = fold::files_source(&self.storage, &small, &listed.files, &schema);
                plan =
                    fold::reading(plan, &other, &source).map_err(|e| EngineError::Internal(Box::new(e)))?;
            }
            let frame = small.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
            let (stream, held) = self.execute_fairly(project, frame).await?;
            (stream, held, None)
        };
        let path = to.clone().join(fold::part_name(parts));
        let mut writer =
            ResultWriter::create(&self.storage, path, stream.schema().as_ref(), metadata)?.after(rows);
        while let Some(batch) = stream.next().await {
            writer.write(&batch.map_err(execute::execution_error)?).await?;
        }
        let added = writer.finish().await?;
        covered.tables.insert(table, fold::Read::of(&now));
        covered.parts = Some(parts + 1);
        self.fold_plans.keep((project, key), &kept, physical, &covered);
        let coverage = Some(covered.coverage());
        let fold = Fold::Incremental;
        Ok(Stored { rows: rows + added, folded: Some(added), coverage, changes_with_time: false, fold })
    }

    /// The physical plan of a fold of `stored`, which reads `table` (of `schema`) only, over the appended files
    /// each execution binds: planned in a session of one partition, as the appended rows are few.
    async fn appended_plan(
        &self,
        stored: LogicalPlan,
        (table, schema): (&str, &Schema),
        runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    ) -> Result<KeptPlan, EngineError> {
        let small = catalog::small_session(&self.storage, Some(runtime), None)?;
        let files = catalog::appended_files(&self.storage, &small, Arc::new(schema.clone()));
        let source = provider_as_source(Arc::new(files));
        let plan = fold::reading(stored, table, &source).map_err(|e| EngineError::Internal(Box::new(e)))?;
        let frame = small.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
        KeptPlan::of(&small, frame).await.map_err(execute::execution_error)
    }

    /// Merges the parts of the stored result at `from` into the first part of the one at `to`, and returns the
    /// rows it holds: a rollup's partial rows merged per group, so that a run reads one row per group again; a
    /// result of rows in their order, positions kept. `stored` is the plan the result's parts hold, and whether
    /// it is a rollup's; the merged part has its types, as the parts folded after it do. A fold does it when a
    /// result has [`fold::MAX_PARTS`], instead of computing it again from its tables.
    async fn compact_parts(
        &self,
        project: ProjectId,
        from: &ObjectPath,
        to: &ObjectPath,
        (stored, aggregated): (&LogicalPlan, bool),
        metadata: HashMap<String, String>,
    ) -> Result<u64, EngineError> {
        let ctx = catalog::live_session(
            &self.storage,
            Some(self.admission.runtime(&self.files)?),
            self.scheduler(),
            self.limits.partitions,
        )?;
        let location = self.storage.url_of(from);
        let parts = ctx
            .read_parquet(location.as_str(), ParquetReadOptions::default())
            .await
            .map_err(execute::storage_error)?;
        let frame = if aggregated {
            let plan = rollup::merged(parts.into_unoptimized_plan(), stored)
                .map_err(|e| EngineError::Internal(Box::new(e)))?;
            ctx.execute_logical_plan(plan).await.map_err(execute::execution_error)?
        } else {
            let schema = parts.schema().as_arrow().clone();
            let position = ordinal(&schema, from.as_ref())?.name().clone();
            let order = fold::kept_order(stored).unwrap_or_else(Vec::new);
            // A DISTINCT's rows once each, at their first position.
            let parts = if fold::distinct_rows(stored) {
                let rows = stored.schema().fields().iter().map(|f| col(quoted(f.name()))).collect();
                let first = min(col(quoted(&position))).alias(&position);
                parts.aggregate(rows, vec![first]).map_err(execute::execution_error)?
            } else {
                parts
            };
            let outputs: Vec<Expr> = stored
                .schema()
                .fields()
                .iter()
                .map(|f| cast(col(quoted(f.name())), f.data_type().clone()).alias(f.name()))
                .collect();
            parts
                .sort(stored_order(&order, &position))
                .and_then(|sorted| sorted.select(outputs))
                .map_err(execute::execution_error)?
        };
        let (mut stream, _held) = self.execute_fairly(project, frame).await?;
        let path = to.clone().join(fold::part_name(0));
        let mut writer = ResultWriter::create(&self.storage, path, stream.schema().as_ref(), metadata)?;
        while let Some(batch) = stream.next().await {
            writer.write(&batch.map_err(execute::execution_error)?).await?;
        }
        writer.finish().await
    }

    /// A session and the plan of the page `offset..offset+limit` of the stored result at `location`
    /// (`prepared`): its rows that pass every filter in stored order, or for a rollup, those aggregated again.
    async fn stored_plan(
        &self,
        (location, prepared): (&str, &PreparedResult),
        filters: Vec<(MaterializedFilter, BoundValue)>,
    ) -> Result<(SessionContext, LogicalPlan), EngineError> {
        // Rows held in memory are few: one partition reads them. A file may hold millions: every core does.
        let runtime = Some(self.admission.runtime(&self.files)?);
        let ctx = match prepared.rows {
            Some(_) => catalog::small_session(&self.storage, runtime, self.scheduler())?,
            None => catalog::live_session(&self.storage, runtime, self.scheduler(), self.limits.partitions)?,
        };
        let filters = prepared.resolved(filters)?;
        if let Some(RolledUp { query, scan, .. }) = &prepared.rollup {
            let filters =
                filters.into_iter().map(|(filter, value)| (filter, execute::scalar(&value))).collect();
            let plan = rollup::read_plan(query, scan.clone(), filters)
                .map_err(|e| EngineError::Internal(Box::new(e)))?;
            return Ok((ctx, plan));
        }
        match &prepared.rows {
            Some(rows) => {
                ctx.register_table(TABLE, Arc::clone(rows) as Arc<dyn TableProvider>)
                    .map_err(|e| EngineError::Internal(Box::new(e)))?;
            }
            // Many rows: read from the files, declared in stored order (each part holds its rows in it) so that
            // reading in that order merges the parts instead of sorting them.
            None => {
                let position = ordinal(&prepared.schema, location)?.name();
                let order = stored_order(&prepared.order, position);
                let options = ParquetReadOptions::default().file_sort_order(vec![order]);
                ctx.register_parquet(TABLE, location, options).await.map_err(execute::storage_error)?;
            }
        }
        let stored = (&prepared.schema, prepared.order.as_slice(), prepared.distinct);
        let (compiled, values) = filtered(location, stored, filters)?;
        let plan = self.plan(&ctx, crate::parse(&ctx, &compiled)?, values).await?;
        Ok((ctx, plan))
    }

    /// The stored result at `prefix` prepared to answer runs (see [`Self::prepare`]), and its location's URL.
    async fn prepared_result(
        &self,
        project: ProjectId,
        prefix: &ObjectPath,
    ) -> Result<(String, Arc<PreparedResult>), EngineError> {
        let location = self.storage.url_of(prefix);
        let key = (project, location.clone());
        if let Some(prepared) = self.prepared.get(&key) {
            return Ok((location, prepared));
        }
        let ctx = catalog::small_session(
            &self.storage,
            Some(self.admission.runtime(&self.files)?),
            self.scheduler(),
        )?;
        // Read with its metadata, which says whether it is a rollup.
        let stored = ctx
            .read_parquet(location.as_str(), ParquetReadOptions::default().skip_metadata(false))
            .await
            .map_err(execute::storage_error)?;
        // Boxed: preparing nests DataFusion's futures deeper than the compiler sizes by default.
        let prepared = Arc::new(Box::pin(self.prepare(project, prefix, stored)).await?);
        self.prepared.insert(key, Arc::clone(&prepared));
        Ok((location, prepared))
    }

    /// A run's page of a stored result held in memory, by the read plan kept for its shape (made and kept at
    /// the first run of the shape); `None` when the result is not held in memory, or the plan of its shape is
    /// made per run.
    async fn read_kept(
        &self,
        project: ProjectId,
        (location, prepared): (&str, &Arc<PreparedResult>),
        filters: &[(MaterializedFilter, BoundValue)],
        (limit, offset): (u32, u64),
        started: std::time::Instant,
    ) -> Result<Option<QueryResult>, EngineError> {
        let Some(rows) = &prepared.rows else { return Ok(None) };
        let filters = prepared.resolved(filters.to_vec())?;
        let bound = filters
            .iter()
            .map(|(filter, _)| {
                let column = rollup::stored_name(&filter.column)?;
                Some(BoundFilter { column, op: rollup::operator(filter.op) })
            })
            .collect::<Option<Vec<_>>>();
        let Some(bound) = bound else { return Ok(None) };
        let shape = ReadShape { filters: bound, limit, offset };
        let kept = prepared.reads.lock().unwrap_or_else(PoisonError::into_inner).get(&shape).cloned();
        let kept = match kept {
            Some(kept) => {
                self.metrics.planned(kept.is_some());
                kept
            }
            None => {
                self.metrics.planned(false);
                let kept = self.kept_read(prepared, rows, location, &shape).await?.map(Arc::new);
                let added = {
                    let mut reads = prepared.reads.lock().unwrap_or_else(PoisonError::into_inner);
                    let room = reads.len() < KEPT_READS;
                    if room {
                        reads.insert(shape, kept.clone());
                    }
                    room
                };
                // Weighed again with the plan it now keeps.
                if added {
                    self.prepared.insert((project, location.to_owned()), Arc::clone(prepared));
                }
                kept
            }
        };
        let Some(kept) = kept else { return Ok(None) };
        let values = filters.iter().map(|(_, value)| execute::scalar(value)).collect();
        let (plan, task) = kept
            .planned
            .bind(bound::Bound(values), self.admission.runtime(&self.files)?)
            .map_err(execute::execution_error)?;
        let (stream, held) = self.execute_planned(project, plan, task).await?;
        let batches = execute::collect(stream).await?;
        let statistics = execute::statistics(&held.1, started.elapsed());
        execute::result(kept.columns.clone(), &batches, limit, self.limits.result_bytes, statistics).map(Some)
    }

    /// The physical plan of reads of `shape` from `rows` (a prepared result's, held in memory), whose filters'
    /// values each run binds; `None` when it reads more than the rows, or calls a function whose answer changes
    /// between runs, and is made per run.
    async fn kept_read(
        &self,
        prepared: &PreparedResult,
        rows: &Arc<MemTable>,
        location: &str,
        shape: &ReadShape,
    ) -> Result<Option<KeptRead>, EngineError> {
        let ctx = catalog::small_session(&self.storage, None, self.scheduler())?;
        let internal = |e: datafusion::error::DataFusionError| EngineError::Internal(Box::new(e));
        let source = Arc::new(BoundRows::new(Arc::clone(rows), &shape.filters).map_err(internal)?);
        let plan = match &prepared.rollup {
            Some(RolledUp { query, .. }) => {
                let scan = LogicalPlanBuilder::scan(TABLE, provider_as_source(source), None)
                    .and_then(LogicalPlanBuilder::build)
                    .map_err(internal)?;
                rollup::read_plan(query, scan, Vec::new()).map_err(internal)?
            }
            None => {
                ctx.register_table(TABLE, source).map_err(internal)?;
                let stored = (&prepared.schema, prepared.order.as_slice(), prepared.distinct);
                let (compiled, values) = filtered(location, stored, Vec::new())?;
                self.plan(&ctx, crate::parse(&ctx, &compiled)?, values).await?
            }
        };
        if crate::tables_read(&plan) != [TABLE] || fold::changing_function(&plan).is_some() {
            return Ok(None);
        }
        let columns = types::columns(plan.schema().as_arrow());
        let plan = execute::window(plan, shape.limit, shape.offset)?;
        let frame = ctx.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
        let planned = KeptPlan::of(&ctx, frame).await.map_err(execute::execution_error)?;
        Ok(Some(KeptRead { planned, columns }))
    }

    /// A stored result prepared to answer runs: for a rollup, the query it rolls up (held in the file's
    /// metadata) planned in a session of its tables; and the stored rows, decoded, when there are at most
    /// `stored_rows_in_memory` (as the file's statistics count them) and queries run in this process.
    async fn prepare(
        &self,
        project: ProjectId,
        prefix: &ObjectPath,
        stored: DataFrame,
    ) -> Result<PreparedResult, EngineError> {
        let schema = stored.schema().as_arrow().clone();
        let query = match schema.metadata().get(ROLLUP_QUERY) {
            Some(document) => Some(self.rolled_up(project, document).await?),
            None => None,
        };
        let filtered_outputs = match schema.metadata().get(FILTERED_OUTPUTS) {
            Some(names) => Some(serde_json::from_str(names).map_err(|e| {
                EngineError::Internal(format!("a stored result's filtered outputs do not read: {e}").into())
            })?),
            None => None,
        };
        let order: Vec<fold::OrderedBy> = match schema.metadata().get(ROWS_ORDER) {
            Some(order) => serde_json::from_str(order).map_err(|e| {
                EngineError::Internal(format!("a stored result's order does not read: {e}").into())
            })?,
            None => Vec::new(),
        };
        // A DISTINCT's rows repeat only across parts: one part (a refresh's, or parts merged) holds each once, and
        // its runs group nothing.
        let distinct = schema.metadata().contains_key(ROWS_DISTINCT)
            && fold::parts(&self.storage, prefix).await?.len() > 1;
        let in_memory = self.scheduler().is_none()
            && stored.clone().count().await.map_err(execute::execution_error)?
                <= self.limits.stored_rows_in_memory;
        if !in_memory {
            let scan = stored.into_unoptimized_plan();
            let rollup = query.map(|(query, filters)| RolledUp { query, scan, filters });
            return Ok(PreparedResult {
                rollup,
                filtered_outputs,
                order,
                distinct,
                rows: None,
                schema,
                bytes: PLAN_BYTES,
                reads: Mutex::default(),
            });
        }
        let sorted = stored_order(&order, ordinal(&schema, "a stored result")?.name());
        let batches = stored
            .sort(sorted.clone())
            .map_err(execute::execution_error)?
            .collect()
            .await
            .map_err(execute::execution_error)?;
        let bytes = PLAN_BYTES + batches.iter().map(RecordBatch::get_array_memory_size).sum::<usize>();
        let rows = MemTable::try_new(Arc::new(schema.clone()), vec![batches])
            .map_err(|e| EngineError::Internal(Box::new(e)))?
            .with_sort_order(vec![sorted]);
        let rows = Arc::new(rows);
        let rollup = match query {
            Some((query, filters)) => {
                let source = provider_as_source(Arc::clone(&rows) as Arc<dyn TableProvider>);
                let scan = LogicalPlanBuilder::scan(TABLE, source, None)
                    .and_then(LogicalPlanBuilder::build)
                    .map_err(|e| EngineError::Internal(Box::new(e)))?;
                Some(RolledUp { query, scan, filters })
            }
            None => None,
        };
        Ok(PreparedResult {
            rollup,
            filtered_outputs,
            order,
            distinct,
            rows: Some(rows),
            schema,
            bytes,
            reads: Mutex::default(),
        })
    }

    /// The unbound plan of the query a rollup rolls up (`document`, its JSON), in a session of its tables.
    async fn rolled_up(
        &self,
        project: ProjectId,
        document: &str,
    ) -> Result<(LogicalPlan, Vec<MaterializedFilter>), EngineError> {
        let corrupt =
            |e: String| EngineError::Internal(format!("a rollup's query does not read: {e}").into());
        let document: serde_json::Value =
            serde_json::from_str(document).map_err(|e| corrupt(e.to_string()))?;
        let query = Query::try_from(&document).map_err(|e| corrupt(e.to_string()))?;
        let compiled = compile::compile(&query);
        let plan = self.live_plan(project, &compiled).await?.1;
        let outline = outline::outline(&plan, &compiled).map_err(|e| corrupt(message(&e)))?;
        let filters = Eligibility::decide(&outline).filters().map(<[_]>::to_vec).unwrap_or_else(Vec::new);
        Ok((plan, filters))
    }
}

/// The position column of a stored result: its last.
fn ordinal<'a>(schema: &'a Schema, location: &str) -> Result<&'a Field, EngineError> {
    schema
        .fields()
        .last()
        .map(AsRef::as_ref)
        .ok_or_else(|| EngineError::Internal(format!("stored result at {location} has no columns").into()))
}

/// The query of a stored result's rows (registered as `TABLE`) that pass every filter, in stored order (the
/// ORDER BY the rows keep, then their position; a DISTINCT's rows once each, at their first position), with the
/// filters' values. `stored` is the result's schema, the ORDER BY it keeps, and whether it is a DISTINCT's.
fn filtered(
    location: &str,
    (schema, order, distinct): (&Schema, &[fold::OrderedBy], bool),
    filters: Vec<(MaterializedFilter, BoundValue)>,
) -> Result<(Compiled, Vec<ScalarValue>), EngineError> {
    let (ordinal, output) = schema
        .fields()
        .split_last()
        .ok_or_else(|| EngineError::Internal(format!("stored result at {location} has no columns").into()))?;
    let mut params = Vec::with_capacity(filters.len());
    let mut conditions = Vec::with_capacity(filters.len());
    let mut values = Vec::with_capacity(filters.len());
    for (i, (filter, value)) in filters.into_iter().enumerate() {
        let StoredColumn::Output(column) = &filter.column else {
            return Err(EngineError::Internal(
                format!("stored result at {location} is a query's rows; a filter names a rollup's column")
                    .into(),
            ));
        };
        let ty = variable_type(&value);
        conditions.push(format!(
            "{} {} CAST(${} AS {})",
            quoted(column),
            filter.op.as_sql(),
            i + 1,
            compile::sql_type(ty)
        ));
        values.push(execute::scalar(&value));
        params.push((filter.variable, ty));
    }
    let columns = output.iter().map(|f| quoted(f.name())).collect::<Vec<_>>().join(", ");
    let mut rows = TABLE.to_owned();
    if !conditions.is_empty() {
        rows.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
    }
    let position = quoted(ordinal.name());
    if distinct {
        rows = format!(
            "(SELECT {columns}, min({position}) AS {position} FROM {rows} GROUP BY {columns}) AS {TABLE}"
        );
    }
    // Rows read as they are are declared in that order, so reading in it needs no sort.
    let order = stored_order_sql(order, ordinal.name());
    let sql = format!("SELECT {columns} FROM {rows} ORDER BY {order}");
    Ok((Compiled { sql, params }, values))
}

impl DataFusionEngine {
    async fn read_here(
        &self,
        project: ProjectId,
        prefix: &ObjectPath,
        filters: Vec<(MaterializedFilter, BoundValue)>,
        limit: u32,
        offset: u64,
    ) -> Result<QueryResult, EngineError> {
        let started = std::time::Instant::now();
        let (location, prepared) = self.prepared_result(project, prefix).await?;
        let stored = (location.as_str(), &prepared);
        if let Some(result) = self.read_kept(project, stored, &filters, (limit, offset), started).await? {
            return Ok(result);
        }
        let (ctx, plan) = self.stored_plan((&location, &prepared), filters).await?;
        self.run_plan(project, &ctx, plan, limit, offset, started).await
    }

    async fn export_stored(
        &self,
        project: ProjectId,
        prefix: &ObjectPath,
        filters: Vec<(MaterializedFilter, BoundValue)>,
        limit: u32,
        offset: u64,
        format: ResultFormat,
    ) -> Result<Export, EngineError> {
        let (location, prepared) = self.prepared_result(project, prefix).await?;
        let (ctx, plan) = self.stored_plan((&location, &prepared), filters).await?;
        self.write_plan(project, &ctx, plan, limit, offset, format).await
    }
}

#[async_trait]
impl ResultStorage for DataFusionEngine {
    #[instrument(skip_all, fields(project = %project, location))]
    async fn write(&self, project: ProjectId, query: &Query, location: &str) -> Result<Stored, EngineError> {
        compile::check_text(&query.sql)?;
        let prefix = resolve(project, location)?;
        let (engine, query, target) = (self.clone(), query.clone(), prefix.clone());
        let limit = self.limits.refresh_timeout;
        // A refresh takes no slot of its project: with its runs' slots, the project's own refreshes would answer its
        // runs 429 (measured: a demo project's first refreshes made a single client's runs 429).
        let work = self.runtime.run(async move { engine.write_here(project, &query, &target).await });
        let written = tokio::time::timeout(limit, work).await.unwrap_or(Err(EngineError::Timeout(limit)));
        if written.is_err() {
            // The write's own error is the one to report; a leftover is the sweep's to remove.
            if let Err(err) = self.storage.remove_prefix(&prefix).await {
                tracing::warn!(location, error = %err, "cannot remove a failed materialization's files");
            }
        }
        written
    }

    #[instrument(skip_all, fields(project = %project, from = %from.location, to))]
    async fn fold(
        &self,
        project: ProjectId,
        query: &Query,
        from: &StoredResult,
        to: &str,
    ) -> Result<Stored, EngineError> {
        compile::check_text(&query.sql)?;
        // What the refresh that wrote it found (final rows stored in place of a rollup among it).
        if let Some(reason) = from.fold.as_ref().and_then(Fold::reason) {
            return Err(EngineError::InvalidQuery(format!(
                "The stored result cannot follow the appended rows: {reason}."
            )));
        }
        let Some(coverage) = from.coverage.clone() else {
            return Err(EngineError::InvalidQuery("the stored result does not say what it holds".into()));
        };
        let (source, target) = (resolve(project, &from.location)?, resolve(project, to)?);
        let (engine, query, into, rows) = (self.clone(), query.clone(), target.clone(), from.row_count);
        let limit = self.limits.refresh_timeout;
        let work = self
            .runtime
            .run(async move { engine.fold_here(project, &query, (&source, rows, &coverage), &into).await });
        let folded = tokio::time::timeout(limit, work).await.unwrap_or(Err(EngineError::Timeout(limit)));
        if folded.is_err() {
            if let Err(err) = self.storage.remove_prefix(&target).await {
                tracing::warn!(location = to, error = %err, "cannot remove a failed fold's files");
            }
        }
        folded
    }

    #[instrument(skip_all, fields(project = %project, location, limit, offset))]
    async fn read(
        &self,
        project: ProjectId,
        location: &str,
        filters: Vec<(MaterializedFilter, BoundValue)>,
        limit: u32,
        offset: u64,
    ) -> Result<QueryResult, EngineError> {
        let prefix = resolve(project, location)?;
        self.in_slot(project, move |engine| async move {
            engine.read_here(project, &prefix, filters, limit, offset).await
        })
        .await
        .map(|(result, _slot)| result)
    }

    #[instrument(skip_all, fields(project = %project, location, limit, offset))]
    async fn export(
        &self,
        project: ProjectId,
        location: &str,
        filters: Vec<(MaterializedFilter, BoundValue)>,
        limit: u32,
        offset: u64,
        format: ResultFormat,
    ) -> Result<Export, EngineError> {
        let prefix = resolve(project, location)?;
        self.in_slot(project, move |engine| async move {
            engine.export_stored(project, &prefix, filters, limit, offset, format).await
        })
        .await
        .and_then(|(export, slot)| self.spooled(project, export, slot))
    }

    #[instrument(skip_all, fields(project = %project, location))]
    async fn remove(&self, project: ProjectId, location: &str) -> Result<(), EngineError> {
        let prefix = resolve(project, location)?;
        self.storage.remove_prefix(&prefix).await.map_err(unavailable)
    }

    #[instrument(skip_all)]
    async fn locations(&self) -> Result<Vec<(ProjectId, String)>, EngineError> {
        let mut found = Vec::new();
        for project in self.storage.children(&ObjectPath::from("projects")).await.map_err(unavailable)? {
            let Some(project) = project.parse::<i64>().ok().and_then(|p| ProjectId::new(p).ok()) else {
                continue;
            };
            let endpoints = materializations_prefix(project);
            for endpoint in self.storage.children(&endpoints).await.map_err(unavailable)? {
                for attempt in self
                    .storage
                    .children(&endpoints.clone().join(endpoint.as_str()))
                    .await
                    .map_err(unavailable)?
                {
                    found.push((project, format!("{endpoint}/{attempt}")));
                }
            }
        }
        Ok(found)
    }
}
