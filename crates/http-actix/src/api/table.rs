//! A table record, the answer of an append, and a table's preview.

use domain::{QueryResult, TableSource};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::names;

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = TableColumn)]
pub struct Column {
    pub name: String,
    #[serde(rename = "type")]
    #[schema(schema_with = names::column_type)]
    pub column_type: domain::ColumnType,
    pub nullable: bool,
}

/// A project's table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Table {
    pub name: String,
    pub columns: Vec<Column>,
    /// Null when it is not known without reading every row: external CSV and NDJSON files, a PostgreSQL table.
    pub row_count: Option<u64>,
    /// The size of its files; null for a PostgreSQL table.
    pub bytes: Option<u64>,
    /// How many files hold its rows; null for a PostgreSQL table. Compaction keeps it small for a table that
    /// takes many small appends.
    pub files: Option<u64>,
    /// When compaction last merged the table's small files; null if it never has.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub last_compacted_at: Option<OffsetDateTime>,
    /// How its files are laid out for the endpoints that read it.
    pub layout: Layout,
    /// How its rows are kept: `parquet` for uploads, the external files' format, or `postgres`.
    #[schema(schema_with = names::table_format)]
    pub format: String,
    /// `upload` for rows sent over HTTP or loaded with the CLI; else the external source's URL, without its
    /// password.
    pub source: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The endpoints whose current version reads the table.
    pub used_by: Vec<String>,
}

/// How a table's files are laid out for the endpoints that read it: compaction sorts them by the columns those
/// endpoints filter on with variables (or by the columns set for the table), so that a run reads the row
/// groups and pages of its values only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = TableLayout)]
pub struct Layout {
    /// The columns its compacted files are sorted by, first to last (at most two): the columns the most
    /// endpoints reading it compare with a variable. Empty when none does, and for an external source, which is
    /// read as it is.
    pub cluster_by: Vec<String>,
    /// How many of its files are sorted so; the others are appends not compacted yet.
    pub files_clustered: u64,
    /// The columns set for the table (`PATCH` with `cluster_by`), which compaction sorts by in place of those
    /// its endpoints filter on; null when its endpoints choose.
    pub pinned: Option<Vec<String>>,
}

/// One version of a table: a commit of its Delta log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TableVersion {
    /// The version this commit made, from 0.
    pub version: u64,
    /// When it was committed.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// What made it: `WRITE` (a replace or an append), `OPTIMIZE` (a compaction), or another writer's operation.
    pub operation: String,
    /// Rows it added; null where the log does not say.
    #[schema(required = true)]
    pub rows_added: Option<u64>,
    /// Rows it removed (a replace removes the table's rows); null where the log does not say.
    #[schema(required = true)]
    pub rows_removed: Option<u64>,
}

impl From<domain::TableCommit> for TableVersion {
    fn from(commit: domain::TableCommit) -> Self {
        let domain::TableCommit { version, at, operation, rows_added, rows_removed } = commit;
        Self { version, at, operation, rows_added, rows_removed }
    }
}

impl From<domain::Table> for Table {
    fn from(table: domain::Table) -> Self {
        let info = table.info;
        Self {
            name: info.name.to_string(),
            columns: info
                .columns
                .into_iter()
                .map(|c| Column { name: c.name, column_type: c.column_type, nullable: c.nullable })
                .collect(),
            row_count: info.row_count,
            bytes: info.bytes,
            files: info.files,
            last_compacted_at: info.last_compacted_at,
            layout: Layout {
                cluster_by: info.layout.cluster_by,
                files_clustered: info.layout.files_clustered,
                pinned: info.layout.pinned,
            },
            format: info.source.format().to_owned(),
            source: match info.source {
                TableSource::Upload => "upload".into(),
                TableSource::External(source) => source.url().to_owned(),
            },
            created_at: info.created_at,
            updated_at: info.updated_at,
            used_by: table.used_by.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Rows added to a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Appended {
    /// The rows added to the table.
    pub rows_added: u64,
    /// The rows set aside in the table's quarantine table (`on_error=quarantine`); 0 otherwise.
    pub rows_quarantined: u64,
    /// The size of the body.
    pub bytes_received: u64,
    /// The table after the append.
    pub table: Table,
}

impl Appended {
    pub(crate) fn of(table: domain::Table, written: domain::Written) -> Self {
        Self {
            rows_added: written.rows,
            rows_quarantined: written.rows_quarantined,
            bytes_received: written.bytes,
            table: table.into(),
        }
    }
}

/// The first rows of a table, as a run writes rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Preview {
    pub name: String,
    /// The column names, in order.
    pub columns: Vec<String>,
    /// `[name, type]` of each column.
    #[schema(value_type = Vec<Vec<String>>)]
    pub types: Vec<(String, domain::ColumnType)>,
    /// Rows keyed by column name.
    #[schema(value_type = Vec<Object>)]
    pub results: Value,
    /// Whether rows follow these.
    #[serde(rename = "hasMore")]
    pub has_more: bool,
    pub limit: u32,
}

impl Preview {
    pub(crate) fn of(name: &str, limit: u32, result: QueryResult) -> Self {
        Self {
            name: name.to_owned(),
            columns: result.columns.iter().map(|c| c.name.clone()).collect(),
            types: result.columns.iter().map(|c| (c.name.clone(), c.column_type)).collect(),
            // A preview is at most a thousand rows: parsing them again costs nothing worth keeping them raw for.
            results: serde_json::from_str(&result.rows_json).unwrap_or(Value::Array(Vec::new())),
            has_more: result.has_more,
            limit,
        }
    }
}
