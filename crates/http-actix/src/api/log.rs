//! An endpoint's run log as the API answers it: a page of records, and usage buckets.

use domain::{LogPage, LogRecord, UsageBucket, UsageQuery};
use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::millis;

/// One run or refresh. It never holds a variable's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    pub id: Uuid,
    /// When the request (or refresh) began.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub endpoint: String,
    /// The version that ran; null when the run failed before one was chosen.
    #[schema(required = true)]
    pub version: Option<u32>,
    #[schema(inline)]
    pub kind: LogKindName,
    /// The HTTP status the run was answered with (a refresh: 200, or the status its failure would have had).
    pub status: u16,
    /// The error code of a failure.
    #[schema(required = true)]
    pub code: Option<String>,
    pub duration_ms: f64,
    /// Rows answered (a refresh: rows stored).
    #[schema(required = true)]
    pub rows: Option<u64>,
    /// Bytes read from storage; null when nothing was computed or the engine cannot tell.
    #[schema(required = true)]
    pub bytes_read: Option<u64>,
    #[schema(required = true, inline)]
    pub source: Option<LogSourceName>,
    /// The API key's label, or the run token's id.
    #[schema(required = true)]
    pub credential: Option<String>,
    #[schema(required = true, inline)]
    pub transport: Option<TransportName>,
    /// The request's `X-Request-Id`.
    #[schema(required = true)]
    pub request_id: Option<String>,
    /// How many runs the record stands for: 1, or for a sample of runs refused with 429 past the project's
    /// share of the log, the refused runs it was kept for.
    #[schema(minimum = 1)]
    pub runs: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogKindName {
    Run,
    Refresh,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogSourceName {
    Cache,
    Materialized,
    Live,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransportName {
    Rest,
    Mcp,
}

impl From<LogRecord> for LogEntry {
    fn from(record: LogRecord) -> Self {
        Self {
            id: record.id,
            at: record.at,
            endpoint: record.endpoint,
            version: record.version,
            kind: match record.kind {
                domain::LogKind::Run => LogKindName::Run,
                domain::LogKind::Refresh => LogKindName::Refresh,
            },
            status: record.status,
            code: record.code,
            duration_ms: millis(record.duration),
            rows: record.rows,
            bytes_read: record.bytes_read,
            source: record.source.map(|source| match source {
                domain::LogSource::Cache => LogSourceName::Cache,
                domain::LogSource::Materialized => LogSourceName::Materialized,
                domain::LogSource::Live => LogSourceName::Live,
            }),
            credential: record.credential.map(|credential| credential.to_string()),
            transport: record.transport.map(|transport| match transport {
                domain::Transport::Rest => TransportName::Rest,
                domain::Transport::Mcp => TransportName::Mcp,
            }),
            request_id: record.request_id,
            runs: record.runs,
        }
    }
}

/// A page of an endpoint's log, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogList {
    pub results: Vec<LogEntry>,
    /// Pass as `cursor` for the next page; null on the last.
    #[schema(required = true)]
    pub next: Option<String>,
}

impl From<LogPage> for LogList {
    fn from(page: LogPage) -> Self {
        Self {
            results: page.records.into_iter().map(LogEntry::from).collect(),
            next: page.next.map(|cursor| cursor.text()),
        }
    }
}

/// One bucket of usage: the runs that began in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageBucketBody {
    /// Where the bucket begins.
    #[serde(with = "time::serde::rfc3339")]
    pub start: OffsetDateTime,
    pub requests: u64,
    /// Runs answered with a status of 400 or more.
    pub errors: u64,
    /// Runs answered from the cache.
    pub cache_hits: u64,
    /// Latency percentiles in milliseconds (nearest rank over every run); null without runs.
    #[schema(required = true)]
    pub p50_ms: Option<f64>,
    #[schema(required = true)]
    pub p95_ms: Option<f64>,
    #[schema(required = true)]
    pub p99_ms: Option<f64>,
    pub rows: u64,
    pub bytes_read: u64,
}

/// An endpoint's usage in buckets over a range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub until: OffsetDateTime,
    /// minute, hour or day.
    #[schema(value_type = String)]
    pub interval: Cow<'static, str>,
    pub buckets: Vec<UsageBucketBody>,
}

impl Usage {
    pub(crate) fn of(query: UsageQuery, buckets: Vec<UsageBucket>) -> Self {
        let round = |ms: Option<f64>| ms.map(|ms| (ms * 1000.0).round() / 1000.0);
        Self {
            since: query.since,
            until: query.until,
            interval: Cow::Borrowed(query.interval.as_str()),
            buckets: buckets
                .into_iter()
                .map(|bucket| UsageBucketBody {
                    start: bucket.start,
                    requests: bucket.requests,
                    errors: bucket.errors,
                    cache_hits: bucket.cache_hits,
                    p50_ms: round(bucket.p50_ms),
                    p95_ms: round(bucket.p95_ms),
                    p99_ms: round(bucket.p99_ms),
                    rows: bucket.rows,
                    bytes_read: bucket.bytes_read,
                })
                .collect(),
        }
    }
}
