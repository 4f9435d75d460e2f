//! Starting the application on a fresh data directory and talking to it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use http_actix::api::{Endpoint, Materialization};
pub use http_actix::ErrorBody;
use reqwest::{Method, RequestBuilder, Response};
use serde_json::{json, Value};
use server::{Application, Config};
use tokio::sync::oneshot;

pub const FAMILIES: [&str; 2] = ["/api/environments", "/api/projects"];

/// A running application and what a test needs to talk to it.
pub struct TestApp {
    pub address: String,
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    pub stopped: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    /// A stopped app leaves its directory for `respawn`; a running one removes it when dropped.
    remove_dir: bool,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if self.remove_dir {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

/// A stopped app's data directory, removed when dropped (a failing test's too), for tests that go on with
/// `endpoints serve` processes over it. Declared before those processes, it outlives them.
pub struct DataDir(pub PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for DataDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for DataDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

fn fresh_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("endpoints-api-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The application on its embedded SQLite database, in a fresh data directory: `TestApp::builder().spawn()`.
pub async fn spawn_app() -> TestApp {
    TestApp::builder().spawn().await
}

pub fn postgres_url() -> String {
    std::env::var("TEST_POSTGRES_URL").expect(
        "TEST_POSTGRES_URL must name a throwaway PostgreSQL database; `make test` starts one and sets it",
    )
}

/// How a test's server is made, the one way every test makes one (as the Rust registry's test utilities
/// build theirs): on SQLite in a fresh data directory unless told otherwise.
#[must_use = "a builder spawns nothing until `spawn`"]
pub struct Spawn<'a> {
    database_url: Option<String>,
    data_dir: Option<PathBuf>,
    /// Whether the data directory is another running app's, which that app removes.
    shared: bool,
    tune: Box<dyn FnOnce(&mut Config) + 'a>,
}

impl<'a> Spawn<'a> {
    /// On the PostgreSQL database `make test` provides (migrated through the CLI first).
    pub fn on_postgres(self) -> Self {
        self.on_database(postgres_url())
    }

    /// On the PostgreSQL database at `url` (for example through a proxy a test controls).
    pub fn on_database(mut self, url: String) -> Self {
        self.database_url = Some(url);
        self
    }

    /// Over the data directory (and database) of a stopped app.
    pub fn over(mut self, data_dir: PathBuf) -> Self {
        self.data_dir = Some(data_dir);
        self
    }

    /// Another node of `app`: its PostgreSQL database and data directory.
    pub fn node_of(mut self, app: &TestApp) -> Self {
        self.database_url.clone_from(&app.database_url);
        self.data_dir = Some(app.data_dir.clone());
        self.shared = true;
        self
    }

    /// With the configuration adjusted by `tune`.
    pub fn tuned(mut self, tune: impl FnOnce(&mut Config) + 'a) -> Self {
        self.tune = Box::new(tune);
        self
    }

    pub async fn spawn(self) -> TestApp {
        let data_dir = self.data_dir.unwrap_or_else(fresh_dir);
        let mut app = spawn_with(self.database_url, data_dir, self.tune).await;
        app.remove_dir = !self.shared;
        app
    }
}

impl TestApp {
    /// A builder of a test's server.
    pub fn builder<'a>() -> Spawn<'a> {
        Spawn { database_url: None, data_dir: None, shared: false, tune: Box::new(|_| {}) }
    }
}

async fn spawn_with(
    database_url: Option<String>,
    data_dir: PathBuf,
    tune: impl FnOnce(&mut Config),
) -> TestApp {
    let mut config = Config::new(&data_dir);
    config.bind = "127.0.0.1:0".into();
    config.workers = 2;
    config.database_url.clone_from(&database_url);
    if database_url.is_some() {
        // Tests share one PostgreSQL database but not their data directories: only a test about refreshes
        // turns a node's materialization worker on, so no node refreshes another test's endpoints.
        config.worker.parallelism = 0;
    }
    tune(&mut config);
    let partial = TestApp {
        address: String::new(),
        data_dir: data_dir.clone(),
        database_url: database_url.clone(),
        // Idle connections are dropped before the server's keep-alive (5 s) closes them: a request after a long
        // pause (a CLI import under load) would otherwise go out on a connection the server is closing.
        client: reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(2))
            .build()
            .expect("a client with no TLS settings builds"),
        shutdown: None,
        stopped: None,
        remove_dir: false,
    };
    if database_url.is_some() {
        partial.cli(&["migrate"]);
    }
    let app = Application::build(&config).expect("the application starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    let (tx, rx) = oneshot::channel::<()>();
    let stopped = tokio::spawn(app.run_until(async {
        let _ = rx.await;
    }));
    TestApp {
        address,
        data_dir,
        database_url,
        client: partial.client.clone(),
        shutdown: Some(tx),
        stopped: Some(stopped),
        remove_dir: true,
    }
}

impl TestApp {
    /// Runs the real binary against this app's data directory and database; returns its stdout as JSON.
    pub fn cli(&self, args: &[&str]) -> Value {
        let output = self.cli_raw(args);
        assert!(
            output.status.success(),
            "endpoints {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!("endpoints {args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&output.stdout))
        })
    }

    pub fn cli_raw(&self, args: &[&str]) -> std::process::Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_endpoints"));
        command.arg("--data-dir").arg(&self.data_dir).arg("--json").args(args).env_remove("DATABASE_URL");
        if let Some(url) = &self.database_url {
            command.arg("--database-url").arg(url);
        }
        command.output().expect("the endpoints binary runs")
    }

    pub fn create_project(&self) -> i64 {
        self.cli(&["project", "create", "--name", "Test"])["id"].as_i64().unwrap()
    }

    /// A new key for `project` with the given scopes; returns (id, secret).
    pub fn create_key(&self, project: i64, scopes: &[&str]) -> (String, String) {
        let project = project.to_string();
        let mut args = vec!["key", "create", "--project", project.as_str()];
        for scope in scopes {
            args.extend(["--scope", scope]);
        }
        let key = self.cli(&args);
        (key["id"].as_str().unwrap().to_owned(), key["key"].as_str().unwrap().to_owned())
    }

    /// A project with a read-write key.
    pub fn project_with_key(&self) -> (i64, String) {
        let project = self.create_project();
        let (_, secret) = self.create_key(project, &["endpoint:write"]);
        (project, secret)
    }

    pub fn request(&self, method: Method, path: &str, key: Option<&str>) -> RequestBuilder {
        let builder = self.client.request(method, format!("{}{path}", self.address));
        match key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    pub async fn get(&self, path: &str, key: &str) -> Response {
        self.request(Method::GET, path, Some(key)).send().await.unwrap()
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Response {
        self.request(Method::POST, path, Some(key)).json(body).send().await.unwrap()
    }

    pub async fn patch(&self, path: &str, key: &str, body: &Value) -> Response {
        self.request(Method::PATCH, path, Some(key)).json(body).send().await.unwrap()
    }

    pub async fn delete(&self, path: &str, key: &str) -> Response {
        self.request(Method::DELETE, path, Some(key)).send().await.unwrap()
    }

    /// Creates an endpoint and returns its record, asserting 201.
    pub async fn create_endpoint(&self, project: i64, key: &str, body: &Value) -> Endpoint {
        let response = self.post(&format!("/api/projects/{project}/endpoints/"), key, body).await;
        assert_eq!(response.status(), 201, "create failed");
        response.json().await.unwrap()
    }

    /// An endpoint's record, asserting 200.
    pub async fn endpoint(&self, project: i64, key: &str, name: &str) -> Endpoint {
        let response = self.get(&format!("/api/projects/{project}/endpoints/{name}"), key).await;
        assert_eq!(response.status(), 200, "reading {name} failed");
        response.json().await.unwrap()
    }

    /// An update of an endpoint, answered with its record (asserting 200).
    pub async fn update_endpoint(&self, project: i64, key: &str, name: &str, body: &Value) -> Endpoint {
        let response = self.patch(&format!("/api/projects/{project}/endpoints/{name}"), key, body).await;
        assert_eq!(response.status(), 200, "updating {name} failed");
        response.json().await.unwrap()
    }

    /// Stops the server gracefully and waits for it. The data directory stays, for `respawn`.
    pub async fn stop(mut self) -> std::io::Result<()> {
        self.remove_dir = false;
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.stopped.take().unwrap().await.unwrap()
    }
}

pub const SALES: &str = "\
id,country,amount,quantity,day,at,vip
1,US,10.5,1,2026-01-01,2026-01-01T08:00:00,true
2,US,20.25,2,2026-01-02,2026-01-02T09:30:00,false
3,FR,5,3,2026-01-03,2026-01-03T10:00:00,true
4,O'Brien,7.75,4,2026-01-04,2026-01-04T11:00:00,false
5,DE,100,5,2026-01-05,2026-01-05T12:00:00,true
6,Ünïcødé,1,6,2026-01-06,2026-01-06T13:00:00,false
";

/// A project with a read-write key and the `sales` table loaded through the real CLI.
pub fn project_with_sales(app: &TestApp) -> (i64, String) {
    let (project, key) = app.project_with_key();
    let file = app.data_dir.join(format!("sales-{project}.csv"));
    std::fs::write(&file, SALES).unwrap();
    let report = app.cli(&[
        "data",
        "import",
        "--project",
        &project.to_string(),
        "--table",
        "sales",
        file.to_str().unwrap(),
    ]);
    assert_eq!(report["rows"], 6);
    (project, key)
}

pub fn endpoint_body(name: &str, sql: &str) -> Value {
    json!({"name": name, "query": {"kind": "SQLQuery", "query": sql}})
}

/// Asserts an error response's status and body shape, and returns the body.
/// What no error body may say (contract section 21): where the server keeps its data (every test's data
/// directory is under a directory named so), the engine's plan text, or DataFusion's own internals.
const NEVER_IN_AN_ERROR: [&str; 6] =
    ["endpoints-api-", "/staging/", "Placeholder", "Cast {", "data_type:", "bug in DataFusion"];

pub async fn assert_error(response: Response, status: u16, kind: &str) -> ErrorBody<'static> {
    assert_error_quoting(response, status, kind, "").await
}

/// [`assert_error`] for a request that itself names `quoted` (a path in a hostile query, say), which its error
/// may quote back.
pub async fn assert_error_quoting(
    response: Response,
    status: u16,
    kind: &str,
    quoted: &str,
) -> ErrorBody<'static> {
    assert_eq!(response.status(), status, "unexpected status");
    let text = response.text().await.unwrap();
    let body: ErrorBody =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not an error body ({e}): {text}"));
    assert_eq!(serde_json::to_value(body.kind).unwrap(), kind, "{text}");
    assert!(
        serde_json::from_str::<Value>(&text).unwrap().get("attr").is_some(),
        "attr is always said: {text}"
    );
    let text = if quoted.is_empty() { text } else { text.replace(quoted, "") };
    for internal in NEVER_IN_AN_ERROR {
        assert!(!text.contains(internal), "an error body shows {internal}: {text}");
    }
    body
}

/// A real `endpoints serve` process on a port of its own, on the embedded database of `data_dir`. Killed
/// (SIGKILL) when dropped.
pub struct ServeProcess {
    pub child: Child,
    pub address: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `endpoints` binary as a command whose files may not grow past `max_kib` KiB: a write past it fails as
/// it would on a full disk (EFBIG, with the signal that would kill the process ignored).
pub fn endpoints_with_file_limit(max_kib: u64) -> Command {
    let mut command = Command::new("bash");
    command.args([
        "-c",
        &format!("ulimit -f {max_kib}; trap '' XFSZ; exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_endpoints"),
    ]);
    command
}

/// Starts `endpoints serve` with `args` and waits until it answers.
pub async fn serve_process(data_dir: &std::path::Path, args: &[&str]) -> ServeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_endpoints"));
    command.stderr(Stdio::null());
    serve_command(command, data_dir, args).await
}

/// `serve_process` from a prepared command (for example one with a file size limit, or one whose logs a test
/// reads: output not redirected by the command is discarded).
pub async fn serve_command(command: Command, data_dir: &std::path::Path, args: &[&str]) -> ServeProcess {
    serve_command_on(command, data_dir, None, args).await
}

/// [`serve_command`] on `port` (a free one when `None`).
pub async fn serve_command_on(
    mut command: Command,
    data_dir: &std::path::Path,
    port: Option<u16>,
    args: &[&str],
) -> ServeProcess {
    let port = port
        .unwrap_or_else(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let child = command
        .arg("--data-dir")
        .arg(data_dir)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .args(args)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .spawn()
        .expect("the endpoints binary starts");
    let server = ServeProcess { child, address: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + Duration::from_secs(30);
    while reqwest::get(format!("{}/healthz", server.address)).await.is_err() {
        assert!(Instant::now() < deadline, "the server never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
}

/// A body as the API's type of it (the body in the message when it is not one).
pub fn typed<T: serde::de::DeserializeOwned>(body: &Value) -> T {
    serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// GET `url` with `key` from outside a `TestApp` (a `serve` process), as JSON.
pub async fn get_json(client: &reqwest::Client, url: &str, key: &str) -> Value {
    let response = client.get(url).bearer_auth(key).send().await.expect("the server answers");
    response.json().await.expect("a JSON answer")
}

/// The materialization status at `url` (a server's `.../materialization_status`), as the API's own type.
pub async fn get_status(client: &reqwest::Client, url: &str, key: &str) -> Materialization {
    let response = client.get(url).bearer_auth(key).send().await.expect("the server answers");
    response.json().await.expect("a materialization status")
}
