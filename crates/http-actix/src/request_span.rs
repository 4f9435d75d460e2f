//! One tracing span per request, carrying a request id: the client's `X-Request-Id` when it sends a usable one,
//! else a new one. The id is echoed in the response's `X-Request-Id`, so a client can quote it and an operator
//! can find every log line of that request.
//!
//! The same middleware times every request for the request metrics, labelled by the route's name, and writes
//! the caller's rate-limit budget (left by authentication) into the response headers.
//!
//! Written here rather than taken from `tracing-actix-web`: that middleware records a dozen fields and draws
//! each id from the operating system, which together cost more than serving a cached run.

use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::web;
use actix_web::HttpMessage;
use tracing::Instrument;

use crate::rate_limit::Budget;
use crate::routes::ROUTE_NAMES;
use crate::AppState;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A client's id is kept when it is short and plain, so it cannot forge or break log lines.
fn usable(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// A new id from the thread's random generator (no system call), as 32 lowercase hex digits.
fn new_id() -> HeaderValue {
    let mut text = [0_u8; uuid::fmt::Simple::LENGTH];
    let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
    HeaderValue::from_str(id.simple().encode_lower(&mut text)).unwrap_or(HeaderValue::from_static("unknown"))
}

pub(crate) async fn request_span(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    // The client's value is shared, not copied.
    let id = req
        .headers()
        .get(&REQUEST_ID)
        .filter(|v| v.to_str().is_ok_and(usable))
        .cloned()
        .unwrap_or_else(new_id);
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        path = %req.path(),
        request_id = %id.to_str().unwrap_or_default()
    );
    let started = std::time::Instant::now();
    let metrics = req.app_data::<web::Data<AppState>>().map(|state| Arc::clone(&state.operations));
    let mut response = next.call(req).instrument(span).await?;
    if let Some(operations) = metrics {
        let request = response.request();
        let route = request
            .match_name()
            .and_then(|name| ROUTE_NAMES.iter().find(|known| **known == name).copied())
            .unwrap_or(if response.status() == StatusCode::NOT_FOUND { "unmatched" } else { "other" });
        operations.metrics.observe_request(route, request.method(), response.status(), started.elapsed());
    }
    let budget = response.request().extensions().get::<Budget>().copied();
    if let Some(budget) = budget {
        budget.write(response.headers_mut());
    }
    response.headers_mut().insert(REQUEST_ID, id);
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
        let a = a.to_str().unwrap();
        assert!(usable(a) && a.len() == 32 && a != b.to_str().unwrap());
    }
}
