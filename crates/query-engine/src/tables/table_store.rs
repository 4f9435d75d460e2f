//! Tables over HTTP: the domain's `TableStore` on the engine's storage.
//!
//! An upload is streamed, as it arrives, to a staging object (`projects/{id}/staging/{uuid}/body.{ext}`) whose bytes
//! are counted against the limit, so a body of any size needs a buffer's worth of memory. Once the body is
//! whole, the staged object is read like a file the CLI imports and written as the table's Parquet: a replace
//! as an overwrite commit of the table's Delta log, an append as a commit adding its file (with others of a
//! group commit). The staged object is removed either way. A body that is cut off, too
//! large or malformed, or rows that do not fit the table, leave the table as it was.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::TableReference;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use domain::{
    Compaction, EngineError, ExternalSource, Findable, Invalid, KeptTables, Page, PageRequest, ProjectId,
    TableColumn, TableCommit, TableFormat, TableInfo, TableName, TableSource, TableStore, TaggedWrite,
    Upload, UploadError, WriteMode, Written,
};
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt};
use tables_delta::Snapshot;
use tracing::instrument;

use crate::storage::{unavailable, Storage};
use crate::tables::catalog::{
    current, empty_session, list_tables, object_meta, state_of, table_error, table_prefix, Current,
    SourceRecord, DELETED,
};
use crate::tables::files::{instant, instant_ms, rows_of, FileRows};
use crate::tables::imports::{import_staged, table_schema, HeldBody, ImportMode, Keyed, StagedError};
use crate::tables::quarantine::QUARANTINE_BODY_BYTES;
use crate::tables::records::RecordSizes;
use crate::tables::spool::Spool;
use crate::DataFusionEngine;

fn staging_prefix(project: ProjectId) -> ObjectPath {
    ObjectPath::from_iter(["projects", &project.to_string(), "staging"])
}

/// `reason` with every mention of the staged body (a URL or a path, however the engine spelled it: each word
/// that names its directory, which is unique) said as the client knows it: the body.
fn the_body(reason: &str, staged: &ObjectPath) -> String {
    let unique = staged.filename().unwrap_or("staging");
    reason
        .split_inclusive(char::is_whitespace)
        .map(|word| {
            if word.contains(unique) {
                let space = &word[word.trim_end().len()..];
                format!("the body{space}")
            } else {
                word.to_owned()
            }
        })
        .collect()
}

/// A body staged: where, its size, and the rows its import reads at a time (see `records`).
struct Staged {
    directory: ObjectPath,
    bytes: u64,
    batch_rows: Option<usize>,
}

/// An append's body up to this size is held in memory and written with the other appends to its table that
/// arrive meanwhile (`appends`); a larger one, and every replace, is staged and written alone.
const HELD_BODY_BYTES: u64 = 1 << 20;

/// A body as received: held in memory, or staged in the storage.
enum Received {
    Held { chunks: Vec<bytes::Bytes>, bytes: u64 },
    Staged(Staged),
}

/// Receives the body, measuring its records as they pass: held in memory while it is at most `hold` bytes,
/// otherwise written to disk as it arrives ([`Spool`]) for a new staging object, alone in its own directory.
/// Nothing is left behind on error.
async fn receive(
    storage: &Storage,
    project: ProjectId,
    upload: &mut Upload,
    hold: u64,
) -> Result<Received, UploadError> {
    let directory = staging_prefix(project).join(uuid::Uuid::new_v4().to_string());
    let path = directory.clone().join(format!("body.{}", upload.format.as_str()));
    let mut records = RecordSizes::of(upload.format);
    let mut held: Vec<bytes::Bytes> = Vec::new();
    let mut writer: Option<Spool> = None;
    let mut size = 0_u64;
    let failed = loop {
        let Some(chunk) = upload.body.next().await else {
            break records.as_mut().and_then(|r| r.finish().err()).map(UploadError::Invalid);
        };
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(err) => break Some(UploadError::CutOff(Box::new(err))),
        };
        size += chunk.len() as u64;
        if size > upload.limit_bytes {
            break Some(UploadError::TooLarge { limit_bytes: upload.limit_bytes });
        }
        if let Some(Err(too_long)) = records.as_mut().map(|r| r.feed(&chunk)) {
            break Some(UploadError::Invalid(too_long));
        }
        if writer.is_none() && size <= hold {
            held.push(chunk);
            continue;
        }
        let sink = match &mut writer {
            Some(sink) => sink,
            None => match Spool::new(storage, path.clone()) {
                Ok(sink) => writer.insert(sink),
                Err(err) => break Some(UploadError::Engine(unavailable(err))),
            },
        };
        let mut put = Ok(());
        for part in held.drain(..).chain(std::iter::once(chunk)) {
            put = sink.put(part).await;
            if put.is_err() {
                break;
            }
        }
        if let Err(err) = put {
            break Some(UploadError::Engine(unavailable(err)));
        }
    };
    let failed = failed.or_else(|| {
        (size == 0).then(|| UploadError::Invalid("The body is empty: send the table's rows.".into()))
    });
    let Some(writer) = writer else {
        return match failed {
            Some(err) => Err(err),
            None => Ok(Received::Held { chunks: held, bytes: size }),
        };
    };
    if let Some(err) = failed {
        if let Err(abort) = writer.abort().await {
            tracing::warn!(location = %path, error = %abort, "cannot abort a staged upload");
        }
        return Err(err);
    }
    writer.finish().await.map_err(|e| UploadError::Engine(unavailable(e)))?;
    Ok(Received::Staged(Staged { directory, bytes: size, batch_rows: records.map(|r| r.batch_rows()) }))
}

/// A table's record, from its version in the log (files, sizes, rows, times) and its first file's columns.
async fn describe(
    storage: &Storage,
    rows: &FileRows,
    name: TableName,
    snapshot: &Snapshot,
) -> Result<TableInfo, EngineError> {
    let columns = match crate::tables::imports::existing_schema(storage, snapshot).await {
        Ok(schema) => table_columns(&schema),
        Err(err) => return Err(EngineError::Internal(err.to_string().into())),
    };
    // Rows the log does not state (a file another writer added without statistics) are read from footers.
    let mut row_count = 0;
    for file in &snapshot.files {
        row_count += match file.rows {
            Some(rows) => rows,
            None => rows_of(storage.store().as_ref(), &object_meta(file), Some(rows)).await?,
        };
    }
    let committed_at = instant_ms(snapshot.committed_ms);
    let created_at = snapshot.created_ms.map_or(committed_at, instant_ms);
    // A file system's times are coarser than the clock's: never before the table was created.
    let updated_at = committed_at.max(created_at);
    Ok(TableInfo {
        name,
        columns,
        row_count: Some(row_count),
        bytes: Some(snapshot.bytes()),
        files: Some(snapshot.files.len() as u64),
        last_compacted_at: crate::tables::compaction::compacted_at(snapshot),
        layout: crate::tables::compaction::layout_of(snapshot),
        source: TableSource::Upload,
        created_at,
        updated_at,
    })
}

/// The columns (from the first file) and the rows of Parquet files, from their footers (or `known`, for files
/// of the storage whose rows were read before).
async fn footers(
    store: &dyn object_store::ObjectStore,
    parquet: &[&ObjectMeta],
    known: Option<&FileRows>,
) -> Result<(Vec<TableColumn>, u64), EngineError> {
    let mut columns = Vec::new();
    let mut row_count = 0;
    for (i, meta) in parquet.iter().enumerate() {
        if i == 0 {
            let footer = DFParquetMetadata::new(store, meta);
            let schema = footer.fetch_schema().await.map_err(|e| EngineError::Internal(Box::new(e)))?;
            columns = table_columns(&schema);
        }
        row_count += rows_of(store, meta, known).await?;
    }
    Ok((columns, row_count))
}

fn table_columns(schema: &datafusion::arrow::datatypes::Schema) -> Vec<TableColumn> {
    let types = crate::types::columns(schema);
    schema
        .fields()
        .iter()
        .zip(types)
        .map(|(field, column)| TableColumn {
            name: column.name,
            column_type: column.column_type,
            nullable: field.is_nullable(),
        })
        .collect()
}

/// The record of a table that reads an external source: its columns as the engine reads them, and for files
/// their size and (Parquet) rows. A source that cannot be read now shows no columns; a query of it says why.
async fn describe_external(
    storage: &Storage,
    name: TableName,
    source: ExternalSource,
    since: &Snapshot,
) -> Result<TableInfo, EngineError> {
    let registered_at = instant_ms(since.committed_ms);
    let created_at = since.created_ms.map_or(registered_at, instant_ms);
    let mut info = TableInfo {
        name,
        columns: Vec::new(),
        row_count: None,
        bytes: None,
        files: None,
        last_compacted_at: None,
        layout: domain::TableLayout::default(),
        source: TableSource::External(source.clone()),
        created_at,
        // A file system's times are coarser than the clock's: never before the table was created.
        updated_at: registered_at.max(created_at),
    };
    let ctx = empty_session(storage, None, None)?;
    let read = async {
        let current = Current::External { source: source.clone(), since: Arc::new(since.clone()) };
        crate::tables::catalog::register(storage, &ctx, (info.name.as_str(), None), &current).await?;
        let provider = ctx
            .table_provider(TableReference::bare(info.name.as_str()))
            .await
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        info.columns = table_columns(&provider.schema());
        if let ExternalSource::Files { url, format } = &source {
            let (store, files) = storage
                .sources()
                .files(&ctx, url, *format, storage.bucket().as_ref(), &storage.projects_url())
                .await
                .map_err(|e| EngineError::Unavailable(e.into()))?;
            info.bytes = Some(files.iter().map(|m| m.size).sum());
            info.files = Some(files.len() as u64);
            if *format == TableFormat::Parquet {
                let metas: Vec<&ObjectMeta> = files.iter().collect();
                info.row_count = Some(footers(store.as_ref(), &metas, None).await?.1);
            }
            if let Some(latest) = files.iter().map(instant).max() {
                info.updated_at = info.updated_at.max(latest);
            }
        }
        if let ExternalSource::Delta { url } = &source {
            let (_, snapshot) = storage
                .sources()
                .delta_table(&ctx, url, storage.bucket().as_ref(), &storage.projects_url())
                .await
                .map_err(|e| EngineError::Unavailable(e.into()))?;
            info.row_count = snapshot.rows();
            info.bytes = Some(snapshot.bytes());
            info.files = Some(snapshot.files.len() as u64);
            info.updated_at = info.updated_at.max(instant_ms(snapshot.committed_ms));
        }
        Ok::<_, EngineError>(())
    };
    if let Err(err) = read.await {
        tracing::warn!(table = %info.name, error = %err, "cannot read a table's external source");
    }
    // The record shows where the rows are, never a password.
    info.source = TableSource::External(source.shown_as(crate::tables::sources::shown_raw));
    Ok(info)
}

/// Where a table's rows are, described.
async fn describe_current(
    storage: &Storage,
    rows: &FileRows,
    name: TableName,
    current: Current,
) -> Result<TableInfo, EngineError> {
    match current {
        Current::Files(snapshot) => describe(storage, rows, name, &snapshot).await,
        Current::External { source, since } => describe_external(storage, name, source, &since).await,
    }
}

/// Makes a table read `source`: checked allowed and readable (a files source has files), then one commit of the
/// table's log switches it (its own files leave the table, and go with the next vacuum). Returns whether it
/// created the table.
async fn register_source(
    storage: &Storage,
    project: ProjectId,
    name: &str,
    source: ExternalSource,
) -> Result<bool, UploadError> {
    let refused = |reason: crate::tables::sources::Unreadable| {
        UploadError::Rejected(Invalid::field("source", reason.to_string()))
    };
    let ctx = empty_session(storage, None, None)?;
    storage
        .sources()
        .register(&ctx, name, &source, storage.bucket().as_ref(), &storage.projects_url())
        .await
        .map_err(refused)?;
    let provider = ctx
        .table_provider(TableReference::bare(name))
        .await
        .map_err(|e| UploadError::Engine(EngineError::Internal(Box::new(e))))?;
    let prefix = table_prefix(project, name);
    let created = current(storage, &prefix).await?.is_none();
    let schema = crate::tables::imports::plain(&provider.schema());
    let created_ms = created.then(|| storage.now_ms());
    storage
        .tables()
        .replace(&prefix, &schema, &[], &SourceRecord::properties(&source), created_ms)
        .await
        .map_err(|e| UploadError::Engine(table_error(e)))?;
    Ok(created)
}

/// Whether the quarantine table `name` (its columns, as `found`) can take rows set aside: there is none yet, or it
/// has the quarantine's columns and is not an external source.
fn quarantine_fits(
    name: &TableName,
    found: Result<Option<datafusion::arrow::datatypes::SchemaRef>, StagedError>,
) -> Result<(), UploadError> {
    let refused = |why: &str| {
        UploadError::Rejected(Invalid::field(
            "on_error",
            format!(
                "Rows that do not fit go to the table {name}, which {why}: rename or delete it, or send the body \
                 without on_error=quarantine. Nothing was added."
            ),
        ))
    };
    let expected = crate::tables::quarantine::quarantine_schema();
    match found {
        Ok(None) => Ok(()),
        Ok(Some(schema)) => {
            let same = schema.fields().len() == expected.fields().len()
                && schema
                    .fields()
                    .iter()
                    .zip(expected.fields())
                    .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
            if same {
                Ok(())
            } else {
                Err(refused("is not a quarantine table (received_at, line, raw, error)"))
            }
        }
        Err(StagedError::External) => Err(refused("reads an external source")),
        Err(err) => Err(staged_error(err, None)),
    }
}

impl DataFusionEngine {
    /// Appends the records of a body that fit the table, and writes the others to its quarantine table.
    async fn append_quarantining(
        &self,
        project: ProjectId,
        name: &TableName,
        mut upload: Upload,
    ) -> Result<Written, UploadError> {
        let quarantine = upload.quarantine_table(name).map_err(UploadError::Rejected)?;
        let format = upload.format;
        upload.limit_bytes = upload.limit_bytes.min(QUARANTINE_BODY_BYTES);
        // The body arrives before a turn is taken (a client sending slowly holds none): held when small, staged
        // otherwise. Bodies held whole for sorting are bounded in number, whoever sends them.
        let received = receive(&self.storage, project, &mut upload, HELD_BODY_BYTES).await?;
        let _turn = self.appends.sort_turn().await;
        let (body, bytes) = match received {
            Received::Held { chunks, bytes } => (bytes::Bytes::from(chunks.concat()), bytes),
            Received::Staged(staged) => (self.read_staged(&staged, upload.format).await?, staged.bytes),
        };
        let (storage, table, aside) =
            (self.storage.clone(), name.as_str().to_owned(), quarantine.as_str().to_owned());
        let (sorted, aside) = self
            .runtime
            .run(async move {
                let schema = table_schema(&storage, project, &table).await;
                let sorted = schema
                    .map(|found| found.map(|schema| crate::tables::quarantine::sort(&body, format, &schema)));
                // The quarantine table is read only when there are rows to set aside.
                let bad = matches!(&sorted, Ok(Some(Ok(sorted))) if !sorted.bad.is_empty());
                let aside = if bad { Some(table_schema(&storage, project, &aside).await) } else { None };
                Ok((sorted, aside))
            })
            .await
            .map_err(UploadError::Engine)?;
        let sorted = match sorted.map_err(|err| staged_error(err, None))? {
            Some(Ok(sorted)) => sorted,
            Some(Err(reason)) => return Err(UploadError::Invalid(reason)),
            None => return Err(UploadError::NoSuchTable),
        };
        // Where the bad rows go is checked before any row lands: a refusal then leaves both tables as they were
        // (and frees the body's idempotency key with nothing written under it). The bad rows are written first:
        // when they cannot be set aside, no good row has landed either.
        if let Some(aside) = aside {
            quarantine_fits(&quarantine, aside)?;
            let now = domain::Clock::now(&domain::SystemClock);
            let received_at = i64::try_from(now.unix_timestamp_nanos() / 1_000).unwrap_or(i64::MAX);
            let parquet = crate::tables::quarantine::quarantine_body(&sorted.bad, received_at)
                .map_err(|e| UploadError::Engine(EngineError::Internal(e.into())))?;
            self.set_aside(project, &quarantine, parquet).await?;
        }
        let mut rows = 0;
        if sorted.good_rows > 0 {
            let tag = upload.tag.as_ref().map(|tag| Keyed::of(tag, bytes));
            let body = HeldBody { bytes: sorted.good, format, tag };
            let lock = self.table_locks.of(project, name.as_str());
            rows = self
                .appends
                .append(&self.runtime, (&self.storage, self.hot_here()), lock, project, name.as_str(), body)
                .await
                .map_err(|err| staged_error(err, None))?;
            self.appended.mark(project, name.as_str());
        }
        Ok(Written { rows, bytes, created: false, rows_quarantined: sorted.bad.len() as u64 })
    }

    /// A staged body of `format`, read whole, and then removed from the staging area.
    async fn read_staged(&self, staged: &Staged, format: TableFormat) -> Result<bytes::Bytes, UploadError> {
        let location = staged.directory.clone().join(format!("body.{}", format.as_str()));
        let read = async { self.storage.store().get(&location).await?.bytes().await }.await;
        if let Err(err) = self.storage.remove_prefix(&staged.directory).await {
            tracing::warn!(location = %staged.directory, error = %err, "cannot remove a staged upload");
        }
        read.map_err(|err| UploadError::Engine(unavailable(err)))
    }

    /// Adds rows (a Parquet body of its columns) to a quarantine table, creating it the first time.
    async fn set_aside(
        &self,
        project: ProjectId,
        name: &TableName,
        parquet: bytes::Bytes,
    ) -> Result<(), UploadError> {
        let lock = self.table_locks.of(project, name.as_str());
        let _held = lock.lock().await;
        let exists = current(&self.storage, &table_prefix(project, name.as_str())).await?.is_some();
        let mode = if exists { WriteMode::Append } else { WriteMode::Replace };
        let limit_bytes = parquet.len() as u64;
        let mut upload = Upload {
            format: TableFormat::Parquet,
            mode,
            body: Box::pin(futures_util::stream::iter([Ok(parquet)])),
            limit_bytes,
            tag: None,
            quarantine: false,
        };
        let Received::Staged(staged) = receive(&self.storage, project, &mut upload, 0).await? else {
            return Err(UploadError::Engine(EngineError::Internal(
                "quarantined rows were not staged".into(),
            )));
        };
        self.import(project, name, (mode, TableFormat::Parquet), &staged, None).await?;
        self.appended.mark(project, name.as_str());
        Ok(())
    }

    /// Imports a staged body into a table (the caller holds the table's lock) and removes it; answers the rows
    /// and whether the table was created.
    async fn import(
        &self,
        project: ProjectId,
        name: &TableName,
        (mode, format): (WriteMode, TableFormat),
        staged: &Staged,
        tag: Option<Keyed>,
    ) -> Result<(u64, bool), UploadError> {
        let mode = match mode {
            WriteMode::Replace => ImportMode::Replace,
            WriteMode::Append => ImportMode::Append,
        };
        let storage = self.storage.clone();
        let table = name.as_str().to_owned();
        let (target, batch_rows) = (staged.directory.clone(), staged.batch_rows);
        // Reading and writing the rows is the engine's work, on its threads.
        let imported = self
            .runtime
            .run(async move {
                let tag = tag.as_ref();
                Ok(import_staged(&storage, project, &table, &target, format, mode, batch_rows, tag).await)
            })
            .await;
        if let Err(err) = self.storage.remove_prefix(&staged.directory).await {
            tracing::warn!(location = %staged.directory, error = %err, "cannot remove a staged upload");
        }
        match imported {
            Ok(Ok(imported)) => Ok(imported),
            // The engine failed on the body itself (it panicked reading a malformed file): the body's fault.
            Err(EngineError::InvalidQuery(reason)) => {
                Err(UploadError::Invalid(the_body(&reason, &staged.directory)))
            }
            Ok(Err(err)) => Err(staged_error(err, Some(&staged.directory))),
            Err(engine) => Err(UploadError::Engine(engine)),
        }
    }
}

/// An import's failure as the upload's; a reason that names where the body was staged names "the body".
fn staged_error(err: StagedError, staged: Option<&ObjectPath>) -> UploadError {
    match err {
        StagedError::Invalid(reason) => {
            UploadError::Invalid(staged.map_or_else(|| reason.clone(), |at| the_body(&reason, at)))
        }
        StagedError::NoSuchTable => UploadError::NoSuchTable,
        StagedError::TakenOver => UploadError::TakenOver,
        StagedError::External => UploadError::Rejected(Invalid::field(
            "table",
            "The table reads an external source where it is: add the rows there, or replace the table with PUT.",
        )),
        StagedError::Write(reason) => UploadError::Engine(EngineError::Unavailable(reason.into())),
    }
}

/// The tables' versions this process keeps follow the writes every process announces.
impl KeptTables for DataFusionEngine {
    fn written(&self, project: ProjectId, name: &TableName) {
        self.storage.tables().written(&table_prefix(project, name.as_str()));
    }

    fn hearing(&self, heard: bool) {
        self.storage.tables().hearing(heard);
    }
}

#[async_trait]
impl TableStore for DataFusionEngine {
    #[instrument(skip_all, fields(project = %project))]
    async fn list(&self, project: ProjectId) -> Result<Vec<TableInfo>, EngineError> {
        let (storage, rows) = (self.storage.clone(), self.file_rows.clone());
        // On the engine's threads: a database source's connections live there.
        self.runtime
            .run(async move {
                let mut tables = Vec::new();
                for (name, current) in list_tables(&storage, project).await? {
                    // Tables the CLI wrote under names the API does not take are left to the CLI.
                    if let Ok(name) = TableName::parse(&name) {
                        tables.push(describe_current(&storage, &rows, name, current).await?);
                    }
                }
                Ok(tables)
            })
            .await
    }

    #[instrument(skip_all, fields(project = %project, table = %name))]
    async fn get(&self, project: ProjectId, name: &TableName) -> Result<Option<TableInfo>, EngineError> {
        let (storage, rows, name) = (self.storage.clone(), self.file_rows.clone(), name.clone());
        self.runtime
            .run(async move {
                match current(&storage, &table_prefix(project, name.as_str())).await? {
                    Some(found) => Ok(Some(describe_current(&storage, &rows, name, found).await?)),
                    None => Ok(None),
                }
            })
            .await
    }

    #[instrument(skip_all, fields(project = %project, table = %name))]
    async fn versions(
        &self,
        project: ProjectId,
        name: &TableName,
        request: PageRequest,
    ) -> Result<Option<Page<TableCommit>>, EngineError> {
        let prefix = table_prefix(project, name.as_str());
        let tables = self.storage.tables();
        let Some(newest) = tables.snapshot(&prefix).await.map_err(table_error)? else { return Ok(None) };
        if state_of(Arc::clone(&newest)).is_none() {
            return Ok(None);
        }
        // Versions are numbered from 0 without gaps: the newest says how many there are.
        let total = newest.version + 1;
        let before = total.saturating_sub(request.offset);
        let limit = usize::try_from(request.limit).unwrap_or(usize::MAX);
        let commits = tables.commits(&prefix, before, limit).await.map_err(table_error)?;
        let items = commits
            .into_iter()
            .map(|commit| TableCommit {
                version: commit.version,
                at: instant_ms(commit.at_ms),
                operation: commit.operation,
                rows_added: commit.rows_added,
                rows_removed: commit.rows_removed,
            })
            .collect();
        Ok(Some(Page { items, total, request }))
    }

    #[instrument(skip_all, fields(project = %project, table = %name, format = upload.format.as_str()))]
    async fn write(
        &self,
        project: ProjectId,
        name: &TableName,
        mut upload: Upload,
    ) -> Result<Written, UploadError> {
        let started = std::time::Instant::now();
        if upload.quarantine && upload.mode == WriteMode::Append {
            return self.append_quarantining(project, name, upload).await;
        }
        // Only while there is room for it among the bodies held by all clients: a flood of slow appends is
        // staged in the storage rather than held.
        let place = match (upload.mode, upload.format) {
            (WriteMode::Append, TableFormat::Csv | TableFormat::NdJson) => self.appends.try_hold(),
            _ => None,
        };
        let hold = if place.is_some() { HELD_BODY_BYTES } else { 0 };
        let lock = self.table_locks.of(project, name.as_str());
        let (rows, bytes, created) = match receive(&self.storage, project, &mut upload, hold).await? {
            Received::Held { chunks, bytes } => {
                let tag = upload.tag.as_ref().map(|tag| Keyed::of(tag, bytes));
                let body = HeldBody { bytes: chunks.concat().into(), format: upload.format, tag };
                let appended = self
                    .appends
                    .append(
                        &self.runtime,
                        (&self.storage, self.hot_here()),
                        lock,
                        project,
                        name.as_str(),
                        body,
                    )
                    .await;
                drop(place);
                let rows = appended.map_err(|err| staged_error(err, None))?;
                (rows, bytes, false)
            }
            Received::Staged(staged) => {
                drop(place);
                let _held = lock.lock().await;
                let tag = upload.tag.as_ref().map(|tag| Keyed::of(tag, staged.bytes));
                let (rows, created) =
                    self.import(project, name, (upload.mode, upload.format), &staged, tag).await?;
                (rows, staged.bytes, created)
            }
        };
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // A table appended to, or written with full files, has files its next compaction may merge or sort.
        if upload.mode == WriteMode::Append || rows >= crate::tables::compaction::FULL_FILE_ROWS {
            self.appended.mark(project, name.as_str());
        }
        if upload.mode == WriteMode::Append {
            // A stream of appends would be a stream of lines: they are counted by the request metrics instead.
            tracing::debug!(rows, bytes, took_ms, "rows appended to a table");
        } else {
            tracing::info!(rows, bytes, took_ms, "table written from an upload");
        }
        Ok(Written { rows, bytes, created, rows_quarantined: 0 })
    }

    fn appended(&self) -> Vec<(ProjectId, TableName)> {
        let all = self.appended.all().into_iter();
        all.filter_map(|(project, table)| Some((project, TableName::parse(&table).ok()?))).collect()
    }

    #[instrument(skip_all, fields(project = %project, table = %name))]
    async fn compact(
        &self,
        project: ProjectId,
        name: &TableName,
        keep: Findable,
        cluster_by: Vec<String>,
    ) -> Result<Option<Compaction>, EngineError> {
        // Taken first: an append from now on makes the table a candidate again.
        self.appended.take(project, name.as_str());
        let (storage, rows, table) = (self.storage.clone(), self.file_rows.clone(), name.as_str().to_owned());
        let lock = self.table_locks.of(project, name.as_str());
        let (after, keep) = (keep.after, keep.pending.into_iter().collect());
        let sweep = self.appended.sweep_due(project, name.as_str());
        let compacted = self
            .runtime
            .run(async move {
                let plan = ((&keep, after), cluster_by.as_slice());
                crate::tables::compaction::compact(&storage, &rows, lock, (project, &table), plan, sweep)
                    .await
            })
            .await;
        // A table that failed, or has more files to sort than one compaction takes, is a candidate again.
        if compacted.as_ref().map_or(true, |compacted| compacted.more) {
            self.appended.mark(project, name.as_str());
        }
        compacted.map(|compacted| compacted.done)
    }

    async fn newest_version(&self, project: ProjectId, name: &TableName) -> Result<Option<u64>, EngineError> {
        let (storage, prefix) = (self.storage.clone(), table_prefix(project, name.as_str()));
        let current = self.runtime.run(async move { current(&storage, &prefix).await }).await?;
        Ok(match current {
            Some(Current::Files(snapshot)) => Some(snapshot.version),
            Some(Current::External { .. }) | None => None,
        })
    }

    #[instrument(skip_all, fields(project = %project, table = %name))]
    async fn pin_layout(
        &self,
        project: ProjectId,
        name: &TableName,
        columns: Option<Vec<String>>,
    ) -> Result<bool, EngineError> {
        let prefix = table_prefix(project, name.as_str());
        if current(&self.storage, &prefix).await?.is_none() {
            return Ok(false);
        }
        let value = columns.as_deref().map(crate::tables::layout::pin_property);
        let tables = self.storage.tables();
        tables.set_layout(&prefix, tables_delta::LAYOUT_PINNED, value).await.map_err(table_error)?;
        tracing::info!(?columns, "the table's layout was set");
        Ok(true)
    }

    #[instrument(skip_all, fields(project = %project, table = %name))]
    async fn holds(
        &self,
        project: ProjectId,
        name: &TableName,
        write_id: uuid::Uuid,
    ) -> Result<Option<TaggedWrite>, EngineError> {
        let (storage, table) = (self.storage.clone(), name.as_str().to_owned());
        let found =
            self.runtime
                .run(async move {
                    crate::tables::compaction::find_tagged(&storage, project, &table, write_id).await
                })
                .await?;
        Ok(found.map(|append| TaggedWrite {
            written: Written { rows: append.rows, bytes: append.bytes, created: false, rows_quarantined: 0 },
            body_sha256: append.body_sha256,
        }))
    }

    #[instrument(skip_all, fields(project = %project, table = %name))]
    async fn register(
        &self,
        project: ProjectId,
        name: &TableName,
        source: ExternalSource,
    ) -> Result<bool, UploadError> {
        let lock = self.table_locks.of(project, name.as_str());
        let _held = lock.lock().await;
        let (storage, table) = (self.storage.clone(), name.as_str().to_owned());
        let format = TableSource::External(source.clone()).format();
        let registered = self
            .runtime
            .run(async move { Ok(register_source(&storage, project, &table, source).await) })
            .await
            .map_err(UploadError::Engine)?;
        if registered.is_ok() {
            tracing::info!(format, "table registered to read an external source");
        }
        registered
    }

    #[instrument(skip_all, fields(project = %project, table = %name))]
    async fn delete(&self, project: ProjectId, name: &TableName) -> Result<bool, EngineError> {
        let lock = self.table_locks.of(project, name.as_str());
        let _held = lock.lock().await;
        let prefix = table_prefix(project, name.as_str());
        let tables = self.storage.tables();
        let Some(snapshot) = tables.snapshot(&prefix).await.map_err(table_error)? else { return Ok(false) };
        if state_of(Arc::clone(&snapshot)).is_none() {
            return Ok(false);
        }
        // One commit that leaves the table without files, marked deleted: every process sees it at its next
        // read, and a later replace writes the table again. The files go with the vacuum after the retention.
        let deleted = HashMap::from([(DELETED.to_owned(), "true".to_owned())]);
        tables.replace(&prefix, &snapshot.schema, &[], &deleted, None).await.map_err(table_error)?;
        Ok(true)
    }
}
