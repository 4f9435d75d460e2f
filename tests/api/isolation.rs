//! Isolation and resource bounds (contract section 21), tried as an attacker with one project's key would: MCP
//! under the REST API's limits, floods of unknown keys, and error details that say nothing of the server.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{assert_error, spawn_app, DataDir, ServeProcess, TestApp};

fn rate(per_second: u32) -> Option<http_actix::Rate> {
    std::num::NonZeroU32::new(per_second).map(|per_second| http_actix::Rate { per_second })
}

async fn mcp(app: &TestApp, key: &str, message: Value) -> reqwest::Response {
    app.request(Method::POST, "/mcp", Some(key))
        .header("Accept", "application/json, text/event-stream")
        .json(&message)
        .send()
        .await
        .unwrap()
}

fn ping(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

#[tokio::test]
async fn mcp_has_the_rest_apis_rate_and_body_timeout_on_every_method() {
    let app = TestApp::builder()
        .tuned(|config| {
            config.rate_limits.per_key = rate(1);
            config.client_timeout = Duration::from_secs(1);
        })
        .spawn()
        .await;
    let (_, key) = app.project_with_key();
    // `ping` and `initialize` spend the key's budget like any call: a burst of two, then 429.
    assert_eq!(mcp(&app, &key, ping(1)).await.status(), 200);
    let initialize = json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    assert_eq!(mcp(&app, &key, initialize).await.status(), 200);
    let over = mcp(&app, &key, ping(3)).await;
    assert!(over.headers().contains_key("retry-after"), "{:?}", over.headers());
    assert_eq!(assert_error(over, 429, "throttled").await.code.as_str(), "rate_limited");

    // A body sent a byte at a time is cut off at the client timeout, as on the REST routes.
    let (_, slow) = app.project_with_key();
    let address = app.address.trim_start_matches("http://").to_owned();
    let started = Instant::now();
    let answer = tokio::task::spawn_blocking(move || {
        let mut socket = std::net::TcpStream::connect(address).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {slow}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{"
        );
        socket.write_all(head.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = socket.read_to_string(&mut answer);
        answer
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10), "cut off after {:?}", started.elapsed());
}

/// The real binary serving `app`'s data directory once `app` stops, without a refresh worker, its log written to a
/// file beside the directory (whose path it returns).
async fn serve_logging(app: TestApp) -> (ServeProcess, DataDir, std::path::PathBuf) {
    let data_dir = DataDir(app.data_dir.clone());
    app.stop().await.unwrap();
    let log_path = data_dir.with_extension("log");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"));
    command.stderr(std::fs::File::create(&log_path).unwrap());
    let server = crate::helpers::serve_command(command, &data_dir, &["--materialize-workers", "0"]).await;
    (server, data_dir, log_path)
}

#[tokio::test]
async fn a_flood_of_mcp_requests_does_not_write_a_log_line_each() {
    let app = spawn_app().await;
    let (_, key) = app.project_with_key();
    let (server, _data_dir, log_path) = serve_logging(app).await;
    let client = reqwest::Client::new();
    let before = std::fs::read_to_string(&log_path).unwrap().lines().count();
    for id in 0..150 {
        let message = if id % 2 == 0 {
            ping(id)
        } else {
            json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        };
        let answer = client
            .post(format!("{}/mcp", server.address))
            .bearer_auth(&key)
            .header("Accept", "application/json, text/event-stream")
            .json(&message)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    drop(server);
    let log = std::fs::read_to_string(&log_path).unwrap();
    let written = log.lines().count() - before;
    assert!(written < 10, "150 MCP requests wrote {written} log lines:\n{log}");
    std::fs::remove_file(log_path).ok();
}

#[tokio::test]
async fn writes_to_a_table_do_not_log_the_delta_kernels_snapshots() {
    let app = spawn_app().await;
    let project = app.create_project();
    let (_, key) = app.create_key(project, &["table:write"]);
    let (server, _data_dir, log_path) = serve_logging(app).await;
    let client = reqwest::Client::new();
    let table = format!("{}/api/projects/{project}/tables/events", server.address);
    let put = client.put(&table).bearer_auth(&key).header("Content-Type", "text/csv").body("n\n0\n");
    assert_eq!(put.send().await.unwrap().status(), 201);
    for n in 1..=20 {
        let append =
            client.post(format!("{table}/rows")).bearer_auth(&key).header("Content-Type", "text/csv");
        assert_eq!(append.body(format!("n\n{n}\n")).send().await.unwrap().status(), 200);
    }
    drop(server);
    let log = std::fs::read_to_string(&log_path).unwrap();
    // The kernel logs each snapshot it builds at `info`, the whole log segment in one line of kilobytes.
    assert!(!log.contains("buoyant_kernel"), "a table's writes logged the Delta kernel's lines:\n{log}");
    assert!(log.len() < 20_000, "21 writes to a table logged {} bytes:\n{log}", log.len());
    std::fs::remove_file(log_path).ok();
}

#[tokio::test]
async fn an_address_that_keeps_failing_to_authenticate_is_refused_before_its_keys_are_read() {
    let app =
        TestApp::builder().tuned(|config| config.rate_limits.failed_auth_per_address = rate(5)).spawn().await;
    let (project, key) = app.project_with_key();
    let path = format!("/api/projects/{project}/endpoints");
    let mut statuses = Vec::new();
    for i in 0..40 {
        let made_up = format!("phx_{:064x}", i);
        statuses.push(app.get(&path, &made_up).await.status().as_u16());
    }
    let unauthorized = statuses.iter().filter(|s| **s == 401).count();
    assert!((10..=12).contains(&unauthorized), "a burst of about ten 401s: {statuses:?}");
    assert!(statuses.ends_with(&[429; 20]), "{statuses:?}");
    // The address is refused whatever it sends, until it may try again; another address is not.
    let refused = app.get(&path, &key).await;
    assert!(refused.headers().contains_key("retry-after"));
    assert_error(refused, 429, "throttled").await;
    let elsewhere = reqwest::Client::builder().local_address(Some([127, 0, 0, 2].into())).build().unwrap();
    let answer = elsewhere.get(format!("{}{path}", app.address)).bearer_auth(&key).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(app.get(&path, &key).await.status(), 200, "the address may try again");
}

/// What broke the server's answers before: a corrupt Parquet body and a string past 2 GiB panicked (500), a
/// huge value was read whole, and details showed where the body was staged and the engine's plan text. Each is
/// a 400 now, with its cause, in the client's terms.
#[tokio::test]
async fn nothing_a_client_sends_gets_a_500_or_shows_the_servers_internals() {
    let app = spawn_app().await;
    let project = app.create_project();
    let (_, key) = app.create_key(project, &["endpoint:write", "table:write"]);
    let table = format!("/api/projects/{project}/tables/t");
    let put = |content_type: &'static str, body: Vec<u8>| {
        let request = app.request(Method::PUT, &table, Some(&key)).header("Content-Type", content_type);
        async move { request.body(body).send().await.unwrap() }
    };
    for (content_type, body) in [
        ("application/vnd.apache.parquet", b"PAR1garbagePAR1".to_vec()),
        ("text/csv", b"a,b\n1,2,3\n".to_vec()),
        ("application/x-ndjson", b"{\"a\": 1}\n{\"a\": \n".to_vec()),
    ] {
        let error = assert_error(put(content_type, body).await, 400, "validation_error").await;
        assert_eq!(error.attr.as_deref(), Some("body"), "{content_type}: {error:?}");
    }
    let mut huge = b"id,blob\n1,\"".to_vec();
    huge.resize(huge.len() + 65 * 1024 * 1024, b'x');
    let error = assert_error(put("text/csv", huge).await, 400, "validation_error").await;
    assert!(error.detail.contains("Row 2"), "{error:?}");

    let endpoints = format!("/api/projects/{project}/endpoints");
    for (name, sql, variables) in [
        ("repeat", "SELECT length(repeat('x', {variables.n})) AS n", json!({"n": 1_500_000_000})),
        (
            "overflow",
            "SELECT sum(length(repeat('y', 1000000 + v % 2))) AS m FROM generate_series(1, 3000) AS t(v) \
             WHERE v <= {variables.n}",
            json!({"n": 2100}),
        ),
    ] {
        let body = json!({"name": name, "query": {"kind": "SQLQuery", "query": sql,
            "variables": {"n": {"type": "Integer", "default": 1}}}});
        let created = app.post(&endpoints, &key, &body).await;
        assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
        let run = app.post(&format!("{endpoints}/{name}/run"), &key, &json!({"variables": variables})).await;
        assert_eq!(assert_error(run, 400, "query_error").await.code.as_str(), "query_memory_limit");
    }
    let body = json!({"name": "typed", "query": {"kind": "SQLQuery",
        "query": "SELECT * FROM generate_series(1, {variables.s})",
        "variables": {"s": {"type": "String", "default": "x"}}}});
    let error = assert_error(app.post(&endpoints, &key, &body).await, 400, "validation_error").await;
    assert!(error.detail.contains("{variables.s}"), "{error:?}");
}
