//! One tracing span per request, carrying a request id: the client's `X-Request-Id` when it sends a usable one,
//! else a new one. The id is echoed in the response's `X-Request-Id`, so a client can quote it and an operator
//! can find every log line of that request.
//!
//! Written here rather than taken from `tracing-actix-web`: that middleware records a dozen fields and draws
//! each id from the operating system, which together cost more than serving a cached run.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use tracing::Instrument;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A client's id is kept when it is short and plain, so it cannot forge or break log lines.
fn usable(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// A new id from the thread's random generator (no system call).
fn new_id() -> String {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid().simple().to_string()
}

pub(crate) async fn request_span(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| usable(v))
        .map_or_else(new_id, str::to_owned);
    let span = tracing::info_span!("request", method = %req.method(), path = %req.path(), request_id = %id);
    let mut response = next.call(req).instrument(span).await?;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::{new_id, usable};

    #[test]
    fn plain_client_ids_are_kept_and_others_replaced() {
        for ok in ["abc", "0f6b-12_a.b:c", &"x".repeat(128)] {
            assert!(usable(ok), "{ok}");
        }
        for bad in ["", "a b", "a\nb", "ünï", &"x".repeat(129), "a\"b"] {
            assert!(!usable(bad), "{bad}");
        }
        let (a, b) = (new_id(), new_id());
        assert!(usable(&a) && a.len() == 32 && a != b);
    }
}
