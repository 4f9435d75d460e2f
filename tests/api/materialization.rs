//! Materialization end to end (deleting, the status, materialized runs): eligibility, refreshes by the real worker,
//! answers equal to the live ones, the lifecycle of stored files, two nodes on one PostgreSQL, and a server
//! killed mid-refresh.

use std::path::Path;
use std::time::{Duration, Instant};

use http_actix::api::{Endpoint, RunResult};
use serde_json::{json, Value};
use server::Config;

use crate::helpers::{
    assert_error, project_with_sales, serve_process, Materialization, ServeProcess, TestApp, FAMILIES,
};

/// A worker that looks for due refreshes every 50 ms and holds leases for 3 s.
fn quick_worker(config: &mut Config) {
    config.worker.parallelism = 2;
    config.worker.poll = Duration::from_millis(50);
    config.lease = Duration::from_secs(3);
}

async fn status(app: &TestApp, project: i64, key: &str, name: &str) -> Materialization {
    let response =
        app.get(&format!("/api/projects/{project}/endpoints/{name}/materialization_status"), key).await;
    assert_eq!(response.status(), 200, "materialization_status failed");
    response.json().await.unwrap()
}

/// A time as the API writes it, for comparing with a run's JSON.
fn rfc3339(at: Option<time::OffsetDateTime>) -> Value {
    at.map_or(Value::Null, |at| at.format(&time::format_description::well_known::Rfc3339).unwrap().into())
}

/// Polls the materialization status until the endpoint's `version` reaches `want`.
async fn wait_for(
    app: &TestApp,
    project: i64,
    key: &str,
    name: &str,
    want: &str,
    version: u32,
) -> Materialization {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let current = status(app, project, key, name).await;
        if current.status == want && current.version == version {
            return current;
        }
        assert!(current.status != "Failed", "the refresh failed: {current:?}");
        assert!(Instant::now() < deadline, "{name} never reached {want} (v{version}): {current:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The names of the stored result directories of an endpoint.
fn stored(data_dir: &Path, project: i64, endpoint_id: &str) -> Vec<String> {
    let dir = data_dir.join("projects").join(project.to_string()).join("materializations").join(endpoint_id);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

async fn run(app: &TestApp, project: i64, key: &str, name: &str, body: &Value) -> RunResult {
    let response = app.post(&format!("/api/projects/{project}/endpoints/{name}/run"), key, body).await;
    assert_eq!(response.status(), 200, "run failed");
    response.json().await.unwrap()
}

const BY_COUNTRY: &str = "SELECT country, vip, sum(amount) AS total, count(*) AS orders FROM sales \
                          WHERE country >= {variables.from} AND vip = {variables.vip} \
                          GROUP BY country, vip ORDER BY country";

fn by_country(sql: &str) -> Value {
    json!({"kind": "SQLQuery", "query": sql, "variables": {
        "from": {"type": "String", "default": "A"},
        "vip": {"type": "Boolean", "default": true},
    }})
}

/// Totals per key filtered on columns the query does not output: stored as a rollup.
const TOTALS: &str = "SELECT vip, count(*) AS orders, sum(quantity) AS items, avg(amount) AS mean, \
                      max(country) AS last_country FROM sales \
                      WHERE at >= {variables.since} AND at < {variables.until} AND country != {variables.not} \
                      GROUP BY vip ORDER BY orders DESC, vip";

fn totals() -> Value {
    json!({"kind": "SQLQuery", "query": TOTALS, "variables": {
        "since": {"type": "Date", "default": "2026-01-01"},
        "until": {"type": "Date", "default": "2026-02-01"},
        "not": {"type": "String", "default": "ZZ"},
    }})
}

#[tokio::test]
async fn a_rollup_answers_runs_as_the_live_query_does_and_shows_its_grouping() {
    let app = TestApp::builder().tuned(quick_worker).spawn().await;
    let (project, key) = project_with_sales(&app);
    let query = json!({"kind": "SQLQuery", "query": TOTALS, "variables": {
        "since": {"type": "Date", "default": "2026-01-01"},
        "until": {"type": "Date", "default": "2026-02-01"},
        "not": {"type": "String", "default": "ZZ"},
    }});
    let body = json!({"name": "totals", "is_materialized": true, "cache_age_seconds": 0, "query": query});
    let created = app.create_endpoint(project, &key, &body).await;
    let grouping =
        Some(["sales.vip", "date_trunc('day', sales.at)", "sales.country"].map(String::from).to_vec());
    assert_eq!(created.materialization.grouping, grouping, "{created:?}");
    let done = wait_for(&app, project, &key, "totals", "Completed", 1).await;
    // One stored row per (vip, day, country): the six sales fall on six days.
    assert_eq!((done.row_count, &done.grouping), (Some(6), &grouping));
    let mut compared = 0;
    for (since, until) in [
        ("2026-01-01", "2026-02-01"),
        ("2026-01-02", "2026-01-05"),
        ("2026-01-06", "2026-01-06"),
        ("2026-01-09", "2026-01-02"),
        ("2025-01-01", "2025-02-01"),
        ("2026-01-04", "2026-01-05"),
    ] {
        for not in ["US", "ZZ", "Ünïcødé"] {
            let variables = json!({"since": since, "until": until, "not": not});
            let body = |refresh: &str| json!({"variables": variables, "refresh": refresh});
            let stored = run(&app, project, &key, "totals", &body("blocking")).await;
            let live = run(&app, project, &key, "totals", &body("direct")).await;
            assert_eq!(
                (Some(stored.computed.endpoint_materialized), Some(live.computed.endpoint_materialized)),
                (Some(true), Some(false))
            );
            assert_eq!(
                (&stored.results, &stored.computed.types),
                (&live.results, &live.computed.types),
                "{variables}"
            );
            compared += live.results.as_array().unwrap().len();
        }
    }
    assert!(compared > 10, "the answers compared hold rows ({compared})");
    let first = run(
        &app,
        project,
        &key,
        "totals",
        &json!({"variables": {"since": "2026-01-01", "until": "2026-01-04", "not": "FR"}}),
    )
    .await;
    assert_eq!(
        first.results,
        json!([{"vip": false, "orders": 1, "items": 2, "mean": 20.25, "last_country": "US"},
               {"vip": true, "orders": 1, "items": 1, "mean": 10.5, "last_country": "US"}])
    );
}

#[tokio::test]
async fn materialized_runs_equal_live_runs_and_follow_the_endpoint() {
    let app = TestApp::builder().tuned(quick_worker).spawn().await;
    let (project, key) = project_with_sales(&app);
    let base = format!("/api/projects/{project}/endpoints");

    // Queries the rule refuses, and an inactive endpoint, cannot be materialized.
    let variable = json!({"c": {"type": "String", "default": "US"}});
    for (sql, reason) in [
        ("SELECT country FROM sales WHERE country = {variables.c} LIMIT 2", "LIMIT"),
        (
            "SELECT vip, median(amount) AS n FROM sales WHERE country = {variables.c} GROUP BY vip",
            "`median(sales.amount)` cannot be recombined",
        ),
        ("SELECT id FROM sales WHERE country = {variables.c}", "does not output"),
    ] {
        let body = json!({"name": "bad", "is_materialized": true,
                          "query": {"kind": "SQLQuery", "query": sql, "variables": variable}});
        let error = assert_error(app.post(&base, &key, &body).await, 400, "validation_error").await;
        assert_eq!(error.attr.as_deref(), Some("is_materialized"), "{sql}");
        assert!(error.detail.contains(reason), "{sql}: {error:?}");
    }
    let inactive =
        json!({"name": "off", "is_materialized": true, "is_active": false, "query": by_country(BY_COUNTRY)});
    assert_eq!(
        assert_error(app.post(&base, &key, &inactive).await, 400, "validation_error").await.attr.as_deref(),
        Some("is_materialized")
    );
    // The status says the same without trying.
    let plain = json!({"name": "limited", "query": {"kind": "SQLQuery",
                       "query": "SELECT country FROM sales LIMIT 2"}});
    app.create_endpoint(project, &key, &plain).await;
    let limited = status(&app, project, &key, "limited").await;
    assert_eq!((limited.status.as_ref(), limited.can_materialize), ("Disabled", false));
    assert!(limited.reason.as_deref().is_some_and(|r| r.contains("LIMIT")), "{limited:?}");

    let body = json!({"name": "kpi", "is_materialized": true, "sync_frequency": "5min", "cache_age_seconds": 0,
                      "query": by_country(BY_COUNTRY)});
    let created = app.create_endpoint(project, &key, &body).await;
    let id = created.id.to_string();
    assert!(["Pending", "Running", "Completed"].contains(&created.materialization.status.as_ref()));
    let done = wait_for(&app, project, &key, "kpi", "Completed", 1).await;
    assert_eq!((done.row_count, done.can_materialize), (Some(6), true));
    assert_eq!((&done.error, &done.reason, done.sync_frequency.as_deref()), (&None, &None, Some("5min")));
    assert_eq!(done.next_run_at.unwrap() - done.last_materialized_at.unwrap(), time::Duration::minutes(5));
    for family in FAMILIES {
        let response =
            app.get(&format!("{family}/{project}/endpoints/kpi/materialization_status"), &key).await;
        assert_eq!(response.json::<Materialization>().await.unwrap(), done);
    }
    assert_eq!(app.endpoint(project, &key, "kpi").await.materialization, done);

    // The stored answer, read with the run's variables and window, is the live answer.
    let first = run(&app, project, &key, "kpi", &json!({"variables": {"from": "A", "vip": true}})).await;
    assert!(first.computed.endpoint_materialized, "{first:?}");
    assert_eq!(first.computed.endpoint_materialized_at, done.last_materialized_at);
    assert_eq!(
        first.results,
        json!([{"country": "DE", "vip": true, "total": 100.0, "orders": 1},
               {"country": "FR", "vip": true, "total": 5.0, "orders": 1},
               {"country": "US", "vip": true, "total": 10.5, "orders": 1}])
    );
    for from in ["", "E", "O'Brien", "US", "Z", "Ü"] {
        for vip in [true, false] {
            for (limit, offset) in [(100, 0), (1, 0), (1, 1), (2, 1), (5, 3)] {
                let variables = json!({"from": from, "vip": vip});
                let body = |refresh: &str| json!({"variables": variables, "limit": limit, "offset": offset, "refresh": refresh});
                let stored = run(&app, project, &key, "kpi", &body("blocking")).await;
                let live = run(&app, project, &key, "kpi", &body("direct")).await;
                assert_eq!(
                    (Some(stored.computed.endpoint_materialized), Some(live.computed.endpoint_materialized)),
                    (Some(true), Some(false))
                );
                assert_eq!(stored.results, live.results, "{variables} limit {limit} offset {offset}");
                assert_eq!(
                    stored.computed.has_more, live.computed.has_more,
                    "{variables} limit {limit} offset {offset}"
                );
                assert_eq!(stored.computed.types, live.computed.types);
            }
        }
    }
    let forced = run(&app, project, &key, "kpi", &json!({"refresh": "force_cache"})).await;
    assert_eq!(
        (Some(forced.computed.endpoint_materialized), forced.results.clone()),
        (Some(true), first.results.clone())
    );
    let fresh = run(&app, project, &key, "kpi", &json!({"refresh": "force_blocking"})).await;
    assert!(!fresh.computed.endpoint_materialized);

    // A page in another format is read from the stored result in the same modes, says so in its headers, and
    // equals the live page; with force_cache and nothing stored it is a page of no rows.
    let export = |name: &'static str, refresh: &'static str| {
        let variables = if name == "kpi" { json!({"from": "A", "vip": true}) } else { json!({}) };
        let body = json!({"format": "csv", "refresh": refresh, "variables": variables});
        let uri = format!("{base}/{name}/run");
        let (app, key) = (&app, &key);
        async move { app.post(&uri, key, &body).await }
    };
    let header = |response: &reqwest::Response, name: &str| {
        response.headers().get(name).map(|v| v.to_str().unwrap().to_owned())
    };
    let from_stored = export("kpi", "blocking").await;
    assert_eq!(from_stored.status(), 200);
    assert_eq!(header(&from_stored, "x-endpoint-materialized").as_deref(), Some("true"));
    assert_eq!(
        header(&from_stored, "x-endpoint-materialized-at"),
        rfc3339(done.last_materialized_at).as_str().map(str::to_owned)
    );
    let live = export("kpi", "direct").await;
    assert_eq!(header(&live, "x-endpoint-materialized").as_deref(), Some("false"));
    assert_eq!(header(&live, "x-endpoint-materialized-at"), None);
    let (from_stored, live) = (from_stored.text().await.unwrap(), live.text().await.unwrap());
    assert_eq!(from_stored, "country,vip,total,orders\nDE,true,100.0,1\nFR,true,5.0,1\nUS,true,10.5,1\n");
    assert_eq!(from_stored, live);
    let nothing = export("limited", "force_cache").await;
    assert_eq!(nothing.status(), 200, "limited is not materialized");
    assert_eq!(header(&nothing, "x-endpoint-version").as_deref(), Some("1"));
    assert_eq!(header(&nothing, "x-endpoint-materialized").as_deref(), Some("false"));
    assert_eq!(header(&nothing, "x-data-as-of"), None);
    assert_eq!(nothing.text().await.unwrap(), "country\n", "a page of no rows has the columns");

    // A new query makes version 2 Pending; its result replaces version 1's files once complete.
    let v2 = BY_COUNTRY.replace("count(*) AS orders", "count(*) AS orders, max(quantity) AS most");
    let patched = app.update_endpoint(project, &key, "kpi", &json!({"query": by_country(&v2)})).await;
    let materialization = patched.materialization;
    assert_eq!(materialization.version, 2);
    assert!(["Pending", "Running"].contains(&materialization.status.as_ref()), "{materialization:?}");
    assert_eq!(materialization.last_materialized_at, None, "version 1's result is not version 2's");
    wait_for(&app, project, &key, "kpi", "Completed", 2).await;
    // The record switches to version 2's result first (runs read it from then on); version 1's files are
    // removed right after.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut files = stored(&app.data_dir, project, &id);
    while files.len() != 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        files = stored(&app.data_dir, project, &id);
    }
    assert!(files.len() == 1 && files[0].starts_with("v2-"), "{files:?}");
    let v2_run = run(&app, project, &key, "kpi", &json!({"variables": {"from": "A", "vip": true}})).await;
    assert_eq!(
        (Some(v2_run.computed.endpoint_materialized), v2_run.results[0]["most"].as_i64()),
        (Some(true), Some(5))
    );

    // Deactivating a materialized endpoint is refused; turning materialization off removes files and status.
    let refused = app.patch(&format!("{base}/kpi"), &key, &json!({"is_active": false})).await;
    assert_eq!(assert_error(refused, 400, "validation_error").await.attr.as_deref(), Some("is_materialized"));
    let off = app.update_endpoint(project, &key, "kpi", &json!({"is_materialized": false})).await;
    assert_eq!((off.materialization.status.as_ref(), off.sync_frequency), ("Disabled", None));
    assert!(stored(&app.data_dir, project, &id).is_empty());
    let live = run(&app, project, &key, "kpi", &json!({"variables": {"from": "A", "vip": true}})).await;
    assert!(!live.computed.endpoint_materialized);

    // On again, then deleted: nothing of it remains readable.
    app.patch(&format!("{base}/kpi"), &key, &json!({"is_materialized": true})).await;
    wait_for(&app, project, &key, "kpi", "Completed", 2).await;
    assert_eq!(stored(&app.data_dir, project, &id).len(), 1);
    assert_eq!(app.delete(&format!("{base}/kpi"), &key).await.status(), 204);
    assert!(stored(&app.data_dir, project, &id).is_empty());
    for family in FAMILIES {
        let gone = app.get(&format!("{family}/{project}/endpoints/kpi/materialization_status"), &key).await;
        assert_error(gone, 404, "not_found").await;
    }
}

#[tokio::test]
async fn a_failing_refresh_reports_why_and_is_retried_later() {
    let app = TestApp::builder().tuned(quick_worker).spawn().await;
    let (project, key) = project_with_sales(&app);
    let body = json!({"name": "broken", "is_materialized": true, "sync_frequency": "30min",
                      "query": {"kind": "SQLQuery", "query": "SELECT CAST(country AS INT) AS n FROM sales"}});
    let id = app.create_endpoint(project, &key, &body).await.id.to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let failed = loop {
        let current = status(&app, project, &key, "broken").await;
        if current.status == "Failed" {
            break current;
        }
        assert!(Instant::now() < deadline, "the refresh never failed: {current:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let error = failed.error.as_deref().unwrap();
    assert!(error.contains("Cast") || error.contains("cast"), "{error}");
    assert!(!error.contains(&app.data_dir.display().to_string()), "no file paths: {error}");
    assert_eq!((failed.row_count, failed.last_materialized_at), (None, None));
    let retry = failed.next_run_at.unwrap();
    let in_five_minutes = time::OffsetDateTime::now_utc() + time::Duration::minutes(5);
    assert!(
        (retry - in_five_minutes).abs() < time::Duration::seconds(30),
        "retried in five minutes: {retry}"
    );
    assert!(stored(&app.data_dir, project, &id).is_empty(), "a failed attempt leaves no files");
}

/// A refresh that would run for hours.
const ENDLESS: &str =
    "SELECT t.v % 7 AS k, count(*) AS n FROM generate_series(1, 50000000000) AS t(v) GROUP BY k";

/// Creates the materialized endpoint `endless` and waits until its refresh is running; returns its id. Nothing
/// of a running refresh is visible in the storage: its result appears whole when written, or never.
async fn start_endless(app: &TestApp, project: i64, key: &str) -> String {
    let body =
        json!({"name": "endless", "is_materialized": true, "query": {"kind": "SQLQuery", "query": ENDLESS}});
    let id = app.create_endpoint(project, key, &body).await.id.to_string();
    wait_for(app, project, key, "endless", "Running", 1).await;
    id
}

/// Waits until the app's metrics show `series` at `want` or more.
async fn wait_for_metric(app: &TestApp, series: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = crate::operations::metrics(app).await;
        if crate::operations::sample(&text, series).is_some_and(|value| value >= want) {
            return;
        }
        assert!(Instant::now() < deadline, "{series} never reached {want}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_refresh_running_when_its_endpoint_is_deleted_leaves_no_files() {
    let app = TestApp::builder().tuned(quick_worker).spawn().await;
    let (project, key) = app.project_with_key();
    let id = start_endless(&app, project, &key).await;
    assert_eq!(app.delete(&format!("/api/projects/{project}/endpoints/endless"), &key).await.status(), 204);
    // The worker learns at its next lease renewal that the claim is gone, stops, and removes what it wrote.
    wait_for_metric(&app, "endpoints_materialization_refreshes_total{outcome=\"released\"}", 1.0).await;
    assert!(stored(&app.data_dir, project, &id).is_empty(), "files left behind");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(stored(&app.data_dir, project, &id).is_empty(), "the refresh wrote again after the delete");
}

#[tokio::test]
async fn a_graceful_stop_gives_running_refreshes_back_at_once() {
    // A lease far longer than the test: only a claim given back can be taken again in time.
    let long_lease = |config: &mut Config| {
        quick_worker(config);
        config.lease = Duration::from_secs(600);
    };
    let app = TestApp::builder().tuned(long_lease).spawn().await;
    let (project, key) = app.project_with_key();
    let id = start_endless(&app, project, &key).await;
    let data_dir = app.data_dir.clone();
    app.stop().await.unwrap();
    assert!(stored(&data_dir, project, &id).is_empty(), "the stopped refresh removed what it wrote");

    // Claimed again by the new process within seconds, although the old lease had ten minutes to run.
    let again = TestApp::builder().over(data_dir.clone()).tuned(long_lease).spawn().await;
    wait_for_metric(&again, "endpoints_materialization_lag_seconds_count", 1.0).await;
    assert_eq!(status(&again, project, &key, "endless").await.status, "Running");
}

#[tokio::test]
async fn two_nodes_on_one_postgres_refresh_each_materialization_once() {
    let first = TestApp::builder().on_postgres().tuned(quick_worker).spawn().await;
    let second = TestApp::builder().node_of(&first).tuned(quick_worker).spawn().await;
    let (project, key) = project_with_sales(&first);
    let mut ids = Vec::new();
    for i in 0..6 {
        let body = json!({"name": format!("kpi{i}"), "is_materialized": true, "sync_frequency": "5min",
                          "query": by_country(BY_COUNTRY)});
        ids.push(first.create_endpoint(project, &key, &body).await.id.to_string());
    }
    let mut completed = Vec::new();
    for i in 0..6 {
        completed.push(wait_for(&second, project, &key, &format!("kpi{i}"), "Completed", 1).await);
    }
    // Both workers keep looking for due refreshes; none is due again for five minutes, so nothing changes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (i, done) in completed.iter().enumerate() {
        assert_eq!(&status(&first, project, &key, &format!("kpi{i}")).await, done);
        assert_eq!(stored(&first.data_dir, project, &ids[i]).len(), 1, "one stored result per endpoint");
    }
    let answer = run(&second, project, &key, "kpi3", &json!({"variables": {"from": "F"}})).await;
    assert_eq!(
        (Some(answer.computed.endpoint_materialized), answer.results[0]["country"].as_str()),
        (Some(true), Some("FR"))
    );
    drop(second);
}

/// A real `endpoints serve` process with a worker that polls every 50 ms and holds leases for 3 s.
async fn serve(data_dir: &Path) -> ServeProcess {
    serve_process(
        data_dir,
        &["--workers", "1", "--materialize-poll-ms", "50", "--materialize-lease-secs", "3"],
    )
    .await
}

async fn server_status(server: &ServeProcess, project: i64, key: &str) -> Materialization {
    reqwest::Client::new()
        .get(format!("{}/api/projects/{project}/endpoints/slow/materialization_status", server.address))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_refresh_killed_mid_way_is_retried_after_its_lease() {
    let app = TestApp::builder().tuned(|config| config.worker.parallelism = 0).spawn().await;
    let (project, key) = app.project_with_key();
    // A few seconds of work: long enough to be killed during, short enough to finish on the retry.
    let slow =
        "SELECT t.v % 7 AS k, count(*) AS n FROM generate_series(1, 30000000) AS t(v) GROUP BY k ORDER BY k";
    let body = json!({"name": "slow", "is_materialized": true, "query": {"kind": "SQLQuery", "query": slow}});
    let id = app.create_endpoint(project, &key, &body).await.id.to_string();
    let data_dir = crate::helpers::DataDir(app.data_dir.clone());
    app.stop().await.unwrap();

    let doomed = serve(&data_dir).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while server_status(&doomed, project, &key).await.status != "Running" {
        assert!(Instant::now() < deadline, "the refresh never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(doomed); // SIGKILL: no chance to give the claim back.

    let restarted = serve(&data_dir).await;
    assert_eq!(
        server_status(&restarted, project, &key).await.status,
        "Running",
        "the dead lease still holds"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let current = server_status(&restarted, project, &key).await;
        if current.status == "Completed" {
            break current;
        }
        assert!(current.status != "Failed", "{current:?}");
        assert!(Instant::now() < deadline, "the refresh was never retried: {current:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done.row_count, Some(7));
    let files = stored(&data_dir, project, &id);
    assert_eq!(files.len(), 1, "only the retry's result is stored: {files:?}");
    drop(restarted);
}

/// Appends `csv` (with the header of `sales`) to the project's `sales` table.
async fn append_sales(app: &TestApp, project: i64, key: &str, csv: &str) {
    let response = app
        .request(reqwest::Method::POST, &format!("/api/projects/{project}/tables/sales/rows"), Some(key))
        .header("Content-Type", "text/csv")
        .body(format!("id,country,amount,quantity,day,at,vip\n{csv}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
}

/// The answer of a run and its `X-Data-As-Of` header.
async fn run_with_as_of(
    app: &TestApp,
    project: i64,
    key: &str,
    name: &str,
    body: &Value,
) -> (RunResult, String) {
    let response = app.post(&format!("/api/projects/{project}/endpoints/{name}/run"), key, body).await;
    assert_eq!(response.status(), 200, "run failed");
    let header = response.headers()["x-data-as-of"].to_str().unwrap().to_owned();
    (response.json().await.unwrap(), header)
}

#[tokio::test]
async fn appended_rows_reach_stored_results_within_their_freshness() {
    let app = TestApp::builder().tuned(quick_worker).spawn().await;
    let (project, key) = project_with_sales(&app);
    let (_, writer) = app.create_key(project, &["table:write"]);
    // freshness_seconds is validated, defaults to 60 and changes with a PATCH.
    for bad in [json!(0), json!(86_401), json!("5"), json!(1.5)] {
        let body = json!({"name": "bad", "freshness_seconds": bad, "query": by_country(BY_COUNTRY)});
        let response = app.post(&format!("/api/projects/{project}/endpoints"), &key, &body).await;
        assert_eq!(
            assert_error(response, 400, "validation_error").await.attr.as_deref(),
            Some("freshness_seconds"),
            "{bad}"
        );
    }
    let plain = json!({"name": "plain", "query": {"kind": "SQLQuery", "query": "SELECT 1 AS n"}});
    assert_eq!(app.create_endpoint(project, &key, &plain).await.freshness_seconds, 60);
    // A DISTINCT count stores the values it counts, so that appended rows fold in; an aggregate no rollup
    // recombines is stored as its final rows, computed again after each append.
    let on_vip = |sql: &str| json!({"kind": "SQLQuery", "variables": {"vip": {"type": "Boolean", "default": true}}, "query": sql});
    let countries = on_vip(
        "SELECT vip, count(DISTINCT country) AS countries, sum(amount) AS total FROM sales \
         WHERE vip = {variables.vip} GROUP BY vip",
    );
    let typical =
        on_vip("SELECT vip, median(amount) AS typical FROM sales WHERE vip = {variables.vip} GROUP BY vip");
    // Rows in an ORDER BY of what they return: each stored part in that order, a run merges them.
    let ordered = on_vip(
        "SELECT id, country, amount, vip FROM sales WHERE vip = {variables.vip} ORDER BY amount DESC, id, country",
    );
    // A DISTINCT's rows: an appended row that repeats a stored one is read once.
    let distinct =
        on_vip("SELECT DISTINCT country, vip FROM sales WHERE vip = {variables.vip} ORDER BY country, vip");
    for (name, sql) in [
        ("by_country", by_country(BY_COUNTRY)),
        ("totals", totals()),
        ("countries", countries),
        ("typical", typical),
        ("ordered", ordered),
        ("distinct", distinct),
    ] {
        let body = json!({"name": name, "is_materialized": true, "freshness_seconds": 1, "query": sql});
        assert_eq!(app.create_endpoint(project, &key, &body).await.freshness_seconds, 1);
    }
    let patched = app
        .patch(&format!("/api/projects/{project}/endpoints/plain"), &key, &json!({"freshness_seconds": 3}))
        .await;
    assert_eq!(patched.json::<Endpoint>().await.unwrap().freshness_seconds, 3);
    let variables = [
        ("by_country", json!({"from": "A", "vip": true})),
        ("totals", json!({"since": "2026-01-01", "until": "2027-01-01", "not": "XX"})),
        ("countries", json!({"vip": true})),
        ("typical", json!({"vip": true})),
        ("ordered", json!({"vip": true})),
        ("distinct", json!({"vip": true})),
    ];
    for (name, _) in &variables {
        let done = wait_for(&app, project, &key, name, "Completed", 1).await;
        assert_eq!((done.full_refreshes, done.appended_since), (1, None));
        // The status says how appended rows will reach it, and why not folded when they are not.
        let incremental = *name != "typical";
        assert_eq!(done.fold.as_deref(), Some(if incremental { "incremental" } else { "full_refresh_only" }));
        let reason = done.fold_reason.as_deref().unwrap_or("");
        assert_eq!(reason.contains("`median(sales.amount)` cannot be recombined"), !incremental, "{done:?}");
    }

    for round in 0..3 {
        let appended_at = Instant::now();
        let id = 100 + round;
        append_sales(
            &app,
            project,
            &writer,
            &format!("{id},US,1000,{id},2026-02-01,2026-02-01T10:00:00,true\n"),
        )
        .await;
        let pending = status(&app, project, &key, "by_country").await;
        assert!(pending.appended_since.is_some(), "{pending:?}");
        for (name, vars) in &variables {
            let live = run(&app, project, &key, name, &json!({"variables": vars, "refresh": "direct"})).await;
            // Within freshness_seconds (1) and a second of work, a blocking run is answered from a stored result
            // that has the appended row, equal to the live answer.
            let (stored, as_of) = loop {
                let body = json!({"variables": vars});
                let (answer, header) = run_with_as_of(&app, project, &key, name, &body).await;
                if answer.computed.endpoint_materialized && answer.results == live.results {
                    break (answer, header);
                }
                assert!(
                    appended_at.elapsed() < Duration::from_secs(2),
                    "{name}: round {round} not fresh after 2 s: {answer:?} vs {live:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let as_of =
                time::OffsetDateTime::parse(&as_of, &time::format_description::well_known::Rfc3339).unwrap();
            assert_eq!(stored.computed.data_as_of, Some(as_of), "the header says what the body does");
            let materialized_at = stored.computed.endpoint_materialized_at.unwrap();
            assert!(as_of <= materialized_at, "data as of when its refresh began reading: {stored:?}");
        }
    }
    // Both aggregations take the appended rows in, the one filtered on its group keys (a rollup of its keys) as
    // the one filtered on other columns.
    let done = status(&app, project, &key, "by_country").await;
    assert_eq!((done.full_refreshes, done.rows_folded), (1, 3), "{done:?}");
    assert_eq!(done.grouping, Some(vec!["sales.country".to_owned(), "sales.vip".to_owned()]), "{done:?}");
    let done = status(&app, project, &key, "totals").await;
    assert_eq!((done.full_refreshes, done.rows_folded), (1, 3), "{done:?}");
    assert!(done.last_folded_at.is_some(), "{done:?}");
    let done = status(&app, project, &key, "countries").await;
    assert_eq!((done.full_refreshes, done.rows_folded), (1, 3), "{done:?}");
    assert_eq!(done.grouping, Some(vec!["sales.vip".to_owned(), "sales.country".to_owned()]), "{done:?}");
    for name in ["ordered", "distinct"] {
        let done = status(&app, project, &key, name).await;
        assert_eq!((done.full_refreshes, done.rows_folded), (1, 3), "{name}: {done:?}");
    }
    // Final rows followed each append by a full refresh.
    let done = status(&app, project, &key, "typical").await;
    assert_eq!((done.full_refreshes, done.rows_folded, done.last_folded_at), (4, 0, None), "{done:?}");

    // A run that takes no data older than 0 seconds is computed live, and says so.
    let (bounded, _) = run_with_as_of(
        &app,
        project,
        &key,
        "by_country",
        &json!({"variables": variables[0].1, "max_staleness_seconds": 0}),
    )
    .await;
    assert_eq!(
        (Some(bounded.computed.endpoint_materialized), Some(bounded.request.is_cached)),
        (Some(false), Some(false))
    );
    let path = format!("/api/projects/{project}/endpoints/by_country/run?max_staleness_seconds=-1");
    let refused = assert_error(app.get(&path, &key).await, 400, "validation_error").await;
    assert_eq!(refused.attr.as_deref(), Some("max_staleness_seconds"));
    let csv = app
        .get(
            &format!("/api/projects/{project}/endpoints/by_country/run?format=csv&max_staleness_seconds=0"),
            &key,
        )
        .await;
    assert_eq!(csv.status(), 200);
    assert_eq!(csv.headers()["x-endpoint-materialized"], "false");
    assert!(csv.headers().contains_key("x-data-as-of"));
}

/// Polls the materialization status until `done` holds of it.
async fn wait_until(
    app: &TestApp,
    project: i64,
    key: &str,
    name: &str,
    done: impl Fn(&Materialization) -> bool,
) -> Materialization {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let current = status(app, project, key, name).await;
        if done(&current) {
            return current;
        }
        assert!(Instant::now() < deadline, "{name} never got there: {current:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A materialized endpoint nobody runs for its `hibernate_after_days` is neither refreshed nor folded (status
/// `Hibernating`, since when); its next run answers live and wakes it, and what was appended meanwhile reaches
/// its stored result. The days pass on the service's clock, which the test moves.
#[tokio::test]
async fn an_unused_materialization_hibernates_and_its_next_run_wakes_it() {
    use domain::Clock as _;
    let clock = std::sync::Arc::new(domain::testing::ManualClock::new(domain::SystemClock.now()));
    let app = TestApp::builder()
        .tuned(|config| {
            quick_worker(config);
            config.flush_interval = Duration::from_millis(50);
            config.clock = server::ServiceClock(clock.clone());
        })
        .spawn()
        .await;
    let (project, key) = project_with_sales(&app);
    let (_, writer) = app.create_key(project, &["table:write"]);
    for bad in [json!(0), json!(3651), json!("7"), json!(1.5)] {
        let body = json!({"name": "bad", "hibernate_after_days": bad, "query": totals()});
        let response = app.post(&format!("/api/projects/{project}/endpoints"), &key, &body).await;
        let refused = assert_error(response, 400, "validation_error").await;
        assert_eq!(refused.attr.as_deref(), Some("hibernate_after_days"), "{bad}");
    }
    let plain = json!({"name": "plain", "query": {"kind": "SQLQuery", "query": "SELECT 1 AS n"}});
    assert_eq!(app.create_endpoint(project, &key, &plain).await.hibernate_after_days, Some(7), "the default");
    let mut created = Vec::new();
    for (name, days) in [("sleepy", Some(2)), ("awake", None)] {
        let body = json!({"name": name, "is_materialized": true, "freshness_seconds": 1,
                          "hibernate_after_days": days, "query": totals()});
        let endpoint = app.create_endpoint(project, &key, &body).await;
        assert_eq!(endpoint.hibernate_after_days, days);
        created.push(endpoint);
    }
    for name in ["sleepy", "awake"] {
        assert_eq!(wait_for(&app, project, &key, name, "Completed", 1).await.hibernated_at, None);
    }

    clock.advance(Duration::from_secs(3 * 86_400));
    let later = Some(clock.now());
    let asleep = status(&app, project, &key, "sleepy").await;
    let since = created[0].updated_at + Duration::from_secs(2 * 86_400);
    assert_eq!(
        (&*asleep.status, asleep.hibernated_at, asleep.next_run_at),
        ("Hibernating", Some(since), None)
    );
    let record = app.endpoint(project, &key, "sleepy").await;
    assert_eq!(record.materialization.status, "Hibernating");
    // Both are past their daily refresh: the one awake is refreshed (a rollup with nothing appended, by a fold
    // of no rows), the one asleep is not (one worker pass claims both when both are due).
    let refreshed = wait_until(&app, project, &key, "awake", |m| m.last_materialized_at >= later).await;
    assert_eq!((&*refreshed.status, refreshed.hibernated_at), ("Completed", None));
    let still = status(&app, project, &key, "sleepy").await;
    assert_eq!((&*still.status, still.full_refreshes), ("Hibernating", 1));
    assert!(still.last_materialized_at < later, "{still:?}");

    // A row appended now, past both freshnesses: the one awake takes it in, the one asleep does not.
    append_sales(&app, project, &writer, "900,US,1000,9,2026-01-05,2026-01-05T10:00:00,true\n").await;
    clock.advance(Duration::from_secs(2));
    wait_until(&app, project, &key, "awake", |m| m.rows_folded == 1).await;
    let still = status(&app, project, &key, "sleepy").await;
    assert_eq!((&*still.status, still.full_refreshes, still.rows_folded), ("Hibernating", 1, 0));

    // Its next run answers live, with the appended row, and wakes it: the row then reaches its stored result.
    let vars = json!({"since": "2026-01-01", "until": "2027-01-01", "not": "XX"});
    let live = run(&app, project, &key, "sleepy", &json!({"variables": vars, "refresh": "direct"})).await;
    let first = run(&app, project, &key, "sleepy", &json!({"variables": vars})).await;
    assert_eq!((Some(first.computed.endpoint_materialized), &first.results), (Some(false), &live.results));
    let woken =
        wait_until(&app, project, &key, "sleepy", |m| m.status == "Completed" && m.rows_folded == 1).await;
    assert_eq!(woken.hibernated_at, None, "{woken:?}");
    // Other variables than the run cached: read from the stored result, equal to the live answer.
    let vars = json!({"since": "2026-01-01", "until": "2027-01-01", "not": "YY"});
    let live = run(&app, project, &key, "sleepy", &json!({"variables": vars, "refresh": "direct"})).await;
    let stored = run(&app, project, &key, "sleepy", &json!({"variables": vars})).await;
    assert_eq!((Some(stored.computed.endpoint_materialized), &stored.results), (Some(true), &live.results));
}
