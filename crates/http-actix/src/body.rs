//! Reading a JSON body: content type, size limit and syntax, each with its own clear error.

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use futures_util::StreamExt;
use serde_json::Value;

use crate::error::ApiError;

fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
}

/// Reads the body as JSON. An empty body is `None`; anything else must be JSON within `limit` bytes, sent
/// within `timeout` (a client trickling its body would otherwise hold its connection for as long as it likes).
pub(crate) async fn read_json(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Option<Value>, ApiError> {
    tokio::time::timeout(timeout, read(req, payload, limit))
        .await
        .map_err(|_| ApiError::BodyTimeout { timeout })?
}

async fn read(req: &HttpRequest, mut payload: web::Payload, limit: usize) -> Result<Option<Value>, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut bytes = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::MalformedJson(e.to_string()))?;
        if bytes.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        bytes.extend_from_slice(&chunk);
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if !is_json(req) {
        return Err(ApiError::UnsupportedMediaType);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| ApiError::MalformedJson(e.to_string()))
}
