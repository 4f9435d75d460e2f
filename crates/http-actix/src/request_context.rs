//! The request each task serves, carrying a request id: the client's `X-Request-Id` when it sends a usable one,
//! else a new one. The id is echoed in the response's `X-Request-Id`, so a client can quote it and an operator
//! can find every log line of that request: the log formatters read [`RequestContext::current`].
//!
//! The same middleware times every request for the request metrics, labelled by the route's name, and writes
//! the caller's rate-limit budget (left by authentication) into the response headers. When the request came is
//! part of its context: a run's record counts its duration from then.
//!
//! A task-local rather than a tracing span: a span is created, registered and formatted on every request,
//! while a task-local is moved in and out on each poll and read only when a line is logged, so a request that
//! logs nothing pays next to nothing for it (which `tracing-actix-web`'s span per request does not allow).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode, Uri};
use actix_web::middleware::Next;
use actix_web::web;
use actix_web::HttpMessage;

use crate::paths::ROUTE_NAMES;
use crate::rate_limit::Budget;
use crate::AppState;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

tokio::task_local! {
    static CURRENT: RequestContext;
}

/// What a log line written while serving a request says about it. Cloning the parts shares their bytes.
#[derive(Debug, Clone)]
pub struct RequestContext {
    method: Method,
    uri: Uri,
    id: HeaderValue,
    started: Instant,
}

impl RequestContext {
    /// A request that came just now.
    pub fn new(method: Method, uri: Uri, id: HeaderValue) -> Self {
        Self { method, uri, id, started: Instant::now() }
    }

    /// Runs `work` as serving this request: what it logs names the request.
    pub async fn scope<F: std::future::Future>(self, work: F) -> F::Output {
        CURRENT.scope(self, work).await
    }

    pub fn method(&self) -> &str {
        self.method.as_str()
    }

    /// The path as the client sent it, without the query string (which may hold variables' values).
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// The request id, also in the response's `X-Request-Id`.
    pub fn id(&self) -> &str {
        self.id.to_str().expect("the middleware sets only plain ASCII ids (`usable`, `new_id`)")
    }

    pub(crate) fn id_value(&self) -> &HeaderValue {
        &self.id
    }

    /// When the middleware took the request.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// What `f` makes of the request the current task is serving, or `None` outside of one (a background task,
    /// a blocking thread, a command).
    pub fn current<R>(f: impl FnOnce(&Self) -> R) -> Option<R> {
        CURRENT.try_with(f).ok()
    }
}

/// A client's id is kept when it is short and plain, so it cannot forge or break log lines.
fn usable(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// A new id as 32 lowercase hex digits: 64 random bits drawn once per process, then a counter. Unique across
/// processes and nodes without a random draw per request; ids need not be secret.
fn new_id() -> HeaderValue {
    static PROCESS: LazyLock<u64> = LazyLock::new(rand::random);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = (u128::from(*PROCESS) << 64) | u128::from(NEXT.fetch_add(1, Ordering::Relaxed));
    let mut text = [0_u8; uuid::fmt::Simple::LENGTH];
    let id = uuid::Uuid::from_u128(id).simple();
    HeaderValue::from_str(id.encode_lower(&mut text)).unwrap_or(HeaderValue::from_static("unknown"))
}

/// In front of every route: the request's context and metrics, and paths with extra slashes trimmed
/// ([`crate::normalize`]); one middleware rather than two, since each layer costs a cached run a boxed future.
pub(crate) async fn request_context(
    mut req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    // The client's value is shared, not copied.
    let id = req
        .headers()
        .get(&REQUEST_ID)
        .filter(|v| v.to_str().is_ok_and(usable))
        .cloned()
        .unwrap_or_else(new_id);
    // Logged as the client sent it.
    let context = RequestContext::new(req.method().clone(), req.uri().clone(), id);
    let started = context.started;
    crate::normalize::trim_slashes(&mut req);
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let mut serving = std::pin::pin!(CURRENT.scope(context, next.call(req)));
    let result = serving.as_mut().await;
    let id = serving.as_mut().take_value().map(|context| context.id);
    let mut response = result?;
    if let Some(state) = state {
        let took = started.elapsed();
        let request = response.request();
        let route = request
            .match_name()
            .and_then(|name| ROUTE_NAMES.iter().find(|known| **known == name).copied())
            .unwrap_or(if response.status() == StatusCode::NOT_FOUND { "unmatched" } else { "other" });
        state.operations.metrics.observe_request(route, request.method(), response.status(), took);
    }
    let budget = response.request().extensions().get::<Budget>().copied();
    if let Some(budget) = budget {
        budget.write(response.headers_mut());
    }
    if let Some(id) = id {
        response.headers_mut().insert(REQUEST_ID, id);
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
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        assert!(usable(a) && a.len() == 32 && a != b, "{a} {b}");
        assert!(a.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{a}");
    }
}
