//! Stored results of materialized endpoints: `DATA_DIR/projects/{id}/materializations/{endpoint}/v{n}-{token}/`.
//!
//! A result is the query's rows, in the order the query produced them, with one more column at the end holding
//! each row's position, so a read returns them in that same order whatever the file layout. Each refresh writes
//! into a location of its own that nothing reads until the store switches to it; removing a location never
//! touches another.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::{col, ParquetReadOptions};
use domain::materialization::{Eligibility, MaterializedFilter};
use domain::ports::{EngineError, MaterializedResults};
use domain::{BoundValue, ProjectId, Query, QueryResult, VariableType};
use futures_util::StreamExt;
use tracing::instrument;
use uuid::Uuid;

use crate::compile::{self, Compiled};
use crate::{catalog, execute, message, outline, types, DataFusionEngine};

const TABLE: &str = "materialized";

pub(crate) fn materializations_dir(data_dir: &Path, project: ProjectId) -> PathBuf {
    data_dir.join("projects").join(project.to_string()).join("materializations")
}

/// The directory of a location, refusing anything that is not `{uuid}` or `{uuid}/v{n}-{uuid}`: a location
/// never reaches outside its project's directory.
fn resolve(data_dir: &Path, project: ProjectId, location: &str) -> Result<PathBuf, EngineError> {
    let bad = || EngineError::Internal(format!("not a materialization location: {location:?}").into());
    let mut parts = location.split('/');
    let endpoint = parts.next().ok_or_else(bad)?;
    Uuid::parse_str(endpoint).map_err(|_| bad())?;
    let mut path = materializations_dir(data_dir, project).join(endpoint);
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

fn io(err: std::io::Error) -> EngineError {
    EngineError::Internal(Box::new(err))
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

/// Rows in order with their positions, into one Parquet file.
struct ResultWriter {
    writer: ArrowWriter<std::fs::File>,
    schema: SchemaRef,
    rows: u64,
}

impl ResultWriter {
    fn create(path: &Path, output: &Schema) -> Result<Self, EngineError> {
        let mut fields: Vec<Field> = output.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(ordinal_name(output), DataType::UInt64, false));
        let schema = Arc::new(Schema::new(fields));
        let file = std::fs::File::create(path).map_err(io)?;
        let props =
            WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
        let writer = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        Ok(Self { writer, schema, rows: 0 })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<(), EngineError> {
        let n = batch.num_rows() as u64;
        let positions: ArrayRef = Arc::new(UInt64Array::from_iter_values(self.rows..self.rows + n));
        let mut columns = batch.columns().to_vec();
        columns.push(positions);
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        tokio::task::block_in_place(|| self.writer.write(&batch))
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        self.rows += n;
        Ok(())
    }

    fn finish(self) -> Result<u64, EngineError> {
        tokio::task::block_in_place(|| self.writer.close())
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        Ok(self.rows)
    }
}

impl DataFusionEngine {
    async fn write_here(&self, project: ProjectId, query: &Query, dir: &Path) -> Result<u64, EngineError> {
        let compiled = compile::compile(query);
        let ctx = catalog::session(&self.data_dir, project, Some(execute::runtime(&self.limits)?)).await?;
        let unbound = self.plan_unbound(&ctx, &compiled).await?;
        let outline =
            outline::outline(&unbound, &compiled).map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        if let Some(reason) = Eligibility::decide(&outline).reason() {
            return Err(EngineError::InvalidQuery(reason.to_owned()));
        }
        let plan = outline::without_variable_predicates(unbound, &compiled)
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        let frame = ctx.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
        let mut stream = frame.execute_stream().await.map_err(execute::execution_error)?;
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut writer = ResultWriter::create(&dir.join("part-0.parquet"), stream.schema().as_ref())?;
        while let Some(batch) = stream.next().await {
            writer.write(&batch.map_err(execute::execution_error)?)?;
        }
        writer.finish()
    }

    async fn read_here(
        &self,
        dir: &Path,
        filters: Vec<(MaterializedFilter, BoundValue)>,
        limit: u32,
        offset: u64,
    ) -> Result<QueryResult, EngineError> {
        let ctx = catalog::empty_session(Some(execute::runtime(&self.limits)?));
        let location = format!("{}/", dir.display());
        let schema = ctx
            .read_parquet(location.as_str(), ParquetReadOptions::default())
            .await
            .map_err(|e| EngineError::Internal(Box::new(e)))?
            .schema()
            .as_arrow()
            .clone();
        let (ordinal, output) = schema.fields().split_last().ok_or_else(|| {
            EngineError::Internal(format!("stored result at {} has no columns", dir.display()).into())
        })?;
        // The rows are stored in order of their position, so reading in that order needs no sort.
        let options = ParquetReadOptions::default()
            .file_sort_order(vec![vec![col(quoted(ordinal.name())).sort(true, false)]]);
        ctx.register_parquet(TABLE, &location, options)
            .await
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        let mut params = Vec::with_capacity(filters.len());
        let mut conditions = Vec::with_capacity(filters.len());
        let mut values = Vec::with_capacity(filters.len());
        for (i, (filter, value)) in filters.into_iter().enumerate() {
            let ty = variable_type(&value);
            conditions.push(format!(
                "{} {} CAST(${} AS {})",
                quoted(&filter.column),
                filter.op.as_sql(),
                i + 1,
                compile::sql_type(ty)
            ));
            values.push(execute::scalar(&value));
            params.push((filter.variable, ty));
        }
        let select: Vec<String> = output.iter().map(|f| quoted(f.name())).collect();
        let mut sql = format!("SELECT {} FROM {TABLE}", select.join(", "));
        if !conditions.is_empty() {
            sql.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
        }
        sql.push_str(&format!(" ORDER BY {}", quoted(ordinal.name())));
        let plan = self.plan(&ctx, &Compiled { sql, params }, values).await?;
        let columns = types::columns(plan.schema().as_arrow());
        let plan = execute::window(plan, limit, offset)?;
        let frame = ctx.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
        let stream = frame.execute_stream().await.map_err(execute::execution_error)?;
        let batches = execute::collect(stream).await?;
        execute::result(columns, &batches, limit, self.limits.result_bytes)
    }
}

/// Removes `path` and, when that leaves it empty, its endpoint directory.
fn remove_location(path: &Path, endpoint_dir: Option<&Path>) -> Result<(), EngineError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    if let Some(parent) = endpoint_dir {
        // Fails harmlessly when another attempt of the endpoint still has files there.
        let _ = std::fs::remove_dir(parent);
    }
    Ok(())
}

fn children(dir: &Path) -> Result<Vec<(String, PathBuf)>, EngineError> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|entry| {
                let entry = entry.map_err(io)?;
                Ok((entry.file_name().to_string_lossy().into_owned(), entry.path()))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(e)),
    }
}

#[async_trait]
impl MaterializedResults for DataFusionEngine {
    #[instrument(skip_all, fields(project = %project, location))]
    async fn write(&self, project: ProjectId, query: &Query, location: &str) -> Result<u64, EngineError> {
        compile::check_size(&query.sql)?;
        let dir = resolve(&self.data_dir, project, location)?;
        let (engine, query, target) = (self.clone(), query.clone(), dir.clone());
        let limit = self.limits.refresh_timeout;
        let work = self.runtime.run(async move { engine.write_here(project, &query, &target).await });
        let written = tokio::time::timeout(limit, work).await.unwrap_or(Err(EngineError::Timeout(limit)));
        if written.is_err() {
            // The write's own error is the one to report; a leftover is the sweep's to remove.
            if let Err(err) = remove_location(&dir, None) {
                tracing::warn!(location, error = %err, "cannot remove a failed materialization's files");
            }
        }
        written
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
        let dir = resolve(&self.data_dir, project, location)?;
        let slot = self.slots.try_acquire(project, &self.limits)?;
        let engine = self.clone();
        self.within_time(self.runtime.run(async move {
            let _slot = slot;
            engine.read_here(&dir, filters, limit, offset).await
        }))
        .await
    }

    #[instrument(skip_all, fields(project = %project, location))]
    async fn remove(&self, project: ProjectId, location: &str) -> Result<(), EngineError> {
        let path = resolve(&self.data_dir, project, location)?;
        let endpoint_dir = location.contains('/').then(|| path.parent().map(Path::to_path_buf)).flatten();
        tokio::task::spawn_blocking(move || remove_location(&path, endpoint_dir.as_deref()))
            .await
            .map_err(|e| EngineError::Internal(Box::new(e)))?
    }

    #[instrument(skip_all)]
    async fn locations(&self) -> Result<Vec<(ProjectId, String)>, EngineError> {
        let data_dir = self.data_dir.clone();
        tokio::task::spawn_blocking(move || {
            let mut found = Vec::new();
            for (project, _) in children(&data_dir.join("projects"))? {
                let Some(project) = project.parse::<i64>().ok().and_then(|p| ProjectId::new(p).ok()) else {
                    continue;
                };
                for (endpoint, path) in children(&materializations_dir(&data_dir, project))? {
                    let attempts = children(&path)?;
                    if attempts.is_empty() {
                        // Only ever removed while empty: a refresh about to write here recreates it.
                        let _ = std::fs::remove_dir(&path);
                    }
                    for (attempt, _) in attempts {
                        found.push((project, format!("{endpoint}/{attempt}")));
                    }
                }
            }
            Ok(found)
        })
        .await
        .map_err(|e| EngineError::Internal(Box::new(e)))?
    }
}
