//! What an operator sees: liveness, readiness over the real store and engine, and the metrics of the real
//! wiring.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{endpoint_body, project_with_sales, spawn_app};

pub(crate) async fn metrics(app: &crate::helpers::TestApp) -> String {
    let response = app.request(Method::GET, "/metrics", None).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// The value of the sample named exactly `series` (name and labels), if present.
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_request_id_and_never_the_key() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let (_, uploader) = app.create_key(project, &["table:write"]);
    let data_dir = crate::helpers::DataDir(app.data_dir.clone());
    app.stop().await.unwrap();
    let log_path = data_dir.with_extension("log");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"));
    command.arg("--log-json").stderr(std::fs::File::create(&log_path).unwrap());
    let server = crate::helpers::serve_command(command, &data_dir, &["--materialize-workers", "0"]).await;
    let client = reqwest::Client::new();
    let listed = client
        .get(format!("{}/api/projects/{project}/endpoints", server.address))
        .bearer_auth(&key)
        .header("X-Request-Id", "trace-42")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let uploaded = client
        .put(format!("{}/api/projects/{project}/tables/orders", server.address))
        .bearer_auth(&uploader)
        .header("X-Request-Id", "upload-9")
        .header("Content-Type", "text/csv")
        .body("id,amount\n1,2.5\n2,4\n3,1\n")
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status(), 201);
    // Something logged inside a request: readiness failing while the data directory is away.
    let moved = data_dir.with_extension("moved");
    std::fs::rename(&data_dir, &moved).unwrap();
    let ready = client
        .get(format!("{}/readyz", server.address))
        .header("X-Request-Id", "probe-7")
        .send()
        .await
        .unwrap();
    std::fs::rename(&moved, &data_dir).unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(ready.headers()["x-request-id"], "probe-7");
    drop(server);

    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    let warning = lines
        .iter()
        .find(|l| l["level"] == "WARN" && l["fields"]["message"] == "not ready")
        .unwrap_or_else(|| panic!("no readiness warning in:\n{log}"));
    assert_eq!(warning["request_id"], "probe-7", "{warning}");
    assert_eq!(warning["method"], "GET", "{warning}");
    assert_eq!(warning["path"], "/readyz", "{warning}");
    // Each replace is logged with its size, rows and time (appends only at debug: a stream is many).
    let upload = lines
        .iter()
        .find(|l| l["fields"]["message"] == "table written from an upload")
        .unwrap_or_else(|| panic!("no upload line in:\n{log}"));
    assert_eq!((upload["fields"]["rows"].as_u64(), upload["fields"]["bytes"].as_u64()), (Some(3), Some(24)));
    assert!(upload["fields"]["took_ms"].is_u64() && upload["request_id"] == "upload-9", "{upload}");
    // Lines outside of any request (startup) carry no request.
    let startup =
        lines.iter().find(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains("listening")));
    assert!(startup.is_some_and(|l| l.get("request_id").is_none()), "{log}");
    for secret in [&key, &uploader] {
        assert!(!log.contains(secret.as_str()) && !log.contains(&secret[4..]), "an API key reached the log");
    }
    std::fs::remove_file(log_path).ok();
}

/// `serve` keeps the tables its runs read decoded within `--hot-tables-mb` (its metrics say so, and later runs
/// answer the same from memory), and keeps none with 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_the_tables_runs_read_decoded_within_its_bound() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let sql = "SELECT country, SUM(amount) AS total FROM sales GROUP BY country ORDER BY country";
    app.create_endpoint(project, &key, &endpoint_body("totals", sql)).await;
    let data_dir = crate::helpers::DataDir(app.data_dir.clone());
    app.stop().await.unwrap();
    let client = reqwest::Client::new();
    for (bound, kept) in [("1", 1.0), ("0", 0.0)] {
        let command = std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"));
        let args = ["--materialize-workers", "0", "--compaction-interval-ms", "0", "--hot-tables-mb", bound];
        let server = crate::helpers::serve_command(command, &data_dir, &args).await;
        let run = format!("{}/api/projects/{project}/endpoints/totals/run?refresh=direct", server.address);
        let metric = || async {
            let text =
                client.get(format!("{}/metrics", server.address)).send().await.unwrap().text().await.unwrap();
            (sample(&text, "endpoints_hot_table_files"), sample(&text, "endpoints_hot_table_bytes"))
        };
        let mut answers = Vec::new();
        // The first run reads the file from storage and has it decoded in the background; a later one reads it
        // from memory once it is (bounded: a server that never keeps it fails here).
        for _ in 0..200 {
            let answer: Value =
                client.get(&run).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
            answers.push(answer["results"].clone());
            if metric().await.0 == Some(kept) || kept == 0.0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let answer: Value = client.get(&run).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
        assert!(answers.iter().all(|earlier| *earlier == answer["results"]), "{answers:?} {answer}");
        match metric().await {
            (Some(files), Some(bytes)) => {
                assert!(files == kept && (bytes > 0.0) == (kept > 0.0), "{files} {bytes}")
            }
            (None, None) => assert_eq!(kept, 0.0, "the metrics exist while tables are kept"),
            other => panic!("{other:?}"),
        }
    }
}
