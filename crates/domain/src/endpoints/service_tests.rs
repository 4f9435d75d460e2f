use std::sync::Arc;

use mockall::predicate::{always, eq};
use serde_json::{json, Value};
use time::macros::datetime;

use super::super::ports::{MockEndpointChanges, MockEndpointStore};
use super::*;
use crate::clock::{MockClock, Timestamp};
use crate::endpoints::{CacheAge, EndpointFilter, Freshness, Hibernation};
use crate::error::EngineError;
use crate::materialization::{MockMaterializationRecords, MockResultStorage};
use crate::query::{Column, ColumnType, MockQueryEngine, Query, QueryDescription, VariableType};

const NOW: Timestamp = datetime!(2026-11-22 10:00 UTC);

fn project() -> ProjectId {
    ProjectId::new(7).unwrap()
}

fn clock() -> Arc<MockClock> {
    let mut clock = MockClock::new();
    clock.expect_now().return_const(NOW);
    Arc::new(clock)
}

fn columns() -> Vec<Column> {
    vec![Column { name: "n".into(), column_type: ColumnType::Integer }]
}

fn describing_engine() -> MockQueryEngine {
    let mut engine = MockQueryEngine::new();
    engine.expect_describe().returning(|_, _| Ok(description()));
    engine
}

fn description() -> QueryDescription {
    QueryDescription { columns: columns(), outline: Default::default(), tables: vec!["events".into()] }
}

/// The service over `store` and `engine`, with the collaborators most tests do not look at: no materialization
/// record, stored results removed, changes heard.
fn deps(store: MockEndpointStore, engine: MockQueryEngine) -> EndpointDeps {
    let store = Arc::new(store);
    let mut states = MockMaterializationRecords::new();
    states.expect_get().returning(|_| Ok(None));
    states.expect_get_many().returning(|_| Ok(Vec::new()));
    states.expect_reschedule().returning(|_, _| Ok(()));
    let mut results = MockResultStorage::new();
    results.expect_remove().returning(|_, _| Ok(()));
    let mut changes = MockEndpointChanges::new();
    changes.expect_changed().return_const(());
    changes.expect_settled().return_const(());
    EndpointDeps {
        executions: Arc::new(ExecutionTracker::new(store.clone())),
        store,
        engine: Arc::new(engine),
        clock: clock(),
        materializations: MaterializationPorts { states: Arc::new(states), results: Arc::new(results) },
        changes: Arc::new(changes),
    }
}

fn service(store: MockEndpointStore, engine: MockQueryEngine) -> EndpointService {
    EndpointService::new(deps(store, engine))
}

/// A store whose insert echoes what it is given, as a real store would.
fn echoing_store() -> MockEndpointStore {
    let mut store = MockEndpointStore::new();
    store.expect_insert().returning(|new| Ok(saved(new)));
    store
}

fn saved(new: NewEndpoint) -> Endpoint {
    new.unsaved()
}

fn body(extra: Value) -> Value {
    let mut base = json!({"name": "daily", "query": {"kind": "SQLQuery", "query": "SELECT 1 AS n"}});
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

fn existing() -> Endpoint {
    let query = Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT 1 AS n"})).unwrap();
    saved(NewEndpoint {
        id: Uuid::nil(),
        project_id: project(),
        name: EndpointName::parse("daily").unwrap(),
        description: "old".into(),
        query,
        columns: columns(),
        eligibility: Eligibility::Eligible { filters: vec![], rollup: None },
        tables: vec![],
        derived_from_insight: None,
        is_active: true,
        is_materialized: false,
        cache_age: CacheAge::default(),
        sync_frequency: None,
        freshness: Freshness::default(),
        hibernation: Hibernation::default(),
        created_at: NOW,
    })
}

/// The service called as its adapters call it: a body read into its command first, a name from a path.
impl EndpointService {
    async fn create_json(&self, project: ProjectId, body: &Value) -> Result<Endpoint, Error> {
        self.create(project, CreateEndpoint::try_from(body)?).await
    }

    async fn check_create_json(&self, project: ProjectId, body: &Value) -> Result<Endpoint, Error> {
        self.check_create(project, CreateEndpoint::try_from(body)?).await
    }

    async fn update_json(&self, project: ProjectId, name: &str, body: &Value) -> Result<Endpoint, Error> {
        let name = EndpointName::from_path(name)?;
        self.update(project, &name, EndpointPatch::try_from(body)?).await
    }

    async fn check_update_json(
        &self,
        project: ProjectId,
        name: &str,
        body: &Value,
    ) -> Result<Endpoint, Error> {
        let name = EndpointName::from_path(name)?;
        self.check_update(project, &name, EndpointPatch::try_from(body)?).await
    }

    async fn get_named(&self, project: ProjectId, name: &str) -> Result<Endpoint, Error> {
        self.get(project, &EndpointName::from_path(name)?).await
    }

    async fn delete_named(&self, project: ProjectId, name: &str) -> Result<(), Error> {
        self.delete(project, &EndpointName::from_path(name)?).await
    }

    async fn version_named(
        &self,
        project: ProjectId,
        name: &str,
        number: &str,
    ) -> Result<EndpointVersion, Error> {
        let number = VersionNumber::parse_field("version_number", number)?;
        self.version(project, &EndpointName::from_path(name)?, number).await
    }
}

fn invalid_attr(err: Error) -> String {
    match err {
        Error::Invalid(invalid) => invalid.attr.unwrap_or_default(),
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_applies_defaults_and_records_columns() {
    let created =
        service(echoing_store(), describing_engine()).create_json(project(), &body(json!({}))).await.unwrap();
    assert!(created.is_active);
    assert!(!created.is_materialized);
    assert_eq!(created.cache_age.configured(), None);
    assert_eq!(created.sync_frequency, None);
    assert_eq!(created.description, "");
    assert_eq!(created.columns, columns());
    assert_eq!(created.tables, Some(vec!["events".into()]), "the tables the engine found are recorded");
    assert_eq!(created.created_at, NOW);
}

#[tokio::test]
async fn create_of_a_materialized_endpoint_defaults_sync_to_a_day() {
    let created = service(echoing_store(), describing_engine())
        .create_json(project(), &body(json!({"is_materialized": true})))
        .await
        .unwrap();
    assert_eq!(created.sync_frequency, Some(SyncFrequency::OneDay));
}

#[tokio::test]
async fn create_refuses_bad_fields_naming_them() {
    let cases = [
        (json!({"name": "1bad"}), "name"),
        (json!({"name": null}), "name"),
        (json!({"query": null}), "query"),
        (json!({"query": {"kind": "SQLQuery"}}), "query.query"),
        (json!({"is_active": "yes"}), "is_active"),
        (json!({"cache_age_seconds": 90_000}), "cache_age_seconds"),
        (json!({"cache_age_seconds": "60"}), "cache_age_seconds"),
        (json!({"sync_frequency": "1hour"}), "sync_frequency"),
        (json!({"is_materialized": true, "sync_frequency": "2hour"}), "sync_frequency"),
        (json!({"surprise": 1}), "surprise"),
        (json!({"description": 5}), "description"),
    ];
    for (extra, attr) in cases {
        // Neither the engine nor the store may be reached by a request that fails validation.
        let err = service(MockEndpointStore::new(), MockQueryEngine::new())
            .create_json(project(), &body(extra.clone()))
            .await
            .unwrap_err();
        assert_eq!(invalid_attr(err), attr, "{extra}");
    }
    let err = service(MockEndpointStore::new(), MockQueryEngine::new())
        .create_json(project(), &json!([1]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid(Invalid { attr: None, .. })));
}

#[tokio::test]
async fn create_reports_the_engines_refusal_on_query() {
    let mut engine = MockQueryEngine::new();
    engine
        .expect_describe()
        .returning(|_, _| Err(EngineError::InvalidQuery("table 'nope' not found".into())));
    let err =
        service(MockEndpointStore::new(), engine).create_json(project(), &body(json!({}))).await.unwrap_err();
    match err {
        Error::Invalid(invalid) => {
            assert_eq!(invalid.attr.as_deref(), Some("query"));
            assert!(invalid.detail.contains("nope"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn create_maps_a_taken_name_to_a_conflict() {
    let mut store = MockEndpointStore::new();
    store.expect_insert().returning(|new| Err(StoreError::NameTaken(new.name.to_string())));
    let err = service(store, describing_engine()).create_json(project(), &body(json!({}))).await.unwrap_err();
    assert!(matches!(err, Error::NameTaken(name) if name == "daily"));
}

#[tokio::test]
async fn a_dry_run_create_checks_everything_and_saves_nothing() {
    // No insert is expected: a save would fail the test.
    let mut store = MockEndpointStore::new();
    store.expect_get().times(1).returning(|_, _| Err(StoreError::NotFound));
    let checked = service(store, describing_engine())
        .check_create_json(project(), &body(json!({"description": "d"})))
        .await
        .unwrap();
    assert_eq!((checked.name.as_str(), checked.description.as_str()), ("daily", "d"));
    assert_eq!((checked.current_version, checked.columns), (1, columns()));
    // The checks of a create: a bad field, a taken name.
    let err = service(MockEndpointStore::new(), describing_engine())
        .check_create_json(project(), &body(json!({"name": "1x"})))
        .await
        .unwrap_err();
    assert_eq!(invalid_attr(err), "name");
    let taken = service(store_with_existing(), describing_engine())
        .check_create_json(project(), &body(json!({})))
        .await
        .unwrap_err();
    assert!(matches!(&taken, Error::NameTaken(name) if name == "daily"), "{taken:?}");
}

#[tokio::test]
async fn a_dry_run_update_answers_the_next_version_and_saves_nothing() {
    // `store_with_existing` expects no update: a save would fail the test.
    let mut engine = MockQueryEngine::new();
    engine.expect_describe().returning(|_, _| {
        let m = Column { name: "m".into(), column_type: ColumnType::Float };
        Ok(QueryDescription { columns: vec![m], ..description() })
    });
    let query = json!({"kind": "SQLQuery", "query": "SELECT 2.0 AS m"});
    let checked = service(store_with_existing(), engine)
        .check_update_json(project(), "daily", &json!({"description": "new", "query": query}))
        .await
        .unwrap();
    assert_eq!((checked.current_version, checked.versions_count), (2, 2));
    assert_eq!((checked.query.sql.as_str(), checked.description.as_str()), ("SELECT 2.0 AS m", "new"));
    assert_eq!(checked.columns[0].name, "m");
    assert_eq!(checked.updated_at, NOW);
    // Settings alone keep the version; the rules of an update hold.
    let settings = service(store_with_existing(), MockQueryEngine::new())
        .check_update_json(project(), "daily", &json!({"is_active": false}))
        .await
        .unwrap();
    assert_eq!((settings.current_version, settings.is_active), (1, false));
    let err = service(store_with_existing(), MockQueryEngine::new())
        .check_update_json(project(), "daily", &json!({"name": "other"}))
        .await
        .unwrap_err();
    assert_eq!(invalid_attr(err), "name");
}

fn store_with_existing() -> MockEndpointStore {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(|_, _| Ok(existing()));
    store
}

#[tokio::test]
async fn update_refuses_a_rename_but_accepts_the_same_name() {
    let err = service(store_with_existing(), MockQueryEngine::new())
        .update_json(project(), "daily", &json!({"name": "weekly"}))
        .await
        .unwrap_err();
    assert_eq!(invalid_attr(err), "name");
    // Same name and nothing else: nothing to write, so the store's update is never called.
    let same = service(store_with_existing(), MockQueryEngine::new())
        .update_json(project(), "daily", &json!({"name": "daily", "description": "old"}))
        .await
        .unwrap();
    assert_eq!(same, existing());
}

#[tokio::test]
async fn update_of_settings_alone_makes_no_new_version() {
    let mut store = store_with_existing();
    store
        .expect_update()
        .withf(|_, _, change, at| {
            change.query.is_none() && change.description.as_deref() == Some("new") && *at == NOW
        })
        .times(1)
        .returning(|_, _, _, _| Ok(existing()));
    service(store, MockQueryEngine::new())
        .update_json(project(), "daily", &json!({"description": "new", "is_active": true}))
        .await
        .unwrap();
}

#[tokio::test]
async fn update_with_an_equivalent_query_makes_no_new_version() {
    // Same query, different whitespace around it and an explicit empty variables object.
    let same = json!({"query": {"query": " SELECT 1 AS n ", "kind": "SQLQuery", "variables": {}}});
    let result =
        service(store_with_existing(), MockQueryEngine::new()).update_json(project(), "daily", &same).await;
    assert_eq!(result.unwrap(), existing());
}

#[tokio::test]
async fn update_with_a_new_query_plans_it_and_saves_it() {
    let mut store = store_with_existing();
    store
        .expect_update()
        .withf(|_, _, change, _| {
            change.query.as_ref().is_some_and(|v| {
                v.number == 2 && v.planned.query.sql == "SELECT 2 AS n" && v.planned.columns == columns()
            })
        })
        .times(1)
        .returning(|_, _, _, _| Ok(existing()));
    let mut engine = MockQueryEngine::new();
    engine.expect_describe().with(eq(project()), always()).times(1).returning(|_, _| Ok(description()));
    service(store, engine)
        .update_json(project(), "daily", &json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS n"}}))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_new_version_saved_first_by_another_change_makes_this_one_decided_again() {
    let mut store = MockEndpointStore::new();
    let mut seq = mockall::Sequence::new();
    store.expect_get().times(1).in_sequence(&mut seq).returning(|_, _| Ok(existing()));
    store
        .expect_update()
        .withf(|_, _, change, _| change.query.as_ref().is_some_and(|v| v.number == 2))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _, _, _| Err(StoreError::Superseded { current: 2 }));
    let moved_on = || Endpoint { current_version: 2, versions_count: 2, ..existing() };
    store.expect_get().times(1).in_sequence(&mut seq).returning(move |_, _| Ok(moved_on()));
    store
        .expect_update()
        .withf(|_, _, change, _| change.query.as_ref().is_some_and(|v| v.number == 3))
        .times(1)
        .in_sequence(&mut seq)
        .returning(move |_, _, _, _| Ok(Endpoint { current_version: 3, versions_count: 3, ..existing() }));
    let mut engine = MockQueryEngine::new();
    engine.expect_describe().times(2).returning(|_, _| Ok(description()));
    let updated = service(store, engine)
        .update_json(project(), "daily", &json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS n"}}))
        .await
        .unwrap();
    assert_eq!(updated.current_version, 3);
}

#[tokio::test]
async fn update_enforces_sync_frequency_rules() {
    let err = service(store_with_existing(), MockQueryEngine::new())
        .update_json(project(), "daily", &json!({"sync_frequency": "1hour"}))
        .await
        .unwrap_err();
    assert_eq!(invalid_attr(err), "sync_frequency");

    let mut store = store_with_existing();
    store
        .expect_update()
        .withf(|_, _, change, _| {
            change.is_materialized == Some(true) && change.sync_frequency == Some(Some(SyncFrequency::OneDay))
        })
        .times(1)
        .returning(|_, _, _, _| Ok(existing()));
    service(store, MockQueryEngine::new())
        .update_json(project(), "daily", &json!({"is_materialized": true}))
        .await
        .unwrap();

    let err = service(store_with_existing(), MockQueryEngine::new())
        .update_json(project(), "daily", &json!({"query": null}))
        .await
        .unwrap_err();
    assert_eq!(invalid_attr(err), "query");
}

#[tokio::test]
async fn unknown_or_impossible_names_are_not_found() {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(|_, _| Err(StoreError::NotFound));
    let svc = service(store, MockQueryEngine::new());
    assert!(matches!(svc.get_named(project(), "missing").await, Err(Error::NotFound(_))));
    // A name that cannot be valid never reaches the store.
    assert!(matches!(svc.get_named(project(), "not a name").await, Err(Error::NotFound(_))));
    assert!(matches!(svc.update_json(project(), "missing", &json!({})).await, Err(Error::NotFound(_))));
}

#[tokio::test]
async fn version_numbers_must_be_positive_integers() {
    let mut store = MockEndpointStore::new();
    store.expect_get_version().returning(|_, _, v| Err(StoreError::VersionNotFound(v)));
    let svc = service(store, MockQueryEngine::new());
    for bad in ["0", "-1", "abc", "1.5", "99999999999"] {
        let err = svc.version_named(project(), "daily", bad).await.unwrap_err();
        assert_eq!(invalid_attr(err), "version_number", "{bad}");
    }
    assert!(matches!(svc.version_named(project(), "daily", "3").await, Err(Error::NotFound(_))));
}

#[tokio::test]
async fn list_passes_paging_and_filters_to_the_store() {
    let mut store = MockEndpointStore::new();
    store
        .expect_list()
        .withf(|_, filter, page| {
            filter.is_active == Some(false)
                && filter.is_materialized.is_none()
                && filter.search.as_deref() == Some("rev")
                && page.limit == 5
                && page.offset == 10
        })
        .times(1)
        .returning(|_, _, page| Ok(Page { items: vec![], total: 0, request: page }));
    let svc = service(store, MockQueryEngine::new());
    let filter = EndpointFilter { is_active: Some(false), search: Some("rev".into()), ..Default::default() };
    svc.list(project(), &filter, PageRequest { limit: 5, offset: 10 }).await.unwrap();
}

/// Each saved change clears what this process keeps, then waits until every other process applied it (read your
/// writes on every node): in that order, before the call returns.
#[tokio::test]
async fn every_saved_update_and_delete_is_told_to_what_this_process_keeps() {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(|_, _| Ok(existing()));
    store
        .expect_update()
        .times(1)
        .returning(|_, _, _, _| Ok(Endpoint { description: "new".into(), ..existing() }));
    store.expect_delete().times(1).returning(|_, _| Ok(Uuid::nil()));
    let mut changes = MockEndpointChanges::new();
    let daily = EndpointName::parse("daily").unwrap();
    let mut order = mockall::Sequence::new();
    for _ in 0..2 {
        changes
            .expect_changed()
            .with(eq(project()), eq(daily.clone()))
            .times(1)
            .in_sequence(&mut order)
            .return_const(());
        changes.expect_settled().times(1).in_sequence(&mut order).return_const(());
    }
    let service = EndpointService::new(EndpointDeps {
        changes: Arc::new(changes),
        ..deps(store, MockQueryEngine::new())
    });
    // A body that changes nothing saves nothing, so nothing kept is stale.
    service.update_json(project(), "daily", &json!({"description": "old"})).await.unwrap();
    service.update_json(project(), "daily", &json!({"description": "new"})).await.unwrap();
    service.delete_named(project(), "daily").await.unwrap();
}

mod materialization {
    use super::*;
    use crate::query::{CompareOp, QueryOutline, VariablePredicate};

    /// An engine whose every query has an outermost LIMIT.
    fn limited_engine() -> MockQueryEngine {
        let mut engine = MockQueryEngine::new();
        engine.expect_describe().returning(|_, _| {
            Ok(QueryDescription {
                columns: columns(),
                outline: QueryOutline { limit_or_offset: true, ..QueryOutline::default() },
                tables: vec![],
            })
        });
        engine
    }

    fn with_results(
        store: MockEndpointStore,
        engine: MockQueryEngine,
        removed: Arc<std::sync::Mutex<Vec<String>>>,
    ) -> EndpointService {
        let mut results = MockResultStorage::new();
        results.expect_remove().returning(move |_, location| {
            removed.lock().unwrap().push(location.to_owned());
            Ok(())
        });
        let deps = deps(store, engine);
        let states = Arc::clone(&deps.materializations.states);
        EndpointService::new(EndpointDeps {
            materializations: MaterializationPorts { states, results: Arc::new(results) },
            ..deps
        })
    }

    #[tokio::test]
    async fn ineligible_queries_and_inactive_endpoints_are_refused() {
        for (engine, extra) in [
            (limited_engine(), json!({"is_materialized": true})),
            (describing_engine(), json!({"is_materialized": true, "is_active": false})),
        ] {
            let err = service(MockEndpointStore::new(), engine)
                .create_json(project(), &body(extra))
                .await
                .unwrap_err();
            assert_eq!(invalid_attr(err), "is_materialized");
        }
        // Without materialization the same query saves, and records why it cannot be materialized.
        let created = service(echoing_store(), limited_engine())
            .create_json(project(), &body(json!({})))
            .await
            .unwrap();
        assert!(created.eligibility.unwrap().reason().unwrap().contains("LIMIT"));

        let mut engine = MockQueryEngine::new();
        engine.expect_describe().returning(|_, _| {
            let predicate = VariablePredicate {
                variable: "v".into(),
                variable_type: VariableType::String,
                op: CompareOp::Eq,
                column: "t.c".into(),
                column_type: ColumnType::String,
                output_column: None,
                group_key: None,
            };
            Ok(QueryDescription {
                columns: columns(),
                outline: QueryOutline { predicates: vec![predicate], ..QueryOutline::default() },
                tables: vec![],
            })
        });
        let materialized =
            Endpoint { is_materialized: true, sync_frequency: Some(SyncFrequency::OneDay), ..existing() };
        let mut store = MockEndpointStore::new();
        store.expect_get().returning(move |_, _| Ok(materialized.clone()));
        store.expect_update().never();
        let err = service(store, engine)
            .update_json(
                project(),
                "daily",
                &json!({"query": {"kind": "SQLQuery", "query": "SELECT 3 AS n"}}),
            )
            .await
            .unwrap_err();
        assert_eq!(invalid_attr(err), "is_materialized");
        let mut store = MockEndpointStore::new();
        let materialized =
            Endpoint { is_materialized: true, sync_frequency: Some(SyncFrequency::OneDay), ..existing() };
        store.expect_get().returning(move |_, _| Ok(materialized.clone()));
        store.expect_update().never();
        let err = service(store, MockQueryEngine::new())
            .update_json(project(), "daily", &json!({"is_active": false}))
            .await
            .unwrap_err();
        assert_eq!(invalid_attr(err), "is_materialized");
    }

    #[tokio::test]
    async fn turning_materialization_off_and_deleting_remove_stored_results() {
        let removed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut store = MockEndpointStore::new();
        let materialized =
            Endpoint { is_materialized: true, sync_frequency: Some(SyncFrequency::OneDay), ..existing() };
        store.expect_get().returning(move |_, _| Ok(materialized.clone()));
        store.expect_update().times(1).returning(|_, _, _, _| Ok(existing()));
        store.expect_delete().times(1).returning(|_, _| Ok(Uuid::from_u128(7)));
        let service = with_results(store, MockQueryEngine::new(), Arc::clone(&removed));
        let off = service.update_json(project(), "daily", &json!({"is_materialized": false})).await.unwrap();
        assert!(!off.is_materialized);
        service.delete_named(project(), "daily").await.unwrap();
        assert_eq!(*removed.lock().unwrap(), vec![Uuid::nil().to_string(), Uuid::from_u128(7).to_string()]);
    }
}

/// `existing()` outputs `n` (integer) and `label` (string), and last ran `ran_days_ago` days ago (never: None).
fn store_ran(ran_days_ago: Option<i64>) -> MockEndpointStore {
    let mut store = MockEndpointStore::new();
    store.expect_get().returning(move |_, _| {
        let mut endpoint = existing();
        endpoint.columns.push(Column { name: "label".into(), column_type: ColumnType::String });
        endpoint.last_executed_at = ran_days_ago.map(|days| NOW - time::Duration::days(days));
        Ok(endpoint)
    });
    store
}

/// Output columns by name and type.
type Outputs = Vec<(&'static str, ColumnType)>;

fn engine_outputting(columns: Outputs) -> MockQueryEngine {
    let mut engine = MockQueryEngine::new();
    engine.expect_describe().returning(move |_, _| {
        let columns = columns.iter().map(|(n, t)| Column { name: (*n).into(), column_type: *t }).collect();
        Ok(QueryDescription { columns, outline: Default::default(), tables: vec![] })
    });
    engine
}

fn new_query(confirm: Option<bool>) -> Value {
    let mut body = json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS n"}});
    if let Some(confirm) = confirm {
        body["confirm_breaking"] = json!(confirm);
    }
    body
}

#[tokio::test]
async fn a_version_records_the_columns_it_removes_or_retypes() {
    use super::super::model::{BreakingChange, ColumnChange};
    let (int, string, float) = (ColumnType::Integer, ColumnType::String, ColumnType::Float);
    let removed = |column: &str, from| BreakingChange {
        column: column.into(),
        change: ColumnChange::Removed,
        from,
        to: None,
    };
    let retyped = |column: &str, from, to| BreakingChange {
        column: column.into(),
        change: ColumnChange::TypeChanged,
        from,
        to: Some(to),
    };
    let cases: [(Outputs, Vec<BreakingChange>); 5] = [
        // An added column breaks nothing.
        (vec![("n", int), ("label", string), ("extra", float)], vec![]),
        (vec![("n", int)], vec![removed("label", string)]),
        (vec![("n", float), ("label", string)], vec![retyped("n", int, float)]),
        // A rename is a removal (and an addition).
        (vec![("n", int), ("name", string)], vec![removed("label", string)]),
        (vec![("label", int)], vec![removed("n", int), retyped("label", string, int)]),
    ];
    for (outputs, expected) in cases {
        let mut store = store_ran(None);
        let want = expected.clone();
        store
            .expect_update()
            .withf(move |_, _, change, _| {
                change.query.as_ref().is_some_and(|v| v.planned.breaking_changes == want)
            })
            .times(1)
            .returning(|_, _, _, _| Ok(existing()));
        service(store, engine_outputting(outputs.clone()))
            .update_json(project(), "daily", &new_query(None))
            .await
            .unwrap_or_else(|e| panic!("{outputs:?}: {e:?}"));
    }
}

#[tokio::test]
async fn a_breaking_version_of_an_endpoint_run_this_week_needs_confirming() {
    let breaking = || engine_outputting(vec![("n", ColumnType::Integer)]);
    // Ran 6 days ago: refused with the changes listed, nothing saved (the store has no update expectation).
    let err = service(store_ran(Some(6)), breaking())
        .update_json(project(), "daily", &new_query(None))
        .await
        .unwrap_err();
    let Error::BreakingChange { detail, changes } = err else { panic!("{err:?}") };
    assert!(
        detail.contains("column 'label' (string) is removed") && detail.contains("confirm_breaking"),
        "{detail}"
    );
    assert_eq!(changes, json!([{"column": "label", "change": "removed", "from": "string", "to": null}]));
    let refused = service(store_ran(Some(6)), breaking())
        .update_json(project(), "daily", &new_query(Some(false)))
        .await;
    assert!(matches!(refused, Err(Error::BreakingChange { .. })));
    // A dry run answers the same.
    let dry =
        service(store_ran(Some(6)), breaking()).check_update_json(project(), "daily", &new_query(None)).await;
    assert!(matches!(dry, Err(Error::BreakingChange { .. })));

    // Confirmed, or last run more than 7 days ago, or never run: saved.
    for (ran, confirm) in [(Some(6), Some(true)), (Some(8), None), (None, None)] {
        let mut store = store_ran(ran);
        store
            .expect_update()
            .withf(|_, _, change, _| {
                change.query.as_ref().is_some_and(|v| v.planned.breaking_changes.len() == 1)
            })
            .times(1)
            .returning(|_, _, _, _| Ok(existing()));
        service(store, breaking())
            .update_json(project(), "daily", &new_query(confirm))
            .await
            .unwrap_or_else(|e| panic!("ran {ran:?} days ago, confirm {confirm:?}: {e:?}"));
    }

    // A non-breaking change needs no confirmation however recently it ran.
    let mut store = store_ran(Some(0));
    store.expect_update().times(1).returning(|_, _, _, _| Ok(existing()));
    let adding = engine_outputting(vec![
        ("n", ColumnType::Integer),
        ("label", ColumnType::String),
        ("x", ColumnType::Date),
    ]);
    service(store, adding).update_json(project(), "daily", &new_query(None)).await.unwrap();
}

#[tokio::test]
async fn a_run_not_yet_flushed_counts_as_a_recent_run() {
    let store = store_ran(None);
    let deps = deps(store, engine_outputting(vec![("n", ColumnType::Integer)]));
    deps.executions.record(project(), &EndpointName::parse("daily").unwrap(), NOW - time::Duration::hours(1));
    let err = EndpointService::new(deps).update_json(project(), "daily", &new_query(None)).await.unwrap_err();
    assert!(matches!(err, Error::BreakingChange { .. }), "{err:?}");
}

/// The tables a saved version reads are told their readers changed (their layout follows the new filters); a
/// change of settings alone, which saves no version, tells nobody.
#[tokio::test]
async fn each_saved_version_tells_the_tables_it_reads_that_their_readers_changed() {
    let mut readers = super::super::ports::MockTableReadersChanged::new();
    readers
        .expect_readers_changed()
        .withf(|p, tables| *p == project() && tables == ["events".to_owned()])
        .times(2)
        .return_const(());
    let readers = Arc::new(readers);
    let created = EndpointService::new(deps(echoing_store(), describing_engine()))
        .with_table_readers(readers.clone())
        .create_json(project(), &body(json!({})))
        .await
        .unwrap();
    assert_eq!(created.tables, Some(vec!["events".to_owned()]));

    let mut store = store_with_existing();
    let reads = || Some(vec!["events".to_owned()]);
    store
        .expect_update()
        .withf(|_, _, change, _| change.query.is_some())
        .times(1)
        .returning(move |_, _, _, _| Ok(Endpoint { current_version: 2, tables: reads(), ..existing() }));
    store
        .expect_update()
        .withf(|_, _, change, _| change.query.is_none())
        .times(1)
        .returning(move |_, _, _, _| Ok(Endpoint { tables: reads(), ..existing() }));
    let service = EndpointService::new(deps(store, describing_engine())).with_table_readers(readers);
    let new_query = json!({"query": {"kind": "SQLQuery", "query": "SELECT 2 AS n"}});
    service.update_json(project(), "daily", &new_query).await.unwrap();
    service.update_json(project(), "daily", &json!({"description": "new"})).await.unwrap();
}
