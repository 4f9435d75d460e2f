//! The operator's commands, through the real binary.

use serde_json::Value;

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
