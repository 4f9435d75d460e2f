//! The last execution times of several endpoints over the past six months.

use std::time::{Duration, Instant};

use serde_json::Value;
use uuid::Uuid;

use super::service::RunService;
use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::endpoints::EndpointName;
use crate::error::{Error, Invalid};
use crate::fields::Fields;

/// The answer of a last-execution-times lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct LastExecutions {
    pub id: Uuid,
    /// Names that ran in the window, with their last time, ordered by name.
    pub results: Vec<(EndpointName, Timestamp)>,
    pub names_requested: usize,
    /// Rows the store returned for the lookup.
    pub rows_read: u64,
    /// Bytes of the names and times read.
    pub bytes_read: u64,
    pub start_time: Timestamp,
    pub end_time: Timestamp,
    pub elapsed: Duration,
}

/// The most names one lookup accepts.
pub const MAX_NAMES: usize = 1000;

/// The same instant six calendar months earlier (the day clamped to the month's length).
pub fn six_months_before(now: Timestamp) -> Timestamp {
    let mut year = now.year();
    let mut month = i32::from(u8::from(now.month())) - 6;
    if month <= 0 {
        month += 12;
        year -= 1;
    }
    let month = u8::try_from(month).ok().and_then(|m| time::Month::try_from(m).ok()).unwrap_or(now.month());
    let day = now.day().min(month.length(year));
    time::Date::from_calendar_date(year, month, day).map_or(now, |date| now.replace_date(date))
}

/// The endpoints whose last execution times are asked for: between 1 and [`MAX_NAMES`] names, each once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastExecutionsRequest {
    names: Vec<EndpointName>,
}

impl LastExecutionsRequest {
    /// The names, each once, in the order first given.
    ///
    /// # Errors
    /// [`Invalid`] (attr `names`) for no names or more than [`MAX_NAMES`].
    pub fn new(names: impl IntoIterator<Item = EndpointName>) -> Result<Self, Invalid> {
        let mut unique = Vec::new();
        for (i, name) in names.into_iter().enumerate() {
            if i == MAX_NAMES {
                return Err(count_error());
            }
            if !unique.contains(&name) {
                unique.push(name);
            }
        }
        if unique.is_empty() {
            return Err(count_error());
        }
        Ok(Self { names: unique })
    }

    pub fn names(&self) -> &[EndpointName] {
        &self.names
    }
}

fn count_error() -> Invalid {
    Invalid::field("names", format!("names must hold between 1 and {MAX_NAMES} endpoint names."))
}

/// Reads a body `{"names": [...]}`.
impl TryFrom<&Value> for LastExecutionsRequest {
    type Error = Invalid;

    fn try_from(body: &Value) -> Result<Self, Invalid> {
        let fields = Fields::new(body, &["names"])?;
        let invalid = |detail: String| Invalid::field("names", detail);
        let items = match fields.get("names") {
            None | Some(Value::Null) => return Err(Invalid::required("names")),
            Some(Value::Array(items)) => items,
            Some(_) => return Err(invalid("names must be an array of endpoint names.".into())),
        };
        if items.is_empty() || items.len() > MAX_NAMES {
            return Err(count_error());
        }
        let names = items.iter().map(|item| {
            let raw = item.as_str().ok_or_else(|| invalid("names must be an array of strings.".into()))?;
            EndpointName::parse(raw).map_err(|_| invalid(format!("'{raw}' is not a valid endpoint name.")))
        });
        Self::new(names.collect::<Result<Vec<_>, _>>()?)
    }
}

impl RunService {
    /// Last execution times within the past six months of the listed endpoints; unknown names and older runs
    /// are left out.
    ///
    /// # Errors
    /// Store failures.
    pub async fn last_execution_times(
        &self,
        project: ProjectId,
        request: &LastExecutionsRequest,
    ) -> Result<LastExecutions, Error> {
        let names = request.names();
        let started = Instant::now();
        let start_time = self.clock.now();
        let since = six_months_before(start_time);
        let (results, rows_read) = self.executions.last_executed(project, names, since).await?;
        let bytes_read = results.iter().map(|(name, _)| name.as_str().len() as u64 + 8).sum();
        Ok(LastExecutions {
            id: Uuid::new_v4(),
            results,
            names_requested: names.len(),
            rows_read,
            bytes_read,
            start_time,
            end_time: self.clock.now(),
            elapsed: started.elapsed(),
        })
    }
}
