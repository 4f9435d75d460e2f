//! Physical plans kept between executions, with what each execution reads bound when it executes: a run's filter
//! values, a fold's appended files.
//!
//! A run of a result held in memory spent nearly all its time planning: measured on a rollup of 900 stored rows,
//! 0.3 ms for a session, 0.6 ms optimizing and 1-1.3 ms making the physical plan, against 0.2 ms executing it.
//! Its plan depends on the values of its variables only through the filters of the stored rows, so a prepared
//! result keeps the physical plan of each read it answered, by the filters' columns and operators and the page
//! ([`ReadShape`]); a run executes it again with its own values ([`Bound`], in the run's task context), which
//! the plan's scan ([`BoundRows`]) compares each stored row with. The filter is coerced as the planner
//! coerces a comparison ([`BinaryTypeCoercer`]), so a kept plan answers what a plan of the run's own would.
//!
//! A plan is kept only when the stored rows are all it reads and no function in it answers differently from
//! one run to the next (`now()`, `random()`: the planner evaluates them once).
//!
//! A fold is the same: the plan over a table's appended rows depends on them only through the files that hold
//! them. Its scan ([`AppendedFiles`]) reads the files the executing fold binds ([`Appended`]), so the fold of
//! the next append executes the same physical plan (planning it was 2.3-3.2 ms of a 9-10 ms fold). When the
//! table is kept decoded ([`crate::hot_tables`]), an append keeps its rows there too, and the fold reads them
//! from memory instead of opening and decoding the files just written.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::compute::{and, filter_record_batch, BatchCoalescer};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::type_coercion::binary::BinaryTypeCoercer;
use datafusion::logical_expr::{Expr, Operator};
use datafusion::physical_expr::expressions::{binary, CastExpr, Column, Literal};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{
    reset_plan_states, Boundedness, ChildrenPropertiesMode, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::scalar::ScalarValue;
use futures_util::StreamExt;

use crate::hot_tables::HotFile;

/// A physical plan kept between executions, with the configuration of the session that made it: each execution
/// binds what it reads in a copy of that configuration.
#[derive(Debug, Clone)]
pub(crate) struct KeptPlan {
    pub(crate) plan: Arc<dyn ExecutionPlan>,
    config: SessionConfig,
    session: String,
}

impl KeptPlan {
    /// The physical plan of `frame`, made in `ctx`.
    pub(crate) async fn of(ctx: &SessionContext, frame: DataFrame) -> Result<Self> {
        let (config, session) = (ctx.copied_config(), ctx.session_id());
        Ok(Self { plan: frame.create_physical_plan().await?, config, session })
    }

    /// A fresh copy of its operators (a plan's operators keep what one execution built, such as a join's
    /// table), and the task that executes them with `bound` and `runtime`.
    pub(crate) fn bind<T: Send + Sync + 'static>(
        &self,
        bound: T,
        runtime: Arc<RuntimeEnv>,
    ) -> Result<(Arc<dyn ExecutionPlan>, Arc<TaskContext>)> {
        let config = self.config.clone().with_extension(Arc::new(bound));
        let task = TaskContext::new(
            None,
            self.session.clone(),
            config,
            HashMap::new(),
            HashMap::new(),
            HashMap::new(),
            HashMap::new(),
            runtime,
        );
        Ok((reset_plan_states(Arc::clone(&self.plan))?, Arc::new(task)))
    }
}

/// The values a run binds to a kept plan's filters, in their order: put in the run's session configuration.
#[derive(Debug)]
pub(crate) struct Bound(pub(crate) Vec<ScalarValue>);

/// A filter of the stored rows whose value each run binds: its stored column compared by `op` with the value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct BoundFilter {
    pub(crate) column: String,
    pub(crate) op: Operator,
}

/// What a kept read plan is kept by: the filters whose values runs bind, and the page.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ReadShape {
    pub(crate) filters: Vec<BoundFilter>,
    pub(crate) limit: u32,
    pub(crate) offset: u64,
}

/// Stored rows held in memory, as a table whose scan keeps the rows that pass its filters with the values the
/// executing run binds.
#[derive(Debug)]
pub(crate) struct BoundRows {
    rows: Arc<MemTable>,
    /// Each filter's column, as its index in the rows' schema, and operator.
    filters: Arc<[(usize, Operator)]>,
}

impl BoundRows {
    /// # Errors
    /// A filter naming a column the rows do not have.
    pub(crate) fn new(rows: Arc<MemTable>, filters: &[BoundFilter]) -> Result<Self> {
        let schema = rows.schema();
        let filters = filters
            .iter()
            .map(|filter| Ok((schema.index_of(&filter.column)?, filter.op)))
            .collect::<Result<Arc<[_]>>>()?;
        Ok(Self { rows, filters })
    }
}

#[async_trait]
impl TableProvider for BoundRows {
    fn schema(&self) -> SchemaRef {
        self.rows.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Every column: the filters read theirs before the projection drops them.
        let rows = self.rows.scan(state, None, &[], None).await?;
        let filtered: Arc<dyn ExecutionPlan> =
            Arc::new(BoundFilterExec { input: rows, filters: Arc::clone(&self.filters) });
        let Some(columns) = projection else { return Ok(filtered) };
        let schema = filtered.schema();
        let columns = columns.iter().map(|&i| {
            let name = schema.field(i).name();
            ProjectionExpr {
                expr: Arc::new(Column::new(name, i)) as Arc<dyn PhysicalExpr>,
                alias: name.clone(),
            }
        });
        Ok(Arc::new(ProjectionExec::try_new(columns, filtered)?))
    }
}

/// The rows of `input` that pass every filter with the values bound in the executing task's configuration.
#[derive(Debug)]
struct BoundFilterExec {
    input: Arc<dyn ExecutionPlan>,
    filters: Arc<[(usize, Operator)]>,
}

impl DisplayAs for BoundFilterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let schema = self.input.schema();
        let filters: Vec<String> = self
            .filters
            .iter()
            .enumerate()
            .map(|(i, (column, op))| format!("{} {op} ${}", schema.field(*column).name(), i + 1))
            .collect();
        write!(f, "BoundFilterExec: {}", filters.join(" AND "))
    }
}

impl ExecutionPlan for BoundFilterExec {
    fn name(&self) -> &'static str {
        "BoundFilterExec"
    }

    /// Its input's: keeping some rows changes neither their order nor their partitions.
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children.into_iter().next().unwrap_or_else(|| Arc::clone(&self.input));
        Ok(Arc::new(Self { input, filters: Arc::clone(&self.filters) }))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let values = context.session_config().get_extension::<Bound>().ok_or_else(|| {
            DataFusionError::Internal("a kept read plan executed without its values".into())
        })?;
        if values.0.len() != self.filters.len() {
            return Err(DataFusionError::Internal(format!(
                "a kept read plan of {} filters executed with {} values",
                self.filters.len(),
                values.0.len()
            )));
        }
        let schema = self.input.schema();
        let predicates = self
            .filters
            .iter()
            .zip(&values.0)
            .map(|(&(column, op), value)| comparison(&schema, column, op, value))
            .collect::<Result<Vec<_>>>()?;
        let input = self.input.execute(partition, context)?;
        let kept = input.map(move |batch| batch.and_then(|batch| passing(&batch, &predicates)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, kept)))
    }
}

/// `column op value`, each side cast to the type the planner coerces that comparison to.
fn comparison(
    schema: &Schema,
    column: usize,
    op: Operator,
    value: &ScalarValue,
) -> Result<Arc<dyn PhysicalExpr>> {
    let field = schema.field(column);
    let (left, right) =
        BinaryTypeCoercer::new(field.data_type(), &op, &value.data_type()).get_input_types()?;
    let mut stored: Arc<dyn PhysicalExpr> = Arc::new(Column::new(field.name(), column));
    if &left != field.data_type() {
        stored = Arc::new(CastExpr::new(stored, left, None));
    }
    let value = Arc::new(Literal::new(value.cast_to(&right)?));
    binary(stored, op, value, schema)
}

/// The rows of `batch` for which every predicate is true (not false, not null).
fn passing(batch: &RecordBatch, predicates: &[Arc<dyn PhysicalExpr>]) -> Result<RecordBatch> {
    let mut mask: Option<BooleanArray> = None;
    for predicate in predicates {
        let result = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
        let result = result
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| DataFusionError::Internal("a comparison did not answer booleans".into()))?;
        mask = Some(match mask {
            Some(mask) => and(&mask, result)?,
            None => result.clone(),
        });
    }
    match mask {
        Some(mask) => Ok(filter_record_batch(batch, &mask)?),
        None => Ok(batch.clone()),
    }
}

/// The files a fold binds to its kept plan's scan of the appended table, in its session configuration.
pub(crate) enum Appended {
    /// Read from storage.
    Files(Vec<PartitionedFile>),
    /// Every one of them kept decoded, in the log's order: read from memory when the columns the scan reads
    /// are decoded in each, else from storage (`files`).
    Decoded { decoded: Vec<HotFile>, files: Vec<PartitionedFile> },
}

impl fmt::Debug for Appended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Files(files) => f.debug_tuple("Files").field(&files.len()).finish(),
            Self::Decoded { decoded, .. } => f.debug_tuple("Decoded").field(&decoded.len()).finish(),
        }
    }
}

/// A table of files whose scan reads the files the executing fold binds ([`Appended`]), in one partition (the
/// appended rows are few), with the table's Parquet options. Filters are left to the plan above it.
#[derive(Debug)]
pub(crate) struct AppendedFiles {
    schema: SchemaRef,
    store: ObjectStoreUrl,
    format: Arc<dyn FileFormat>,
}

impl AppendedFiles {
    /// Files of `schema` in the object store `store` names, read by `format`.
    pub(crate) fn new(schema: SchemaRef, store: ObjectStoreUrl, format: Arc<dyn FileFormat>) -> Self {
        Self { schema, store, format }
    }
}

#[async_trait]
impl TableProvider for AppendedFiles {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let source = self.format.file_source(Arc::clone(&self.schema).into());
        let config = FileScanConfigBuilder::new(self.store.clone(), source)
            .with_file_groups(vec![FileGroup::default()])
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .build();
        // The format's own scan (its options, its readers and their metadata cache), with no files yet.
        let scan = self.format.create_physical_plan(state, config).await?;
        let columns = Columns { schema: Arc::clone(&self.schema), projection: projection.cloned(), limit };
        let config = scan
            .downcast_ref::<DataSourceExec>()
            .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
            .cloned()
            .ok_or_else(|| DataFusionError::Internal("a file format planned a scan of no files".into()))?;
        let properties = PlanProperties::new(
            EquivalenceProperties::new(scan.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Arc::new(AppendedFilesExec { config, columns, properties: Arc::new(properties) }))
    }
}

/// The table's columns, those a scan reads of them, and how many rows at most.
#[derive(Debug)]
struct Columns {
    schema: SchemaRef,
    projection: Option<Vec<usize>>,
    limit: Option<usize>,
}

/// A scan of the files bound in the executing task's configuration, as `config` reads files (or of their rows
/// kept decoded).
#[derive(Debug)]
struct AppendedFilesExec {
    config: FileScanConfig,
    /// What it reads of rows kept decoded.
    columns: Columns,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for AppendedFilesExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AppendedFilesExec")
    }
}

impl ExecutionPlan for AppendedFilesExec {
    fn name(&self) -> &'static str {
        "AppendedFilesExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let files = context.session_config().get_extension::<Appended>().ok_or_else(|| {
            DataFusionError::Internal("a kept fold plan executed without its appended files".into())
        })?;
        if partition != 0 {
            return Err(DataFusionError::Internal(format!("appended files have no partition {partition}")));
        }
        let files = match files.as_ref() {
            Appended::Decoded { decoded, files } => {
                let Columns { schema, projection, limit } = &self.columns;
                let projection = projection.as_deref();
                if !decoded.iter().all(|file| file.reads(schema, projection)) {
                    files.clone()
                } else {
                    // Streamed appends leave many files of a few rows: read as batches of the session's size,
                    // not one small batch per file for each operator above to take in turn.
                    let read = datafusion::common::project_schema(schema, self.columns.projection.as_ref())?;
                    let mut coalescer =
                        BatchCoalescer::new(Arc::clone(&read), context.session_config().batch_size());
                    for file in decoded {
                        for batch in file.batches(projection, |_| true)? {
                            coalescer.push_batch(batch)?;
                        }
                    }
                    coalescer.finish_buffered_batch()?;
                    let rows: Vec<RecordBatch> =
                        std::iter::from_fn(|| coalescer.next_completed_batch()).collect();
                    let memory = MemorySourceConfig::try_new(&[rows], read, None)?.with_limit(*limit);
                    return DataSourceExec::from_data_source(memory).execute(0, context);
                }
            }
            Appended::Files(files) => files.clone(),
        };
        let config = FileScanConfigBuilder::from(self.config.clone())
            .with_file_groups(vec![FileGroup::new(files)])
            .build();
        DataSourceExec::from_data_source(config).execute(0, context)
    }
}
