//! Rows written in another format than JSON: the formats, and a written page ready to send.

use std::fmt;

use bytes::Bytes;
use futures_util::stream::BoxStream;

use super::plan::Column;
use crate::error::Invalid;

/// How a run's rows are written: JSON (the run answer), or a whole page as CSV, NDJSON, Parquet or Arrow IPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ResultFormat {
    #[default]
    Json,
    /// With a header row.
    Csv,
    NdJson,
    Parquet,
    /// The Arrow IPC stream format.
    Arrow,
}

impl ResultFormat {
    pub const ALL: [ResultFormat; 5] = [Self::Json, Self::Csv, Self::NdJson, Self::Parquet, Self::Arrow];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Csv => "csv",
            Self::NdJson => "ndjson",
            Self::Parquet => "parquet",
            Self::Arrow => "arrow",
        }
    }

    /// The media type a page in this format is sent as.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Csv => "text/csv",
            Self::NdJson => "application/x-ndjson",
            Self::Parquet => "application/vnd.apache.parquet",
            Self::Arrow => "application/vnd.apache.arrow.stream",
        }
    }

    /// Other media types a client may ask for it by.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            Self::NdJson => &["application/ndjson", "application/jsonl"],
            Self::Json | Self::Csv | Self::Parquet | Self::Arrow => &[],
        }
    }

    /// Whether a page in this format is bytes rather than text.
    pub fn is_binary(self) -> bool {
        matches!(self, Self::Parquet | Self::Arrow)
    }

    /// # Errors
    /// [`Invalid`] (attr `format`) for any other name.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        Self::ALL.into_iter().find(|f| f.as_str() == raw).ok_or_else(|| {
            Invalid::field(
                "format",
                format!("format must be one of {}.", Self::ALL.map(Self::as_str).join(", ")),
            )
        })
    }
}

/// A page of rows written in an export format, held outside memory (the engine's temporary file) until it is
/// sent.
pub struct Export {
    pub columns: Vec<Column>,
    /// The rows written.
    pub rows: u64,
    /// Whether rows follow this page.
    pub has_more: bool,
    /// The size of the written page.
    pub bytes: u64,
    /// A digest of the written bytes (32 hex digits): the same page has the same one.
    pub digest: String,
    /// The written bytes, read as they are sent.
    pub body: BoxStream<'static, Result<Bytes, std::io::Error>>,
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("columns", &self.columns)
            .field("rows", &self.rows)
            .field("has_more", &self.has_more)
            .field("bytes", &self.bytes)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}
