//! Tables over HTTP under both families: uploads in CSV and NDJSON, appends, previews, deletes, scopes, and
//! every way an upload fails, with the table checked unchanged afterwards.

use domain::ColumnType;
use http_actix::api::{
    Appended, Endpoint, Preview, RunResult, Table, TableColumn, TableLayout, TablePage, TableVersionPage,
};
use reqwest::{Method, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::helpers::{assert_error, endpoint_body, spawn_app, TestApp, FAMILIES};

/// A PUT (replace) or POST `/rows` (append) of `body` as `content_type`.
async fn upload(
    app: &TestApp,
    method: Method,
    path: &str,
    key: &str,
    content_type: &str,
    body: &str,
) -> Response {
    app.request(method, path, Some(key))
        .header("Content-Type", content_type)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

async fn ok_json(response: Response, status: u16) -> Value {
    decoded(response, status).await
}

/// The body of an answer of `status`, as the API's type of it.
async fn decoded<T: DeserializeOwned>(response: Response, status: u16) -> T {
    let got = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The names of a table's columns, in order.
fn names(table: &Table) -> Vec<&str> {
    table.columns.iter().map(|column| column.name.as_str()).collect()
}

/// A project and a key that may write both endpoints and tables.
fn project_with_writer(app: &TestApp) -> (i64, String) {
    let project = app.create_project();
    let (_, key) = app.create_key(project, &["endpoint:write", "table:write"]);
    (project, key)
}

const ORDERS: &str = "id,country,amount\n1,US,10.5\n2,FR,4\n3,US,1.5\n";

#[tokio::test]
async fn a_table_is_created_appended_to_read_by_an_endpoint_and_deleted_under_both_families() {
    let app = spawn_app().await;
    for family in FAMILIES {
        let (project, key) = project_with_writer(&app);
        let tables = format!("{family}/{project}/tables");
        let created = upload(&app, Method::PUT, &format!("{tables}/orders"), &key, "text/csv", ORDERS).await;
        assert_eq!(created.status(), 201);
        assert_eq!(created.headers()["location"], format!("/api/projects/{project}/tables/orders").as_str());
        let table: Table = decoded(created, 201).await;
        assert_eq!((table.name.as_str(), table.row_count), ("orders", Some(3)), "{table:?}");
        let amount = TableColumn { name: "amount".into(), column_type: ColumnType::Float, nullable: true };
        assert_eq!(table.columns[2], amount);
        assert_eq!((table.format.as_str(), table.source.as_str()), ("parquet", "upload"));
        assert!(table.used_by.is_empty());

        // An endpoint on the table; its run is cached, and an append makes the cached answer stale at once.
        let endpoints = format!("{family}/{project}/endpoints");
        let body = endpoint_body(
            "by-country",
            "SELECT country, sum(amount) AS total FROM orders GROUP BY country ORDER BY country",
        );
        assert_eq!(app.post(&format!("{endpoints}/"), &key, &body).await.status(), 201);
        let run_path = format!("{endpoints}/by-country/run");
        assert_eq!(
            decoded::<RunResult>(app.get(&run_path, &key).await, 200).await.results,
            json!([{"country": "FR", "total": 4.0}, {"country": "US", "total": 12.0}])
        );
        assert!(decoded::<RunResult>(app.get(&run_path, &key).await, 200).await.request.is_cached);
        let ndjson = "{\"id\": 4, \"country\": \"DE\", \"amount\": 2}\n";
        let appended: Appended = decoded(
            upload(
                &app,
                Method::POST,
                &format!("{tables}/orders/rows"),
                &key,
                "application/x-ndjson",
                ndjson,
            )
            .await,
            200,
        )
        .await;
        assert_eq!((appended.rows_added, appended.table.row_count), (1, Some(4)));
        assert_eq!(appended.table.used_by, ["by-country"]);
        let after: RunResult = decoded(app.get(&run_path, &key).await, 200).await;
        assert!(!after.request.is_cached, "the append made the cached run stale");
        assert_eq!(after.results[0], json!({"country": "DE", "total": 2.0}));

        let listed: TablePage = decoded(app.get(&format!("{tables}?limit=10"), &key).await, 200).await;
        assert_eq!((listed.count, listed.results[0].name.as_str()), (1, "orders"));
        let preview: Preview =
            decoded(app.post(&format!("{tables}/orders/preview?limit=2"), &key, &json!({})).await, 200).await;
        assert_eq!(preview.columns, ["id", "country", "amount"]);
        assert_eq!((preview.results.as_array().unwrap().len(), preview.has_more), (2, true));

        // A replace answers 200 and keeps when the table was created.
        let replaced: Table = decoded(
            upload(
                &app,
                Method::PUT,
                &format!("{tables}/orders/"),
                &key,
                "text/csv",
                "id,country,amount\n9,JP,1\n",
            )
            .await,
            200,
        )
        .await;
        assert_eq!((replaced.row_count, replaced.created_at), (Some(1), table.created_at));

        // A table an endpoint reads cannot be deleted; once the endpoint is gone it can.
        let in_use = assert_error(app.delete(&format!("{tables}/orders"), &key).await, 409, "conflict").await;
        assert_eq!(in_use.code.as_str(), "in_use");
        assert!(in_use.detail.contains("by-country"), "{in_use:?}");
        assert_eq!(app.delete(&format!("{endpoints}/by-country"), &key).await.status(), 204);
        assert_eq!(app.delete(&format!("{tables}/orders"), &key).await.status(), 204);
        assert_error(app.get(&format!("{tables}/orders"), &key).await, 404, "not_found").await;
        assert_error(app.delete(&format!("{tables}/orders"), &key).await, 404, "not_found").await;
    }
}

#[tokio::test]
async fn replacing_a_table_plans_its_readers_again() {
    let app = spawn_app().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    let endpoints = format!("/api/projects/{project}/endpoints");
    upload(&app, Method::PUT, &format!("{tables}/orders"), &key, "text/csv", ORDERS).await;
    let body = endpoint_body("totals", "SELECT country, sum(amount) AS total FROM orders GROUP BY country");
    assert_eq!(app.post(&format!("{endpoints}/"), &key, &body).await.status(), 201);
    let record = |name: &'static str| app.endpoint(project, &key, name);
    assert_eq!(record("totals").await.plan_error, None);

    // Without the column the query reads: the endpoint says why, and its runs are 400 query_invalid.
    let without_amount = "id,country\n1,US\n";
    let replaced =
        upload(&app, Method::PUT, &format!("{tables}/orders"), &key, "text/csv", without_amount).await;
    assert_eq!(decoded::<Table>(replaced, 200).await.used_by, ["totals"]);
    let broken = record("totals").await;
    assert!(broken.plan_error.as_deref().unwrap().contains("amount"), "{broken:?}");
    assert_eq!(broken.columns, None);
    for family in FAMILIES {
        let run = app.get(&format!("{family}/{project}/endpoints/totals/run"), &key).await;
        let error = assert_error(run, 400, "query_error").await;
        assert_eq!(
            (Some(error.code.as_str()), error.attr.as_deref()),
            (Some("query_invalid"), Some("query"))
        );
        assert!(error.detail.contains("amount"), "{error:?}");
    }
    let version: http_actix::api::Version =
        decoded(app.get(&format!("{endpoints}/totals/versions/1"), &key).await, 200).await;
    assert_eq!(version.plan_error, broken.plan_error);
    // Still a reader: the table cannot be deleted under it.
    assert_error(app.delete(&format!("{tables}/orders"), &key).await, 409, "conflict").await;

    // With the column back as text, sum() does not plan either; as integers it plans, with the new type.
    let amount_as_text = "id,country,amount\nid-1,US,ten\n";
    upload(&app, Method::PUT, &format!("{tables}/orders"), &key, "text/csv", amount_as_text).await;
    assert!(record("totals").await.plan_error.unwrap().contains("sum"));
    let amount_as_integers = "id,country,amount\n1,US,10\n2,US,5\n";
    upload(&app, Method::PUT, &format!("{tables}/orders"), &key, "text/csv", amount_as_integers).await;
    let fixed = record("totals").await;
    assert_eq!(fixed.plan_error, None, "{fixed:?}");
    let total = http_actix::api::Column { name: "total".into(), column_type: ColumnType::Integer };
    assert_eq!(fixed.columns.as_ref().map(|columns| &columns[1]), Some(&total), "{fixed:?}");
    let run: RunResult = decoded(app.get(&format!("{endpoints}/totals/run"), &key).await, 200).await;
    assert_eq!(run.results, json!([{"country": "US", "total": 15}]));
    // A new version of the query starts without an error of its own (it drops both columns of an endpoint that
    // just ran: confirmed).
    let patched = app
        .patch(
            &format!("{endpoints}/totals"),
            &key,
            &json!({"query": {"kind": "SQLQuery", "query": "SELECT id FROM orders"}, "confirm_breaking": true}),
        )
        .await;
    assert_eq!(decoded::<Endpoint>(patched, 200).await.plan_error, None);
}

#[tokio::test]
async fn a_table_named_with_capitals_is_listed_and_read_under_its_quoted_name() {
    let app = spawn_app().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    let created = upload(&app, Method::PUT, &format!("{tables}/Orders_EU"), &key, "text/csv", ORDERS).await;
    assert_eq!(decoded::<Table>(created, 201).await.name, "Orders_EU");
    let listed: TablePage = decoded(app.get(&format!("{tables}/"), &key).await, 200).await;
    assert_eq!(listed.results[0].name, "Orders_EU", "{listed:?}");
    let endpoints = format!("/api/projects/{project}/endpoints");
    let body = endpoint_body("eu", "SELECT count(*) AS n FROM \"Orders_EU\"");
    assert_eq!(app.post(&format!("{endpoints}/"), &key, &body).await.status(), 201);
    let run: RunResult = decoded(app.get(&format!("{endpoints}/eu/run"), &key).await, 200).await;
    assert_eq!(run.results, json!([{"n": 3}]));
    // Unquoted, SQL folds the name to lower case, and there is no such table.
    let folded = endpoint_body("folded", "SELECT count(*) AS n FROM Orders_EU");
    assert_error(app.post(&format!("{endpoints}/"), &key, &folded).await, 400, "validation_error").await;
    let used: Table = decoded(app.get(&format!("{tables}/Orders_EU"), &key).await, 200).await;
    assert_eq!(used.used_by, ["eu"]);
}

#[tokio::test]
async fn table_routes_need_table_scopes() {
    let app = spawn_app().await;
    let project = app.create_project();
    let (_, writer) = app.create_key(project, &["table:write"]);
    let (_, reader) = app.create_key(project, &["table:read"]);
    let (_, endpoints) = app.create_key(project, &["endpoint:write"]);
    let tables = format!("/api/projects/{project}/tables");
    assert_eq!(
        upload(&app, Method::PUT, &format!("{tables}/t"), &writer, "text/csv", "n\n1\n").await.status(),
        201
    );
    // table:write implies table:read; endpoint:write implies neither.
    for key in [&writer, &reader] {
        assert_eq!(app.get(&format!("{tables}/t"), key).await.status(), 200);
        assert_eq!(app.post(&format!("{tables}/t/preview"), key, &json!({"limit": 1})).await.status(), 200);
    }
    let denied = assert_error(
        upload(&app, Method::PUT, &format!("{tables}/t"), &reader, "text/csv", "n\n2\n").await,
        403,
        "permission_denied",
    )
    .await;
    assert!(denied.detail.contains("table:write"));
    assert_error(app.delete(&format!("{tables}/t"), &reader).await, 403, "permission_denied").await;
    assert_error(app.get(&tables, &endpoints).await, 403, "permission_denied").await;
    assert_error(
        app.get(&format!("/api/projects/{project}/endpoints"), &writer).await,
        403,
        "permission_denied",
    )
    .await;
    // Another project's key sees nothing of these tables.
    let other = app.create_project();
    let (_, stranger) = app.create_key(other, &["table:write"]);
    assert_error(app.get(&format!("{tables}/t"), &stranger).await, 403, "permission_denied").await;
    assert_error(app.request(Method::GET, &tables, None).send().await.unwrap(), 401, "authentication_error")
        .await;
}

/// A table keeps its columns in the order they were sent (NDJSON's keys as first seen, CSV's header), and a CSV
/// append names the table's columns by its header, in any order, leaving out nullable ones.
#[tokio::test]
async fn columns_keep_the_order_they_were_sent_in_and_csv_appends_match_them_by_name() {
    let app = spawn_app().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    let ndjson = "{\"id\": 1, \"region\": \"eu\", \"amount\": 2.5}\n{\"id\": 2, \"region\": \"us\", \"zone\": \"b\"}\n";
    let sales: Table = decoded(
        upload(&app, Method::PUT, &format!("{tables}/sales"), &key, "application/x-ndjson", ndjson).await,
        201,
    )
    .await;
    assert_eq!(names(&sales), ["id", "region", "amount", "zone"], "{sales:?}");
    let csv: Table = decoded(
        upload(&app, Method::PUT, &format!("{tables}/by_header"), &key, "text/csv", "zone,b,a\nx,1,2\n")
            .await,
        201,
    )
    .await;
    assert_eq!(names(&csv), ["zone", "b", "a"], "{csv:?}");

    let rows = format!("{tables}/sales/rows");
    for body in ["amount,id,region,zone\n4.5,3,eu,c\n", "region,id\nus,4\n"] {
        ok_json(upload(&app, Method::POST, &rows, &key, "text/csv", body).await, 200).await;
    }
    let twice = assert_error(
        upload(&app, Method::POST, &rows, &key, "text/csv", "id,id\n5,6\n").await,
        400,
        "validation_error",
    )
    .await;
    assert!(twice.detail.contains("'id' twice"), "{twice:?}");
    let preview: Preview =
        decoded(app.post(&format!("{tables}/sales/preview"), &key, &json!({"limit": 10})).await, 200).await;
    assert_eq!(preview.columns, ["id", "region", "amount", "zone"], "{preview:?}");
    let mut got = preview.results.as_array().unwrap().clone();
    got.sort_by_key(|row| row["id"].as_i64());
    assert_eq!(
        Value::from(got),
        json!([
            {"id": 1, "region": "eu", "amount": 2.5, "zone": null},
            {"id": 2, "region": "us", "amount": null, "zone": "b"},
            {"id": 3, "region": "eu", "amount": 4.5, "zone": "c"},
            {"id": 4, "region": "us", "amount": null, "zone": null},
        ]),
        "{preview:?}"
    );
}

#[tokio::test]
async fn a_failed_upload_leaves_the_table_as_it_was() {
    let app = TestApp::builder().tuned(|config| config.upload_limit = 4096).spawn().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    let path = format!("{tables}/orders");
    ok_json(upload(&app, Method::PUT, &path, &key, "text/csv", ORDERS).await, 201).await;
    let before =
        decoded::<Preview>(app.post(&format!("{path}/preview"), &key, &json!({})).await, 200).await.results;
    let rows = format!("{path}/rows");

    let ragged = assert_error(
        upload(&app, Method::PUT, &path, &key, "text/csv", "id,country,amount\n1,US,1,extra\n").await,
        400,
        "validation_error",
    )
    .await;
    assert_eq!(ragged.attr.as_deref(), Some("body"));
    let mismatch = assert_error(
        upload(&app, Method::POST, &rows, &key, "text/csv", "id,land,amount\n4,DE,1\n").await,
        400,
        "validation_error",
    )
    .await;
    assert!(mismatch.detail.contains("the body has 'land'"), "{mismatch:?}");
    let bad_value = assert_error(
        upload(&app, Method::POST, &rows, &key, "text/csv", "id,country,amount\n4,DE,lots\n").await,
        400,
        "validation_error",
    )
    .await;
    assert!(
        bad_value.detail.contains("lots") && !serde_json::to_string(&bad_value).unwrap().contains("staging"),
        "{bad_value:?}"
    );
    let empty =
        assert_error(upload(&app, Method::PUT, &path, &key, "text/csv", "").await, 400, "validation_error")
            .await;
    assert!(empty.detail.contains("empty"));
    let big = format!("id,country,amount\n{}", "5,US,1\n".repeat(1000));
    let too_large = assert_error(
        upload(&app, Method::POST, &rows, &key, "text/csv", &big).await,
        413,
        "validation_error",
    )
    .await;
    assert_eq!(too_large.code.as_str(), "payload_too_large");
    assert_error(
        upload(&app, Method::PUT, &path, &key, "application/xml", "<x/>").await,
        415,
        "validation_error",
    )
    .await;
    assert_error(
        upload(&app, Method::POST, &format!("{tables}/missing/rows"), &key, "text/csv", "n\n1\n").await,
        404,
        "not_found",
    )
    .await;
    assert_error(
        upload(&app, Method::PUT, &format!("{tables}/no-dashes"), &key, "text/csv", "n\n1\n").await,
        400,
        "validation_error",
    )
    .await;

    // A client that goes away halfway through its body.
    let address = app.address.trim_start_matches("http://").to_owned();
    let head = format!(
        "POST {rows} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\nContent-Type: text/csv\r\n\
         Content-Length: 2000\r\n\r\nid,country,amount\n7,CUT,1\n8,CUT,"
    );
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut socket = std::net::TcpStream::connect(&address).unwrap();
        socket.write_all(head.as_bytes()).unwrap();
        socket.shutdown(std::net::Shutdown::Both).unwrap();
    })
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let after =
        decoded::<Preview>(app.post(&format!("{path}/preview"), &key, &json!({})).await, 200).await.results;
    assert_eq!(after, before, "no failed upload changed the table");
    assert_eq!(decoded::<Table>(app.get(&path, &key).await, 200).await.row_count, Some(3));
    let staging = app.data_dir.join(format!("projects/{project}/staging"));
    let staged: Vec<_> = walk(&staging).into_iter().filter(|p| p.is_file()).collect();
    assert!(staged.is_empty(), "nothing staged is left: {staged:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let entries: Vec<_> =
        std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    entries.into_iter().flat_map(|p| if p.is_dir() { walk(&p) } else { vec![p] }).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_all_land_and_runs_never_see_half_of_one() {
    let app = spawn_app().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    ok_json(upload(&app, Method::PUT, &format!("{tables}/events"), &key, "text/csv", "n\n0\n").await, 201)
        .await;
    let body = json!({"name": "count", "cache_age_seconds": 0,
                      "query": {"kind": "SQLQuery", "query": "SELECT count(*) AS rows FROM events"}});
    assert_eq!(app.post(&format!("/api/projects/{project}/endpoints/"), &key, &body).await.status(), 201);
    // Each append holds 100 rows: a run that saw part of one would count something else than 1 + 100k.
    let batch: String =
        std::iter::once("n\n".to_owned()).chain((1..=100).map(|i| format!("{i}\n"))).collect();
    let appends: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, key, batch) = (
                app.client.clone(),
                format!("{}{tables}/events/rows", app.address),
                key.clone(),
                batch.clone(),
            );
            tokio::spawn(async move {
                client
                    .post(url)
                    .bearer_auth(key)
                    .header("Content-Type", "text/csv")
                    .body(batch)
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    let runs: Vec<_> = (0..16)
        .map(|_| {
            let (client, url, key) = (
                app.client.clone(),
                format!("{}/api/projects/{project}/endpoints/count/run?refresh=direct", app.address),
                key.clone(),
            );
            tokio::spawn(async move {
                let response = client.get(url).bearer_auth(key).send().await.unwrap();
                // The project's slots are shared with the appends: a run may be told to retry.
                if response.status() == 429 {
                    return None;
                }
                let answer: RunResult = decoded(response, 200).await;
                answer.results[0]["rows"].as_u64()
            })
        })
        .collect();
    for append in appends {
        assert_eq!(append.await.unwrap(), 200);
    }
    for run in runs {
        if let Some(rows) = run.await.unwrap() {
            assert_eq!(rows % 100, 1, "a run saw part of an append: {rows} rows");
        }
    }
    let table: Table = decoded(app.get(&format!("{tables}/events"), &key).await, 200).await;
    assert_eq!(table.row_count, Some(801), "no append was lost");
}

/// Runs SQL on the test PostgreSQL database with `psql`, returning what it printed (unaligned, no headers).
fn psql(sql: &str) -> String {
    let output = std::process::Command::new("psql")
        .args([&crate::helpers::postgres_url(), "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
        .output()
        .expect("psql runs (make test installs PostgreSQL)");
    assert!(output.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A schema of the test database, dropped with it.
struct Schema(String);

impl Drop for Schema {
    fn drop(&mut self) {
        // Nothing here may panic: this runs while a failed test unwinds too.
        if let Ok(database) = std::env::var("TEST_POSTGRES_URL") {
            let drop_it = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0);
            let _ = std::process::Command::new("psql").args([&database, "-c", &drop_it]).output();
        }
    }
}

#[tokio::test]
async fn a_postgresql_table_of_an_allowed_database_is_read_where_it_is() {
    let database = url::Url::parse(&crate::helpers::postgres_url()).unwrap();
    let schema = Schema(format!("source_{}", uuid::Uuid::new_v4().simple()));
    psql(&format!(
        "CREATE SCHEMA {0}; CREATE TABLE {0}.orders (id integer, country text, amount double precision); \
         INSERT INTO {0}.orders VALUES (1, 'US', 10.5), (2, 'FR', 4), (3, 'US', 1.5);",
        schema.0
    ));
    // The local server speaks no TLS: the operator says so in the prefix, or no tenant could lower it.
    let mut allowed = database.clone();
    allowed.set_query(Some("sslmode=disable"));
    let app =
        TestApp::builder().tuned(|config| config.allowed_sources = vec![allowed.to_string()]).spawn().await;
    let (project, key) = project_with_writer(&app);
    let (host, port, db) = (database.host_str().unwrap(), database.port().unwrap_or(5432), database.path());
    // No credentials: the allowed prefix's serve.
    let url = format!("postgres://{host}:{port}{db}?sslmode=disable");
    let source = |table: &str| json!({"source": {"url": url, "table": format!("{}.{table}", schema.0)}});

    let put = |family: &str, table: &str, body: Value| {
        let path = format!("{family}/{project}/tables/{table}");
        let (app, key) = (&app, &key);
        async move { app.request(Method::PUT, &path, Some(key)).json(&body).send().await.unwrap() }
    };
    let created: Table = decoded(put(FAMILIES[0], "orders", source("orders")).await, 201).await;
    assert_eq!((created.format.as_str(), created.source.as_str()), ("postgres", url.as_str()));
    assert_eq!((created.row_count, created.bytes), (None, None), "{created:?}");
    let column = |name: &str, column_type| TableColumn { name: name.into(), column_type, nullable: true };
    assert_eq!(
        created.columns,
        [
            column("id", ColumnType::Integer),
            column("country", ColumnType::String),
            column("amount", ColumnType::Float)
        ]
    );

    // An endpoint reads it live: a row inserted there is in the next direct run.
    let endpoints = format!("{}/{project}/endpoints", FAMILIES[1]);
    let body = endpoint_body(
        "totals",
        "SELECT country, sum(amount) AS total FROM orders WHERE amount > 1 GROUP BY country ORDER BY country",
    );
    assert_eq!(app.post(&format!("{endpoints}/"), &key, &body).await.status(), 201);
    let run = format!("{endpoints}/totals/run?refresh=direct");
    let totals = json!([{"country": "FR", "total": 4.0}, {"country": "US", "total": 12.0}]);
    assert_eq!(decoded::<RunResult>(app.get(&run, &key).await, 200).await.results, totals);
    psql(&format!("INSERT INTO {}.orders VALUES (4, 'DE', 2)", schema.0));
    let more: RunResult = decoded(app.get(&run, &key).await, 200).await;
    assert_eq!(more.results[0], json!({"country": "DE", "total": 2.0}), "{more:?}");
    let preview_path = format!("{}/{project}/tables/orders/preview", FAMILIES[1]);
    let preview = app.post(&preview_path, &key, &json!({"limit": 2})).await;
    assert_eq!(decoded::<Preview>(preview, 200).await.results.as_array().unwrap().len(), 2);
    // A `LIKE` the engine would match itself is the database's to evaluate, in the SQL it understands.
    let body = endpoint_body("us", "SELECT id FROM orders WHERE country LIKE '_S' ORDER BY id");
    assert_eq!(app.post(&format!("{endpoints}/"), &key, &body).await.status(), 201);
    let us: RunResult =
        decoded(app.get(&format!("{endpoints}/us/run?refresh=direct"), &key).await, 200).await;
    assert_eq!(us.results, json!([{"id": 1}, {"id": 3}]), "{us:?}");

    // Its rows are the database's: an append is refused.
    let tables = format!("{}/{project}/tables", FAMILIES[0]);
    let append = upload(&app, Method::POST, &format!("{tables}/orders/rows"), &key, "text/csv", ORDERS).await;
    let error = assert_error(append, 400, "validation_error").await;
    assert_eq!(error.attr.as_deref(), Some("table"), "{error:?}");

    // A password in the URL never shows in the record.
    let mut with_password = database.clone();
    with_password.set_query(Some("sslmode=disable"));
    let body = json!({"source": {"url": with_password.as_str(), "table": format!("{}.orders", schema.0)}});
    let shown = ok_json(put(FAMILIES[1], "orders_again", body).await, 201).await;
    let password = format!(":{}@", database.password().unwrap());
    assert!(!shown.to_string().contains(&password), "{shown}");
    let shown: Table = serde_json::from_value(shown).unwrap();
    assert!(shown.source.starts_with(&format!("postgres://{}@", database.username())));

    // Refused, and nothing registered: another database, a table that is not there, wrong credentials.
    let other_database = format!("postgres://{host}:{port}/postgres?sslmode=disable");
    let mut wrong = database.clone();
    wrong.set_password(Some("not-the-password")).unwrap();
    wrong.set_query(Some("sslmode=disable"));
    for (body, why) in [
        (json!({"source": {"url": other_database, "table": "public.orders"}}), "not under a source"),
        (json!({"source": {"url": url, "table": format!("{}.missing", schema.0)}}), "missing"),
        (
            json!({"source": {"url": wrong.as_str(), "table": format!("{}.orders", schema.0)}}),
            "cannot connect",
        ),
    ] {
        let error = assert_error(put(FAMILIES[0], "refused", body).await, 400, "validation_error").await;
        assert_eq!(error.attr.as_deref(), Some("source"), "{error:?}");
        let detail = error.detail;
        assert!(detail.contains(why) && !detail.contains("not-the-password"), "{detail}");
    }
    assert_eq!(app.get(&format!("{tables}/refused"), &key).await.status(), 404);

    // Deleting the table forgets it; the database's table stays.
    for endpoint in ["totals", "us"] {
        app.delete(&format!("{endpoints}/{endpoint}"), &key).await;
    }
    assert_eq!(app.delete(&format!("{tables}/orders"), &key).await.status(), 204);
    assert_eq!(psql(&format!("SELECT count(*) FROM {}.orders", schema.0)), "4");
}

#[tokio::test]
async fn external_files_are_read_only_from_allowed_places() {
    let lake = std::env::temp_dir().join(format!("endpoints-lake-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(lake.join("orders")).unwrap();
    std::fs::write(lake.join("orders/2026-01.csv"), ORDERS).unwrap();
    let allowed = format!("file://{}/", lake.display());
    let app = TestApp::builder().tuned(|config| config.allowed_sources = vec![allowed.clone()]).spawn().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/environments/{project}/tables");
    let put = |table: &str, body: Value| {
        let path = format!("{tables}/{table}");
        let (app, key) = (&app, &key);
        async move { app.request(Method::PUT, &path, Some(key)).json(&body).send().await.unwrap() }
    };
    let url = format!("{allowed}orders/");
    let created: Table =
        decoded(put("orders", json!({"source": {"url": url, "format": "csv"}})).await, 201).await;
    assert_eq!((created.format.as_str(), created.source.as_str()), ("csv", url.as_str()));
    assert_eq!(created.row_count, None);
    let body = endpoint_body("n", "SELECT count(*) AS n FROM orders");
    assert_eq!(app.post(&format!("/api/projects/{project}/endpoints/"), &key, &body).await.status(), 201);
    let n: RunResult =
        decoded(app.get(&format!("/api/projects/{project}/endpoints/n/run"), &key).await, 200).await;
    assert_eq!(n.results, json!([{"n": 3}]));

    for (body, attr, why) in [
        (json!({"source": {"url": "file:///etc/", "format": "csv"}}), "source", "not under a source"),
        (json!({"source": {"url": "s3://any-bucket/x/", "format": "csv"}}), "source", "not under a source"),
        (
            json!({"source": {"url": format!("{allowed}nothing/"), "format": "csv"}}),
            "source",
            "does not exist",
        ),
        (json!({"source": {"url": "https://example.com/x.csv", "format": "csv"}}), "source", "not https"),
        (json!({"source": {"url": url, "format": "xlsx"}}), "source.format", "xlsx"),
        (json!({"source": {"url": url}}), "source.format", "required"),
        (json!({"from": url}), "from", "Unknown field"),
    ] {
        let error = assert_error(put("refused", body.clone()).await, 400, "validation_error").await;
        assert_eq!(error.attr.as_deref(), Some(attr), "{body}: {error:?}");
        assert!(error.detail.contains(why), "{body}: {error:?}");
    }
    let malformed = app
        .request(Method::PUT, &format!("{tables}/refused"), Some(&key))
        .header("Content-Type", "application/json")
        .body("{\"source\":")
        .send()
        .await
        .unwrap();
    assert_eq!(assert_error(malformed, 400, "validation_error").await.code.as_str(), "parse_error");
    assert_eq!(app.get(&format!("{tables}/refused"), &key).await.status(), 404);
    let _ = std::fs::remove_dir_all(&lake);
}

/// A database that declines TLS, as a man in the middle would: the operator's prefix names no `sslmode`, so a
/// tenant's `sslmode=disable` is refused before anything connects, and a URL without one connects with TLS
/// required, so the server never sees a startup message, let alone the operator's password.
#[tokio::test]
async fn a_tenant_cannot_make_the_server_send_the_operators_password_in_clear() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let seen = std::sync::Arc::clone(&received);
    let fake = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let seen = std::sync::Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buffer = [0_u8; 4096];
                loop {
                    let read = match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => read,
                    };
                    seen.lock().unwrap().extend_from_slice(&buffer[..read]);
                    // An SSLRequest (length 8, code 80877103) is declined; anything else asks for a password in
                    // clear text, which is what a server that wants it would do.
                    let answer: &[u8] = if read == 8 && buffer[4..8] == [0x04, 0xd2, 0x16, 0x2f] {
                        b"N"
                    } else {
                        &[b'R', 0, 0, 0, 8, 0, 0, 0, 3]
                    };
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let prefix = format!("postgres://operator:op-secret-pw@127.0.0.1:{port}/app");
    let app = TestApp::builder().tuned(|config| config.allowed_sources = vec![prefix.clone()]).spawn().await;
    let (project, key) = project_with_writer(&app);
    let path = format!("{}/{project}/tables/remote", FAMILIES[0]);
    for (url, why) in [
        (format!("postgres://127.0.0.1:{port}/app?sslmode=disable"), "weaker"),
        (format!("postgres://127.0.0.1:{port}/app?sslmode=prefer"), "weaker"),
        (format!("postgres://127.0.0.1:{port}/app?sslmode=require"), "weaker"),
        (format!("postgres://127.0.0.1:{port}/app"), "cannot connect"),
    ] {
        let body = json!({"source": {"url": url, "table": "public.orders"}});
        let response = app.request(Method::PUT, &path, Some(&key)).json(&body).send().await.unwrap();
        let error = assert_error(response, 400, "validation_error").await;
        let detail = error.detail;
        assert!(detail.contains(why) && !detail.contains("op-secret-pw"), "{url}: {detail}");
    }
    fake.abort();
    let received = received.lock().unwrap().clone();
    // Only SSLRequests arrived: no startup message (which names the user), no password.
    assert!(!received.is_empty(), "the URL without sslmode did try to connect");
    assert!(received.chunks(8).all(|c| c == [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]), "{received:?}");
    let text = String::from_utf8_lossy(&received);
    assert!(!text.contains("op-secret-pw") && !text.contains("operator"), "{text}");
}

/// An append with an `Idempotency-Key`.
async fn append_once(
    app: &TestApp,
    path: &str,
    api_key: &str,
    idempotency_key: &str,
    body: &str,
) -> Response {
    app.request(Method::POST, path, Some(api_key))
        .header("Content-Type", "text/csv")
        .header("Idempotency-Key", idempotency_key)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_append_with_an_idempotency_key_adds_its_rows_once() {
    let app = spawn_app().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    for table in ["orders", "returns"] {
        ok_json(upload(&app, Method::PUT, &format!("{tables}/{table}"), &key, "text/csv", ORDERS).await, 201)
            .await;
    }
    let rows = format!("{tables}/orders/rows");
    let more = "id,country,amount\n4,DE,2\n5,DE,3\n";
    let first: Appended = decoded(append_once(&app, &rows, &key, "batch-0001", more).await, 200).await;
    assert_eq!((first.rows_added, first.table.row_count), (2, Some(5)));
    // A retry (the answer was lost, say) adds nothing and answers as the first did.
    for _ in 0..3 {
        let again: Appended = decoded(append_once(&app, &rows, &key, "batch-0001", more).await, 200).await;
        assert_eq!(
            (again.rows_added, again.bytes_received, again.table.row_count),
            (2, first.bytes_received, Some(5)),
            "{again:?}"
        );
    }
    // The same key with other rows is a conflict, and adds nothing.
    let other = "id,country,amount\n6,IT,1\n";
    let conflict =
        assert_error(append_once(&app, &rows, &key, "batch-0001", other).await, 409, "conflict").await;
    assert_eq!(conflict.code.as_str(), "idempotency_conflict", "{conflict:?}");
    // A key is per table: the same key on another table is another append.
    let returns: Appended =
        decoded(append_once(&app, &format!("{tables}/returns/rows"), &key, "batch-0001", other).await, 200)
            .await;
    assert_eq!(returns.table.row_count, Some(4));
    // A body refused (its rows do not fit) frees its key: sent again, fixed, it lands.
    let bad = "id,country,amount\n7,IT,lots\n";
    assert_error(append_once(&app, &rows, &key, "batch-0002", bad).await, 400, "validation_error").await;
    let fixed: Appended =
        decoded(append_once(&app, &rows, &key, "batch-0002", "id,country,amount\n7,IT,8\n").await, 200).await;
    assert_eq!(fixed.table.row_count, Some(6));
    // Keys outside the rule are refused before anything is read.
    for bad_key in [String::new(), "k".repeat(129), "two words".into()] {
        let refused =
            assert_error(append_once(&app, &rows, &key, &bad_key, more).await, 400, "validation_error").await;
        assert_eq!(refused.attr.as_deref(), Some("Idempotency-Key"), "{refused:?}");
    }
    let table: Table = decoded(app.get(&format!("{tables}/orders"), &key).await, 200).await;
    assert_eq!(table.row_count, Some(6), "{table:?}");
}

#[tokio::test]
async fn a_stream_of_small_appends_is_compacted_into_few_files() {
    let app = TestApp::builder()
        .tuned(|config| config.compaction_interval = Some(std::time::Duration::from_millis(200)))
        .spawn()
        .await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    ok_json(upload(&app, Method::PUT, &format!("{tables}/events"), &key, "text/csv", "n\n0\n").await, 201)
        .await;
    let body = json!({"name": "total", "cache_age_seconds": 0,
                      "query": {"kind": "SQLQuery", "query": "SELECT count(*) AS rows, sum(n) AS total FROM events"}});
    assert_eq!(app.post(&format!("/api/projects/{project}/endpoints/"), &key, &body).await.status(), 201);
    for i in 1..=40 {
        let appended = upload(
            &app,
            Method::POST,
            &format!("{tables}/events/rows"),
            &key,
            "text/csv",
            &format!("n\n{i}\n"),
        )
        .await;
        assert_eq!(appended.status(), 200);
    }
    let compacted = |table: &Table| table.files < Some(8) && table.last_compacted_at.is_some();
    let mut table: Table = decoded(app.get(&format!("{tables}/events"), &key).await, 200).await;
    for _ in 0..100 {
        if compacted(&table) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        table = decoded(app.get(&format!("{tables}/events"), &key).await, 200).await;
    }
    assert!(compacted(&table), "{table:?}");
    assert_eq!(table.row_count, Some(41));
    let run: RunResult = decoded(
        app.get(&format!("/api/projects/{project}/endpoints/total/run?refresh=direct"), &key).await,
        200,
    )
    .await;
    assert_eq!(run.results[0], json!({"rows": 41, "total": 820}));
    let metrics =
        app.client.get(format!("{}/metrics", app.address)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("endpoints_table_compactions_total{outcome=\"compacted\"}"), "{metrics}");
}

#[tokio::test]
async fn rows_that_do_not_fit_are_set_aside_in_the_quarantine_table_when_asked() {
    let app = spawn_app().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    ok_json(upload(&app, Method::PUT, &format!("{tables}/orders"), &key, "text/csv", ORDERS).await, 201)
        .await;
    let rows = format!("{tables}/orders/rows");
    let body = "{\"id\": 4, \"country\": \"DE\", \"amount\": 2}\n\
                {\"id\": \"five\", \"country\": \"IT\", \"amount\": 1}\n\
                {\"id\": 6, \"country\": \"ES\", \"amount\": 3, \"colour\": \"red\"}\n\
                {\"id\": 7, \"amount\": 8}\n";
    // Without quarantine one bad row refuses the body, as before, and adds nothing.
    assert_error(
        upload(&app, Method::POST, &rows, &key, "application/x-ndjson", body).await,
        400,
        "validation_error",
    )
    .await;
    let quarantined: Appended = decoded(
        upload(
            &app,
            Method::POST,
            &format!("{rows}?on_error=quarantine"),
            &key,
            "application/x-ndjson",
            body,
        )
        .await,
        200,
    )
    .await;
    assert_eq!((quarantined.rows_added, quarantined.rows_quarantined), (2, 2), "{quarantined:?}");
    assert_eq!(quarantined.table.row_count, Some(5));
    // The bad rows are a table of the project, read like any other.
    let sql = "SELECT line, raw, error <> '' AS why, received_at IS NOT NULL AS at FROM orders_quarantine ORDER BY line";
    let endpoint =
        json!({"name": "bad_rows", "cache_age_seconds": 0, "query": {"kind": "SQLQuery", "query": sql}});
    assert_eq!(app.post(&format!("/api/projects/{project}/endpoints/"), &key, &endpoint).await.status(), 201);
    let run: RunResult =
        decoded(app.get(&format!("/api/projects/{project}/endpoints/bad_rows/run"), &key).await, 200).await;
    assert_eq!(
        run.results,
        json!([
            {"line": 2, "raw": "{\"id\": \"five\", \"country\": \"IT\", \"amount\": 1}", "why": true, "at": true},
            {"line": 3, "raw": "{\"id\": 6, \"country\": \"ES\", \"amount\": 3, \"colour\": \"red\"}", "why": true, "at": true},
        ]),
        "{run:?}"
    );
    let table: Table = decoded(app.get(&format!("{tables}/orders_quarantine"), &key).await, 200).await;
    assert_eq!(names(&table), ["received_at", "line", "raw", "error"]);
    // A CSV body too, and a second quarantine adds to the table; the endpoint over it sees them at once.
    let csv = "id,country,amount\n8,PT,1\n9,PT,lots\n";
    let second: Appended = decoded(
        upload(&app, Method::POST, &format!("{rows}?on_error=quarantine"), &key, "text/csv", csv).await,
        200,
    )
    .await;
    assert_eq!((second.rows_added, second.rows_quarantined), (1, 1));
    let run: RunResult =
        decoded(app.get(&format!("/api/projects/{project}/endpoints/bad_rows/run"), &key).await, 200).await;
    assert_eq!(run.results.as_array().unwrap().len(), 3, "{run:?}");
    // What quarantine cannot take is refused, naming on_error.
    let bogus = assert_error(
        upload(&app, Method::POST, &format!("{rows}?on_error=skip"), &key, "text/csv", csv).await,
        400,
        "validation_error",
    )
    .await;
    assert_eq!(bogus.attr.as_deref(), Some("on_error"));
    let wrong_header = assert_error(
        upload(
            &app,
            Method::POST,
            &format!("{rows}?on_error=quarantine"),
            &key,
            "text/csv",
            "id,colour\n1,2\n",
        )
        .await,
        400,
        "validation_error",
    )
    .await;
    assert!(wrong_header.detail.contains("the body has 'colour'"), "{wrong_header:?}");
    let table: Table = decoded(app.get(&format!("{tables}/orders"), &key).await, 200).await;
    assert_eq!(table.row_count, Some(6), "{table:?}");
}

#[tokio::test]
async fn a_quarantine_table_of_other_columns_refuses_the_body_before_any_row_lands_and_frees_its_key() {
    let app = spawn_app().await;
    let (project, key) = project_with_writer(&app);
    let tables = format!("/api/projects/{project}/tables");
    ok_json(upload(&app, Method::PUT, &format!("{tables}/orders"), &key, "text/csv", ORDERS).await, 201)
        .await;
    // A table of the quarantine's name the tenant made for something else.
    let theirs = format!("{tables}/orders_quarantine");
    ok_json(upload(&app, Method::PUT, &theirs, &key, "text/csv", "note\nkeep me\n").await, 201).await;
    let body = "{\"id\": 4, \"country\": \"DE\", \"amount\": 2}\n{\"id\": \"five\"}\n";
    let send = || {
        app.request(Method::POST, &format!("{tables}/orders/rows?on_error=quarantine"), Some(&key))
            .header("Content-Type", "application/x-ndjson")
            .header("Idempotency-Key", "once")
            .body(body)
            .send()
    };
    let refused = assert_error(send().await.unwrap(), 400, "validation_error").await;
    assert_eq!(refused.attr.as_deref(), Some("on_error"), "{refused:?}");
    assert!(refused.detail.contains("not a quarantine table"), "{refused:?}");
    let orders: Table = decoded(app.get(&format!("{tables}/orders"), &key).await, 200).await;
    assert_eq!(orders.row_count, Some(3), "no good row landed: {orders:?}");
    let kept: Table = decoded(app.get(&theirs, &key).await, 200).await;
    assert_eq!(kept.row_count, Some(1), "{kept:?}");
    // The key is free: once the name is, the retry is taken, once.
    assert_eq!(app.request(Method::DELETE, &theirs, Some(&key)).send().await.unwrap().status(), 204);
    for _ in 0..2 {
        let taken: Appended = decoded(send().await.unwrap(), 200).await;
        assert_eq!((taken.rows_added, taken.rows_quarantined), (1, 1));
    }
    let orders: Table = decoded(app.get(&format!("{tables}/orders"), &key).await, 200).await;
    assert_eq!(orders.row_count, Some(4), "{orders:?}");
}

/// A table's versions are the commits of its Delta log: each replace, append and compaction, newest first,
/// paged, readable with a `table:read` key, and gone with the table.
#[tokio::test]
async fn a_tables_versions_list_its_commits_newest_first_under_both_families() {
    let app = spawn_app().await;
    for family in FAMILIES {
        let (project, key) = project_with_writer(&app);
        let (_, reader) = app.create_key(project, &["table:read"]);
        let table = format!("{family}/{project}/tables/orders");
        ok_json(upload(&app, Method::PUT, &table, &key, "text/csv", ORDERS).await, 201).await;
        let rows = "id,country,amount\n4,DE,1\n5,DE,2\n";
        for _ in 0..2 {
            ok_json(upload(&app, Method::POST, &format!("{table}/rows"), &key, "text/csv", rows).await, 200)
                .await;
        }
        ok_json(
            upload(&app, Method::PUT, &table, &key, "text/csv", "id,country,amount\n9,US,1\n").await,
            200,
        )
        .await;

        // Decoding reads each commit's time as RFC 3339.
        let versions: TableVersionPage =
            decoded(app.get(&format!("{table}/versions"), &reader).await, 200).await;
        assert_eq!(versions.count, 4, "{versions:?}");
        let listed: Vec<(u64, &str, Option<u64>, Option<u64>)> = versions
            .results
            .iter()
            .map(|v| (v.version, v.operation.as_str(), v.rows_added, v.rows_removed))
            .collect();
        assert_eq!(
            listed,
            vec![
                (3, "WRITE", Some(1), Some(7)),
                (2, "WRITE", Some(2), None),
                (1, "WRITE", Some(2), None),
                (0, "WRITE", Some(3), None)
            ],
            "{versions:?}"
        );
        let first: TableVersionPage =
            decoded(app.get(&format!("{table}/versions?limit=1"), &reader).await, 200).await;
        assert_eq!(first.results[0].version, 3);
        assert!(first.next.as_deref().unwrap().contains("offset=1"), "{first:?}");
        let last: TableVersionPage =
            decoded(app.get(&format!("{table}/versions?limit=1&offset=3"), &reader).await, 200).await;
        assert_eq!((last.results[0].version, last.next), (0, None));
        assert_error(app.get(&format!("{table}/versions?limit=0"), &reader).await, 400, "validation_error")
            .await;

        assert_error(
            app.get(&format!("{family}/{project}/tables/nope/versions"), &reader).await,
            404,
            "not_found",
        )
        .await;
        let (_, endpoint_only) = app.create_key(project, &["endpoint:read"]);
        assert_error(app.get(&format!("{table}/versions"), &endpoint_only).await, 403, "permission_denied")
            .await;
        let deleted = app.request(Method::DELETE, &table, Some(&key)).send().await.unwrap();
        assert_eq!(deleted.status(), 204);
        assert_error(app.get(&format!("{table}/versions"), &reader).await, 404, "not_found").await;
    }
}

/// Quarantine appends take their sorting turn once their body has arrived: bodies one project keeps open (more
/// than there are turns) do not hold up another project's quarantine append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_never_finish_hold_no_turn_of_another_projects_quarantine_append() {
    use tokio::io::AsyncWriteExt;
    let app = TestApp::builder()
        .tuned(|config| config.client_timeout = std::time::Duration::from_secs(120))
        .spawn()
        .await;
    let (slow, slow_key) = project_with_writer(&app);
    let (other, other_key) = project_with_writer(&app);
    for (project, key) in [(slow, &slow_key), (other, &other_key)] {
        let table = format!("/api/projects/{project}/tables/orders");
        ok_json(upload(&app, Method::PUT, &table, key, "text/csv", ORDERS).await, 201).await;
    }
    // Eight bodies of one project, each promised 1 MiB and sent 100 bytes of: more than the turns there are.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let head = format!(
            "POST /api/projects/{slow}/tables/orders/rows?on_error=quarantine HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {slow_key}\r\nContent-Type: text/csv\r\nContent-Length: 1048576\r\n\r\n\
             id,country,amount\n"
        );
        let mut stream =
            tokio::net::TcpStream::connect(app.address.trim_start_matches("http://")).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&b"9,DE,1\n".repeat(12)).await.unwrap();
        stalled.push(stream);
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let rows = format!("/api/projects/{other}/tables/orders/rows?on_error=quarantine");
    let appended = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        upload(&app, Method::POST, &rows, &other_key, "text/csv", "id,country,amount\n4,DE,2\nfive,IT,1\n"),
    )
    .await
    .expect("answered while the other project's bodies are still open");
    let answer: Appended = decoded(appended, 200).await;
    assert_eq!((answer.rows_added, answer.rows_quarantined), (1, 1));
    drop(stalled);
}

/// The table's record once its layout is sorted by `columns` in every file, polled while compactions run.
async fn laid_out(app: &TestApp, path: &str, key: &str, columns: &[&str]) -> Table {
    let mut table: Table = decoded(app.get(path, key).await, 200).await;
    for _ in 0..300 {
        if table.layout.cluster_by == columns && Some(table.layout.files_clustered) == table.files {
            return table;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        table = decoded(app.get(path, key).await, 200).await;
    }
    panic!("the table was not laid out by {columns:?}: {table:?}");
}

/// A table's files are sorted by the column its endpoints filter on with a variable, chosen again when an
/// endpoint's new version filters another (once the table has kept its first order for `LAYOUT_RECHECK`), and
/// runs answer the same.
#[tokio::test]
async fn a_tables_files_are_sorted_by_the_columns_its_endpoints_filter_on() {
    use domain::Clock as _;
    // The service tells the time by a clock this test moves.
    let clock = std::sync::Arc::new(domain::testing::ManualClock::new(domain::SystemClock.now()));
    let app = TestApp::builder()
        .tuned(|config| {
            config.compaction_interval = Some(std::time::Duration::from_millis(200));
            config.clock = server::ServiceClock(clock.clone());
        })
        .spawn()
        .await;
    let (project, key) = project_with_writer(&app);
    let table = format!("/api/projects/{project}/tables/events");
    // More rows than a full file holds, written in arrival order: accounts out of order.
    let rows = 140_000u64;
    let account = |n: u64| format!("a{}", (n * 7919) % 1000);
    let mut csv = String::from("n,account\n");
    for n in 0..rows {
        csv.push_str(&format!("{n},{}\n", account(n)));
    }
    ok_json(upload(&app, Method::PUT, &table, &key, "text/csv", &csv).await, 201).await;
    let record: Table = decoded(app.get(&table, &key).await, 200).await;
    let unsorted = TableLayout { cluster_by: Vec::new(), files_clustered: 0, pinned: None };
    assert_eq!(record.layout, unsorted, "{record:?}");

    let by_account = json!({"name": "by_account", "query": {"kind": "SQLQuery",
        "query": "SELECT count(*) AS rows, sum(n) AS total FROM events WHERE account = {variables.account}",
        "variables": {"account": {"type": "String", "default": "a0"}}}});
    assert_eq!(
        app.post(&format!("/api/projects/{project}/endpoints/"), &key, &by_account).await.status(),
        201
    );
    laid_out(&app, &table, &key, &["account"]).await;
    let run = |account: &str| {
        let path = format!("/api/projects/{project}/endpoints/by_account/run");
        let body = json!({"variables": {"account": account}, "refresh": "direct"});
        let (app, key) = (&app, &key);
        async move { decoded::<RunResult>(app.post(&path, key, &body).await, 200).await }
    };
    let matching: Vec<u64> = (0..rows).filter(|n| account(*n) == "a7").collect();
    let expected = json!({"rows": matching.len(), "total": matching.iter().sum::<u64>()});
    assert_eq!(run("a7").await.results[0], expected);

    // The endpoint's next version also filters a range of `n`: the files are sorted by both (the equality
    // first) at the first compaction once they have been sorted by `account` for `LAYOUT_RECHECK`.
    let by_range = json!({"query": {"kind": "SQLQuery",
        "query": "SELECT count(*) AS rows, sum(n) AS total FROM events \
                  WHERE n >= {variables.from} AND account = {variables.account}",
        "variables": {"account": {"type": "String", "default": "a0"},
                      "from": {"type": "Integer", "default": 0}}}});
    let updated = app.patch(&format!("/api/projects/{project}/endpoints/by_account"), &key, &by_range).await;
    assert_eq!(updated.status(), 200);
    clock.advance(domain::LAYOUT_RECHECK);
    laid_out(&app, &table, &key, &["account", "n"]).await;
    assert_eq!(run("a7").await.results[0], expected);
}

/// Columns set for a table (`PATCH` with `cluster_by`) sort its files in place of its endpoints' filters, until
/// given back; a body that does not name its own orderable columns, a missing table or a reader's key is refused.
#[tokio::test]
async fn a_tables_files_are_sorted_by_the_columns_set_for_it() {
    let app = TestApp::builder()
        .tuned(|config| config.compaction_interval = Some(std::time::Duration::from_millis(200)))
        .spawn()
        .await;
    let (project, key) = project_with_writer(&app);
    let table = format!("/api/projects/{project}/tables/events");
    let rows = 140_000u64;
    let mut csv = String::from("n,account\n");
    for n in 0..rows {
        csv.push_str(&format!("{},a{}\n", (n * 7919) % rows, n % 1000));
    }
    ok_json(upload(&app, Method::PUT, &table, &key, "text/csv", &csv).await, 201).await;
    let set = |body: Value| {
        let (app, table, key) = (&app, &table, &key);
        async move { app.patch(table, key, &body).await }
    };
    let record: Table = decoded(set(json!({"cluster_by": ["n"]})).await, 200).await;
    assert_eq!(record.layout.pinned, Some(vec!["n".to_owned()]), "{record:?}");
    // No endpoint reads the table: the columns set are all that sorts it.
    laid_out(&app, &table, &key, &["n"]).await;

    for (body, says) in [
        (json!({"cluster_by": ["missing"]}), "no column 'missing'"),
        (json!({"cluster_by": ["n", "account", "x"]}), "at most 2"),
        (json!({"cluster_by": "n"}), "list of column names"),
        (json!({}), "required"),
    ] {
        let refused = assert_error(set(body.clone()).await, 400, "validation_error").await;
        assert_eq!(refused.attr.as_deref(), Some("cluster_by"), "{body}: {refused:?}");
        assert!(refused.detail.contains(says), "{body}: {refused:?}");
    }
    let missing = format!("/api/projects/{project}/tables/nothing");
    assert_error(app.patch(&missing, &key, &json!({"cluster_by": null})).await, 404, "not_found").await;
    let (_, reader) = app.create_key(project, &["table:read"]);
    assert_error(app.patch(&table, &reader, &json!({"cluster_by": null})).await, 403, "permission_denied")
        .await;

    let record: Table = decoded(set(json!({"cluster_by": null})).await, 200).await;
    assert_eq!(record.layout.pinned, None, "{record:?}");
}

/// A table written before the process serving it started (by the CLI, or a process that did not compact) is
/// laid out for the endpoints reading it all the same: a starting process looks at every table endpoints read.
#[tokio::test]
async fn a_table_written_before_the_process_started_is_laid_out_for_its_endpoints() {
    let app = TestApp::builder().tuned(|config| config.compaction_interval = None).spawn().await;
    let (project, key) = project_with_writer(&app);
    let table = format!("/api/projects/{project}/tables/events");
    let mut csv = String::from("n,account\n");
    for n in 0..140_000u64 {
        csv.push_str(&format!("{n},a{}\n", (n * 7919) % 1000));
    }
    ok_json(upload(&app, Method::PUT, &table, &key, "text/csv", &csv).await, 201).await;
    let by_account = json!({"name": "by_account", "query": {"kind": "SQLQuery",
        "query": "SELECT count(*) AS rows FROM events WHERE account = {variables.account}",
        "variables": {"account": {"type": "String", "default": "a0"}}}});
    let created = app.post(&format!("/api/projects/{project}/endpoints/"), &key, &by_account).await;
    assert_eq!(created.status(), 201);
    let record: Table = decoded(app.get(&table, &key).await, 200).await;
    assert!(record.layout.cluster_by.is_empty(), "nothing compacts in this process: {record:?}");
    let data_dir = app.data_dir.clone();
    app.stop().await.unwrap();

    let app = TestApp::builder()
        .over(data_dir)
        .tuned(|config| {
            config.compaction_interval = Some(std::time::Duration::from_millis(200));
        })
        .spawn()
        .await;
    laid_out(&app, &table, &key, &["account"]).await;
}
