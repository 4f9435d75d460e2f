//! A table's version as the engine reads it: its files and columns, from the Delta log.

use std::collections::HashMap;

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use deltalake::kernel::transaction::PROTOCOL;
use deltalake::kernel::{Metadata, Protocol, StructType};
use deltalake::table::state::DeltaTableState;
use object_store::path::Path as ObjectPath;

/// One of a table's Parquet files at a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFile {
    /// Its location from the storage's root.
    pub location: ObjectPath,
    pub size: u64,
    /// Its rows, as the log's statistics say (`None` for a file added without them, by another writer).
    pub rows: Option<u64>,
    /// When it was written, in milliseconds since the Unix epoch.
    pub modified_ms: i64,
}

/// A table at one version: what a run reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub version: u64,
    pub files: Vec<DataFile>,
    /// Its columns, as Arrow types.
    pub schema: SchemaRef,
    /// When the version was committed, in milliseconds since the Unix epoch.
    pub committed_ms: i64,
    /// When the table was created (its metadata's creation time).
    pub created_ms: Option<i64>,
    /// Its properties (the metadata's configuration).
    pub properties: HashMap<String, String>,
    /// Why delta-rs may not write to the table (a table feature of another writer it does not support).
    pub(crate) unwritable: Option<String>,
}

impl Snapshot {
    pub(crate) fn of(
        table: &ObjectPath,
        state: &DeltaTableState,
    ) -> Result<Self, deltalake::DeltaTableError> {
        let files = state
            .log_data()
            .iter()
            .map(|file| DataFile {
                location: ObjectPath::from_iter(table.parts().chain(file.object_store_path().parts())),
                size: u64::try_from(file.size()).unwrap_or(0),
                rows: file.num_records().map(|rows| rows as u64),
                modified_ms: file.modification_time(),
            })
            .collect();
        let version = state.version();
        Ok(Self {
            version,
            files,
            schema: state.snapshot().arrow_schema(),
            committed_ms: state.version_timestamp(version).unwrap_or(0),
            created_ms: state.metadata().created_time(),
            properties: state.metadata().configuration().clone(),
            unwritable: PROTOCOL.can_write_to(state).err().map(|err| err.to_string()),
        })
    }

    /// The rows of the version, where every file's statistics say them.
    pub fn rows(&self) -> Option<u64> {
        self.files.iter().map(|f| f.rows).sum()
    }

    /// The bytes of its files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// The protocol of a table of `schema`: the oldest readers and writers read it (plain Parquet files, no deletion
/// vectors, no column mapping), with the one table feature its columns may need: timestamps without a time zone
/// (`timestampNtz`, which Spark 3.4, DuckDB and the `deltalake` package read).
pub(crate) fn protocol(schema: &StructType) -> Protocol {
    let value = if needs_timestamp_ntz(schema) {
        serde_json::json!({
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["timestampNtz"],
            "writerFeatures": ["timestampNtz"],
        })
    } else {
        serde_json::json!({ "minReaderVersion": 1, "minWriterVersion": 2 })
    };
    serde_json::from_value(value).expect("the protocols of reader 1 and writer 2, or 3 and 7, are valid")
}

/// Whether a column (at any depth) is a timestamp without a time zone.
pub(crate) fn needs_timestamp_ntz(schema: &StructType) -> bool {
    serde_json::to_string(schema).is_ok_and(|text| text.contains("\"timestamp_ntz\""))
}

/// A table's metadata with `schema` and `properties`: the one it had (`existing`, its id and creation time
/// kept), or a new one when it had none or when it is created again at `created_ms`.
pub(crate) fn metadata(
    schema: &StructType,
    existing: Option<&Metadata>,
    properties: &HashMap<String, String>,
    created_ms: Option<i64>,
) -> Result<Metadata, deltalake::DeltaTableError> {
    let base = match existing.filter(|_| created_ms.is_none()) {
        Some(existing) => existing.clone(),
        #[allow(deprecated)]
        None => {
            deltalake::kernel::new_metadata(schema, Vec::<String>::new(), Vec::<(String, String)>::new())?
        }
    };
    let mut value = serde_json::to_value(&base)?;
    value["schemaString"] = serde_json::Value::String(serde_json::to_string(schema)?);
    value["configuration"] = serde_json::to_value(properties)?;
    if let Some(created) = created_ms {
        value["createdTime"] = created.into();
    }
    Ok(serde_json::from_value(value)?)
}

/// The columns as the Delta log states them, for other readers: Delta's types are fewer than Arrow's, so a type
/// it lacks is logged as the one its readers read the Parquet column as (timestamps in microseconds, with UTC
/// for any time zone; times of day and durations as their integers; half floats as floats). The files keep
/// their own types, which are what this service reads.
pub(crate) fn loggable(schema: &Schema) -> Schema {
    Schema::new_with_metadata(logged_fields(schema.fields()), schema.metadata().clone())
}

fn logged_fields(fields: &Fields) -> Fields {
    fields.iter().map(|f| Arc::new(f.as_ref().clone().with_data_type(logged(f.data_type())))).collect()
}

fn logged(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Timestamp(_, zone) => {
            DataType::Timestamp(TimeUnit::Microsecond, zone.as_ref().map(|_| Arc::from("UTC")))
        }
        DataType::Time32(_) => DataType::Int32,
        DataType::Time64(_) | DataType::Duration(_) | DataType::Interval(_) => DataType::Int64,
        DataType::Float16 => DataType::Float32,
        DataType::Date64 => DataType::Date32,
        DataType::Dictionary(_, values) => logged(values),
        DataType::Struct(fields) => DataType::Struct(logged_fields(fields)),
        DataType::List(item)
        | DataType::LargeList(item)
        | DataType::ListView(item)
        | DataType::LargeListView(item) => {
            DataType::List(Arc::new(Field::new(item.name(), logged(item.data_type()), item.is_nullable())))
        }
        DataType::FixedSizeList(item, _) => {
            DataType::List(Arc::new(Field::new(item.name(), logged(item.data_type()), item.is_nullable())))
        }
        DataType::Map(entries, sorted) => {
            let entries = Field::new(entries.name(), logged(entries.data_type()), entries.is_nullable());
            DataType::Map(Arc::new(entries), *sorted)
        }
        other => other.clone(),
    }
}
