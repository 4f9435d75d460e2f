//! An endpoint's versions: they appear only when the query changes.

use domain::ColumnType;
use http_actix::api::{BreakingChange, Column, Endpoint, Version, VersionPage};
use serde_json::{json, Value};

use crate::helpers::{assert_error, endpoint_body, spawn_app, FAMILIES};

fn column(name: &str, column_type: ColumnType) -> Column {
    Column { name: name.into(), column_type }
}

fn change(column: &str, change: &'static str, from: ColumnType, to: Option<ColumnType>) -> BreakingChange {
    BreakingChange { column: column.into(), change: change.into(), from, to }
}

#[tokio::test]
async fn query_changes_make_versions_and_settings_changes_do_not() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    app.create_endpoint(project, &key, &endpoint_body("kpi", "SELECT 1 AS n")).await;
    let path = format!("/api/projects/{project}/endpoints/kpi");

    app.patch(&path, &key, &json!({"description": "first words", "cache_age_seconds": 120})).await;
    // The same query in another key order is not a change.
    let same = json!({"query": {"query": "SELECT 1 AS n", "kind": "SQLQuery"}});
    let unchanged: Endpoint = app.patch(&path, &key, &same).await.json().await.unwrap();
    assert_eq!(unchanged.current_version, 1);

    let changed: Endpoint = app
        .patch(&path, &key, &json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS m, 'x' AS label"}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!((changed.current_version, changed.versions_count), (2, 2));
    assert_eq!(
        changed.columns,
        Some(vec![column("m", ColumnType::Integer), column("label", ColumnType::String)])
    );

    for family in FAMILIES {
        let list: VersionPage =
            app.get(&format!("{family}/{project}/endpoints/kpi/versions/"), &key).await.json().await.unwrap();
        assert_eq!(list.count, 2);
        let versions = &list.results;
        assert_eq!((versions[0].version, versions[0].is_current), (2, true), "newest first");
        assert_eq!(versions[0].description, "first words", "settings are copied into the new version");
        assert_eq!(versions[0].cache_age_seconds, Some(120));
        assert_eq!((versions[1].version, versions[1].is_current), (1, false));
        assert_eq!(versions[1].query.query, "SELECT 1 AS n");
        assert_eq!(versions[1].columns, Some(vec![column("n", ColumnType::Integer)]));

        let one: Version = app
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
    let paged: VersionPage = app.get(&format!("{base}?limit=1&offset=1"), &key).await.json().await.unwrap();
    assert_eq!(paged.results[0].version, 1);
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
    let versions: VersionPage = app.get(&format!("{path}/versions/"), &key).await.json().await.unwrap();
    let recorded: Vec<(u32, usize)> =
        versions.results.iter().map(|v| (v.version, v.breaking_changes.len())).collect();
    // Version 2 added `extra`, version 3 changed its value, not its type; version 1 follows nothing.
    assert_eq!(recorded, [(3, 0), (2, 0), (1, 0)]);

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
    let unchanged: Endpoint = app.get(&path, &key).await.json().await.unwrap();
    assert_eq!(unchanged.current_version, 3, "nothing changed");
    // A wrong type for the confirmation is a validation error on it.
    let bad =
        app.patch(&path, &key, &json!({"query": sql(breaking)["query"], "confirm_breaking": "yes"})).await;
    assert_eq!(assert_error(bad, 400, "validation_error").await.attr.as_deref(), Some("confirm_breaking"));

    // Confirmed, it is saved and its version says what it broke, as its OpenAPI document does.
    let confirmed =
        app.patch(&path, &key, &json!({"query": sql(breaking)["query"], "confirm_breaking": true})).await;
    assert_eq!(confirmed.status(), 200);
    let v4: Version = app.get(&format!("{path}/versions/4"), &key).await.json().await.unwrap();
    assert_eq!(
        v4.breaking_changes,
        [
            change("n", "type_changed", ColumnType::Integer, Some(ColumnType::String)),
            change("label", "removed", ColumnType::String, None),
            change("share", "removed", ColumnType::Float, None),
        ]
    );
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
    let v2: Version = app.get(&format!("{fresh}/versions/2"), &key).await.json().await.unwrap();
    assert_eq!(v2.breaking_changes, [change("n", "removed", ColumnType::Integer, None)]);
}
