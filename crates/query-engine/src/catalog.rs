//! A project's tables: one DataFusion session per request, holding only that project's tables.
//!
//! A table is `projects/{id}/tables/{table}/` in the storage. Its rows are the Parquet files of the version
//! its `_current` object names (`v-{uuid}/`), and the full files compactions wrote (`full/`) that the same
//! object lists, so a replace or a compaction becomes visible at once, by one write of that object, on a local
//! disk and on S3 alike. A table without `_current` (written before versions existed) is the Parquet files
//! directly under its prefix.

use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::ParquetReadOptions;
use domain::{EngineError, ExternalSource, ProjectId};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt};

use crate::sources::Unreadable;
use crate::storage::{unavailable, Storage};

/// The object naming a table's current version on its first line, and on its second, when it has one, when the
/// table was first written (RFC 3339; replaces carry it over).
pub(crate) const CURRENT: &str = "_current";

/// The directory of a table's full files: written by compactions, part of the table once `_current` lists
/// them, and never rewritten or copied by later compactions.
pub(crate) const FULL: &str = "full";

/// A table a project can query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFiles {
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

/// A name for a new table: a table name other than `_logs`, which is the project's run log ([`crate::run_log`]).
/// (A table written under that name before the run log existed is still read, listed and queried as before.)
pub(crate) fn is_new_table_name(name: &str) -> bool {
    is_table_name(name) && name != crate::run_log::LOGS_TABLE
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
    pub(crate) target: TableContents,
    /// When the table was first written; `None` for a pointer written before this was kept.
    pub(crate) created: Option<domain::Timestamp>,
    /// For a version: the names of the full files (in `full/`) that hold rows of the table besides the
    /// version's own, one per line after the creation time.
    pub(crate) full: Vec<String>,
}

/// A full file's name as a pointer lists it: a Parquet file's name, never a path.
fn is_full_file_name(name: &str) -> bool {
    name.ends_with(".parquet") && !name.contains('/') && !name.starts_with('.')
}

/// Where a table's rows are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TableContents {
    /// A version of its own files: `v-{uuid}`.
    Version(String),
    /// An external source, read where it is.
    Source(ExternalSource),
}

/// The first line of the pointer of a table that reads an external source; its third is the source as JSON.
const EXTERNAL: &str = "external";

/// An external source as a pointer keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
struct SourceRecord {
    url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    table: Option<String>,
}

impl SourceRecord {
    fn of(source: &ExternalSource) -> Self {
        match source {
            ExternalSource::Files { url, format } => {
                Self { url: url.clone(), format: Some(format.as_str().into()), table: None }
            }
            ExternalSource::Postgres { url, table } => {
                Self { url: url.clone(), format: None, table: Some(table.clone()) }
            }
        }
    }

    fn source(self) -> Option<ExternalSource> {
        match (self.format, self.table) {
            (Some(format), None) => {
                let format = domain::TableFormat::ALL.into_iter().find(|f| f.as_str() == format)?;
                Some(ExternalSource::Files { url: self.url, format })
            }
            (None, Some(table)) => Some(ExternalSource::Postgres { url: self.url, table }),
            _ => None,
        }
    }
}

impl Pointer {
    pub(crate) fn text(&self) -> String {
        let created =
            self.created.and_then(|at| at.format(&time::format_description::well_known::Rfc3339).ok());
        match (&self.target, created) {
            (TableContents::Version(version), created) if !self.full.is_empty() => {
                let mut text = format!("{version}\n{}\n", created.as_deref().unwrap_or(""));
                for name in &self.full {
                    text.push_str(name);
                    text.push('\n');
                }
                text
            }
            (TableContents::Version(version), Some(created)) => format!("{version}\n{created}\n"),
            (TableContents::Version(version), None) => version.clone(),
            (TableContents::Source(source), created) => {
                let record =
                    serde_json::to_string(&SourceRecord::of(source)).expect("a source record is strings");
                // A pointer written before sources had a creation time has an empty line there.
                format!("{EXTERNAL}\n{}\n{record}\n", created.as_deref().unwrap_or(""))
            }
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines().map(str::trim);
        let first = lines.next()?;
        let created = lines.next().and_then(|line| {
            domain::Timestamp::parse(line, &time::format_description::well_known::Rfc3339).ok()
        });
        let mut full = Vec::new();
        let target = if first == EXTERNAL {
            let record: SourceRecord = serde_json::from_str(lines.next()?).ok()?;
            TableContents::Source(record.source()?)
        } else if is_version_name(first) {
            for name in lines.filter(|line| !line.is_empty()) {
                if !is_full_file_name(name) {
                    return None;
                }
                full.push(name.to_owned());
            }
            TableContents::Version(first.to_owned())
        } else {
            return None;
        };
        Some(Self { target, created, full })
    }
}

/// The table's `_current` pointer, if it has one.
pub(crate) async fn pointer(storage: &Storage, table: &ObjectPath) -> Result<Option<Pointer>, EngineError> {
    Ok(pointed(storage, table).await?.map(|(pointer, _)| pointer))
}

/// The table's `_current` pointer, if it has one, with when it was written.
async fn pointed(
    storage: &Storage,
    table: &ObjectPath,
) -> Result<Option<(Pointer, ObjectMeta)>, EngineError> {
    let pointer = table.clone().join(CURRENT);
    let (bytes, meta) = match storage.store().get(&pointer).await {
        Ok(found) => {
            let meta = found.meta.clone();
            (found.bytes().await.map_err(unavailable)?, meta)
        }
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(unavailable(e)),
    };
    let unreadable = |first: &str| {
        EngineError::Internal(format!("{pointer} does not name a table version or source: {first:?}").into())
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| unreadable("(not UTF-8)"))?;
    let parsed = Pointer::parse(text).ok_or_else(|| unreadable(text.lines().next().unwrap_or("")))?;
    Ok(Some((parsed, meta)))
}

/// The version `_current` names, if the table has one of its own files.
pub(crate) async fn current_version(
    storage: &Storage,
    table: &ObjectPath,
) -> Result<Option<String>, EngineError> {
    Ok(pointer(storage, table).await?.and_then(|p| match p.target {
        TableContents::Version(version) => Some(version),
        TableContents::Source(_) => None,
    }))
}

/// Where a table's rows are now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Current {
    Files(TableVersion),
    External(ExternalSource),
}

/// The files of a table's current version: those under its directory, and the full files its pointer lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableVersion {
    pub(crate) dir: ObjectPath,
    pub(crate) full: Vec<ObjectPath>,
    /// When the table was first written, as the pointer keeps it.
    pub(crate) created: Option<domain::Timestamp>,
    /// When the pointer was written (a replace or a compaction switched the table then).
    pub(crate) switched: Option<domain::Timestamp>,
}

impl TableVersion {
    /// The version's name (`v-{uuid}`), `None` for a table written before versions existed.
    pub(crate) fn name(&self) -> Option<&str> {
        self.dir.filename().filter(|name| is_version_name(name))
    }

    /// Its Parquet files: the directory's, then the full files.
    pub(crate) async fn files(&self, storage: &Storage) -> Result<Vec<ObjectMeta>, object_store::Error> {
        let mut files: Vec<ObjectMeta> =
            storage.objects(&self.dir).await?.into_iter().filter(|o| is_parquet(&o.location)).collect();
        files.extend(self.full_files(storage).await?);
        Ok(files)
    }

    /// Its full files, with their sizes and times (one listing of `full/`).
    pub(crate) async fn full_files(&self, storage: &Storage) -> Result<Vec<ObjectMeta>, object_store::Error> {
        let Some(first) = self.full.first() else { return Ok(Vec::new()) };
        let parts: Vec<_> = first.parts().collect();
        let dir = ObjectPath::from_iter(parts[..parts.len().saturating_sub(1)].iter().cloned());
        let listed = storage.objects(&dir).await?;
        Ok(listed.into_iter().filter(|o| self.full.contains(&o.location)).collect())
    }
}

/// Where a table's rows are, or `None` when there is no such table.
pub(crate) async fn current(storage: &Storage, table: &ObjectPath) -> Result<Option<Current>, EngineError> {
    match pointed(storage, table).await? {
        Some((Pointer { target: TableContents::Version(version), full, created }, meta)) => {
            let dir = table.clone().join(version.as_str());
            let full = full.iter().map(|name| table.clone().join(FULL).join(name.as_str())).collect();
            let switched = Some(crate::table_store::instant(&meta));
            return Ok(Some(Current::Files(TableVersion { dir, full, created, switched })));
        }
        Some((Pointer { target: TableContents::Source(source), .. }, _)) => {
            return Ok(Some(Current::External(source)))
        }
        None => {}
    }
    let legacy = storage.objects(table).await.map_err(unavailable)?;
    let dir = table.clone();
    Ok(legacy
        .iter()
        .any(|o| is_parquet(&o.location))
        .then(|| Current::Files(TableVersion { dir, full: Vec::new(), created: None, switched: None })))
}

/// Each table of the project, by name, with where its rows are.
pub(crate) async fn list_tables(
    storage: &Storage,
    project: ProjectId,
) -> Result<Vec<(String, Current)>, EngineError> {
    let mut tables = Vec::new();
    for name in storage.children(&tables_prefix(project)).await.map_err(unavailable)? {
        if !is_table_name(&name) {
            continue;
        }
        if let Some(current) = current(storage, &table_prefix(project, &name)).await? {
            tables.push((name, current));
        }
    }
    tables.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(tables)
}

/// The tables with their sizes, for people.
pub(crate) async fn describe_tables(
    storage: &Storage,
    project: ProjectId,
) -> Result<Vec<TableFiles>, EngineError> {
    let mut described = Vec::new();
    for (name, current) in list_tables(storage, project).await? {
        let info = match current {
            Current::Files(version) => {
                let parquet = version.files(storage).await.map_err(unavailable)?;
                TableFiles {
                    name,
                    location: format!("{}/{}/", storage.location(), version.dir),
                    files: parquet.len() as u64,
                    bytes: parquet.iter().map(|o| o.size).sum(),
                }
            }
            // Read where they are: their size is the source's business.
            Current::External(ExternalSource::Files { url, .. } | ExternalSource::Postgres { url, .. }) => {
                TableFiles { name, location: crate::sources::shown_raw(&url), files: 0, bytes: 0 }
            }
        };
        described.push(info);
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
    session_with(storage, runtime, scheduler, SessionConfig::new())
}

/// An [`empty_session`] for live queries, split into `partitions` (one per core when `None`).
pub(crate) fn live_session(
    storage: &Storage,
    runtime: Option<Arc<RuntimeEnv>>,
    scheduler: Option<&str>,
    partitions: Option<std::num::NonZeroUsize>,
) -> Result<SessionContext, EngineError> {
    let config = SessionConfig::new();
    let config = match partitions {
        Some(partitions) => config.with_target_partitions(partitions.get()),
        None => config,
    };
    session_with(storage, runtime, scheduler, config)
}

/// An [`empty_session`] for reading a few rows (a stored result held in memory): its queries run as one
/// partition, since splitting a few thousand rows across the cores (and merging them again) costs more than it
/// saves.
pub(crate) fn small_session(
    storage: &Storage,
    runtime: Option<Arc<RuntimeEnv>>,
    scheduler: Option<&str>,
) -> Result<SessionContext, EngineError> {
    session_with(storage, runtime, scheduler, SessionConfig::new().with_target_partitions(1))
}

/// An [`empty_session`] for merging `files` sorted files into one: a partition per file (never a file split
/// across partitions, nor two in one), so that each partition is in the files' order.
pub(crate) fn merge_session(storage: &Storage, files: usize) -> Result<SessionContext, EngineError> {
    let config = SessionConfig::new().with_target_partitions(files.max(1)).with_repartition_file_scans(false);
    session_with(storage, None, None, config)
}

/// An [`empty_session`] for importing a staged upload, reading `batch_rows` rows at a time when its records
/// are large (see `records`).
pub(crate) fn import_session(
    storage: &Storage,
    batch_rows: Option<usize>,
) -> Result<SessionContext, EngineError> {
    let config = SessionConfig::new();
    let config = match batch_rows {
        Some(rows) => config.with_batch_size(rows),
        None => config,
    };
    session_with(storage, None, None, config)
}

fn session_with(
    storage: &Storage,
    runtime: Option<Arc<RuntimeEnv>>,
    scheduler: Option<&str>,
    config: SessionConfig,
) -> Result<SessionContext, EngineError> {
    #[cfg(feature = "ballista")]
    if let Some(scheduler) = scheduler {
        return crate::distributed::session(storage, runtime, scheduler);
    }
    #[cfg(not(feature = "ballista"))]
    debug_assert!(scheduler.is_none(), "a scheduler is only ever set with the `ballista` feature");
    let config = config.with_information_schema(false);
    let ctx = match runtime {
        Some(runtime) => SessionContext::new_with_config_rt(config, runtime),
        None => SessionContext::new_with_config(config),
    };
    storage.register(&ctx.runtime_env());
    crate::memory::bound_functions(&ctx, crate::EngineLimits::default().memory_limit);
    Ok(ctx)
}

/// Registers in `ctx` the project's tables that `statement` names, so it sees those and has no way to reach
/// other files, and returns each name looked up with what it found. Only those are registered: a query pays
/// for the tables it reads, and an external source that cannot be read fails only the queries that read it.
/// Names of common table expressions are among the names, which is harmless: they name no table. `_logs`
/// registers the project's run log within `log_retention` (and is not among the names returned).
pub(crate) async fn register_named(
    storage: &Storage,
    ctx: &SessionContext,
    project: ProjectId,
    statement: &datafusion::sql::parser::Statement,
    log_retention: std::time::Duration,
) -> Result<crate::plans::Named, EngineError> {
    // Resolved through the lock: a copy of the session's state costs more than the walk.
    let references = ctx.state_ref().read().resolve_table_references(statement);
    // A statement whose names do not resolve reads nothing; planning it reports why.
    let Ok(references) = references else { return Ok(Vec::new()) };
    let mut named: Vec<&str> = references.iter().map(TableReference::table).collect();
    named.sort_unstable();
    named.dedup();
    // Each named table's own pointer, not a listing of every table: only names a table can have are looked up.
    let mut found = Vec::with_capacity(named.len());
    for name in named.into_iter().filter(|name| is_table_name(name)) {
        let current = current(storage, &table_prefix(project, name)).await?;
        match &current {
            Some(current) => register(storage, ctx, name, current).await?,
            // A table written under the name before the run log took it stays that project's `_logs`.
            None if name == crate::run_log::LOGS_TABLE => {
                crate::run_log::register(storage, ctx, project, log_retention).await?;
            }
            None => {}
        }
        found.push((name.to_owned(), current));
    }
    Ok(found)
}

/// Registers one table in `ctx`, as it is spelled (`"Sales"` in SQL finds `Sales`; a parsed name would fold to
/// `sales`). An external source that cannot be read now fails the query that reads it, saying why.
pub(crate) async fn register(
    storage: &Storage,
    ctx: &SessionContext,
    name: &str,
    current: &Current,
) -> Result<(), EngineError> {
    match current {
        Current::Files(version) if version.full.is_empty() => {
            let table = TableReference::bare(name);
            ctx.register_parquet(table, storage.url_of(&version.dir), ParquetReadOptions::default())
                .await
                .map_err(crate::execute::storage_error)
        }
        // The version's directory and each full file: one table of several paths, read as a directory is.
        Current::Files(version) => {
            let mut urls = vec![storage.url_of(&version.dir)];
            urls.extend(version.full.iter().map(|file| storage.url_of_object(file)));
            let paths = urls
                .iter()
                .map(ListingTableUrl::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(crate::execute::storage_error)?;
            let state = ctx.state();
            let options = ParquetReadOptions::default()
                .to_listing_options(&ctx.copied_config(), ctx.copied_table_options());
            let config = ListingTableConfig::new_with_multi_paths(paths)
                .with_listing_options(options)
                .infer_schema(&state)
                .await
                .map_err(crate::execute::storage_error)?;
            let table = ListingTable::try_new(config).map_err(crate::execute::storage_error)?;
            ctx.register_table(TableReference::bare(name), Arc::new(table))
                .map(|_| ())
                .map_err(crate::execute::storage_error)
        }
        Current::External(source) => storage
            .sources()
            .register(ctx, name, source, storage.bucket().as_ref(), &storage.projects_url())
            .await
            .map_err(|unreadable| match unreadable {
                Unreadable::Refused(why) => EngineError::InvalidQuery(format!("table {name}: {why}")),
                Unreadable::Failed(why) => EngineError::Unavailable(format!("table {name}: {why}").into()),
            }),
    }
}
