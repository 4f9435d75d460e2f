//! A project's tables as the API shows them: their names, columns, sizes and where their rows come from, and
//! what an upload is.

use std::fmt;

use bytes::Bytes;
use futures_util::stream::BoxStream;

use crate::clock::Timestamp;
use crate::endpoints::EndpointName;
use crate::error::{Error, Invalid};
use crate::fields::Fields;
use crate::query::ColumnType;

use super::layout::TableLayout;

/// A table name: a letter, then letters, digits and `_`, at most 63 characters. A table is named in SQL as it
/// is: a name with capital letters is written in double quotes (`"Sales"`), as SQL folds unquoted names to
/// lower case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName(String);

impl TableName {
    /// The suffix of a table's quarantine table: `events` sets its bad rows aside in `events_quarantine`.
    pub const QUARANTINE_SUFFIX: &'static str = "_quarantine";

    /// The table appends to this one set their bad rows aside in (`?on_error=quarantine`).
    ///
    /// # Errors
    /// [`Invalid`] (attr `on_error`) when that name would be longer than a table's may be.
    pub fn quarantine(&self) -> Result<TableName, Invalid> {
        TableName::parse(&format!("{self}{}", Self::QUARANTINE_SUFFIX)).map_err(|_| {
            Invalid::field(
                "on_error",
                format!(
                    "Table '{self}' has too long a name for its quarantine table ({} characters at most).",
                    Self::MAX_LEN
                ),
            )
        })
    }

    pub const MAX_LEN: usize = 63;

    /// The rule [`TableName::is_valid`] checks, as a regular expression for documents that describe names.
    pub const PATTERN: &'static str = "^[A-Za-z][A-Za-z0-9_]{0,62}$";

    /// # Errors
    /// [`Invalid`] (attr `table`) when the name breaks the rule.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        if Self::is_valid(raw) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(Invalid::field(
                "table",
                "A table name starts with a letter and has only letters, digits and '_' (at most 63 characters).",
            ))
        }
    }

    /// A name from a URL path: one that cannot be valid names no table, so it is not found, not invalid.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the name breaks the rule.
    pub fn from_path(raw: &str) -> Result<Self, Error> {
        Self::parse(raw).map_err(|_| Error::table_not_found(raw))
    }

    pub fn is_valid(raw: &str) -> bool {
        let mut chars = raw.chars();
        raw.len() <= Self::MAX_LEN
            && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The format of a table's files, or of an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// With a header row.
    Csv,
    /// One JSON object per line.
    NdJson,
    Parquet,
}

impl TableFormat {
    pub const ALL: [TableFormat; 3] = [Self::Csv, Self::NdJson, Self::Parquet];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Csv => "csv",
            Self::NdJson => "ndjson",
            Self::Parquet => "parquet",
        }
    }
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableColumn {
    pub name: String,
    pub column_type: ColumnType,
    pub nullable: bool,
}

/// Rows a table reads where they are, without copying them: files in a bucket (or a directory), or a table of
/// a PostgreSQL database. Its `Debug` leaves the URL out, as a database URL may carry a password.
#[derive(Clone, PartialEq, Eq)]
pub enum ExternalSource {
    /// Every file of `format` under `url` when it ends in `/` (a prefix), else the one file `url` names.
    Files { url: String, format: TableFormat },
    /// The Delta Lake table at `url` (its folder, holding `_delta_log/`), read at its newest version.
    Delta { url: String },
    /// The table `table` (`name` or `schema.name`) of the PostgreSQL database `url` names
    /// (`postgres://[user[:password]@]host[:port]/database[?sslmode=...]`).
    Postgres { url: String, table: String },
}

impl fmt::Debug for ExternalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Files { format, .. } => {
                f.debug_struct("Files").field("format", format).finish_non_exhaustive()
            }
            Self::Delta { .. } => f.debug_struct("Delta").finish_non_exhaustive(),
            Self::Postgres { table, .. } => {
                f.debug_struct("Postgres").field("table", table).finish_non_exhaustive()
            }
        }
    }
}

impl ExternalSource {
    /// The fields of `source` in a request body.
    pub const FIELDS: [&'static str; 3] = ["url", "format", "table"];

    /// The `format` of a Delta table.
    pub const DELTA: &'static str = "delta";

    /// Every `format` a source of files may name: the files' own, or `delta` for a Delta table.
    pub const FORMATS: [&'static str; 4] = ["csv", "ndjson", "parquet", Self::DELTA];

    /// Where the source is: a prefix, a file, a Delta table's folder or a database.
    pub fn url(&self) -> &str {
        match self {
            Self::Files { url, .. } | Self::Delta { url } | Self::Postgres { url, .. } => url,
        }
    }

    /// The same source, its URL as `shown` shows it (without a password, for a record people read).
    #[must_use]
    pub fn shown_as(mut self, shown: impl FnOnce(&str) -> String) -> Self {
        match &mut self {
            Self::Files { url, .. } | Self::Delta { url } | Self::Postgres { url, .. } => *url = shown(url),
        }
        self
    }

    /// The URL schemes of PostgreSQL databases.
    pub const POSTGRES_SCHEMES: [&'static str; 2] = ["postgres", "postgresql"];

    fn parse_source(source: &serde_json::Value) -> Result<Self, Invalid> {
        let fields = Fields::new(source, &Self::FIELDS)?;
        let text = |key: &str| fields.nullable_string(key).map(Option::flatten);
        let url = text("url")?.ok_or_else(|| Invalid::required("url"))?;
        let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
        let Some(scheme) = scheme.filter(|s| !s.is_empty()) else {
            return Err(Invalid::field(
                "url",
                "url must be a URL: s3://bucket/prefix/, file:///dir/ or postgres://host/db.",
            ));
        };
        let (format, table) = (text("format")?, text("table")?);
        if Self::POSTGRES_SCHEMES.contains(&scheme.as_str()) {
            if format.is_some() {
                return Err(Invalid::field(
                    "format",
                    "A PostgreSQL source has no format: name its table instead.",
                ));
            }
            let table = table.ok_or_else(|| Invalid::required("table"))?;
            if !Self::is_postgres_table(&table) {
                return Err(Invalid::field(
                    "table",
                    "table must be a PostgreSQL table name, 'name' or 'schema.name', of letters, digits and '_'.",
                ));
            }
            return Ok(Self::Postgres { url, table });
        }
        if table.is_some() {
            return Err(Invalid::field(
                "table",
                "Only a PostgreSQL source names a table; files have a format.",
            ));
        }
        let format = format.ok_or_else(|| Invalid::required("format"))?;
        if format == Self::DELTA {
            return Ok(Self::Delta { url });
        }
        let format = TableFormat::ALL.into_iter().find(|f| f.as_str() == format).ok_or_else(|| {
            Invalid::field("format", format!("Unknown format '{format}': use parquet, csv, ndjson or delta."))
        })?;
        Ok(Self::Files { url, format })
    }

    /// `name` or `schema.name`, each part an unquoted PostgreSQL identifier of at most 63 characters.
    fn is_postgres_table(raw: &str) -> bool {
        let part = |p: &str| {
            let mut chars = p.chars();
            p.len() <= 63
                && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        match raw.split_once('.') {
            Some((schema, name)) => part(schema) && part(name),
            None => part(raw),
        }
    }
}

/// Reads the source a request body names: `{"source": {"url": ..., "format": ...}}` for files,
/// `{"source": {"url": "postgres://...", "table": ...}}` for a PostgreSQL table. An error names the field
/// (`source.url`, `source.format`, `source.table`, or another key).
impl TryFrom<&serde_json::Value> for ExternalSource {
    type Error = Invalid;

    fn try_from(body: &serde_json::Value) -> Result<Self, Invalid> {
        let outer = Fields::new(body, &["source"])?;
        let inner = outer.get("source").ok_or_else(|| Invalid::required("source"))?;
        if !inner.is_object() {
            return Err(Invalid::field(
                "source",
                "source must be an object: {\"url\": ..., \"format\": ...}.",
            ));
        }
        Self::parse_source(inner).map_err(|e| e.within("source"))
    }
}

/// Where a table's rows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableSource {
    /// Uploaded (over HTTP or with the CLI) and kept in the storage as Parquet.
    Upload,
    /// Read where they are. In a table record the URL is shown without a password.
    External(ExternalSource),
}

impl TableSource {
    /// Every value of [`TableSource::format`].
    pub const FORMATS: [&'static str; 5] = ["csv", "ndjson", "parquet", "delta", "postgres"];

    /// How the rows are kept: `parquet` for uploads, the files' format, or `postgres`.
    pub fn format(&self) -> &'static str {
        match self {
            Self::Upload => TableFormat::Parquet.as_str(),
            Self::External(ExternalSource::Files { format, .. }) => format.as_str(),
            Self::External(ExternalSource::Delta { .. }) => ExternalSource::DELTA,
            Self::External(ExternalSource::Postgres { .. }) => "postgres",
        }
    }
}

/// A table as its store describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    pub name: TableName,
    pub columns: Vec<TableColumn>,
    /// `None` when it is not known without reading every row (external CSV and NDJSON files, a PostgreSQL
    /// table).
    pub row_count: Option<u64>,
    /// The size of its files; `None` for a PostgreSQL table.
    pub bytes: Option<u64>,
    /// How many files hold its rows; `None` for a PostgreSQL table.
    pub files: Option<u64>,
    /// When compaction last merged its small files; `None` if it never has.
    pub last_compacted_at: Option<Timestamp>,
    /// How its files are laid out for the endpoints that read it (nothing for an external source).
    pub layout: TableLayout,
    pub source: TableSource,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// One commit of a table's log (a table's version): what changed it and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCommit {
    /// The table's version this commit made (0 for the first).
    pub version: u64,
    pub at: Timestamp,
    /// What made it, as the log names it: `WRITE` (a replace or an append), `OPTIMIZE` (a compaction), `CREATE
    /// TABLE`, or another writer's operation.
    pub operation: String,
    /// Rows it added and removed, where the log says (a compaction adds and removes none: the same rows in
    /// fewer files).
    pub rows_added: Option<u64>,
    pub rows_removed: Option<u64>,
}

/// The appends a compaction leaves findable by their write ids ([`TableStore::holds`](super::TableStore::holds)):
/// those `pending` when it began, and every file committed after the table's version `after` (read before
/// `pending` was: an append committed later may have been claimed after the list was read, and its writer may
/// stop before answering, so its retry must find it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findable {
    pub pending: Vec<uuid::Uuid>,
    pub after: u64,
}

/// What one compaction of a table did: its small files merged into `files_written`, the files it had and has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub files_before: u64,
    pub files_after: u64,
    /// The small files merged, and the rows they held.
    pub files_merged: u64,
    pub rows_merged: u64,
}

/// A table with the endpoints whose current version reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub info: TableInfo,
    pub used_by: Vec<EndpointName>,
}

/// Whether an upload replaces a table (creating it if need be) or adds rows to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    Replace,
    Append,
}

/// The body of an upload, as it arrives: chunks of bytes, or the error that cut it off.
pub type UploadBody = BoxStream<'static, Result<Bytes, std::io::Error>>;

/// An upload to a table.
pub struct Upload {
    pub format: TableFormat,
    pub mode: WriteMode,
    pub body: UploadBody,
    /// The most bytes the body may have.
    pub limit_bytes: u64,
    /// For an append under an `Idempotency-Key`: what the engine keeps with its rows.
    pub tag: Option<super::AppendTag>,
    /// For an append: rows that do not fit the table go to its quarantine table instead of refusing the body.
    pub quarantine: bool,
}

impl Upload {
    /// Where this append sets its bad rows aside: `name`'s quarantine table. Quarantine reads text records one
    /// by one, so it takes CSV and NDJSON bodies.
    ///
    /// # Errors
    /// [`Invalid`] (attr `on_error`) for a Parquet body, or a table whose quarantine table's name is too long.
    pub fn quarantine_table(&self, name: &TableName) -> Result<TableName, Invalid> {
        if self.format == TableFormat::Parquet {
            return Err(Invalid::field(
                "on_error",
                "on_error=quarantine takes CSV and NDJSON bodies: a Parquet body's columns fit the table or not, \
                 as a whole.",
            ));
        }
        name.quarantine()
    }

    /// Whether an append's `on_error` asks for quarantine: `fail` (or nothing) refuses a body with a row that
    /// does not fit, `quarantine` sets such rows aside.
    ///
    /// # Errors
    /// [`Invalid`] (attr `on_error`) for any other value.
    pub fn quarantines(on_error: Option<&str>) -> Result<bool, Invalid> {
        match on_error {
            None | Some("fail") => Ok(false),
            Some("quarantine") => Ok(true),
            Some(other) => Err(Invalid::field(
                "on_error",
                format!("on_error is 'fail' (the default) or 'quarantine', not '{other}'."),
            )),
        }
    }
}

impl fmt::Debug for Upload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upload")
            .field("format", &self.format)
            .field("mode", &self.mode)
            .field("limit_bytes", &self.limit_bytes)
            .field("quarantine", &self.quarantine)
            .finish_non_exhaustive()
    }
}

/// What an upload wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The rows the upload held.
    pub rows: u64,
    /// The bytes of its body.
    pub bytes: u64,
    /// Whether it created the table (a replace of a table that did not exist).
    pub created: bool,
    /// Rows that did not fit the table, written to its quarantine table instead (an append with
    /// [`Upload::quarantine`]).
    pub rows_quarantined: u64,
}

#[cfg(test)]
mod tests {
    use super::{TableFormat, TableName, Upload, WriteMode};

    #[test]
    fn an_append_quarantines_text_into_its_tables_quarantine_table() {
        let upload = |format| Upload {
            format,
            mode: WriteMode::Append,
            body: Box::pin(futures_util::stream::empty()),
            limit_bytes: 1,
            tag: None,
            quarantine: true,
        };
        let events = TableName::parse("events").unwrap();
        for format in [TableFormat::Csv, TableFormat::NdJson] {
            assert_eq!(upload(format).quarantine_table(&events).unwrap().as_str(), "events_quarantine");
        }
        let parquet = upload(TableFormat::Parquet).quarantine_table(&events).unwrap_err();
        assert_eq!(parquet.attr.as_deref(), Some("on_error"));
        let longest = TableName::parse(&"t".repeat(TableName::MAX_LEN)).unwrap();
        let too_long = upload(TableFormat::Csv).quarantine_table(&longest).unwrap_err();
        assert!(too_long.detail.contains("too long"), "{}", too_long.detail);
    }

    #[test]
    fn names_follow_the_rule() {
        for ok in ["a", "Sales_2026", &format!("t{}", "x".repeat(62))] {
            assert!(TableName::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "_a", "1a", "a-b", "a b", "a.b", "é", "\"a\"", &format!("t{}", "x".repeat(63))] {
            assert_eq!(TableName::parse(bad).unwrap_err().attr.as_deref(), Some("table"), "{bad}");
        }
    }
}
