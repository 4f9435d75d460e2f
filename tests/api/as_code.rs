//! Endpoints as code: `pull`, `diff`, `push` and `test` of the real binary against a real server, over its
//! public API only.

use std::path::Path;
use std::process::Output;

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::*;

/// `endpoints <command> --url .. --project .. --dir ..` with the key from the environment, waited for off the
/// test's runtime (which serves the app).
async fn code(app: &TestApp, project: i64, key: &str, dir: &Path, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"));
    command
        .arg(args[0])
        .args(["--url", &app.address, "--project", &project.to_string()])
        .arg("--dir")
        .arg(dir)
        .args(&args[1..])
        .env("ENDPOINTS_API_KEY", key)
        .env_remove("ENDPOINTS_URL");
    tokio::task::spawn_blocking(move || command.output().expect("the endpoints binary runs")).await.unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Asserts the exit status, showing what the command printed when it is not the one expected.
fn status(output: &Output, expected: i32) -> String {
    let text = stdout(output);
    assert_eq!(
        output.status.code(),
        Some(expected),
        "stdout: {text}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap()
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(dir.join(file).parent().unwrap()).unwrap();
    std::fs::write(dir.join(file), text).unwrap();
}

async fn endpoint(app: &TestApp, project: i64, key: &str, name: &str) -> reqwest::Response {
    app.request(Method::GET, &format!("/api/projects/{project}/endpoints/{name}"), Some(key))
        .send()
        .await
        .unwrap()
}

async fn version_of(app: &TestApp, project: i64, key: &str, name: &str) -> (u32, String) {
    let body: Endpoint = endpoint(app, project, key, name).await.json().await.unwrap();
    (body.current_version, body.description)
}

/// Pull, edit, diff, dry run, push, a second push, a breaking edit with and without `--confirm-breaking`,
/// `--prune`, and `test` passing and failing with a JUnit report: each with the exit status a CI job reads.
#[tokio::test]
async fn a_folder_is_pulled_diffed_pushed_pruned_and_tested() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let by_country = json!({
        "name": "by-country",
        "description": "Sales of one country",
        "query": {"kind": "SQLQuery",
                  "query": "SELECT country, sum(amount) AS total\nFROM sales\nWHERE country = {variables.c}\nGROUP BY country",
                  "variables": {"c": {"type": "String", "default": "US", "description": "A country"}}},
    });
    for body in [by_country, endpoint_body("all-sales", "SELECT id, amount FROM sales ORDER BY id")] {
        let created =
            app.request(Method::POST, &format!("/api/projects/{project}/endpoints"), Some(&key)).json(&body);
        assert_eq!(created.send().await.unwrap().status(), 201);
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    // pull: one file each, the SQL as a literal block; a second pull writes the same bytes.
    let pulled = status(&code(&app, project, &key, dir, &["pull"]).await, 0);
    assert!(pulled.contains("pulled 2 endpoint(s), 2 file(s) written"), "{pulled}");
    let file = read(dir, "endpoints/by-country.yaml");
    assert_eq!(
        file,
        "name: by-country\ndescription: Sales of one country\nquery: |-\n  SELECT country, sum(amount) AS total\n  \
         FROM sales\n  WHERE country = {variables.c}\n  GROUP BY country\nvariables:\n  c:\n    type: String\n    \
         default: US\n    description: A country\nis_active: true\nis_materialized: false\n"
    );
    let again = status(&code(&app, project, &key, dir, &["pull"]).await, 0);
    assert!(again.contains("0 file(s) written"), "{again}");
    assert_eq!(read(dir, "endpoints/by-country.yaml"), file);
    let clean = status(&code(&app, project, &key, dir, &["diff"]).await, 0);
    assert!(clean.contains("no changes"), "{clean}");

    // Edits: a new column (a new version that breaks nothing), a description (settings only), a new endpoint.
    write(dir, "endpoints/by-country.yaml", &file.replace("AS total\n", "AS total, count(*) AS sales\n"));
    let all_sales = read(dir, "endpoints/all-sales.yaml");
    write(
        dir,
        "endpoints/all-sales.yaml",
        &all_sales.replace("name: all-sales\n", "name: all-sales\ndescription: Every sale\n"),
    );
    write(
        dir,
        "endpoints/top.yaml",
        "name: top\nquery: |\n  SELECT max(amount) AS top FROM sales\ncache_age_seconds: 60\n",
    );
    let diff = status(&code(&app, project, &key, dir, &["diff"]).await, 1);
    for line in [
        "+  SELECT country, sum(amount) AS total, count(*) AS sales",
        "+description: Every sale",
        "+name: top",
    ] {
        assert!(diff.contains(line), "{line} not in {diff}");
    }
    assert!(
        diff.contains("1 to create, 1 to update with a new version, 1 to update settings, 0 to delete"),
        "{diff}"
    );

    // A dry run prints the plan and changes nothing.
    let planned = status(&code(&app, project, &key, dir, &["push", "--dry-run"]).await, 0);
    assert!(
        planned.contains("+ create top") && planned.contains("~ update (new version) by-country"),
        "{planned}"
    );
    assert_eq!(version_of(&app, project, &key, "by-country").await, (1, "Sales of one country".into()));
    assert_eq!(endpoint(&app, project, &key, "top").await.status(), 404);

    // push applies it; a second push changes nothing and makes no version.
    let pushed = status(&code(&app, project, &key, dir, &["push"]).await, 0);
    assert!(pushed.contains("applied create top"), "{pushed}");
    assert_eq!(version_of(&app, project, &key, "by-country").await, (2, "Sales of one country".into()));
    assert_eq!(version_of(&app, project, &key, "all-sales").await, (1, "Every sale".into()));
    let top: Endpoint = endpoint(&app, project, &key, "top").await.json().await.unwrap();
    assert_eq!((top.cache_age_seconds, top.is_active), (Some(60), true));
    let twice = status(&code(&app, project, &key, dir, &["push"]).await, 0);
    assert!(twice.contains("no changes"), "{twice}");
    assert_eq!(version_of(&app, project, &key, "by-country").await.0, 2);
    status(&code(&app, project, &key, dir, &["diff"]).await, 0);

    // A breaking edit of an endpoint that ran: refused (exit 1, named, nothing changed) until confirmed.
    let run =
        app.request(Method::POST, &format!("/api/projects/{project}/endpoints/by-country/run"), Some(&key));
    assert_eq!(run.json(&json!({})).send().await.unwrap().status(), 200);
    let edited = read(dir, "endpoints/by-country.yaml");
    write(dir, "endpoints/by-country.yaml", &edited.replace("sum(amount) AS total, ", ""));
    let refused = status(&code(&app, project, &key, dir, &["push"]).await, 1);
    assert!(
        refused.contains("breaking: column total removed") && refused.contains("nothing changed"),
        "{refused}"
    );
    assert!(refused.contains("--confirm-breaking"), "{refused}");
    assert_eq!(version_of(&app, project, &key, "by-country").await.0, 2);
    status(&code(&app, project, &key, dir, &["push", "--confirm-breaking"]).await, 0);
    assert_eq!(version_of(&app, project, &key, "by-country").await.0, 3);

    // --prune deletes an endpoint whose file is gone; without it, the endpoint stays.
    std::fs::remove_file(dir.join("endpoints/top.yaml")).unwrap();
    let kept = status(&code(&app, project, &key, dir, &["push"]).await, 0);
    assert!(kept.contains("no changes"), "{kept}");
    assert_eq!(endpoint(&app, project, &key, "top").await.status(), 200);
    status(&code(&app, project, &key, dir, &["diff"]).await, 1);
    let pruned = status(&code(&app, project, &key, dir, &["push", "--prune"]).await, 0);
    assert!(pruned.contains("- delete top") && pruned.contains("applied delete top"), "{pruned}");
    assert_eq!(endpoint(&app, project, &key, "top").await.status(), 404);

    // test: exact rows (types and order), columns, row counts; a failing case fails the command and the report.
    write(
        dir,
        "tests/by-country.yaml",
        "- name: france\n  variables: {c: FR}\n  expect:\n    columns: [country, sales]\n    rows:\n      - {country: FR, sales: 1}\n\
         - name: nobody\n  variables: {c: XX}\n  expect: {row_count: 0}\n",
    );
    write(
        dir,
        "tests/all-sales.yaml",
        "- name: first rows\n  expect:\n    row_count: 6\n    rows: [{id: 1, amount: 10.5}]\n",
    );
    let report_file = dir.join("report.xml");
    let failed =
        status(&code(&app, project, &key, dir, &["test", "--junit", report_file.to_str().unwrap()]).await, 1);
    assert!(
        failed.contains("ok   by-country / france") && failed.contains("ok   by-country / nobody"),
        "{failed}"
    );
    assert!(
        failed.contains("FAIL all-sales / first rows") && failed.contains("rows: expected 1 rows, got 6"),
        "{failed}"
    );
    assert!(failed.contains("3 case(s), 2 passed, 1 failed"), "{failed}");
    let report = std::fs::read_to_string(&report_file).unwrap();
    assert!(report.contains("tests=\"3\"") && report.contains("failures=\"1\""), "{report}");
    assert!(report.contains("<failure message=\"1 difference(s)\""), "{report}");
    // A value of another type is a difference: 10.5 is a float, "10.5" a string.
    write(dir, "tests/all-sales.yaml", "- name: first\n  expect: {rows: [{id: 1, amount: '10.5'}]}\n");
    let typed = status(&code(&app, project, &key, dir, &["test"]).await, 1);
    assert!(
        typed.contains("row 1: expected {\"amount\":\"10.5\",\"id\":1}, got {\"amount\":10.5,\"id\":1}"),
        "{typed}"
    );
    write(dir, "tests/all-sales.yaml", "- name: count\n  expect: {row_count: 6, columns: [id, amount]}\n");
    let passed = status(&code(&app, project, &key, dir, &["test"]).await, 0);
    assert!(passed.contains("3 case(s), 3 passed, 0 failed"), "{passed}");
}

/// Bad input gets a clear message and exit status 2, and changes nothing: a file the server refuses, a file
/// of the wrong name, an unknown field, a wrong key, an unreachable server.
#[tokio::test]
async fn bad_files_keys_and_servers_exit_two_and_change_nothing() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write(dir, "endpoints/good.yaml", "name: good\nquery: SELECT 1 AS one\n");
    write(dir, "endpoints/bad.yaml", "name: bad\nquery: SELECT * FROM no_such_table\n");
    let output = code(&app, project, &key, dir, &["push"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bad: 400") && stderr.contains("no_such_table"), "{stderr}");
    assert_eq!(endpoint(&app, project, &key, "good").await.status(), 404, "a refused plan applies nothing");
    std::fs::remove_file(dir.join("endpoints/bad.yaml")).unwrap();

    for (file, text, says) in [
        ("endpoints/other.yaml", "name: good2\nquery: SELECT 1\n", "is not the file's name"),
        ("endpoints/typo.yaml", "name: typo\nquery: SELECT 1\nis_materialised: true\n", "is_materialised"),
        ("endpoints/no_sql.yaml", "name: no_sql\n", "query"),
        ("endpoints/a b.yaml", "name: a b\nquery: SELECT 1\n", "not an endpoint name"),
        // Refused by the API's own rules before anything is sent.
        (
            "endpoints/typed.yaml",
            "name: typed\nquery: SELECT {variables.n} AS n\nvariables:\n  n:\n    type: Integr\n",
            "typed: 400 validation_error: query.variables.n",
        ),
        ("tests/good.yaml", "- name: empty\n  expect: {}\n", "expects nothing"),
    ] {
        write(dir, file, text);
        let output =
            code(&app, project, &key, dir, &[if file.starts_with("tests") { "test" } else { "push" }]).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{file}: {stderr}");
        assert!(stderr.contains(says), "{file}: {stderr}");
        std::fs::remove_file(dir.join(file)).unwrap();
    }
    assert_eq!(endpoint(&app, project, &key, "good").await.status(), 404);

    let wrong_key = code(&app, project, "epk_wrong", dir, &["diff"]).await;
    assert_eq!(wrong_key.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&wrong_key.stderr).contains("401"), "{wrong_key:?}");
    let nowhere = std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"))
        .args(["pull", "--url", "http://127.0.0.1:9", "--project", "1", "--key", "k"])
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(nowhere.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&nowhere.stderr).contains("could not reach the server"), "{nowhere:?}");
    assert!(
        !dir.join("endpoints/good.yaml").exists() || read(dir, "endpoints/good.yaml").contains("name: good")
    );
}

/// Every demo endpoint pulled, pushed to a project with none, and pulled again gives the same bytes.
#[tokio::test]
async fn demo_endpoints_round_trip_through_files() {
    let app = spawn_app().await;
    let demo = app.cli(&["demo", "--rows", "2000"]);
    let (project, key) = (demo["project_id"].as_i64().unwrap(), demo["key"].as_str().unwrap().to_owned());
    let first = tempfile::tempdir().unwrap();
    status(&code(&app, project, &key, first.path(), &["pull"]).await, 0);
    let names: Vec<String> = std::fs::read_dir(first.path().join("endpoints"))
        .unwrap()
        .map(|f| f.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.len() >= 4, "{names:?}");
    // Emptied of endpoints (its tables stay, as the queries read them), then filled from the folder.
    for name in &names {
        let name = name.trim_end_matches(".yaml");
        let path = format!("/api/projects/{project}/endpoints/{name}");
        assert_eq!(app.request(Method::DELETE, &path, Some(&key)).send().await.unwrap().status(), 204);
    }
    let pushed = status(&code(&app, project, &key, first.path(), &["push"]).await, 0);
    assert!(pushed.contains(&format!("plan: {} to create", names.len())), "{pushed}");
    let second = tempfile::tempdir().unwrap();
    status(&code(&app, project, &key, second.path(), &["pull"]).await, 0);
    for name in &names {
        let file = format!("endpoints/{name}");
        assert_eq!(read(first.path(), &file), read(second.path(), &file), "{name}");
    }
}

/// The CI example is a workflow GitHub can read, and runs the commands as this binary spells them.
#[test]
fn the_ci_example_runs_diff_test_and_push_with_a_secret_key() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/examples/ci.yml")).unwrap();
    let workflow: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(workflow["env"]["ENDPOINTS_API_KEY"], "${{ secrets.ENDPOINTS_API_KEY }}");
    let runs: Vec<String> = workflow["jobs"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|job| job["steps"].as_array().unwrap().iter())
        .filter_map(|step| step["run"].as_str().map(str::to_owned))
        .collect();
    for command in [
        "endpoints diff",
        "endpoints push --dir . --dry-run",
        "endpoints test",
        "endpoints push --dir . --prune",
    ] {
        assert!(runs.iter().any(|run| run.contains(command)), "{command} is not in {runs:?}");
    }
    // Every command and flag it uses is one the binary knows.
    use clap::CommandFactory;
    let cli = server::cli::Cli::command();
    for run in runs.iter().filter(|run| run.starts_with("endpoints ")) {
        let words: Vec<&str> = run.split(" || ").next().unwrap().split_whitespace().collect();
        let mut args = words.clone();
        args.extend(["--url", "http://localhost", "--project", "1", "--key", "k"]);
        cli.clone().try_get_matches_from(&args).unwrap_or_else(|err| panic!("{run}: {err}"));
    }
}

proptest::proptest! {
    /// Any SQL and description, written to a file and read back, are what they were, byte for byte: line breaks
    /// (`\n`, `\r\n`), leading and trailing spaces, tabs, blank lines, `#`, quotes, YAML's own characters.
    #[test]
    fn any_text_round_trips_through_a_file(
        sql in "[ \t\r\n#:|>'\"\\-a-zA-Z0-9{}.é中]{0,80}",
        description in "[ \t\n#:|>'\"\\-a-z]{0,40}",
        default in proptest::option::of("[ \n#:'a-z0-9]{0,12}"),
        hibernate_after_days in proptest::option::of(proptest::option::of(1..3650_u32)),
    ) {
        use server::cli::code::files::{EndpointFile, Sql, VariableFile};
        let mut variables = std::collections::BTreeMap::new();
        variables.insert("v".to_owned(), VariableFile {
            kind: "String".into(),
            default: default.map(Value::from),
            required: None,
            description: None,
        });
        let file = EndpointFile {
            name: "e".into(),
            description,
            query: Sql(sql),
            variables,
            cache_age_seconds: Some(0),
            is_active: false,
            is_materialized: false,
            sync_frequency: None,
            freshness_seconds: None,
            hibernate_after_days,
        };
        let text = file.to_yaml().unwrap();
        let read: EndpointFile = serde_saphyr::from_str(&text).unwrap();
        proptest::prop_assert_eq!(read, file, "{}", text);
    }
}

/// `pull` reads every page of the project's endpoints (a hundred a page).
#[tokio::test]
async fn pull_reads_every_page() {
    let app = spawn_app().await;
    let (project, key) = project_with_sales(&app);
    for i in 0..205 {
        let body = endpoint_body(&format!("e-{i:03}"), "SELECT 1 AS one");
        let created = app.request(Method::POST, &format!("/api/projects/{project}/endpoints"), Some(&key));
        assert_eq!(created.json(&body).send().await.unwrap().status(), 201);
    }
    let dir = tempfile::tempdir().unwrap();
    let pulled = status(&code(&app, project, &key, dir.path(), &["pull"]).await, 0);
    assert!(pulled.contains("pulled 205 endpoint(s), 205 file(s) written"), "{pulled}");
}

/// A server that answers every request with what `answer` writes (the request's head read first), on a port of
/// its own; each connection is closed after its answer.
async fn hostile_server<F, Fut>(answer: F) -> u16
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let answer = std::sync::Arc::clone(&answer);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0_u8; 1];
                while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                answer(socket).await;
            });
        }
    });
    port
}

/// `endpoints pull` against `port`, with a deadline: it must give up on its own.
async fn pull_from(port: u16) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_endpoints"))
        .args(["pull", "--url", &format!("http://127.0.0.1:{port}"), "--project", "1", "--key", "k"])
        .arg("--dir")
        .arg(dir.path())
        .output();
    tokio::time::timeout(std::time::Duration::from_secs(60), command).await.expect("pull gives up").unwrap()
}

/// A hostile server cannot make the CLI hold what it sends without end, nor write to the user's terminal: its
/// text is printed with control characters escaped, a body past the bound and pages that never end are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_server_can_neither_exhaust_the_cli_nor_write_to_its_terminal() {
    use tokio::io::AsyncWriteExt;
    let escapes = hostile_server(|mut socket| async move {
        let body = r#"{"code": "bad\u001b[31m", "detail": "boom \u001b]0;pwned\u0007\r\nfake prompt$ "}"#;
        let head = format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = socket.write_all(format!("{head}{body}").as_bytes()).await;
    })
    .await;
    let output = pull_from(escapes).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains('\u{1b}') && !stderr.contains('\u{7}') && !stderr.contains('\r'), "{stderr:?}");
    assert!(stderr.contains("\\u{1b}]0;pwned"), "shown escaped: {stderr}");

    let endless = hostile_server(|mut socket| async move {
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"results\": [";
        if socket.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let spaces = vec![b' '; 1024 * 1024];
        while socket.write_all(&spaces).await.is_ok() {}
    })
    .await;
    let output = pull_from(endless).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("larger than 64 MiB"), "{stderr}");

    let pages = hostile_server(|mut socket| async move {
        // An endpoint record as the API writes it.
        let endpoint = r#"{"id": "00000000-0000-0000-0000-000000000001", "name": "e", "description": "",
            "query": {"kind": "SQLQuery", "query": "SELECT 1", "variables": {}}, "derived_from_insight": null,
            "is_active": true, "is_materialized": false, "cache_age_seconds": null, "sync_frequency": null,
            "freshness_seconds": 60, "hibernate_after_days": 7, "current_version": 1, "versions_count": 1,
            "columns": [], "plan_error": null,
            "endpoint_path": "/api/projects/1/endpoints/e/run", "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z", "last_executed_at": null,
            "materialization": {"name": "e", "version": 1, "is_materialized": false, "status": "NotMaterialized",
                "sync_frequency": null, "last_materialized_at": null, "next_run_at": null, "row_count": null,
                "freshness_seconds": 60, "data_as_of": null, "appended_since": null, "full_refreshes": 0,
                "last_folded_at": null, "rows_folded": 0, "hibernate_after_days": 7, "hibernated_at": null,
                "grouping": null, "error": null, "can_materialize": true, "reason": null}}"#;
        let page = format!(
            "{{\"count\": 1000000, \"next\": \"more\", \"previous\": null, \"results\": [{}]}}",
            vec![endpoint; 1000].join(",")
        );
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            page.len()
        );
        let _ = socket.write_all(format!("{head}{page}").as_bytes()).await;
    })
    .await;
    let output = pull_from(pages).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("endpoints listed, page after page"), "{stderr}");
}
