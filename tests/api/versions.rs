//! An endpoint's versions: they appear only when the query changes.

use serde_json::{json, Value};

use crate::helpers::{assert_error, endpoint_body, spawn_app, FAMILIES};

#[tokio::test]
async fn query_changes_make_versions_and_settings_changes_do_not() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    app.create_endpoint(project, &key, &endpoint_body("kpi", "SELECT 1 AS n")).await;
    let path = format!("/api/projects/{project}/endpoints/kpi");

    app.patch(&path, &key, &json!({"description": "first words", "cache_age_seconds": 120})).await;
    // The same query in another key order is not a change.
    let same = json!({"query": {"query": "SELECT 1 AS n", "kind": "SQLQuery"}});
    let unchanged: Value = app.patch(&path, &key, &same).await.json().await.unwrap();
    assert_eq!(unchanged["current_version"], 1);

    let changed: Value = app
        .patch(&path, &key, &json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS m, 'x' AS label"}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!((changed["current_version"].as_u64(), changed["versions_count"].as_u64()), (Some(2), Some(2)));
    assert_eq!(
        changed["columns"],
        json!([{"name": "m", "type": "integer"}, {"name": "label", "type": "string"}])
    );

    for family in FAMILIES {
        let list: Value =
            app.get(&format!("{family}/{project}/endpoints/kpi/versions/"), &key).await.json().await.unwrap();
        assert_eq!(list["count"], 2);
        let versions = list["results"].as_array().unwrap();
        assert_eq!(versions[0]["version"], 2, "newest first");
        assert_eq!(versions[0]["is_current"], true);
        assert_eq!(versions[0]["description"], "first words", "settings are copied into the new version");
        assert_eq!(versions[0]["cache_age_seconds"], 120);
        assert_eq!(versions[1]["version"], 1);
        assert_eq!(versions[1]["is_current"], false);
        assert_eq!(versions[1]["query"]["query"], "SELECT 1 AS n");
        assert_eq!(versions[1]["columns"], json!([{"name": "n", "type": "integer"}]));

        let one: Value = app
            .get(&format!("{family}/{project}/endpoints/kpi/versions/1/"), &key)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(one, versions[1]);
    }
    let base = format!("/api/projects/{project}/endpoints/kpi/versions");
    for bad in ["0", "-1", "abc", "1.0"] {
        let error =
            assert_error(app.get(&format!("{base}/{bad}"), &key).await, 400, "validation_error").await;
        assert_eq!(error.attr.as_deref(), Some("version_number"));
    }
    assert_error(app.get(&format!("{base}/3"), &key).await, 404, "not_found").await;
    assert_error(
        app.get(&format!("/api/projects/{project}/endpoints/nope/versions"), &key).await,
        404,
        "not_found",
    )
    .await;
    let paged: Value = app.get(&format!("{base}?limit=1&offset=1"), &key).await.json().await.unwrap();
    assert_eq!(paged["results"][0]["version"], 1);
}

#[tokio::test]
async fn a_version_that_breaks_recent_callers_needs_confirming_and_records_what_it_breaks() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let sql = |text: &str| json!({"query": {"kind": "SQLQuery", "query": text}});
    app.create_endpoint(project, &key, &endpoint_body("kpi", "SELECT 1 AS n, 'x' AS label, 2.5 AS share"))
        .await;
    for family in FAMILIES {
        let path = format!("{family}/{project}/endpoints/kpi");
        // Never run: any change is saved without confirmation.
        let first = format!("SELECT 1 AS n, 'x' AS label, 2.5 AS share, {} AS extra", family.len());
        let v = app.patch(&path, &key, &sql(&first)).await;
        assert_eq!(v.status(), 200);
    }
    let path = format!("/api/projects/{project}/endpoints/kpi");
    let versions: Value = app.get(&format!("{path}/versions/"), &key).await.json().await.unwrap();
    let recorded: Vec<(u64, Value)> = versions["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["version"].as_u64().unwrap(), v["breaking_changes"].clone()))
        .collect();
    // Version 2 added `extra`, version 3 changed its value, not its type; version 1 follows nothing.
    assert_eq!(recorded, [(3, json!([])), (2, json!([])), (1, json!([]))]);

    // Once it ran, removing `label`, retyping `n` and renaming `share` is refused with nothing changed.
    let ran = app.post(&format!("{path}/run"), &key, &json!({})).await;
    assert_eq!(ran.status(), 200);
    let breaking = "SELECT 'one' AS n, 2.5 AS ratio, 7 AS extra";
    let expected = json!([
        {"column": "n", "change": "type_changed", "from": "integer", "to": "string"},
        {"column": "label", "change": "removed", "from": "string", "to": null},
        {"column": "share", "change": "removed", "from": "float", "to": null},
    ]);
    for family in FAMILIES {
        let family_path = format!("{family}/{project}/endpoints/kpi");
        for body in [sql(breaking), json!({"query": sql(breaking)["query"], "confirm_breaking": false})] {
            for dry_run in ["", "?dry_run=true"] {
                let refused = app.patch(&format!("{family_path}{dry_run}"), &key, &body).await;
                let error = assert_error(refused, 409, "conflict").await;
                assert_eq!(
                    (Some(error.code.as_str()), error.attr.as_deref()),
                    (Some("breaking_change"), Some("query"))
                );
                assert_eq!(error.breaking_changes.as_deref(), Some(&expected), "{error:?}");
                let detail = error.detail;
                assert!(
                    detail.contains("column 'label' (string) is removed")
                        && detail.contains("confirm_breaking"),
                    "{detail}"
                );
            }
        }
    }
    let unchanged: Value = app.get(&path, &key).await.json().await.unwrap();
    assert_eq!(unchanged["current_version"], 3, "nothing changed");
    // A wrong type for the confirmation is a validation error on it.
    let bad =
        app.patch(&path, &key, &json!({"query": sql(breaking)["query"], "confirm_breaking": "yes"})).await;
    assert_eq!(assert_error(bad, 400, "validation_error").await.attr.as_deref(), Some("confirm_breaking"));

    // Confirmed, it is saved and its version says what it broke, as its OpenAPI document does.
    let confirmed =
        app.patch(&path, &key, &json!({"query": sql(breaking)["query"], "confirm_breaking": true})).await;
    assert_eq!(confirmed.status(), 200);
    let v4: Value = app.get(&format!("{path}/versions/4"), &key).await.json().await.unwrap();
    assert_eq!(v4["breaking_changes"], expected);
    let doc: Value = app.get(&format!("{path}/openapi.json"), &key).await.json().await.unwrap();
    let description = doc["info"]["description"].as_str().unwrap_or_default();
    assert!(
        description.contains("Breaking changes in version 4 against version 3: column 'n' changes from integer to string; column 'label' (string) is removed; column 'share' (float) is removed."),
        "{description}"
    );
    let older: Value = app.get(&format!("{path}/openapi.json?version=3"), &key).await.json().await.unwrap();
    assert!(
        !older["info"]["description"].as_str().unwrap_or_default().contains("Breaking"),
        "{}",
        older["info"]
    );

    // Adding a column to an endpoint that ran needs nothing.
    let adding = app.patch(&path, &key, &sql("SELECT 'one' AS n, 2.5 AS ratio, 7 AS extra, 1 AS more")).await;
    assert_eq!(adding.status(), 200);

    // An endpoint that never ran takes a breaking version without confirmation, and records what it broke.
    app.create_endpoint(project, &key, &endpoint_body("fresh", "SELECT 1 AS n")).await;
    let fresh = format!("/api/projects/{project}/endpoints/fresh");
    assert_eq!(app.patch(&fresh, &key, &sql("SELECT 'a' AS m")).await.status(), 200);
    let v2: Value = app.get(&format!("{fresh}/versions/2"), &key).await.json().await.unwrap();
    assert_eq!(
        v2["breaking_changes"],
        json!([{"column": "n", "change": "removed", "from": "integer", "to": null}])
    );
}
