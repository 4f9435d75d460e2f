//! The query engine adapter: the domain's `QueryEngine` port on Apache DataFusion, embedded in the process.
//!
//! Each project gets a catalog of its own holding only its tables, which are Parquet files under
//! `projects/{id}/tables/{table}/` in the storage: the data directory by default, or an S3-compatible bucket. Only a single read-only statement is ever planned: no DDL, DML,
//! `COPY`, `SET`, external tables or URL tables, so a query can read its project's tables and nothing else.
//! Variables are compiled to engine placeholders and bound as typed values, never pasted into SQL text.
//! This crate knows nothing of HTTP or of the store.

mod admission;
mod compile;
#[cfg(feature = "ballista")]
pub mod distributed;
mod execute;
mod export;
mod fair;
mod float_order;
mod hot_tables;
mod memory;
mod messages;
mod metrics;
mod plans;
mod progress;
mod rewrites;
mod run_log;
mod runtime;
mod session;
mod snapshot_scan;
mod storage;
mod stored;
pub mod tables;
mod types;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SQLOptions;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use domain::{EngineError, Export, ProjectId, Query, QueryDescription, QueryEngine, ReadAt, ResultFormat};
use tracing::instrument;

use crate::stored::{materialized, outline};
use crate::tables::{appends, catalog, compaction, files, upgrade};

pub use catalog::TableFiles;
pub use execute::EngineLimits;
pub use metrics::EngineMetrics;
pub use run_log::{LogSettings, ParquetRunLog, GRACE as LOG_MERGE_GRACE, LOGS_TABLE};
pub use storage::{Storage, StorageError};
pub use upgrade::TablesUpgraded;

/// DataFusion behind the `QueryEngine` port.
#[derive(Debug, Clone)]
pub struct DataFusionEngine {
    storage: Storage,
    /// The gRPC address of the Ballista scheduler queries run on; `None`: in this process.
    scheduler: Option<Arc<str>>,
    limits: EngineLimits,
    /// What queries take from the process, and who is refused.
    admission: Arc<admission::Admission>,
    runtime: Arc<runtime::EngineRuntime>,
    metrics: EngineMetrics,
    table_locks: Arc<files::TableLocks>,
    /// Appends of small bodies, written together per table (see `appends`).
    appends: Arc<appends::Appends>,
    /// The tables this process appended to, for compaction.
    appended: Arc<compaction::Appended>,
    /// The rows of table files whose footers were read, for describing tables.
    file_rows: files::FileRows,
    /// Stored results prepared to answer runs (see `materialized`).
    prepared: materialized::PreparedResults,
    /// The footers and statistics of the files queries read, shared by every query's runtime.
    files: execute::FileCaches,
    /// Table files kept decoded for runs (`limits.hot_tables`); `None` when none are.
    hot: Option<Arc<hot_tables::HotTables>>,
    /// Live queries' plans before their variables are bound, kept between runs.
    plans: plans::Plans,
    /// The plans folds ran, kept for the next fold of the same query.
    fold_plans: materialized::FoldPlans,
    /// How far back `_logs` reads.
    log_retention: std::time::Duration,
}

/// The engine's error text for a person: no backtrace, no internal prefix noise.
pub(crate) fn message(err: &DataFusionError) -> String {
    messages::readable(&err.strip_backtrace())
}

impl DataFusionEngine {
    /// An engine over the tables under `projects/` in `storage`, with the default limits.
    pub fn new(storage: Storage) -> Self {
        let limits = EngineLimits::default();
        Self {
            storage,
            scheduler: None,
            admission: Arc::new(admission::Admission::new(&limits)),
            limits,
            runtime: Arc::new(runtime::EngineRuntime::new()),
            metrics: EngineMetrics::default(),
            table_locks: Arc::default(),
            appends: Arc::default(),
            appended: Arc::default(),
            file_rows: files::file_rows(),
            prepared: materialized::prepared_results(),
            files: execute::FileCaches::new(),
            hot: hot_tables::HotTables::new(EngineLimits::default().hot_tables),
            plans: plans::Plans::new(),
            fold_plans: materialized::FoldPlans::new(),
            log_retention: LogSettings::default().retention,
        }
    }

    /// The run log of every project in the engine's storage, its reads (logs and usage) running on the
    /// engine's threads as queries do.
    pub fn run_log(&self, settings: LogSettings) -> ParquetRunLog {
        ParquetRunLog::read_by(self.clone(), settings)
    }

    /// A session for reading the run log: its memory bounded as a query's, its files' footers in the
    /// engine's footer cache (see [`execute::FileCaches::footers_only`]).
    pub(crate) fn log_session(&self) -> Result<datafusion::prelude::SessionContext, EngineError> {
        let runtime = self.admission.runtime(&self.files.footers_only())?;
        catalog::empty_session(&self.storage, Some(runtime), None)
    }

    /// The same engine, its queries' `_logs` reading records within `retention` (as the run log keeps them).
    #[must_use]
    pub fn with_log_retention(mut self, retention: std::time::Duration) -> Self {
        self.log_retention = retention;
        self
    }

    /// The same engine, its live queries running under `limits`.
    #[must_use]
    pub fn with_limits(mut self, limits: EngineLimits) -> Self {
        self.admission = Arc::new(admission::Admission::new(&limits));
        self.hot = hot_tables::HotTables::new(limits.hot_tables);
        self.limits = limits;
        self
    }

    /// The engine's metrics, to register for `/metrics`.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Exposes the engine's metrics and its tables' in `registry`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
        self.storage.tables().register_metrics(registry);
        if let Some(hot) = &self.hot {
            hot.register_metrics(registry);
        }
    }

    /// The same engine, running queries on the Ballista cluster whose scheduler `url` names
    /// (`ballista://HOST:PORT`); planning stays in this process.
    ///
    /// # Errors
    /// A message when the URL names no scheduler.
    #[cfg(feature = "ballista")]
    pub fn on_ballista(mut self, url: &str) -> Result<Self, String> {
        self.scheduler = Some(distributed::scheduler_address(url)?.into());
        Ok(self)
    }

    fn scheduler(&self) -> Option<&str> {
        self.scheduler.as_deref()
    }

    /// Where queries run, for people: `embedded`, or the scheduler's address.
    pub fn engine(&self) -> &str {
        self.scheduler().unwrap_or("embedded")
    }

    /// The storage of its tables and stored results.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Whether the engine can run a query (on its own threads, or on its Ballista cluster) and its storage
    /// answers (for readiness).
    ///
    /// # Errors
    /// [`EngineError::Unavailable`] when the storage is missing or unreachable, or the engine's threads do not
    /// answer.
    pub async fn ping(&self) -> Result<(), EngineError> {
        self.storage.ping().await?;
        // On Ballista this runs a (tiny) job on the cluster: readiness means queries can run.
        let ctx = catalog::empty_session(&self.storage, None, self.scheduler())?;
        self.runtime
            .run(async move {
                let frame = ctx.sql("SELECT 1").await.map_err(|e| EngineError::Unavailable(Box::new(e)))?;
                frame.collect().await.map_err(|e| EngineError::Unavailable(Box::new(e)))?;
                Ok(())
            })
            .await
    }

    /// The tables a project can query, by name, with their sizes.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the storage cannot be read.
    pub async fn tables(&self, project: ProjectId) -> Result<Vec<TableFiles>, EngineError> {
        catalog::describe_tables(&self.storage, project).await
    }

    /// Converts every table an earlier release wrote into a Delta table, in place (`migrate`; see `upgrade`).
    ///
    /// # Errors
    /// `Unavailable` when the storage cannot be read or written; `Internal` for a table whose pointer names
    /// nothing.
    pub async fn upgrade_tables(&self) -> Result<TablesUpgraded, EngineError> {
        let storage = self.storage.clone();
        self.runtime.run(async move { upgrade::upgrade(&storage).await }).await
    }

    /// Plans a parsed statement in `ctx`, `values` bound to its parameters.
    async fn plan(
        &self,
        ctx: &datafusion::prelude::SessionContext,
        statement: DfStatement,
        values: Vec<datafusion::scalar::ScalarValue>,
    ) -> Result<datafusion::logical_expr::LogicalPlan, EngineError> {
        bind(self.plan_unbound(ctx, statement).await?, values)
    }

    /// Plans a parsed statement in `ctx`, leaving its parameters unbound.
    async fn plan_unbound(
        &self,
        ctx: &datafusion::prelude::SessionContext,
        statement: DfStatement,
    ) -> Result<datafusion::logical_expr::LogicalPlan, EngineError> {
        let plan = session::plan(ctx, statement).await.map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        Ok(plan)
    }
}

/// `plan` with its placeholders bound to `values`, and each `column IN {variables.LIST}` made an `IN` list of the
/// bound values (see [`inline_lists`]).
fn bind(
    plan: datafusion::logical_expr::LogicalPlan,
    values: Vec<datafusion::scalar::ScalarValue>,
) -> Result<datafusion::logical_expr::LogicalPlan, EngineError> {
    let bound = plan.with_param_values(values).map_err(|e| EngineError::InvalidQuery(message(&e)))?;
    inline_lists(bound).map_err(|e| EngineError::InvalidQuery(message(&e)))
}

/// A `List` variable is written `column IN (SELECT UNNEST(CAST($n AS VARCHAR[])))` (see `compile`): a subquery
/// that the optimizer would turn into a semi join, whose build side may be the whole table. Once the values are
/// bound, each such subquery becomes an `IN` list of them: a hash set probed per row, which also prunes files
/// and row groups by their statistics, as the same query with the values written in its SQL does.
pub(crate) fn inline_lists(
    plan: datafusion::logical_expr::LogicalPlan,
) -> datafusion::error::Result<datafusion::logical_expr::LogicalPlan> {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    use datafusion::logical_expr::expr::{InList, InSubquery};
    use datafusion::logical_expr::Expr;
    let inlined = plan.transform_up_with_subqueries(|node| {
        node.map_expressions(|expr| {
            expr.transform_up(|expr| match expr {
                Expr::InSubquery(InSubquery { expr, subquery, negated }) => {
                    match listed_values(&subquery.subquery) {
                        Some(list) => Ok(Transformed::yes(Expr::InList(InList::new(expr, list, negated)))),
                        None => Ok(Transformed::no(Expr::InSubquery(InSubquery { expr, subquery, negated }))),
                    }
                }
                other => Ok(Transformed::no(other)),
            })
        })
    })?;
    Ok(inlined.data)
}

/// The bound values of a `List` variable, when `subquery` is exactly the unnest `compile` writes for one
/// (`Projection <- Unnest <- Projection(the bound list) <- one empty row`); `None` for any other subquery.
fn listed_values(
    subquery: &datafusion::logical_expr::LogicalPlan,
) -> Option<Vec<datafusion::logical_expr::Expr>> {
    use datafusion::arrow::array::Array;
    use datafusion::logical_expr::{Expr, LogicalPlan};
    let LogicalPlan::Projection(outer) = subquery else { return None };
    let LogicalPlan::Unnest(unnest) = outer.input.as_ref() else { return None };
    let LogicalPlan::Projection(inner) = unnest.input.as_ref() else { return None };
    let LogicalPlan::EmptyRelation(empty) = inner.input.as_ref() else { return None };
    if !empty.produce_one_row || inner.expr.len() != 1 || outer.expr.len() != 1 {
        return None;
    }
    let mut value = &inner.expr[0];
    loop {
        match value {
            Expr::Alias(alias) => value = &alias.expr,
            Expr::Cast(cast) => value = &cast.expr,
            _ => break,
        }
    }
    let Expr::Literal(datafusion::scalar::ScalarValue::List(array), _) = value else { return None };
    if array.len() != 1 || array.is_null(0) {
        return None;
    }
    let values = array.value(0);
    (0..values.len())
        .map(|i| {
            datafusion::scalar::ScalarValue::try_from_array(&values, i).ok().map(|v| Expr::Literal(v, None))
        })
        .collect()
}

/// Parses compiled SQL with `ctx`'s settings: one read-only statement (SELECT, WITH ... SELECT or VALUES). Once
/// per run: the same statement names the tables to register and is planned.
fn parse(
    ctx: &datafusion::prelude::SessionContext,
    compiled: &compile::Compiled,
) -> Result<DfStatement, EngineError> {
    // Read through the lock: a copy of the session's state costs more than the parse.
    let state = ctx.state_ref();
    let state = state.read();
    let dialect = state.config().options().sql_parser.dialect;
    let statement = state
        .sql_to_statement(&compiled.sql, &dialect)
        .map_err(|e| EngineError::InvalidQuery(message(&e)))?;
    match &statement {
        DfStatement::Statement(inner) if matches!(**inner, SqlStatement::Query(_)) => {
            compile::check_depth(inner)?;
            Ok(statement)
        }
        _ => Err(EngineError::InvalidQuery(
            "Only a single read-only SELECT (or WITH ... SELECT, or VALUES) statement is allowed.".into(),
        )),
    }
}

impl DataFusionEngine {
    /// Bounds planning as well as execution by the query timeout; the work is aborted when it passes.
    async fn within_time<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, EngineError>>,
    ) -> Result<T, EngineError> {
        tokio::time::timeout(self.limits.query_timeout, work)
            .await
            .unwrap_or(Err(EngineError::Timeout(self.limits.query_timeout)))
    }

    /// Runs live work of `project` (whose SQL is `sql`): counted in the metrics, in one of the project's query
    /// slots (429 when none is free), on the engine's threads, within the query timeout.
    async fn live<T, F>(
        &self,
        project: ProjectId,
        sql: &str,
        work: impl FnOnce(Self) -> F,
    ) -> Result<(T, admission::Slot), EngineError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        let started = std::time::Instant::now();
        let _running = self.metrics.running();
        let result = async {
            compile::check_text(sql)?;
            self.in_slot(project, work).await
        }
        .await;
        self.metrics.finished(&result, started.elapsed());
        result
    }

    /// Runs work of `project` in one of its query slots (429 when none is free), on the engine's threads, within
    /// the query timeout; returns its result with the slot, which the caller holds as long as the result needs
    /// the engine (an export's body, until it is sent).
    async fn in_slot<T, F>(
        &self,
        project: ProjectId,
        work: impl FnOnce(Self) -> F,
    ) -> Result<(T, admission::Slot), EngineError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        let slot = self.admission.enter(project)?;
        let work = work(self.clone());
        let done = self.within_time(self.runtime.run(work)).await?;
        Ok((done, slot))
    }

    /// Runs the service's own work of `project` as [`DataFusionEngine::in_slot`] does, but waits for one of the
    /// project's slots instead of being refused; the wait counts in the query timeout.
    async fn in_queued_slot<T, F>(
        &self,
        project: ProjectId,
        work: impl FnOnce(Self) -> F,
    ) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        self.within_time(async {
            let _slot = self.admission.queue(project).await?;
            self.runtime.run(work(self.clone())).await
        })
        .await
    }

    async fn describe_here(
        &self,
        project: ProjectId,
        query: &Query,
    ) -> Result<QueryDescription, EngineError> {
        let compiled = compile::compile(query);
        let (ctx, statement) = self.session(project, &compiled).await?;
        let unbound = self.plan_unbound(&ctx, statement).await?;
        let outline =
            outline::outline(&unbound, &compiled).map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        let tables = tables_read(&unbound);
        let plan = unbound
            .with_param_values(compiled.sample_values())
            .map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        let columns = types::columns(plan.schema().as_arrow());
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = columns.iter().find(|c| !seen.insert(c.name.as_str())) {
            return Err(EngineError::InvalidQuery(format!(
                "The output column name '{}' appears more than once; give each column a distinct alias.",
                dup.name
            )));
        }
        Ok(QueryDescription { columns, outline, tables })
    }

    async fn execute_here(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, domain::BoundValue>,
        limit: u32,
        offset: u64,
        at: &ReadAt,
    ) -> Result<domain::QueryResult, EngineError> {
        let compiled = compile::compile(query);
        let values = execute::parameter_values(&compiled, variables)?;
        let started = std::time::Instant::now();
        let (ctx, unbound, read) = self.plan_at(project, &compiled, at).await?;
        let mut result = self.run_plan(project, &ctx, bind(unbound, values)?, limit, offset, started).await?;
        result.read = read;
        Ok(result)
    }

    /// A session for running `compiled` live over the newest version of each table, and its plan before its
    /// variables are bound (see [`Self::plan_at`]).
    async fn live_plan(
        &self,
        project: ProjectId,
        compiled: &compile::Compiled,
    ) -> Result<(datafusion::prelude::SessionContext, datafusion::logical_expr::LogicalPlan), EngineError>
    {
        self.plan_at(project, compiled, &ReadAt::Newest).await.map(|(ctx, plan, _)| (ctx, plan))
    }

    /// A session for running `compiled` live (under the engine's memory limit, here or on the cluster) over the
    /// versions of its tables `at` says, its plan before its variables are bound, and the versions it reads.
    /// A plan of the newest versions is kept from an earlier run while the tables it names are where they were
    /// ([`plans`]), else planned in the session, which then sees those tables.
    async fn plan_at(
        &self,
        project: ProjectId,
        compiled: &compile::Compiled,
        at: &ReadAt,
    ) -> Result<
        (
            datafusion::prelude::SessionContext,
            datafusion::logical_expr::LogicalPlan,
            Vec<domain::TableVersion>,
        ),
        EngineError,
    > {
        let runtime = Some(self.admission.runtime(&self.files)?);
        let ctx = catalog::live_session(&self.storage, runtime, self.scheduler(), self.limits.partitions)?;
        // A cluster's session plans for its scheduler: its plans are not kept; nor are plans of earlier versions.
        let keeps = self.scheduler().is_none() && at.is_newest();
        if keeps {
            if let Some((plan, read)) = self.plans.current(&self.storage, project, &compiled.sql).await? {
                self.metrics.planned(true);
                return Ok((ctx, plan, read));
            }
        }
        let statement = parse(&ctx, compiled)?;
        let tables = self.register_named(&ctx, project, &statement, at).await?;
        let plan = self.plan_unbound(&ctx, statement).await?;
        let read = catalog::versions_read(&tables);
        // A plan of the run log reads the files it had when planned: planned again each time.
        if keeps && !ctx.table_exist(run_log::LOGS_TABLE).unwrap_or(true) {
            self.metrics.planned(false);
            self.plans.keep(project, &compiled.sql, tables, &plan);
        }
        Ok((ctx, plan, read))
    }

    /// A session that sees the project's tables `compiled` names, and its parsed statement.
    async fn session(
        &self,
        project: ProjectId,
        compiled: &compile::Compiled,
    ) -> Result<(datafusion::prelude::SessionContext, DfStatement), EngineError> {
        let ctx = catalog::live_session(&self.storage, None, self.scheduler(), self.limits.partitions)?;
        let statement = parse(&ctx, compiled)?;
        self.register_named(&ctx, project, &statement, &ReadAt::Newest).await?;
        Ok((ctx, statement))
    }

    /// The tables kept decoded, when this process's runs read them (a cluster's executors read the files
    /// themselves).
    pub(crate) fn hot_here(&self) -> Option<Arc<hot_tables::HotTables>> {
        self.hot.clone().filter(|_| self.scheduler.is_none())
    }

    /// Registers the tables `statement` names in `ctx` (`catalog::register_named`), and the project's run log
    /// when it names `_logs` and no table of the project has that name (one written before the run log took it
    /// stays that project's `_logs`).
    async fn register_named(
        &self,
        ctx: &datafusion::prelude::SessionContext,
        project: ProjectId,
        statement: &DfStatement,
        at: &ReadAt,
    ) -> Result<catalog::Named, EngineError> {
        let hot = self.hot_here();
        let tables =
            catalog::register_named(&self.storage, ctx, (project, hot.as_ref()), statement, at).await?;
        if tables.iter().any(|(name, current)| current.is_none() && name == run_log::LOGS_TABLE) {
            run_log::register(&self.storage, ctx, project, self.log_retention).await?;
        }
        Ok(tables)
    }

    /// Runs a planned query for the page `offset..offset+limit` of its rows; `started` is when its planning
    /// began, for the statistics.
    async fn run_plan(
        &self,
        project: ProjectId,
        ctx: &datafusion::prelude::SessionContext,
        plan: datafusion::logical_expr::LogicalPlan,
        limit: u32,
        offset: u64,
        started: std::time::Instant,
    ) -> Result<domain::QueryResult, EngineError> {
        let columns = types::columns(plan.schema().as_arrow());
        let plan = execute::window(plan, limit, offset)?;
        self.partition_for(ctx, &plan);
        let frame = ctx.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
        let (stream, held) = self.execute_fairly(project, frame).await?;
        let batches = execute::collect(stream).await?;
        let statistics = execute::statistics(&held.1, started.elapsed());
        execute::result(columns, &batches, limit, self.limits.result_bytes, statistics)
    }

    /// Plans `plan` in `ctx` in one partition when the tables it reads are small ([`ONE_PARTITION_ROWS`]), unless
    /// the operator set the partitions (`--query-partitions`) or a cluster runs it.
    pub(crate) fn partition_for(
        &self,
        ctx: &datafusion::prelude::SessionContext,
        plan: &datafusion::logical_expr::LogicalPlan,
    ) {
        let set = self.limits.partitions.is_some() || self.scheduler().is_some();
        if !set && rows_read(plan).is_some_and(|rows| rows <= ONE_PARTITION_ROWS) {
            ctx.state_ref().write().config_mut().options_mut().execution.target_partitions = 1;
        }
    }

    /// Executes a planned query in its turn among every project's queries ([`fair`]): once it has a slot, each
    /// of its operators asks for its turn again before each batch. Returns its stream, and what must be held
    /// until the stream is done: its ticket, and its physical plan (whose leaves' metrics are the statistics).
    /// On a Ballista cluster, whose executors run the plan, the scheduler there shares its cores.
    async fn execute_fairly(
        &self,
        project: ProjectId,
        frame: datafusion::prelude::DataFrame,
    ) -> Result<
        (datafusion::physical_plan::SendableRecordBatchStream, (Option<fair::Held>, Arc<dyn ExecutionPlan>)),
        EngineError,
    > {
        let task = Arc::new(frame.task_ctx());
        let physical = frame.create_physical_plan().await.map_err(execute::execution_error)?;
        self.execute_planned(project, physical, task).await
    }

    /// `physical`, a plan of `project`'s to execute on this process's cores, its operators asking for the
    /// project's turns there ([`fair`]), once its first turn has come. The turns are the held ticket's.
    pub(crate) async fn with_turns(
        &self,
        project: ProjectId,
        physical: &Arc<dyn ExecutionPlan>,
    ) -> Result<(Arc<dyn ExecutionPlan>, fair::Held), EngineError> {
        let held = self.admission.turns(project);
        held.turn().await;
        let gated = fair::gate(Arc::clone(physical), &held).map_err(execute::execution_error)?;
        Ok((gated, held))
    }

    /// Executes a physical plan as [`Self::execute_fairly`] does, with `task`.
    async fn execute_planned(
        &self,
        project: ProjectId,
        physical: Arc<dyn ExecutionPlan>,
        task: Arc<datafusion::execution::TaskContext>,
    ) -> Result<
        (datafusion::physical_plan::SendableRecordBatchStream, (Option<fair::Held>, Arc<dyn ExecutionPlan>)),
        EngineError,
    > {
        let (gated, held) = if self.scheduler().is_some() {
            (Arc::clone(&physical), None)
        } else {
            let (gated, held) = self.with_turns(project, &physical).await?;
            (gated, Some(held))
        };
        let stream =
            datafusion::physical_plan::execute_stream(gated, task).map_err(execute::execution_error)?;
        Ok((stream, (held, physical)))
    }
}

/// A live run reading at most this many rows in all is planned in one partition: splitting it across the cores
/// (repartitioning its rows, aggregating in two phases, merging the streams) costs about half a millisecond to
/// plan and to run, more than such rows take on a core. Past it, a run whose filter is most of its work (a
/// `LIKE` over every row) gains more from a second core than that (docs/benchmarks.md, small runs).
pub(crate) const ONE_PARTITION_ROWS: u64 = 50_000;

/// The rows of the tables a plan scans, in its subqueries too, when each table's log says how many it holds;
/// `None` when one does not (the run log, an external source).
pub(crate) fn rows_read(plan: &datafusion::logical_expr::LogicalPlan) -> Option<u64> {
    use datafusion::common::stats::Precision;
    let mut rows = Some(0_u64);
    each_scan(plan, |scan| {
        let provider = datafusion::datasource::source_as_provider(&scan.source).ok();
        let counted = match provider.and_then(|provider| provider.statistics()).map(|s| s.num_rows) {
            Some(Precision::Exact(counted)) => u64::try_from(counted).ok(),
            _ => None,
        };
        rows = rows.zip(counted).map(|(sum, counted)| sum.saturating_add(counted));
    });
    rows
}

/// The tables a plan scans, in its subqueries too, by name, each once.
pub(crate) fn tables_read(plan: &datafusion::logical_expr::LogicalPlan) -> Vec<String> {
    let mut tables = std::collections::BTreeSet::new();
    each_scan(plan, |scan| {
        tables.insert(scan.table_name.table().to_owned());
    });
    tables.into_iter().collect()
}

/// Calls `visit` with each table scan of `plan`, in its subqueries too.
fn each_scan(
    plan: &datafusion::logical_expr::LogicalPlan,
    mut visit: impl FnMut(&datafusion::logical_expr::TableScan),
) {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::LogicalPlan;
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            visit(scan);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("the walk's closure never fails");
}

/// Planning and execution run on the engine's own threads, whose deep stacks let DataFusion recurse through
/// large expressions; a caller that goes away aborts its work there.
#[async_trait]
impl QueryEngine for DataFusionEngine {
    #[instrument(skip_all, fields(project = %project))]
    async fn describe(&self, project: ProjectId, query: &Query) -> Result<QueryDescription, EngineError> {
        compile::check_text(&query.sql)?;
        let owned = query.clone();
        // Planning takes a core as a run does: one of the project's query slots, refused as a run is when none
        // is free.
        self.in_slot(project, move |engine| async move { engine.describe_here(project, &owned).await })
            .await
            .map(|(description, _slot)| description)
            .map_err(|e| compile::compile(query).explain(e))
    }

    #[instrument(skip_all, fields(project = %project))]
    async fn describe_queued(
        &self,
        project: ProjectId,
        query: &Query,
    ) -> Result<QueryDescription, EngineError> {
        compile::check_text(&query.sql)?;
        let owned = query.clone();
        self.in_queued_slot(project, move |engine| async move { engine.describe_here(project, &owned).await })
            .await
            .map_err(|e| compile::compile(query).explain(e))
    }

    async fn execute(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, domain::BoundValue>,
        limit: u32,
        offset: u64,
    ) -> Result<domain::QueryResult, EngineError> {
        self.execute_at(project, query, variables, limit, offset, &ReadAt::Newest).await
    }

    #[instrument(skip_all, fields(project = %project, limit, offset))]
    async fn execute_at(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, domain::BoundValue>,
        limit: u32,
        offset: u64,
        at: &ReadAt,
    ) -> Result<domain::QueryResult, EngineError> {
        let (owned, variables, at) = (query.clone(), variables.clone(), at.clone());
        self.live(project, &query.sql, move |engine| async move {
            engine.execute_here(project, &owned, &variables, limit, offset, &at).await
        })
        .await
        .map(|(result, _slot)| result)
        .map_err(|e| compile::compile(query).explain(e))
    }

    #[instrument(skip_all, fields(project = %project, limit, offset, format = format.as_str()))]
    async fn export(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, domain::BoundValue>,
        limit: u32,
        offset: u64,
        format: ResultFormat,
    ) -> Result<Export, EngineError> {
        let (owned, variables) = (query.clone(), variables.clone());
        self.live(project, &query.sql, move |engine| async move {
            engine.export_here(project, &owned, &variables, limit, offset, format).await
        })
        .await
        .map_err(|e| compile::compile(query).explain(e))
        .and_then(|(export, slot)| self.spooled(project, export, slot))
    }
}

#[cfg(test)]
mod compaction_tests;
/// The demo project's `events` generator, which lives with the CLI's `demo` command, for realistic test tables.
#[cfg(test)]
#[path = "../../server/src/cli/demo_data.rs"]
mod demo;
#[cfg(test)]
mod export_tests;
#[cfg(test)]
mod hot_tables_tests;
#[cfg(test)]
mod materialization_tests;
#[cfg(test)]
mod run_log_tests;
#[cfg(test)]
mod storage_tests;
#[cfg(test)]
mod table_store_tests;
#[cfg(test)]
mod tests;
