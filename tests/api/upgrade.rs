//! A data directory written by the release before tables were Delta tables (`tests/fixtures/previous-release/`,
//! written by `tests/fixtures/previous_release.py`: a CLI import, a table replaced, appended to, compacted and
//! quarantined over HTTP, a materialized rollup) is migrated in place and answers as that release did. It is
//! served on a clock set to when the fixture was written: a day later its stored result is no longer fresh, a
//! week later its rollup hibernates, and neither may depend on the day the test runs.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use domain::testing::ManualClock;
use http_actix::api::{RunResult, Table, TableVersionPage};
use serde_json::{json, Value};

use crate::helpers::{get_json, get_status, typed, DataDir, TestApp};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Every file under `dir`, as paths relative to it.
fn files(dir: &Path) -> Vec<String> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                all.push(entry.path().strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_the_release_before_delta_tables_is_migrated_and_answers_the_same() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/previous-release");
    let data_dir =
        DataDir(std::env::temp_dir().join(format!("endpoints-api-upgrade-{}", uuid::Uuid::new_v4())));
    copy_dir(&fixture, &data_dir);
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(data_dir.join("answers.json")).unwrap()).unwrap();
    let (project, key) =
        (recorded["project"].as_i64().unwrap(), recorded["key"].as_str().unwrap().to_owned());
    let tables = data_dir.join(format!("projects/{project}/tables"));
    assert!(tables.join("events/_current").exists(), "the fixture is of the earlier layout");

    let migrate = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_endpoints"))
            .arg("--data-dir")
            .arg(&*data_dir)
            .args(["--json", "migrate"])
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let first = migrate(&[]);
    let mut converted: Vec<&str> =
        first["tables_converted"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    converted.sort_unstable();
    let expected: Vec<String> =
        ["events", "events_quarantine", "sales"].iter().map(|t| format!("{project}/{t}")).collect();
    assert_eq!(converted, expected.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(migrate(&[])["tables_converted"], json!([]), "converted once");
    for table in ["events", "events_quarantine", "sales"] {
        let left = files(&tables.join(table));
        assert!(left.iter().any(|f| f.starts_with("_delta_log/")), "{table}: {left:?}");
        assert!(
            !left.iter().any(|f| f == "_current" || f.ends_with("_sealed") || f.ends_with("_compacted")),
            "{left:?}"
        );
    }

    let written_at = time::OffsetDateTime::parse(
        recorded["written_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new(written_at));
    let server = TestApp::builder()
        .over(data_dir.to_path_buf())
        .tuned(|config| {
            config.worker.poll = Duration::from_millis(50);
            config.compaction_interval = None;
            config.clock = server::ServiceClock(clock.clone());
        })
        .spawn()
        .await;
    let client = server.client.clone();
    let base = format!("{}/api/projects/{project}", server.address);
    let run = |name: &str, refresh: &str| {
        let url = format!("{base}/endpoints/{name}/run?refresh={refresh}&limit=1000");
        let (client, key) = (client.clone(), key.clone());
        async move { typed::<RunResult>(&get_json(&client, &url, &key).await) }
    };
    for (name, rows) in recorded["answers"].as_object().unwrap() {
        if name == "rollup-stored" {
            continue;
        }
        assert_eq!(&run(name, "direct").await.results, rows, "{name} answers as before the upgrade");
    }
    // The stored result of the earlier release is still served.
    let stored = run("rollup", "blocking").await;
    assert!(stored.computed.endpoint_materialized, "{stored:?}");
    assert_eq!(stored.results, recorded["answers"]["rollup-stored"]);
    let events: Table = typed(&get_json(&client, &format!("{base}/tables/events"), &key).await);
    assert_eq!(events.row_count, Some(35), "{events:?}");

    // Written to again: an append lands, and the stored result follows it (computed again in full once, since it
    // named a version of the earlier layout).
    let appended = client
        .post(format!("{base}/tables/events/rows"))
        .bearer_auth(&key)
        .header("Content-Type", "application/x-ndjson")
        .body("{\"id\": 100, \"country\": \"US\", \"amount\": 1000.0}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 200, "{}", appended.text().await.unwrap());
    let live = run("rollup", "direct").await.results;
    assert_ne!(live, recorded["answers"]["rollup"], "the appended row is in the live answer");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = run("rollup", "blocking").await;
        if answer.computed.endpoint_materialized && answer.results == live {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stored result never followed the append: {answer:?} vs {live}"
        );
        // Past the endpoint's freshness of one second, on the service's clock.
        clock.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let versions: TableVersionPage =
        typed(&get_json(&client, &format!("{base}/tables/events/versions"), &key).await);
    assert_eq!(versions.count, 2, "the converted version and the append: {versions:?}");
    // Its refreshes since say how appended rows reach it, which that release did not record.
    let status_url = format!("{base}/endpoints/rollup/materialization_status");
    let status = get_status(&client, &status_url, &key).await;
    assert_eq!(
        (status.fold.as_deref(), status.fold_reason.as_deref()),
        (Some("incremental"), None),
        "{status:?}"
    );
    drop(server);
}
