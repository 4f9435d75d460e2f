//! Log lines: what the text and JSON formats write inside and outside a request.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use actix_web::http::header::HeaderValue;
use actix_web::http::{Method, Uri};
use http_actix::RequestContext;
use tracing_subscriber::EnvFilter;

use server::telemetry::subscriber;

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What `json` logging writes for one warning inside a request (within a span) and one outside.
fn logged(json: bool) -> Vec<String> {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = subscriber(json, false, EnvFilter::new("info"), move || writer.clone());
    tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let request = RequestContext::new(
            Method::GET,
            Uri::from_static("/api/projects/1/endpoints/kpi/run?variables.secret=s3cret"),
            HeaderValue::from_static("trace-\"42"),
        );
        runtime.block_on(request.scope(async {
            let _store = tracing::info_span!("find", name = "kpi").entered();
            tracing::warn!(answer = 42, "inside");
        }));
        tracing::warn!("outside");
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_owned).collect()
}

#[test]
fn text_lines_name_the_request_first_among_the_spans() {
    let lines = logged(false);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let inside = lines[0].split_once("  WARN ").unwrap().1;
    assert_eq!(
        inside,
        r#"request{method=GET path=/api/projects/1/endpoints/kpi/run request_id=trace-"42}:find{name="kpi"}: api::telemetry: inside answer=42"#
    );
    assert!(lines[1].ends_with("  WARN api::telemetry: outside"), "{}", lines[1]);
    assert!(!lines.concat().contains("s3cret"), "the query string reached the log");
}

#[test]
fn json_lines_carry_the_request_keys_and_stay_one_object() {
    let lines: Vec<serde_json::Value> =
        logged(true).iter().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    let (inside, outside) = (&lines[0], &lines[1]);
    assert_eq!(inside["request_id"], "trace-\"42");
    assert_eq!(inside["method"], "GET");
    assert_eq!(inside["path"], "/api/projects/1/endpoints/kpi/run");
    assert_eq!(inside["fields"]["answer"], 42);
    assert_eq!(inside["span"]["name"], "find");
    assert_eq!(outside["fields"]["message"], "outside");
    assert!(outside.get("request_id").is_none() && outside.get("path").is_none(), "{outside}");
}
