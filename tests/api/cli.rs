//! The operator's commands, through the real binary.

use clap::{CommandFactory, FromArgMatches};
use serde_json::Value;
use server::cli::file::apply_table;
use server::cli::{Cli, Command as Sub};

use crate::helpers::spawn_app;

#[tokio::test]
async fn admin_commands_print_json_for_scripts() {
    let app = spawn_app().await;
    let project = app.cli(&["project", "create", "--name", "Acme"]);
    assert!(project["id"].as_i64().unwrap() > 0);
    assert_eq!(project["name"], "Acme");
    let id = project["id"].as_i64().unwrap().to_string();

    let key = app.cli(&[
        "key",
        "create",
        "--project",
        &id,
        "--scope",
        "endpoint:read",
        "--label",
        "ci",
        "--expires-in",
        "90d",
    ]);
    let secret = key["key"].as_str().unwrap();
    assert!(secret.starts_with("phx_") && secret.len() > 40, "{secret}");
    assert_eq!(key["scopes"], serde_json::json!(["endpoint:read"]));
    assert_eq!(key["project_id"].as_i64().unwrap().to_string(), id);
    assert!(key["expires_at"].is_string());

    let keys = app.cli(&["key", "list", "--project", &id]);
    let listed = &keys.as_array().unwrap()[0];
    assert_eq!(listed["id"], key["id"]);
    assert_eq!(listed["label"], "ci");
    assert!(!keys.to_string().contains(secret), "the secret is never shown again");

    let projects = app.cli(&["project", "list"]);
    assert!(projects.as_array().unwrap().iter().any(|p| p["name"] == "Acme"));
}

#[tokio::test]
async fn global_options_go_before_or_after_the_subcommand_and_errors_exit_nonzero() {
    let app = spawn_app().await;
    let dir = app.data_dir.to_str().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"))
        .args(["project", "create", "--name", "After", "--json", "--data-dir", dir])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(output.status.success());
    let created: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(created["name"], "After");

    for args in [
        vec!["key", "create", "--project", "999", "--scope", "endpoint:read"],
        vec!["key", "create", "--project", "1", "--scope", "admin"],
        vec!["key", "create", "--project", "1", "--scope", "endpoint:read", "--expires-in", "0s"],
        vec!["key", "create", "--project", "1", "--scope", "endpoint:read", "--expires-in", "soon"],
        vec!["key", "revoke", "not-a-uuid"],
        vec!["key", "revoke", "00000000-0000-0000-0000-000000000000"],
    ] {
        let output = app.cli_raw(&args);
        assert!(!output.status.success(), "{args:?} should fail");
        assert!(String::from_utf8_lossy(&output.stderr).contains("error:"), "{args:?}");
    }
}

#[tokio::test]
async fn a_configuration_file_sets_defaults_that_the_environment_and_flags_override() {
    let app = spawn_app().await;
    let file = app.data_dir.join("endpoints.toml");
    std::fs::write(
        &file,
        format!("data_dir = {:?}\n\n[serve]\nworkers = 1\n", app.data_dir.to_str().unwrap()),
    )
    .unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_endpoints"))
            .arg("--config")
            .arg(&file)
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("ENDPOINTS_DATA_DIR")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    // The file's data directory is the app's: the project lands in its database.
    let output = run(&["--json", "project", "create", "--name", "FromFile"], &[]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(app.cli(&["project", "list"]).as_array().unwrap().iter().any(|p| p["name"] == "FromFile"));

    // The environment beats the file, and a flag beats both.
    let elsewhere = app.data_dir.join("elsewhere");
    let output = run(
        &["--json", "project", "create", "--name", "FromEnv"],
        &[("ENDPOINTS_DATA_DIR", elsewhere.to_str().unwrap())],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(elsewhere.join("endpoints.db").exists());
    let flagged = app.data_dir.join("flagged");
    let output = run(
        &["--json", "--data-dir", flagged.to_str().unwrap(), "project", "create", "--name", "FromFlag"],
        &[("ENDPOINTS_DATA_DIR", elsewhere.to_str().unwrap())],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(flagged.join("endpoints.db").exists());

    // A typo stops the command with the file and the key.
    std::fs::write(&file, "[serve]\nquery_timeout = 3\n").unwrap();
    let output = run(&["project", "list"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("endpoints.toml") && stderr.contains("query_timeout"), "{stderr}");
}

fn parse(file: &str, args: &[&str]) -> Result<Cli, String> {
    let command = apply_table(Cli::command(), &file.parse().map_err(|e| format!("{e}"))?)?;
    let matches = command.try_get_matches_from(args).map_err(|e| e.to_string())?;
    Cli::from_arg_matches(&matches).map_err(|e| e.to_string())
}

fn serve(cli: Cli) -> server::cli::ServeArgs {
    match cli.command {
        Sub::Serve(args) => args,
        other => panic!("not serve: {other:?}"),
    }
}

const FILE: &str = r#"
    data_dir = "/srv/endpoints"
    log_json = true

    [serve]
    bind = "0.0.0.0:9000"
    query_timeout_secs = 45
    materialize_workers = 0
"#;

#[test]
fn file_values_are_defaults_that_flags_override() {
    let cli = parse(FILE, &["endpoints", "serve"]).unwrap();
    assert_eq!((cli.data_dir.to_str(), cli.log_json), (Some("/srv/endpoints"), true));
    let args = serve(cli);
    assert_eq!(
        (args.bind.as_str(), args.query_timeout_secs, args.materialize_workers),
        ("0.0.0.0:9000", 45, 0)
    );
    assert_eq!(args.pool_size, 8, "settings the file leaves out keep their defaults");
    let sources = "[serve]\nallow_sources = [\"s3://lake/exports/\", \"postgres://db/app\"]";
    let listed = serve(parse(sources, &["endpoints", "serve"]).unwrap()).allow_sources;
    assert_eq!(listed, ["s3://lake/exports/", "postgres://db/app"]);
    let flagged = parse(sources, &["endpoints", "serve", "--allow-source", "file:///srv/"]).unwrap();
    assert_eq!(serve(flagged).allow_sources, ["file:///srv/"], "flags replace the file's list");

    let cli =
        parse(FILE, &["endpoints", "--data-dir", "/tmp/x", "serve", "--query-timeout-secs", "5"]).unwrap();
    assert_eq!(cli.data_dir.to_str(), Some("/tmp/x"));
    assert_eq!(serve(cli).query_timeout_secs, 5);
}

#[test]
fn unknown_keys_sections_and_bad_values_are_refused() {
    for (file, expected) in [
        ("data_dri = \"x\"", "unknown setting data_dri"),
        ("[serve]\nquery_timeout = 3", "unknown setting [serve] query_timeout"),
        ("[server]\nbind = \"x\"", "unknown section [server]"),
        ("[serve]\nbind = [1, 2]", "[serve] bind must be a string, number or boolean"),
        ("[serve]\nworkers = \"many\"", "invalid value 'many'"),
        ("[serve]\nallow_sources = [1]", "[serve] allow_sources must be a list of strings"),
    ] {
        let err = parse(file, &["endpoints", "serve"]).err().unwrap_or_else(|| panic!("{file} was accepted"));
        assert!(err.contains(expected), "{file}: {err}");
    }
}

#[test]
fn limits_are_checked_where_they_are_read() {
    for (flag, value) in [
        ("--query-timeout-secs", "0"),
        ("--query-memory-mb", "0"),
        ("--max-queries-per-project", "0"),
        ("--flush-secs", "0"),
        ("--materialize-lease-secs", "2"),
        ("--pool-size", "0"),
        ("--query-partitions", "0"),
        ("--query-partitions", "1025"),
    ] {
        let err =
            parse("", &["endpoints", "serve", flag, value]).err().unwrap_or_else(|| panic!("{flag} {value}"));
        assert!(err.contains(&format!("invalid value '{value}'")) && err.contains(flag), "{err}");
    }
    assert_eq!(
        serve(parse("", &["endpoints", "serve", "--materialize-lease-secs", "3"]).unwrap())
            .materialize_lease_secs,
        3
    );
}

#[test]
fn every_setting_is_documented() {
    let doc = include_str!("../../docs/operations.md");
    let command = Cli::command();
    let serve = command.find_subcommand("serve").unwrap();
    for arg in command.get_arguments().chain(serve.get_arguments()) {
        let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else { continue };
        if ["help", "version", "json"].contains(&id) {
            continue;
        }
        assert!(doc.contains(&format!("`--{long}`")), "docs/operations.md does not document --{long}");
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            assert!(doc.contains(&format!("`{env}`")), "docs/operations.md does not document {env}");
        }
    }
}

#[test]
fn demo_events_are_reproducible() {
    use server::cli::demo_data::events;
    let a: Vec<_> = events(1000, 7).collect();
    assert_eq!(a, events(1000, 7).collect::<Vec<_>>());
    assert_eq!(a.iter().map(|batch| batch.num_rows()).sum::<usize>(), 1000);
    assert_ne!(a, events(1000, 8).collect::<Vec<_>>());
}
