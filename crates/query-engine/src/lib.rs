//! The query engine adapter: the domain's `QueryEngine` port on Apache DataFusion, embedded in the process.
//!
//! Each project gets a catalog of its own holding only its tables, which are directories of Parquet files under
//! `DATA_DIR/projects/{id}/tables/{table}/`. Only a single read-only statement is ever planned: no DDL, DML,
//! `COPY`, `SET`, external tables or URL tables, so a query can read its project's tables and nothing else.
//! Variables are compiled to engine placeholders and bound as typed values, never pasted into SQL text.
//! This crate knows nothing of HTTP or of the store.

mod catalog;
mod compile;
mod types;

use std::path::PathBuf;

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SQLOptions;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use domain::endpoint::Column;
use domain::ports::{EngineError, QueryEngine};
use domain::{ProjectId, Query};
use tracing::instrument;

pub use catalog::TableInfo;

/// DataFusion behind the `QueryEngine` port.
#[derive(Debug, Clone)]
pub struct DataFusionEngine {
    data_dir: PathBuf,
}

/// The engine's error text for a person: no backtrace, no internal prefix noise.
pub(crate) fn message(err: &DataFusionError) -> String {
    err.strip_backtrace()
}

impl DataFusionEngine {
    /// An engine over the tables under `data_dir/projects/`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self { data_dir: data_dir.into() }
    }

    /// The tables a project can query, by name.
    ///
    /// # Errors
    /// [`EngineError::Internal`] when the table directory cannot be read.
    pub async fn tables(&self, project: ProjectId) -> Result<Vec<TableInfo>, EngineError> {
        catalog::list_tables(&self.data_dir, project).await
    }

    /// Parses and plans `query` for `project`: one read-only statement, variables as typed placeholders.
    async fn plan(
        &self,
        project: ProjectId,
        query: &Query,
    ) -> Result<datafusion::logical_expr::LogicalPlan, EngineError> {
        let compiled = compile::compile(query);
        let ctx = catalog::session(&self.data_dir, project).await?;
        let state = ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state
            .sql_to_statement(&compiled.sql, &dialect)
            .map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        match &statement {
            DfStatement::Statement(inner) if matches!(**inner, SqlStatement::Query(_)) => {}
            _ => {
                return Err(EngineError::InvalidQuery(
                    "Only a single read-only SELECT (or WITH ... SELECT, or VALUES) statement is allowed."
                        .into(),
                ))
            }
        }
        let plan =
            state.statement_to_plan(statement).await.map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(|e| EngineError::InvalidQuery(message(&e)))?;
        plan.with_param_values(compiled.sample_values()).map_err(|e| EngineError::InvalidQuery(message(&e)))
    }
}

#[async_trait]
impl QueryEngine for DataFusionEngine {
    #[instrument(skip_all, fields(project = %project))]
    async fn describe(&self, project: ProjectId, query: &Query) -> Result<Vec<Column>, EngineError> {
        let plan = self.plan(project, query).await?;
        let columns = types::columns(plan.schema().as_arrow());
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = columns.iter().find(|c| !seen.insert(c.name.as_str())) {
            return Err(EngineError::InvalidQuery(format!(
                "The output column name '{}' appears more than once; give each column a distinct alias.",
                dup.name
            )));
        }
        Ok(columns)
    }
}

#[cfg(test)]
mod tests;
