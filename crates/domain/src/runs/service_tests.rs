use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use time::macros::datetime;

use super::super::last_executions::{six_months_before, LastExecutionsRequest};
use super::super::record::{Recording, RunBy, CANCELLED};
use super::*;
use crate::clock::Timestamp;
use crate::endpoints::{CacheAge, MockEndpointStore};
use crate::error::Invalid;
use crate::logs::{LogKind, LogSource, Transport};
use crate::materialization::{MockMaterializationRecords, MockResultStorage, StoredColumn};
use crate::query::{Column, ColumnType, MockQueryEngine, Query};
use crate::testing::{self, KeptRunLog, ManualClock, T0};

/// Materialization ports for endpoints that are not materialized: any call fails the test.
fn untouched_materializations() -> MaterializationPorts {
    MaterializationPorts {
        states: Arc::new(MockMaterializationRecords::new()),
        results: Arc::new(MockResultStorage::new()),
    }
}

/// A real in-memory cache, so hits, expiry and invalidation are exercised for real.
#[derive(Default)]
struct MapCache {
    entries: Mutex<HashMap<CacheKey, Arc<CachedRun>>>,
    generations: Mutex<HashMap<(ProjectId, EndpointName), u64>>,
}

impl ResultCache for MapCache {
    fn generation(&self, project: ProjectId, name: &EndpointName) -> u64 {
        *self.generations.lock().unwrap().get(&(project, name.clone())).unwrap_or(&0)
    }
    fn get(&self, key: &CacheKey) -> Option<Arc<CachedRun>> {
        self.entries.lock().unwrap().get(key).cloned()
    }
    fn put(&self, key: CacheKey, run: Arc<CachedRun>) {
        self.entries.lock().unwrap().insert(key, run);
    }
    fn invalidate(&self, project: ProjectId, name: &EndpointName) {
        *self.generations.lock().unwrap().entry((project, name.clone())).or_insert(0) += 1;
    }
    fn invalidate_all(&self) {
        self.entries.lock().unwrap().clear();
    }
}

fn project() -> ProjectId {
    ProjectId::new(3).unwrap()
}

/// A key of the project: its runs are as sent.
fn principal() -> &'static Principal {
    static CALLER: std::sync::LazyLock<Principal> = std::sync::LazyLock::new(|| testing::caller(3));
    &CALLER
}

/// The caller's runs, over REST.
fn caller() -> RunBy<'static> {
    RunBy::now(principal(), Transport::Rest)
}

fn query(sql: &str) -> Query {
    Query::try_from(
        &json!({"kind": "SQLQuery", "query": sql, "variables": {"n": {"type": "Integer", "default": 1}}}),
    )
    .unwrap()
}

/// `kpi` at version 2, cached for a minute, its eligibility not recorded.
fn endpoint(active: bool) -> Endpoint {
    Endpoint {
        project_id: project(),
        is_active: active,
        cache_age: CacheAge::new(Some(60)).unwrap(),
        current_version: 2,
        versions_count: 2,
        eligibility: None,
        ..testing::endpoint("kpi", query("SELECT {variables.n} AS n"))
    }
}

/// Version `number` of `kpi`, whose query multiplies `n` by the number.
fn version(number: u32) -> EndpointVersion {
    EndpointVersion {
        version: number,
        query: query(&format!("SELECT {{variables.n}} * {number} AS n")),
        is_current: number == 2,
        ..testing::current_version(&endpoint(true))
    }
}

fn store(active: bool) -> MockEndpointStore {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(move |_, name| {
        if name.as_str() == "kpi" {
            Ok(endpoint(active))
        } else {
            Err(StoreError::NotFound)
        }
    });
    store.expect_get_version().returning(|_, _, v| {
        if v <= 2 {
            Ok(version(v))
        } else {
            Err(StoreError::VersionNotFound(v))
        }
    });
    store
}

/// An engine that answers `{"n": value}` (with the version's multiplier in the SQL) and counts its runs.
fn engine(runs: Arc<AtomicUsize>) -> MockQueryEngine {
    let runs_for_exports = Arc::clone(&runs);
    let mut engine = MockQueryEngine::new();
    engine.expect_execute().returning(move |_, query, vars, _, _| {
        runs.fetch_add(1, Ordering::SeqCst);
        let n = match vars.get("n") {
            Some(BoundValue::Integer(n)) => *n,
            other => panic!("{other:?}"),
        };
        let factor: i64 = query
            .sql
            .rsplit("* ")
            .next()
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        Ok(QueryResult {
            columns: vec![Column { name: "n".into(), column_type: ColumnType::Integer }],
            rows_json: format!("[{{\"n\":{}}}]", n * factor),
            row_count: 1,
            has_more: false,
            statistics: crate::query::Statistics::default(),
            read: Vec::new(),
        })
    });
    let exports = runs_for_exports;
    engine.expect_export().returning(move |_, _, _, limit, _, _| {
        exports.fetch_add(1, Ordering::SeqCst);
        Ok(page(if limit == 0 { "no rows" } else { "live" }))
    });
    engine
}

/// An exported page whose digest says where it came from.
fn page(source: &str) -> crate::query::Export {
    crate::query::Export {
        columns: vec![],
        rows: 1,
        has_more: false,
        bytes: 0,
        digest: source.into(),
        body: Box::pin(futures_util::stream::empty()),
    }
}

struct Fixture {
    service: RunService,
    log: Arc<KeptRunLog>,
    cache: Arc<MapCache>,
    clock: Arc<ManualClock>,
    runs: Arc<AtomicUsize>,
    executions: Arc<ExecutionTracker>,
}

fn fixture(store: MockEndpointStore) -> Fixture {
    let runs = Arc::new(AtomicUsize::new(0));
    let cache = Arc::new(MapCache::default());
    let clock = Arc::new(ManualClock::new(T0));
    let store: Arc<dyn EndpointStore> = Arc::new(store);
    let executions = Arc::new(ExecutionTracker::new(store.clone()));
    let log = Arc::new(KeptRunLog::default());
    let service = RunService::new(RunDeps {
        store,
        engine: Arc::new(engine(runs.clone())),
        cache: cache.clone(),
        clock: clock.clone(),
        executions: executions.clone(),
        materializations: untouched_materializations(),
        export_limit: RunRequest::DEFAULT_EXPORT_LIMIT,
        cursor_ttl: RunService::DEFAULT_CURSOR_TTL,
        log: log.clone(),
    });
    Fixture { service, log, cache, clock, runs, executions }
}

fn request(refresh: Refresh, vars: serde_json::Value) -> RunRequest {
    RunRequest {
        version: None,
        variables: vars.as_object().cloned().unwrap_or_default(),
        limit: 100,
        offset: 0,
        refresh,
        client_query_id: None,
        format: crate::query::ResultFormat::Json,
        max_staleness: None,
        as_of: None,
        cursor: None,
        followed: None,
    }
}

fn rows(outcome: &RunOutcome) -> &str {
    &outcome.run.as_ref().unwrap().result.rows_json
}

#[tokio::test]
async fn computations_read_the_endpoint_again_once_it_changes_or_a_second_has_passed() {
    // The store says which version is current, and counts its reads of the endpoint.
    let (reads, current) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(2)));
    let mut store = MockEndpointStore::new();
    let (counted, serving) = (Arc::clone(&reads), Arc::clone(&current));
    store.expect_get().returning(move |_, _| {
        counted.fetch_add(1, Ordering::SeqCst);
        let current_version = u32::try_from(serving.load(Ordering::SeqCst)).unwrap();
        Ok(Endpoint { current_version, ..endpoint(true) })
    });
    store.expect_get_version().returning(|_, _, v| Ok(version(v)));
    let f = fixture(store);
    let run = |version| {
        let request = RunRequest { version, ..request(Refresh::Direct, json!({"n": 5})) };
        f.service.run(caller(), project(), named("kpi"), request)
    };
    let read = || reads.load(Ordering::SeqCst);

    assert_eq!(rows(&run(None).await.unwrap()), r#"[{"n":10}]"#);
    assert_eq!(rows(&run(None).await.unwrap()), r#"[{"n":10}]"#);
    assert_eq!((read(), f.runs.load(Ordering::SeqCst)), (1, 2), "computed twice, read once");
    // Another version asked for is read, and does not replace the current one.
    assert_eq!(rows(&run(Some(1)).await.unwrap()), r#"[{"n":5}]"#);
    assert_eq!(rows(&run(Some(2)).await.unwrap()), r#"[{"n":10}]"#);
    assert_eq!(read(), 2);

    // Version 1 made current elsewhere, unannounced: trusted until a second has passed.
    current.store(1, Ordering::SeqCst);
    f.clock.advance(RunService::DEFINITION_TTL - Duration::from_millis(1));
    assert_eq!(rows(&run(None).await.unwrap()), r#"[{"n":10}]"#);
    f.clock.advance(Duration::from_millis(1));
    assert_eq!(rows(&run(None).await.unwrap()), r#"[{"n":5}]"#);
    assert_eq!(read(), 3);

    // Changed and announced (the endpoint's generation moves on): read at once.
    current.store(2, Ordering::SeqCst);
    f.cache.invalidate(project(), &EndpointName::parse("kpi").unwrap());
    assert_eq!(rows(&run(None).await.unwrap()), r#"[{"n":10}]"#);
    assert_eq!(read(), 4);
}

#[tokio::test]
async fn a_second_run_is_a_cache_hit_until_it_expires() {
    let f = fixture(store(true));
    let first = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"n": 5})))
        .await
        .unwrap();
    assert!(!first.is_cached);
    assert_eq!(rows(&first), r#"[{"n":10}]"#, "latest version (2) runs by default");
    assert_eq!(first.run.as_ref().unwrap().expires_at, Some(T0 + Duration::from_secs(60)));
    let second = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"n": 5})))
        .await
        .unwrap();
    assert!(second.is_cached);
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    assert_ne!(first.execution_id, second.execution_id);
    assert_eq!(second.fresh_for, Duration::from_secs(60), "a client may keep it as long as the cache does");
    f.clock.advance(Duration::from_secs(20));
    let later = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"n": 5})))
        .await
        .unwrap();
    assert_eq!((later.is_cached, later.fresh_for), (true, Duration::from_secs(40)));

    f.clock.advance(Duration::from_secs(41));
    let third = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"n": 5})))
        .await
        .unwrap();
    assert!(!third.is_cached, "expired");
    assert_eq!(f.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_cache_hit_touches_neither_store_nor_engine() {
    let f = fixture(store(true));
    f.service.run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    // A service over a store and an engine that fail on any call still answers from the cache.
    let strict = RunService::new(RunDeps {
        store: Arc::new(MockEndpointStore::new()),
        engine: Arc::new(MockQueryEngine::new()),
        cache: f.cache.clone(),
        clock: f.clock.clone(),
        executions: f.executions.clone(),
        materializations: untouched_materializations(),
        export_limit: RunRequest::DEFAULT_EXPORT_LIMIT,
        cursor_ttl: RunService::DEFAULT_CURSOR_TTL,
        log: Arc::new(crate::logs::NoRunLog),
    });
    let hit =
        strict.run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    assert!(hit.is_cached);
    assert_eq!(rows(&hit), r#"[{"n":2}]"#);
}

#[tokio::test]
async fn invalidation_makes_old_results_unreachable() {
    let f = fixture(store(true));
    f.service.run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    f.cache.invalidate(project(), &EndpointName::parse("kpi").unwrap());
    let after = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({})))
        .await
        .unwrap();
    assert!(!after.is_cached);
    assert_eq!(f.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn refresh_modes_use_the_cache_as_documented() {
    let f = fixture(store(true));
    let empty = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::ForceCache, json!({})))
        .await
        .unwrap();
    assert!(empty.run.is_none() && !empty.is_cached, "force_cache without a cached result");
    assert_eq!(f.runs.load(Ordering::SeqCst), 0);

    let direct =
        f.service.run(caller(), project(), named("kpi"), request(Refresh::Direct, json!({}))).await.unwrap();
    assert!(!direct.is_cached && direct.run.as_ref().unwrap().expires_at.is_none());
    let still_empty = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::ForceCache, json!({})))
        .await
        .unwrap();
    assert!(still_empty.run.is_none(), "direct does not fill the cache");

    f.service
        .run(caller(), project(), named("kpi"), request(Refresh::ForceBlocking, json!({})))
        .await
        .unwrap();
    let cached = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::ForceCache, json!({})))
        .await
        .unwrap();
    assert!(cached.is_cached, "force_blocking refreshes the cache");
    let forced = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::ForceBlocking, json!({})))
        .await
        .unwrap();
    assert!(!forced.is_cached, "force_blocking never reads the cache");
    assert_eq!(f.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn versions_can_be_pinned() {
    let f = fixture(store(true));
    let mut pinned = request(Refresh::Blocking, json!({"n": 4}));
    pinned.version = Some(1);
    let outcome = f.service.run(caller(), project(), named("kpi"), pinned.clone()).await.unwrap();
    assert_eq!((outcome.run.as_ref().unwrap().version, rows(&outcome)), (1, r#"[{"n":4}]"#));
    pinned.version = Some(9);
    assert!(matches!(
        f.service.run(caller(), project(), named("kpi"), pinned).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn unknown_and_inactive_endpoints_are_not_found() {
    let f = fixture(store(true));
    assert!(matches!(
        f.service.run(caller(), project(), named("other"), request(Refresh::Blocking, json!({}))).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(EndpointName::from_path("bad name"), Err(Error::NotFound(_))), "a name no endpoint has");
    let inactive = fixture(store(false));
    for refresh in [Refresh::Blocking, Refresh::ForceCache, Refresh::Direct] {
        assert!(matches!(
            inactive.service.run(caller(), project(), named("kpi"), request(refresh, json!({}))).await,
            Err(Error::NotFound(_))
        ));
    }
}

#[tokio::test]
async fn bad_variables_are_refused_before_the_engine() {
    let f = fixture(store(true));
    let err = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"m": 1})))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Invalid(ref i) if i.code == crate::error::Violation::UnknownVariable),
        "{err:?}"
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_version_that_no_longer_plans_answers_query_invalid_without_running() {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(|_, _| {
        Ok(Endpoint { plan_error: Some("Schema error: No field named n.".into()), ..endpoint(true) })
    });
    store.expect_get_version().returning(|_, _, v| {
        let plan_error = (v == 2).then(|| "Schema error: No field named n.".to_owned());
        Ok(EndpointVersion { plan_error, ..version(v) })
    });
    let f = fixture(store);
    for refresh in [Refresh::Blocking, Refresh::Direct, Refresh::ForceCache] {
        let err = f
            .service
            .run(caller(), project(), named("kpi"), request(refresh, json!({"n": 1})))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::QueryInvalid(ref r) if r.contains("No field named n")),
            "{refresh:?}: {err:?}"
        );
    }
    let csv =
        RunRequest { format: crate::query::ResultFormat::Csv, ..request(Refresh::Blocking, json!({"n": 1})) };
    assert!(matches!(
        f.service.export(caller(), project(), named("kpi"), csv).await,
        Err(Error::QueryInvalid(_))
    ));
    assert_eq!(f.runs.load(Ordering::SeqCst), 0, "nothing ran");
    // An older version that plans still runs.
    let pinned = RunRequest { version: Some(1), ..request(Refresh::Blocking, json!({"n": 3})) };
    assert_eq!(
        rows(&f.service.run(caller(), project(), named("kpi"), pinned).await.unwrap()),
        r#"[{"n":3}]"#
    );
}

#[tokio::test]
async fn a_query_the_engine_no_longer_plans_is_query_invalid() {
    let mut f = fixture(store(true));
    let mut engine = MockQueryEngine::new();
    engine.expect_execute().returning(|_, _, _, _, _| {
        Err(crate::error::EngineError::InvalidQuery("table 'sales' not found".into()))
    });
    let store: Arc<dyn EndpointStore> = Arc::new(store(true));
    f.service = RunService::new(RunDeps {
        store,
        engine: Arc::new(engine),
        cache: f.cache.clone(),
        clock: f.clock.clone(),
        executions: f.executions.clone(),
        materializations: untouched_materializations(),
        export_limit: RunRequest::DEFAULT_EXPORT_LIMIT,
        cursor_ttl: RunService::DEFAULT_CURSOR_TTL,
        log: Arc::new(crate::logs::NoRunLog),
    });
    let err = f
        .service
        .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"n": 1})))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QueryInvalid(ref r) if r.contains("sales")), "{err:?}");
}

#[tokio::test]
async fn exports_are_bounded_by_the_export_limit_and_record_their_run() {
    let mut f = fixture(store(true));
    let store: Arc<dyn EndpointStore> = Arc::new(store(true));
    f.service = RunService::new(RunDeps {
        store,
        engine: Arc::new(engine(f.runs.clone())),
        cache: f.cache.clone(),
        clock: f.clock.clone(),
        executions: f.executions.clone(),
        materializations: untouched_materializations(),
        export_limit: 500,
        cursor_ttl: RunService::DEFAULT_CURSOR_TTL,
        log: Arc::new(crate::logs::NoRunLog),
    });
    let csv = |limit| RunRequest {
        limit,
        format: crate::query::ResultFormat::Csv,
        ..request(Refresh::Blocking, json!({"n": 1}))
    };
    let err = f.service.export(caller(), project(), named("kpi"), csv(501)).await.unwrap_err();
    assert!(matches!(err, Error::Invalid(ref i) if i.attr.as_deref() == Some("limit")), "{err:?}");
    assert_eq!(f.runs.load(Ordering::SeqCst), 0);
    let exported = f.service.export(caller(), project(), named("kpi"), csv(500)).await.unwrap();
    assert_eq!((exported.version, exported.export.digest), (2, "live".into()));
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    let kpi = EndpointName::parse("kpi").unwrap();
    assert_eq!(f.executions.pending(project(), &kpi), Some(T0), "an export is a run of the endpoint");
}

/// An engine that takes its time without blocking the runtime, and counts its runs.
struct SlowEngine(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl QueryEngine for SlowEngine {
    async fn describe(
        &self,
        _: ProjectId,
        _: &Query,
    ) -> Result<crate::query::QueryDescription, crate::error::EngineError> {
        Ok(crate::query::QueryDescription::default())
    }

    async fn execute(
        &self,
        _: ProjectId,
        _: &Query,
        _: &std::collections::BTreeMap<String, BoundValue>,
        _: u32,
        _: u64,
    ) -> Result<QueryResult, crate::error::EngineError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(QueryResult {
            columns: vec![],
            rows_json: "[]".into(),
            row_count: 0,
            has_more: false,
            statistics: crate::query::Statistics::default(),
            read: Vec::new(),
        })
    }

    async fn export(
        &self,
        _: ProjectId,
        _: &Query,
        _: &std::collections::BTreeMap<String, BoundValue>,
        _: u32,
        _: u64,
        _: crate::query::ResultFormat,
    ) -> Result<crate::query::Export, crate::error::EngineError> {
        Err(crate::error::EngineError::Internal("these tests run JSON only".into()))
    }
}

/// A cache that keeps nothing, so only coalescing can save work.
struct NoCache;

impl ResultCache for NoCache {
    fn generation(&self, _: ProjectId, _: &EndpointName) -> u64 {
        0
    }
    fn get(&self, _: &CacheKey) -> Option<Arc<CachedRun>> {
        None
    }
    fn put(&self, _: CacheKey, _: Arc<CachedRun>) {}
    fn invalidate(&self, _: ProjectId, _: &EndpointName) {}
    fn invalidate_all(&self) {}
}

/// A service over the slow engine and no cache, and the engine's run counter.
fn slow_service() -> (Arc<RunService>, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn EndpointStore> = Arc::new(store(true));
    let service = RunService::new(RunDeps {
        store: store.clone(),
        engine: Arc::new(SlowEngine(runs.clone())),
        cache: Arc::new(NoCache),
        clock: Arc::new(ManualClock::new(T0)),
        executions: Arc::new(ExecutionTracker::new(store)),
        materializations: untouched_materializations(),
        export_limit: RunRequest::DEFAULT_EXPORT_LIMIT,
        cursor_ttl: RunService::DEFAULT_CURSOR_TTL,
        log: Arc::new(crate::logs::NoRunLog),
    });
    (Arc::new(service), runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_concurrent_misses_compute_once() {
    let (service, runs) = slow_service();
    let call = |vars: serde_json::Value| {
        let service = service.clone();
        tokio::spawn(async move {
            service.run(caller(), project(), named("kpi"), request(Refresh::Blocking, vars)).await
        })
    };
    let calls: Vec<_> = (0..4).map(|_| call(json!({"n": 1}))).chain([call(json!({"n": 2}))]).collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "four identical requests computed once, the different one apart"
    );
    assert!(service.in_flight.lock().unwrap().is_empty(), "finished computations leave the registry");

    // Direct runs are never shared.
    let direct: Vec<_> = (0..2)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                service.run(caller(), project(), named("kpi"), request(Refresh::Direct, json!({}))).await
            })
        })
        .collect();
    for call in direct {
        call.await.unwrap().unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_computation_abandoned_by_every_caller_is_cancelled() {
    let (service, runs) = slow_service();
    // The caller gives up (as a disconnected client's handler is dropped) before the engine finishes.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(50),
        service.run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({}))),
    )
    .await;
    assert!(abandoned.is_err());
    // A later identical request starts afresh instead of waiting on a dead computation.
    let outcome =
        service.run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    assert!(!outcome.is_cached);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn runs_record_execution_times_in_memory() {
    let mut store = store(true);
    let flushed = Arc::new(AtomicU64::new(0));
    let seen = flushed.clone();
    store.expect_record_executions().times(1).returning(move |batch| {
        seen.fetch_add(batch.len() as u64, Ordering::SeqCst);
        Ok(())
    });
    store.expect_last_executions().returning(|_, _, _| Ok((vec![], 0)));
    let f = fixture(store);
    f.service.run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    f.service.run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    let name = EndpointName::parse("kpi").unwrap();
    assert_eq!(f.executions.pending(project(), &name), Some(T0));

    let found = f
        .service
        .last_execution_times(project(), &names(&json!({"names": ["kpi", "never-ran"]})).unwrap())
        .await
        .unwrap();
    assert_eq!(found.results, vec![(name.clone(), T0)], "pending times show before any flush");
    assert_eq!(found.rows_read, 1, "the pending time was read from memory");
    assert_eq!(f.executions.flush().await.unwrap(), 1, "one write for both runs");
    assert_eq!(flushed.load(Ordering::SeqCst), 1);
    assert_eq!(f.executions.flush().await.unwrap(), 0);
}

#[test]
fn last_execution_times_validate_names() {
    let many: Vec<String> = (0..1001).map(|i| format!("e{i}")).collect();
    for body in [
        json!({}),
        json!({"names": []}),
        json!({"names": "kpi"}),
        json!({"names": [1]}),
        json!({"names": ["no way"]}),
        json!({"names": many}),
    ] {
        assert_eq!(names(&body).unwrap_err().attr.as_deref(), Some("names"), "{body}");
    }
    assert_eq!(names(&json!({"names": ["a"], "x": 1})).unwrap_err().attr.as_deref(), Some("x"));
    let twice = names(&json!({"names": ["a", "b", "a"]})).unwrap();
    assert_eq!(twice.names().iter().map(EndpointName::as_str).collect::<Vec<_>>(), ["a", "b"]);
}

/// A name as the adapters read it from a path.
fn named(name: &str) -> EndpointName {
    EndpointName::from_path(name).unwrap()
}

/// A last-execution-times body as the adapters read it.
fn names(body: &serde_json::Value) -> Result<LastExecutionsRequest, Invalid> {
    LastExecutionsRequest::try_from(body)
}

#[test]
fn six_months_is_calendar_months() {
    assert_eq!(six_months_before(datetime!(2026-11-22 10:00 UTC)), datetime!(2026-05-22 10:00 UTC));
    assert_eq!(six_months_before(datetime!(2026-03-15 0:00 UTC)), datetime!(2025-09-15 0:00 UTC));
    assert_eq!(six_months_before(datetime!(2026-08-31 12:00 UTC)), datetime!(2026-02-28 12:00 UTC));
}

mod materialized {
    use super::*;
    use crate::endpoints::SyncFrequency;
    use crate::error::EngineError;
    use crate::materialization::{MaterializationState, MaterializationStatus, MaterializedFilter};
    use crate::query::{CompareOp, ResultFormat};

    fn filters() -> Vec<MaterializedFilter> {
        vec![MaterializedFilter {
            column: StoredColumn::Output("n".into()),
            op: CompareOp::Eq,
            variable: "n".into(),
        }]
    }

    /// `kpi` materialized hourly; version 2 (current) can be materialized.
    fn materialized_store() -> MockEndpointStore {
        let mut store = MockEndpointStore::new();
        store.expect_get().returning(|_, _| {
            Ok(Endpoint {
                is_materialized: true,
                sync_frequency: Some(SyncFrequency::OneHour),
                ..endpoint(true)
            })
        });
        store.expect_get_version().returning(|_, _, v| {
            Ok(EndpointVersion {
                eligibility: Some(Eligibility::Eligible { filters: filters(), rollup: None }),
                ..version(v)
            })
        });
        store
    }

    /// The record of endpoint `id` whose stored result of version 2 at `location` was computed at `at`.
    fn record(id: uuid::Uuid, location: &str, at: Timestamp) -> MaterializationState {
        MaterializationState {
            endpoint_id: id,
            version: 2,
            status: MaterializationStatus::Completed,
            next_run_at: at + Duration::from_secs(3600),
            error: None,
            result: Some(StoredResult {
                version: 2,
                location: location.into(),
                row_count: 3,
                materialized_at: at,
                data_as_of: at,
                coverage: None,
                fold: None,
            }),
            lease: None,
            appended_since: None,
            full_refreshes: 1,
            last_folded_at: None,
            rows_folded: 0,
        }
    }

    /// A record whose stored result of version 2 was computed at `at`, counting its reads in `gets`.
    fn states(at: Timestamp, gets: Arc<AtomicUsize>) -> MockMaterializationRecords {
        let mut states = MockMaterializationRecords::new();
        states.expect_get().returning(move |id| {
            gets.fetch_add(1, Ordering::SeqCst);
            Ok(Some(record(id, "loc", at)))
        });
        states
    }

    /// Stored results that answer `[{"n":"stored"}]`, or fail, and count their reads.
    fn results(fail: bool, reads: Arc<AtomicUsize>) -> MockResultStorage {
        let mut results = MockResultStorage::new();
        let exports = Arc::clone(&reads);
        results.expect_read().returning(move |_, location, bound, limit, offset| {
            reads.fetch_add(1, Ordering::SeqCst);
            assert_eq!((location, limit, offset), ("loc", 100, 0));
            assert_eq!(bound, vec![(filters()[0].clone(), BoundValue::Integer(5))]);
            if fail {
                return Err(EngineError::Internal("the file is gone".into()));
            }
            Ok(QueryResult {
                columns: vec![],
                rows_json: r#"[{"n":"stored"}]"#.into(),
                row_count: 1,
                has_more: false,
                statistics: crate::query::Statistics::default(),
                read: Vec::new(),
            })
        });
        results.expect_export().returning(move |_, location, bound, limit, offset, format| {
            exports.fetch_add(1, Ordering::SeqCst);
            assert_eq!((location, limit, offset, format), ("loc", 100, 0, ResultFormat::Csv));
            assert_eq!(bound, vec![(filters()[0].clone(), BoundValue::Integer(5))]);
            if fail {
                return Err(EngineError::Internal("the file is gone".into()));
            }
            Ok(page("stored"))
        });
        results
    }

    fn export(refresh: Refresh) -> RunRequest {
        RunRequest { format: ResultFormat::Csv, ..request(refresh, json!({"n": 5})) }
    }

    /// Where an export's page came from, and when its stored result was computed.
    async fn exported(f: &Fixture, refresh: Refresh) -> (String, Option<Timestamp>) {
        let exported = f.service.export(caller(), project(), named("kpi"), export(refresh)).await.unwrap();
        (exported.export.digest, exported.materialized_at)
    }

    #[tokio::test]
    async fn exports_read_a_fresh_stored_result_in_the_modes_that_runs_do() {
        let (f, reads) = service(T0, false);
        for refresh in [Refresh::Blocking, Refresh::ForceCache] {
            assert_eq!(exported(&f, refresh).await, ("stored".into(), Some(T0)), "{refresh:?}");
        }
        for refresh in [Refresh::Direct, Refresh::ForceBlocking] {
            assert_eq!(exported(&f, refresh).await, ("live".into(), None), "{refresh:?}");
        }
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (2, 2));
        assert!(f.cache.entries.lock().unwrap().is_empty(), "exports do not go through the run cache");
    }

    #[tokio::test]
    async fn an_export_with_nothing_fresh_stored_runs_live_or_with_force_cache_is_a_page_of_no_rows() {
        let (f, reads) = service(T0, false);
        f.clock.advance(Duration::from_secs(3601));
        assert_eq!(exported(&f, Refresh::Blocking).await, ("live".into(), None));
        let ran_at = f.clock.now();
        f.clock.advance(Duration::from_secs(1));
        assert_eq!(exported(&f, Refresh::ForceCache).await, ("no rows".into(), None));
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (0, 2));
        let kpi = named("kpi");
        assert_eq!(
            f.executions.pending(project(), &kpi),
            Some(ran_at),
            "a page of no rows is not an execution"
        );
    }

    #[tokio::test]
    async fn a_failed_stored_export_falls_back_to_the_live_path() {
        let (f, reads) = service(T0, true);
        assert_eq!(exported(&f, Refresh::Blocking).await, ("live".into(), None));
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (1, 1));
    }

    fn service(at: Timestamp, fail: bool) -> (Fixture, Arc<AtomicUsize>) {
        let (f, reads, _) = service_counting(at, fail);
        (f, reads)
    }

    /// [`service`], with the count of the record's reads.
    fn service_counting(at: Timestamp, fail: bool) -> (Fixture, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (reads, gets) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let f = service_with(states(at, Arc::clone(&gets)), results(fail, reads.clone()));
        (f, reads, gets)
    }

    /// A service of `kpi` whose records and stored results are `states` and `results`.
    fn service_with(states: MockMaterializationRecords, results: MockResultStorage) -> Fixture {
        let mut f = fixture(materialized_store());
        let store: Arc<dyn EndpointStore> = Arc::new(materialized_store());
        f.service = RunService::new(RunDeps {
            store,
            engine: Arc::new(engine(f.runs.clone())),
            cache: f.cache.clone(),
            clock: f.clock.clone(),
            executions: f.executions.clone(),
            materializations: MaterializationPorts { states: Arc::new(states), results: Arc::new(results) },
            export_limit: RunRequest::DEFAULT_EXPORT_LIMIT,
            cursor_ttl: RunService::DEFAULT_CURSOR_TTL,
            log: Arc::new(crate::logs::NoRunLog),
        });
        f
    }

    /// The record kept names a result another process switched away from and removed before its announcement
    /// arrived: the read that fails has the record read again, and the result it names now answers.
    #[tokio::test]
    async fn a_kept_record_naming_a_removed_result_is_read_again() {
        let gets = Arc::new(AtomicUsize::new(0));
        let mut states = MockMaterializationRecords::new();
        let counted = Arc::clone(&gets);
        let switched_at = T0 + Duration::from_secs(10);
        states.expect_get().returning(move |id| {
            Ok(Some(match counted.fetch_add(1, Ordering::SeqCst) {
                0 => record(id, "loc", T0),
                _ => record(id, "switched", switched_at),
            }))
        });
        let mut results = MockResultStorage::new();
        let tried = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&tried);
        results.expect_export().returning(move |_, location, _, _, _, _| {
            seen.lock().unwrap().push(location.to_owned());
            match location {
                "loc" => Err(EngineError::Internal("the file is gone".into())),
                _ => Ok(page("stored")),
            }
        });
        let f = service_with(states, results);
        f.clock.advance(Duration::from_secs(10));
        assert_eq!(exported(&f, Refresh::Blocking).await, ("stored".into(), Some(switched_at)));
        assert_eq!(*tried.lock().unwrap(), ["loc", "switched"]);
        assert_eq!(f.runs.load(Ordering::SeqCst), 0, "not run live");
        // The record read again is the one kept.
        assert_eq!(exported(&f, Refresh::Blocking).await, ("stored".into(), Some(switched_at)));
        assert_eq!(gets.load(Ordering::SeqCst), 2);
    }

    /// The record naming the stored result is read once per cache generation: a switch to another result (which
    /// moves the generation on, here or as another process announces it) is seen at the next read, and a record
    /// is trusted no longer than a definition is.
    #[tokio::test]
    async fn the_stored_result_is_read_from_the_store_once_per_generation() {
        let (f, reads, gets) = service_counting(T0, false);
        for _ in 0..3 {
            assert_eq!(exported(&f, Refresh::Blocking).await, ("stored".into(), Some(T0)));
        }
        assert_eq!((reads.load(Ordering::SeqCst), gets.load(Ordering::SeqCst)), (3, 1));
        f.cache.invalidate(project(), &named("kpi"));
        assert_eq!(exported(&f, Refresh::Blocking).await, ("stored".into(), Some(T0)));
        assert_eq!(gets.load(Ordering::SeqCst), 2, "read again in the new generation");
        f.clock.advance(RunService::DEFINITION_TTL);
        assert_eq!(exported(&f, Refresh::Blocking).await, ("stored".into(), Some(T0)));
        assert_eq!(gets.load(Ordering::SeqCst), 3, "read again once the time to trust it passed");
    }

    #[tokio::test]
    async fn blocking_and_force_cache_runs_read_a_fresh_stored_result() {
        let (f, reads) = service(T0, false);
        for refresh in [Refresh::Blocking, Refresh::ForceCache] {
            f.cache.invalidate(project(), &EndpointName::parse("kpi").unwrap());
            let outcome = f
                .service
                .run(caller(), project(), named("kpi"), request(refresh, json!({"n": 5})))
                .await
                .unwrap();
            assert_eq!(rows(&outcome), r#"[{"n":"stored"}]"#, "{refresh:?}");
            assert!(outcome.endpoint_materialized);
            assert_eq!(outcome.run.as_ref().unwrap().materialized_at, Some(T0));
        }
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (2, 0));
    }

    /// Nobody ran it for its `hibernate_after_days` (a week): its stored result stopped following the tables, so a
    /// run answers live, however fresh the result looks; that run, recorded, wakes it.
    #[tokio::test]
    async fn a_hibernating_endpoint_answers_live_and_its_run_wakes_it() {
        let week = Duration::from_secs(7 * 86_400);
        let (f, reads) = service(T0 + week, false);
        f.clock.advance(week);
        let kpi = named("kpi");
        let first = f
            .service
            .run(caller(), project(), kpi.clone(), request(Refresh::Blocking, json!({"n": 5})))
            .await
            .unwrap();
        assert_eq!((rows(&first), first.endpoint_materialized), (r#"[{"n":10}]"#, false));
        assert_eq!(f.executions.pending(project(), &kpi), Some(T0 + week));
        f.cache.invalidate(project(), &kpi);
        let second = f
            .service
            .run(caller(), project(), kpi, request(Refresh::Blocking, json!({"n": 5})))
            .await
            .unwrap();
        assert_eq!((rows(&second), second.endpoint_materialized), (r#"[{"n":"stored"}]"#, true));
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (1, 1));
    }

    #[tokio::test]
    async fn direct_and_force_blocking_runs_bypass_it() {
        let (f, reads) = service(T0, false);
        for refresh in [Refresh::Direct, Refresh::ForceBlocking] {
            let outcome = f
                .service
                .run(caller(), project(), named("kpi"), request(refresh, json!({"n": 5})))
                .await
                .unwrap();
            assert_eq!(rows(&outcome), r#"[{"n":10}]"#);
            assert!(!outcome.endpoint_materialized);
        }
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (0, 2));
    }

    #[tokio::test]
    async fn a_result_older_than_one_sync_period_is_not_served() {
        let (f, reads) = service(T0, false);
        f.clock.advance(Duration::from_secs(3601));
        let outcome = f
            .service
            .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"n": 5})))
            .await
            .unwrap();
        assert_eq!((rows(&outcome), outcome.endpoint_materialized), (r#"[{"n":10}]"#, false));
        let forced = f
            .service
            .run(caller(), project(), named("kpi"), request(Refresh::ForceCache, json!({"n": 6})))
            .await
            .unwrap();
        assert!(
            forced.run.is_none(),
            "force_cache with nothing cached and nothing fresh stored answers no rows"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn every_answer_says_how_fresh_its_data_is_and_a_run_can_bound_it() {
        let (f, reads) = service(T0, false);
        f.clock.advance(Duration::from_secs(30));
        let run = |refresh, max: Option<i64>| {
            let mut request = request(refresh, json!({"n": 5}));
            request.max_staleness = RunRequest::max_staleness(max).unwrap();
            f.service.run(caller(), project(), named("kpi"), request)
        };
        // A stored answer has the stored result's data; a live one, the data as of its start.
        let stored = run(Refresh::Blocking, None).await.unwrap();
        assert_eq!((rows(&stored), stored.run.as_ref().unwrap().data_as_of), (r#"[{"n":"stored"}]"#, T0));
        let live = run(Refresh::Direct, None).await.unwrap();
        assert_eq!(live.run.as_ref().unwrap().data_as_of, T0 + Duration::from_secs(30));
        // The cached stored answer is 30 seconds old: a run that takes 60 gets it, one that takes 10 does not.
        let cached = run(Refresh::Blocking, Some(60)).await.unwrap();
        assert!(cached.is_cached);
        let bounded = run(Refresh::Blocking, Some(10)).await.unwrap();
        assert!(!bounded.is_cached && !bounded.endpoint_materialized, "computed live");
        assert_eq!(
            (rows(&bounded), bounded.run.as_ref().unwrap().data_as_of),
            (r#"[{"n":10}]"#, T0 + Duration::from_secs(30))
        );
        // That live answer replaced the cached one, so the next bounded run is answered from the cache.
        assert!(run(Refresh::Blocking, Some(10)).await.unwrap().is_cached);
        // force_cache never computes: with nothing recent enough it has no rows.
        f.cache.invalidate(project(), &EndpointName::parse("kpi").unwrap());
        assert!(run(Refresh::ForceCache, Some(10)).await.unwrap().run.is_none());
        assert!(run(Refresh::ForceCache, Some(30)).await.unwrap().run.is_some());
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (2, 2));
        // An export says so too.
        let mut csv = export(Refresh::Blocking);
        csv.max_staleness = RunRequest::max_staleness(Some(10)).unwrap();
        let exported = f.service.export(caller(), project(), named("kpi"), csv).await.unwrap();
        assert_eq!(
            (exported.materialized_at, exported.data_as_of),
            (None, Some(T0 + Duration::from_secs(30)))
        );
        let exported =
            f.service.export(caller(), project(), named("kpi"), export(Refresh::Blocking)).await.unwrap();
        assert_eq!((exported.materialized_at, exported.data_as_of), (Some(T0), Some(T0)));
    }

    #[tokio::test]
    async fn a_failed_read_falls_back_to_the_live_path() {
        let (f, reads) = service(T0, true);
        let outcome = f
            .service
            .run(caller(), project(), named("kpi"), request(Refresh::Blocking, json!({"n": 5})))
            .await
            .unwrap();
        assert_eq!((rows(&outcome), outcome.endpoint_materialized), (r#"[{"n":10}]"#, false));
        assert_eq!((reads.load(Ordering::SeqCst), f.runs.load(Ordering::SeqCst)), (1, 1));
    }
}

#[test]
fn request_keys_name_everything_that_changes_the_answer() {
    let mut latest = request(Refresh::Blocking, json!({"b": "2", "a": 1}));
    latest.limit = 7;
    latest.offset = 30;
    assert_eq!(request_key(&latest), r#"v=latest;limit=7;offset=30;vars={"a":1,"b":"2"}"#);
    let pinned = RunRequest { version: Some(12), ..latest };
    assert_eq!(request_key(&pinned), r#"v=12;limit=7;offset=30;vars={"a":1,"b":"2"}"#);
}

#[tokio::test]
async fn a_run_tokens_grant_is_applied_by_the_run_and_the_export_themselves() {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(|_, _| Ok(endpoint(true)));
    store.expect_get_version().returning(|_, _, v| Ok(version(v)));
    let f = fixture(store);
    let grant = crate::access::RunGrant {
        token_id: uuid::Uuid::nil(),
        endpoints: vec!["kpi".into()],
        fixed_variables: json!({"n": 7}).as_object().cloned().unwrap(),
        rate_limit_per_sec: None,
        versions: std::collections::BTreeMap::from([("kpi".to_owned(), vec![1])]),
        expires_at: T0 + Duration::from_secs(3600),
    };
    let holder = Principal { grant: Some(Arc::new(grant)), ..principal().clone() };
    let service = &f.service;
    let run = |who: Principal, version, vars| {
        let request = RunRequest { version, ..request(Refresh::Direct, vars) };
        async move { service.run(RunBy::now(&who, Transport::Rest), project(), named("kpi"), request).await }
    };

    // The token's variable is the run's (n = 7, times the current version's 2); a key's runs are as sent.
    assert_eq!(rows(&run(holder.clone(), None, json!({})).await.unwrap()), r#"[{"n":14}]"#);
    assert_eq!(rows(&run(principal().clone(), None, json!({"n": 1})).await.unwrap()), r#"[{"n":2}]"#);
    // The version it was issued for runs; another does not.
    assert_eq!(rows(&run(holder.clone(), Some(1), json!({})).await.unwrap()), r#"[{"n":7}]"#);
    assert!(matches!(run(holder.clone(), Some(2), json!({})).await, Err(Error::PermissionDenied(_))));
    // Its holder may not send the fixed variable, to a run or to an export; nothing is computed.
    let computed = f.runs.load(Ordering::SeqCst);
    let sent = run(holder.clone(), None, json!({"n": 1})).await.unwrap_err();
    assert!(matches!(&sent, Error::Invalid(i) if i.attr.as_deref() == Some("variables.n")), "{sent:?}");
    let csv =
        RunRequest { format: crate::query::ResultFormat::Csv, ..request(Refresh::Direct, json!({"n": 1})) };
    let exported = f
        .service
        .export(RunBy::now(&holder, Transport::Rest), project(), named("kpi"), csv)
        .await
        .unwrap_err();
    assert!(
        matches!(&exported, Error::Invalid(i) if i.attr.as_deref() == Some("variables.n")),
        "{exported:?}"
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), computed);
}

#[tokio::test]
async fn each_run_is_recorded_by_the_service_from_what_it_answered_by_the_services_clock() {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(|_, _| Ok(endpoint(true)));
    store.expect_get_version().returning(|_, _, v| Ok(version(v)));
    let f = fixture(store);
    let by = RunBy { request_id: Some("r1"), ..caller() };
    f.service.run(by, project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    f.clock.advance(Duration::from_nanos(1_500_700));
    f.service.run(by, project(), named("kpi"), request(Refresh::Blocking, json!({}))).await.unwrap();
    let unknown = f.service.run(by, project(), named("kpi"), request(Refresh::Blocking, json!({"m": 1})));
    assert!(unknown.await.is_err());
    let csv = RunRequest { format: crate::query::ResultFormat::Csv, ..request(Refresh::Direct, json!({})) };
    f.service.export(RunBy::now(principal(), Transport::Mcp), project(), named("kpi"), csv).await.unwrap();

    let records = f.log.records();
    let [live, hit, failed, exported] = &records[..] else { panic!("{records:#?}") };
    assert_eq!((live.kind, live.status, live.code.as_deref()), (LogKind::Run, 200, None));
    assert_eq!((live.version, live.rows, live.source), (Some(2), Some(1), Some(LogSource::Live)));
    assert_eq!((live.credential.as_deref(), live.transport), (Some("test-key"), Some(Transport::Rest)));
    assert_eq!((live.endpoint.as_str(), live.request_id.as_deref()), ("kpi", Some("r1")));
    assert_eq!(
        (hit.source, hit.bytes_read, hit.rows),
        (Some(LogSource::Cache), None, Some(1)),
        "read nothing"
    );
    // Filed under when it began by the service's clock (its time since it was asked before the clock's now),
    // to the microsecond.
    let now = T0 + Duration::from_nanos(1_500_700);
    assert!(hit.at <= now && now - hit.at < hit.duration + Duration::from_micros(1), "{hit:?}");
    assert_eq!(hit.at.nanosecond() % 1000, 0);
    assert_eq!(
        (failed.status, failed.code.as_deref(), failed.version, failed.rows, failed.source),
        (400, Some("unknown_variable"), None, None, None)
    );
    assert_eq!(
        (exported.transport, exported.source, exported.request_id.as_deref()),
        (Some(Transport::Mcp), Some(LogSource::Live), None)
    );
    assert!(records.windows(2).all(|pair| pair[0].id < pair[1].id), "ids follow the process's runs");
    assert!(live.id.get_version_num() == 8);
}

#[test]
fn a_run_refused_before_the_service_is_recorded_in_its_callers_project_only() {
    let f = fixture(MockEndpointStore::new());
    f.service.refused(caller(), project(), "kpi", 429, "rate_limited");
    // A name no endpoint can have, and a caller of another project: in no log.
    f.service.refused(caller(), project(), "no such/name", 400, "invalid");
    f.service.refused(caller(), ProjectId::new(4).unwrap(), "kpi", 403, "permission_denied");
    let records = f.log.records();
    let [refused] = &records[..] else { panic!("{records:#?}") };
    assert_eq!(
        (refused.project, refused.endpoint.as_str(), refused.status, refused.code.as_deref()),
        (project(), "kpi", 429, Some("rate_limited"))
    );
    assert_eq!((refused.version, refused.rows, refused.source), (None, None, None));
}

#[tokio::test]
async fn a_run_dropped_before_it_ends_is_recorded_as_cancelled() {
    let f = fixture(MockEndpointStore::new());
    let name = named("kpi");
    // A run still under way when its caller goes (its future dropped, as a transport drops it).
    let never = std::future::pending::<Result<(), Error>>();
    let mut running =
        Box::pin(Recording::start(&f.service, caller(), project(), &name).of(never, |()| unreachable!()));
    assert!(futures_util::FutureExt::now_or_never(&mut running).is_none(), "still running");
    assert!(f.log.records().is_empty(), "nothing filed while it runs");
    drop(running);
    let records = f.log.records();
    let [cancelled] = &records[..] else { panic!("{records:#?}") };
    assert_eq!((cancelled.status, cancelled.code.as_deref()), (CANCELLED.1, Some(CANCELLED.0)));
    // Filed once: a run that ended is not recorded again when its recording goes.
    let ended = Recording::start(&f.service, caller(), project(), &name);
    let failed = ended.of(async { Err::<(), _>(Error::NotFound("gone".into())) }, |()| unreachable!()).await;
    assert!(failed.is_err());
    let records = f.log.records();
    assert_eq!(records.len(), 2, "{records:#?}");
    assert_eq!((records[1].status, records[1].code.as_deref()), (404, Some("not_found")));
}
