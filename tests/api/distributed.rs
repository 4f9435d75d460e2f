//! Endpoints on the distributed engine (the `ballista` feature): a real Ballista scheduler with two executors,
//! started as `endpoints cluster` in its own process over the test's data directory, and the application
//! started with `--engine ballista://...`. The engine's own suite runs on such a cluster too
//! (`TEST_ENGINE=ballista cargo test -p query-engine --features ballista`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_actix::api::{Endpoint, Materialization, RunResult};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::helpers::{project_with_sales, serve_command, TestApp};
use crate::storage::Moto;

/// An `endpoints cluster` process, killed when dropped.
struct ClusterProcess {
    child: Child,
    url: String,
}

impl Drop for ClusterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_cluster(data_dir: &std::path::Path) -> ClusterProcess {
    start_cluster_with(Command::new(env!("CARGO_BIN_EXE_endpoints")), data_dir)
}

/// `endpoints cluster` from a prepared command (one with the storage in a bucket, say).
fn start_cluster_with(mut command: Command, data_dir: &std::path::Path) -> ClusterProcess {
    let mut child = command
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--json", "cluster", "--executors", "2", "--slots", "2"])
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("endpoints cluster starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let started: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert_eq!(started["executors"], 2, "{started}");
    ClusterProcess { child, url: started["engine"].as_str().unwrap().to_owned() }
}

/// The answer of a GET of `path` (asserting 200), as the API's type of it.
async fn run<T: DeserializeOwned>(app: &TestApp, key: &str, path: &str) -> T {
    let response = app.get(path, key).await;
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_run_on_a_ballista_cluster_and_fail_clearly_without_it() {
    let dir = std::env::temp_dir().join(format!("endpoints-ballista-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = start_cluster(&dir);
    let engine = cluster.url.clone();
    let app = TestApp::builder()
        .over(dir)
        .tuned(|config| {
            config.engine = Some(engine);
            config.worker.poll = Duration::from_millis(50);
        })
        .spawn()
        .await;
    let (project, key) = project_with_sales(&app);
    let base = format!("/api/projects/{project}/endpoints");

    let ready: Value =
        app.request(reqwest::Method::GET, "/readyz", None).send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["checks"]["engine"]["status"], "ok", "{ready}");

    // A live run with a variable, planned here and executed by the cluster's executors.
    let live = json!({"name": "totals", "query": {"kind": "SQLQuery",
        "query": "SELECT country, sum(quantity) AS q FROM sales WHERE amount >= {variables.min} GROUP BY country ORDER BY country",
        "variables": {"min": {"type": "Number", "default": 0}}}});
    app.create_endpoint(project, &key, &live).await;
    let answer: RunResult =
        run(&app, &key, &format!("{base}/totals/run?variables.min=7&refresh=direct")).await;
    assert_eq!(
        answer.results,
        json!([{"country": "DE", "q": 5}, {"country": "O'Brien", "q": 4}, {"country": "US", "q": 3}])
    );

    // A materialized endpoint: refreshed through the cluster, answered from the stored result exactly as live.
    let stored = json!({"name": "by-country", "is_materialized": true, "sync_frequency": "1hour",
        "query": {"kind": "SQLQuery",
                  "query": "SELECT country, count(*) AS orders FROM sales WHERE country = {variables.country} GROUP BY country",
                  "variables": {"country": {"type": "String", "default": "US"}}}});
    app.create_endpoint(project, &key, &stored).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: Materialization =
            run(&app, &key, &format!("{base}/by-country/materialization_status")).await;
        if status.status == "Completed" {
            break;
        }
        assert!(status.status != "Failed" && Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let from_store: RunResult = run(&app, &key, &format!("{base}/by-country/run?variables.country=US")).await;
    assert!(from_store.computed.endpoint_materialized);
    assert_eq!(from_store.results, json!([{"country": "US", "orders": 2}]));

    // Without the cluster: a clear 503 for live runs and readiness, never a hang or a 500.
    drop(cluster);
    let response = app.get(&format!("{base}/totals/run?variables.min=1&refresh=direct"), &key).await;
    assert_eq!(response.status(), 503, "{:?}", response.text().await);
    let ready = app.request(reqwest::Method::GET, "/readyz", None).send().await.unwrap();
    assert_eq!(ready.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_reads_tables_from_an_s3_bucket_and_results_are_stored_there() {
    let moto = Moto::start().await;
    let (dir, project, key) = moto.project_with_sales();
    let data_dir = dir.0.as_path();

    // The executors and `serve` share nothing but the bucket (and `serve` its SQLite file).
    let cluster = start_cluster_with(moto.endpoints(), data_dir);
    let mut command = moto.endpoints();
    command.stderr(Stdio::null());
    let server =
        serve_command(command, data_dir, &["--engine", &cluster.url, "--materialize-poll-ms", "50"]).await;
    let client = reqwest::Client::new();
    let base = format!("{}/api/projects/{project}/endpoints", server.address);
    let send = |request: reqwest::RequestBuilder| async { request.bearer_auth(&key).send().await.unwrap() };

    let live = json!({"name": "totals", "query": {"kind": "SQLQuery",
        "query": "SELECT vip, count(*) AS orders FROM sales WHERE amount > {variables.min} GROUP BY vip ORDER BY vip",
        "variables": {"min": {"type": "Number", "default": 0}}}});
    assert_eq!(send(client.post(format!("{base}/")).json(&live)).await.status(), 201);
    let answer: RunResult = send(client.get(format!("{base}/totals/run?variables.min=5&refresh=direct")))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(answer.results, json!([{"vip": false, "orders": 2}, {"vip": true, "orders": 2}]));

    let stored = json!({"name": "vip", "is_materialized": true, "sync_frequency": "1hour", "query": {"kind": "SQLQuery",
        "query": "SELECT country, quantity, vip FROM sales WHERE vip = {variables.vip} ORDER BY quantity",
        "variables": {"vip": {"type": "Boolean", "default": true}}}});
    let created: Endpoint = send(client.post(format!("{base}/")).json(&stored)).await.json().await.unwrap();
    let id = created.id;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: Materialization =
            send(client.get(format!("{base}/vip/materialization_status"))).await.json().await.unwrap();
        if status.status == "Completed" {
            break;
        }
        assert!(status.status != "Failed" && Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys = moto.keys(&format!("projects/{project}/materializations/{id}/")).await;
    assert!(
        keys.len() == 1 && keys[0].ends_with("/part-0.parquet"),
        "the result is stored in the bucket: {keys:?}"
    );
    let answer: RunResult =
        send(client.get(format!("{base}/vip/run?variables.vip=true"))).await.json().await.unwrap();
    assert!(answer.computed.endpoint_materialized, "{answer:?}");
    assert_eq!(
        answer.results,
        json!([{"country": "US", "quantity": 1, "vip": true}, {"country": "FR", "quantity": 3, "vip": true},
               {"country": "DE", "quantity": 5, "vip": true}])
    );
}
