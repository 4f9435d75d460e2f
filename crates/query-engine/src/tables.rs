//! Loading data into a project's tables: files in Parquet, CSV (with a header) or NDJSON become Parquet files
//! under `DATA_DIR/projects/{id}/tables/{table}/`. Everything is written to a staging directory first and moved
//! into place at the end, so a failed import leaves nothing half-written visible to queries.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::file_format::options::JsonReadOptions;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use domain::ProjectId;
use futures_util::StreamExt;

use crate::catalog::{is_table_name, tables_dir};

/// Whether an import replaces the table or adds rows to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportMode {
    Replace,
    Append,
}

/// The format of an input file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Parquet,
    Csv,
    NdJson,
}

impl FileFormat {
    /// The format named by a file's extension: `.parquet`, `.csv`, `.ndjson`/`.jsonl`/`.json`.
    pub fn from_path(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "parquet" | "pq" => Some(Self::Parquet),
            "csv" => Some(Self::Csv),
            "ndjson" | "jsonl" | "json" => Some(Self::NdJson),
            _ => None,
        }
    }

    /// # Errors
    /// A message naming the accepted formats.
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "parquet" => Ok(Self::Parquet),
            "csv" => Ok(Self::Csv),
            "ndjson" | "jsonl" => Ok(Self::NdJson),
            _ => Err(format!("unknown format '{raw}': use parquet, csv or ndjson")),
        }
    }
}

/// Why an import failed. Nothing of it is visible when it fails.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(
        "'{0}' is not a table name: use lowercase letters, digits and '_', starting with a letter or '_'"
    )]
    InvalidTableName(String),
    #[error("cannot tell the format of {0}: name it .parquet, .csv or .ndjson, or pass --format")]
    UnknownFormat(PathBuf),
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} does not match the columns of table '{table}' (append needs the same columns and types): {reason}")]
    SchemaMismatch { path: PathBuf, table: String, reason: String },
    #[error("cannot write the table: {0}")]
    Write(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What an import wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub table: String,
    pub rows: u64,
    pub files: usize,
}

fn extension(path: &Path) -> String {
    path.extension().and_then(|e| e.to_str()).map(|e| format!(".{e}")).unwrap_or_default()
}

async fn read(ctx: &SessionContext, path: &Path, format: FileFormat) -> Result<DataFrame, ImportError> {
    let location = path
        .to_str()
        .ok_or_else(|| ImportError::Read { path: path.into(), reason: "the path is not UTF-8".into() })?;
    let ext = extension(path);
    let frame = match format {
        FileFormat::Parquet => {
            ctx.read_parquet(location, ParquetReadOptions { file_extension: &ext, ..Default::default() })
                .await
        }
        FileFormat::Csv => {
            ctx.read_csv(location, CsvReadOptions::new().has_header(true).file_extension(&ext)).await
        }
        FileFormat::NdJson => ctx.read_json(location, JsonReadOptions::default().file_extension(&ext)).await,
    };
    frame.map_err(|e| ImportError::Read { path: path.into(), reason: crate::message(&e) })
}

/// A staging directory next to the tables, removed on drop unless its content was moved into place.
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn new(tables: &Path) -> Result<Self, ImportError> {
        let dir = tables.join(format!(".staging-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes batches to one Parquet file, reporting the rows written so far.
pub struct TableWriter {
    writer: ArrowWriter<std::fs::File>,
    rows: u64,
}

impl TableWriter {
    fn create(path: &Path, schema: SchemaRef) -> Result<Self, ImportError> {
        let file = std::fs::File::create(path)?;
        let props = WriterProperties::builder().set_compression(Compression::UNCOMPRESSED).build();
        let writer =
            ArrowWriter::try_new(file, schema, Some(props)).map_err(|e| ImportError::Write(e.to_string()))?;
        Ok(Self { writer, rows: 0 })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<u64, ImportError> {
        self.writer.write(batch).map_err(|e| ImportError::Write(e.to_string()))?;
        self.rows += batch.num_rows() as u64;
        Ok(self.rows)
    }

    fn close(self) -> Result<u64, ImportError> {
        self.writer.close().map_err(|e| ImportError::Write(e.to_string()))?;
        Ok(self.rows)
    }
}

async fn existing_schema(ctx: &SessionContext, table_dir: &Path) -> Result<Option<SchemaRef>, ImportError> {
    if !table_dir.is_dir() {
        return Ok(None);
    }
    let location = format!("{}/", table_dir.display());
    let frame = ctx
        .read_parquet(location.as_str(), ParquetReadOptions::default())
        .await
        .map_err(|e| ImportError::Read { path: table_dir.into(), reason: crate::message(&e) })?;
    Ok(Some(Arc::new(frame.schema().as_arrow().clone())))
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

/// Imports files into a table. `progress` is called with the rows written so far.
///
/// # Errors
/// [`ImportError`]; on any error nothing of this import is visible.
pub async fn import_files(
    data_dir: &Path,
    project: ProjectId,
    table: &str,
    files: &[PathBuf],
    format: Option<FileFormat>,
    mode: ImportMode,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<ImportReport, ImportError> {
    if !is_table_name(table) {
        return Err(ImportError::InvalidTableName(table.into()));
    }
    let tables = tables_dir(data_dir, project);
    std::fs::create_dir_all(&tables)?;
    let table_dir = tables.join(table);
    let ctx = SessionContext::new();
    let mut expected = match mode {
        ImportMode::Append => existing_schema(&ctx, &table_dir).await?,
        ImportMode::Replace => None,
    };
    let staging = Staging::new(&tables)?;
    let mut rows = 0;
    for (index, path) in files.iter().enumerate() {
        let format = format
            .or_else(|| FileFormat::from_path(path))
            .ok_or_else(|| ImportError::UnknownFormat(path.clone()))?;
        let frame = read(&ctx, path, format).await?;
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
        let target = staging.dir.join(format!("part-{}-{index}.parquet", uuid::Uuid::new_v4()));
        let mut writer = TableWriter::create(&target, schema)?;
        while let Some(batch) = stream.next().await {
            let batch =
                batch.map_err(|e| ImportError::Read { path: path.clone(), reason: crate::message(&e) })?;
            progress(rows + writer.write(&batch)?);
        }
        rows += writer.close()?;
    }
    publish(&staging, &table_dir, mode)?;
    Ok(ImportReport { table: table.into(), rows, files: files.len() })
}

/// Writes generated batches as the whole new content of a table.
///
/// # Errors
/// [`ImportError`]; on any error the table keeps its previous content.
pub fn write_table(
    data_dir: &Path,
    project: ProjectId,
    table: &str,
    schema: SchemaRef,
    batches: impl Iterator<Item = RecordBatch>,
    progress: &dyn Fn(u64),
) -> Result<u64, ImportError> {
    if !is_table_name(table) {
        return Err(ImportError::InvalidTableName(table.into()));
    }
    let tables = tables_dir(data_dir, project);
    std::fs::create_dir_all(&tables)?;
    let staging = Staging::new(&tables)?;
    let mut writer = TableWriter::create(&staging.dir.join("part-0.parquet"), schema)?;
    for batch in batches {
        progress(writer.write(&batch)?);
    }
    let rows = writer.close()?;
    publish(&staging, &tables.join(table), ImportMode::Replace)?;
    Ok(rows)
}

/// Moves staged files into place: a whole directory swap for a replace, file by file for an append (each
/// rename is atomic, and a query sees a file only once it is complete).
fn publish(staging: &Staging, table_dir: &Path, mode: ImportMode) -> Result<(), ImportError> {
    match mode {
        ImportMode::Append if table_dir.is_dir() => {
            for entry in std::fs::read_dir(&staging.dir)? {
                let entry = entry?;
                std::fs::rename(entry.path(), table_dir.join(entry.file_name()))?;
            }
        }
        _ => {
            let parent = table_dir.parent().unwrap_or(table_dir);
            let retired = parent.join(format!(".retired-{}", uuid::Uuid::new_v4()));
            let had_table = table_dir.is_dir();
            if had_table {
                std::fs::rename(table_dir, &retired)?;
            }
            std::fs::rename(&staging.dir, table_dir)?;
            if had_table {
                std::fs::remove_dir_all(&retired)?;
            }
        }
    }
    Ok(())
}
