//! Run tokens (contract section 15), black-box under both families: issuing, what a token may and may not do,
//! fixed variables, expiry, forgery, rotation, its own rate limit, tenant isolation under load, CORS, and when
//! keys were last used.

use std::collections::HashSet;
use std::time::Duration;

use base64::Engine as _;
use futures_util::stream::{self, StreamExt};
use http_actix::api::{RunResult, RunToken};
use rand::Rng;
use reqwest::{Method, Response};
use serde_json::{json, Value};

use crate::helpers::{assert_error, endpoint_body, project_with_sales, TestApp};

const FAMILIES: [&str; 2] = ["projects", "environments"];

fn by_country() -> Value {
    json!({
        "name": "by-country",
        "query": {
            "kind": "SQLQuery",
            "query": "SELECT country, count(*) AS n, sum(amount) AS total FROM sales \
                      WHERE country = {variables.country} GROUP BY country",
            "variables": {"country": {"type": "String", "default": "US"}}
        },
        "cache_age_seconds": 300
    })
}

async fn json_of(response: Response, status: u16) -> Value {
    let got = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}

/// A run's answer (asserting 200), as the API's type of it.
async fn answered(response: Response) -> RunResult {
    let body = json_of(response, 200).await;
    serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("{e}: {body}"))
}

async fn issue(app: &TestApp, family: &str, project: i64, key: &str, body: Value) -> String {
    let response = app.post(&format!("/api/{family}/{project}/run_tokens"), key, &body).await;
    // Its expiry is an RFC 3339 time, or it does not decode.
    let issued: RunToken = serde_json::from_value(json_of(response, 201).await).unwrap();
    issued.token
}

fn no_limits(config: &mut server::Config) {
    config.rate_limits = http_actix::RateLimitConfig::default();
    config.flush_interval = Duration::from_millis(100);
}

#[tokio::test]
async fn a_run_token_runs_only_its_endpoints_with_its_variables_fixed() {
    let app = TestApp::builder().tuned(no_limits).spawn().await;
    let (project, writer) = project_with_sales(&app);
    let (_, reader) = app.create_key(project, &["endpoint:read"]);
    app.create_endpoint(project, &writer, &by_country()).await;
    app.create_endpoint(project, &writer, &endpoint_body("other", "SELECT 1 AS one")).await;
    let (other_project, other_writer) = project_with_sales(&app);
    app.create_endpoint(other_project, &other_writer, &by_country()).await;

    for family in FAMILIES {
        let base = format!("/api/{family}/{project}/endpoints");
        let tokens = format!("/api/{family}/{project}/run_tokens");
        // Issuing: `endpoint:write` only, and a grant the endpoints can honour.
        let grant = json!({"endpoints": ["by-country"], "fixed_variables": {"country": "FR"}});
        assert_error(app.post(&tokens, &reader, &grant).await, 403, "permission_denied").await;
        assert_error(
            app.request(Method::POST, &tokens, None).json(&grant).send().await.unwrap(),
            401,
            "authentication_error",
        )
        .await;
        for (bad, attr) in [
            (
                json!({"endpoints": ["other"], "fixed_variables": {"country": "FR"}}),
                "fixed_variables.country",
            ),
            (
                json!({"endpoints": ["by-country"], "fixed_variables": {"country": 3}}),
                "fixed_variables.country",
            ),
            (json!({"endpoints": ["by-country"], "expires_in_seconds": 2_592_001}), "expires_in_seconds"),
            (json!({"endpoints": ["by-country"], "scopes": ["endpoint:write"]}), "scopes"),
        ] {
            let body = assert_error(app.post(&tokens, &writer, &bad).await, 400, "validation_error").await;
            assert_eq!(body.attr.as_deref(), Some(attr), "{body:?}");
        }
        let body = json!({"endpoints": ["by-country", "nope"]});
        let missing = assert_error(app.post(&tokens, &writer, &body).await, 404, "not_found").await;
        assert!(missing.detail.contains("'nope'"), "{missing:?}");
        let token = issue(&app, family, project, &writer, grant).await;

        // It runs its endpoint, by GET and POST, and sees only its tenant's rows.
        let run = format!("{base}/by-country/run");
        let answer = answered(app.get(&run, &token).await).await;
        assert_eq!(answer.results, json!([{"country": "FR", "n": 1, "total": 5.0}]), "{answer:?}");
        let answer = answered(app.post(&run, &token, &json!({})).await).await;
        assert_eq!(answer.results, json!([{"country": "FR", "n": 1, "total": 5.0}]), "{answer:?}");
        // A key sees what it asks for; the token's holder cannot ask.
        let us = answered(app.get(&format!("{run}?variables.country=US"), &reader).await).await;
        assert_eq!(us.results[0]["country"], "US");
        for response in [
            app.get(&format!("{run}?variables.country=US"), &token).await,
            app.get(&format!("{run}?variables.country=FR"), &token).await,
            app.get(&format!("{run}?variables={{\"country\":\"US\"}}"), &token).await,
            app.post(&run, &token, &json!({"variables": {"country": "US"}})).await,
            app.post(&run, &token, &json!({"variables": {"country": null}})).await,
        ] {
            let body = assert_error(response, 400, "validation_error").await;
            assert_eq!(
                (Some(body.code.as_str()), body.attr.as_deref()),
                (Some("fixed_variable"), Some("variables.country"))
            );
        }
        // Its OpenAPI document, not anything else.
        json_of(app.get(&format!("{base}/by-country/openapi.json"), &token).await, 200).await;
        let forbidden = [
            (Method::GET, format!("{base}/other/run")),
            (Method::POST, format!("{base}/other/run")),
            (Method::GET, format!("{base}/other/openapi.json")),
            (Method::GET, format!("{base}/nope/run")),
            (Method::GET, base.clone()),
            (Method::POST, base.clone()),
            (Method::GET, format!("{base}/by-country")),
            (Method::PATCH, format!("{base}/by-country")),
            (Method::DELETE, format!("{base}/by-country")),
            (Method::GET, format!("{base}/by-country/versions")),
            (Method::GET, format!("{base}/by-country/versions/1")),
            (Method::GET, format!("{base}/by-country/materialization_status")),
            (Method::POST, format!("{base}/last_execution_times")),
            (Method::GET, format!("/api/{family}/{project}/tables")),
            (Method::GET, format!("/api/{family}/{project}/tables/sales")),
            (Method::POST, tokens.clone()),
        ];
        for (method, path) in forbidden {
            let response =
                app.request(method.clone(), &path, Some(&token)).json(&json!({})).send().await.unwrap();
            let body = assert_error(response, 403, "permission_denied").await;
            assert!(body.detail.contains("run token"), "{method} {path}: {body:?}");
        }
        // Another project's path: the token is not valid there.
        let elsewhere = format!("/api/{family}/{other_project}/endpoints/by-country/run");
        assert_error(app.get(&elsewhere, &token).await, 401, "authentication_error").await;
        // The endpoint is still there, untouched.
        json_of(app.get(&format!("{base}/by-country"), &writer).await, 200).await;
    }
}

/// A fixed query binds the tokens already issued: a token runs (and documents) the current version unless it was
/// issued for the version named.
#[tokio::test]
async fn a_run_token_runs_the_current_version_unless_issued_for_another() {
    let app = TestApp::builder().tuned(no_limits).spawn().await;
    let (project, writer) = project_with_sales(&app);
    app.create_endpoint(
        project,
        &writer,
        &endpoint_body("leaky", "SELECT country FROM sales ORDER BY country"),
    )
    .await;
    let base = format!("/api/projects/{project}/endpoints/leaky");
    let fixed = json!({"query": {"kind": "SQLQuery", "query": "SELECT count(*) AS n FROM sales"}});
    json_of(app.patch(&base, &writer, &fixed).await, 200).await;
    let pinned = issue(&app, "projects", project, &writer, json!({"endpoints": ["leaky"]})).await;
    let current = answered(app.get(&format!("{base}/run"), &pinned).await).await;
    assert_eq!(
        (current.computed.endpoint_version, &current.results),
        (Some(2), &json!([{"n": 6}])),
        "{current:?}"
    );
    for response in [
        app.get(&format!("{base}/run?version=1"), &pinned).await,
        app.post(&format!("{base}/run"), &pinned, &json!({"version": 1})).await,
        app.post(&format!("{base}/run?version=1"), &pinned, &json!({})).await,
        app.get(&format!("{base}/run?version=2"), &pinned).await,
        app.get(&format!("{base}/openapi.json?version=1"), &pinned).await,
        app.get(&format!("{base}/openapi.json?version=x"), &pinned).await,
    ] {
        let body = assert_error(response, 403, "permission_denied").await;
        assert!(body.detail.contains("current version"), "{body:?}");
    }
    // The same with a key is allowed: the key holder is the endpoint's owner.
    json_of(app.get(&format!("{base}/run?version=1"), &writer).await, 200).await;

    // Issued for version 1 by name: that version, and the current one, and no other.
    let grant = json!({"endpoints": ["leaky"], "versions": {"leaky": [1]}});
    let named = issue(&app, "projects", project, &writer, grant).await;
    let old = answered(app.get(&format!("{base}/run?version=1"), &named).await).await;
    assert_eq!(old.computed.endpoint_version, Some(1), "{old:?}");
    json_of(app.get(&format!("{base}/openapi.json?version=1"), &named).await, 200).await;
    json_of(app.get(&format!("{base}/run"), &named).await, 200).await;
    assert_error(app.get(&format!("{base}/run?version=2"), &named).await, 403, "permission_denied").await;
    let tokens = format!("/api/projects/{project}/run_tokens");
    for (bad, attr) in [
        (json!({"endpoints": ["leaky"], "versions": {"leaky": [7]}}), "versions.leaky"),
        (json!({"endpoints": ["leaky"], "versions": {"other": [1]}}), "versions.other"),
        (json!({"endpoints": ["leaky"], "versions": {"leaky": [0]}}), "versions.leaky"),
        (json!({"endpoints": ["leaky"], "versions": {"leaky": "1"}}), "versions.leaky"),
        (json!({"endpoints": ["leaky"], "versions": [1]}), "versions"),
    ] {
        let body = assert_error(app.post(&tokens, &writer, &bad).await, 400, "validation_error").await;
        assert_eq!(body.attr.as_deref(), Some(attr), "{bad}: {body:?}");
    }
}

#[tokio::test]
async fn expired_forged_foreign_and_rotated_tokens_are_refused() {
    let app = TestApp::builder().tuned(no_limits).spawn().await;
    let (project, writer) = project_with_sales(&app);
    app.create_endpoint(project, &writer, &by_country()).await;
    let (other_project, other_writer) = project_with_sales(&app);
    app.create_endpoint(other_project, &other_writer, &by_country()).await;
    let run = format!("/api/projects/{project}/endpoints/by-country/run");
    let grant = json!({"endpoints": ["by-country"], "fixed_variables": {"country": "FR"}});
    let token = issue(&app, "projects", project, &writer, grant.clone()).await;
    json_of(app.get(&run, &token).await, 200).await;

    let refused = |response: Response| async move {
        assert_eq!(response.headers().get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
        assert_error(response, 401, "authentication_error").await
    };
    // The claims changed under the same signature (a wider tenant), or the signature changed.
    let parts: Vec<&str> = token.split('.').collect();
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims: Value = serde_json::from_slice(&engine.decode(parts[1]).unwrap()).unwrap();
    claims["fixed_variables"]["country"] = json!("US");
    let widened = format!("{}.{}.{}", parts[0], engine.encode(claims.to_string()), parts[2]);
    refused(app.get(&run, &widened).await).await;
    let mut signature = engine.decode(parts[2]).unwrap();
    signature[0] ^= 1;
    refused(app.get(&run, &format!("{}.{}.{}", parts[0], parts[1], engine.encode(signature))).await).await;
    // `alg: none`, unsigned.
    let none = engine.encode(json!({"alg": "none", "typ": "JWT", "kid": project.to_string()}).to_string());
    refused(app.get(&run, &format!("{none}.{}.", parts[1])).await).await;
    refused(app.get(&run, &format!("{none}.{}.{}", parts[1], parts[2])).await).await;
    // Signed for another project, claiming this one in its header.
    let foreign = issue(&app, "projects", other_project, &other_writer, grant.clone()).await;
    let foreign_parts: Vec<&str> = foreign.split('.').collect();
    let header = engine.encode(json!({"alg": "HS256", "typ": "JWT", "kid": project.to_string()}).to_string());
    refused(app.get(&run, &format!("{header}.{}.{}", foreign_parts[1], foreign_parts[2])).await).await;
    refused(app.get(&run, &foreign).await).await;
    // Garbage of a token's shape.
    refused(app.get(&run, "a.b.c").await).await;

    // Expired: a token of one second, a little later.
    let short = issue(
        &app,
        "projects",
        project,
        &writer,
        json!({"endpoints": ["by-country"], "expires_in_seconds": 1}),
    )
    .await;
    json_of(app.get(&run, &short).await, 200).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let body = refused(app.get(&run, &short).await).await;
    assert!(body.detail.contains("expired"), "{body:?}");

    // Rotated by the CLI (another process): every token of the project stops, within the cache's second.
    app.cli(&["project", "rotate-token-secret", "--project", &project.to_string()]);
    let mut refused_after = None;
    for attempt in 0..40 {
        if app.get(&run, &token).await.status() == 401 {
            refused_after = Some(attempt);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused_after.is_some(), "the token still worked 4 s after its secret was rotated");
    let fresh = issue(&app, "projects", project, &writer, grant).await;
    json_of(app.get(&run, &fresh).await, 200).await;
    // The other project's tokens are untouched.
    json_of(app.get(&format!("/api/projects/{other_project}/endpoints/by-country/run"), &foreign).await, 200)
        .await;
    let missing = app.cli_raw(&["project", "rotate-token-secret", "--project", "999999"]);
    assert!(!missing.status.success());
}

#[tokio::test]
async fn a_token_has_its_own_rate_and_its_uses_count_as_its_keys() {
    let app =
        TestApp::builder().tuned(|config| config.flush_interval = Duration::from_millis(100)).spawn().await;
    let (project, writer) = project_with_sales(&app);
    app.create_endpoint(project, &writer, &by_country()).await;
    let (issuer_id, issuer) = app.create_key(project, &["endpoint:write"]);
    let (idle_id, _) = app.create_key(project, &["endpoint:read"]);
    let run = format!("/api/projects/{project}/endpoints/by-country/run");
    let token = issue(
        &app,
        "projects",
        project,
        &issuer,
        json!({"endpoints": ["by-country"], "rate_limit_per_sec": 1}),
    )
    .await;

    // One a second, bursts of two.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(app.get(&run, &token).await.status().as_u16());
    }
    assert_eq!(&statuses[..2], [200, 200], "{statuses:?}");
    let limited = app.get(&run, &token).await;
    assert!(limited.headers().contains_key("retry-after"));
    let body = assert_error(limited, 429, "throttled").await;
    assert!(body.detail.contains("run token"), "{body:?}");
    // The issuing key is not slowed by its token.
    json_of(app.get(&run, &issuer).await, 200).await;

    // When each key was last used: the issuer's (its token's use included), never the idle one.
    let before = time::OffsetDateTime::now_utc();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    json_of(app.get(&run, &token).await, 200).await;
    let mut seen = None;
    for _ in 0..50 {
        let keys = app.cli(&["key", "list", "--project", &project.to_string()]);
        let find = |id: &str| keys.as_array().unwrap().iter().find(|k| k["id"] == id).unwrap().clone();
        let used = find(&issuer_id)["last_used_at"].as_str().map(|at| {
            time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).unwrap()
        });
        assert!(find(&idle_id)["last_used_at"].is_null(), "{keys}");
        if used.is_some_and(|at| at > before) {
            seen = used;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen.is_some(), "the token's use was not recorded as its key's");
}

#[tokio::test]
async fn a_thousand_tenants_see_only_their_own_rows() {
    let app = TestApp::builder()
        .tuned(|config| {
            no_limits(config);
            // Every tenant's first run is live, 64 at once.
            config.limits.max_concurrent_per_project = 64;
        })
        .spawn()
        .await;
    let project = app.create_project();
    let (_, writer) = app.create_key(project, &["endpoint:write", "table:write"]);
    // 200 customers with 1 to 5 orders each.
    let mut csv = String::from("customer_id,order_id,amount\n");
    let mut orders_of = vec![0_usize; 200];
    let mut order = 0;
    for (customer, count) in orders_of.iter_mut().enumerate() {
        *count = customer % 5 + 1;
        for _ in 0..*count {
            order += 1;
            csv.push_str(&format!("{customer},{order},{}.5\n", order % 97));
        }
    }
    let response = app
        .request(Method::PUT, &format!("/api/projects/{project}/tables/orders"), Some(&writer))
        .header("Content-Type", "text/csv")
        .body(csv)
        .send()
        .await
        .unwrap();
    json_of(response, 201).await;
    let endpoint = json!({
        "name": "my-orders",
        "query": {
            "kind": "SQLQuery",
            "query": "SELECT customer_id, order_id, amount FROM orders WHERE customer_id = {variables.customer_id} ORDER BY order_id",
            "variables": {"customer_id": {"type": "Integer", "required": true}}
        },
        "cache_age_seconds": 600
    });
    app.create_endpoint(project, &writer, &endpoint).await;

    // 1,000 tokens for random customers, some with no orders at all (ids past 199).
    let mut rng = rand::rng();
    let customers: Vec<usize> = (0..1000).map(|_| rng.random_range(0..250)).collect();
    let tokens: Vec<(usize, String)> = stream::iter(customers)
        .map(|customer| {
            let app = &app;
            let writer = &writer;
            async move {
                let grant = json!({"endpoints": ["my-orders"], "fixed_variables": {"customer_id": customer}});
                (customer, issue(app, "projects", project, writer, grant).await)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert_eq!(tokens.iter().map(|(_, t)| t).collect::<HashSet<_>>().len(), 1000, "every token is its own");

    // Every token runs at once, twice (the second time from the cache): each sees its customer's rows only.
    let run = format!("/api/projects/{project}/endpoints/my-orders/run");
    for pass in 0..2 {
        let checked: Vec<bool> = stream::iter(&tokens)
            .map(|(customer, token)| {
                let (app, run, orders_of) = (&app, &run, &orders_of);
                async move {
                    let answer = answered(app.get(run, token).await).await;
                    let rows = answer.results.as_array().unwrap();
                    let expected = orders_of.get(*customer).copied().unwrap_or(0);
                    assert_eq!(rows.len(), expected, "customer {customer}: {answer:?}");
                    assert!(
                        rows.iter().all(|row| row["customer_id"] == json!(customer)),
                        "customer {customer}: {answer:?}"
                    );
                    answer.request.is_cached
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        if pass == 1 {
            assert!(
                checked.iter().filter(|cached| **cached).count() >= 900,
                "the second pass is served from the cache"
            );
        }
    }
}

/// The CORS answers a browser reads, and what other origins and routes get: nothing.
#[tokio::test]
async fn allowed_origins_get_cors_on_run_routes_only() {
    let app = TestApp::builder().tuned(no_limits).spawn().await;
    let (project, writer) = project_with_sales(&app);
    app.create_endpoint(project, &writer, &by_country()).await;
    let token = issue(&app, "projects", project, &writer, json!({"endpoints": ["by-country"]})).await;
    let allowed = "https://shop.example.com";
    let updated = app.cli(&[
        "project",
        "update",
        "--project",
        &project.to_string(),
        "--allow-origin",
        "https://shop.example.com/",
        "--allow-origin",
        "http://localhost:8080",
    ]);
    assert_eq!(updated["allowed_origins"], json!(["http://localhost:8080", allowed]));
    let bad = app.cli_raw(&[
        "project",
        "update",
        "--project",
        &project.to_string(),
        "--allow-origin",
        "https://x.com/path",
    ]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("not an origin"));

    for family in FAMILIES {
        let run = format!("/api/{family}/{project}/endpoints/by-country/run");
        let preflight = |origin: &str, path: &str| {
            app.request(Method::OPTIONS, path, None)
                .header("Origin", origin)
                .header("Access-Control-Request-Method", "POST")
                .header("Access-Control-Request-Headers", "authorization, content-type")
                .send()
        };
        let acao = |response: &Response| {
            response.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap().to_owned())
        };
        // Allowed: an answered preflight, and the origin echoed on the run.
        let answered = preflight(allowed, &run).await.unwrap();
        assert_eq!(answered.status(), 200);
        assert_eq!(acao(&answered).as_deref(), Some(allowed));
        let methods = answered.headers()["access-control-allow-methods"].to_str().unwrap().to_owned();
        assert!(methods.contains("POST") && methods.contains("GET"), "{methods}");
        let headers = answered.headers()["access-control-allow-headers"].to_str().unwrap().to_lowercase();
        assert!(headers.contains("authorization") && headers.contains("content-type"), "{headers}");
        let response =
            app.request(Method::GET, &run, Some(&token)).header("Origin", allowed).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(acao(&response).as_deref(), Some(allowed));
        let exposed = response.headers()["access-control-expose-headers"].to_str().unwrap().to_lowercase();
        assert!(exposed.contains("etag") && exposed.contains("x-ratelimit-remaining"), "{exposed}");
        let openapi = format!("/api/{family}/{project}/endpoints/by-country/openapi.json");
        let response =
            app.request(Method::GET, &openapi, Some(&token)).header("Origin", allowed).send().await.unwrap();
        assert_eq!(acao(&response).as_deref(), Some(allowed));
        // Not from a page: no CORS header at all, only that the answer varies by origin.
        for path in [&run, &openapi] {
            let response = app.request(Method::GET, path, Some(&token)).send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            let cors: Vec<_> = response
                .headers()
                .keys()
                .filter(|name| name.as_str().starts_with("access-control-"))
                .collect();
            assert!(cors.is_empty(), "{path}: {cors:?}");
            assert_eq!(response.headers()["vary"], "Origin", "{path}");
        }

        // Another origin: a refused preflight, a run without CORS headers (the browser keeps it from the page).
        let refused = preflight("https://evil.example.com", &run).await.unwrap();
        assert_eq!(acao(&refused), None);
        assert_error(refused, 403, "permission_denied").await;
        let response = app
            .request(Method::GET, &run, Some(&token))
            .header("Origin", "https://evil.example.com")
            .send()
            .await
            .unwrap();
        assert_eq!((response.status().as_u16(), acao(&response)), (200, None));
        // @current cannot be resolved without a credential: no CORS.
        let current = format!("/api/{family}/@current/endpoints/by-country/run");
        assert_eq!(acao(&preflight(allowed, &current).await.unwrap()), None);
        // Other routes: no CORS, even for an allowed origin.
        for path in [
            format!("/api/{family}/{project}/endpoints"),
            format!("/api/{family}/{project}/endpoints/by-country"),
        ] {
            let response = app
                .request(Method::GET, &path, Some(&writer))
                .header("Origin", allowed)
                .send()
                .await
                .unwrap();
            assert_eq!((response.status().as_u16(), acao(&response)), (200, None), "{path}");
            assert_eq!(acao(&preflight(allowed, &path).await.unwrap()), None, "{path}");
        }
    }

    // Removing the origins takes effect within the cache's second.
    app.cli(&["project", "update", "--project", &project.to_string(), "--no-origins"]);
    let run = format!("/api/projects/{project}/endpoints/by-country/run");
    let mut gone = false;
    for _ in 0..40 {
        let response =
            app.request(Method::GET, &run, Some(&token)).header("Origin", allowed).send().await.unwrap();
        if !response.headers().contains_key("access-control-allow-origin") {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the removed origin still got CORS headers 4 s later");
    let projects = app.cli(&["project", "list"]);
    let listed = projects.as_array().unwrap().iter().find(|p| p["id"] == project).unwrap().clone();
    assert_eq!(listed["allowed_origins"], json!([]));
}
