//! Run logs and usage (contract section 19): every run and refresh recorded without its variables' values, read
//! back per endpoint, as usage, and as the project's own `_logs` table; never another project's; gone after
//! the retention; written by every node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use http_actix::api::{LogEntry, LogKindName, LogList, LogSourceName, TransportName, Usage, UsageBucketBody};
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{assert_error, project_with_sales, TestApp};

/// Requests sent at once, past a key's rate.
const BURST: usize = 150;

/// A value no record or answer about the runs may hold.
const SECRET: &str = "zz-secret-variable-value";

fn quick_log(config: &mut server::Config) {
    config.run_log =
        Some(server::RunLogConfig { flush_interval: Duration::from_millis(100), ..Default::default() });
}

fn by_country(name: &str) -> Value {
    json!({
        "name": name,
        "query": {
            "kind": "SQLQuery",
            "query": "SELECT country, count(*) AS n FROM sales WHERE country = {variables.country} GROUP BY country",
            "variables": {"country": {"type": "String", "default": "US"}}
        },
        "cache_age_seconds": 300
    })
}

/// The endpoint's log records, once there are at least `count` (within ten seconds).
async fn records(
    app: &TestApp,
    project: i64,
    key: &str,
    name: &str,
    query: &str,
    count: usize,
) -> Vec<LogEntry> {
    let started = Instant::now();
    loop {
        let response =
            app.get(&format!("/api/projects/{project}/endpoints/{name}/logs?limit=1000{query}"), key).await;
        assert_eq!(response.status(), 200);
        let found = response.json::<LogList>().await.unwrap().results;
        if found.len() >= count || started.elapsed() > Duration::from_secs(10) {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sql(app: &TestApp, project: i64, key: &str, name: &str, query: &str) -> Value {
    let body = json!({"name": name, "query": {"kind": "SQLQuery", "query": query}});
    let created = app.post(&format!("/api/projects/{project}/endpoints"), key, &body).await;
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let run = app.get(&format!("/api/projects/{project}/endpoints/{name}/run?refresh=direct"), key).await;
    assert_eq!(run.status(), 200);
    run.json::<Value>().await.unwrap()["results"].clone()
}

fn token_id(token: &str) -> String {
    let claims = token.split('.').nth(1).unwrap();
    let claims: Value =
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(claims).unwrap())
            .unwrap();
    claims["jti"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn every_kind_of_run_and_refresh_is_logged_without_a_variables_value() {
    let app = TestApp::builder()
        .tuned(|config| {
            quick_log(config);
            config.rate_limits.per_key =
                std::num::NonZeroU32::new(50).map(|per_second| http_actix::Rate { per_second });
        })
        .spawn()
        .await;
    let (project, writer) = project_with_sales(&app);
    let base = format!("/api/projects/{project}/endpoints");
    app.create_endpoint(project, &writer, &by_country("by-country")).await;
    let labelled = app.cli(&[
        "key",
        "create",
        "--project",
        &project.to_string(),
        "--scope",
        "endpoint:read",
        "--label",
        "dashboard",
    ]);
    let reader = labelled["key"].as_str().unwrap().to_owned();
    let run = format!("{base}/by-country/run");
    let mut request_ids = Vec::new();
    let mut send = |response: reqwest::Response| {
        request_ids.push(response.headers()["x-request-id"].to_str().unwrap().to_owned());
        response
    };

    // Live, then from the cache; POST; an export; a refused variable; each with the secret value.
    let live = send(app.get(&format!("{run}?variables.country={SECRET}"), &reader).await);
    assert_eq!(live.status(), 200);
    let cached = send(app.get(&format!("{run}?variables.country={SECRET}"), &reader).await);
    assert_eq!(cached.json::<Value>().await.unwrap()["is_cached"], true);
    let posted = send(app.post(&run, &reader, &json!({"variables": {"country": "US"}})).await);
    assert_eq!(posted.status(), 200);
    let csv = send(app.get(&format!("{run}?format=csv&variables.country={SECRET}"), &reader).await);
    assert_eq!(csv.status(), 200);
    let refused = send(app.get(&format!("{run}?variables.nope={SECRET}"), &reader).await);
    assert_error(refused, 400, "validation_error").await;
    // A run token's run, and one over MCP.
    let issued = app
        .post(&format!("/api/projects/{project}/run_tokens"), &writer, &json!({"endpoints": ["by-country"]}))
        .await;
    let token = issued.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    assert_eq!(send(app.get(&run, &token).await).status(), 200);
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "run_by-country", "arguments": {"country": SECRET}}});
    let mcp = app
        .request(Method::POST, "/mcp", Some(&reader))
        .header("Accept", "application/json, text/event-stream")
        .json(&call)
        .send()
        .await
        .unwrap();
    assert_eq!(mcp.status(), 200, "{}", mcp.text().await.unwrap());
    // Past a key's rate (50 a second, bursts of 100): 429s.
    let (_, hasty) = app.create_key(project, &["endpoint:read"]);
    let mut limited = 0;
    for _ in 0..BURST {
        if app.get(&run, &hasty).await.status() == 429 {
            limited += 1;
        }
    }
    assert!(limited > 0);
    // A key of another project is in no log of this one.
    let (_, stranger) = app.project_with_key();
    assert_eq!(app.get(&run, &stranger).await.status(), 403);

    // A materialized endpoint's refresh.
    let mut materialized = by_country("kept");
    materialized["is_materialized"] = json!(true);
    app.create_endpoint(project, &writer, &materialized).await;

    let runs = 7 + BURST;
    let logged = records(&app, project, &writer, "by-country", "", runs).await;
    assert_eq!(logged.len(), runs, "{logged:#?}");
    let text = serde_json::to_string(&logged).unwrap();
    assert!(!text.contains(SECRET), "a variable's value is in the log: {text}");
    let with_id = |id: &str| {
        logged.iter().find(|r| r.request_id.as_deref() == Some(id)).unwrap_or_else(|| panic!("{id}: {text}"))
    };
    let live = with_id(&request_ids[0]);
    assert_eq!((live.kind, live.status, live.source), (LogKindName::Run, 200, Some(LogSourceName::Live)));
    assert_eq!((live.version, live.rows, live.transport), (Some(1), Some(0), Some(TransportName::Rest)));
    assert_eq!(live.credential.as_deref(), Some("dashboard"));
    assert!(live.duration_ms > 0.0 && live.bytes_read.is_some(), "{live:?}");
    assert_eq!(with_id(&request_ids[1]).source, Some(LogSourceName::Cache));
    assert_eq!(with_id(&request_ids[2]).rows, Some(1));
    assert_eq!(with_id(&request_ids[3]).source, Some(LogSourceName::Live));
    let refused = with_id(&request_ids[4]);
    assert_eq!(
        (refused.status, refused.code.as_deref(), refused.version),
        (400, Some("unknown_variable"), None)
    );
    assert_eq!(with_id(&request_ids[5]).credential, Some(token_id(&token)));
    let over_mcp: Vec<_> = logged.iter().filter(|r| r.transport == Some(TransportName::Mcp)).collect();
    assert_eq!(over_mcp.len(), 1, "{text}");
    assert_eq!((over_mcp[0].status, over_mcp[0].credential.as_deref()), (200, Some("dashboard")));
    let limited_records = logged.iter().filter(|r| r.status == 429).count();
    assert_eq!(limited_records, limited);
    assert!(logged.iter().filter(|r| r.status == 429).all(|r| r.code.as_deref() == Some("rate_limited")));
    // Newest first.
    let times: Vec<_> = logged.iter().map(|r| r.at).collect();
    let mut sorted = times.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(times, sorted);

    // Filters and paging.
    let errors = records(&app, project, &writer, "by-country", "&status=error", 1).await;
    assert_eq!(errors.len(), 1 + limited);
    let page =
        app.get(&format!("{base}/by-country/logs?limit=5"), &writer).await.json::<LogList>().await.unwrap();
    let next = page.next.unwrap();
    let second = app
        .get(&format!("{base}/by-country/logs?limit=5&cursor={next}"), &writer)
        .await
        .json::<LogList>()
        .await
        .unwrap();
    assert_eq!(second.results[0], logged[5]);
    for bad in ["limit=0", "limit=1001", "kind=walk", "status=4xx", "since=yesterday", "cursor=nope"] {
        let response = app.get(&format!("{base}/by-country/logs?{bad}"), &writer).await;
        assert_error(response, 400, "validation_error").await;
    }
    assert_error(app.get(&format!("{base}/missing/logs"), &writer).await, 404, "not_found").await;
    assert_error(app.get(&format!("{base}/by-country/logs"), &token).await, 403, "permission_denied").await;

    // Usage: the runs of the last hour in minutes, errors and cache hits among them.
    let usage = app.get(&format!("{base}/by-country/usage?interval=minute"), &writer).await;
    assert_eq!(usage.status(), 200);
    let usage: Usage = usage.json().await.unwrap();
    let buckets = &usage.buckets;
    // An hour from now back: 60 minutes, and the part of one more where it begins.
    assert!((60..=61).contains(&buckets.len()), "{usage:?}");
    let total = |field: fn(&UsageBucketBody) -> u64| buckets.iter().map(field).sum::<u64>();
    assert_eq!(total(|b| b.requests), runs as u64);
    assert_eq!(total(|b| b.errors), 1 + limited as u64);
    let cache_hits = logged.iter().filter(|r| r.source == Some(LogSourceName::Cache)).count();
    assert_eq!(total(|b| b.cache_hits), cache_hits as u64);
    assert!(buckets.iter().any(|b| b.p99_ms.is_some_and(|p99| p99 >= b.p50_ms.unwrap())));
    assert_error(
        app.get(&format!("{base}/by-country/usage?interval=week"), &writer).await,
        400,
        "validation_error",
    )
    .await;
    // A year of minutes: the newest week of them, and the answer says where they begin.
    let year = app
        .get(&format!("{base}/by-country/usage?interval=minute&since=2025-01-01T00:00:00Z"), &writer)
        .await;
    let year: Usage = year.json().await.unwrap();
    assert_eq!(year.buckets.len(), 7 * 24 * 60, "{}", year.since);
    assert_ne!(year.since, time::macros::datetime!(2025-01-01 00:00 UTC));
    // A range that holds nothing has no bucket; an empty value is refused, as the schema says.
    let empty = app
        .get(
            &format!("{base}/by-country/usage?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z"),
            &writer,
        )
        .await;
    assert!(empty.json::<Usage>().await.unwrap().buckets.is_empty());
    for blank in ["logs?kind=", "logs?until=", "usage?interval=", "usage?since="] {
        assert_error(app.get(&format!("{base}/by-country/{blank}"), &writer).await, 400, "validation_error")
            .await;
    }

    // The refresh of the materialized endpoint.
    let refreshes = records(&app, project, &writer, "kept", "&kind=refresh", 1).await;
    assert_eq!((refreshes[0].status, refreshes[0].rows), (200, Some(5)), "{refreshes:?}");
    assert_eq!(refreshes[0].transport, None);

    // `_logs`: the project's own records in SQL, not among its tables.
    let counted = sql(
        &app,
        project,
        &writer,
        "my-usage",
        "SELECT count(*) AS n FROM _logs WHERE endpoint = 'by-country'",
    )
    .await;
    assert_eq!(counted[0]["n"], runs);
    let tables =
        app.get(&format!("/api/projects/{project}/tables"), &writer).await.json::<Value>().await.unwrap();
    assert!(!tables.to_string().contains("_logs"), "{tables}");
    // Nothing of the secret in the files either (the log's writer may merge files away while they are read).
    let gone = |err: &std::io::Error| err.kind() == std::io::ErrorKind::NotFound;
    let mut files = vec![app.data_dir.join(format!("projects/{project}/logs"))];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            match std::fs::read_dir(&path) {
                Ok(entries) => files.extend(entries.filter_map(Result::ok).map(|entry| entry.path())),
                Err(err) if gone(&err) => {}
                Err(err) => panic!("{}: {err}", path.display()),
            }
        } else {
            match std::fs::read(&path) {
                Ok(bytes) => {
                    assert!(
                        !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                        "{}",
                        path.display()
                    );
                }
                Err(err) if gone(&err) => {}
                Err(err) => panic!("{}: {err}", path.display()),
            }
        }
    }
}

#[tokio::test]
async fn a_project_never_sees_another_projects_records_and_old_ones_are_gone() {
    use domain::Clock as _;
    // The service tells the time by a clock this test moves.
    let clock = Arc::new(domain::testing::ManualClock::new(domain::SystemClock.now()));
    let app = TestApp::builder()
        .tuned(|config| {
            config.run_log = Some(server::RunLogConfig {
                flush_interval: Duration::from_millis(100),
                retention: Duration::from_secs(3),
                ..Default::default()
            });
            config.clock = server::ServiceClock(clock.clone());
        })
        .spawn()
        .await;
    let (first, first_key) = project_with_sales(&app);
    let (second, second_key) = project_with_sales(&app);
    for (project, key) in [(first, &first_key), (second, &second_key)] {
        app.create_endpoint(project, key, &by_country("kpi")).await;
    }
    for _ in 0..3 {
        assert_eq!(
            app.get(&format!("/api/projects/{first}/endpoints/kpi/run"), &first_key).await.status(),
            200
        );
    }
    assert_eq!(
        app.get(&format!("/api/projects/{second}/endpoints/kpi/run"), &second_key).await.status(),
        200
    );
    assert_eq!(records(&app, first, &first_key, "kpi", "", 3).await.len(), 3);
    assert_eq!(records(&app, second, &second_key, "kpi", "", 1).await.len(), 1);
    // Another project's key reads none of them.
    let foreign = app.get(&format!("/api/projects/{first}/endpoints/kpi/logs"), &second_key).await;
    assert_error(foreign, 403, "permission_denied").await;
    let foreign = app.get(&format!("/api/projects/{first}/endpoints/kpi/usage"), &second_key).await;
    assert_error(foreign, 403, "permission_denied").await;
    let theirs = sql(&app, second, &second_key, "all-logs", "SELECT count(*) AS n FROM _logs").await;
    assert_eq!(theirs[0]["n"], 1, "the second project's run of kpi, none of the first's");

    // Past the retention (3 s) by the service's clock, none are read: not by the listing, the usage or `_logs`.
    clock.advance(Duration::from_secs(4));
    assert!(records(&app, first, &first_key, "kpi", "", 0).await.is_empty());
    let usage: Usage = app
        .get(&format!("/api/projects/{first}/endpoints/kpi/usage"), &first_key)
        .await
        .json()
        .await
        .unwrap();
    assert!(usage.buckets.iter().all(|b| b.requests == 0), "{usage:?}");
    let left =
        sql(&app, first, &first_key, "left", "SELECT count(*) AS n FROM _logs WHERE endpoint = 'kpi'").await;
    assert_eq!(left[0]["n"], 0);
}

/// A busy node writes its records as its buffers fill, not only at its interval: with the interval an hour and
/// buffers of 20 records (one per thread that records; eight), a hundred runs fill one past half, and the
/// records taken by then are written at once.
#[tokio::test]
async fn records_are_written_when_a_buffer_is_half_full_whatever_the_interval() {
    let app = TestApp::builder()
        .tuned(|config| {
            config.run_log = Some(server::RunLogConfig {
                flush_interval: Duration::from_secs(3600),
                buffered: 8 * 20,
                ..Default::default()
            });
        })
        .spawn()
        .await;
    let (project, writer) = project_with_sales(&app);
    app.create_endpoint(project, &writer, &by_country("by-country")).await;
    let run = format!("/api/projects/{project}/endpoints/by-country/run");
    for _ in 0..100 {
        assert_eq!(app.get(&run, &writer).await.status(), 200);
    }
    let written = records(&app, project, &writer, "by-country", "", 10).await;
    assert!(written.len() >= 10, "{} records written in ten seconds, the interval an hour", written.len());
}

#[tokio::test]
async fn records_from_every_node_are_read_on_any() {
    let first = TestApp::builder().on_postgres().tuned(quick_log).spawn().await;
    let second = TestApp::builder().node_of(&first).tuned(quick_log).spawn().await;
    let (project, key) = project_with_sales(&first);
    first.create_endpoint(project, &key, &by_country("both")).await;
    let run = format!("/api/projects/{project}/endpoints/both/run?refresh=direct");
    let mut ids = Vec::new();
    for node in [&first, &second, &first, &second] {
        let response = node.get(&run, &key).await;
        assert_eq!(response.status(), 200);
        ids.push(response.headers()["x-request-id"].to_str().unwrap().to_owned());
    }
    for node in [&first, &second] {
        let logged = records(node, project, &key, "both", "", 4).await;
        let mut seen: Vec<_> = logged.iter().map(|r| r.request_id.clone().unwrap()).collect();
        seen.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(seen, expected);
    }
}
