//! The web console as the binary serves it: where it is, its content types, cache lifetimes and security
//! headers, its page for client-side routes, and that it never shadows the API. (What it does is tested in a
//! browser: `tests/console/console_e2e.py`.)

use reqwest::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LOCATION};
use reqwest::{Method, StatusCode};

use crate::helpers::{assert_error, spawn_app, TestApp};

/// The console's built page; `make test` builds the console before the tests.
fn built_page() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../console/dist/index.html");
    std::fs::read_to_string(path).expect("the console is built (make console) before these tests run")
}

async fn fetch(app: &TestApp, path: &str) -> reqwest::Response {
    app.request(Method::GET, path, None).send().await.unwrap()
}

fn header(response: &reqwest::Response, name: reqwest::header::HeaderName) -> &str {
    response.headers().get(&name).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

#[tokio::test]
async fn the_console_is_served_from_the_binary_with_strict_headers() {
    let app = spawn_app().await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();

    // `/` leads to the console.
    let home = client.get(format!("{}/", app.address)).send().await.unwrap();
    assert_eq!(home.status(), StatusCode::FOUND);
    assert_eq!(header(&home, LOCATION), "/console/");

    // The page, for the console's root and for any of its client-side routes, never cached without asking.
    let page = built_page();
    for path in ["/console/", "/console", "/console/endpoints/daily-revenue", "/console/tables/events?x=1"] {
        let response = fetch(&app, path).await;
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(header(&response, CONTENT_TYPE), "text/html; charset=utf-8", "{path}");
        assert_eq!(header(&response, CACHE_CONTROL), "no-cache", "{path}");
        let csp = header(&response, CONTENT_SECURITY_POLICY).to_owned();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
        assert_eq!(header(&response, "x-content-type-options".parse().unwrap()), "nosniff");
        assert_eq!(response.text().await.unwrap(), page, "{path}");
    }

    // A page the browser has is not sent again.
    let first = fetch(&app, "/console/").await;
    let etag = header(&first, ETAG).to_owned();
    assert!(etag.starts_with('"'), "{etag}");
    let again =
        app.request(Method::GET, "/console/", None).header(IF_NONE_MATCH, &etag).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert!(header(&again, CONTENT_SECURITY_POLICY).contains("default-src 'none'"));
    assert!(again.bytes().await.unwrap().is_empty());

    // Every file the page names is served with its type and cached for good; the page itself has no inline
    // script or style for the policy to refuse.
    let assets: Vec<&str> = page.split('"').filter(|part| part.starts_with("/console/assets/")).collect();
    assert!(
        assets.iter().any(|a| a.ends_with(".js")) && assets.iter().any(|a| a.ends_with(".css")),
        "{page}"
    );
    assert!(!page.contains("<style") && !page.contains("style="), "{page}");
    for asset in assets {
        let response = fetch(&app, asset).await;
        assert_eq!(response.status(), 200, "{asset}");
        let expected =
            if asset.ends_with(".js") { "text/javascript; charset=utf-8" } else { "text/css; charset=utf-8" };
        assert_eq!(header(&response, CONTENT_TYPE), expected, "{asset}");
        assert_eq!(header(&response, CACHE_CONTROL), "public, max-age=31536000, immutable", "{asset}");
    }
    // A file that does not exist is a 404, not the page.
    assert_error(fetch(&app, "/console/assets/nope-123.js").await, 404, "not_found").await;

    // The console never answers for the API, and other methods are refused.
    assert_error(fetch(&app, "/api/nope").await, 404, "not_found").await;
    let (project, key) = app.project_with_key();
    let listed = app.get(&format!("/api/projects/{project}/endpoints"), &key).await;
    assert_eq!(header(&listed, CONTENT_TYPE), "application/json");
    let post = app.request(Method::POST, "/console/endpoints", None).send().await.unwrap();
    assert_eq!(header(&post, "allow".parse().unwrap()), "GET, HEAD");
    assert_error(post, 405, "validation_error").await;
    let head = app.request(Method::HEAD, "/console/", None).send().await.unwrap();
    assert_eq!(head.status(), 200);
}
