//! Tables and stored results in an S3 bucket: a real S3-compatible server (`moto`'s server mode, which
//! `make test` installs) started here, and the real `endpoints` binary pointed at it with
//! `--storage s3://bucket/prefix` and the usual `AWS_*` variables. The data directory holds only the SQLite
//! database.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_actix::api::{Appended, Endpoint, LogList, Materialization, RunResult, Table};
use http_actix::ErrorBody;
use serde_json::{json, Value};

use crate::helpers::{serve_command, typed, ServeProcess, SALES};

pub(crate) const BUCKET: &str = "endpoints-test";
pub(crate) const PREFIX: &str = "deployment";

/// A moto S3 server on a free loopback port, killed when dropped.
pub(crate) struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Started on a free port; started again on another when it exits first (the port taken meanwhile by
    /// another test's server). Given a minute and a half to answer: a Python server starts slowly on two cores
    /// shared with the rest of the suite.
    pub(crate) async fn start() -> Self {
        let program = std::env::var("TEST_MOTO_SERVER").expect(
            "TEST_MOTO_SERVER must name moto's `moto_server` program; `make test` installs it and sets it",
        );
        let deadline = Instant::now() + Duration::from_secs(90);
        let moto = 'started: loop {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let child = Command::new(&program)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("moto_server starts");
            let mut moto = Self { child, endpoint: format!("http://127.0.0.1:{port}") };
            while reqwest::get(&moto.endpoint).await.is_err() {
                assert!(Instant::now() < deadline, "moto_server never answered");
                if moto.child.try_wait().unwrap().is_some() {
                    continue 'started;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            break moto;
        };
        let created = reqwest::Client::new().put(format!("{}/{BUCKET}", moto.endpoint)).send().await.unwrap();
        assert!(created.status().is_success(), "cannot create the bucket: {}", created.status());
        moto
    }

    /// The server's address (`http://127.0.0.1:PORT`).
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The keys in the bucket under `prefix`, sorted.
    pub(crate) async fn keys(&self, prefix: &str) -> Vec<String> {
        let url = format!("{}/{BUCKET}?list-type=2&prefix={PREFIX}/{prefix}", self.endpoint);
        let listing = reqwest::get(url).await.unwrap().text().await.unwrap();
        assert!(!listing.contains("<IsTruncated>true"), "more keys than one listing holds");
        let mut keys: Vec<String> = listing
            .split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split_once("</Key>"))
            .map(|(key, _)| key.strip_prefix(&format!("{PREFIX}/")).unwrap_or(key).to_owned())
            .collect();
        keys.sort();
        keys
    }

    /// `endpoints` with the storage in the bucket and this server's address and credentials.
    pub(crate) fn endpoints(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_endpoints"));
        command
            .args(["--storage", &format!("s3://{BUCKET}/{PREFIX}")])
            .env_remove("DATABASE_URL")
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1");
        command
    }

    /// A fresh data directory (for the SQLite file) with a project, a read-write key, and the `sales` table
    /// imported into the bucket; returns the directory, the project and the key.
    pub(crate) fn project_with_sales(&self) -> (Dir, i64, String) {
        let dir = Dir::fresh();
        let project = self.cli(&dir.0, &["project", "create", "--name", "S3"])["id"].as_i64().unwrap();
        let scope = ["key", "create", "--project", &project.to_string(), "--scope", "endpoint:write"];
        let key = self.cli(&dir.0, &scope)["key"].as_str().unwrap().to_owned();
        let sales = dir.0.join("sales.csv");
        std::fs::write(&sales, SALES).unwrap();
        assert_eq!(self.import(&dir.0, project, &sales)["rows"], 6);
        (dir, project, key)
    }

    /// `endpoints data import` of `file` into the project's `sales` table, replacing it.
    pub(crate) fn import(&self, data_dir: &Path, project: i64, file: &Path) -> Value {
        let project = project.to_string();
        self.cli(
            data_dir,
            &["data", "import", "--project", &project, "--table", "sales", file.to_str().unwrap()],
        )
    }

    pub(crate) fn cli(&self, data_dir: &Path, args: &[&str]) -> Value {
        let output =
            self.endpoints().arg("--data-dir").arg(data_dir).arg("--json").args(args).output().unwrap();
        assert!(output.status.success(), "endpoints {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    }
}

pub(crate) struct Dir(pub(crate) PathBuf);

impl Dir {
    /// A new, empty data directory (for the SQLite file).
    pub(crate) fn fresh() -> Self {
        let dir = Self(std::env::temp_dir().join(format!("endpoints-s3-{}", uuid::Uuid::new_v4())));
        std::fs::create_dir_all(&dir.0).unwrap();
        dir
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn call(
    server: &ServeProcess,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request =
        reqwest::Client::new().request(method, format!("{}{path}", server.address)).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn wait_completed(server: &ServeProcess, base: &str, key: &str, version: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, status) =
            call(server, reqwest::Method::GET, &format!("{base}/materialization_status"), key, None).await;
        let record: Materialization = typed(&status);
        if record.status == "Completed" && u64::from(record.version) == version {
            return;
        }
        assert!(record.status != "Failed", "the refresh failed: {status}");
        assert!(Instant::now() < deadline, "v{version} never completed: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn tables_and_stored_results_live_in_an_s3_bucket() {
    let moto = Moto::start().await;
    let (dir, project, key) = moto.project_with_sales();
    let data_dir = dir.0.as_path();
    let import = |file: &Path| moto.import(data_dir, project, file);

    // The table is a Delta table in the bucket (its log's first commit, by a conditional put, and its file);
    // nothing is on the local disk.
    let table = format!("projects/{project}/tables/sales/");
    let first = moto.keys(&table).await;
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0], format!("{table}_delta_log/00000000000000000000.json"));
    assert!(first[1].starts_with(&format!("{table}part-")) && first[1].ends_with(".parquet"), "{first:?}");
    assert!(!data_dir.join("projects").exists());
    let listed = moto.cli(data_dir, &["data", "list", "--project", &project.to_string()]);
    let location = listed[0]["location"].as_str().unwrap();
    assert_eq!(location, format!("s3://{BUCKET}/{PREFIX}/{table}"), "{listed}");
    assert_eq!(listed[0]["files"], 1);

    let worker = ["--materialize-poll-ms", "50", "--materialize-lease-secs", "3", "--workers", "1"];
    let mut command = moto.endpoints();
    command.stderr(Stdio::null());
    let server = serve_command(command, data_dir, &worker).await;
    let ready = reqwest::get(format!("{}/readyz", server.address)).await.unwrap();
    assert_eq!(ready.status(), 200);

    // A live run reads the table from the bucket.
    let base = format!("/api/projects/{project}/endpoints");
    let total = json!({"name": "total", "query": {"kind": "SQLQuery",
                        "query": "SELECT count(*) AS n, sum(quantity) AS q FROM sales"}});
    assert_eq!(call(&server, reqwest::Method::POST, &format!("{base}/"), &key, Some(total)).await.0, 201);
    let total_url = format!("{base}/total/run?refresh=direct");
    let run_total = || call(&server, reqwest::Method::GET, &total_url, &key, None);
    assert_eq!(typed::<RunResult>(&run_total().await.1).results, json!([{"n": 6, "q": 21}]));

    // A materialized endpoint's result is written to the bucket, read from it, and replaced on a new version.
    let by_country = |sql: &str| {
        json!({"kind": "SQLQuery", "query": sql,
               "variables": {"country": {"type": "String", "default": "US"}}})
    };
    let body = json!({"name": "by-country", "is_materialized": true, "sync_frequency": "1hour",
                      "query": by_country("SELECT country, sum(quantity) AS q FROM sales WHERE country = {variables.country} GROUP BY country")});
    let (status, created) = call(&server, reqwest::Method::POST, &format!("{base}/"), &key, Some(body)).await;
    assert_eq!(status, 201, "{created}");
    let id = typed::<Endpoint>(&created).id;
    let stored = format!("projects/{project}/materializations/{id}/");
    wait_completed(&server, &format!("{base}/by-country"), &key, 1).await;
    let v1 = moto.keys(&stored).await;
    assert!(v1.len() == 1 && v1[0].starts_with(&format!("{stored}v1-")), "{v1:?}");
    let run = format!("{base}/by-country/run?variables.country=US");
    let answer: RunResult = typed(&call(&server, reqwest::Method::GET, &run, &key, None).await.1);
    assert_eq!(
        (answer.computed.endpoint_materialized, answer.results),
        (true, json!([{"country": "US", "q": 3}]))
    );

    // `q` becomes `orders`, a breaking change of an endpoint that just ran: confirmed.
    let changed = json!({"query": by_country("SELECT country, count(*) AS orders FROM sales WHERE country = {variables.country} GROUP BY country"), "confirm_breaking": true});
    assert_eq!(
        call(&server, reqwest::Method::PATCH, &format!("{base}/by-country"), &key, Some(changed)).await.0,
        200
    );
    wait_completed(&server, &format!("{base}/by-country"), &key, 2).await;
    let v2 = moto.keys(&stored).await;
    assert!(
        v2.len() == 1 && v2[0].starts_with(&format!("{stored}v2-")),
        "version 1's result is removed: {v2:?}"
    );
    let answer: RunResult = typed(&call(&server, reqwest::Method::GET, &run, &key, None).await.1);
    assert_eq!(answer.results, json!([{"country": "US", "orders": 2}]));

    // A replace while serving (a commit of the CLI's process): the next live run here sees the new rows; the old
    // file stays for readers of the older version until a vacuum.
    let fewer = data_dir.join("fewer.csv");
    std::fs::write(&fewer, SALES.lines().take(3).collect::<Vec<_>>().join("\n")).unwrap();
    assert_eq!(import(&fewer)["rows"], 2);
    assert_eq!(typed::<RunResult>(&run_total().await.1).results, json!([{"n": 2, "q": 3}]));
    let second = moto.keys(&table).await;
    assert_eq!(second.len(), 4, "{second:?}");
    assert_eq!(second[1], format!("{table}_delta_log/00000000000000000001.json"));
    assert!(second.contains(&first[1]), "{second:?}");

    // Deleting the endpoint removes its stored result from the bucket.
    assert_eq!(
        call(&server, reqwest::Method::DELETE, &format!("{base}/by-country"), &key, None).await.0,
        204
    );
    assert!(moto.keys(&stored).await.is_empty(), "{:?}", moto.keys(&stored).await);

    // An upload over HTTP is staged in the bucket and written as the table there; nothing staged remains.
    let scopes = ["key", "create", "--project", &project.to_string(), "--scope", "table:write"];
    let uploader = moto.cli(data_dir, &scopes)["key"].as_str().unwrap().to_owned();
    let orders = format!("{}/api/projects/{project}/tables/orders", server.address);
    let client = reqwest::Client::new();
    let put = |body: &'static str, url: String, method: reqwest::Method| {
        client
            .request(method, url)
            .bearer_auth(&uploader)
            .header("Content-Type", "text/csv")
            .body(body)
            .send()
    };
    assert_eq!(put("id,amount\n1,2.5\n", orders.clone(), reqwest::Method::PUT).await.unwrap().status(), 201);
    let appended: Appended = put("id,amount\n2,1\n", format!("{orders}/rows"), reqwest::Method::POST)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(appended.table.row_count, Some(2), "{appended:?}");
    let files = moto.keys(&format!("projects/{project}/tables/orders/")).await;
    assert_eq!(files.iter().filter(|k| k.ends_with(".parquet")).count(), 2, "{files:?}");
    assert!(moto.keys(&format!("projects/{project}/staging/")).await.is_empty());

    // Without its storage the server is not ready, and a live run is a clear 503, not a hang or a 500.
    drop(moto);
    let ready = reqwest::get(format!("{}/readyz", server.address)).await.unwrap();
    assert_eq!(ready.status(), 503);
    let (status, body) = run_total().await;
    assert_eq!(status, 503, "{body}");
}

#[tokio::test]
async fn external_files_are_read_in_the_storages_bucket_and_in_allowed_ones() {
    let moto = Moto::start().await;
    let client = reqwest::Client::new();
    let put_object = |key: String, body: &'static str| {
        let request = client.put(format!("{}/{key}", moto.endpoint)).body(body).send();
        async move { assert!(request.await.unwrap().status().is_success(), "cannot write {key}") }
    };
    assert!(client.put(format!("{}/lake", moto.endpoint)).send().await.unwrap().status().is_success());
    put_object(format!("{BUCKET}/incoming/orders/a.csv"), "id,amount\n1,2.5\n2,1.5\n").await;
    put_object(format!("{BUCKET}/incoming/orders/b.csv"), "id,amount\n3,4.5\n").await;
    put_object("lake/exports/events.ndjson".into(), "{\"event\":\"click\"}\n{\"event\":\"view\"}\n").await;
    put_object("lake/private/secrets.ndjson".into(), "{\"secret\":\"x\"}\n").await;

    let dir = Dir::fresh();
    let project = moto.cli(&dir.0, &["project", "create", "--name", "Lake"])["id"].as_i64().unwrap();
    let scopes = [
        "key",
        "create",
        "--project",
        &project.to_string(),
        "--scope",
        "endpoint:write",
        "--scope",
        "table:write",
    ];
    let key = moto.cli(&dir.0, &scopes)["key"].as_str().unwrap().to_owned();
    let mut command = moto.endpoints();
    command.stderr(Stdio::null());
    let server = serve_command(command, &dir.0, &["--allow-source", "s3://lake/exports/"]).await;
    let tables = format!("/api/projects/{project}/tables");
    let register = |table: &str, url: &str, format: &str| {
        let body = json!({"source": {"url": url, "format": format}});
        let (server, key, path) = (&server, &key, format!("{tables}/{table}"));
        async move { call(server, reqwest::Method::PUT, &path, key, Some(body)).await }
    };

    // The storage's own bucket, outside its prefix: every CSV file under the URL.
    let orders_url = format!("s3://{BUCKET}/incoming/orders/");
    let (status, orders) = register("orders", &orders_url, "csv").await;
    assert_eq!(status, 201, "{orders}");
    let orders: Table = typed(&orders);
    assert_eq!((orders.source.as_str(), orders.bytes), (orders_url.as_str(), Some(38)));
    // Another bucket, under the prefix the operator allowed.
    let (status, events) = register("events", "s3://lake/exports/", "ndjson").await;
    assert_eq!(status, 201, "{events}");
    let base = format!("/api/projects/{project}/endpoints");
    let sql = "SELECT (SELECT sum(amount) FROM orders) AS total, (SELECT count(*) FROM events) AS events";
    let body = json!({"name": "both", "query": {"kind": "SQLQuery", "query": sql}});
    assert_eq!(call(&server, reqwest::Method::POST, &format!("{base}/"), &key, Some(body)).await.0, 201);
    let (_, run) = call(&server, reqwest::Method::GET, &format!("{base}/both/run"), &key, None).await;
    assert_eq!(typed::<RunResult>(&run).results, json!([{"total": 8.5, "events": 2}]), "{run}");

    // Outside what is allowed, or the storage's own projects/ area: 400, and no table.
    for url in [
        "s3://lake/private/",
        "s3://other/x/",
        &format!("s3://{BUCKET}/{PREFIX}/projects/{project}/tables/orders/"),
        // The object store decodes what the check once compared as text.
        &format!("s3://{BUCKET}/{PREFIX}/project%73/{project}/tables/orders/"),
        &format!(
            "s3://{BUCKET}/%{:02X}{}/projects/{project}/tables/orders/",
            PREFIX.as_bytes()[0],
            &PREFIX[1..]
        ),
    ] {
        let (status, error) = register("refused", url, "ndjson").await;
        let attr = typed::<ErrorBody>(&error).attr.map(|attr| attr.into_owned());
        assert_eq!((status, attr.as_deref()), (400, Some("source")), "{url}: {error}");
    }
    let (status, _) = call(&server, reqwest::Method::GET, &format!("{tables}/refused"), &key, None).await;
    assert_eq!(status, 404);

    // Deleting a table leaves its files where they are.
    call(&server, reqwest::Method::DELETE, &format!("{base}/both"), &key, None).await;
    assert_eq!(call(&server, reqwest::Method::DELETE, &format!("{tables}/events"), &key, None).await.0, 204);
    let listing =
        client.get(format!("{}/lake?list-type=2&prefix=exports/", moto.endpoint)).send().await.unwrap();
    let listing = listing.text().await.unwrap();
    assert!(listing.contains("<Key>exports/events.ndjson</Key>"), "{listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_on_postgresql_append_to_one_table_in_a_bucket_and_every_row_lands_once() {
    let moto = Moto::start().await;
    let database_url = crate::helpers::postgres_url();
    let dir = Dir::fresh();
    let with_database = |args: &[&str]| -> Vec<String> {
        ["--database-url", database_url.as_str()].iter().chain(args).map(|a| (*a).to_owned()).collect()
    };
    let cli = |args: &[&str]| {
        let args = with_database(args);
        moto.cli(&dir.0, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    cli(&["migrate"]);
    let project = cli(&["project", "create", "--name", "Stream"])["id"].as_i64().unwrap();
    let scopes = [
        "key",
        "create",
        "--project",
        &project.to_string(),
        "--scope",
        "table:write",
        "--scope",
        "endpoint:write",
    ];
    let key = cli(&scopes)["key"].as_str().unwrap().to_owned();
    // Both nodes compact every 100 ms: they take turns through the table's lease.
    let args =
        ["--materialize-workers", "0", "--compaction-interval-ms", "100", "--rate-limit-key-per-sec", "0"];
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let mut command = moto.endpoints();
        command.arg("--database-url").arg(&database_url).stderr(Stdio::null());
        nodes.push(serve_command(command, &dir.0, &args).await);
    }
    let tables: Vec<String> =
        nodes.iter().map(|n| format!("{}/api/projects/{project}/tables/events", n.address)).collect();
    let client = reqwest::Client::new();
    let put = |body: String| {
        client
            .put(&tables[0])
            .bearer_auth(&key)
            .header("Content-Type", "application/x-ndjson")
            .body(body)
            .send()
    };
    assert_eq!(put("{\"id\": 0}\n".into()).await.unwrap().status(), 201);
    // Eight writers, their appends alternating between the nodes, each under a key; a retry of each through
    // the other node adds nothing.
    let mut writers = Vec::new();
    for writer in 0..8_u64 {
        let (client, tables, key) = (client.clone(), tables.clone(), key.clone());
        writers.push(tokio::spawn(async move {
            for n in 0..15_usize {
                let first = 1 + writer * 1000 + n as u64 * 3;
                let body: String = (first..first + 3).map(|id| format!("{{\"id\": {id}}}\n")).collect();
                for node in [n % 2, (n + 1) % 2] {
                    let answer = client
                        .post(format!("{}/rows", tables[node]))
                        .bearer_auth(&key)
                        .header("Content-Type", "application/x-ndjson")
                        .header("Idempotency-Key", format!("w{writer}-{n}"))
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
                }
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let expected = 1 + 8 * 15 * 3;
    let endpoints = format!("{}/api/projects/{project}/endpoints", nodes[1].address);
    let count =
        crate::helpers::endpoint_body("count", "SELECT count(*) AS n, count(DISTINCT id) AS d FROM events");
    let created = client.post(format!("{endpoints}/")).bearer_auth(&key).json(&count).send().await.unwrap();
    assert_eq!(created.status(), 201);
    for node in &nodes {
        let url = format!("{}/api/projects/{project}/endpoints/count/run?refresh=direct", node.address);
        let run: RunResult = typed(&crate::helpers::get_json(&client, &url, &key).await);
        assert_eq!(run.results, json!([{"n": expected, "d": expected}]));
    }
    // Compaction merged the small files in the bucket, and the table still has every row once.
    let compacted = |table: &Table| table.files < Some(8) && table.last_compacted_at.is_some();
    let mut table: Table = typed(&crate::helpers::get_json(&client, &tables[1], &key).await);
    for _ in 0..100 {
        if compacted(&table) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        table = typed(&crate::helpers::get_json(&client, &tables[1], &key).await);
    }
    assert!(compacted(&table), "{table:?}");
    assert_eq!(table.row_count, Some(expected));
    // The compaction's merged files, committed to the table's Delta log in the bucket.
    let keys = moto.keys(&format!("projects/{project}/tables/events/")).await;
    assert!(keys.iter().any(|k| k.contains("/compacted-")), "{keys:?}");
    assert!(keys.iter().any(|k| k.contains("/_delta_log/")), "{keys:?}");
    let url = format!("{}/api/projects/{project}/endpoints/count/run?refresh=direct", nodes[0].address);
    let run: RunResult = typed(&crate::helpers::get_json(&client, &url, &key).await);
    assert_eq!(run.results, json!([{"n": expected, "d": expected}]));
}

#[tokio::test]
async fn run_logs_live_in_the_bucket() {
    let moto = Moto::start().await;
    let (dir, project, key) = moto.project_with_sales();
    let mut command = moto.endpoints();
    command.stderr(Stdio::null());
    let server = serve_command(command, &dir.0, &["--log-flush-ms", "100", "--workers", "1"]).await;
    let base = format!("/api/projects/{project}/endpoints");
    let body = crate::helpers::endpoint_body("total", "SELECT count(*) AS n FROM sales");
    assert_eq!(call(&server, reqwest::Method::POST, &format!("{base}/"), &key, Some(body)).await.0, 201);
    for _ in 0..3 {
        assert_eq!(
            call(&server, reqwest::Method::GET, &format!("{base}/total/run"), &key, None).await.0,
            200
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let logged = loop {
        let (status, page) =
            call(&server, reqwest::Method::GET, &format!("{base}/total/logs"), &key, None).await;
        assert_eq!(status, 200, "{page}");
        let page: LogList = typed(&page);
        if page.results.len() >= 3 || Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(logged.results.len(), 3, "{logged:?}");
    // The records are Parquet files in the bucket, under the project's prefix.
    let files = moto.keys(&format!("projects/{project}/logs/")).await;
    assert!(!files.is_empty() && files.iter().all(|k| k.ends_with(".parquet")), "{files:?}");
    // And the project's `_logs` reads them there.
    let count =
        crate::helpers::endpoint_body("runs", "SELECT count(*) AS n FROM _logs WHERE endpoint = 'total'");
    assert_eq!(call(&server, reqwest::Method::POST, &format!("{base}/"), &key, Some(count)).await.0, 201);
    let (_, runs) =
        call(&server, reqwest::Method::GET, &format!("{base}/runs/run?refresh=direct"), &key, None).await;
    assert_eq!(typed::<RunResult>(&runs).results, json!([{"n": 3}]), "{runs}");
}
