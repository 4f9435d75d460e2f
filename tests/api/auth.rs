//! The auth matrix: no key, bad key, revoked, expired, read-only key writing, key of another project.

use reqwest::Method;
use serde_json::json;

use crate::helpers::{assert_error, endpoint_body, spawn_app, TestApp};

/// Any key of a project reads the project (its name, for the console's header), under both families and as
/// `@current`; another project's key and a run token may not.
#[tokio::test]
async fn any_key_of_a_project_reads_its_name_and_nothing_else_does() {
    let app = spawn_app().await;
    let (project, writer) = app.project_with_key();
    let (_, loader) = app.create_key(project, &["table:write"]);
    let (_, other_key) = app.project_with_key();
    for path in [
        format!("/api/projects/{project}"),
        format!("/api/environments/{project}/"),
        "/api/projects/@current".to_owned(),
    ] {
        let response = app.get(&path, &loader).await;
        assert_eq!(response.status(), 200, "{path}");
        let body: http_actix::api::Project = response.json().await.unwrap();
        assert_eq!((body.id, body.name.as_str()), (project, "Test"), "{body:?}");
        assert_error(
            app.get(&path.replace("@current", "999999"), &other_key).await,
            403,
            "permission_denied",
        )
        .await;
    }
    app.create_endpoint(project, &writer, &endpoint_body("n", "SELECT 1 AS n")).await;
    let issued =
        app.post(&format!("/api/projects/{project}/run_tokens"), &writer, &json!({"endpoints": ["n"]})).await;
    let token: http_actix::api::RunToken = issued.json().await.unwrap();
    let token = token.token.as_str();
    assert_error(app.get(&format!("/api/projects/{project}"), token).await, 403, "permission_denied").await;
    assert_error(app.get("/api/projects/1?verbose=1", &loader).await, 400, "validation_error").await;
}

#[tokio::test]
async fn the_auth_matrix() {
    let app = spawn_app().await;
    let (project, writer) = app.project_with_key();
    let (_, reader) = app.create_key(project, &["endpoint:read"]);
    let (revoked_id, revoked) = app.create_key(project, &["endpoint:write"]);
    let (other_project, other_key) = app.project_with_key();
    app.create_endpoint(project, &writer, &endpoint_body("secret-numbers", "SELECT 42 AS n")).await;
    app.cli(&["key", "revoke", &revoked_id]);

    let base = format!("/api/projects/{project}/endpoints");
    let one = format!("{base}/secret-numbers");
    // Every row, with the scope it needs.
    let reads = [
        (Method::GET, base.clone()),
        (Method::GET, one.clone()),
        (Method::GET, format!("{one}/versions")),
        (Method::GET, format!("{one}/versions/1")),
        (Method::GET, format!("{one}/run")),
        (Method::POST, format!("{one}/run")),
        (Method::GET, format!("{one}/openapi.json")),
        (Method::GET, format!("{one}/materialization_status")),
        (Method::POST, format!("{base}/last_execution_times")),
    ];
    let writes = [(Method::POST, base.clone()), (Method::PATCH, one.clone()), (Method::DELETE, one.clone())];

    for (method, path) in reads.iter().chain(writes.iter()) {
        for key in [None, Some("phx_nope"), Some("Bearer"), Some(revoked.as_str())] {
            let response = app.request(method.clone(), path, key).json(&json!({})).send().await.unwrap();
            assert_eq!(
                response.headers().get("www-authenticate").map(|v| v.to_str().unwrap()),
                Some("Bearer")
            );
            assert_error(response, 401, "authentication_error").await;
        }
        let response =
            app.request(method.clone(), path, Some(&other_key)).json(&json!({})).send().await.unwrap();
        assert_error(response, 403, "permission_denied").await;
        // A project that does not exist looks the same as one the key may not see.
        let missing = path.replace(&format!("/{project}/"), "/999999/");
        let response =
            app.request(method.clone(), &missing, Some(&writer)).json(&json!({})).send().await.unwrap();
        assert_error(response, 403, "permission_denied").await;
    }
    for (method, path) in &writes {
        let response =
            app.request(method.clone(), path, Some(&reader)).json(&json!({})).send().await.unwrap();
        let body = assert_error(response, 403, "permission_denied").await;
        assert!(body.detail.contains("endpoint:write"), "{body:?}");
    }
    for (method, path) in &reads {
        let response = app
            .request(method.clone(), path, Some(&reader))
            .json(&json!({"names": ["x"]}))
            .send()
            .await
            .unwrap();
        assert!(
            ![401, 403].contains(&response.status().as_u16()),
            "{method} {path} -> {}",
            response.status()
        );
    }
    // The other project's key works on its own project, and @current names it.
    let response = app.get(&format!("/api/projects/{other_project}/endpoints"), &other_key).await;
    assert_eq!(response.status(), 200);
    let response = app.get("/api/environments/@current/endpoints/", &other_key).await;
    assert_eq!(response.json::<http_actix::api::EndpointPage>().await.unwrap().count, 0);
}

/// Every route of both families against every combination of scopes a key can hold, and against a key of
/// another project holding all of them: a read route admits any scope, a write route needs `endpoint:write`,
/// and another project's key is refused everywhere.
#[tokio::test]
async fn every_route_of_both_families_against_every_scope_combination() {
    let app = spawn_app().await;
    let (project, writer) = app.project_with_key();
    app.create_endpoint(project, &writer, &endpoint_body("numbers", "SELECT 42 AS n")).await;
    let combinations: [&[&str]; 3] =
        [&["endpoint:read"], &["endpoint:write"], &["endpoint:read", "endpoint:write"]];
    let keys: Vec<(&[&str], String)> =
        combinations.iter().map(|scopes| (*scopes, app.create_key(project, scopes).1)).collect();
    let (other_project, _) = app.project_with_key();
    let (_, stranger) = app.create_key(other_project, &["endpoint:read", "endpoint:write"]);

    let mut checked = 0;
    for family in ["projects", "environments"] {
        let base = format!("/api/{family}/{project}/endpoints");
        let one = format!("{base}/numbers");
        // (method, path, body, needs write). Writes aim at what they cannot harm: a create without a name, an
        // update that changes nothing, a delete of an endpoint that does not exist.
        let routes = [
            (Method::GET, base.clone(), json!(null), false),
            (Method::POST, base.clone(), json!({}), true),
            (Method::GET, one.clone(), json!(null), false),
            (Method::PATCH, one.clone(), json!({}), true),
            (Method::DELETE, format!("{base}/no-such-endpoint"), json!(null), true),
            (Method::GET, format!("{one}/materialization_status"), json!(null), false),
            (Method::GET, format!("{one}/openapi.json"), json!(null), false),
            (Method::GET, format!("{one}/run"), json!(null), false),
            (Method::POST, format!("{one}/run"), json!({}), false),
            (Method::GET, format!("{one}/versions"), json!(null), false),
            (Method::GET, format!("{one}/versions/1"), json!(null), false),
            (Method::POST, format!("{base}/last_execution_times"), json!({"names": ["numbers"]}), false),
        ];
        for (method, path, body, needs_write) in &routes {
            let send = |key: &str| {
                let request = app.request(method.clone(), path, Some(key));
                if body.is_null() { request } else { request.json(body) }.send()
            };
            for (scopes, key) in &keys {
                let status = send(key).await.unwrap().status().as_u16();
                let allowed = !needs_write || scopes.contains(&"endpoint:write");
                if allowed {
                    let expected = match (method.as_str(), path.ends_with("no-such-endpoint")) {
                        ("POST", _) if path == &base => 400, // the create without a name
                        ("DELETE", true) => 404,
                        _ => 200,
                    };
                    assert_eq!(status, expected, "{method} {path} with {scopes:?}");
                } else {
                    let body = assert_error(send(key).await.unwrap(), 403, "permission_denied").await;
                    assert!(body.detail.contains("endpoint:write"), "{method} {path}: {body:?}");
                }
                checked += 1;
            }
            assert_error(send(&stranger).await.unwrap(), 403, "permission_denied").await;
        }
    }
    assert_eq!(checked, 2 * 12 * 3);
    // A refused delete of a real endpoint leaves it there, in both families.
    for family in ["projects", "environments"] {
        let one = format!("/api/{family}/{project}/endpoints/numbers");
        for key in [&keys[0].1, &stranger] {
            assert_error(
                app.request(Method::DELETE, &one, Some(key)).send().await.unwrap(),
                403,
                "permission_denied",
            )
            .await;
        }
    }
    assert_eq!(app.get(&format!("/api/projects/{project}/endpoints/numbers"), &writer).await.status(), 200);
}

#[tokio::test]
async fn revocation_takes_effect_within_the_key_cache_ttl_and_expiry_at_once() {
    let app = spawn_app().await;
    let project = app.create_project();
    let path = format!("/api/projects/{project}/endpoints");
    let (id, key) = app.create_key(project, &["endpoint:read"]);
    assert_eq!(app.get(&path, &key).await.status(), 200);
    // The CLI is another process: the server trusts the key it read for at most the cache TTL (1 s).
    app.cli(&["key", "revoke", &id]);
    let revoked_at = std::time::Instant::now();
    while app.get(&path, &key).await.status() == 200 {
        assert!(revoked_at.elapsed() < std::time::Duration::from_secs(3), "the revoked key still works");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_error(app.get(&path, &key).await, 401, "authentication_error").await;

    let short = app.cli(&[
        "key",
        "create",
        "--project",
        &project.to_string(),
        "--scope",
        "endpoint:read",
        "--expires-in",
        "1s",
    ]);
    let short_key = short["key"].as_str().unwrap();
    assert!(short["expires_at"].is_string());
    assert_eq!(app.get(&path, short_key).await.status(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_error(app.get(&path, short_key).await, 401, "authentication_error").await;
}

#[tokio::test]
async fn request_rates_are_limited_per_key_with_429_and_budget_headers() {
    let per_second = std::num::NonZeroU32::new(5).unwrap();
    let app = TestApp::builder()
        .tuned(|config| {
            config.rate_limits.per_key = Some(http_actix::Rate { per_second });
        })
        .spawn()
        .await;
    let (project, key) = app.project_with_key();
    let list = format!("/api/projects/{project}/endpoints");
    let mut remaining = Vec::new();
    for _ in 0..10 {
        let response = app.get(&list, &key).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-ratelimit-limit"], "10", "a burst of twice the rate");
        remaining.push(response.headers()["x-ratelimit-remaining"].to_str().unwrap().parse::<u32>().unwrap());
    }
    assert!(remaining.windows(2).all(|w| w[1] < w[0]), "the budget goes down: {remaining:?}");
    let over = app.get(&list, &key).await;
    assert_eq!(over.status(), 429);
    let retry_after: u64 = over.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert_eq!(over.headers()["x-ratelimit-remaining"], "0");
    let body: http_actix::ErrorBody = over.json().await.unwrap();
    assert_eq!((body.kind, body.code), (http_actix::ErrorType::Throttled, http_actix::Code::RateLimited));

    // Another key has its own budget; the limited one recovers after the wait it was given.
    let (_, other) = app.create_key(project, &["endpoint:read"]);
    assert_eq!(app.get(&list, &other).await.status(), 200);
    tokio::time::sleep(std::time::Duration::from_secs(retry_after)).await;
    assert_eq!(app.get(&list, &key).await.status(), 200);
}
