//! A project's tables: one DataFusion session per request, holding only that project's tables.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::execution::runtime_env::RuntimeEnv;

use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::prelude::ParquetReadOptions;
use domain::ports::EngineError;
use domain::ProjectId;

/// A table a project can query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    pub name: String,
    pub path: PathBuf,
}

pub(crate) fn tables_dir(data_dir: &Path, project: ProjectId) -> PathBuf {
    data_dir.join("projects").join(project.to_string()).join("tables")
}

/// Table names are SQL identifiers, so a directory with any other name is not a table.
pub(crate) fn is_table_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

pub(crate) async fn list_tables(data_dir: &Path, project: ProjectId) -> Result<Vec<TableInfo>, EngineError> {
    let dir = tables_dir(data_dir, project);
    let mut entries = match tokio::fs::read_dir(&dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EngineError::Internal(Box::new(e))),
    };
    let mut tables = Vec::new();
    while let Some(entry) = entries.next_entry().await.map_err(|e| EngineError::Internal(Box::new(e)))? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let has_files = std::fs::read_dir(entry.path())
            .map(|mut files| {
                files.any(|f| f.is_ok_and(|f| f.path().extension().is_some_and(|e| e == "parquet")))
            })
            .unwrap_or(false);
        if is_table_name(&name) && has_files {
            tables.push(TableInfo { name, path: entry.path() });
        }
    }
    tables.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(tables)
}

/// A session with no tables at all.
pub(crate) fn empty_session(runtime: Option<Arc<RuntimeEnv>>) -> SessionContext {
    let config = SessionConfig::new().with_information_schema(false);
    match runtime {
        Some(runtime) => SessionContext::new_with_config_rt(config, runtime),
        None => SessionContext::new_with_config(config),
    }
}

/// A session that sees exactly the project's tables and has no way to reach other files.
pub(crate) async fn session(
    data_dir: &Path,
    project: ProjectId,
    runtime: Option<Arc<RuntimeEnv>>,
) -> Result<SessionContext, EngineError> {
    let ctx = empty_session(runtime);
    for table in list_tables(data_dir, project).await? {
        let path = format!("{}/", table.path.display());
        ctx.register_parquet(table.name.as_str(), &path, ParquetReadOptions::default())
            .await
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
    }
    Ok(ctx)
}
