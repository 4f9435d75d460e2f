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
        assert_eq!(error["attr"], "version_number");
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
