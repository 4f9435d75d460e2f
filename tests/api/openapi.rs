//! Each endpoint's OpenAPI document. The documents are also written to `target/openapi-samples/`, where
//! `make test` checks them with a standard OpenAPI 3.0 validator.

use serde_json::{json, Value};

use crate::helpers::{assert_error, spawn_app, FAMILIES};

fn save_sample(name: &str, doc: &Value) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/openapi-samples");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.json")), serde_json::to_vec_pretty(doc).unwrap()).unwrap();
}

#[tokio::test]
async fn each_endpoint_version_has_a_typed_document() {
    let app = spawn_app().await;
    let (project, key) = app.project_with_key();
    let body = json!({"name": "sales-by-day", "description": "Sales per day",
        "query": {"kind": "SQLQuery",
                  "query": "SELECT CAST({variables.day} AS DATE) AS day, {variables.n} * 2 AS doubled, 1.5 AS ratio, 'x' AS label, true AS ok, [1, 2] AS tags WHERE {variables.on} AND 'a' IN {variables.codes}",
                  "variables": {"day": {"type": "Date", "default": "2026-01-01"}, "n": {"type": "Integer"},
                                "on": {"type": "Boolean", "default": true, "description": "Switch"},
                                "codes": {"type": "List", "default": ["a"]}}}});
    app.create_endpoint(project, &key, &body).await;

    let mut docs = Vec::new();
    for family in FAMILIES {
        let response =
            app.get(&format!("{family}/{project}/endpoints/sales-by-day/openapi.json"), &key).await;
        assert_eq!(response.status(), 200);
        docs.push(response.json::<Value>().await.unwrap());
    }
    assert_eq!(docs[0], docs[1], "both families give the same document");
    let doc = &docs[0];
    save_sample("sales-by-day-v1", doc);

    assert_eq!(doc["openapi"], "3.0.3");
    assert_eq!(
        (doc["info"]["title"].as_str(), doc["info"]["version"].as_str()),
        (Some("sales-by-day"), Some("1"))
    );
    assert_eq!(doc["info"]["description"], "Sales per day");
    assert_eq!(doc["servers"][0]["url"], app.address.as_str());
    let path = &doc["paths"][format!("/api/projects/{project}/endpoints/sales-by-day/run")];
    assert_eq!(path["post"]["operationId"], "run_sales_by_day");
    assert_eq!(path["get"]["operationId"], "run_sales_by_day_get");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        json!({"type": "http", "scheme": "bearer", "bearerFormat": "API key", "description": "A project API key with endpoint:read, sent as 'Authorization: Bearer phx_...'."})
    );
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    for code in ["200", "400", "401", "403", "404", "429"] {
        assert!(path["post"]["responses"][code].is_object(), "missing {code}");
    }

    let variables = &doc["components"]["schemas"]["RunRequest"]["properties"]["variables"];
    assert_eq!(variables["additionalProperties"], false);
    assert_eq!(variables["required"], json!(["n"]), "only the variable without a default");
    // A request's default is said in words: generators make a property with `default` required.
    assert_eq!(
        variables["properties"]["day"],
        json!({"type": "string", "format": "date", "description": "Default: \"2026-01-01\"."})
    );
    assert_eq!(variables["properties"]["n"], json!({"type": "integer", "format": "int64"}));
    assert_eq!(
        variables["properties"]["on"],
        json!({"type": "boolean", "description": "Switch. Default: true."})
    );
    assert_eq!(variables["properties"]["codes"]["type"], "array");
    assert_eq!(doc["components"]["schemas"]["RunRequest"]["additionalProperties"], false);
    assert_eq!(doc["components"]["schemas"]["RunRequest"]["required"], json!(["variables"]));

    let row = &doc["components"]["schemas"]["RunResult"]["properties"]["results"]["items"];
    let types: Vec<(String, Value)> = row["properties"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, schema)| (name.clone(), schema["type"].clone()))
        .collect();
    assert_eq!(
        types,
        [
            ("day", "string"),
            ("doubled", "integer"),
            ("label", "string"),
            ("ok", "boolean"),
            ("ratio", "number"),
            ("tags", "array")
        ]
        .map(|(n, t)| (n.to_owned(), json!(t)))
    );
    assert_eq!(row["properties"]["day"]["format"], "date");

    // A new version with other variables and columns has its own document; the old one stays reachable.
    let change = json!({"query": {"kind": "SQLQuery", "query": "SELECT {variables.label} AS label",
                                  "variables": {"label": {"type": "String", "default": "hi"}}}});
    app.patch(&format!("/api/projects/{project}/endpoints/sales-by-day"), &key, &change).await;
    let v2: Value = app
        .get(&format!("/api/projects/{project}/endpoints/sales-by-day/openapi.json"), &key)
        .await
        .json()
        .await
        .unwrap();
    save_sample("sales-by-day-v2", &v2);
    assert_eq!(v2["info"]["version"], "2");
    let v2_vars = &v2["components"]["schemas"]["RunRequest"]["properties"]["variables"];
    assert_eq!(v2_vars["properties"].as_object().unwrap().keys().collect::<Vec<_>>(), ["label"]);
    assert!(v2_vars.get("required").is_none(), "no required variable");
    let v1_again: Value = app
        .get(&format!("/api/projects/{project}/endpoints/sales-by-day/openapi.json?version=1"), &key)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(&v1_again, doc);

    let base = format!("/api/projects/{project}/endpoints");
    assert_error(
        app.get(&format!("{base}/sales-by-day/openapi.json?version=9"), &key).await,
        404,
        "not_found",
    )
    .await;
    let error = assert_error(
        app.get(&format!("{base}/sales-by-day/openapi.json?version=x"), &key).await,
        400,
        "validation_error",
    )
    .await;
    assert_eq!(error.attr.as_deref(), Some("version"));
    assert_error(app.get(&format!("{base}/nope/openapi.json"), &key).await, 404, "not_found").await;
}

#[tokio::test]
async fn the_service_document_covers_both_families_and_is_stable() {
    let app = spawn_app().await;
    let doc: Value =
        app.client.get(format!("{}/api/schema", app.address)).send().await.unwrap().json().await.unwrap();
    let again: Value =
        app.client.get(format!("{}/api/schema/", app.address)).send().await.unwrap().json().await.unwrap();
    assert_eq!(doc, again, "the document is the same on every request");
    save_sample("service", &doc);
    for family in ["projects", "environments"] {
        for suffix in [
            "",
            "/{name}",
            "/{name}/run",
            "/{name}/openapi.json",
            "/{name}/versions",
            "/{name}/versions/{version_number}",
            "/last_execution_times",
        ] {
            let path = format!("/api/{family}/{{project_id}}/endpoints{suffix}");
            assert!(doc["paths"][&path].is_object(), "missing {path}");
        }
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    // Every operation declares the answers any request may get; those that read a body, the body's too.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = &operation["responses"];
            for status in ["400", "429", "503"] {
                assert!(responses[status].is_object(), "{method} {path} lacks {status}");
            }
            if operation.get("requestBody").is_some() {
                for status in ["408", "413", "415"] {
                    assert!(responses[status].is_object(), "{method} {path} lacks {status}");
                }
            }
        }
    }

    // The interactive page is served by the binary itself.
    let page = app.client.get(format!("{}/api/docs", app.address)).send().await.unwrap();
    assert_eq!(page.status(), 200, "redirected to the page");
    assert!(page.text().await.unwrap().contains("Swagger UI"));
}
