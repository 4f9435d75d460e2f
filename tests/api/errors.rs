//! HTTP-level errors: every status of the contract with the JSON error body.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{assert_error, endpoint_body, spawn_app, TestApp};

#[tokio::test]
async fn http_level_errors_are_json() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let base = format!("/api/projects/{project}/endpoints");
    app.create_endpoint(project, &key, &endpoint_body("kpi", "SELECT 1 AS n")).await;

    let response = app.request(Method::PUT, &format!("{base}/kpi"), Some(&key)).send().await.unwrap();
    assert_eq!(response.headers()["allow"], "GET, PATCH, DELETE");
    assert_error(response, 405, "validation_error").await;
    let response = app.request(Method::DELETE, &base, Some(&key)).send().await.unwrap();
    assert_eq!(response.headers()["allow"], "GET, POST");
    assert_error(response, 405, "validation_error").await;

    let response = app
        .request(Method::POST, &base, Some(&key))
        .header("content-type", "text/plain")
        .body("name=kpi")
        .send()
        .await
        .unwrap();
    assert_error(response, 415, "validation_error").await;

    let huge = json!({"name": "big", "description": "x".repeat(2 * 1024 * 1024),
                      "query": {"kind": "SQLQuery", "query": "SELECT 1"}});
    let body = assert_error(app.post(&base, &key, &huge).await, 413, "validation_error").await;
    assert_eq!(body.code.as_str(), "payload_too_large");

    let response = app
        .request(Method::POST, &base, Some(&key))
        .header("content-type", "application/json")
        .body("{\"name\": \"x\",")
        .send()
        .await
        .unwrap();
    let body = assert_error(response, 400, "validation_error").await;
    assert_eq!(body.code.as_str(), "parse_error");

    assert_error(app.get("/api/unknown", &key).await, 404, "not_found").await;
    assert_error(app.get(&format!("{base}/kpi/unknown"), &key).await, 404, "not_found").await;
    assert_error(app.get(&format!("{base}/no-such-endpoint"), &key).await, 404, "not_found").await;
    assert_error(app.get(&format!("{base}/not%20a%20name"), &key).await, 404, "not_found").await;
}

#[tokio::test]
async fn pathological_sql_cannot_bring_the_server_down() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let base = format!("/api/projects/{project}/endpoints");
    for (name, sql) in [
        ("sum", format!("SELECT {} AS x", vec!["1"; 50_000].join("+"))),
        ("sum250", format!("SELECT {} AS x", vec!["1"; 250].join("+"))),
        ("sum1200", format!("SELECT {} AS x", vec!["1"; 1_200].join("+"))),
        ("parens", format!("SELECT {}1{} AS x", "(".repeat(50_000), ")".repeat(50_000))),
        ("ands", format!("SELECT 1 AS x WHERE {}", vec!["1 = 1"; 20_000].join(" AND "))),
    ] {
        let response = app.post(&base, &key, &endpoint_body(name, &sql)).await;
        assert!([201, 400].contains(&response.status().as_u16()), "{name}: {}", response.status());
    }
    assert_eq!(app.get(&base, &key).await.status(), 200, "the server is still up");
    // Large but bounded expressions plan and run on the engine's deep stacks; deeper ones are refused before
    // planning, whose time grows with the square of their depth.
    let run: Value = app.get(&format!("{base}/sum250/run"), &key).await.json().await.unwrap();
    assert_eq!(run["results"], json!([{"x": 250}]));
    assert_eq!(app.get(&format!("{base}/sum1200"), &key).await.status(), 404, "refused when created");
}

/// Opens a raw connection to the app and sends `head` (and nothing more).
async fn raw(app: &crate::helpers::TestApp, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(app.address.trim_start_matches("http://")).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Everything the server sends until it closes the connection, or `None` if it is still open after `within`.
async fn answer_within(stream: &mut tokio::net::TcpStream, within: std::time::Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut text = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut text)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&text).into_owned())
}

#[tokio::test]
async fn slow_clients_get_408_and_are_disconnected() {
    let app = TestApp::builder()
        .tuned(|config| config.client_timeout = std::time::Duration::from_secs(1))
        .spawn()
        .await;
    let (project, key) = app.project_with_key();
    let limit = std::time::Duration::from_secs(5);

    // A head that never ends.
    let mut stream = raw(&app, "GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
    let answer = answer_within(&mut stream, limit).await.expect("the connection is closed");
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");

    // A body that trickles: the head is complete, the body never is.
    let head = format!(
        "POST /api/projects/{project}/endpoints/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\""
    );
    let mut stream = raw(&app, &head).await;
    let answer = answer_within(&mut stream, limit).await.expect("the connection is answered and closed");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "a JSON error: {answer}");
}

#[tokio::test]
async fn oversized_request_heads_get_431() {
    let app = crate::helpers::spawn_app().await;
    let (project, key) = app.project_with_key();
    let limit = std::time::Duration::from_secs(5);
    // Host, Authorization and Connection, then `extra` fields.
    let head = |extra: &str| {
        format!(
            "GET /api/projects/{project}/endpoints HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Connection: close\r\n{extra}\r\n"
        )
    };
    let many = |n: usize| (0..n).map(|i| format!("X-Field-{i}: v\r\n")).collect::<String>();
    // Within the limits: 93 more fields (96 in all), and a 64 KiB value.
    for fits in [many(93), format!("X-Big: {}\r\n", "x".repeat(64 * 1024))] {
        let mut stream = raw(&app, &head(&fits)).await;
        let answer = answer_within(&mut stream, limit).await.expect("answered");
        assert!(answer.starts_with("HTTP/1.1 200"), "{}", &answer[..40.min(answer.len())]);
    }
    // Past them: 97 fields, or a 200 KiB value. The answer comes before the server stops reading.
    for too_much in [many(94), format!("X-Big: {}\r\n", "x".repeat(200 * 1024))] {
        use tokio::io::AsyncReadExt;
        let mut stream = raw(&app, &head(&too_much)).await;
        let mut start = [0u8; 12];
        tokio::time::timeout(limit, stream.read_exact(&mut start)).await.expect("answered").unwrap();
        assert_eq!(&start, b"HTTP/1.1 431");
    }
}
