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

fn parse_names(body: &Value) -> Result<Vec<EndpointName>, Error> {
    let fields = Fields::new(body, &["names"])?;
    let invalid = |detail: String| Error::Invalid(Invalid::field("names", detail));
    let items = match fields.get("names") {
        None | Some(Value::Null) => return Err(Invalid::required("names").into()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid("names must be an array of endpoint names.".into())),
    };
    if items.is_empty() || items.len() > MAX_NAMES {
        return Err(invalid(format!("names must hold between 1 and {MAX_NAMES} endpoint names.")));
    }
    let mut names = Vec::with_capacity(items.len());
    for item in items {
        let raw = item.as_str().ok_or_else(|| invalid("names must be an array of strings.".into()))?;
        let name = EndpointName::parse(raw)
            .map_err(|_| invalid(format!("'{raw}' is not a valid endpoint name.")))?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

impl RunService {
    /// Last execution times within the past six months of the listed endpoints; unknown names and older runs
    /// are left out.
    ///
    /// # Errors
    /// [`Error::Invalid`] (attr `names`) for a missing, empty, oversized or malformed list; store failures.
    pub async fn last_execution_times(
        &self,
        project: ProjectId,
        body: &Value,
    ) -> Result<LastExecutions, Error> {
        let names = parse_names(body)?;
        let started = Instant::now();
        let start_time = self.clock.now();
        let since = six_months_before(start_time);
        let (results, rows_read) = self.executions.last_executed(project, &names, since).await?;
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
