//! Faults an operator meets: the database going away under load and coming back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_actix::api::{Appended, Endpoint, LastExecutionTimes, RunResult, Table, VersionPage};
use http_actix::{Code, ErrorBody, ErrorType};
use reqwest::Method;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex};

use crate::helpers::{endpoint_body, get_json, postgres_url, typed, TestApp};

/// A TCP proxy in front of PostgreSQL that a test can cut (every connection dropped, new ones refused) and
/// restore, so the database goes away for this test's application only.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    open: watch::Sender<bool>,
}

impl Proxy {
    pub(crate) async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, watcher) = watch::channel(true);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut cut = watcher.clone();
                if !*cut.borrow_and_update() {
                    continue; // dropped: the connection is refused
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.wait_for(|open| !open) => {}
                    }
                });
            }
        });
        Self { port, open }
    }

    pub(crate) fn cut(&self) {
        self.open.send_replace(false);
    }

    pub(crate) fn restore(&self) {
        self.open.send_replace(true);
    }
}

/// The test database's URL with its host and port replaced by the proxy's; and the upstream address.
pub(crate) fn through_proxy(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (credentials, rest) = rest.rsplit_once('@').unwrap();
    let (address, database) = rest.split_once('/').unwrap();
    (format!("{scheme}://{credentials}@127.0.0.1:{port}/{database}"), address.to_owned())
}

async fn status_of(
    app: &TestApp,
    method: Method,
    path: &str,
    key: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request = app.request(method, path, Some(key)).timeout(Duration::from_secs(30));
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.expect("the service answers, whatever the database does");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

// Several threads: the proxy must keep forwarding while the test blocks on the `endpoints migrate` command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_going_away_under_load_is_503_and_nothing_acknowledged_is_lost() {
    let url = postgres_url();
    let (_, upstream) = through_proxy(&url, 0);
    let proxy = Proxy::start(upstream).await;
    let (proxied, _) = through_proxy(&url, proxy.port);
    let app = Arc::new(TestApp::builder().on_database(proxied).spawn().await);
    let (project, key) = app.project_with_key();
    let base = format!("/api/projects/{project}/endpoints");

    // Writers create endpoints until told to stop; every 201 is remembered.
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let statuses = Arc::new(Mutex::new(Vec::<(u16, Value)>::new()));
    let (stop, stopped) = watch::channel(false);
    let mut writers = Vec::new();
    for writer in 0..4 {
        let (app, key, base) = (Arc::clone(&app), key.clone(), base.clone());
        let (acknowledged, statuses, stopped) =
            (Arc::clone(&acknowledged), Arc::clone(&statuses), stopped.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !*stopped.borrow() {
                n += 1;
                let name = format!("w{writer}-{n}");
                let body = endpoint_body(&name, "SELECT 1 AS one");
                let (status, answer) =
                    status_of(&app, Method::POST, &format!("{base}/"), &key, Some(&body)).await;
                if status == 201 {
                    acknowledged.lock().await.push(name);
                }
                statuses.lock().await.push((status, answer));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    proxy.cut();
    let cut_at = Instant::now();
    // During the outage: 503 with the JSON error, the process alive, not ready.
    let (status, body) = status_of(&app, Method::GET, &format!("{base}/"), &key, None).await;
    assert_eq!(status, 503, "{body}");
    let error: ErrorBody = typed(&body);
    assert_eq!((error.kind, error.code), (ErrorType::ServerError, Code::Unavailable), "{body}");
    assert_eq!(app.request(Method::GET, "/healthz", None).send().await.unwrap().status(), 200);
    let ready = app.request(Method::GET, "/readyz", None).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["checks"]["store"]["status"], "failed", "{ready}");
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(cut_at.elapsed())).await;

    proxy.restore();
    // Recovery needs no restart: the pool opens new connections on the next requests.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = status_of(&app, Method::GET, &format!("{base}/"), &key, None).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the service did not recover: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(app.request(Method::GET, "/readyz", None).send().await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send_replace(true);
    for writer in writers {
        writer.await.unwrap();
    }

    let statuses = statuses.lock().await;
    let unavailable = statuses.iter().filter(|(s, _)| *s == 503).count();
    let created = statuses.iter().filter(|(s, _)| *s == 201).count();
    assert!(
        unavailable > 0 && created > 0,
        "the writers saw the outage and the recovery: {unavailable} / {created}"
    );
    for (status, body) in statuses.iter() {
        assert!(matches!(status, 201 | 503), "only created or unavailable, never {status}: {body}");
    }
    // Every acknowledged write is there, with its one version.
    for name in acknowledged.lock().await.iter() {
        let (status, endpoint) = status_of(&app, Method::GET, &format!("{base}/{name}"), &key, None).await;
        assert_eq!(status, 200, "{name}: {endpoint}");
        assert_eq!(typed::<Endpoint>(&endpoint).current_version, 1, "{name}: {endpoint}");
    }
}

/// The value of `endpoints_live_queries_running` on a server.
async fn running_queries(address: &str) -> f64 {
    let text = reqwest::get(format!("{address}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("endpoints_live_queries_running ")?.parse().ok())
        .expect("the gauge is exported")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_request_in_flight_finish_flushes_execution_times_and_exits() {
    let app = crate::helpers::spawn_app().await;
    let (project, key) = app.project_with_key();
    // A few seconds of work, to be in flight when the signal comes.
    let slow =
        "SELECT t.v % 7 AS k, count(*) AS n FROM generate_series(1, 30000000) AS t(v) GROUP BY k ORDER BY k";
    app.create_endpoint(project, &key, &endpoint_body("slow", slow)).await;
    app.create_endpoint(project, &key, &endpoint_body("quick", "SELECT 1 AS one")).await;
    let data_dir = app.data_dir.clone();
    app.stop().await.unwrap();

    // Execution times are only written at the stop.
    let mut server =
        crate::helpers::serve_process(&data_dir, &["--flush-secs", "3600", "--materialize-workers", "0"])
            .await;
    let client = reqwest::Client::new();
    let base = format!("{}/api/projects/{project}/endpoints", server.address);
    let quick = client.get(format!("{base}/quick/run")).bearer_auth(&key).send().await.unwrap();
    assert_eq!(quick.status(), 200);
    let in_flight = tokio::spawn({
        let request = client.get(format!("{base}/slow/run?refresh=direct")).bearer_auth(&key);
        async move { (request.send().await, Instant::now()) }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while running_queries(&server.address).await < 1.0 {
        assert!(Instant::now() < deadline, "the slow query never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let signalled = Instant::now();
    let pid = server.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let (answer, answered_at) = in_flight.await.unwrap();
    let answer = answer.expect("the request in flight is answered");
    assert!(answered_at > signalled, "the query was still running when the signal came");
    assert_eq!(answer.status(), 200);
    let body: RunResult = answer.json().await.unwrap();
    assert_eq!(body.results.as_array().map(Vec::len), Some(7), "{body:?}");
    // No new connections once stopping.
    assert!(client.get(format!("{base}/quick/run")).bearer_auth(&key).send().await.is_err());
    let exited = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(signalled.elapsed() < Duration::from_secs(45), "the process did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exited.success(), "{exited:?}");

    // The times recorded in memory reached the database.
    let app = TestApp::builder().over(data_dir).spawn().await;
    let found: LastExecutionTimes = app
        .post(
            &format!("/api/projects/{project}/endpoints/last_execution_times"),
            &key,
            &serde_json::json!({"names": ["quick", "slow"]}),
        )
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = found.query_status.results.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["quick", "slow"], "{found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_writes_leaves_no_partial_endpoint_or_version_gap() {
    let app = crate::helpers::spawn_app().await;
    let (project, key) = app.project_with_key();
    let data_dir = crate::helpers::DataDir(app.data_dir.clone());
    app.stop().await.unwrap();

    let mut server = crate::helpers::serve_process(&data_dir, &["--materialize-workers", "0"]).await;
    let base = format!("{}/api/projects/{project}/endpoints", server.address);
    // Each writer creates endpoints and gives each two new queries; what the server acknowledged is remembered.
    let acknowledged = Arc::new(Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    let mut writers = Vec::new();
    for writer in 0..4 {
        let (base, key, acknowledged) = (base.clone(), key.clone(), Arc::clone(&acknowledged));
        writers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            for n in 0.. {
                let name = format!("k{writer}-{n}");
                let created = client.post(format!("{base}/")).bearer_auth(&key).json(&endpoint_body(&name, "SELECT 1 AS one")).send().await;
                match created {
                    Ok(response) if response.status() == 201 => acknowledged.lock().await.insert(name.clone(), 1),
                    _ => return,
                };
                for version in 2..=3 {
                    let query = serde_json::json!({"query": {"kind": "SQLQuery", "query": format!("SELECT {version} AS v")}});
                    match client.patch(format!("{base}/{name}")).bearer_auth(&key).json(&query).send().await {
                        Ok(response) if response.status() == 200 => acknowledged.lock().await.insert(name.clone(), version),
                        _ => return,
                    };
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.child.kill().unwrap(); // SIGKILL, mid-write
    server.child.wait().unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    let acknowledged = acknowledged.lock().await.clone();
    assert!(acknowledged.len() >= 4, "the writers got going: {acknowledged:?}");

    let server = crate::helpers::serve_process(&data_dir, &["--materialize-workers", "0"]).await;
    let client = reqwest::Client::new();
    let base = format!("{}/api/projects/{project}/endpoints", server.address);
    let page = client.get(format!("{base}/?limit=1000")).bearer_auth(&key).send().await.unwrap();
    let page: http_actix::api::EndpointPage = page.json().await.unwrap();
    let stored: std::collections::BTreeMap<String, u64> =
        page.results.into_iter().map(|e| (e.name, u64::from(e.current_version))).collect();
    for (name, version) in &acknowledged {
        // A write that committed as the process died was never acknowledged: at most one version more.
        let found = stored.get(name).copied();
        assert!(
            found.is_some_and(|v| v == *version || v == version + 1),
            "{name}: acknowledged v{version}, found {found:?}"
        );
    }
    for (name, current) in &stored {
        let versions: VersionPage =
            typed(&get_json(&client, &format!("{base}/{name}/versions?limit=100"), &key).await);
        let mut numbers: Vec<u64> = versions.results.iter().map(|v| u64::from(v.version)).collect();
        numbers.sort_unstable();
        assert_eq!(numbers, (1..=*current).collect::<Vec<_>>(), "{name}: whole versions, no gap");
    }
}

/// `rows` sales rows as CSV, in the columns of the `sales` fixture.
fn many_sales(rows: usize) -> String {
    let mut csv = String::from("id,country,amount,quantity,day,at,vip\n");
    for i in 0..rows {
        csv.push_str(&format!(
            "{i},C{},{}.5,{},2026-01-01,2026-01-01T08:00:00,true\n",
            i % 97,
            i % 1000,
            i % 13
        ));
    }
    csv
}

#[tokio::test]
async fn a_full_disk_during_an_import_fails_clearly_and_keeps_the_previous_table() {
    let app = crate::helpers::spawn_app().await;
    let (project, key) = crate::helpers::project_with_sales(&app);
    app.create_endpoint(project, &key, &endpoint_body("count", "SELECT count(*) AS n FROM sales")).await;
    let run = format!("/api/projects/{project}/endpoints/count/run?refresh=direct");
    let count = |body: RunResult| body.results[0]["n"].as_i64();
    assert_eq!(count(app.get(&run, &key).await.json().await.unwrap()), Some(6));

    let big = app.data_dir.join("big.csv");
    std::fs::write(&big, many_sales(300_000)).unwrap();
    let output = crate::helpers::endpoints_with_file_limit(256)
        .arg("--data-dir")
        .arg(&app.data_dir)
        .args(["data", "import", "--project", &project.to_string(), "--table", "sales"])
        .arg(&big)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the import cannot have fitted");
    assert!(stderr.contains("error:") && stderr.contains("File too large"), "{stderr}");

    assert_eq!(
        count(app.get(&run, &key).await.json().await.unwrap()),
        Some(6),
        "the previous table is served"
    );
    let tables = app.data_dir.join(format!("projects/{project}/tables"));
    let left: Vec<String> = std::fs::read_dir(&tables)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["sales"], "no staging left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_during_a_refresh_is_reported_and_the_previous_result_still_served() {
    let app = crate::helpers::spawn_app().await;
    let (project, key) = crate::helpers::project_with_sales(&app);
    let body = serde_json::json!({
        "name": "by-country", "is_materialized": true, "sync_frequency": "1hour",
        "query": {"kind": "SQLQuery", "query": "SELECT id, country, amount FROM sales WHERE country = {variables.country}",
                  "variables": {"country": {"type": "String", "default": "US"}}},
    });
    app.create_endpoint(project, &key, &body).await;
    let data_dir = crate::helpers::DataDir(app.data_dir.clone());
    // Enough rows that their stored result cannot fit under the limit below.
    let big = data_dir.join("big.csv");
    std::fs::write(&big, many_sales(300_000)).unwrap();
    app.stop().await.unwrap();

    let worker = ["--materialize-poll-ms", "50", "--materialize-lease-secs", "3", "--workers", "1"];
    let mut limited = crate::helpers::endpoints_with_file_limit(1024);
    // Its warnings say why, should a run not answer from the stored result.
    let log = data_dir.join("server.log");
    limited.stderr(std::fs::File::create(&log).unwrap());
    let warnings = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().filter(|line| line.contains("WARN")).collect::<Vec<_>>().join("\n")
    };
    let server = crate::helpers::serve_command(limited, &data_dir, &worker).await;
    let client = reqwest::Client::new();
    let base = format!("{}/api/projects/{project}/endpoints/by-country", server.address);
    let status_url = format!("{base}/materialization_status");
    let status = || crate::helpers::get_status(&client, &status_url, &key);
    let deadline = Instant::now() + Duration::from_secs(60);
    while status().await.status != "Completed" {
        assert!(Instant::now() < deadline, "the small first refresh completes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = status().await.last_materialized_at;

    // The table grows past what fits; a changed frequency makes the endpoint due at once.
    append_with_the_cli(&data_dir, project, &big);
    let patched = client
        .patch(&base)
        .bearer_auth(&key)
        .json(&serde_json::json!({"sync_frequency": "24hour"}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(60);
    let failed = loop {
        let now = status().await;
        if now.status == "Failed" {
            break now;
        }
        assert!(Instant::now() < deadline, "the refresh fails: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The kind of storage failure, never a path.
    let error = failed.error.as_deref();
    assert_eq!(error, Some("The result could not be stored: file too large."), "{failed:?}");
    assert_eq!(failed.last_materialized_at, first, "the previous result is still the one on record");
    let answer: RunResult =
        typed(&get_json(&client, &format!("{base}/run?variables.country=US"), &key).await);
    assert!(answer.computed.endpoint_materialized, "{answer:?}\n{}", warnings());
    assert_eq!(answer.results.as_array().map(Vec::len), Some(2), "the previous result's rows: {answer:?}");
}

/// `endpoints data import --append` of a file into the project's `sales` table.
fn append_with_the_cli(data_dir: &std::path::Path, project: i64, file: &std::path::Path) {
    let import = std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"))
        .arg("--data-dir")
        .arg(data_dir.as_os_str())
        .args(["data", "import", "--project", &project.to_string(), "--table", "sales", "--append"])
        .arg(file)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(import.status.success(), "{}", String::from_utf8_lossy(&import.stderr));
}

/// An append of `rows` ids from `first`, as NDJSON.
fn ids_body(first: u64, rows: u64) -> String {
    (first..first + rows).map(|id| format!("{{\"id\": {id}}}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_appends_and_compactions_then_retries_with_their_keys_lose_and_repeat_no_row() {
    let app = crate::helpers::spawn_app().await;
    let project = app.create_project();
    let (_, key) = app.create_key(project, &["table:write", "table:read", "endpoint:write"]);
    let data_dir = crate::helpers::DataDir(app.data_dir.clone());
    app.stop().await.unwrap();
    // Compactions every 50 ms, so that the kill may come in the middle of one, under leases of 3 s (the killed
    // process's lease on the table runs out soon after the restart). Appends in flight keep the default of two
    // minutes: a retry takes over an append cut off by the kill because its process is gone, not because time
    // passed.
    let args = [
        "--materialize-workers",
        "0",
        "--compaction-interval-ms",
        "50",
        "--materialize-lease-secs",
        "3",
        "--rate-limit-key-per-sec",
        "0",
        "--rate-limit-project-per-sec",
        "0",
    ];
    let mut server = crate::helpers::serve_process(&data_dir, &args).await;
    let tables = format!("{}/api/projects/{project}/tables", server.address);
    let client = reqwest::Client::new();
    let created = client
        .put(format!("{tables}/events"))
        .bearer_auth(&key)
        .header("Content-Type", "application/x-ndjson")
        .body(ids_body(0, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    // Eight writers append 5 rows at a time under keys of their own; each remembers what was acknowledged and
    // what was sent without an answer.
    let acknowledged = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let unanswered = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let mut writers = Vec::new();
    for writer in 0..8_u64 {
        let (rows, key) = (format!("{tables}/events/rows"), key.clone());
        let (acknowledged, unanswered) = (Arc::clone(&acknowledged), Arc::clone(&unanswered));
        writers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            for n in 0_u64.. {
                let (name, first) = (format!("w{writer}-{n}"), 1 + writer * 1_000_000 + n * 5);
                let sent = client
                    .post(&rows)
                    .bearer_auth(&key)
                    .header("Content-Type", "application/x-ndjson")
                    .header("Idempotency-Key", &name)
                    .body(ids_body(first, 5))
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == 200 => acknowledged.lock().await.push((name, first)),
                    _ => {
                        unanswered.lock().await.push((name, first));
                        return;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    server.child.kill().unwrap(); // SIGKILL, mid-append
    server.child.wait().unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    let acknowledged = acknowledged.lock().await.clone();
    let unanswered = unanswered.lock().await.clone();
    assert!(acknowledged.len() >= 40, "the writers got going: {}", acknowledged.len());

    let server = crate::helpers::serve_process(&data_dir, &args).await;
    let tables = format!("{}/api/projects/{project}/tables", server.address);
    // Every append sent without an answer is retried with its key at once, and a few acknowledged ones too.
    let retried: Vec<&(String, u64)> = unanswered.iter().chain(acknowledged.iter().take(5)).collect();
    for (name, first) in &retried {
        let answer = client
            .post(format!("{tables}/events/rows"))
            .bearer_auth(&key)
            .header("Content-Type", "application/x-ndjson")
            .header("Idempotency-Key", name.as_str())
            .body(ids_body(*first, 5))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let body: Value = answer.json().await.unwrap();
        assert_eq!(status.as_u16(), 200, "{name}: {body}");
        assert_eq!(typed::<Appended>(&body).rows_added, 5, "{name}: {body}");
    }
    // Each acknowledged or retried append is in the table once: 1 + 5 rows each, every id once.
    let expected = 1 + 5 * (acknowledged.len() + unanswered.len()) as u64;
    let mut table: Table = typed(&get_json(&client, &format!("{tables}/events"), &key).await);
    for _ in 0..100 {
        if table.files < Some(12) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        table = typed(&get_json(&client, &format!("{tables}/events"), &key).await);
    }
    assert_eq!(table.row_count, Some(expected), "{table:?}");
    assert!(table.files < Some(12), "compacted after the restart: {table:?}");
    let endpoints = format!("{}/api/projects/{project}/endpoints", server.address);
    let count = endpoint_body("count", "SELECT count(*) AS n, count(DISTINCT id) AS d FROM events");
    let created = client.post(format!("{endpoints}/")).bearer_auth(&key).json(&count).send().await.unwrap();
    assert_eq!(created.status(), 201);
    let run: RunResult =
        typed(&get_json(&client, &format!("{endpoints}/count/run?refresh=direct"), &key).await);
    assert_eq!(run.results, serde_json::json!([{"n": expected, "d": expected}]), "no row lost or twice");
    let ids: std::collections::BTreeSet<u64> = (0..1)
        .chain(acknowledged.iter().chain(unanswered.iter()).flat_map(|(_, first)| *first..*first + 5))
        .collect();
    assert_eq!(ids.len() as u64, expected, "the ids sent are distinct");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_killed_mid_way_is_done_again_after_its_lease_and_equals_the_live_answer() {
    let app = crate::helpers::spawn_app().await;
    let (project, key) = crate::helpers::project_with_sales(&app);
    // A rollup (its variable filters a column it does not output), with appended rows due within a second.
    let body = serde_json::json!({
        "name": "by-vip", "is_materialized": true, "freshness_seconds": 1, "cache_age_seconds": 0,
        "query": {"kind": "SQLQuery",
                  "query": "SELECT vip, count(*) AS orders, sum(quantity) AS items, max(amount) AS top FROM sales \
                            WHERE country != {variables.not} GROUP BY vip ORDER BY vip",
                  "variables": {"not": {"type": "String", "default": "C1"}}},
    });
    let id = app.create_endpoint(project, &key, &body).await.id.to_string();
    let data_dir = crate::helpers::DataDir(app.data_dir.clone());
    let status_path = format!("/api/projects/{project}/endpoints/by-vip/materialization_status");
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.get(&status_path, &key).await.json::<crate::helpers::Materialization>().await.unwrap().status
        != "Completed"
    {
        assert!(Instant::now() < deadline, "the first refresh completes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await.unwrap();
    // Enough appended rows that folding them takes a while; the import says the endpoint's result is behind.
    let big = data_dir.join("big.csv");
    std::fs::write(&big, many_sales(2_000_000)).unwrap();
    append_with_the_cli(&data_dir, project, &big);

    let worker = ["--materialize-poll-ms", "50", "--materialize-lease-secs", "3", "--workers", "1"];
    let client = reqwest::Client::new();
    let doomed = crate::helpers::serve_process(&data_dir, &worker).await;
    let status_url = |server: &crate::helpers::ServeProcess| format!("{}{status_path}", server.address);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = crate::helpers::get_status(&client, &status_url(&doomed), &key).await;
        if now.status == "Running" {
            break;
        }
        assert_eq!(now.rows_folded, 0, "the fold finished before it could be killed: {now:?}");
        assert!(Instant::now() < deadline, "the fold never started: {now:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(doomed); // SIGKILL while folding: no chance to give the claim back.

    let restarted = crate::helpers::serve_process(&data_dir, &worker).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let now = crate::helpers::get_status(&client, &status_url(&restarted), &key).await;
        if now.status == "Completed" && now.rows_folded > 0 {
            break now;
        }
        assert!(now.status != "Failed", "{now:?}");
        assert!(Instant::now() < deadline, "the fold was never done again: {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Folded again from the same result, not computed in full; and only that result is stored.
    assert_eq!(done.full_refreshes, 1, "{done:?}");
    let stored = data_dir.join("projects").join(project.to_string()).join("materializations").join(&id);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&stored).unwrap().count() != 1 {
        assert!(Instant::now() < deadline, "the killed fold's files are removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run = format!("{}/api/projects/{project}/endpoints/by-vip/run?variables.not=C5", restarted.address);
    // A run falls back to the live tables when the stored result cannot be read at that moment (a later
    // refresh replacing it while it is read): the stored result is served again once it can be.
    let deadline = Instant::now() + Duration::from_secs(30);
    let stored = loop {
        let stored: RunResult = typed(&get_json(&client, &run, &key).await);
        if stored.computed.endpoint_materialized {
            break stored;
        }
        assert!(Instant::now() < deadline, "runs read the folded result: {stored:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let live: RunResult = typed(&get_json(&client, &format!("{run}&refresh=direct"), &key).await);
    assert_eq!(stored.results, live.results, "the folded result equals the live answer");
    let orders: u64 =
        live.results.as_array().unwrap().iter().map(|row| row["orders"].as_u64().unwrap()).sum();
    assert_eq!(orders, 6 + 2_000_000 - 20_619, "every appended row but country C5's, once");
}
