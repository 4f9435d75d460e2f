//! Two `serve` nodes on one PostgreSQL database and one table storage (an S3 bucket on moto, or a shared local
//! directory), written through both at once for 30 s: appends under idempotency keys, replaces of another table,
//! compactions every 100 ms on both nodes, runs reading both tables, and a SIGKILL of each node in turn. On S3,
//! one node's storage requests are slowed (a second per `PUT`, as a slow bucket would), which widens every window
//! between reading a table's log and committing to it. Afterwards every acknowledged append is in the table
//! exactly once, every append sent without an answer is taken once when retried with its key, and the replaced
//! table holds exactly one replace's rows: it did at every read in between.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_actix::api::{Appended, RunResult, Table};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use crate::helpers::{endpoint_body, get_json, postgres_url, serve_command_on, typed, ServeProcess};
use crate::storage::{Dir, Moto};

/// How long both nodes are written through.
const WRITE_FOR: Duration = Duration::from_secs(30);

/// How long each `PUT` to the bucket waits on the slowed node.
const SLOW_PUT: Duration = Duration::from_secs(1);

/// The rows each replace of `snap` writes.
const SNAP_ROWS: u64 = 3;

/// A TCP proxy in front of an S3 server that holds each request starting with `PUT ` for `delay` before passing
/// it on (requests on one connection are sequential, so a chunk that starts one is its head), counting them in
/// `slowed`. Answers its port.
async fn slow_puts(upstream: String, delay: Duration, slowed: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, slowed) = (upstream.clone(), Arc::clone(&slowed));
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else { return };
                let (mut from_client, mut to_server) = (client.into_split(), server.into_split());
                let answers = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut to_server.0, &mut from_client.1).await;
                });
                let mut buf = vec![0_u8; 64 * 1024];
                loop {
                    let read = match from_client.0.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(read) => read,
                    };
                    if buf[..read].starts_with(b"PUT ") {
                        slowed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(delay).await;
                    }
                    if to_server.1.write_all(&buf[..read]).await.is_err() {
                        break;
                    }
                }
                answers.abort();
            });
        }
    });
    port
}

/// Where the two nodes keep their tables.
enum Shared {
    /// One local directory (the SQLite-free data directory both are started on).
    Directory,
    /// A bucket on moto, the second node through a proxy that slows its `PUT`s.
    Bucket { moto: Moto, slowed_endpoint: String, slowed: Arc<AtomicUsize> },
}

impl Shared {
    async fn bucket() -> Self {
        let moto = Moto::start().await;
        let upstream = moto.endpoint().trim_start_matches("http://").to_owned();
        let slowed = Arc::new(AtomicUsize::new(0));
        let port = slow_puts(upstream, SLOW_PUT, Arc::clone(&slowed)).await;
        Self::Bucket { moto, slowed_endpoint: format!("http://127.0.0.1:{port}"), slowed }
    }

    /// `endpoints` for node `node` (0 or 1) on the shared storage and `database_url`.
    fn endpoints(&self, node: usize, database_url: &str) -> Command {
        let mut command = match self {
            Self::Directory => Command::new(env!("CARGO_BIN_EXE_endpoints")),
            Self::Bucket { moto, slowed_endpoint, .. } => {
                let mut command = moto.endpoints();
                if node == 1 {
                    command.env("AWS_ENDPOINT_URL", slowed_endpoint);
                }
                command
            }
        };
        command.arg("--database-url").arg(database_url).env_remove("DATABASE_URL");
        command
    }

    fn cli(&self, dir: &Dir, database_url: &str, args: &[&str]) -> Value {
        let output =
            self.endpoints(0, database_url).arg("--data-dir").arg(&dir.0).arg("--json").args(args).output();
        let output = output.unwrap();
        assert!(output.status.success(), "endpoints {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// Starts node `node`, on `port` if given (a restarted node keeps its address).
    async fn serve(&self, node: usize, dir: &Dir, database_url: &str, port: Option<u16>) -> ServeProcess {
        let args = [
            "--materialize-workers",
            "0",
            "--compaction-interval-ms",
            "100",
            "--append-in-flight-secs",
            "1",
            "--materialize-lease-secs",
            "3",
            "--rate-limit-key-per-sec",
            "0",
            "--rate-limit-project-per-sec",
            "0",
        ];
        let mut command = self.endpoints(node, database_url);
        command.stderr(Stdio::null());
        serve_command_on(command, &dir.0, port, &args).await
    }
}

/// An append of 5 ids from `first`, as NDJSON.
fn ids(first: u64) -> String {
    (first..first + 5).map(|id| format!("{{\"id\": {id}}}\n")).collect()
}

/// A replace of `snap` by the replace numbered `put`.
fn snap(put: u64) -> String {
    (0..SNAP_ROWS).map(|i| format!("{{\"put\": {put}, \"i\": {i}}}\n")).collect()
}

/// What the writers saw: each write acknowledged, or sent without an answer (a node killed, or restarting).
#[derive(Default)]
struct Seen {
    appended: Vec<(String, u64)>,
    unanswered: Vec<(String, u64)>,
    replaced: Vec<u64>,
    replaces_unanswered: Vec<u64>,
    /// What each append without an answer got instead.
    failures: Vec<String>,
    /// Each answer of a run of `snap`: the rows, distinct replaces and the replace read.
    snapshots: Vec<Value>,
}

struct Cluster {
    shared: Shared,
    dir: Dir,
    database_url: String,
    nodes: Mutex<[Option<ServeProcess>; 2]>,
    addresses: [String; 2],
    project: i64,
    key: String,
    client: reqwest::Client,
}

impl Cluster {
    async fn start(shared: Shared) -> Arc<Self> {
        let (dir, database_url) = (Dir::fresh(), postgres_url());
        shared.cli(&dir, &database_url, &["migrate"]);
        let project =
            shared.cli(&dir, &database_url, &["project", "create", "--name", "Stress"])["id"].as_i64();
        let project = project.unwrap();
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
        let key = shared.cli(&dir, &database_url, &scopes)["key"].as_str().unwrap().to_owned();
        let first = shared.serve(0, &dir, &database_url, None).await;
        let second = shared.serve(1, &dir, &database_url, None).await;
        let addresses = [first.address.clone(), second.address.clone()];
        Arc::new(Self {
            shared,
            dir,
            database_url,
            nodes: Mutex::new([Some(first), Some(second)]),
            addresses,
            project,
            key,
            client: reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap(),
        })
    }

    fn table(&self, node: usize, name: &str) -> String {
        format!("{}/api/projects/{}/tables/{name}", self.addresses[node], self.project)
    }

    /// Sends NDJSON to `url`; the status, or `None` without an answer.
    async fn send(&self, request: reqwest::RequestBuilder, body: String) -> Option<(u16, Value)> {
        let sent = request
            .bearer_auth(&self.key)
            .header("Content-Type", "application/x-ndjson")
            .body(body)
            .send()
            .await
            .ok()?;
        let status = sent.status().as_u16();
        Some((status, sent.json().await.unwrap_or(Value::Null)))
    }

    fn endpoints(&self, node: usize) -> String {
        format!("{}/api/projects/{}/endpoints", self.addresses[node], self.project)
    }

    /// SIGKILLs node `node`, whatever it is doing, and starts it again at the same address.
    async fn kill_and_restart(&self, node: usize) {
        let mut nodes = self.nodes.lock().await;
        if let Some(mut process) = nodes[node].take() {
            process.child.kill().unwrap();
            process.child.wait().unwrap();
        }
        let port = self.addresses[node].rsplit(':').next().unwrap().parse().unwrap();
        nodes[node] = Some(self.shared.serve(node, &self.dir, &self.database_url, Some(port)).await);
    }
}

async fn stress(shared: Shared) {
    let cluster = Cluster::start(shared).await;
    let created = cluster.send(cluster.client.put(cluster.table(0, "events")), "{\"id\": 0}\n".into()).await;
    assert_eq!(created.map(|(status, _)| status), Some(201));
    let created = cluster.send(cluster.client.put(cluster.table(1, "snap")), snap(0)).await;
    assert_eq!(created.map(|(status, _)| status), Some(201));
    let endpoints = |node: usize| cluster.endpoints(node);
    let query = "SELECT count(*) AS n, count(DISTINCT put) AS d, min(put) AS put FROM snap";
    let made = cluster.client.post(format!("{}/", endpoints(0))).bearer_auth(&cluster.key);
    assert_eq!(made.json(&endpoint_body("snap", query)).send().await.unwrap().status(), 201);

    let seen = Arc::new(Mutex::new(Seen::default()));
    let deadline = Instant::now() + WRITE_FOR;
    let mut tasks = Vec::new();
    // Appenders: 5 ids at a time, two through each node (one through the slowed node would wait on it all
    // along), each under a key of its own.
    for writer in 0..4_u64 {
        let (cluster, seen) = (Arc::clone(&cluster), Arc::clone(&seen));
        tasks.push(tokio::spawn(async move {
            for n in 0_u64.. {
                if Instant::now() >= deadline {
                    break;
                }
                let (key, first) = (format!("w{writer}-{n}"), 1 + writer * 10_000_000 + n * 5);
                let node = usize::try_from(writer % 2).unwrap();
                let request = cluster
                    .client
                    .post(format!("{}/rows", cluster.table(node, "events")))
                    .header("Idempotency-Key", &key);
                match cluster.send(request, ids(first)).await {
                    Some((200, answer)) => {
                        assert_eq!(typed::<Appended>(&answer).rows_added, 5, "{answer}");
                        seen.lock().await.appended.push((key, first));
                    }
                    Some((status, answer)) if status < 500 && status != 409 => {
                        panic!("append {key}: {status} {answer}")
                    }
                    other => {
                        let mut seen = seen.lock().await;
                        seen.failures.push(
                            other.map_or_else(|| "no answer".into(), |(s, a)| format!("{s} {}", a["detail"])),
                        );
                        seen.unanswered.push((key, first));
                        drop(seen);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    // Replacers: one per node, each replace of `snap` numbered.
    for replacer in 0..2_u64 {
        let (cluster, seen) = (Arc::clone(&cluster), Arc::clone(&seen));
        tasks.push(tokio::spawn(async move {
            for n in 1_u64.. {
                if Instant::now() >= deadline {
                    break;
                }
                let put = n * 2 + replacer;
                let node = usize::try_from(replacer).unwrap();
                match cluster.send(cluster.client.put(cluster.table(node, "snap")), snap(put)).await {
                    Some((200, _)) => seen.lock().await.replaced.push(put),
                    Some((status, answer)) if status < 500 && status != 409 => {
                        panic!("replace {put}: {status} {answer}")
                    }
                    _ => seen.lock().await.replaces_unanswered.push(put),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    // A reader of `snap` through both nodes.
    {
        let (cluster, seen) = (Arc::clone(&cluster), Arc::clone(&seen));
        tasks.push(tokio::spawn(async move {
            for n in 0_usize.. {
                if Instant::now() >= deadline {
                    break;
                }
                let url = format!("{}/snap/run?refresh=direct", cluster.endpoints(n % 2));
                if let Ok(answer) = cluster.client.get(&url).bearer_auth(&cluster.key).send().await {
                    let status = answer.status().as_u16();
                    let body: Value = answer.json().await.unwrap_or(Value::Null);
                    assert!(status == 200 || status == 503, "a run of snap: {status} {body}");
                    if status == 200 {
                        seen.lock().await.snapshots.push(typed::<RunResult>(&body).results[0].clone());
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    // Each node is killed once, a third and two thirds of the way through.
    tokio::time::sleep(WRITE_FOR / 3).await;
    cluster.kill_and_restart(1).await;
    tokio::time::sleep(WRITE_FOR / 3).await;
    cluster.kill_and_restart(0).await;
    for task in tasks {
        task.await.unwrap();
    }

    let seen = seen.lock().await;
    assert!(
        seen.appended.len() >= 40 && seen.replaced.len() >= 10,
        "{} appends, {} replaces",
        seen.appended.len(),
        seen.replaced.len()
    );
    // Every read of `snap` saw one replace's rows, whole.
    assert!(seen.snapshots.len() >= 20, "{} reads", seen.snapshots.len());
    for read in &seen.snapshots {
        assert_eq!((read["n"].as_u64(), read["d"].as_u64()), (Some(SNAP_ROWS), Some(1)), "{read}");
    }
    // Appends sent without an answer are retried with their keys, through either node: each is taken once.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (i, (key, first)) in seen.unanswered.iter().enumerate() {
        let url = format!("{}/rows", cluster.table(i % 2, "events"));
        let mut tries = 0;
        loop {
            let request = cluster.client.post(&url).header("Idempotency-Key", key);
            match cluster.send(request, ids(*first)).await {
                Some((200, answer)) => {
                    assert_eq!(typed::<Appended>(&answer).rows_added, 5, "{key}: {answer}");
                    break;
                }
                other => {
                    tries += 1;
                    assert!(tries < 50, "the retry of {key} was not taken: {other:?}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    let expected = 1 + 5 * (seen.appended.len() + seen.unanswered.len()) as u64;
    let count = endpoint_body("count", "SELECT count(*) AS n, count(DISTINCT id) AS d FROM events");
    let made = cluster.client.post(format!("{}/", endpoints(1))).bearer_auth(&cluster.key).json(&count);
    assert_eq!(made.send().await.unwrap().status(), 201);
    for node in 0..2 {
        let url = format!("{}/count/run?refresh=direct", endpoints(node));
        let run: RunResult = typed(&get_json(&cluster.client, &url, &cluster.key).await);
        assert_eq!(run.results, json!([{"n": expected, "d": expected}]), "node {node}");
        // `snap` is one replace's rows, one that was sent.
        let url = format!("{}/snap/run?refresh=direct", endpoints(node));
        let run: RunResult = typed(&get_json(&cluster.client, &url, &cluster.key).await);
        let read = &run.results[0];
        assert_eq!((read["n"].as_u64(), read["d"].as_u64()), (Some(SNAP_ROWS), Some(1)), "{read}");
        let put = read["put"].as_u64().unwrap();
        assert!(
            seen.replaced.contains(&put) || seen.replaces_unanswered.contains(&put),
            "{put} was never sent"
        );
    }
    if let Shared::Bucket { slowed, .. } = &cluster.shared {
        assert!(slowed.load(Ordering::Relaxed) >= 20, "the slowed node wrote through the proxy");
    }
    eprintln!(
        "{} appends acknowledged, {} sent without an answer and retried, {} replaces, {} reads of snap",
        seen.appended.len(),
        seen.unanswered.len(),
        seen.replaced.len(),
        seen.snapshots.len()
    );
    let mut failures = std::collections::BTreeMap::<&str, usize>::new();
    for failure in &seen.failures {
        *failures.entry(failure.as_str()).or_default() += 1;
    }
    eprintln!("appends without an answer: {failures:?}");
    // The compactions kept up on both nodes' appends.
    let table: Table = typed(&get_json(&cluster.client, &cluster.table(0, "events"), &cluster.key).await);
    assert_eq!(table.row_count, Some(expected), "{table:?}");
    assert!(table.last_compacted_at.is_some(), "{table:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_on_one_bucket_one_slowed_and_each_killed_lose_and_repeat_no_acknowledged_row() {
    stress(Shared::bucket().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_on_one_directory_each_killed_lose_and_repeat_no_acknowledged_row() {
    stress(Shared::Directory).await;
}
