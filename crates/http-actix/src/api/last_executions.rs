//! The answer of a last-execution-times lookup: `{"query_status": {...}}`, in the shape of the reference
//! product's query status.

use domain::{LastExecutions, ProjectId};
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::millis;

/// Counts of the lookup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueryProgress {
    /// Microseconds spent.
    pub active_cpu_time: u64,
    pub bytes_read: u64,
    /// The names asked for.
    pub estimated_rows_total: u64,
    pub rows_read: u64,
    /// Milliseconds.
    pub time_elapsed: f64,
}

/// The lookup, as a completed synchronous query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueryStatus {
    pub id: Uuid,
    /// The project's id.
    pub team_id: i64,
    pub complete: bool,
    pub error: bool,
    #[schema(required = true)]
    pub error_message: Option<String>,
    pub query_async: bool,
    #[schema(required = true)]
    pub dashboard_id: Option<i64>,
    #[schema(required = true)]
    pub insight_id: Option<i64>,
    #[schema(required = true)]
    pub labels: Option<Vec<String>>,
    #[serde(with = "time::serde::rfc3339")]
    pub start_time: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub pickup_time: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub end_time: OffsetDateTime,
    #[schema(required = true)]
    pub expiration_time: Option<String>,
    #[schema(required = true)]
    pub task_id: Option<String>,
    /// `[name, last_executed_at]` of each endpoint that ran in the past six months, by name.
    #[schema(value_type = Vec<Vec<String>>)]
    pub results: Vec<(String, String)>,
    pub query_progress: QueryProgress,
}

/// The last execution times of the endpoints asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LastExecutionTimes {
    pub query_status: QueryStatus,
}

impl LastExecutionTimes {
    pub(crate) fn of(project: ProjectId, found: LastExecutions) -> Self {
        let results = found
            .results
            .into_iter()
            .map(|(name, at)| {
                let at =
                    at.format(&Rfc3339).expect("execution times come from the clock, within years 0 to 9999");
                (name.as_str().to_owned(), at)
            })
            .collect();
        let query_progress = QueryProgress {
            active_cpu_time: u64::try_from(found.elapsed.as_micros()).unwrap_or(u64::MAX),
            bytes_read: found.bytes_read,
            estimated_rows_total: found.names_requested as u64,
            rows_read: found.rows_read,
            time_elapsed: millis(found.elapsed),
        };
        let query_status = QueryStatus {
            id: found.id,
            team_id: project.get(),
            complete: true,
            error: false,
            error_message: None,
            query_async: false,
            dashboard_id: None,
            insight_id: None,
            labels: None,
            start_time: found.start_time,
            pickup_time: found.start_time,
            end_time: found.end_time,
            expiration_time: None,
            task_id: None,
            results,
            query_progress,
        };
        Self { query_status }
    }
}
