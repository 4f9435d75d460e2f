//! A project's tables: one DataFusion session per request, holding only that project's tables.
//!
//! A table is `projects/{id}/tables/{table}/` in the storage. Its rows are the Parquet files of the version
//! its `_current` object names (`v-{uuid}/`), so a replace becomes visible at once, by one write of that
//! object, on a local disk and on S3 alike. A table without `_current` (written before versions existed) is
//! the Parquet files directly under its prefix.

use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::ParquetReadOptions;
use domain::{EngineError, ProjectId};
use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;

use crate::storage::{unavailable, Storage};

/// The object naming a table's current version on its first line, and on its second, when it has one, when the
/// table was first written (RFC 3339; replaces carry it over).
pub(crate) const CURRENT: &str = "_current";

/// A table a project can query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    pub name: String,
    /// Where its current files are, for people (`file:///...` or `s3://...`).
    pub location: String,
    /// Its Parquet files and their total size.
    pub files: u64,
    pub bytes: u64,
}

pub(crate) fn tables_prefix(project: ProjectId) -> ObjectPath {
    ObjectPath::from_iter(["projects", &project.to_string(), "tables"])
}

pub(crate) fn table_prefix(project: ProjectId, table: &str) -> ObjectPath {
    tables_prefix(project).join(table)
}

/// Table names are SQL identifiers, so a prefix with any other name is not a table: the API's rule
/// ([`domain::TableName`]), or lower case starting with `_`, which the CLI has always taken too.
pub(crate) fn is_table_name(name: &str) -> bool {
    let mut chars = name.chars();
    domain::TableName::is_valid(name)
        || (name.len() <= 63
            && chars.next() == Some('_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
}

/// A version's name: `v-` and a UUID, so a `_current` object can never point outside its table.
pub(crate) fn is_version_name(name: &str) -> bool {
    name.strip_prefix("v-").is_some_and(|id| uuid::Uuid::parse_str(id).is_ok())
}

pub(crate) fn is_parquet(path: &ObjectPath) -> bool {
    path.extension() == Some("parquet")
}

/// What a table's `_current` object says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pointer {
    pub(crate) version: String,
    /// When the table was first written; `None` for a pointer written before this was kept.
    pub(crate) created: Option<domain::Timestamp>,
}

impl Pointer {
    pub(crate) fn text(&self) -> String {
        let created =
            self.created.and_then(|at| at.format(&time::format_description::well_known::Rfc3339).ok());
        match created {
            Some(created) => format!("{}\n{created}\n", self.version),
            None => self.version.clone(),
        }
    }
}

/// The table's `_current` pointer, if it has one.
pub(crate) async fn pointer(storage: &Storage, table: &ObjectPath) -> Result<Option<Pointer>, EngineError> {
    let pointer = table.clone().join(CURRENT);
    let bytes = match storage.store().get(&pointer).await {
        Ok(found) => found.bytes().await.map_err(unavailable)?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(unavailable(e)),
    };
    let text = std::str::from_utf8(&bytes).unwrap_or_default();
    let mut lines = text.lines().map(str::trim);
    let name = lines.next().unwrap_or_default();
    if !is_version_name(name) {
        return Err(EngineError::Internal(
            format!("{pointer} does not name a table version: {name:?}").into(),
        ));
    }
    let created = lines
        .next()
        .and_then(|line| domain::Timestamp::parse(line, &time::format_description::well_known::Rfc3339).ok());
    Ok(Some(Pointer { version: name.to_owned(), created }))
}

/// The version `_current` names, if the table has one.
pub(crate) async fn current_version(
    storage: &Storage,
    table: &ObjectPath,
) -> Result<Option<String>, EngineError> {
    Ok(pointer(storage, table).await?.map(|p| p.version))
}

/// The prefix holding a table's current files, or `None` when there is no such table.
pub(crate) async fn current_files(
    storage: &Storage,
    table: &ObjectPath,
) -> Result<Option<ObjectPath>, EngineError> {
    if let Some(version) = current_version(storage, table).await? {
        return Ok(Some(table.clone().join(version.as_str())));
    }
    let legacy = storage.objects(table).await.map_err(unavailable)?;
    Ok(legacy.iter().any(|o| is_parquet(&o.location)).then(|| table.clone()))
}

/// Each table of the project, by name, with the prefix of its current files.
pub(crate) async fn list_tables(
    storage: &Storage,
    project: ProjectId,
) -> Result<Vec<(String, ObjectPath)>, EngineError> {
    let mut tables = Vec::new();
    for name in storage.children(&tables_prefix(project)).await.map_err(unavailable)? {
        if !is_table_name(&name) {
            continue;
        }
        if let Some(files) = current_files(storage, &table_prefix(project, &name)).await? {
            tables.push((name, files));
        }
    }
    tables.sort();
    Ok(tables)
}

/// The tables with their sizes, for people.
pub(crate) async fn describe_tables(
    storage: &Storage,
    project: ProjectId,
) -> Result<Vec<TableInfo>, EngineError> {
    let mut described = Vec::new();
    for (name, files) in list_tables(storage, project).await? {
        let parquet: Vec<_> = storage
            .objects(&files)
            .await
            .map_err(unavailable)?
            .into_iter()
            .filter(|o| is_parquet(&o.location))
            .collect();
        described.push(TableInfo {
            name,
            location: format!("{}/{files}/", storage.location()),
            files: parquet.len() as u64,
            bytes: parquet.iter().map(|o| o.size).sum(),
        });
    }
    Ok(described)
}

/// A session with no tables at all that can read the storage (for tables the engine registers). Its queries run
/// in this process, or on the Ballista cluster whose scheduler is at `scheduler`.
pub(crate) fn empty_session(
    storage: &Storage,
    runtime: Option<Arc<RuntimeEnv>>,
    scheduler: Option<&str>,
) -> Result<SessionContext, EngineError> {
    #[cfg(feature = "ballista")]
    if let Some(scheduler) = scheduler {
        return crate::distributed::session(storage, runtime, scheduler);
    }
    #[cfg(not(feature = "ballista"))]
    debug_assert!(scheduler.is_none(), "a scheduler is only ever set with the `ballista` feature");
    let config = SessionConfig::new().with_information_schema(false);
    let ctx = match runtime {
        Some(runtime) => SessionContext::new_with_config_rt(config, runtime),
        None => SessionContext::new_with_config(config),
    };
    storage.register(&ctx.runtime_env());
    Ok(ctx)
}

/// A session that sees exactly the project's tables and has no way to reach other files.
pub(crate) async fn session(
    storage: &Storage,
    project: ProjectId,
    runtime: Option<Arc<RuntimeEnv>>,
    scheduler: Option<&str>,
) -> Result<SessionContext, EngineError> {
    let ctx = empty_session(storage, runtime, scheduler)?;
    for (name, files) in list_tables(storage, project).await? {
        // Bare: registered as it is spelled, so `"Sales"` in SQL finds `Sales` (a parsed name folds to `sales`).
        let table = TableReference::bare(name);
        ctx.register_parquet(table, storage.url_of(&files), ParquetReadOptions::default())
            .await
            .map_err(crate::execute::storage_error)?;
    }
    Ok(ctx)
}
