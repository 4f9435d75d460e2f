//! Several `serve` processes on one PostgreSQL database: a change made through one is honoured by every other
//! at once, while their cached runs still touch no database between changes.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_actix::api::RunResult;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::faults::{through_proxy, Proxy};
use crate::helpers::{endpoint_body, postgres_url, serve_command, typed, ServeProcess, TestApp};

/// A real `endpoints serve` on `database_url`. Keys are trusted for ten minutes and cached runs for the
/// endpoint's cache age (five minutes by default), so only an announced change can end either sooner.
async fn node(data_dir: &std::path::Path, database_url: &str) -> ServeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_endpoints"));
    command.arg("--database-url").arg(database_url).stderr(Stdio::null());
    serve_command(command, data_dir, &["--materialize-workers", "0", "--key-cache-ms", "600000"]).await
}

struct Client {
    http: reqwest::Client,
    key: String,
    project: i64,
}

impl Client {
    fn url(&self, node: &ServeProcess, path: &str) -> String {
        format!("{}/api/projects/{}/endpoints{path}", node.address, self.project)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request.bearer_auth(&self.key).send().await.expect("the node answers");
        (response.status(), response.json().await.unwrap_or(Value::Null))
    }

    async fn run(&self, node: &ServeProcess, name: &str) -> (StatusCode, Value) {
        self.send(self.http.get(self.url(node, &format!("/{name}/run")))).await
    }

    async fn patch(&self, node: &ServeProcess, name: &str, body: Value) {
        let (status, answer) =
            self.send(self.http.patch(self.url(node, &format!("/{name}"))).json(&body)).await;
        assert_eq!(status, 200, "{answer}");
    }

    /// Runs `name` on `node` until `done` accepts the answer, and returns how long that took.
    async fn until(
        &self,
        node: &ServeProcess,
        name: &str,
        done: impl Fn(StatusCode, &Value) -> bool,
    ) -> Duration {
        let started = Instant::now();
        loop {
            let (status, answer) = self.run(node, name).await;
            if done(status, &answer) {
                return started.elapsed();
            }
            assert!(started.elapsed() < Duration::from_secs(3), "not honoured within 3 s: {status} {answer}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn value(answer: &Value) -> Option<i64> {
    answer.get("results").and_then(|rows| rows[0]["n"].as_i64())
}

/// A run's answer as the API's type of it.
fn ran(answer: &Value) -> RunResult {
    typed(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_node_is_honoured_by_the_others_at_once() {
    let setup = TestApp::builder().on_postgres().tuned(|_| {}).spawn().await;
    let (project, key) = setup.project_with_key();
    let url = postgres_url();
    let (a, b, c) = (
        node(&setup.data_dir, &url).await,
        node(&setup.data_dir, &url).await,
        node(&setup.data_dir, &url).await,
    );
    let client = Client { http: reqwest::Client::new(), key, project };
    let (status, _) =
        client.send(client.http.post(client.url(&a, "/")).json(&endpoint_body("kpi", "SELECT 1 AS n"))).await;
    assert_eq!(status, 201);

    // Every node computes once, then answers from its own cache.
    for node in [&a, &b, &c] {
        client.run(node, "kpi").await;
        let (_, cached) = client.run(node, "kpi").await;
        assert_eq!((ran(&cached).request.is_cached, value(&cached)), (true, Some(1)));
    }

    // A new query through A: B and C answer with version 2 at once, not with their cached version 1.
    client.patch(&a, "kpi", json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS n"}})).await;
    for node in [&b, &c] {
        let took = client.until(node, "kpi", |_, answer| value(answer) == Some(2)).await;
        assert!(took < Duration::from_secs(1), "{took:?}");
        let (_, again) = client.run(node, "kpi").await;
        let again = ran(&again);
        assert_eq!((again.request.is_cached, again.computed.endpoint_version), (true, Some(2)));
    }

    // Deactivated through B: A and C stop answering it.
    client.patch(&b, "kpi", json!({"is_active": false})).await;
    for node in [&a, &c] {
        client.until(node, "kpi", |status, _| status == 404).await;
    }
    client.patch(&b, "kpi", json!({"is_active": true})).await;
    for node in [&a, &c] {
        client.until(node, "kpi", |status, _| status == 200).await;
        client.run(node, "kpi").await;
    }

    // Deleted through C: gone on A and B, cached runs included.
    let (status, _) = client.send(client.http.delete(client.url(&c, "/kpi"))).await;
    assert_eq!(status, 204);
    for node in [&a, &b] {
        client.until(node, "kpi", |status, _| status == 404).await;
    }

    // A key revoked by another process (the CLI) stops working on every node, though nodes trust keys they read
    // for ten minutes.
    let id =
        setup.cli(&["key", "list", "--project", &project.to_string()])[0]["id"].as_str().unwrap().to_owned();
    setup.cli(&["key", "revoke", &id]);
    for node in [&a, &b, &c] {
        let started = Instant::now();
        while client.send(client.http.get(client.url(node, "/"))).await.0 != 401 {
            assert!(started.elapsed() < Duration::from_secs(3), "the revoked key still works");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_loses_the_change_channel_stops_trusting_its_cache() {
    let setup = TestApp::builder().on_postgres().tuned(|_| {}).spawn().await;
    let (project, key) = setup.project_with_key();
    let url = postgres_url();
    let (_, upstream) = through_proxy(&url, 0);
    let proxy = Proxy::start(upstream).await;
    let (proxied, _) = through_proxy(&url, proxy.port);
    let a = node(&setup.data_dir, &url).await;
    let b = node(&setup.data_dir, &proxied).await;
    let client = Client { http: reqwest::Client::new(), key, project };
    let (status, _) =
        client.send(client.http.post(client.url(&a, "/")).json(&endpoint_body("kpi", "SELECT 1 AS n"))).await;
    assert_eq!(status, 201);
    client.run(&b, "kpi").await;
    assert!(ran(&client.run(&b, "kpi").await.1).request.is_cached);

    // B loses its database, and with it the channel; A changes the query meanwhile. B cannot know what changed,
    // so it stops answering from its cache (it would serve version 1) and says the store is away instead.
    proxy.cut();
    client.patch(&a, "kpi", json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS n"}})).await;
    client.until(&b, "kpi", |status, _| status == 503).await;
    let (status, answer) = client.run(&b, "kpi").await;
    assert_eq!(status, 503, "{answer}");

    // Back: B answers with version 2.
    proxy.restore();
    client.until(&b, "kpi", |status, answer| status == 200 && value(answer) == Some(2)).await;
}

/// `psql -Atc SQL` on the test database: one line per row.
fn psql(url: &str, sql: &str) -> String {
    let output = Command::new("psql").arg(url).args(["-Atc", sql]).output().expect("psql runs");
    assert!(output.status.success(), "psql: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Waits until `nodes` processes' heartbeats are in (each writes one as its listener connects, then every
/// second), so that every writer waits for each of them.
async fn heartbeats_in(url: &str, nodes: u32) {
    let started = Instant::now();
    let live =
        || psql(url, "SELECT count(*) FROM endpoints_nodes WHERE seen_at > now() - interval '5 seconds'");
    while live().parse::<u32>().unwrap() < nodes {
        assert!(started.elapsed() < Duration::from_secs(5), "the nodes' heartbeats are not in");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Read your writes on every node: once a write through A is answered, the very next request on B sees it, with
/// no retry: a new query 100 times in a row (B held the version before in its cache each time), deletes, and key
/// revocations through the CLI (another process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_seen_on_every_node_as_soon_as_it_is_answered() {
    let setup = TestApp::builder().on_postgres().tuned(|_| {}).spawn().await;
    let (project, key) = setup.project_with_key();
    let url = postgres_url();
    let (a, b) = (node(&setup.data_dir, &url).await, node(&setup.data_dir, &url).await);
    let client = Client { http: reqwest::Client::new(), key, project };
    let (status, _) =
        client.send(client.http.post(client.url(&a, "/")).json(&endpoint_body("kpi", "SELECT 0 AS n"))).await;
    assert_eq!(status, 201);
    heartbeats_in(&url, 3).await;
    client.run(&b, "kpi").await;
    assert!(ran(&client.run(&b, "kpi").await.1).request.is_cached);

    for i in 1..=100 {
        client
            .patch(&a, "kpi", json!({"query": {"kind": "SQLQuery", "query": format!("SELECT {i} AS n")}}))
            .await;
        let (status, answer) = client.run(&b, "kpi").await;
        assert_eq!((status, value(&answer)), (StatusCode::OK, Some(i)), "round {i}: {answer}");
        assert_eq!(ran(&answer).computed.endpoint_version, u32::try_from(i + 1).ok(), "round {i}");
    }

    for i in 0..30 {
        let name = format!("gone-{i}");
        let body = endpoint_body(&name, "SELECT 1 AS n");
        assert_eq!(client.send(client.http.post(client.url(&a, "/")).json(&body)).await.0, 201);
        client.run(&b, &name).await;
        assert!(ran(&client.run(&b, &name).await.1).request.is_cached, "{name} is cached on B");
        assert_eq!(client.send(client.http.delete(client.url(&a, &format!("/{name}")))).await.0, 204);
        let (status, answer) = client.run(&b, &name).await;
        assert_eq!(status, 404, "{name} still runs on B: {answer}");
    }

    // Keys revoked by the CLI: the command returns once no node accepts the key (nodes trust keys for ten minutes).
    for round in 0..5 {
        let (id, secret) = setup.create_key(project, &["endpoint:read"]);
        let revoked = Client { http: client.http.clone(), key: secret, project };
        for node in [&a, &b] {
            assert_eq!(revoked.send(revoked.http.get(revoked.url(node, "/"))).await.0, 200, "round {round}");
        }
        setup.cli(&["key", "revoke", &id]);
        for node in [&a, &b] {
            assert_eq!(revoked.send(revoked.http.get(revoked.url(node, "/"))).await.0, 401, "round {round}");
        }
    }
}

/// How many of `node`'s reads of a table's version were `kept` (known from what it hears) or `checked` against
/// the table's log.
async fn version_reads(node: &ServeProcess, version: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", node.address)).await.unwrap().text().await.unwrap();
    let series = format!("endpoints_table_version_reads_total{{version=\"{version}\"}}");
    crate::operations::sample(&text, &series).unwrap_or(0.0)
}

/// Tables on every node: a node keeps each table's version and hears every write of every process, so a run
/// asks the storage nothing between writes, and the next run on any node after a write was answered reads it:
/// appends through either node, appends by another process (the CLI), a replace and a delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_write_is_read_on_every_node_as_soon_as_it_is_answered_with_no_storage_read_between() {
    let setup = TestApp::builder().on_postgres().tuned(|_| {}).spawn().await;
    let project = setup.create_project();
    let (_, key) = setup.create_key(project, &["endpoint:write", "table:write", "table:read"]);
    let url = postgres_url();
    let (a, b) = (node(&setup.data_dir, &url).await, node(&setup.data_dir, &url).await);
    let client = Client { http: reqwest::Client::new(), key, project };
    let table = |node: &ServeProcess, rows: &str| {
        format!("{}/api/projects/{}/tables/t{rows}", node.address, client.project)
    };
    let csv = |body: String| client.http.put(table(&a, "")).header("Content-Type", "text/csv").body(body);
    assert_eq!(client.send(csv("n\n1\n".into())).await.0, 201);
    // Never cached: every run reads the table.
    let mut body = endpoint_body("rows", "SELECT count(*) AS n FROM t");
    body["cache_age_seconds"] = json!(0);
    assert_eq!(client.send(client.http.post(client.url(&a, "/")).json(&body)).await.0, 201);
    heartbeats_in(&url, 3).await;
    for node in [&a, &b] {
        assert_eq!(value(&client.run(node, "rows").await.1), Some(1));
    }

    for i in 2..=41 {
        let (writer, reader) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let append = client.http.post(table(writer, "/rows")).header("Content-Type", "text/csv");
        let (status, answer) = client.send(append.body(format!("n\n{i}\n"))).await;
        assert_eq!(status, 200, "{answer}");
        let (status, answer) = client.run(reader, "rows").await;
        assert_eq!((status, value(&answer)), (StatusCode::OK, Some(i)), "append {i}: {answer}");
    }

    // Between writes, runs on B take the version it keeps: the storage is not asked.
    let (kept, checked) = (version_reads(&b, "kept").await, version_reads(&b, "checked").await);
    for _ in 0..20 {
        assert_eq!(value(&client.run(&b, "rows").await.1), Some(41));
    }
    // Nearly all: a compaction of the table (announced too) or a heartbeat held up on a loaded machine makes
    // the next read check; without what it hears, every one of the 20 would.
    let checks = version_reads(&b, "checked").await - checked;
    assert!(checks <= 2.0, "runs between writes ask the storage nothing: {checks} checks");
    assert!(version_reads(&b, "kept").await >= kept + 18.0, "they read the kept version");

    // Another process appends (the CLI, straight into the storage): answered once both nodes heard it.
    let file = setup.data_dir.join("more.csv");
    std::fs::write(&file, "n\n42\n43\n").unwrap();
    let project = project.to_string();
    setup.cli(&["data", "import", "--project", &project, "--table", "t", "--append", file.to_str().unwrap()]);
    for node in [&a, &b] {
        assert_eq!(value(&client.run(node, "rows").await.1), Some(43));
    }

    // Replaced through B, deleted through A: the next run on the other node sees it.
    let replace = client.http.put(table(&b, "")).header("Content-Type", "text/csv").body("n\n1\n2\n");
    assert_eq!(client.send(replace).await.0, 200);
    assert_eq!(value(&client.run(&a, "rows").await.1), Some(2));
    assert_eq!(client.send(client.http.delete(client.url(&a, "/rows"))).await.0, 204);
    assert_eq!(client.send(client.http.delete(table(&a, ""))).await.0, 204);
    let (status, answer) = client.send(client.http.get(table(&b, ""))).await;
    assert_eq!(status, 404, "{answer}");
}
