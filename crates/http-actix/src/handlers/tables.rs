//! A project's tables: list, read, create or replace from an upload, append rows, set the layout, delete,
//! preview.

use std::collections::HashMap;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use bytes::Bytes;
use domain::{ExternalSource, IdempotencyKey, TableFormat, TableName, Upload, UploadBody, WriteMode};
use futures_util::StreamExt;
use serde::Deserialize;

use crate::api::{Appended, Preview, Table, TablePage, TableVersionPage};
use crate::error::{ApiError, ErrorBody as Error};
use crate::extract::{Authorized, AuthorizedJson, TableRead, TableWrite};
use crate::AppState;

/// The table a path names (`{table}`).
#[derive(Deserialize)]
pub(crate) struct TablePath {
    table: String,
}

impl TablePath {
    /// The name of a table to read or delete: one that cannot be valid names no table (404).
    fn existing(&self) -> Result<TableName, domain::Error> {
        TableName::from_path(&self.table)
    }

    /// The name of a table to write: one that cannot be valid is refused (400, attr `table`).
    fn to_write(&self) -> Result<TableName, domain::Error> {
        Ok(TableName::parse(&self.table)?)
    }
}

/// The format of an upload, by its `Content-Type`.
fn upload_format(req: &HttpRequest) -> Result<TableFormat, ApiError> {
    match req.mime_type().ok().flatten().map(|m| m.essence_str().to_ascii_lowercase()).as_deref() {
        Some("text/csv") => Ok(TableFormat::Csv),
        Some("application/x-ndjson" | "application/ndjson" | "application/jsonl") => Ok(TableFormat::NdJson),
        Some("application/vnd.apache.parquet" | "application/x-parquet") => Ok(TableFormat::Parquet),
        _ => Err(ApiError::UnsupportedUpload),
    }
}

/// Chunks the pump task may read ahead of the storage.
const READ_AHEAD: usize = 8;

/// The request's body as the upload stream the domain reads. actix-web's payload lives on this worker thread,
/// so a task here pumps it into a bounded channel (a slow storage slows the client, not memory); a client that
/// sends nothing for `idle` is cut off.
fn upload_body(mut payload: web::Payload, idle: Duration) -> UploadBody {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(READ_AHEAD);
    actix_web::rt::spawn(async move {
        loop {
            let chunk = match tokio::time::timeout(idle, payload.next()).await {
                Ok(None) => return,
                Ok(Some(Ok(chunk))) => Ok(chunk),
                Ok(Some(Err(err))) => {
                    Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, err.to_string()))
                }
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no byte of the body arrived for {} s", idle.as_secs_f64()),
                )),
            };
            let failed = chunk.is_err();
            // The reader went away (the upload failed): nothing more to pump.
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
        }
    });
    Box::pin(futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|chunk| (chunk, rx)) },
    ))
}

fn upload(
    req: &HttpRequest,
    state: &AppState,
    payload: web::Payload,
    mode: WriteMode,
) -> Result<Upload, ApiError> {
    let format = upload_format(req)?;
    let limit = state.upload_limit;
    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(domain::Error::PayloadTooLarge { limit_bytes: limit }.into());
    }
    Ok(Upload {
        format,
        mode,
        body: upload_body(payload, state.client_timeout),
        limit_bytes: limit,
        tag: None,
        quarantine: false,
    })
}

/// The append's `Idempotency-Key`, if it sends one.
fn idempotency_key(req: &HttpRequest) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(raw) = req.headers().get(IDEMPOTENCY_KEY) else { return Ok(None) };
    // Bytes that are not text are not visible characters either: the key's rule refuses them.
    let raw = String::from_utf8_lossy(raw.as_bytes());
    Ok(Some(IdempotencyKey::parse(&raw).map_err(domain::Error::from)?))
}

const IDEMPOTENCY_KEY: &str = "idempotency-key";

use super::Query;

#[utoipa::path(get, path = "/api/projects/{project_id}/tables", operation_id = "list_tables",
    params(("project_id" = String, Path), ("limit" = Option<i64>, Query), ("offset" = Option<i64>, Query)),
    responses((status = 200, body = TablePage), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error)))]
pub(crate) async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<TableRead>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let page = super::page_param(&query)?;
    let page = state.tables.list(caller.project, page).await?;
    Ok(HttpResponse::Ok().json(TablePage::of(&req, page)))
}

#[utoipa::path(get, path = "/api/projects/{project_id}/tables/{table}/versions", operation_id = "list_table_versions",
    params(("project_id" = String, Path), ("table" = String, Path), ("limit" = Option<i64>, Query), ("offset" = Option<i64>, Query)),
    responses((status = 200, body = TableVersionPage), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn versions(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<TableRead>,
    path: web::Path<TablePath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let page = super::page_param(&query)?;
    let versions = state.tables.versions(caller.project, &path.existing()?, page).await?;
    Ok(HttpResponse::Ok().json(TableVersionPage::of(&req, versions)))
}

#[utoipa::path(get, path = "/api/projects/{project_id}/tables/{table}", operation_id = "get_table",
    params(("project_id" = String, Path), ("table" = String, Path)),
    responses((status = 200, body = Table), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn retrieve(
    state: web::Data<AppState>,
    caller: Authorized<TableRead>,
    path: web::Path<TablePath>,
) -> Result<HttpResponse, ApiError> {
    let table = state.tables.get(caller.project, &path.existing()?).await?;
    Ok(HttpResponse::Ok().json(Table::from(table)))
}

#[utoipa::path(put, path = "/api/projects/{project_id}/tables/{table}", operation_id = "put_table",
    params(("project_id" = String, Path), ("table" = String, Path)),
    request_body(description = "The table's rows (CSV with a header row, NDJSON, or a Parquet file), or, as JSON, \
        an external source the table reads where it is",
        content((String = "text/csv"), (String = "application/x-ndjson"), ("application/vnd.apache.parquet"),
                (crate::api::requests::TableSourceBody = "application/json"))),
    responses((status = 201, body = Table, headers(("Location" = String, description = "The table's URL"))),
              (status = 200, body = Table, description = "The table was replaced"),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 413, body = Error), (status = 415, body = Error)))]
pub(crate) async fn put(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<TableWrite>,
    path: web::Path<TablePath>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let name = path.to_write()?;
    let (table, created) = if crate::extract::is_json(&req) {
        let body = crate::extract::read_json(&req, payload.into_inner(), &state)
            .await?
            .unwrap_or_else(|| serde_json::Value::Object(serde_json::Map::new()));
        let source = ExternalSource::try_from(&body)?;
        state.tables.register(caller.project, &name, source).await?
    } else {
        let upload = upload(&req, &state, payload, WriteMode::Replace)?;
        let (table, written) = state.tables.write(caller.project, &name, upload).await?;
        (table, written.created)
    };
    if created {
        let location = format!("/api/projects/{}/tables/{}", caller.project, path.table);
        Ok(HttpResponse::Created().insert_header((header::LOCATION, location)).json(Table::from(table)))
    } else {
        Ok(HttpResponse::Ok().json(Table::from(table)))
    }
}

#[utoipa::path(post, path = "/api/projects/{project_id}/tables/{table}/rows", operation_id = "append_rows",
    params(("project_id" = String, Path), ("table" = String, Path),
        ("on_error" = Option<String>, Query, description = "`fail` (the default): a row that does not fit the table \
            refuses the body. `quarantine`: such rows go to the table `{table}_quarantine` and the others are added \
            (CSV and NDJSON bodies, up to 16 MiB)"),
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 128 visible ASCII characters naming this \
            append: a retry with the same key and body within 24 hours adds nothing and answers as the first did")),
    request_body(description = "Rows with the table's columns: CSV with a header row, NDJSON, or a Parquet file",
        content((String = "text/csv"), (String = "application/x-ndjson"), ("application/vnd.apache.parquet"))),
    responses((status = 200, body = Appended), (status = 400, body = Error), (status = 401, body = Error),
              (status = 403, body = Error), (status = 404, body = Error),
              (status = 409, body = Error, description = "The Idempotency-Key was used with another body, or its \
                  first append is still being written"),
              (status = 413, body = Error), (status = 415, body = Error)))]
pub(crate) async fn append(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Authorized<TableWrite>,
    path: web::Path<TablePath>,
    query: Query,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let name = path.to_write()?;
    let key = idempotency_key(&req)?;
    let quarantine = Upload::quarantines(query.get("on_error").map(String::as_str))?;
    let upload = Upload { quarantine, ..upload(&req, &state, payload, WriteMode::Append)? };
    let (table, written) = match &key {
        Some(key) => state.tables.append_once(caller.project, &name, upload, key).await?,
        None => state.tables.write(caller.project, &name, upload).await?,
    };
    Ok(HttpResponse::Ok().json(Appended::of(table, written)))
}

#[utoipa::path(patch, path = "/api/projects/{project_id}/tables/{table}", operation_id = "update_table_layout",
    params(("project_id" = String, Path), ("table" = String, Path)),
    request_body = crate::api::requests::TableLayoutBody,
    responses((status = 200, body = Table), (status = 400, body = Error), (status = 401, body = Error),
              (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn update_layout(
    state: web::Data<AppState>,
    caller: AuthorizedJson<TableWrite>,
    path: web::Path<TablePath>,
) -> Result<HttpResponse, ApiError> {
    let table = state.tables.pin_layout(caller.project, &path.existing()?, &caller.body).await?;
    Ok(HttpResponse::Ok().json(Table::from(table)))
}

#[utoipa::path(delete, path = "/api/projects/{project_id}/tables/{table}", operation_id = "delete_table",
    params(("project_id" = String, Path), ("table" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 409, body = Error)))]
pub(crate) async fn delete(
    state: web::Data<AppState>,
    caller: Authorized<TableWrite>,
    path: web::Path<TablePath>,
) -> Result<HttpResponse, ApiError> {
    state.tables.delete(caller.project, &path.existing()?).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(post, path = "/api/projects/{project_id}/tables/{table}/preview", operation_id = "preview_table",
    params(("project_id" = String, Path), ("table" = String, Path), ("limit" = Option<i64>, Query)),
    request_body = crate::api::requests::PreviewBody,
    responses((status = 200, body = Preview), (status = 400, body = Error), (status = 401, body = Error),
              (status = 403, body = Error), (status = 404, body = Error)))]
pub(crate) async fn preview(
    state: web::Data<AppState>,
    caller: AuthorizedJson<TableRead>,
    path: web::Path<TablePath>,
    query: Query,
) -> Result<HttpResponse, ApiError> {
    let name = path.existing()?;
    let limit = preview_limit(&caller.body, &query)?;
    let (rows, limit) = state.tables.preview(caller.project, &name, limit).await?;
    Ok(HttpResponse::Ok().json(Preview::of(&path.table, limit, rows)))
}

/// How many rows a preview asks for: the body's `{"limit": N}`, else the query string's `limit`.
fn preview_limit(
    body: &serde_json::Value,
    query: &HashMap<String, String>,
) -> Result<Option<i64>, domain::Invalid> {
    let fields = domain::Fields::new(body, &["limit"])?;
    match (fields.nullable_int("limit")?.flatten(), query.get("limit")) {
        (Some(limit), _) => Ok(Some(limit)),
        (None, Some(raw)) => Ok(Some(i64::from(domain::PageRequest::parse(Some(raw), None)?.limit))),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_previews_limit_comes_from_the_body_else_the_query_string() {
        let five: HashMap<String, String> = [("limit".to_owned(), "5".to_owned())].into();
        let none = HashMap::new();
        assert_eq!(preview_limit(&json!({}), &none).unwrap(), None);
        assert_eq!(preview_limit(&json!({}), &five).unwrap(), Some(5));
        assert_eq!(preview_limit(&json!({"limit": 7}), &five).unwrap(), Some(7), "the body wins");
        let zero: HashMap<String, String> = [("limit".to_owned(), "0".to_owned())].into();
        assert_eq!(preview_limit(&json!({}), &zero).unwrap_err().attr.as_deref(), Some("limit"));
        assert_eq!(preview_limit(&json!({"rows": 1}), &none).unwrap_err().attr.as_deref(), Some("rows"));
    }
}
