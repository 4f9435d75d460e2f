//! A project's tables as the API shows them: their names, columns, sizes and where their rows come from, and
//! what an upload is.

use std::fmt;

use bytes::Bytes;
use futures_util::stream::BoxStream;

use crate::clock::Timestamp;
use crate::endpoints::EndpointName;
use crate::error::Invalid;
use crate::query::ColumnType;

/// A table name: a letter, then letters, digits and `_`, at most 63 characters. A table is named in SQL as it
/// is: a name with capital letters is written in double quotes (`"Sales"`), as SQL folds unquoted names to
/// lower case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName(String);

impl TableName {
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

/// Where a table's rows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableSource {
    /// Uploaded (over HTTP or with the CLI) and kept in the storage as Parquet.
    Upload,
}

/// A table as its store describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    pub name: TableName,
    pub columns: Vec<TableColumn>,
    pub row_count: u64,
    /// The size of its files.
    pub bytes: u64,
    pub format: TableFormat,
    pub source: TableSource,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
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
}

impl fmt::Debug for Upload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upload")
            .field("format", &self.format)
            .field("mode", &self.mode)
            .field("limit_bytes", &self.limit_bytes)
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
}

#[cfg(test)]
mod tests {
    use super::TableName;

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
