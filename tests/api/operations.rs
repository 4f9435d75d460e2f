//! What an operator sees: liveness, readiness over the real store and engine, and the metrics of the real
//! wiring.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{endpoint_body, project_with_sales, spawn_app};

async fn metrics(app: &crate::helpers::TestApp) -> String {
    let response = app.request(Method::GET, "/metrics", None).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// The value of the sample named exactly `series` (name and labels), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn health_readiness_and_metrics_report_the_real_service() {
    let app = spawn_app().await;
    let health = app.request(Method::GET, "/healthz", None).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.json::<Value>().await.unwrap(), json!({"status": "ok"}));

    let ready = app.request(Method::GET, "/readyz", None).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(
        (&body["checks"]["store"]["status"], &body["checks"]["engine"]["status"]),
        (&json!("ok"), &json!("ok"))
    );

    let (project, key) = project_with_sales(&app);
    app.create_endpoint(
        project,
        &key,
        &endpoint_body("totals", "SELECT country, SUM(amount) AS total FROM sales GROUP BY country"),
    )
    .await;
    let run = format!("/api/projects/{project}/endpoints/totals/run");
    for _ in 0..3 {
        assert_eq!(app.get(&run, &key).await.status(), 200);
    }
    let text = metrics(&app).await;
    assert_eq!(sample(&text, r#"endpoints_run_answers_total{source="live"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"endpoints_run_answers_total{source="cache"}"#), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, r#"endpoints_live_query_duration_seconds_count{outcome="ok"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"endpoints_http_request_duration_seconds_count{route="run",method="GET",status="200"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(sample(&text, "endpoints_db_pool_max_connections"), Some(8.0), "{text}");
    assert!(sample(&text, r#"endpoints_db_pool_connections{state="idle"}"#).is_some(), "{text}");
    assert_eq!(text.lines().last(), Some("# EOF"));

    // The engine's data directory goes away: not ready, and ready again once it is back, without a restart.
    let moved = app.data_dir.with_extension("moved");
    std::fs::rename(&app.data_dir, &moved).unwrap();
    let ready = app.request(Method::GET, "/readyz", None).send().await.unwrap();
    let status = ready.status();
    let body: Value = ready.json().await.unwrap();
    std::fs::rename(&moved, &app.data_dir).unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["checks"]["engine"]["status"], "failed", "{body}");
    assert!(!body.to_string().contains(app.data_dir.to_str().unwrap()), "no paths in the report: {body}");
    let ready = app.request(Method::GET, "/readyz", None).send().await.unwrap();
    assert_eq!(ready.status(), 200);
}
