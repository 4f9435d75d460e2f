//! Runs (GET and POST) and last execution times over a dataset the test writes, with aggregates known in advance.

use domain::ColumnType;
use http_actix::api::{Endpoint, LastExecutionTimes, RunResult, RunStatistics};
use serde_json::{json, Value};

use crate::helpers::{
    assert_error, assert_error_quoting, endpoint_body, project_with_sales, spawn_app, TestApp, FAMILIES,
};

async fn run_get(app: &TestApp, project: i64, key: &str, name: &str, query: &str) -> reqwest::Response {
    app.get(&format!("/api/projects/{project}/endpoints/{name}/run?{query}"), key).await
}

async fn ok_json(response: reqwest::Response) -> Value {
    assert_eq!(response.status(), 200, "run failed");
    response.json().await.unwrap()
}

/// A run's answer (asserting 200), as the API's type of it.
async fn answered(response: reqwest::Response) -> RunResult {
    let body = ok_json(response).await;
    serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn runs_answer_real_numbers_under_both_families() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let body = endpoint_body(
        "by-country",
        "SELECT country, sum(amount) AS total, count(*) AS n FROM sales GROUP BY country ORDER BY total DESC",
    );
    let created = app.create_endpoint(project, &key, &body).await;
    let columns: Vec<(String, ColumnType)> =
        created.columns.unwrap().into_iter().map(|c| (c.name, c.column_type)).collect();
    let expected =
        [("country", ColumnType::String), ("total", ColumnType::Float), ("n", ColumnType::Integer)];
    assert_eq!(columns, expected.map(|(name, t)| (name.to_owned(), t)));
    for family in FAMILIES {
        for (method, slash) in [(reqwest::Method::GET, ""), (reqwest::Method::POST, "/")] {
            let path = format!("{family}/{project}/endpoints/by-country/run{slash}");
            let response =
                app.request(method.clone(), &path, Some(&key)).json(&json!({})).send().await.unwrap();
            let run = answered(response).await;
            assert_eq!(run.results[0], json!({"country": "DE", "total": 100.0, "n": 1}), "{method} {path}");
            assert_eq!(run.results[1], json!({"country": "US", "total": 30.75, "n": 2}));
            assert_eq!(run.results.as_array().unwrap().len(), 5);
            assert_eq!(run.computed.columns, ["country", "total", "n"]);
            let types: Vec<(&str, ColumnType)> =
                run.computed.types.iter().map(|(name, t)| (name.as_ref(), *t)).collect();
            assert_eq!(types, expected);
            assert_eq!((run.request.name.as_ref(), run.computed.endpoint_version), ("by-country", Some(1)));
            assert!(!run.computed.has_more);
            assert!(run.request.timings.total_ms > 0.0);
        }
    }
}

#[tokio::test]
async fn every_variable_type_binds_from_json_and_from_query_strings() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let body = json!({"name": "filtered", "query": {"kind": "SQLQuery",
        "query": "SELECT count(*) AS n, sum(amount) AS total FROM sales WHERE country IN {variables.countries} \
                  AND amount >= {variables.min_amount} AND quantity <= {variables.max_qty} AND vip = {variables.vip} \
                  AND day >= {variables.from_day} AND at < {variables.before} AND country <> {variables.not_country}",
        "variables": {
            "countries": {"type": "List", "default": ["US", "FR", "DE"]},
            "min_amount": {"type": "Number", "default": 5},
            "max_qty": {"type": "Integer", "default": 5},
            "vip": {"type": "Boolean", "default": true},
            "from_day": {"type": "Date", "default": "2026-01-01"},
            "before": {"type": "DateTime", "default": "2026-01-05T12:00:00Z"},
            "not_country": {"type": "String", "default": "XX"}}}});
    app.create_endpoint(project, &key, &body).await;

    let defaults = answered(run_get(&app, project, &key, "filtered", "").await).await;
    assert_eq!(defaults.results, json!([{"n": 2, "total": 15.5}]), "rows 1 and 3");

    let query = "variables.countries=US,DE&variables.min_amount=10.5&variables.max_qty=5&variables.vip=true\
                 &variables.from_day=2026-01-01&variables.before=2026-01-06T00:00:00Z&variables.not_country=US";
    let from_query = answered(run_get(&app, project, &key, "filtered", query).await).await;
    assert_eq!(from_query.results, json!([{"n": 1, "total": 100.0}]), "only DE");

    let post = app
        .post(
            &format!("/api/projects/{project}/endpoints/filtered/run"),
            &key,
            &json!({"variables": {"countries": ["US"], "vip": false, "min_amount": 0, "before": "2027-01-01T00:00:00+02:00"}}),
        )
        .await;
    assert_eq!(answered(post).await.results, json!([{"n": 1, "total": 20.25}]), "row 2");

    for (query, attr) in [
        ("variables.nope=1", "variables.nope"),
        ("variables.max_qty=lots", "variables.max_qty"),
        ("variables.from_day=2026-13-01", "variables.from_day"),
        ("variables.vip=maybe", "variables.vip"),
        ("refresh=async", "refresh"),
        ("limit=10001", "limit"),
    ] {
        let error =
            assert_error(run_get(&app, project, &key, "filtered", query).await, 400, "validation_error")
                .await;
        assert_eq!(error.attr.as_deref(), Some(attr), "{query}");
    }
    let required = json!({"name": "needs-x", "query": {"kind": "SQLQuery", "query": "SELECT {variables.x} AS x",
        "variables": {"x": {"type": "Integer"}}}});
    app.create_endpoint(project, &key, &required).await;
    let error =
        assert_error(run_get(&app, project, &key, "needs-x", "").await, 400, "validation_error").await;
    assert_eq!((Some(error.code.as_str()), error.attr.as_deref()), (Some("required"), Some("variables.x")));
}

#[tokio::test]
async fn injection_attempts_compare_as_literals() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let body = json!({"name": "by-name", "query": {"kind": "SQLQuery",
        "query": "SELECT id FROM sales WHERE country = {variables.c} ORDER BY id",
        "variables": {"c": {"type": "String"}}}});
    app.create_endpoint(project, &key, &body).await;
    let path = format!("/api/projects/{project}/endpoints/by-name/run");
    for (value, ids) in [
        ("O'Brien", json!([{"id": 4}])),
        ("Ünïcødé", json!([{"id": 6}])),
        ("' OR '1'='1", json!([])),
        ("US' OR 1=1 --", json!([])),
        ("US'; DROP TABLE sales; --", json!([])),
        ("US /* comment */", json!([])),
        ("{variables.c}", json!([])),
        ("US\u{0000}", json!([])),
    ] {
        let run =
            answered(app.post(&path, &key, &json!({"variables": {"c": value}, "refresh": "direct"})).await)
                .await;
        assert_eq!(run.results, ids, "{value:?}");
    }
    // The table is intact.
    let us = answered(app.post(&path, &key, &json!({"variables": {"c": "US"}})).await).await;
    assert_eq!(us.results, json!([{"id": 1}, {"id": 2}]));
}

#[tokio::test]
async fn a_project_cannot_read_another_projects_tables() {
    let app = spawn_app().await;
    project_with_sales(&app);
    let (other, other_key) = app.project_with_key();
    let response = app
        .post(
            &format!("/api/projects/{other}/endpoints"),
            &other_key,
            &endpoint_body("steal", "SELECT * FROM sales"),
        )
        .await;
    let error = assert_error(response, 400, "validation_error").await;
    assert_eq!(error.attr.as_deref(), Some("query"));
    assert!(error.detail.contains("sales"), "{error:?}");
}

#[tokio::test]
async fn pages_cache_and_invalidation() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    app.create_endpoint(project, &key, &endpoint_body("ids", "SELECT id FROM sales ORDER BY id")).await;

    let page = answered(run_get(&app, project, &key, "ids", "limit=2&offset=2").await).await;
    assert_eq!((&page.results, page.computed.has_more), (&json!([{"id": 3}, {"id": 4}]), true));
    assert_eq!((page.request.limit, page.request.offset), (2, 2));
    let last = answered(run_get(&app, project, &key, "ids", "limit=5&offset=4").await).await;
    assert_eq!((&last.results, last.computed.has_more), (&json!([{"id": 5}, {"id": 6}]), false));

    let first = answered(run_get(&app, project, &key, "ids", "limit=3").await).await;
    let second = answered(run_get(&app, project, &key, "ids", "limit=3").await).await;
    assert_eq!((first.request.is_cached, second.request.is_cached), (false, true));
    assert_eq!(first.results, second.results);
    assert_eq!(first.computed.last_refresh, second.computed.last_refresh);
    assert!(second.computed.cache_expires_at.is_some());
    // The engine's figures of the computation, the same on the cache hit that reuses it.
    let statistics = &first.computed.statistics;
    assert_eq!(statistics.rows_read, Some(6), "{statistics:?}");
    assert!(statistics.bytes_read.unwrap() > 0 && statistics.elapsed_ms > 0.0, "{statistics:?}");
    assert_eq!(second.computed.statistics, first.computed.statistics);

    let forced = answered(run_get(&app, project, &key, "ids", "limit=3&refresh=force_blocking").await).await;
    assert!(!forced.request.is_cached);
    let direct = answered(run_get(&app, project, &key, "ids", "limit=3&refresh=direct").await).await;
    assert_eq!((direct.request.is_cached, direct.computed.cache_expires_at), (false, None));
    let cached_only =
        answered(run_get(&app, project, &key, "ids", "limit=4&refresh=force_cache").await).await;
    assert_eq!((cached_only.results.is_null(), cached_only.request.is_cached), (true, false));
    let nothing = RunStatistics { rows_read: Some(0), bytes_read: Some(0), elapsed_ms: 0.0 };
    assert_eq!(cached_only.computed.statistics, nothing);

    // An update of the endpoint makes its cached runs unreachable at once.
    app.patch(&format!("/api/projects/{project}/endpoints/ids"), &key, &json!({"description": "changed"}))
        .await;
    let after_update = answered(run_get(&app, project, &key, "ids", "limit=3").await).await;
    assert!(!after_update.request.is_cached);

    // So does a delete: a new endpoint of the same name never sees the old results.
    app.delete(&format!("/api/projects/{project}/endpoints/ids"), &key).await;
    assert_error(run_get(&app, project, &key, "ids", "limit=3").await, 404, "not_found").await;
    app.create_endpoint(project, &key, &endpoint_body("ids", "SELECT id * 10 AS id FROM sales ORDER BY id"))
        .await;
    let recreated = answered(run_get(&app, project, &key, "ids", "limit=3").await).await;
    assert_eq!((recreated.request.is_cached, &recreated.results[0]), (false, &json!({"id": 10})));

    // cache_age_seconds 0 never serves from cache.
    app.patch(&format!("/api/projects/{project}/endpoints/ids"), &key, &json!({"cache_age_seconds": 0}))
        .await;
    answered(run_get(&app, project, &key, "ids", "").await).await;
    assert!(!answered(run_get(&app, project, &key, "ids", "").await).await.request.is_cached);
}

#[tokio::test]
async fn versions_can_be_pinned_and_inactive_endpoints_do_not_run() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    app.create_endpoint(project, &key, &endpoint_body("v", "SELECT 1 AS v")).await;
    let path = format!("/api/projects/{project}/endpoints/v");
    app.patch(&path, &key, &json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS v"}})).await;

    assert_eq!(answered(run_get(&app, project, &key, "v", "").await).await.results, json!([{"v": 2}]));
    let pinned = answered(run_get(&app, project, &key, "v", "version=1").await).await;
    assert_eq!((&pinned.results, pinned.computed.endpoint_version), (&json!([{"v": 1}]), Some(1)));
    let post_pinned = answered(app.post(&format!("{path}/run?version=1"), &key, &json!({})).await).await;
    assert_eq!(post_pinned.results, json!([{"v": 1}]));
    let body_wins =
        answered(app.post(&format!("{path}/run?version=1"), &key, &json!({"version": 2})).await).await;
    assert_eq!(body_wins.results, json!([{"v": 2}]));
    assert_error(run_get(&app, project, &key, "v", "version=7").await, 404, "not_found").await;
    assert_error(run_get(&app, project, &key, "v", "version=zero").await, 400, "validation_error").await;

    app.patch(&path, &key, &json!({"is_active": false})).await;
    assert_error(run_get(&app, project, &key, "v", "").await, 404, "not_found").await;
}

#[tokio::test]
async fn last_execution_times_show_runs_at_once_and_survive_a_restart() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    for name in ["ran", "never-ran"] {
        app.create_endpoint(project, &key, &endpoint_body(name, "SELECT 1 AS one")).await;
    }
    let before = answered(run_get(&app, project, &key, "ran", "").await).await;
    assert_eq!(before.results, json!([{"one": 1}]));
    let lookup = json!({"names": ["ran", "never-ran", "no-such-endpoint"]});
    let path = format!("/api/environments/{project}/endpoints/last_execution_times/");
    let status: Value = ok_json(app.post(&path, &key, &lookup).await).await;
    let query_status = &status["query_status"];
    for field in [
        "complete",
        "error",
        "error_message",
        "id",
        "query_async",
        "team_id",
        "dashboard_id",
        "insight_id",
        "labels",
        "start_time",
        "end_time",
        "pickup_time",
        "expiration_time",
        "task_id",
        "results",
        "query_progress",
    ] {
        assert!(query_status.get(field).is_some(), "missing {field}");
    }
    let status: LastExecutionTimes = serde_json::from_value(status).unwrap();
    let query_status = status.query_status;
    assert_eq!((query_status.complete, query_status.error, query_status.team_id), (true, false, project));
    let [(name, ran_at)] = &query_status.results[..] else { panic!("{query_status:?}") };
    assert_eq!(name, "ran");
    assert_eq!(query_status.query_progress.estimated_rows_total, 3);

    let record: Endpoint =
        app.get(&format!("/api/projects/{project}/endpoints/ran"), &key).await.json().await.unwrap();
    let recorded =
        record.last_executed_at.map(|at| at.format(&time::format_description::well_known::Rfc3339));
    assert_eq!(recorded.unwrap().unwrap(), *ran_at);

    for bad in [json!({}), json!({"names": []}), json!({"names": ["bad name"]})] {
        let error = assert_error(app.post(&path, &key, &bad).await, 400, "validation_error").await;
        assert_eq!(error.attr.as_deref(), Some("names"));
    }

    // A graceful stop flushes the pending times to the store; a new process reads them from there.
    let data_dir = app.data_dir.clone();
    app.stop().await.unwrap();
    let again = TestApp::builder().over(data_dir).spawn().await;
    let status: LastExecutionTimes =
        serde_json::from_value(ok_json(again.post(&path, &key, &lookup).await).await).unwrap();
    assert_eq!(status.query_status.results, [("ran".to_owned(), ran_at.clone())]);
    assert_eq!(status.query_status.query_progress.rows_read, 1);
}

#[tokio::test]
async fn guards_answer_query_timeout() {
    let app = TestApp::builder()
        .tuned(|config| config.limits.query_timeout = std::time::Duration::from_millis(100))
        .spawn()
        .await;
    let (project, key) = app.project_with_key();
    let body = endpoint_body(
        "slow",
        "SELECT count(*) AS n FROM generate_series(1, 50000000000) AS t(v) WHERE v % 7 = 3",
    );
    app.create_endpoint(project, &key, &body).await;
    let error = assert_error(run_get(&app, project, &key, "slow", "").await, 400, "query_error").await;
    assert_eq!(error.code.as_str(), "query_timeout");
}

#[tokio::test]
async fn a_page_over_the_result_byte_limit_is_refused_with_a_way_out() {
    let app = TestApp::builder().tuned(|config| config.limits.result_bytes = 1024 * 1024).spawn().await;
    let (project, key) = app.project_with_key();
    // About 1 KB a row.
    let wide = "SELECT v, repeat('x', 1000) AS pad FROM generate_series(1, 5000) AS t(v) ORDER BY v";
    app.create_endpoint(project, &key, &endpoint_body("wide", wide)).await;
    let error =
        assert_error(run_get(&app, project, &key, "wide", "limit=2000").await, 400, "query_error").await;
    assert_eq!((Some(error.code.as_str()), error.attr.as_deref()), (Some("result_too_large"), Some("limit")));
    assert!(error.detail.contains("1 MiB"), "{error:?}");
    let page = answered(run_get(&app, project, &key, "wide", "limit=500&offset=500").await).await;
    assert_eq!((page.results.as_array().unwrap().len(), page.computed.has_more), (500, true));
    assert_eq!(page.results[0]["v"], 501);
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_its_live_query() {
    let app = TestApp::builder()
        .tuned(|config| {
            config.limits.query_timeout = std::time::Duration::from_secs(60);
            config.limits.max_concurrent_per_project = 1;
            config.run_log = Some(server::RunLogConfig {
                flush_interval: std::time::Duration::from_millis(100),
                ..Default::default()
            });
        })
        .spawn()
        .await;
    let (project, key) = app.project_with_key();
    let slow = "SELECT count(*) AS n FROM generate_series(1, 50000000000) AS t(v) WHERE v % 7 = 3";
    app.create_endpoint(project, &key, &endpoint_body("slow", slow)).await;
    app.create_endpoint(project, &key, &endpoint_body("quick", "SELECT 1 AS one")).await;

    // The client gives up on the slow query; its connection closes.
    let impatient =
        reqwest::Client::builder().timeout(std::time::Duration::from_millis(300)).build().unwrap();
    let gave_up = impatient
        .get(format!("{}/api/projects/{project}/endpoints/slow/run", app.address))
        .bearer_auth(&key)
        .send()
        .await;
    assert!(gave_up.is_err(), "the slow query should still be running when the client leaves");

    // The project's only slot is free again soon after: the query was cancelled, not left to run for a minute.
    let mut status = 0;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        status = run_get(&app, project, &key, "quick", "refresh=direct").await.status().as_u16();
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "only the slot can be in the way");
    }
    assert_eq!(status, 200, "the slot was never released");
    // The run service recorded the cancelled run as the client's leaving.
    let logs = format!("/api/projects/{project}/endpoints/slow/logs");
    let mut logged = Vec::new();
    for _ in 0..100 {
        logged = app.get(&logs, &key).await.json::<http_actix::api::LogList>().await.unwrap().results;
        if !logged.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let [cancelled] = &logged[..] else { panic!("{logged:#?}") };
    assert_eq!((cancelled.status, cancelled.code.as_deref()), (499, Some("client_closed_request")));
    assert!(cancelled.duration_ms >= 300.0, "{cancelled:?}");
}

#[tokio::test]
async fn hostile_queries_are_refused_when_created() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let base = format!("/api/projects/{project}/endpoints");
    let csv = app.data_dir.join(format!("sales-{project}.csv"));
    let csv = csv.to_str().unwrap();
    for (i, sql) in [
        "DROP TABLE sales".to_owned(),
        "CREATE TABLE t AS SELECT 1".to_owned(),
        "INSERT INTO sales VALUES (7, 'X', 1, 1, '2026-01-01', '2026-01-01T00:00:00', true)".to_owned(),
        "DELETE FROM sales".to_owned(),
        "UPDATE sales SET amount = 0".to_owned(),
        "COPY sales TO '/tmp/stolen.csv'".to_owned(),
        format!("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{csv}'"),
        format!("SELECT * FROM '{csv}'"),
        "SELECT * FROM 'https://example.com/data.parquet'".to_owned(),
        format!("SELECT * FROM read_csv('{csv}')"),
        format!("SELECT * FROM read_parquet('{csv}')"),
        "SELECT * FROM information_schema.tables".to_owned(),
        "SELECT table_name FROM information_schema.columns".to_owned(),
        "SET datafusion.execution.batch_size = 1".to_owned(),
        "SELECT 1; SELECT 2".to_owned(),
        "SELECT 1; DROP TABLE sales".to_owned(),
        "EXPLAIN SELECT 1".to_owned(),
        "SHOW TABLES".to_owned(),
    ]
    .iter()
    .enumerate()
    {
        let response = app.post(&format!("{base}/"), &key, &endpoint_body(&format!("h{i}"), sql)).await;
        let error = assert_error_quoting(response, 400, "validation_error", csv).await;
        assert_eq!(error.attr.as_deref(), Some("query"), "{sql}: {error:?}");
        let detail = error.detail;
        assert!(!detail.contains(app.data_dir.to_str().unwrap()) || detail.contains(csv), "{sql}: {detail}");
    }
    // Nothing was changed or written.
    let total =
        app.post(&format!("{base}/"), &key, &endpoint_body("total", "SELECT count(*) AS n FROM sales")).await;
    assert_eq!(total.status(), 201);
    let run = answered(app.get(&format!("{base}/total/run"), &key).await).await;
    assert_eq!(run.results, json!([{"n": 6}]));
    assert!(!std::path::Path::new("/tmp/stolen.csv").exists());
}

#[tokio::test]
async fn a_recursive_query_that_never_ends_is_cut_off() {
    let app = TestApp::builder()
        .tuned(|config| {
            config.limits.query_timeout = std::time::Duration::from_secs(2);
        })
        .spawn()
        .await;
    let (project, key) = app.project_with_key();
    let bomb = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) AS n FROM r";
    let created =
        app.post(&format!("/api/projects/{project}/endpoints/"), &key, &endpoint_body("bomb", bomb)).await;
    if created.status() == 400 {
        return; // refused at planning: as good
    }
    assert_eq!(created.status(), 201);
    let started = std::time::Instant::now();
    let response = app.get(&format!("/api/projects/{project}/endpoints/bomb/run"), &key).await;
    let error = assert_error(response, 400, "query_error").await;
    assert!(["query_timeout", "query_memory_limit"].contains(&error.code.as_str()), "{error:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "cut off promptly");
}

#[tokio::test]
async fn hostile_values_stay_values() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let body = json!({"name": "typed", "query": {"kind": "SQLQuery",
        "query": "SELECT count(*) AS n FROM sales WHERE country = {variables.c} OR quantity = {variables.q}",
        "variables": {"c": {"type": "String", "default": "nowhere"}, "q": {"type": "Integer", "default": -1}}}});
    app.create_endpoint(project, &key, &body).await;
    let path = format!("/api/projects/{project}/endpoints/typed/run");
    let huge = "x".repeat(200_000);
    for value in [huge.as_str(), "ՍՏ", "ＵＳ", "U\u{200B}S", "US\\", "US\"; --", "${1}", "$1", "%s"] {
        let run =
            answered(app.post(&path, &key, &json!({"variables": {"c": value}, "refresh": "direct"})).await)
                .await;
        assert_eq!(run.results, json!([{"n": 0}]), "{value:.20}");
    }
    // Numbers at and past the limits of their type (a numeric string is a number: query strings are text).
    // Some(rows matched) for an accepted value, None for a refused one.
    for (q, matched) in [
        (json!(i64::MAX), Some(0)),
        (json!(i64::MIN), Some(0)),
        (json!(9_223_372_036_854_775_808_u64), None),
        (json!(1e300), None),
        (json!("1"), Some(1)),
        (json!("1; DROP TABLE sales"), None),
        (json!("0x10"), None),
        (json!(1.5), None),
    ] {
        let response = app.post(&path, &key, &json!({"variables": {"q": q}, "refresh": "direct"})).await;
        match matched {
            Some(n) => assert_eq!(answered(response).await.results, json!([{"n": n}]), "{q}"),
            None => {
                let error = assert_error(response, 400, "validation_error").await;
                assert_eq!(error.attr.as_deref(), Some("variables.q"), "{q}: {error:?}");
            }
        }
    }
}
