//! Snapshots over HTTP (contract section 23): `next` cursors that page one snapshot of the tables while rows
//! are appended, and `as_of` runs that read the tables as they were.

use http_actix::api::RunResult;
use reqwest::Method;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;

use crate::helpers::{assert_error, endpoint_body, spawn_app, TestApp, FAMILIES};

async fn write(app: &TestApp, method: Method, path: &str, key: &str, ndjson: &str) {
    let response = app
        .request(method, path, Some(key))
        .header("Content-Type", "application/x-ndjson")
        .body(ndjson.to_owned())
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.text().await.unwrap());
}

/// The rows of the first test's table: ids 2, 4, ..., 10.
const FIVE: &str = "{\"id\": 2}\n{\"id\": 4}\n{\"id\": 6}\n{\"id\": 8}\n{\"id\": 10}\n";

/// A project, a key that writes endpoints and tables, and its table `items` of `rows`, by the table's path.
async fn project_with_items(app: &TestApp, rows: &str) -> (i64, String, String) {
    let project = app.create_project();
    let (_, key) = app.create_key(project, &["endpoint:write", "table:write"]);
    let table = format!("/api/projects/{project}/tables/items");
    write(app, Method::PUT, &table, &key, rows).await;
    (project, key, table)
}

fn ids(answer: &RunResult) -> Vec<i64> {
    answer.results.as_array().unwrap().iter().map(|row| row["id"].as_i64().unwrap()).collect()
}

async fn run(app: &TestApp, path: &str, key: &str, body: Value) -> RunResult {
    let response = app.post(path, key, &body).await;
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    serde_json::from_value(answer).unwrap()
}

#[tokio::test]
async fn a_cursor_pages_one_snapshot_while_rows_are_appended_and_refuses_another_run() {
    let app = spawn_app().await;
    let (project, key, table) = project_with_items(&app, FIVE).await;
    let sql = "SELECT id FROM items WHERE id >= {variables.low} ORDER BY id";
    let mut body = endpoint_body("listing", sql);
    body["query"]["variables"] = json!({"low": {"type": "Integer", "default": 0}});
    body["cache_age_seconds"] = json!(0);
    app.create_endpoint(project, &key, &body).await;
    app.create_endpoint(project, &key, &endpoint_body("other", "SELECT id FROM items ORDER BY id")).await;

    for family in FAMILIES {
        let path = format!("{family}/{project}/endpoints/listing/run");
        let first = run(&app, &path, &key, json!({"limit": 2, "variables": {"low": 1}})).await;
        assert_eq!(ids(&first), [2, 4]);
        let next = first.request.next.clone().expect("rows follow: a cursor");

        // Rows that sort before and between the pages arrive; the cursor's pages do not see them.
        write(&app, Method::POST, &format!("{table}/rows"), &key, "{\"id\": 1}\n{\"id\": 5}\n").await;
        let second =
            run(&app, &path, &key, json!({"limit": 2, "variables": {"low": 1}, "cursor": next})).await;
        assert_eq!(ids(&second), [6, 8], "the same snapshot, from where the first page ended");
        assert_eq!(second.computed.data_as_of, first.computed.data_as_of, "as of the first page");
        let last_cursor = second.request.next.clone().unwrap();
        let query = format!("{path}?limit=2&variables.low=1&cursor={last_cursor}");
        let third: RunResult = app.get(&query, &key).await.json().await.unwrap();
        assert_eq!((ids(&third), third.computed.has_more), (vec![10], false));
        assert_eq!(third.request.next, None);
        // Paging by offset reads the newest rows.
        let by_offset =
            run(&app, &path, &key, json!({"limit": 2, "offset": 2, "variables": {"low": 1}})).await;
        assert_eq!(ids(&by_offset), [4, 5], "the appended 1 and 5 among them");

        // A cursor continues only its own run.
        for (body, attr) in [
            (json!({"limit": 2, "variables": {"low": 3}, "cursor": last_cursor}), "cursor"),
            (json!({"limit": 2, "variables": {"low": 1}, "cursor": last_cursor, "offset": 4}), "offset"),
            (json!({"limit": 2, "variables": {"low": 1}, "cursor": "bm90IGEgY3Vyc29y"}), "cursor"),
            (json!({"limit": 2, "variables": {"low": 1}, "cursor": "%%%"}), "cursor"),
        ] {
            let error = assert_error(app.post(&path, &key, &body).await, 400, "validation_error").await;
            assert_eq!(error.attr.as_deref(), Some(attr), "{body}");
        }
        let other = format!("{family}/{project}/endpoints/other/run");
        let error = assert_error(
            app.post(&other, &key, &json!({"cursor": last_cursor})).await,
            400,
            "validation_error",
        )
        .await;
        assert!(error.detail.contains("another endpoint"), "{error:?}");
        // Another project's key with the same endpoint name: the cursor is not its project's.
        let (stranger, theirs, _) = project_with_items(&app, "{\"id\": 1}\n").await;
        app.create_endpoint(stranger, &theirs, &body).await;
        let error = assert_error(
            app.post(
                &format!("{family}/{stranger}/endpoints/listing/run"),
                &theirs,
                &json!({"variables": {"low": 1}, "cursor": last_cursor}),
            )
            .await,
            400,
            "validation_error",
        )
        .await;
        assert_eq!(error.attr.as_deref(), Some("cursor"));
        // Start again for the next family, from the table as it was.
        write(&app, Method::PUT, &table, &key, FIVE).await;
    }
}

#[tokio::test]
async fn as_of_reads_the_tables_as_they_were_and_refuses_times_without_a_version() {
    let app = spawn_app().await;
    let (project, key, table) = project_with_items(&app, "{\"id\": 1}\n").await;
    app.create_endpoint(project, &key, &endpoint_body("total", "SELECT sum(id) AS id FROM items")).await;
    let path = format!("/api/projects/{project}/endpoints/total/run");
    let before_append = run(&app, &path, &key, json!({"refresh": "direct"})).await;
    let then = before_append.computed.data_as_of.unwrap();
    write(&app, Method::POST, &format!("{table}/rows"), &key, "{\"id\": 10}\n").await;
    write(&app, Method::POST, &format!("{table}/rows"), &key, "{\"id\": 100}\n").await;

    let now = run(&app, &path, &key, json!({})).await;
    assert_eq!(ids(&now), [111]);
    for family in FAMILIES {
        let path = format!("{family}/{project}/endpoints/total/run");
        let past = run(&app, &path, &key, json!({"as_of": then.format(&Rfc3339).unwrap()})).await;
        assert_eq!(ids(&past), [1], "the table before its appends");
        assert_eq!(past.computed.data_as_of, Some(then));
        let as_of = then.format(&Rfc3339).unwrap().replace('+', "%2B");
        let by_query: RunResult = app.get(&format!("{path}?as_of={as_of}"), &key).await.json().await.unwrap();
        assert_eq!(ids(&by_query), [1]);
    }
    for (as_of, says) in
        [("2001-01-01T00:00:00Z", "retention"), ("yesterday", "RFC 3339"), ("2999-01-01T00:00:00Z", "future")]
    {
        let error =
            assert_error(app.post(&path, &key, &json!({"as_of": as_of})).await, 400, "validation_error")
                .await;
        assert_eq!(error.attr.as_deref(), Some("as_of"), "{as_of}");
        assert!(error.detail.contains(says), "{as_of}: {error:?}");
    }
    // Before the table's first commit, within the retention.
    let created = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let early = created.format(&time::format_description::well_known::Rfc3339).unwrap();
    let error =
        assert_error(app.post(&path, &key, &json!({"as_of": early})).await, 400, "validation_error").await;
    assert!(error.detail.contains("created later"), "{error:?}");
}
