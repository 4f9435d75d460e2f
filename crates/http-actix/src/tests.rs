//! In-process tests of routing, auth, body handling and error mapping, with mocked ports.

use std::sync::Arc;

use actix_web::http::{header, Method, StatusCode};
use actix_web::test::{call_service, init_service, read_body_json, TestRequest};
use domain::testing::{api_key, current_version, endpoint, query};
use domain::{
    ApiKeyService, Column, ColumnType, EndpointDeps, EndpointService, EndpointVersion, ExecutionTracker,
    MaterializationPorts, MockApiKeyStore, MockClock, MockEndpointChanges, MockEndpointStore,
    MockMaterializationRecords, MockProjectStore, MockQueryEngine, MockResultCache, MockResultStorage,
    MockTableStore, NewEndpoint, Page, QueryResult, RunDeps, RunService, Scope, StoreError, TableDeps,
    TableService,
};
use serde_json::{json, Value};
use time::macros::datetime;
use uuid::Uuid;

use super::*;

const READER: &str = "phx_1111111111111111111111111111111111111111111111111111111111111111";
const WRITER: &str = "phx_2222222222222222222222222222222222222222222222222222222222222222";

/// `daily`, an active endpoint of project 1 answering `SELECT 1 AS n`.
fn sample() -> domain::Endpoint {
    endpoint("daily", query(json!({"kind": "SQLQuery", "query": "SELECT 1 AS n"})))
}

/// Materialization ports for endpoints that are not materialized: any call fails the test.
fn untouched_materializations() -> MaterializationPorts {
    MaterializationPorts {
        states: Arc::new(MockMaterializationRecords::new()),
        results: Arc::new(MockResultStorage::new()),
    }
}

fn state(store: MockEndpointStore, engine: MockQueryEngine) -> AppState {
    state_with_tables(store, engine, MockTableStore::new())
}

const TABLES: &str = "phx_4444444444444444444444444444444444444444444444444444444444444444";

fn state_with_tables(store: MockEndpointStore, engine: MockQueryEngine, tables: MockTableStore) -> AppState {
    state_logged(store, engine, tables, Arc::new(domain::NoRunLog))
}

/// As [`state_with_tables`], the runs recorded in `log`.
fn state_logged(
    store: MockEndpointStore,
    engine: MockQueryEngine,
    tables: MockTableStore,
    log: Arc<dyn domain::RunLog>,
) -> AppState {
    let mut keys = MockApiKeyStore::new();
    let known = [
        domain::ApiKey { id: Uuid::new_v4(), ..api_key(READER, vec![Scope::EndpointRead]) },
        domain::ApiKey { id: Uuid::new_v4(), ..api_key(WRITER, vec![Scope::EndpointWrite]) },
        domain::ApiKey { id: Uuid::new_v4(), ..api_key(TABLES, vec![Scope::TableWrite]) },
    ];
    keys.expect_find_by_hash()
        .returning(move |hash| Ok(known.iter().find(|k| k.secret_hash == hash).cloned()));
    let mut clock = MockClock::new();
    clock.expect_now().return_const(datetime!(2026-11-22 10:00 UTC));
    let clock = Arc::new(clock);
    let keys = ApiKeyService::new(Arc::new(keys), Arc::new(MockProjectStore::new()), clock.clone());
    let store = Arc::new(store);
    let engine = Arc::new(engine);
    let mut cache = MockResultCache::new();
    cache.expect_generation().return_const(0_u64);
    cache.expect_get().returning(|_| None);
    cache.expect_put().return_const(());
    let executions = Arc::new(ExecutionTracker::new(store.clone()));
    let runs = RunService::new(RunDeps {
        store: store.clone(),
        engine: engine.clone(),
        cache: Arc::new(cache),
        clock: clock.clone(),
        executions: executions.clone(),
        materializations: untouched_materializations(),
        export_limit: domain::RunRequest::DEFAULT_EXPORT_LIMIT,
        cursor_ttl: domain::RunService::DEFAULT_CURSOR_TTL,
        log,
    });
    let mut changes = MockEndpointChanges::new();
    changes.expect_changed().return_const(());
    changes.expect_settled().return_const(());
    let changes = Arc::new(changes);
    let mut announcer = domain::MockTableAnnouncer::new();
    announcer.expect_announce().returning(|_, _, _| Ok(()));
    announcer.expect_announce_and_settle().return_const(());
    let tables = TableService::new(TableDeps {
        tables: Arc::new(tables),
        endpoints: store.clone(),
        engine: engine.clone(),
        changes: changes.clone(),
        announcer: Arc::new(announcer),
        materializations: untouched_materializations().states,
        keys: Arc::new(domain::MockAppendKeys::new()),
        layouts: Arc::new(domain::MockTableReadersChanged::new()),
        clock: clock.clone(),
        append_in_flight: domain::APPEND_IN_FLIGHT,
    });
    let endpoints = EndpointService::new(EndpointDeps {
        store,
        engine,
        clock,
        materializations: untouched_materializations(),
        executions,
        changes,
    });
    AppState {
        body_limit: 256,
        upload_limit: 64,
        ..AppState::new(
            Arc::new(endpoints),
            Arc::new(runs),
            Arc::new(keys),
            Arc::new(tables),
            Arc::new(domain::LogService::new(
                Arc::new(MockEndpointStore::new()),
                Arc::new(domain::NoRunLog),
                Arc::new(domain::SystemClock),
            )),
        )
    }
}

fn store_with_daily() -> MockEndpointStore {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(|_, name| {
        if name.as_str() == "daily" {
            Ok(sample())
        } else {
            Err(StoreError::NotFound)
        }
    });
    store
}

async fn send(state: AppState, req: TestRequest) -> (StatusCode, actix_web::http::header::HeaderMap, Value) {
    let app = init_service(app(state)).await;
    let resp = call_service(&app, req.to_request()).await;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = if status == StatusCode::NO_CONTENT { Value::Null } else { read_body_json(resp).await };
    (status, headers, body)
}

fn authed(method: Method, uri: &str, key: &str) -> TestRequest {
    TestRequest::default()
        .method(method)
        .uri(uri)
        .insert_header((header::AUTHORIZATION, format!("Bearer {key}")))
}

#[actix_web::test]
async fn both_families_and_trailing_slashes_reach_the_same_handler() {
    for uri in [
        "/api/projects/1/endpoints/daily",
        "/api/projects/1/endpoints/daily/",
        "/api/environments/1/endpoints/daily",
        "/api/environments/@current/endpoints/daily/",
        "/api//projects/1//endpoints/daily//",
    ] {
        let (status, headers, body) =
            send(state(store_with_daily(), MockQueryEngine::new()), authed(Method::GET, uri, READER)).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        let id = headers.get("x-request-id").expect("every response carries its request id");
        assert_eq!(id.len(), 32, "a new id when the client sends none");
        assert_eq!(body["name"], "daily");
        assert_eq!(body["endpoint_path"], "/api/projects/1/endpoints/daily/run");
        assert_eq!(body["materialization"]["status"], "Disabled");
    }
}

#[actix_web::test]
async fn a_plain_client_request_id_is_echoed_and_a_hostile_one_replaced() {
    for (sent, kept) in
        [("trace-42.a_b", true), ("a b\tc", false), ("quote\"d", false), (&"x".repeat(200)[..], false)]
    {
        let req = authed(Method::GET, "/api/projects/1/endpoints/daily", READER)
            .insert_header(("x-request-id", sent));
        let (_, headers, _) = send(state(store_with_daily(), MockQueryEngine::new()), req).await;
        let echoed = headers.get("x-request-id").unwrap().to_str().unwrap();
        assert_eq!(echoed == sent, kept, "{sent:?} -> {echoed}");
    }
}

#[actix_web::test]
async fn authentication_and_authorization_errors() {
    let uri = "/api/projects/1/endpoints/daily";
    let (status, headers, body) =
        send(state(store_with_daily(), MockQueryEngine::new()), TestRequest::get().uri(uri)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers.get(header::WWW_AUTHENTICATE).unwrap(), "Bearer");
    assert_eq!(
        (body["type"].as_str(), body["code"].as_str()),
        (Some("authentication_error"), Some("not_authenticated"))
    );

    let basic = TestRequest::get().uri(uri).insert_header((header::AUTHORIZATION, "Basic abc"));
    assert_eq!(
        send(state(store_with_daily(), MockQueryEngine::new()), basic).await.0,
        StatusCode::UNAUTHORIZED
    );
    let unknown = authed(Method::GET, uri, &WRITER.replace('2', "3"));
    assert_eq!(
        send(state(store_with_daily(), MockQueryEngine::new()), unknown).await.0,
        StatusCode::UNAUTHORIZED
    );

    let (status, _, body) =
        send(state(store_with_daily(), MockQueryEngine::new()), authed(Method::DELETE, uri, READER)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["type"], "permission_denied");
    assert!(body["detail"].as_str().unwrap().contains("endpoint:write"));

    let other = authed(Method::GET, "/api/projects/2/endpoints/daily", WRITER);
    assert_eq!(send(state(store_with_daily(), MockQueryEngine::new()), other).await.0, StatusCode::FORBIDDEN);
    let malformed = authed(Method::GET, "/api/projects/x/endpoints/daily", WRITER);
    let (status, _, body) = send(state(store_with_daily(), MockQueryEngine::new()), malformed).await;
    assert_eq!((status, body["attr"].as_str()), (StatusCode::BAD_REQUEST, Some("project_id")));
}

#[actix_web::test]
async fn create_returns_201_and_conflicts_return_409() {
    let mut store = MockEndpointStore::new();
    store.expect_insert().times(1).returning(|new: NewEndpoint| {
        if new.name.as_str() == "taken" {
            Err(StoreError::NameTaken("taken".into()))
        } else {
            Ok(domain::Endpoint { name: new.name, ..sample() })
        }
    });
    let mut engine = MockQueryEngine::new();
    engine.expect_describe().returning(|_, _| Ok(domain::QueryDescription::default()));
    let body = json!({"name": "fresh", "query": {"kind": "SQLQuery", "query": "SELECT 1 AS n"}});
    let req = authed(Method::POST, "/api/projects/1/endpoints/", WRITER).set_json(&body);
    let (status, headers, created) = send(state(store, engine), req).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(created["name"], "fresh");
    assert_eq!(
        headers.get("location").unwrap(),
        &format!("/api/projects/{}/endpoints/fresh", sample().project_id)
    );

    let mut store = MockEndpointStore::new();
    store.expect_insert().returning(|_| Err(StoreError::NameTaken("taken".into())));
    let mut engine = MockQueryEngine::new();
    engine.expect_describe().returning(|_, _| Ok(domain::QueryDescription::default()));
    let body = json!({"name": "taken", "query": {"kind": "SQLQuery", "query": "SELECT 1 AS n"}});
    let req = authed(Method::POST, "/api/projects/1/endpoints", WRITER).set_json(&body);
    let (status, _, err) = send(state(store, engine), req).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        (err["type"].as_str(), err["code"].as_str(), err["attr"].as_str()),
        (Some("conflict"), Some("unique"), Some("name"))
    );
}

#[actix_web::test]
async fn bodies_are_checked_for_type_size_and_syntax() {
    let uri = "/api/projects/1/endpoints";
    let text = authed(Method::POST, uri, WRITER)
        .insert_header((header::CONTENT_TYPE, "text/plain"))
        .set_payload("{}");
    assert_eq!(
        send(state(MockEndpointStore::new(), MockQueryEngine::new()), text).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );

    let big = authed(Method::POST, uri, WRITER)
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .set_payload(format!("{{\"description\": \"{}\"}}", "x".repeat(300)));
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), big).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large")));

    let broken = authed(Method::POST, uri, WRITER)
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .set_payload("{\"name\": ");
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), broken).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("parse_error")));

    // Authentication comes before the body: a bad body without a key is a 401.
    let anonymous =
        TestRequest::post().uri(uri).insert_header((header::CONTENT_TYPE, "text/plain")).set_payload("x");
    assert_eq!(
        send(state(MockEndpointStore::new(), MockQueryEngine::new()), anonymous).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[actix_web::test]
async fn wrong_methods_get_405_with_allow_and_unknown_paths_404() {
    let req = authed(Method::PUT, "/api/projects/1/endpoints/daily", WRITER);
    let (status, headers, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers.get(header::ALLOW).unwrap(), "GET, PATCH, DELETE");
    assert_eq!(body["code"], "method_not_allowed");

    let req = authed(Method::GET, "/api/nothing/here", WRITER);
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
    assert_eq!((status, body["type"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
}

#[actix_web::test]
async fn last_execution_times_is_a_post_route_and_a_get_reads_an_endpoint_of_that_name() {
    let req = authed(Method::POST, "/api/projects/1/endpoints/last_execution_times/", READER)
        .set_json(json!({"names": []}));
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
    assert_eq!((status, body["attr"].as_str()), (StatusCode::BAD_REQUEST, Some("names")));

    let mut store = MockEndpointStore::new();
    store.expect_last_executions().returning(|_, names, _| {
        Ok((names.into_iter().map(|n| (n, datetime!(2026-11-20 8:00 UTC))).collect(), 1))
    });
    let req = authed(Method::POST, "/api/projects/1/endpoints/last_execution_times", READER)
        .set_json(json!({"names": ["daily"]}));
    let (status, _, body) = send(state(store, MockQueryEngine::new()), req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["query_status"]["results"], json!([["daily", "2026-11-20T08:00:00Z"]]));
    assert_eq!(body["query_status"]["team_id"], 1);

    let req = authed(Method::GET, "/api/projects/1/endpoints/last_execution_times", READER);
    let (status, _, _) = send(state(store_with_daily(), MockQueryEngine::new()), req).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no endpoint has that name");

    for method in [Method::OPTIONS, Method::PUT] {
        let req = authed(method.clone(), "/api/projects/1/endpoints/last_execution_times", READER);
        let (status, headers, body) =
            send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed"))
        );
        assert_eq!(
            headers.get("allow").unwrap(),
            "GET, POST, PATCH, DELETE",
            "{method}: every method the path answers"
        );
    }
}

fn store_for_runs() -> MockEndpointStore {
    let mut store = store_with_daily();
    store.expect_get_version().returning(|_, _, v| {
        if v == 1 {
            Ok(EndpointVersion {
                query: query(json!({"kind": "SQLQuery", "query": "SELECT {variables.n} AS n",
                    "variables": {"n": {"type": "Integer", "default": 1}}})),
                eligibility: None,
                ..current_version(&sample())
            })
        } else {
            Err(StoreError::VersionNotFound(v))
        }
    });
    store
}

fn engine_for_runs() -> MockQueryEngine {
    let mut engine = MockQueryEngine::new();
    engine.expect_execute().returning(|_, _, vars, _, _| {
        let n = match vars.get("n") {
            Some(domain::BoundValue::Integer(n)) => *n,
            other => panic!("{other:?}"),
        };
        Ok(QueryResult {
            columns: vec![Column { name: "n".into(), column_type: ColumnType::Integer }],
            rows_json: format!("[{{\"n\":{n}}}]"),
            row_count: 1,
            has_more: false,
            statistics: domain::Statistics::default(),
            read: Vec::new(),
        })
    });
    engine
}

/// Every operation of the service's document, under both families, refuses a parameter it does not declare,
/// naming it.
#[actix_web::test]
async fn every_operation_refuses_query_parameters_it_does_not_declare() {
    let doc = serde_json::to_value(crate::service_doc::document()).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let uri = path
            .replace("{project_id}", "1")
            .replace("{name}", "daily")
            .replace("{version_number}", "1")
            .replace("{table}", "events")
            .replace("{format}", "csv");
        for (method, operation) in item.as_object().unwrap() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let key = if path.contains("/tables") { TABLES } else { READER };
            let req = authed(method.clone(), &format!("{uri}?bogus_parameter=1"), key)
                .insert_header(header::ContentType::json())
                .set_payload("{}");
            let (status, _, body) = send(state(store_for_runs(), engine_for_runs()), req).await;
            let id = &operation["operationId"];
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path} ({id}): {body}");
            assert_eq!(body["attr"], "bogus_parameter", "{method} {path} ({id}): {body}");
            checked += 1;
        }
    }
    assert!(checked >= 40, "both families' operations: {checked}");
    let (status, _, body) = send(
        state(store_with_daily(), MockQueryEngine::new()),
        authed(Method::GET, "/api/projects/1/endpoints?limti=10", READER),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("Allowed parameters: limit, offset"), "{body}");
}

#[actix_web::test]
async fn runs_bind_variables_from_query_strings_and_bodies() {
    let req = authed(Method::GET, "/api/projects/1/endpoints/daily/run?variables.n=41&limit=5", READER);
    let (status, _, body) = send(state(store_for_runs(), engine_for_runs()), req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["results"], json!([{"n": 41}]));
    assert_eq!(body["columns"], json!(["n"]));
    assert_eq!(body["types"], json!([["n", "integer"]]));
    assert_eq!(
        (body["limit"].as_u64(), body["hasMore"].as_bool(), body["is_cached"].as_bool()),
        (Some(5), Some(false), Some(false))
    );
    assert_eq!(body["endpoint_version"], 1);

    let req = authed(Method::POST, "/api/projects/1/endpoints/daily/run/", READER)
        .set_json(json!({"variables": {"n": 7}, "client_query_id": "abc"}));
    let (status, _, body) = send(state(store_for_runs(), engine_for_runs()), req).await;
    assert_eq!((status, body["results"][0]["n"].as_i64()), (StatusCode::OK, Some(7)));
    assert_eq!(body["client_query_id"], "abc");

    for (req, attr) in [
        (
            authed(Method::GET, "/api/projects/1/endpoints/daily/run?variables.nope=1", READER),
            "variables.nope",
        ),
        (authed(Method::GET, "/api/projects/1/endpoints/daily/run?variables.n=abc", READER), "variables.n"),
        (authed(Method::GET, "/api/projects/1/endpoints/daily/run?refresh=async", READER), "refresh"),
        (authed(Method::GET, "/api/projects/1/endpoints/daily/run?limit=0", READER), "limit"),
        (
            authed(Method::POST, "/api/projects/1/endpoints/daily/run", READER).set_json(json!({"extra": 1})),
            "extra",
        ),
        (
            authed(Method::POST, "/api/projects/1/endpoints/daily/run", READER)
                .set_json(json!({"query_override": {"x": 1}})),
            "query_override",
        ),
    ] {
        let (status, _, body) = send(state(store_for_runs(), engine_for_runs()), req).await;
        assert_eq!((status, body["attr"].as_str()), (StatusCode::BAD_REQUEST, Some(attr)), "{body}");
    }
    let req = authed(Method::GET, "/api/projects/1/endpoints/daily/run?version=2", READER);
    assert_eq!(send(state(store_for_runs(), engine_for_runs()), req).await.0, StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn materialization_status_answers_for_existing_endpoints_only() {
    for family in ["projects", "environments"] {
        let req =
            authed(Method::GET, &format!("/api/{family}/1/endpoints/daily/materialization_status"), READER);
        let (status, _, body) = send(state(store_with_daily(), MockQueryEngine::new()), req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (body["name"].as_str(), body["status"].as_str(), body["can_materialize"].as_bool()),
            (Some("daily"), Some("Disabled"), Some(true))
        );
        assert_eq!((body["version"].as_u64(), body["reason"].is_null()), (Some(1), true));
        let req =
            authed(Method::GET, &format!("/api/{family}/1/endpoints/missing/materialization_status"), READER);
        assert_eq!(
            send(state(store_with_daily(), MockQueryEngine::new()), req).await.0,
            StatusCode::NOT_FOUND
        );
    }
    let req = TestRequest::default()
        .method(Method::GET)
        .uri("/api/projects/1/endpoints/daily/materialization_status");
    assert_eq!(
        send(state(store_with_daily(), MockQueryEngine::new()), req).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[actix_web::test]
async fn lists_link_to_neighbouring_pages_keeping_filters() {
    let mut store = MockEndpointStore::new();
    store.expect_list().returning(|_, _, page| Ok(Page { items: vec![sample()], total: 5, request: page }));
    let req = authed(Method::GET, "/api/projects/1/endpoints/?limit=1&offset=2&search=da", READER);
    let (status, _, body) = send(state(store, MockQueryEngine::new()), req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["count"], 5);
    assert_eq!(body["results"].as_array().unwrap().len(), 1);
    assert_eq!(body["next"], "http://localhost:8080/api/projects/1/endpoints?search=da&limit=1&offset=3");
    assert_eq!(body["previous"], "http://localhost:8080/api/projects/1/endpoints?search=da&limit=1&offset=1");

    let req = authed(Method::GET, "/api/projects/1/endpoints?limit=5000", READER);
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
    assert_eq!((status, body["attr"].as_str()), (StatusCode::BAD_REQUEST, Some("limit")));
}

#[actix_web::test]
async fn store_outages_are_503_and_failures_500_without_internals() {
    for (err, status) in [
        (StoreError::Unavailable("connection refused to 10.0.0.5".into()), StatusCode::SERVICE_UNAVAILABLE),
        (StoreError::Internal("syntax error at SELECT secret".into()), StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        let mut store = MockEndpointStore::new();
        let err = std::sync::Mutex::new(Some(err));
        store.expect_get().returning(move |_, _| Err(err.lock().unwrap().take().unwrap()));
        let req = authed(Method::GET, "/api/projects/1/endpoints/daily", READER);
        let (got, _, body) = send(state(store, MockQueryEngine::new()), req).await;
        assert_eq!(got, status);
        let text = body.to_string();
        assert!(!text.contains("10.0.0.5") && !text.contains("SELECT"), "{text}");
        assert_eq!(body["type"], "server_error");
    }
}

#[actix_web::test]
async fn engine_guards_map_to_429_and_query_errors() {
    use domain::EngineError;
    let cases: Vec<(EngineError, StatusCode, &str)> = vec![
        (
            EngineError::Busy { retry_after: std::time::Duration::from_millis(1500) },
            StatusCode::TOO_MANY_REQUESTS,
            "throttled",
        ),
        (EngineError::Timeout(std::time::Duration::from_secs(30)), StatusCode::BAD_REQUEST, "query_timeout"),
        (EngineError::MemoryLimit("pool exhausted".into()), StatusCode::BAD_REQUEST, "query_memory_limit"),
    ];
    for (err, status, code) in cases {
        let err = std::sync::Mutex::new(Some(err));
        let mut engine = MockQueryEngine::new();
        engine.expect_execute().returning(move |_, _, _, _, _| Err(err.lock().unwrap().take().unwrap()));
        let req = authed(Method::GET, "/api/projects/1/endpoints/daily/run", READER);
        let (got, headers, body) = send(state(store_for_runs(), engine), req).await;
        assert_eq!((got, body["code"].as_str()), (status, Some(code)));
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "2", "rounded up to whole seconds");
            assert_eq!(body["type"], "throttled");
        } else {
            assert_eq!(body["type"], "query_error");
        }
    }
}

struct FixedCheck(&'static str, Result<(), String>);

#[async_trait::async_trait]
impl ReadinessCheck for FixedCheck {
    fn name(&self) -> &'static str {
        self.0
    }

    async fn check(&self) -> Result<(), String> {
        self.1.clone()
    }
}

struct SlowCheck;

#[async_trait::async_trait]
impl ReadinessCheck for SlowCheck {
    fn name(&self) -> &'static str {
        "slow"
    }

    async fn check(&self) -> Result<(), String> {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        Ok(())
    }
}

fn with_checks(checks: Vec<Arc<dyn ReadinessCheck>>) -> AppState {
    state(MockEndpointStore::new(), MockQueryEngine::new())
        .with_operations(Operations { checks, metrics: Metrics::default() })
}

#[actix_web::test]
async fn health_needs_no_key_and_readiness_names_what_is_not_ready() {
    let (status, _, body) = send(with_checks(vec![]), TestRequest::get().uri("/healthz")).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));

    let ok: Vec<Arc<dyn ReadinessCheck>> =
        vec![Arc::new(FixedCheck("store", Ok(()))), Arc::new(FixedCheck("engine", Ok(())))];
    let (status, _, body) = send(with_checks(ok), TestRequest::get().uri("/readyz")).await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("ready")), "{body}");
    assert_eq!(
        (&body["checks"]["store"]["status"], &body["checks"]["engine"]["status"]),
        (&json!("ok"), &json!("ok"))
    );

    let failing: Vec<Arc<dyn ReadinessCheck>> = vec![
        Arc::new(FixedCheck("store", Err("The database does not answer.".into()))),
        Arc::new(FixedCheck("engine", Ok(()))),
    ];
    let (status, headers, body) = send(with_checks(failing), TestRequest::get().uri("/readyz")).await;
    assert_eq!((status, &body["status"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("unavailable")), "{body}");
    assert_eq!(
        body["checks"]["store"],
        json!({"status": "failed", "reason": "The database does not answer.", "took_ms": body["checks"]["store"]["took_ms"]})
    );
    assert_eq!(body["checks"]["engine"]["status"], "ok");
    assert!(headers.contains_key(header::RETRY_AFTER));

    // A check that hangs fails after its time limit (2 s) instead of holding the probe.
    let (status, _, body) =
        send(with_checks(vec![Arc::new(SlowCheck)]), TestRequest::get().uri("/readyz")).await;
    assert_eq!(
        (status, &body["checks"]["slow"]["status"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("failed"))
    );
}

#[actix_web::test]
async fn metrics_count_requests_by_route_and_status() {
    let app = init_service(app(state(store_for_runs(), engine_for_runs()))).await;
    for uri in
        ["/api/projects/1/endpoints/daily/run?variables.n=1", "/api/environments/1/endpoints/daily/run"]
    {
        let resp = call_service(&app, authed(Method::GET, uri, READER).to_request()).await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let resp =
        call_service(&app, authed(Method::GET, "/api/projects/2/endpoints/daily/run", READER).to_request())
            .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    call_service(&app, TestRequest::get().uri("/no/such/path").to_request()).await;
    let resp = call_service(&app, TestRequest::get().uri("/metrics").to_request()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp
        .headers()
        .get(header::CONTENT_TYPE)
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = String::from_utf8(actix_web::test::read_body(resp).await.to_vec()).unwrap();
    for line in [
        r#"endpoints_http_request_duration_seconds_count{route="run",method="GET",status="200"} 2"#,
        r#"endpoints_http_request_duration_seconds_count{route="run",method="GET",status="403"} 1"#,
        r#"endpoints_http_request_duration_seconds_count{route="unmatched",method="GET",status="404"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in:\n{text}");
    }
}

/// The run service records each run it is asked for; what the adapter tells it besides is each run it refused
/// before asking, in the caller's own project only, under the request's id.
#[actix_web::test]
async fn every_run_is_recorded_once_and_so_is_each_refusal_in_the_callers_project() {
    let log = Arc::new(domain::testing::KeptRunLog::default());
    let mut engine = engine_for_runs();
    engine.expect_export().returning(|_, _, _, _, _, _| {
        Ok(domain::Export {
            columns: vec![Column { name: "n".into(), column_type: ColumnType::Integer }],
            rows: 1,
            has_more: false,
            bytes: 4,
            digest: "0123456789abcdef0123456789abcdef".into(),
            body: Box::pin(futures_util::stream::once(async { Ok(bytes::Bytes::from_static(b"n\n3\n")) })),
        })
    });
    let state = state_logged(store_for_runs(), engine, MockTableStore::new(), log.clone());
    let app = init_service(app(state)).await;
    let mut ids = Vec::new();
    let base = "/api/projects/1/endpoints/daily";
    for (request, status) in [
        (authed(Method::GET, &format!("{base}/run?variables.n=2"), READER), StatusCode::OK),
        (authed(Method::GET, &format!("{base}/run?limti=10"), READER), StatusCode::BAD_REQUEST),
        (
            authed(Method::GET, &format!("{base}/run"), READER).insert_header((header::ACCEPT, "text/html")),
            StatusCode::NOT_ACCEPTABLE,
        ),
        (
            authed(Method::POST, &format!("{base}/run"), READER)
                .insert_header((header::CONTENT_TYPE, "application/json"))
                .set_payload("{nope"),
            StatusCode::BAD_REQUEST,
        ),
        (authed(Method::GET, &format!("{base}/run/csv?variables.n=3"), READER), StatusCode::OK),
        // A key of the project without endpoint:read.
        (authed(Method::GET, &format!("{base}/run"), TABLES), StatusCode::FORBIDDEN),
        // Another project's path, and a name no endpoint can have: in no log.
        (authed(Method::GET, "/api/projects/2/endpoints/daily/run", READER), StatusCode::FORBIDDEN),
        (authed(Method::GET, "/api/projects/1/endpoints/No%20Such/run", READER), StatusCode::NOT_FOUND),
    ] {
        let resp = call_service(&app, request.to_request()).await;
        assert_eq!(resp.status(), status);
        ids.push(resp.headers().get("x-request-id").unwrap().to_str().unwrap().to_owned());
    }
    let records = log.records();
    let seen: Vec<_> = records.iter().map(|r| (r.status, r.code.as_deref(), r.source)).collect();
    assert_eq!(
        seen,
        [
            (200, None, Some(domain::LogSource::Live)),
            (400, Some("invalid"), None),
            (406, Some("not_acceptable"), None),
            (400, Some("parse_error"), None),
            (200, None, Some(domain::LogSource::Live)),
            (403, Some("permission_denied"), None),
        ]
    );
    let named: Vec<_> = records.iter().map(|r| r.request_id.clone().unwrap()).collect();
    assert_eq!(named, ids[..6]);
    assert!(records.iter().all(|r| r.endpoint == "daily" && r.transport == Some(domain::Transport::Rest)));
    assert_eq!((records[0].version, records[0].rows), (Some(1), Some(1)));
}

#[actix_web::test]
async fn table_routes_need_table_scopes_and_read_uploads_by_content_type() {
    let uri = "/api/projects/1/tables/sales";
    // An endpoint writer may not touch tables; a table writer may not touch endpoints.
    let req = authed(Method::DELETE, uri, WRITER);
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body["detail"].as_str().unwrap().contains("table:write"), "{body}");
    let req = authed(Method::GET, "/api/projects/1/endpoints/daily", TABLES);
    assert_eq!(send(state(store_with_daily(), MockQueryEngine::new()), req).await.0, StatusCode::FORBIDDEN);

    // A body in a format tables are not read from, or declared over the limit, is refused before it is read.
    let req = authed(Method::PUT, uri, TABLES)
        .insert_header((header::CONTENT_TYPE, "application/xml"))
        .set_payload("<rows/>");
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("unsupported_media_type"))
    );
    assert!(body["detail"].as_str().unwrap().contains("text/csv"));
    let req = authed(Method::PUT, uri, TABLES)
        .insert_header((header::CONTENT_TYPE, "text/csv"))
        .set_payload("n\n".repeat(40));
    let (status, _, body) = send(state(MockEndpointStore::new(), MockQueryEngine::new()), req).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large")));

    // A CSV body reaches the store as its bytes, in the format its Content-Type names.
    let mut tables = MockTableStore::new();
    tables.expect_write().times(1).returning(|_, name, upload| {
        assert_eq!(
            (name.as_str(), upload.format, upload.mode),
            ("sales", domain::TableFormat::Csv, domain::WriteMode::Replace)
        );
        Ok(domain::Written { rows: 1, bytes: 4, created: true, rows_quarantined: 0 })
    });
    tables.expect_get().returning(|_, name| {
        Ok(Some(domain::TableInfo {
            name: name.clone(),
            columns: vec![],
            row_count: Some(1),
            bytes: Some(4),
            files: Some(1),
            last_compacted_at: None,
            layout: domain::TableLayout::default(),
            source: domain::TableSource::Upload,
            created_at: datetime!(2026-11-22 10:00 UTC),
            updated_at: datetime!(2026-11-22 10:00 UTC),
        }))
    });
    let mut store = MockEndpointStore::new();
    store.expect_readers().returning(|_, _| Ok(vec![]));
    let req = authed(Method::PUT, "/api/environments/1/tables/sales/", TABLES)
        .insert_header((header::CONTENT_TYPE, "text/csv; charset=utf-8"))
        .set_payload("n\n1\n");
    let (status, headers, body) = send(state_with_tables(store, MockQueryEngine::new(), tables), req).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(headers.get(header::LOCATION).unwrap(), "/api/projects/1/tables/sales");
    assert_eq!(
        (body["name"].as_str(), body["source"].as_str(), body["row_count"].as_u64()),
        (Some("sales"), Some("upload"), Some(1))
    );
    assert_eq!(body["used_by"], json!([]));
}

#[actix_web::test]
async fn run_answers_carry_their_tag_and_freshness_and_a_held_tag_gets_304() {
    let uri = "/api/projects/1/endpoints/daily/run?variables.n=3";
    let (status, headers, body) =
        send(state(store_for_runs(), engine_for_runs()), authed(Method::GET, uri, READER)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tag = headers.get(header::ETAG).expect("an ETag").to_str().unwrap().to_owned();
    assert!(tag.starts_with('"') && tag.len() == 34, "{tag}");
    // The default cache age (300 s) is what the cache has left of a run computed now.
    assert_eq!(headers.get(header::CACHE_CONTROL).unwrap(), "private, max-age=300");

    let app = init_service(app(state(store_for_runs(), engine_for_runs()))).await;
    for (held, expected) in [
        (tag.clone(), StatusCode::NOT_MODIFIED),
        (format!("W/{tag}"), StatusCode::NOT_MODIFIED),
        (format!("\"other\", {tag}"), StatusCode::NOT_MODIFIED),
        ("*".to_owned(), StatusCode::NOT_MODIFIED),
        ("\"other\"".to_owned(), StatusCode::OK),
    ] {
        let req = authed(Method::GET, uri, READER).insert_header((header::IF_NONE_MATCH, held.clone()));
        let resp = call_service(&app, req.to_request()).await;
        assert_eq!(resp.status(), expected, "{held}");
        assert_eq!(resp.headers().get(header::ETAG).unwrap().to_str().unwrap(), tag);
        let body = actix_web::test::read_body(resp).await;
        assert_eq!(body.is_empty(), expected == StatusCode::NOT_MODIFIED, "{held}");
    }
    // Other rows, another tag.
    let other = "/api/projects/1/endpoints/daily/run?variables.n=4";
    let (_, headers, _) =
        send(state(store_for_runs(), engine_for_runs()), authed(Method::GET, other, READER)).await;
    assert_ne!(headers.get(header::ETAG).unwrap().to_str().unwrap(), tag);
}

/// An engine that runs as `engine_for_runs` does, and whose exports write `n` (the bound variable) as a one-row
/// CSV, whatever format is asked.
fn exporting_engine() -> MockQueryEngine {
    let mut engine = engine_for_runs();
    engine.expect_export().returning(|_, _, vars, limit, _, format| {
        let n = match vars.get("n") {
            Some(domain::BoundValue::Integer(n)) => *n,
            other => panic!("{other:?}"),
        };
        let text = format!("n\n{n}\n# {} rows at most as {}\n", limit, format.as_str());
        Ok(domain::Export {
            columns: vec![Column { name: "n".into(), column_type: ColumnType::Integer }],
            rows: 1,
            has_more: true,
            bytes: text.len() as u64,
            digest: "0123456789abcdef0123456789abcdef".into(),
            body: Box::pin(futures_util::stream::once(async move { Ok(bytes::Bytes::from(text)) })),
        })
    });
    engine
}

#[actix_web::test]
async fn runs_are_written_in_the_format_asked_for_with_their_fields_in_headers() {
    let base = "/api/projects/1/endpoints/daily/run?variables.n=5";
    let send_with = |uri: String, accept: Option<&'static str>| {
        let mut req = authed(Method::GET, &uri, READER);
        if let Some(accept) = accept {
            req = req.insert_header((header::ACCEPT, accept));
        }
        let state = state(store_for_runs(), exporting_engine());
        async move {
            let app = init_service(app(state)).await;
            let resp = call_service(&app, req.to_request()).await;
            let (status, headers) = (resp.status(), resp.headers().clone());
            let body = String::from_utf8(actix_web::test::read_body(resp).await.to_vec()).unwrap();
            (status, headers, body)
        }
    };
    let (status, headers, body) = send_with(format!("{base}&format=csv&limit=20000"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "n\n5\n# 20000 rows at most as csv\n", "an export may pass the JSON page size");
    assert_eq!(headers.get(header::CONTENT_TYPE).unwrap(), "text/csv; charset=utf-8");
    assert_eq!(headers.get(header::ETAG).unwrap(), "\"0123456789abcdef0123456789abcdef\"");
    assert_eq!(headers.get(header::CACHE_CONTROL).unwrap(), "private, max-age=0");
    assert_eq!(headers.get("x-has-more").unwrap(), "true");
    assert_eq!(headers.get("x-endpoint-version").unwrap(), "1");
    assert_eq!(headers.get("x-is-cached").unwrap(), "false");
    assert_eq!(headers.get("x-execution-id").unwrap().len(), 36);
    assert!(headers.get(header::CONTENT_DISPOSITION).unwrap().to_str().unwrap().contains("daily.csv"));

    for (accept, expected) in [
        ("application/vnd.apache.parquet", "parquet"),
        ("application/xml;q=1, application/vnd.apache.arrow.stream;q=0.9", "arrow"),
        ("application/x-ndjson", "ndjson"),
    ] {
        let (status, _, body) = send_with(base.to_owned(), Some(accept)).await;
        assert_eq!(
            (status, body.ends_with(&format!("as {expected}\n"))),
            (StatusCode::OK, true),
            "{accept}: {body}"
        );
    }
    let (status, _, body) = send_with(base.to_owned(), Some("application/xml")).await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE, "{body}");
    assert!(body.contains("not_acceptable"));
    // An explicit format wins over what Accept says, and JSON is still the run answer.
    let (status, _, body) = send_with(format!("{base}&format=json"), Some("application/xml")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("\"results\""));
    let (status, _, body) = send_with(format!("{base}&limit=20000"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a JSON page holds at most 10000 rows: {body}");
    let (status, _, _) = send_with(format!("{base}&format=xlsx"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, body) = send_with(format!("{base}&format=csv"), Some("*/*")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("n\n5\n"));
}
