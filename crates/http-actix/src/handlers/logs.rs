//! An endpoint's run log: a page of its records, and its usage.

use actix_web::{web, HttpResponse};
use domain::{Interval, Invalid, LogCursor, LogFilter, LogKind, StatusFilter, Timestamp};
use time::format_description::well_known::Rfc3339;

use super::{EndpointPath, Query};
use crate::api::{LogList, Usage};
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, EndpointRead};
use crate::AppState;

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/logs", operation_id = "endpoint_logs",
    params(("project_id" = String, Path), ("name" = String, Path),
           ("since" = Option<String>, Query, description = "RFC 3339; records at or after it"),
           ("until" = Option<String>, Query, description = "RFC 3339; records before it"),
           ("kind" = Option<String>, Query, description = "run or refresh"),
           ("status" = Option<String>, Query, description = "ok (below 400), error (400 and above), or one HTTP status"),
           ("limit" = Option<i64>, Query, description = "1 to 1000; 100 by default"),
           ("cursor" = Option<String>, Query, description = "The `next` of the page before")),
    responses((status = 200, body = LogList), (status = 400, body = Error), (status = 401, body = Error),
              (status = 403, body = Error), (status = 404, body = Error), (status = 429, body = Error)))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let filter = filter(&query)?;
    let page = state.logs.records(caller.project, &path.endpoint()?, &filter).await?;
    Ok(HttpResponse::Ok().json(LogList::from(page)))
}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/usage", operation_id = "endpoint_usage",
    params(("project_id" = String, Path), ("name" = String, Path),
           ("since" = Option<String>, Query, description = "RFC 3339; the interval's default span before until when absent"),
           ("until" = Option<String>, Query, description = "RFC 3339; now when absent"),
           ("interval" = Option<String>, Query, description = "minute, hour (default) or day")),
    responses((status = 200, body = Usage), (status = 400, body = Error), (status = 401, body = Error),
              (status = 403, body = Error), (status = 404, body = Error), (status = 429, body = Error)))]
pub(crate) async fn usage(
    state: web::Data<AppState>,
    caller: Authorized<EndpointRead>,
    path: web::Path<EndpointPath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let interval = param(&query, "interval").map(Interval::parse).transpose()?;
    let (since, until) = (instant(&query, "since")?, instant(&query, "until")?);
    let name = path.endpoint()?;
    let (asked, buckets) = state.logs.usage(caller.project, &name, since, until, interval).await?;
    Ok(HttpResponse::Ok().json(Usage::of(asked, buckets)))
}

/// The listing a query string asks for.
fn filter(query: &Query) -> Result<LogFilter, Invalid> {
    let limit = match param(query, "limit") {
        None => LogFilter::DEFAULT_LIMIT,
        Some(raw) => {
            raw.parse::<u32>().ok().filter(|limit| (1..=LogFilter::MAX_LIMIT).contains(limit)).ok_or_else(
                || {
                    Invalid::field(
                        "limit",
                        format!("limit must be an integer between 1 and {}.", LogFilter::MAX_LIMIT),
                    )
                },
            )?
        }
    };
    Ok(LogFilter {
        since: instant(query, "since")?,
        until: instant(query, "until")?,
        kind: param(query, "kind").map(LogKind::parse).transpose()?,
        status: param(query, "status").map(StatusFilter::parse).transpose()?,
        limit,
        cursor: param(query, "cursor").map(LogCursor::parse).transpose()?,
    })
}

/// A parameter of the query string. An empty one is a value, refused as any other that is not one of its
/// words or forms (the schema says so: `kind=` is neither `run` nor `refresh`).
fn param<'a>(query: &'a Query, key: &str) -> Option<&'a str> {
    query.get(key).map(String::as_str)
}

/// An RFC 3339 instant of the query string.
fn instant(query: &Query, key: &str) -> Result<Option<Timestamp>, Invalid> {
    param(query, key)
        .map(|raw| {
            Timestamp::parse(raw, &Rfc3339).map_err(|_| {
                Invalid::field(key, format!("{key} must be an RFC 3339 time, as 2026-11-26T10:00:00Z."))
            })
        })
        .transpose()
}
