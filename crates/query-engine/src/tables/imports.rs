//! Loading data into a project's tables: files in Parquet, CSV (with a header) or NDJSON become Parquet files
//! under `projects/{id}/tables/{table}/` in the storage, which one commit of the table's Delta log makes part of
//! it (see `catalog`): a replace's files become the whole table, an append's join it. Nothing reads a file before
//! its commit; a failed import removes what it wrote and leaves the table as it was.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::file_format::options::JsonReadOptions;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::parquet::arrow::AsyncArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::metadata::KeyValue;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use domain::{ProjectId, TableFormat};
use futures_util::StreamExt;
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

use std::collections::HashMap;

use tables_delta::{Claim, CommitError, NewFile, Snapshot};

use crate::hot_tables::{HotTable, HotTables};
use crate::storage::Storage;
use crate::tables::catalog::{current, is_new_table_name, object_meta, table_prefix, Current};
use crate::types::cast_to;

/// Rows per row group of a table's files. Smaller than the writer's default of 1 Mi rows: a scan decodes a
/// row group at a time (and one ahead), so this bounds what an export or a run holds in memory, row-group
/// statistics can skip finer ranges, and a file of a few million rows still splits across the cores.
const TABLE_ROW_GROUP: usize = 128 * 1024;

/// Whether an import replaces the table or adds rows to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportMode {
    Replace,
    Append,
}

/// The format a file's extension names: `.parquet`, `.csv`, `.ndjson`/`.jsonl`/`.json`.
pub fn format_of_path(path: &Path) -> Option<TableFormat> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "parquet" | "pq" => Some(TableFormat::Parquet),
        "csv" => Some(TableFormat::Csv),
        "ndjson" | "jsonl" | "json" => Some(TableFormat::NdJson),
        _ => None,
    }
}

/// The extension of a staged body of `format`, which DataFusion's readers match.
pub(crate) fn staged_extension(format: TableFormat) -> &'static str {
    match format {
        TableFormat::Parquet => ".parquet",
        TableFormat::Csv => ".csv",
        TableFormat::NdJson => ".ndjson",
    }
}

/// A format as the CLI names it (`--format`).
///
/// # Errors
/// A message naming the accepted formats.
pub fn parse_format(raw: &str) -> Result<TableFormat, String> {
    match raw {
        "parquet" => Ok(TableFormat::Parquet),
        "csv" => Ok(TableFormat::Csv),
        "ndjson" | "jsonl" => Ok(TableFormat::NdJson),
        _ => Err(format!("unknown format '{raw}': use parquet, csv or ndjson")),
    }
}

/// Why an import failed. Nothing of it is visible when it fails.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(
        "'{0}' is not a table name: use letters, digits and '_', starting with a letter (at most 63 characters)"
    )]
    InvalidTableName(String),
    #[error("cannot tell the format of {0}: name it .parquet, .csv or .ndjson, or pass --format")]
    UnknownFormat(PathBuf),
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} does not match the columns of table '{table}' (append needs the same columns and types): {reason}")]
    SchemaMismatch { path: PathBuf, table: String, reason: String },
    #[error("table '{0}' reads an external source where it is: add rows there, or replace the table with an import")]
    External(String),
    /// Columns a table cannot have; the text says which.
    #[error("{0}")]
    Columns(String),
    #[error("cannot write the table: {0}")]
    Write(String),
}

/// What an import wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub table: String,
    pub rows: u64,
    pub files: usize,
}

fn extension(path: &Path) -> String {
    path.extension().and_then(|e| e.to_str()).map_or_else(String::new, |e| format!(".{e}"))
}

async fn read(ctx: &SessionContext, path: &Path, format: TableFormat) -> Result<DataFrame, ImportError> {
    let location = path
        .to_str()
        .ok_or_else(|| ImportError::Read { path: path.into(), reason: "the path is not UTF-8".into() })?;
    read_location(ctx, location, &extension(path), format, None)
        .await
        .map_err(|reason| ImportError::Read { path: path.into(), reason })
}

/// Reads a file at `location` (a path or a URL the session's storage serves). With `schema`, CSV and NDJSON are
/// read as those columns and types rather than inferred.
async fn read_location(
    ctx: &SessionContext,
    location: &str,
    ext: &str,
    format: TableFormat,
    schema: Option<&datafusion::arrow::datatypes::Schema>,
) -> Result<DataFrame, String> {
    let frame = match format {
        TableFormat::Parquet => {
            ctx.read_parquet(location, ParquetReadOptions { file_extension: ext, ..Default::default() }).await
        }
        TableFormat::Csv => {
            let mut options = CsvReadOptions::new().has_header(true).file_extension(ext);
            if let Some(schema) = schema {
                options = options.schema(schema);
            }
            ctx.read_csv(location, options).await
        }
        TableFormat::NdJson => {
            let mut options = JsonReadOptions::default().file_extension(ext);
            if let Some(schema) = schema {
                options = options.schema(schema);
            }
            let frame = ctx.read_json(location, options).await.map_err(|e| crate::message(&e))?;
            return match schema {
                Some(_) => Ok(frame),
                None => in_sent_order(ctx, location, ext, frame).await,
            };
        }
    };
    frame.map_err(|e| crate::message(&e))
}

/// How much of an NDJSON body is read for the order of its keys: as many records as DataFusion infers the
/// columns from, at any ordinary record size.
const KEY_ORDER_BYTES: u64 = 1 << 20;

/// NDJSON's inferred columns in the order their keys first appear in the body, as CSV's header keeps its own:
/// DataFusion reads each record as a JSON map, which orders keys by name. Columns whose keys first appear past
/// the body's first [`KEY_ORDER_BYTES`] follow, in name order.
async fn in_sent_order(
    ctx: &SessionContext,
    location: &str,
    ext: &str,
    frame: DataFrame,
) -> Result<DataFrame, String> {
    let head = body_head(ctx, location, ext).await.map_err(|e| crate::message(&e))?;
    let inferred: Vec<String> = frame.schema().fields().iter().map(|f| f.name().clone()).collect();
    let keys = key_order(&head);
    let mut rank: HashMap<&str, usize> = HashMap::new();
    for (at, key) in keys.iter().enumerate() {
        rank.insert(key, at);
    }
    let mut ordered: Vec<&str> = inferred.iter().map(String::as_str).collect();
    // Stable: the columns not seen in the head keep their name order, after the others.
    ordered.sort_by_key(|name| rank.get(name).copied().unwrap_or(usize::MAX));
    if ordered.iter().eq(inferred.iter()) {
        return Ok(frame);
    }
    frame.select_columns(&ordered).map_err(|e| crate::message(&e))
}

/// The first [`KEY_ORDER_BYTES`] of the first file at `location`.
async fn body_head(
    ctx: &SessionContext,
    location: &str,
    ext: &str,
) -> datafusion::error::Result<bytes::Bytes> {
    let url = datafusion::datasource::listing::ListingTableUrl::parse(location)?;
    let store = ctx.runtime_env().object_store(&url)?;
    let state = ctx.state();
    let first = url.list_all_files(&state, store.as_ref(), ext).await?.next().await.transpose()?;
    let Some(first) = first else { return Ok(bytes::Bytes::new()) };
    Ok(store.get_range(&first.location, 0..first.size.min(KEY_ORDER_BYTES)).await?)
}

/// The keys of the JSON objects in `head`, each once, in the order they first appear; a record cut off at the
/// end of `head` (or anything that is not an object) ends the walk.
fn key_order(head: &[u8]) -> Vec<String> {
    use serde::de::{IgnoredAny, MapAccess, Visitor};

    struct Keys(Vec<String>);
    struct KeysVisitor;
    impl<'de> Visitor<'de> for KeysVisitor {
        type Value = Keys;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
            let mut keys = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                keys.push(key);
            }
            Ok(Keys(keys))
        }
    }
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_map(KeysVisitor)
        }
    }

    let (mut order, mut seen) = (Vec::new(), std::collections::HashSet::new());
    for record in serde_json::Deserializer::from_slice(head).into_iter::<Keys>() {
        let Ok(Keys(keys)) = record else { break };
        for key in keys {
            if seen.insert(key.clone()) {
                order.push(key);
            }
        }
    }
    order
}

/// Writes batches to one Parquet object, reporting the rows written so far. The object appears whole when the
/// writer closes (one upload, or a multipart upload completed at the end), never part-written.
///
/// Every file is written with plain Arrow types (`Utf8`, not the `Utf8View` DataFusion reads strings as), so
/// the files of one table always have one schema, whichever way each was written.
pub struct TableWriter {
    writer: AsyncArrowWriter<BufWriter>,
    schema: SchemaRef,
    rows: u64,
}

/// The schema with view types (as DataFusion reads strings and binaries) in their plain form.
pub(crate) fn plain(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(logical(f.data_type()).clone()))
        .collect();
    Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(fields, schema.metadata().clone()))
}

impl TableWriter {
    pub(crate) fn create(
        storage: &Storage,
        path: ObjectPath,
        schema: SchemaRef,
    ) -> Result<Self, ImportError> {
        let schema = plain(&schema);
        let props = WriterProperties::builder()
            .set_compression(Compression::UNCOMPRESSED)
            .set_max_row_group_row_count(Some(TABLE_ROW_GROUP))
            .build();
        let sink = BufWriter::new(Arc::clone(storage.store()), path);
        let writer = AsyncArrowWriter::try_new(sink, Arc::clone(&schema), Some(props))
            .map_err(|e| ImportError::Write(e.to_string()))?;
        Ok(Self { writer, schema, rows: 0 })
    }

    pub(crate) async fn write(&mut self, batch: &RecordBatch) -> Result<u64, ImportError> {
        let cast;
        let batch = if batch.schema() == self.schema {
            batch
        } else {
            cast = cast_to(batch, &self.schema).map_err(|e| ImportError::Write(e.to_string()))?;
            &cast
        };
        self.writer.write(batch).await.map_err(|e| ImportError::Write(e.to_string()))?;
        self.rows += batch.num_rows() as u64;
        Ok(self.rows)
    }

    /// Keeps the tagged appends whose rows the file holds in its footer, for [`tagged_appends`].
    pub(crate) fn tag(&mut self, appends: &[TaggedAppend]) {
        if appends.is_empty() {
            return;
        }
        if let Ok(text) = serde_json::to_string(appends) {
            self.writer.append_key_value_metadata(KeyValue::new(APPENDS_KEY.to_owned(), text));
        }
    }

    /// The columns of the file, as written.
    pub(crate) fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    pub(crate) async fn close(self) -> Result<u64, ImportError> {
        self.writer.close().await.map_err(|e| ImportError::Write(e.to_string()))?;
        Ok(self.rows)
    }
}

/// The columns of a table's files: those of its first file (every file of a table has them), read once per
/// process; the log's columns for a table without files.
pub(crate) async fn existing_schema(
    storage: &Storage,
    snapshot: &Snapshot,
) -> Result<SchemaRef, ImportError> {
    let Some(first) = snapshot.files.first() else { return Ok(Arc::clone(&snapshot.schema)) };
    if let Some(known) = storage.version_schemas().get(&first.location) {
        return Ok(known);
    }
    let meta = object_meta(first);
    let footer = DFParquetMetadata::new(storage.store().as_ref(), &meta);
    let schema = Arc::new(footer.fetch_schema().await.map_err(|e| ImportError::Write(e.to_string()))?);
    storage.version_schemas().insert(first.location.clone(), Arc::clone(&schema));
    Ok(schema)
}

/// The columns of a table of files; `None` when there is no such table.
pub(crate) async fn table_schema(
    storage: &Storage,
    project: ProjectId,
    table: &str,
) -> Result<Option<SchemaRef>, StagedError> {
    match current(storage, &table_prefix(project, table))
        .await
        .map_err(|e| StagedError::Write(e.to_string()))?
    {
        Some(Current::Files(snapshot)) => {
            existing_schema(storage, &snapshot).await.map(Some).map_err(|e| StagedError::Write(e.to_string()))
        }
        Some(Current::External { .. }) => Err(StagedError::External),
        None => Ok(None),
    }
}

/// String and binary types compare by meaning: Parquet reads strings back as views.
fn logical(data_type: &DataType) -> &DataType {
    match data_type {
        DataType::Utf8View | DataType::LargeUtf8 => &DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => &DataType::Binary,
        other => other,
    }
}

fn same_columns(a: &SchemaRef, b: &SchemaRef) -> Result<(), String> {
    let describe = |s: &SchemaRef| {
        s.fields().iter().map(|f| format!("{} {}", f.name(), logical(f.data_type()))).collect::<Vec<_>>()
    };
    let (a, b) = (describe(a), describe(b));
    if a == b {
        Ok(())
    } else {
        Err(format!("table has [{}], file has [{}]", a.join(", "), b.join(", ")))
    }
}

/// Where an import writes, and the commit that makes it part of the table.
struct Destination {
    table: ObjectPath,
    mode: ImportMode,
    /// Files written so far, for removal if the import fails.
    written: Vec<ObjectPath>,
    /// Files complete: their rows, and the columns they were written with.
    done: Vec<(ObjectPath, u64, SchemaRef)>,
    /// Whether the table had no rows before (a replace that creates it).
    created: bool,
    /// For an append, the version of the table whose columns its files have.
    read: u64,
}

/// What an import's commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Published {
    /// The files are part of the table, as its log names them, at the version committed; whether the import
    /// created it.
    Done { created: bool, files: Vec<NewFile>, version: u64 },
    /// A replace with other columns landed first: the rows are to be written again, to the table as it is now.
    Again,
    /// An append under one of the claimed keys landed first: nothing was added.
    Claimed(Vec<String>),
}

impl Destination {
    /// Chooses the target; an append also returns the columns the new files must have.
    async fn choose(
        storage: &Storage,
        project: ProjectId,
        table: &str,
        mode: ImportMode,
    ) -> Result<(Self, Option<SchemaRef>), ImportError> {
        let prefix = table_prefix(project, table);
        let existing = current(storage, &prefix).await.map_err(|e| ImportError::Write(e.to_string()))?;
        let (expected, read) = match (mode, &existing) {
            (ImportMode::Append, Some(Current::Files(snapshot))) => {
                (Some(existing_schema(storage, snapshot).await?), snapshot.version)
            }
            (ImportMode::Append, Some(Current::External { .. })) => {
                return Err(ImportError::External(table.into()))
            }
            _ => (None, 0),
        };
        let created = existing.is_none();
        let target = Self { table: prefix, mode, written: Vec::new(), done: Vec::new(), created, read };
        Ok((target, expected))
    }

    fn next_file(&mut self, index: usize) -> ObjectPath {
        let path = self.table.clone().join(format!("part-{}-{index}.parquet", uuid::Uuid::new_v4()));
        self.written.push(path.clone());
        path
    }

    /// Records a file written completely, with its rows and columns.
    fn closed(&mut self, rows: u64, schema: SchemaRef) {
        if let Some(path) = self.written.last() {
            self.done.push((path.clone(), rows, schema));
        }
    }

    /// Commits the files: an append adds them, a replace makes them the table (creating it).
    async fn publish(
        &self,
        storage: &Storage,
        note: HashMap<String, serde_json::Value>,
        claims: &[Claim],
    ) -> Result<Published, ImportError> {
        let mut files = Vec::with_capacity(self.done.len());
        for (path, rows, _) in &self.done {
            let meta = storage.store().head(path).await.map_err(store_error)?;
            files.push(NewFile {
                location: path.clone(),
                size: meta.size,
                rows: *rows,
                modified_ms: meta.last_modified.timestamp_millis(),
            });
        }
        let tables = storage.tables();
        match self.mode {
            ImportMode::Append => match tables.append(&self.table, self.read, &files, note, claims).await {
                Ok(version) => Ok(Published::Done { created: false, files, version }),
                Err(CommitError::Replaced(_) | CommitError::NoTable(_)) => Ok(Published::Again),
                Err(CommitError::Claimed { names, .. }) => Ok(Published::Claimed(names)),
                Err(err) => Err(ImportError::Write(err.to_string())),
            },
            ImportMode::Replace => {
                let Some((_, _, schema)) = self.done.first() else {
                    return Err(ImportError::Write("a replace wrote no file".into()));
                };
                let created_ms = self.created.then(|| storage.now_ms());
                let schema = plain(schema);
                let (version, _) = tables
                    .replace(&self.table, &schema, &files, &HashMap::new(), created_ms)
                    .await
                    .map_err(|err| match err {
                        CommitError::Columns { reason, .. } => ImportError::Columns(reason),
                        other => ImportError::Write(other.to_string()),
                    })?;
                Ok(Published::Done { created: self.created, files, version })
            }
        }
    }

    /// Removes what a failed import wrote; the table's content is untouched.
    async fn discard(&self, storage: &Storage) {
        if let Err(err) = storage.delete(self.written.clone()).await {
            tracing::warn!(table = %self.table, error = %err, "cannot remove a failed import's files");
        }
    }
}

pub(crate) fn store_error(err: object_store::Error) -> ImportError {
    ImportError::Write(err.to_string())
}

/// How far an import is: the rows written and the bytes of its files read so far (a little more than the
/// files' size for Parquet, whose footers are read twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportProgress {
    pub rows: u64,
    pub bytes_read: u64,
}

/// Imports files into a table. `progress` is called after each batch of rows.
///
/// # Errors
/// [`ImportError`]; on any error nothing of this import is visible.
pub async fn import_files(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    files: &[PathBuf],
    format: Option<TableFormat>,
    mode: ImportMode,
    progress: &(dyn Fn(ImportProgress) + Sync),
) -> Result<ImportReport, ImportError> {
    if !is_new_table_name(table) {
        return Err(ImportError::InvalidTableName(table.into()));
    }
    let ctx = crate::tables::catalog::empty_session(storage, None, None)
        .map_err(|e| ImportError::Write(e.to_string()))?;
    // The files are read through a file system that counts the bytes.
    let (counting, bytes_read) = crate::progress::CountingFiles::new();
    let local = url::Url::parse("file:///").map_err(|e| ImportError::Write(e.to_string()))?;
    ctx.runtime_env().register_object_store(&local, Arc::new(counting));
    let report = &|rows| {
        progress(ImportProgress { rows, bytes_read: bytes_read.load(std::sync::atomic::Ordering::Relaxed) });
    };
    for _ in 0..APPEND_ATTEMPTS {
        let (mut target, expected) = Destination::choose(storage, project, table, mode).await?;
        let rows = match write_files(storage, &ctx, &mut target, table, files, format, expected, report).await
        {
            Ok(rows) => rows,
            Err(err) => {
                target.discard(storage).await;
                return Err(err);
            }
        };
        match target.publish(storage, HashMap::new(), &[]).await? {
            Published::Done { .. } => {
                return Ok(ImportReport { table: table.into(), rows, files: files.len() })
            }
            // The table was replaced while the rows were written: they go to what the table is now. (An import
            // claims no key.)
            Published::Again | Published::Claimed(_) => target.discard(storage).await,
        }
    }
    Err(ImportError::Write(format!(
        "table {table} was replaced {APPEND_ATTEMPTS} times while rows were added to it"
    )))
}

#[allow(clippy::too_many_arguments)]
async fn write_files(
    storage: &Storage,
    ctx: &SessionContext,
    target: &mut Destination,
    table: &str,
    files: &[PathBuf],
    format: Option<TableFormat>,
    mut expected: Option<SchemaRef>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, ImportError> {
    let mut rows = 0;
    for (index, path) in files.iter().enumerate() {
        let format = format
            .or_else(|| format_of_path(path))
            .ok_or_else(|| ImportError::UnknownFormat(path.clone()))?;
        let frame = read(ctx, path, format).await?;
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        match &expected {
            Some(expected) => same_columns(expected, &schema).map_err(|reason| {
                ImportError::SchemaMismatch { path: path.clone(), table: table.into(), reason }
            })?,
            None => expected = Some(schema.clone()),
        }
        let mut stream = frame
            .execute_stream()
            .await
            .map_err(|e| ImportError::Read { path: path.clone(), reason: crate::message(&e) })?;
        let mut writer = TableWriter::create(storage, target.next_file(index), schema)?;
        while let Some(batch) = stream.next().await {
            let batch =
                batch.map_err(|e| ImportError::Read { path: path.clone(), reason: crate::message(&e) })?;
            progress(rows + writer.write(&batch).await?);
        }
        let columns = writer.schema();
        let file_rows = writer.close().await?;
        target.closed(file_rows, columns);
        rows += file_rows;
    }
    Ok(rows)
}

/// Writes generated batches as the whole new content of a table.
///
/// # Errors
/// [`ImportError`]; on any error the table keeps its previous content.
pub async fn write_table(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    schema: SchemaRef,
    batches: impl Iterator<Item = RecordBatch>,
    progress: &dyn Fn(u64),
) -> Result<u64, ImportError> {
    if !is_new_table_name(table) {
        return Err(ImportError::InvalidTableName(table.into()));
    }
    let (mut target, _) = Destination::choose(storage, project, table, ImportMode::Replace).await?;
    let written = async {
        let mut writer = TableWriter::create(storage, target.next_file(0), schema)?;
        for batch in batches {
            progress(writer.write(&batch).await?);
        }
        let columns = writer.schema();
        let rows = writer.close().await?;
        target.closed(rows, columns);
        Ok(rows)
    }
    .await;
    match written {
        Ok(rows) => {
            target.publish(storage, HashMap::new(), &[]).await?;
            Ok(rows)
        }
        Err(err) => {
            target.discard(storage).await;
            Err(err)
        }
    }
}

/// Why an upload staged in the storage could not be imported. Nothing of it is visible when it fails.
#[derive(Debug, Clone)]
pub(crate) enum StagedError {
    /// The body does not read as its format, or does not fit the table; for a person.
    Invalid(String),
    /// An append to a table that does not exist.
    NoSuchTable,
    /// An append to a table that reads an external source where it is.
    External,
    /// An append under the same key landed first (see [`Claim`]): nothing was written.
    TakenOver,
    Write(String),
}

impl From<ImportError> for StagedError {
    fn from(err: ImportError) -> Self {
        match err {
            ImportError::External(_) => Self::External,
            ImportError::Columns(reason) => Self::Invalid(reason),
            other => Self::Write(other.to_string()),
        }
    }
}

/// How many times an append is written again when a concurrent replace switched the table under it.
const APPEND_ATTEMPTS: usize = 3;

/// Imports one staged upload, the one object under `staged`, into a table; returns the rows and whether it
/// created the table.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn import_staged(
    storage: &Storage,
    project: ProjectId,
    table: &str,
    staged: &ObjectPath,
    format: TableFormat,
    mode: ImportMode,
    batch_rows: Option<usize>,
    tag: Option<&Keyed>,
) -> Result<(u64, bool), StagedError> {
    let ctx = crate::tables::catalog::import_session(storage, batch_rows)
        .map_err(|e| StagedError::Write(e.to_string()))?;
    let location = storage.url_of(staged);
    let ext = staged_extension(format);
    for _ in 0..APPEND_ATTEMPTS {
        let (mut target, expected) = Destination::choose(storage, project, table, mode).await?;
        if mode == ImportMode::Append && expected.is_none() {
            return Err(StagedError::NoSuchTable);
        }
        let footer = tag.map(|keyed| &keyed.append);
        let written =
            write_staged(storage, &ctx, &mut target, (&location, ext, format), expected.as_ref(), footer)
                .await;
        let rows = match written {
            Ok(rows) => rows,
            Err(err) => {
                target.discard(storage).await;
                return Err(err);
            }
        };
        let note = footer.map_or_else(HashMap::new, |a| appends_note(&[TaggedAppend { rows, ..a.clone() }]));
        let claims: Vec<Claim> = tag.map(|keyed| keyed.claim.clone()).into_iter().collect();
        match target.publish(storage, note, &claims).await.map_err(StagedError::from)? {
            Published::Done { created, .. } => return Ok((rows, created)),
            Published::Again => target.discard(storage).await,
            Published::Claimed(_) => {
                target.discard(storage).await;
                return Err(StagedError::TakenOver);
            }
        }
    }
    Err(StagedError::Write(format!(
        "table {table} was replaced {APPEND_ATTEMPTS} times while rows were added to it"
    )))
}

/// Reads the staged upload (as the table's columns when it has them) and writes it as one Parquet file.
async fn write_staged(
    storage: &Storage,
    ctx: &SessionContext,
    target: &mut Destination,
    (location, ext, format): (&str, &str, TableFormat),
    expected: Option<&SchemaRef>,
    tag: Option<&TaggedAppend>,
) -> Result<u64, StagedError> {
    let (schema, mut stream) = read_staged(ctx, location, ext, format, expected).await?;
    let mut writer = TableWriter::create(storage, target.next_file(0), schema)
        .map_err(|e| StagedError::Write(e.to_string()))?;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| StagedError::Invalid(crate::message(&e)))?;
        writer.write(&batch).await.map_err(|e| StagedError::Write(e.to_string()))?;
    }
    if writer.rows == 0 {
        return Err(StagedError::Invalid("The body has no rows.".into()));
    }
    if let Some(tag) = tag {
        writer.tag(&[TaggedAppend { rows: writer.rows, ..tag.clone() }]);
    }
    let columns = writer.schema();
    let rows = writer.close().await.map_err(|e| StagedError::Write(e.to_string()))?;
    target.closed(rows, columns);
    Ok(rows)
}

/// Reads a staged upload as the table's columns when it has them: Parquet must have them, text must name them
/// (CSV all, in order; NDJSON any of them) and is read as their types.
async fn read_staged(
    ctx: &SessionContext,
    location: &str,
    ext: &str,
    format: TableFormat,
    expected: Option<&SchemaRef>,
) -> Result<(SchemaRef, SendableRecordBatchStream), StagedError> {
    let invalid = StagedError::Invalid;
    let Some(expected) = expected else {
        let frame = read_location(ctx, location, ext, format, None).await.map_err(invalid)?;
        let found: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        let stream = frame.execute_stream().await.map_err(|e| invalid(crate::message(&e)))?;
        return Ok((found, stream));
    };
    let frame = match format {
        TableFormat::Parquet => {
            let frame = read_location(ctx, location, ext, format, None).await.map_err(invalid)?;
            same_columns(expected, &Arc::new(frame.schema().as_arrow().clone()))
                .map_err(|reason| invalid(format!("The columns do not match the table's: {reason}.")))?;
            frame
        }
        // Text carries names, not types: the names must be the table's, and the values are read as its types.
        // CSV's header is read as the table's columns of its names, in its order, then put in the table's
        // order with nulls for those left out; NDJSON's reader matches keys by name.
        TableFormat::Csv => {
            let head = body_head(ctx, location, ext).await.map_err(|e| invalid(crate::message(&e)))?;
            let header = csv_header(&head).map_err(invalid)?;
            let sent = sent_columns(expected, header.iter().map(String::as_str)).map_err(invalid)?;
            let frame = read_location(ctx, location, ext, format, Some(&sent)).await.map_err(invalid)?;
            in_table_order(frame, expected).map_err(|e| invalid(crate::message(&e)))?
        }
        TableFormat::NdJson => {
            let found = read_location(ctx, location, ext, format, None).await.map_err(invalid)?;
            sent_columns(expected, found.schema().fields().iter().map(|f| f.name().as_str()))
                .map_err(invalid)?;
            read_location(ctx, location, ext, format, Some(expected.as_ref())).await.map_err(invalid)?
        }
    };
    let schema = Arc::clone(expected);
    let stream = frame.execute_stream().await.map_err(|e| invalid(crate::message(&e)))?;
    Ok((schema, stream))
}

/// The column names of a CSV body's header (its first record), each trimmed.
pub(crate) fn csv_header(body: &[u8]) -> Result<Vec<String>, String> {
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(body);
    let mut record = csv::ByteRecord::new();
    match reader.read_byte_record(&mut record) {
        Ok(true) => Ok(record.iter().map(|name| String::from_utf8_lossy(name).trim().to_owned()).collect()),
        Ok(false) => Err("The body has no header naming its columns.".into()),
        Err(err) => Err(format!("The body's header: {err}")),
    }
}

/// The table's columns a text body names, in the body's order: each once, each a column of the table, and every
/// column of the table it leaves out nullable.
pub(crate) fn sent_columns<'a>(
    expected: &SchemaRef,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<datafusion::arrow::datatypes::Schema, String> {
    let table: Vec<&str> = expected.fields().iter().map(|f| f.name().as_str()).collect();
    let mismatch = |what: String| {
        format!("The columns do not match the table's: {what}; the table has [{}].", table.join(", "))
    };
    let mut sent: Vec<datafusion::arrow::datatypes::Field> = Vec::new();
    for name in names {
        let shown: String = name.chars().take(128).collect();
        let Ok(column) = expected.field_with_name(name) else {
            return Err(mismatch(format!("the body has '{shown}'")));
        };
        if sent.iter().any(|f| f.name() == name) {
            return Err(mismatch(format!("the body names '{shown}' twice")));
        }
        sent.push(column.clone());
    }
    if let Some(left_out) =
        expected.fields().iter().find(|f| !f.is_nullable() && !sent.iter().any(|s| s.name() == f.name()))
    {
        return Err(mismatch(format!("the body leaves out '{}', which cannot be null", left_out.name())));
    }
    Ok(datafusion::arrow::datatypes::Schema::new(sent))
}

/// `frame`'s columns in the table's order, a column it does not have as nulls of the column's type.
fn in_table_order(frame: DataFrame, expected: &SchemaRef) -> datafusion::error::Result<DataFrame> {
    use datafusion::common::{Column, ScalarValue};
    use datafusion::logical_expr::{lit, Expr};
    let columns = expected
        .fields()
        .iter()
        .map(|field| match frame.schema().field_with_unqualified_name(field.name()) {
            Ok(_) => Ok(Expr::Column(Column::new_unqualified(field.name()))),
            Err(_) => Ok(lit(ScalarValue::try_from(field.data_type())?).alias(field.name())),
        })
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    frame.select(columns)
}

/// One append's body, held in memory until its table's next grouped write (see `appends`).
pub(crate) struct HeldBody {
    pub(crate) bytes: bytes::Bytes,
    pub(crate) format: TableFormat,
    /// For an append under a key.
    pub(crate) tag: Option<Keyed>,
}

/// An append under an `Idempotency-Key` as its writer knows it: what its file's footer lists (its rows counted
/// once written), and its claim on the key, which its commit names.
#[derive(Debug, Clone)]
pub(crate) struct Keyed {
    pub(crate) append: TaggedAppend,
    pub(crate) claim: Claim,
}

impl Keyed {
    pub(crate) fn of(tag: &domain::AppendTag, bytes: u64) -> Self {
        let append = TaggedAppend { write_id: tag.write_id, rows: 0, bytes, body_sha256: tag.digest.hex() };
        Self { append, claim: Claim { name: tag.key.as_str().to_owned(), after: tag.after } }
    }
}

/// The footer key under which a table file lists the tagged appends whose rows it holds (JSON).
const APPENDS_KEY: &str = "endpoints.appends";

/// An append made under a key, as a file's footer lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct TaggedAppend {
    pub(crate) write_id: uuid::Uuid,
    pub(crate) rows: u64,
    pub(crate) bytes: u64,
    pub(crate) body_sha256: String,
}

/// A commit's note of the tagged appends it adds (application metadata of the Delta commit, for people and
/// other readers of the log; the files' footers are what `holds` reads).
pub(crate) fn appends_note(appends: &[TaggedAppend]) -> HashMap<String, serde_json::Value> {
    if appends.is_empty() {
        return HashMap::new();
    }
    let ids: Vec<String> = appends.iter().map(|a| a.write_id.to_string()).collect();
    HashMap::from([(APPENDS_KEY.to_owned(), serde_json::Value::from(ids))])
}

/// The tagged appends a table file's footer lists.
pub(crate) fn tagged_appends(
    metadata: &datafusion::parquet::file::metadata::FileMetaData,
) -> Vec<TaggedAppend> {
    let listed = metadata.key_value_metadata().into_iter().flatten().find(|kv| kv.key == APPENDS_KEY);
    // A file written without the key (or by another writer) lists no tagged append.
    listed.and_then(|kv| serde_json::from_str(kv.value.as_deref()?).ok()).unwrap_or_else(Vec::new)
}

/// Appends bodies held in memory to a table as one Parquet file. Each body is read as the table's columns on
/// its own, so one that does not fit is refused alone; the rows of the others are written together, visible
/// when the file is complete. Answers each body's rows, or why it was refused, in order; the whole group fails
/// (with nothing written) when the table does not exist or cannot be written.
pub(crate) async fn append_held(
    storage: &Storage,
    (project, hot): (ProjectId, Option<&Arc<HotTables>>),
    table: &str,
    bodies: &[HeldBody],
) -> Result<Vec<Result<u64, StagedError>>, StagedError> {
    let ctx = crate::tables::catalog::import_session(storage, None)
        .map_err(|e| StagedError::Write(e.to_string()))?;
    let held = Arc::new(object_store::memory::InMemory::new());
    let root = url::Url::parse("memory://held/").map_err(|e| StagedError::Write(e.to_string()))?;
    ctx.runtime_env().register_object_store(&root, Arc::clone(&held) as _);
    let mut taken = std::collections::HashSet::new();
    for _ in 0..APPEND_ATTEMPTS {
        let (mut target, expected) = Destination::choose(storage, project, table, ImportMode::Append).await?;
        let Some(expected) = expected else { return Err(StagedError::NoSuchTable) };
        let mut answers = Vec::with_capacity(bodies.len());
        let mut batches = Vec::new();
        let (mut tagged, mut claims) = (Vec::new(), Vec::new());
        for (index, body) in bodies.iter().enumerate() {
            if body.tag.as_ref().is_some_and(|keyed| taken.contains(&keyed.claim.name)) {
                answers.push(Err(StagedError::TakenOver));
                continue;
            }
            let answer = match decode_held(&body.bytes, body.format, &expected) {
                Some(read) => Ok(keep_rows(read, &mut batches)),
                // Not rows of the table as read directly: the engine's reader reads it, or says why not.
                None => {
                    let ext = staged_extension(body.format);
                    let path = ObjectPath::from(format!("{index}{ext}"));
                    held.put(&path, PutPayload::from(body.bytes.clone()))
                        .await
                        .map_err(store_error_staged)?;
                    let location = format!("{root}{index}{ext}");
                    collect_body(&ctx, &location, ext, body.format, &expected, &mut batches).await
                }
            };
            if let (Ok(rows), Some(keyed)) = (&answer, &body.tag) {
                tagged.push(TaggedAppend { rows: *rows, ..keyed.append.clone() });
                claims.push(keyed.claim.clone());
            }
            answers.push(answer);
        }
        if batches.is_empty() {
            return Ok(answers);
        }
        let written = async {
            let mut writer = TableWriter::create(storage, target.next_file(0), Arc::clone(&expected))?;
            for batch in &batches {
                writer.write(batch).await?;
            }
            writer.tag(&tagged);
            let columns = writer.schema();
            let rows = writer.close().await?;
            target.closed(rows, columns);
            Ok::<_, ImportError>(())
        }
        .await;
        if let Err(err) = written {
            target.discard(storage).await;
            return Err(StagedError::Write(err.to_string()));
        }
        match target
            .publish(storage, appends_note(&tagged), &claims)
            .await
            .map_err(|e| StagedError::Write(e.to_string()))?
        {
            Published::Done { files, version, .. } => {
                // A table kept decoded keeps the rows too: they are in memory already.
                if let (Some(hot), [file]) = (hot, files.as_slice()) {
                    let table = HotTable { project, name: table.to_owned() };
                    let file = crate::tables::catalog::new_file_meta(storage, file);
                    hot.appended(&table, (&file, version), &batches);
                }
                return Ok(answers);
            }
            Published::Again => target.discard(storage).await,
            // The other appends are written again without those whose key another append took.
            Published::Claimed(names) => {
                target.discard(storage).await;
                taken.extend(names);
            }
        }
    }
    Err(StagedError::Write(format!(
        "table {table} was replaced {APPEND_ATTEMPTS} times while rows were added to it"
    )))
}

/// A held body's rows read directly as the table's columns, by the Arrow readers the engine's own reader uses:
/// CSV whose header names the columns in order, or NDJSON with no other key. `None` when the body is not that
/// (or has no rows): the engine's reader then reads it the usual way, or says why it cannot.
fn decode_held(bytes: &[u8], format: TableFormat, expected: &SchemaRef) -> Option<Vec<RecordBatch>> {
    let schema = plain(expected);
    let read = match format {
        TableFormat::NdJson => {
            let decoder = arrow_json::ReaderBuilder::new(Arc::clone(&schema)).with_strict_mode(true);
            decoder.build(std::io::Cursor::new(bytes)).ok()?.collect::<Result<Vec<_>, _>>().ok()?
        }
        TableFormat::Csv => {
            let mut header = csv::ReaderBuilder::new().has_headers(false).from_reader(bytes);
            let names = header.byte_records().next()?.ok()?;
            let same = names.len() == schema.fields().len()
                && names.iter().zip(schema.fields()).all(|(name, field)| name == field.name().as_bytes());
            if !same {
                return None;
            }
            let reader = datafusion::arrow::csv::ReaderBuilder::new(Arc::clone(&schema)).with_header(true);
            reader.build(std::io::Cursor::new(bytes)).ok()?.collect::<Result<Vec<_>, _>>().ok()?
        }
        TableFormat::Parquet => return None,
    };
    (read.iter().any(|batch| batch.num_rows() > 0)).then_some(read)
}

/// Adds a body's batches to the group's; answers its rows.
fn keep_rows(read: Vec<RecordBatch>, batches: &mut Vec<RecordBatch>) -> u64 {
    let rows: usize = read.iter().map(RecordBatch::num_rows).sum();
    batches.extend(read);
    rows as u64
}

/// Reads one held body into `batches`; answers its rows, or why it does not fit (its batches then left out).
async fn collect_body(
    ctx: &SessionContext,
    location: &str,
    ext: &str,
    format: TableFormat,
    expected: &SchemaRef,
    batches: &mut Vec<RecordBatch>,
) -> Result<u64, StagedError> {
    let (_, mut stream) = read_staged(ctx, location, ext, format, Some(expected)).await?;
    let mut read = Vec::new();
    while let Some(batch) = stream.next().await {
        read.push(batch.map_err(|e| StagedError::Invalid(crate::message(&e)))?);
    }
    if read.iter().all(|batch| batch.num_rows() == 0) {
        return Err(StagedError::Invalid("The body has no rows.".into()));
    }
    Ok(keep_rows(read, batches))
}

fn store_error_staged(err: object_store::Error) -> StagedError {
    StagedError::Write(err.to_string())
}
