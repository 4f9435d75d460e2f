//! A project's tables: one DataFusion session per request, holding only that project's tables.
//!
//! A table is a Delta table at `projects/{id}/tables/{table}/` in the storage (see `tables_delta`): its rows are
//! the Parquet files of its newest version, which one commit of its log switches, on a local disk and on S3
//! alike. Two properties of a version say what else it may be: a table that reads an external source where it
//! is (`endpoints.source`, the source as JSON, and no files), and a table deleted (`endpoints.deleted`), which
//! is no table until a replace writes it again.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::listing::PartitionedFile;
#[cfg(feature = "ballista")]
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::ParquetReadOptions;
use domain::{EngineError, ExternalSource, ProjectId, ReadAt, TableVersion};
use object_store::path::Path as ObjectPath;
use object_store::ObjectMeta;
use tables_delta::{CommitError, DataFile, NewFile, Snapshot};

use crate::hot_tables::{HotTable, HotTables};
use crate::snapshot_scan::{HotRead, SnapshotScan};
use crate::storage::{unavailable, Storage};
use crate::stored::bound::{Appended, AppendedFiles};
use crate::tables::sources::Unreadable;

/// The property of a table version that reads an external source: the source as JSON.
pub(crate) const SOURCE: &str = "endpoints.source";
/// The property of a table version that says the table was deleted.
pub(crate) const DELETED: &str = "endpoints.deleted";

/// A table a project can query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFiles {
    pub name: String,
    /// Where it is, for people (`file:///...` or `s3://...`).
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
    is_table_name(name) && name != LOGS_TABLE
}

/// Each name a query gives a table, with where that table's rows were when the query was planned (`None`: no
/// such table then, as for the name of a common table expression).
pub(crate) type Named = Vec<(String, Option<Current>)>;

/// The name of the table that is a project's run log (`crate::run_log`), which no new table may take.
pub const LOGS_TABLE: &str = "_logs";

/// An external source as a table's property keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct SourceRecord {
    url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    table: Option<String>,
}

impl SourceRecord {
    pub(crate) fn of(source: &ExternalSource) -> Self {
        match source {
            ExternalSource::Files { url, format } => {
                Self { url: url.clone(), format: Some(format.as_str().into()), table: None }
            }
            ExternalSource::Delta { url } => {
                Self { url: url.clone(), format: Some(ExternalSource::DELTA.into()), table: None }
            }
            ExternalSource::Postgres { url, table } => {
                Self { url: url.clone(), format: None, table: Some(table.clone()) }
            }
        }
    }

    pub(crate) fn source(self) -> Option<ExternalSource> {
        match (self.format, self.table) {
            (Some(format), None) if format == ExternalSource::DELTA => {
                Some(ExternalSource::Delta { url: self.url })
            }
            (Some(format), None) => {
                let format = domain::TableFormat::ALL.into_iter().find(|f| f.as_str() == format)?;
                Some(ExternalSource::Files { url: self.url, format })
            }
            (None, Some(table)) => Some(ExternalSource::Postgres { url: self.url, table }),
            _ => None,
        }
    }

    /// The properties of a table version that reads `source`.
    pub(crate) fn properties(source: &ExternalSource) -> HashMap<String, String> {
        let record = serde_json::to_string(&Self::of(source)).expect("a source record is strings");
        HashMap::from([(SOURCE.to_owned(), record)])
    }
}

/// Where a table's rows are now.
#[derive(Debug, Clone)]
pub(crate) enum Current {
    /// The Parquet files of a version of the table.
    Files(Arc<Snapshot>),
    /// An external source, read where it is, since the version that registered it.
    External { source: ExternalSource, since: Arc<Snapshot> },
}

impl PartialEq for Current {
    /// The same version of the same table reads the same rows.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Files(a), Self::Files(b)) => {
                Arc::ptr_eq(a, b) || (a.version == b.version && a.files == b.files)
            }
            (Self::External { source: a, since: x }, Self::External { source: b, since: y }) => {
                a == b && x.version == y.version
            }
            _ => false,
        }
    }
}

/// A table's file as the engine's readers take it.
pub(crate) fn object_meta(file: &DataFile) -> ObjectMeta {
    // A time past what a date holds is taken as the epoch: it only decides whether cached footers are reused.
    let last_modified =
        chrono::DateTime::from_timestamp_millis(file.modified_ms).unwrap_or(chrono::DateTime::UNIX_EPOCH);
    ObjectMeta { location: file.location.clone(), last_modified, size: file.size, e_tag: None, version: None }
}

pub(crate) fn table_error(err: CommitError) -> EngineError {
    match err {
        CommitError::Storage { .. } => EngineError::Unavailable(Box::new(err)),
        CommitError::Columns { reason, .. } => EngineError::InvalidQuery(reason),
        other => EngineError::Internal(Box::new(other)),
    }
}

/// Where a table's rows are, or `None` when there is no such table.
pub(crate) async fn current(storage: &Storage, table: &ObjectPath) -> Result<Option<Current>, EngineError> {
    let Some(snapshot) = storage.tables().snapshot(table).await.map_err(table_error)? else {
        return Ok(None);
    };
    Ok(state_of(snapshot))
}

/// What a version of a table says the table is.
pub(crate) fn state_of(snapshot: Arc<Snapshot>) -> Option<Current> {
    if snapshot.properties.contains_key(DELETED) {
        return None;
    }
    if let Some(record) = snapshot.properties.get(SOURCE) {
        let source = serde_json::from_str::<SourceRecord>(record).ok().and_then(SourceRecord::source)?;
        return Some(Current::External { source, since: snapshot });
    }
    Some(Current::Files(snapshot))
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
            Current::Files(snapshot) => {
                let location = storage.url_of(&table_prefix(project, &name));
                TableFiles { name, location, files: snapshot.files.len() as u64, bytes: snapshot.bytes() }
            }
            // Read where they are: their size is the source's business.
            Current::External { source, .. } => TableFiles {
                name,
                location: crate::tables::sources::shown_raw(source.url()),
                files: 0,
                bytes: 0,
            },
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
/// across partitions, nor two in one), so that each partition is in the files' order. Batches are small: the
/// merge holds one of each file at once, and runs beside the queries it must not crowd (docs/logs.md, Storage).
pub(crate) fn merge_session(storage: &Storage, files: usize) -> Result<SessionContext, EngineError> {
    let config = SessionConfig::new()
        .with_target_partitions(files.max(1))
        .with_repartition_file_scans(false)
        .with_batch_size(1024);
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

/// A session for compaction's sort: it holds at most `memory` bytes and spills the rest to the system's
/// temporary directory, so that sorting a large table's files stays within a bound.
///
/// It sorts in one partition, with a quarter of `memory` kept for merging what it spilled: with a partition per
/// core, each sorter's merge reservation (10 MB by default) was too small for its merge and took from what the
/// others buffered, so a resort of 10M rows within 256 MB failed, again on every retry. One partition also
/// leaves the other cores to the runs and folds that go on meanwhile (compaction is background work).
pub(crate) fn sorting_session(storage: &Storage, memory: usize) -> Result<SessionContext, EngineError> {
    let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
        .with_memory_limit(memory, 1.0)
        .build_arc()
        .map_err(|e| EngineError::Internal(Box::new(e)))?;
    let config = SessionConfig::new().with_target_partitions(1).with_sort_spill_reservation_bytes(memory / 4);
    session_with(storage, Some(runtime), None, config)
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
    let runtime = runtime.unwrap_or_else(|| Arc::new(RuntimeEnv::default()));
    storage.register(&runtime);
    Ok(crate::session::new(config, runtime))
}

/// Registers in `ctx` the project's tables that `statement` names, so it sees those and has no way to reach
/// other files, and returns each name looked up with what it found. Only those are registered: a query pays
/// for the tables it reads, and an external source that cannot be read fails only the queries that read it.
/// Names of common table expressions are among the names, which is harmless: they name no table; nor does
/// `_logs` unless a table had the name before the run log took it (the caller registers the run log then).
pub(crate) async fn register_named(
    storage: &Storage,
    ctx: &SessionContext,
    (project, hot): (ProjectId, Option<&Arc<HotTables>>),
    statement: &datafusion::sql::parser::Statement,
    at: &ReadAt,
) -> Result<Named, EngineError> {
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
        let current = lookup(storage, project, name, at).await?;
        if let Some(current) = &current {
            // Only the newest version of a table is kept decoded: the one runs read, which drops its predecessors'.
            let hot = hot
                .filter(|_| matches!(at, ReadAt::Newest))
                .map(|hot| (Arc::clone(hot), HotTable { project, name: name.to_owned() }));
            register(storage, ctx, (name, hot), current).await?;
        }
        found.push((name.to_owned(), current));
    }
    Ok(found)
}

/// Where the table `name` of the project has its rows at the version `at` says; `None` when it had no such
/// table then.
///
/// # Errors
/// [`EngineError::NoSuchVersion`] when the table has no version that old, or `as_of` is before the table
/// retention (what no version reads any more is removed after it), or a pinned version is no longer kept.
async fn lookup(
    storage: &Storage,
    project: ProjectId,
    name: &str,
    at: &ReadAt,
) -> Result<Option<Current>, EngineError> {
    let table = table_prefix(project, name);
    match at {
        ReadAt::Newest => current(storage, &table).await,
        ReadAt::AsOf(time) => {
            let retention = storage.table_retention();
            if time
                .checked_add(retention.try_into().unwrap_or(time::Duration::MAX))
                .is_some_and(|until| until < storage.now())
            {
                let kept = humantime::format_duration(retention);
                return Err(EngineError::NoSuchVersion(format!(
                    "as_of is earlier than the table retention ({kept}): earlier versions are not kept."
                )));
            }
            let millis = i64::try_from(time.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MIN);
            match storage.tables().snapshot_at(&table, millis).await.map_err(table_error)? {
                Some(snapshot) => Ok(state_of(Arc::new(snapshot))),
                None if storage.tables().exists(&table).await.map_err(table_error)? => {
                    Err(EngineError::NoSuchVersion(format!(
                        "table {name} has no version committed at or before as_of: it was created later."
                    )))
                }
                None => Ok(None),
            }
        }
        ReadAt::Pinned(versions) => {
            let Some(pinned) = versions.iter().find(|pinned| pinned.table == name) else { return Ok(None) };
            let snapshot =
                storage.pinned_snapshot(&table, pinned.version).await.map_err(|err| match err {
                    CommitError::NoVersion { version, .. } => EngineError::NoSuchVersion(format!(
                        "version {version} of table {name} is no longer kept"
                    )),
                    other => table_error(other),
                })?;
            Ok(state_of(snapshot))
        }
    }
}

/// The version of each of the project's tables in `named`, as a cursor pins them.
pub(crate) fn versions_read(named: &Named) -> Vec<TableVersion> {
    let version = |current: &Current| match current {
        Current::Files(snapshot) | Current::External { since: snapshot, .. } => snapshot.version,
    };
    named
        .iter()
        .filter_map(|(name, current)| {
            current.as_ref().map(|current| TableVersion { table: name.clone(), version: version(current) })
        })
        .collect()
}

/// Registers one table in `ctx`, as it is spelled (`"Sales"` in SQL finds `Sales`; a parsed name would fold to
/// `sales`). An external source that cannot be read now fails the query that reads it, saying why.
pub(crate) async fn register(
    storage: &Storage,
    ctx: &SessionContext,
    (name, hot): (&str, Option<HotRead>),
    current: &Current,
) -> Result<(), EngineError> {
    match current {
        Current::Files(snapshot) => {
            let table = snapshot_table(storage, ctx, snapshot, hot).await?;
            ctx.register_table(TableReference::bare(name), table)
                .map(|_| ())
                .map_err(crate::execute::storage_error)
        }
        #[cfg(feature = "ballista")]
        Current::External { source: ExternalSource::Delta { url }, .. }
            if crate::distributed::plans_for_cluster(ctx) =>
        {
            Err(EngineError::InvalidQuery(format!(
                "table {name} reads the Delta table {}, which a Ballista cluster does not read: serve it from an \
                 embedded engine.",
                crate::tables::sources::shown_raw(url)
            )))
        }
        Current::External { source, .. } => storage
            .sources()
            .register(ctx, name, source, storage.bucket().as_ref(), &storage.projects_url())
            .await
            .map_err(|unreadable| match unreadable {
                Unreadable::Refused(why) => EngineError::InvalidQuery(format!("table {name}: {why}")),
                Unreadable::Failed(why) => EngineError::Unavailable(format!("table {name}: {why}").into()),
            }),
    }
}

/// A table reading exactly the files of `snapshot`, with the columns of its files (read from its first file's
/// footer once per process: every file of a table has its columns). Here it is a scan of the files the log
/// names ([`SnapshotScan`]); a cluster's session ships a list of the files' URLs to its scheduler instead.
pub(crate) async fn snapshot_table(
    storage: &Storage,
    ctx: &SessionContext,
    snapshot: &Snapshot,
    hot: Option<HotRead>,
) -> Result<Arc<dyn datafusion::catalog::TableProvider>, EngineError> {
    let Some(first) = snapshot.files.first() else {
        let empty = datafusion::datasource::empty::EmptyTable::new(Arc::clone(&snapshot.schema));
        return Ok(Arc::new(empty));
    };
    let options =
        ParquetReadOptions::default().to_listing_options(&ctx.copied_config(), ctx.copied_table_options());
    #[cfg(feature = "ballista")]
    if crate::distributed::plans_for_cluster(ctx) {
        return listed_table(storage, ctx, snapshot, options).await;
    }
    let schema = match storage.scanned_schemas().get(&first.location) {
        Some(schema) => schema,
        None => {
            let store = ctx
                .runtime_env()
                .object_store(storage.engine_store_url())
                .map_err(crate::execute::storage_error)?;
            let meta = [engine_meta(storage, first)];
            let schema = options
                .format
                .infer_schema(&ctx.state(), &store, &meta)
                .await
                .map_err(crate::execute::storage_error)?;
            storage.scanned_schemas().insert(first.location.clone(), Arc::clone(&schema));
            schema
        }
    };
    Ok(Arc::new(files_scan(storage, ctx, &snapshot.files, schema).reading_decoded(hot, snapshot.version)))
}

/// A scan of exactly `files` of a table's log, read with `schema`, the sizes and times the log gives.
pub(crate) fn files_scan(
    storage: &Storage,
    ctx: &SessionContext,
    files: &[DataFile],
    schema: datafusion::arrow::datatypes::SchemaRef,
) -> SnapshotScan {
    let rows = files.iter().map(|file| file.rows).sum();
    let files = files.iter().map(|file| engine_meta(storage, file)).collect();
    SnapshotScan::new(schema, storage.engine_store_url().clone(), (files, rows), parquet_format(ctx))
}

/// A table of `schema` whose scan reads the appended files each execution binds (a fold's kept plan).
pub(crate) fn appended_files(
    storage: &Storage,
    ctx: &SessionContext,
    schema: datafusion::arrow::datatypes::SchemaRef,
) -> AppendedFiles {
    AppendedFiles::new(schema, storage.engine_store_url().clone(), parquet_format(ctx))
}

/// `files` of a table's log as a fold's scan reads them: from memory when `hot` keeps every one of them
/// decoded, of the table's columns (`schema`), with the columns the scan reads (it decides when it executes),
/// else from storage, with the sizes and times the log gives.
pub(crate) fn appended(
    storage: &Storage,
    hot: Option<&HotRead>,
    files: &[DataFile],
    schema: &datafusion::arrow::datatypes::Schema,
) -> Appended {
    let metas: Vec<ObjectMeta> = files.iter().map(|file| engine_meta(storage, file)).collect();
    let kept = hot.map(|(hot, table)| hot.kept_of(table, &metas, Some(&[])));
    let files = metas.into_iter().map(PartitionedFile::new_from_meta).collect();
    match kept {
        Some((decoded, stored))
            if stored.is_empty() && decoded.iter().all(|file| file.reads(schema, Some(&[]))) =>
        {
            Appended::Decoded { decoded, files }
        }
        _ => Appended::Files(files),
    }
}

/// A file an append added to a table, as its scans name it (with the size and time its log entry gives).
pub(crate) fn new_file_meta(storage: &Storage, file: &NewFile) -> ObjectMeta {
    let logged = DataFile {
        location: file.location.clone(),
        size: file.size,
        rows: Some(file.rows),
        modified_ms: file.modified_ms,
    };
    engine_meta(storage, &logged)
}

/// Tables' files as `ctx` reads Parquet.
fn parquet_format(ctx: &SessionContext) -> Arc<dyn FileFormat> {
    ParquetReadOptions::default().to_listing_options(&ctx.copied_config(), ctx.copied_table_options()).format
}

/// A file of a snapshot as the engine's object store names it, with the size and time the log gives.
fn engine_meta(storage: &Storage, file: &DataFile) -> ObjectMeta {
    ObjectMeta {
        location: storage.engine_path(&file.location),
        last_modified: chrono::DateTime::from_timestamp_millis(file.modified_ms)
            .unwrap_or(chrono::DateTime::UNIX_EPOCH),
        size: file.size,
        e_tag: None,
        version: None,
    }
}

/// `snapshot` as a table of its files' URLs, which a cluster's scheduler can ship to its executors.
#[cfg(feature = "ballista")]
async fn listed_table(
    storage: &Storage,
    ctx: &SessionContext,
    snapshot: &Snapshot,
    options: datafusion::datasource::listing::ListingOptions,
) -> Result<Arc<dyn datafusion::catalog::TableProvider>, EngineError> {
    let paths = snapshot
        .files
        .iter()
        .map(|file| ListingTableUrl::parse(storage.url_of_object(&file.location)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(crate::execute::storage_error)?;
    let config = ListingTableConfig::new_with_multi_paths(paths)
        .with_listing_options(options)
        .infer_schema(&ctx.state())
        .await
        .map_err(crate::execute::storage_error)?;
    let table = ListingTable::try_new(config).map_err(crate::execute::storage_error)?;
    Ok(Arc::new(table))
}
