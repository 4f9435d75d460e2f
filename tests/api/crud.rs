//! Listing, creating, reading, changing and deleting endpoints under both families, on SQLite and on PostgreSQL.

use domain::ColumnType;
use http_actix::api::{Column, Endpoint, EndpointPage, VersionPage};
use serde_json::json;

use crate::helpers::{assert_error, endpoint_body, spawn_app, TestApp, FAMILIES};

async fn lifecycle_under_both_families(app: TestApp) {
    let (project, key) = app.project_with_key();
    for family in FAMILIES {
        let base = format!("{family}/{project}/endpoints");
        let name = format!("daily-{}", family.rsplit('/').next().unwrap());
        let created: Endpoint = {
            let body = json!({
                "name": name, "description": "Daily numbers", "derived_from_insight": "abc123",
                "cache_age_seconds": 60,
                "query": {"kind": "SQLQuery", "query": "SELECT {variables.n} * 2 AS doubled",
                          "variables": {"n": {"type": "Integer", "default": 21}}},
            });
            let response = app.post(&format!("{base}/"), &key, &body).await;
            assert_eq!(response.status(), 201);
            response.json().await.unwrap()
        };
        assert_eq!(created.name, name);
        assert_eq!((created.current_version, created.versions_count), (1, 1));
        assert_eq!((created.is_active, created.is_materialized), (true, false));
        assert_eq!((created.cache_age_seconds, created.sync_frequency.as_deref()), (Some(60), None));
        assert_eq!(created.derived_from_insight.as_deref(), Some("abc123"));
        assert_eq!(
            created.columns,
            Some(vec![Column { name: "doubled".into(), column_type: ColumnType::Integer }]),
            "planned by the engine"
        );
        assert_eq!(created.endpoint_path, format!("/api/projects/{project}/endpoints/{name}/run"));
        assert_eq!(created.last_executed_at, None);
        assert_eq!(created.query.variables["n"].default, Some(json!(21)));
        assert!(!created.id.is_nil());

        // List and read it back through both families, with and without the trailing slash.
        for read_family in FAMILIES {
            let page: EndpointPage = app
                .get(&format!("{read_family}/{project}/endpoints/?search={name}"), &key)
                .await
                .json()
                .await
                .unwrap();
            assert_eq!((page.count, &page.results[..]), (1, std::slice::from_ref(&created)));
        }
        for read_family in FAMILIES {
            for slash in ["", "/"] {
                let response =
                    app.get(&format!("{read_family}/{project}/endpoints/{name}{slash}"), &key).await;
                assert_eq!(response.status(), 200);
                assert_eq!(response.json::<Endpoint>().await.unwrap(), created);
            }
        }

        let updated: Endpoint = app
            .patch(&format!("{base}/{name}/"), &key, &json!({"description": "Renamed words"}))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(updated.description, "Renamed words");
        assert_eq!(updated.current_version, 1, "a settings change makes no version");

        let response = app.delete(&format!("{base}/{name}/"), &key).await;
        assert_eq!(response.status(), 204);
        assert!(response.bytes().await.unwrap().is_empty(), "204 has no body");
        assert_error(app.get(&format!("{base}/{name}"), &key).await, 404, "not_found").await;
        assert_error(app.delete(&format!("{base}/{name}"), &key).await, 404, "not_found").await;
        // The name is free again.
        app.create_endpoint(project, &key, &endpoint_body(&name, "SELECT 1 AS one")).await;
    }
}

#[tokio::test]
async fn lifecycle_on_sqlite() {
    lifecycle_under_both_families(spawn_app().await).await;
}

#[tokio::test]
async fn lifecycle_on_postgres() {
    lifecycle_under_both_families(TestApp::builder().on_postgres().spawn().await).await;
}

#[tokio::test]
async fn create_validates_every_field() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let path = format!("/api/projects/{project}/endpoints/");
    let cases = [
        (json!({"query": {"kind": "SQLQuery", "query": "SELECT 1"}}), "name"),
        (json!({"name": "9lives", "query": {"kind": "SQLQuery", "query": "SELECT 1"}}), "name"),
        (json!({"name": "a"}), "query"),
        (json!({"name": "a", "query": {"kind": "TrendsQuery", "query": "SELECT 1"}}), "query.kind"),
        (json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT * FROM nowhere"}}), "query"),
        (json!({"name": "a", "query": {"kind": "SQLQuery", "query": "DROP TABLE x"}}), "query"),
        (json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT 1; SELECT 2"}}), "query"),
        (json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT {variables.x}"}}), "query"),
        (
            json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT 1",
                "variables": {"x": {"type": "Date", "default": "tomorrow"}}}}),
            "query.variables.x.default",
        ),
        (
            json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT 1"}, "cache_age_seconds": -1}),
            "cache_age_seconds",
        ),
        (
            json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT 1"}, "cache_age_seconds": 1.5}),
            "cache_age_seconds",
        ),
        (
            json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT 1"}, "sync_frequency": "1hour"}),
            "sync_frequency",
        ),
        (
            json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT 1"}, "is_active": 1}),
            "is_active",
        ),
        (json!({"name": "a", "query": {"kind": "SQLQuery", "query": "SELECT 1"}, "id": "x"}), "id"),
    ];
    for (body, attr) in cases {
        let error = assert_error(app.post(&path, &key, &body).await, 400, "validation_error").await;
        assert_eq!(error.attr.as_deref(), Some(attr), "{body} -> {error:?}");
    }
    let error = assert_error(app.post(&path, &key, &json!([1, 2])).await, 400, "validation_error").await;
    assert_eq!(error.attr, None);

    app.create_endpoint(project, &key, &endpoint_body("taken", "SELECT 1 AS n")).await;
    let error =
        assert_error(app.post(&path, &key, &endpoint_body("taken", "SELECT 2 AS n")).await, 409, "conflict")
            .await;
    assert_eq!((Some(error.code.as_str()), error.attr.as_deref()), (Some("unique"), Some("name")));
}

#[tokio::test]
async fn materialized_endpoints_default_their_sync_frequency() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let mut body = endpoint_body("mat", "SELECT 1 AS n");
    body["is_materialized"] = json!(true);
    let created = app.create_endpoint(project, &key, &body).await;
    assert_eq!(created.sync_frequency.as_deref(), Some("24hour"));
    // The worker may have claimed the first refresh between the insert and the answer.
    let status = &created.materialization.status;
    assert!(matches!(status.as_ref(), "Pending" | "Running"), "{created:?}");
    let updated = app.update_endpoint(project, &key, "mat", &json!({"sync_frequency": "6hour"})).await;
    assert_eq!(updated.sync_frequency.as_deref(), Some("6hour"));
    let off = app.update_endpoint(project, &key, "mat", &json!({"is_materialized": false})).await;
    assert_eq!((off.sync_frequency, off.materialization.status.as_ref()), (None, "Disabled"));
}

#[tokio::test]
async fn patch_semantics() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let created = app.create_endpoint(project, &key, &endpoint_body("stats", "SELECT 1 AS n")).await;
    let path = format!("/api/projects/{project}/endpoints/stats");

    let error =
        assert_error(app.patch(&path, &key, &json!({"name": "other"})).await, 400, "validation_error").await;
    assert_eq!(error.attr.as_deref(), Some("name"));
    let error = assert_error(
        app.patch(&path, &key, &json!({"sync_frequency": "5min"})).await,
        400,
        "validation_error",
    )
    .await;
    assert_eq!(error.attr.as_deref(), Some("sync_frequency"));
    let error = assert_error(
        app.patch(&path, &key, &json!({"query": {"kind": "SQLQuery", "query": "SELECT nope"}})).await,
        400,
        "validation_error",
    )
    .await;
    assert_eq!(error.attr.as_deref(), Some("query"));

    // Nothing changed by the refused requests, and a body that changes nothing writes nothing.
    let same =
        app.update_endpoint(project, &key, "stats", &json!({"name": "stats", "is_active": true})).await;
    assert_eq!(same, created);

    let inactive = app
        .update_endpoint(project, &key, "stats", &json!({"is_active": false, "cache_age_seconds": null}))
        .await;
    assert!(!inactive.is_active);
    assert_ne!(inactive.updated_at, created.updated_at);
    assert_eq!(inactive.created_at, created.created_at);
}

#[tokio::test]
async fn list_pages_filters_and_orders_by_name() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    for name in ["charlie", "alpha", "bravo", "delta"] {
        let mut body = endpoint_body(name, "SELECT 1 AS n");
        body["description"] = json!(format!("about {name}"));
        body["is_active"] = json!(name != "bravo");
        app.create_endpoint(project, &key, &body).await;
    }
    let names =
        |page: &EndpointPage| -> Vec<String> { page.results.iter().map(|e| e.name.clone()).collect() };
    let base = format!("/api/environments/{project}/endpoints/");
    let all: EndpointPage = app.get(&base, &key).await.json().await.unwrap();
    assert_eq!(
        (all.count, names(&all)),
        (4, ["alpha", "bravo", "charlie", "delta"].map(String::from).to_vec())
    );
    assert_eq!((all.next, all.previous), (None, None));

    let first: EndpointPage = app.get(&format!("{base}?limit=2"), &key).await.json().await.unwrap();
    assert_eq!(names(&first), ["alpha", "bravo"]);
    let next = first.next.as_deref().unwrap();
    assert!(next.starts_with(&app.address), "{next}");
    let second: EndpointPage = app
        .request(reqwest::Method::GET, &next[app.address.len()..], Some(&key))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(names(&second), ["charlie", "delta"]);
    assert_eq!(second.next, None);
    assert!(second.previous.as_deref().unwrap().ends_with("limit=2&offset=0"));

    let active: EndpointPage = app.get(&format!("{base}?is_active=false"), &key).await.json().await.unwrap();
    assert_eq!(names(&active), ["bravo"]);
    let search: EndpointPage = app.get(&format!("{base}?search=CHAR"), &key).await.json().await.unwrap();
    assert_eq!(names(&search), ["charlie"]);
    for bad in ["limit=0", "limit=1001", "offset=-1", "is_active=perhaps"] {
        assert_error(app.get(&format!("{base}?{bad}"), &key).await, 400, "validation_error").await;
    }

    // Another project's endpoints never show up.
    let (other, other_key) = app.project_with_key();
    let empty: EndpointPage =
        app.get(&format!("/api/projects/{other}/endpoints"), &other_key).await.json().await.unwrap();
    assert_eq!(empty.count, 0);
}

#[tokio::test]
async fn stops_gracefully() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    assert_eq!(app.get(&format!("/api/projects/{project}/endpoints"), &key).await.status(), 200);
    let address = app.address.clone();
    let data_dir = app.data_dir.clone();
    app.stop().await.expect("a clean stop");
    std::fs::remove_dir_all(data_dir).unwrap();
    assert!(
        reqwest::get(format!("{address}/api/projects/1/endpoints")).await.is_err(),
        "no longer listening"
    );
}

#[tokio::test]
async fn a_dry_run_checks_a_create_or_an_update_and_saves_nothing() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let (_, reader) = app.create_key(project, &["endpoint:read"]);
    for family in FAMILIES {
        let base = format!("{family}/{project}/endpoints");
        let body = endpoint_body("kpi", "SELECT 1 AS n, 'a' AS label");
        let checked = app.post(&format!("{base}?dry_run=true"), &key, &body).await;
        assert_eq!(checked.status(), 200);
        assert!(checked.headers().get("location").is_none());
        let checked: Endpoint = checked.json().await.unwrap();
        let column = |name: &str, column_type| Column { name: name.into(), column_type };
        assert_eq!(
            checked.columns,
            Some(vec![column("n", ColumnType::Integer), column("label", ColumnType::String)])
        );
        assert_eq!((checked.name.as_str(), checked.current_version), ("kpi", 1));
        assert_error(app.get(&format!("{base}/kpi"), &key).await, 404, "not_found").await;

        // What a create refuses, a dry run refuses the same way; it needs the same scope.
        let bad = endpoint_body("kpi", "SELECT nope FROM missing");
        let err = assert_error(
            app.post(&format!("{base}?dry_run=true"), &key, &bad).await,
            400,
            "validation_error",
        )
        .await;
        assert_eq!(err.attr.as_deref(), Some("query"));
        let err = assert_error(
            app.post(&format!("{base}?dry_run=maybe"), &key, &body).await,
            400,
            "validation_error",
        )
        .await;
        assert_eq!(err.attr.as_deref(), Some("dry_run"));
        assert_error(
            app.post(&format!("{base}?dry_run=true"), &reader, &body).await,
            403,
            "permission_denied",
        )
        .await;

        // `false` is a real create; then the name is taken, for a dry run too.
        assert_eq!(app.post(&format!("{base}?dry_run=false"), &key, &body).await.status(), 201);
        assert_error(app.post(&format!("{base}?dry_run=true"), &key, &body).await, 409, "conflict").await;

        // An update answers the next version with its columns, and changes nothing.
        let change = json!({"description": "new", "query": {"kind": "SQLQuery", "query": "SELECT 2.5 AS x"}});
        let response = app.patch(&format!("{base}/kpi?dry_run=true"), &key, &change).await;
        assert_eq!(response.status(), 200);
        let checked: Endpoint = response.json().await.unwrap();
        assert_eq!((checked.current_version, checked.description.as_str()), (2, "new"));
        assert_eq!(checked.columns, Some(vec![column("x", ColumnType::Float)]));
        let stored: Endpoint = app.get(&format!("{base}/kpi"), &key).await.json().await.unwrap();
        assert_eq!((stored.current_version, stored.description.as_str()), (1, ""));
        let versions: VersionPage =
            app.get(&format!("{base}/kpi/versions"), &key).await.json().await.unwrap();
        assert_eq!(versions.count, 1);
        let bad = json!({"query": {"kind": "SQLQuery", "query": "SELECT {variables.x} AS x"}});
        let err = assert_error(
            app.patch(&format!("{base}/kpi?dry_run=true"), &key, &bad).await,
            400,
            "validation_error",
        )
        .await;
        assert_eq!(err.attr.as_deref(), Some("query"));
        assert_eq!(app.delete(&format!("{base}/kpi"), &key).await.status(), 204);
    }
}
