//! One contract suite, run against SQLite and against a real PostgreSQL.
//!
//! PostgreSQL comes from `TEST_POSTGRES_URL`, which `make test` sets after starting a local cluster and creating
//! a throwaway database. Each test works in projects of its own, so tests share that database safely.

use std::collections::BTreeSet;
use std::sync::{Arc, Once};
use std::time::Duration;

use domain::{
    ApiKey, ApiKeyStore, BreakingChange, CacheAge, Change, Column, ColumnChange, ColumnType, CompareOp,
    Eligibility, EndpointChange, EndpointFilter, EndpointName, EndpointStore, MaterializationRecords,
    MaterializationStatus, MaterializedFilter, NewEndpoint, NewVersion, PageRequest, PlannedQuery,
    ProjectAccess, ProjectId, ProjectStore, Query, Rollup, RollupColumn, Scope, StoreError, StoredColumn,
    StoredResult, Switch, SyncFrequency, TableAnnouncer, TableLeases, TableName, Timestamp, TokenSecret,
};
use domain::{AppendKeyState, AppendKeys, Freshness, Hibernation, IdempotencyKey, Written};
use serde_json::json;
use time::macros::datetime;
use uuid::Uuid;

use crate::{Database, DatabaseConfig, DieselStore};

const T0: Timestamp = datetime!(2026-11-22 10:00:00.123456 UTC);

/// A fresh SQLite database in a directory removed when the test ends.
struct SqliteFile(std::path::PathBuf);

impl Drop for SqliteFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sqlite_store() -> (DieselStore, SqliteFile) {
    let dir = std::env::temp_dir().join(format!("endpoints-store-test-{}", Uuid::new_v4()));
    let db = Database::connect(&DatabaseConfig::new(format!("sqlite://{}/store.db", dir.display()))).unwrap();
    db.migrate().unwrap();
    (DieselStore::new(db), SqliteFile(dir))
}

fn postgres_store() -> DieselStore {
    static MIGRATE: Once = Once::new();
    let url = std::env::var("TEST_POSTGRES_URL").expect(
        "TEST_POSTGRES_URL must name a throwaway PostgreSQL database; `make test` starts one and sets it",
    );
    let mut config = DatabaseConfig::new(url);
    config.pool_size = 4;
    let db = Database::connect(&config).unwrap();
    MIGRATE.call_once(|| {
        db.migrate().unwrap();
    });
    DieselStore::new(db)
}

macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let (store, _file) = super::sqlite_store();
                    super::$test(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test(super::postgres_store()).await;
                }
            )*
        }
    };
}

contract!(
    projects_are_created_and_listed,
    projects_keep_a_token_secret_and_origins,
    endpoints_round_trip,
    names_are_unique_per_project,
    delete_frees_the_name_and_removes_versions,
    settings_changes_keep_the_version,
    query_changes_make_contiguous_versions,
    concurrent_query_changes_stay_contiguous,
    list_filters_searches_and_pages,
    keys_are_found_by_hash_and_revoked,
    materialization_claims_are_exclusive,
    appends_make_a_materialization_due_within_its_freshness,
    materialization_records_follow_the_lease,
    materialization_follows_the_endpoint,
    an_unused_materialization_hibernates_until_it_runs_or_changes,
    a_version_planned_again_records_its_columns_or_why_it_no_longer_plans,
    the_readers_of_a_table_follow_each_current_version,
    table_leases_are_held_by_one_holder_until_released_or_expired,
    append_keys_are_claimed_once_answered_and_forgotten,
);

/// Whether the process that claimed a pending key is gone, as another process sees it: with SQLite (which one
/// process serves) any other process; with PostgreSQL one whose heartbeat stopped, not one without a row yet.
async fn writer_gone_as_another_process_sees_it(claimer: DieselStore, other: DieselStore) -> Vec<bool> {
    let p = project(&claimer).await;
    let events = TableName::parse("events").unwrap();
    let key = IdempotencyKey::parse("batch-1").unwrap();
    let expired = T0 - Duration::from_secs(86_400);
    let first = Uuid::new_v4();
    let claimed = AppendKeys::claim(&claimer, p, &events, &key, first, T0, expired).await.unwrap();
    assert_eq!(claimed, AppendKeyState::Claimed);
    let gone = |store: DieselStore| {
        let (events, key) = (events.clone(), key.clone());
        async move {
            match AppendKeys::claim(&store, p, &events, &key, Uuid::new_v4(), T0, expired).await.unwrap() {
                AppendKeyState::Pending { write_id, writer_gone, .. } if write_id == first => writer_gone,
                other => panic!("{other:?}"),
            }
        }
    };
    assert!(!gone(claimer.clone()).await, "the claiming process itself is writing it");
    let mut seen = vec![gone(other.clone()).await];
    if claimer.database().backend() == crate::connection::Backend::Postgres {
        for age in [60, 0] {
            let node = claimer.database().node().to_owned();
            claimer
                .database()
                .run(move |conn| {
                    use diesel::RunQueryDsl as _;
                    let crate::connection::AnyConnection::Postgresql(conn) = conn else { unreachable!() };
                    diesel::sql_query(
                        "INSERT INTO endpoints_nodes (id, seen_at) VALUES ($1, now() - make_interval(secs => $2)) \
                         ON CONFLICT (id) DO UPDATE SET seen_at = EXCLUDED.seen_at",
                    )
                    .bind::<diesel::sql_types::Text, _>(node)
                    .bind::<diesel::sql_types::Double, _>(f64::from(age))
                    .execute(conn)?;
                    Ok(())
                })
                .await
                .unwrap();
            seen.push(gone(other.clone()).await);
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_takes_any_other_process_for_gone() {
    let (claimer, file) = sqlite_store();
    let config = DatabaseConfig::new(format!("sqlite://{}/store.db", file.0.display()));
    let other = DieselStore::new(Database::connect(&config).unwrap());
    assert_eq!(writer_gone_as_another_process_sees_it(claimer, other).await, [true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_takes_a_process_whose_heartbeat_stopped_for_gone() {
    // Without a row, then with a heartbeat a minute old, then with a fresh one.
    let seen = writer_gone_as_another_process_sees_it(postgres_store(), postgres_store()).await;
    assert_eq!(seen, [false, true, false]);
}

async fn project(store: &DieselStore) -> ProjectId {
    ProjectStore::create(store, format!("p-{}", Uuid::new_v4()), T0).await.unwrap().id
}

fn name(raw: &str) -> EndpointName {
    EndpointName::parse(raw).unwrap()
}

fn query(sql: &str) -> Query {
    Query::try_from(&json!({"kind": "SQLQuery", "query": sql})).unwrap()
}

fn cols(names: &[&str]) -> Vec<Column> {
    names.iter().map(|n| Column { name: (*n).into(), column_type: ColumnType::Integer }).collect()
}

fn eligible() -> Eligibility {
    Eligibility::Eligible {
        filters: vec![MaterializedFilter {
            column: StoredColumn::Filtered(0),
            op: CompareOp::GtEq,
            variable: "v".into(),
        }],
        // A rollup, so that its grouping is seen to survive the store.
        rollup: Some(Rollup {
            keys: vec!["events.country".into()],
            columns: vec![RollupColumn { column: "events.timestamp".into(), day: true }],
            distinct: vec!["events.distinct_id".into()],
        }),
    }
}

/// A query as planned: its columns named `names`, materializable, reading `events`.
fn planned(query: Query, names: &[&str]) -> PlannedQuery {
    PlannedQuery {
        query,
        columns: cols(names),
        eligibility: eligible(),
        tables: vec!["events".into()],
        breaking_changes: vec![],
    }
}

/// Version 2, decided against version 1.
fn after_v1(planned: PlannedQuery) -> NewVersion {
    NewVersion::after(1, planned)
}

/// Version 2 of `daily` no longer outputs its integer `n`.
fn removed_n() -> Vec<BreakingChange> {
    vec![BreakingChange {
        column: "n".into(),
        change: ColumnChange::Removed,
        from: ColumnType::Integer,
        to: None,
    }]
}

fn new_endpoint(project: ProjectId, raw_name: &str) -> NewEndpoint {
    NewEndpoint {
        id: Uuid::new_v4(),
        project_id: project,
        name: name(raw_name),
        description: format!("about {raw_name}"),
        query: query("SELECT 1 AS n"),
        columns: cols(&["n"]),
        eligibility: eligible(),
        tables: vec!["events".into()],
        derived_from_insight: Some("insight-1".into()),
        is_active: true,
        is_materialized: false,
        cache_age: CacheAge::new(Some(60)).unwrap(),
        sync_frequency: None,
        freshness: Freshness::default(),
        hibernation: Hibernation::default(),
        created_at: T0,
    }
}

async fn projects_are_created_and_listed(store: DieselStore) {
    let a = ProjectStore::create(&store, "Acme".into(), T0).await.unwrap();
    let b = ProjectStore::create(&store, "Acme".into(), T0).await.unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(a.created_at, T0, "microsecond precision survives");
    assert_eq!(ProjectStore::get(&store, a.id).await.unwrap(), Some(a.clone()));
    assert_eq!(ProjectStore::get(&store, ProjectId::new(i64::MAX).unwrap()).await.unwrap(), None);
    let all = ProjectStore::list(&store).await.unwrap();
    assert!(all.contains(&a) && all.contains(&b));
    assert!(a.allowed_origins.is_empty());
}

async fn projects_keep_a_token_secret_and_origins(store: DieselStore) {
    let p = project(&store).await;
    let access = ProjectStore::access(&store, p).await.unwrap().unwrap();
    assert_eq!(access, ProjectAccess::default(), "no secret until the first token, no origin");
    assert_eq!(ProjectStore::access(&store, ProjectId::new(i64::MAX).unwrap()).await.unwrap(), None);

    // The first secret written wins: a second process issuing a first token at once gets the same one.
    let first = TokenSecret::generate();
    let kept = ProjectStore::set_token_secret(&store, p, first.clone(), false).await.unwrap();
    assert_eq!(kept, first);
    let kept = ProjectStore::set_token_secret(&store, p, TokenSecret::generate(), false).await.unwrap();
    assert_eq!(kept, first, "a secret is never replaced unless asked");
    let rotated = TokenSecret::generate();
    assert_eq!(ProjectStore::set_token_secret(&store, p, rotated.clone(), true).await.unwrap(), rotated);
    assert_eq!(ProjectStore::access(&store, p).await.unwrap().unwrap().token_secret, Some(rotated));
    let ghost = ProjectId::new(i64::MAX).unwrap();
    assert!(matches!(
        ProjectStore::set_token_secret(&store, ghost, TokenSecret::generate(), true).await,
        Err(StoreError::NotFound)
    ));

    let origins = vec!["http://localhost:8080".to_string(), "https://app.example.com".to_string()];
    ProjectStore::set_allowed_origins(&store, p, origins.clone()).await.unwrap();
    assert_eq!(ProjectStore::access(&store, p).await.unwrap().unwrap().allowed_origins, origins);
    assert_eq!(ProjectStore::get(&store, p).await.unwrap().unwrap().allowed_origins, origins);
    ProjectStore::set_allowed_origins(&store, p, vec![]).await.unwrap();
    assert!(ProjectStore::access(&store, p).await.unwrap().unwrap().allowed_origins.is_empty());
    assert!(matches!(
        ProjectStore::set_allowed_origins(&store, ghost, vec![]).await,
        Err(StoreError::NotFound)
    ));
}

async fn endpoints_round_trip(store: DieselStore) {
    let p = project(&store).await;
    let new = new_endpoint(p, "daily");
    let saved = EndpointStore::insert(&store, new.clone()).await.unwrap();
    assert_eq!(saved.id, new.id);
    assert_eq!(saved.query, new.query);
    assert_eq!(saved.columns, new.columns);
    assert_eq!(saved.derived_from_insight.as_deref(), Some("insight-1"));
    assert_eq!(saved.cache_age.configured(), Some(60));
    assert_eq!((saved.current_version, saved.versions_count), (1, 1));
    assert_eq!((saved.created_at, saved.updated_at, saved.last_executed_at), (T0, T0, None));
    assert_eq!(EndpointStore::get(&store, p, &name("daily")).await.unwrap(), saved);

    let other = project(&store).await;
    assert!(matches!(EndpointStore::get(&store, other, &name("daily")).await, Err(StoreError::NotFound)));
}

async fn names_are_unique_per_project(store: DieselStore) {
    let p = project(&store).await;
    EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap();
    let err = EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap_err();
    assert!(matches!(err, StoreError::NameTaken(ref n) if n == "daily"), "{err:?}");
    let other = project(&store).await;
    EndpointStore::insert(&store, new_endpoint(other, "daily")).await.unwrap();
}

async fn delete_frees_the_name_and_removes_versions(store: DieselStore) {
    let p = project(&store).await;
    let first = EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap();
    let change = EndpointChange {
        query: Some(after_v1(planned(query("SELECT 2 AS n"), &["n"]))),
        ..Default::default()
    };
    EndpointStore::update(&store, p, &name("daily"), change, T0).await.unwrap();
    EndpointStore::delete(&store, p, &name("daily")).await.unwrap();
    assert!(matches!(EndpointStore::get(&store, p, &name("daily")).await, Err(StoreError::NotFound)));
    assert!(matches!(
        EndpointStore::get_version(&store, p, &name("daily"), 1).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(EndpointStore::delete(&store, p, &name("daily")).await, Err(StoreError::NotFound)));

    let second = EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap();
    assert_ne!(first.id, second.id);
    assert_eq!(second.current_version, 1, "a new endpoint starts again at version 1");
    let versions =
        EndpointStore::list_versions(&store, p, &name("daily"), PageRequest::default()).await.unwrap();
    assert_eq!(versions.total, 1);
}

async fn settings_changes_keep_the_version(store: DieselStore) {
    let p = project(&store).await;
    EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap();
    let later = T0 + Duration::from_secs(60);
    let change = EndpointChange {
        description: Some("new words".into()),
        is_active: Some(false),
        is_materialized: Some(true),
        sync_frequency: Some(Some(SyncFrequency::OneHour)),
        cache_age: Some(CacheAge::default()),
        derived_from_insight: Some(None),
        freshness: Some(Freshness::new(Some(5)).unwrap()),
        hibernation: Some(Hibernation::NEVER),
        query: None,
    };
    let updated = EndpointStore::update(&store, p, &name("daily"), change, later).await.unwrap();
    assert_eq!(updated.current_version, 1);
    assert_eq!(updated.freshness.configured(), Some(5));
    assert_eq!(updated.hibernation, Hibernation::NEVER);
    assert_eq!(updated.description, "new words");
    assert!(!updated.is_active && updated.is_materialized);
    assert_eq!(updated.sync_frequency, Some(SyncFrequency::OneHour));
    assert_eq!(updated.cache_age.configured(), None);
    assert_eq!(updated.derived_from_insight, None);
    assert_eq!((updated.created_at, updated.updated_at), (T0, later));
    let v1 = EndpointStore::get_version(&store, p, &name("daily"), 1).await.unwrap();
    assert_eq!(v1.description, "new words", "the current version follows the endpoint's settings");
    assert_eq!(v1.sync_frequency, Some(SyncFrequency::OneHour));
}

async fn a_version_planned_again_records_its_columns_or_why_it_no_longer_plans(store: DieselStore) {
    let p = project(&store).await;
    let created = EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap();
    assert_eq!(created.plan_error, None);
    let broken = Err("Schema error: No field named n.".to_owned());
    assert!(EndpointStore::replan(&store, created.id, 1, broken).await.unwrap());
    let endpoint = EndpointStore::get(&store, p, &name("daily")).await.unwrap();
    assert_eq!(endpoint.plan_error.as_deref(), Some("Schema error: No field named n."));
    assert_eq!(endpoint.tables, Some(vec!["events".to_owned()]), "it still reads the table");
    assert_eq!(endpoint.columns, cols(&["n"]), "what it last planned to is kept");
    let version = EndpointStore::get_version(&store, p, &name("daily"), 1).await.unwrap();
    assert_eq!(version.plan_error, endpoint.plan_error);

    // Planned again with other columns: they are recorded and the error is gone.
    let mut fixed = planned(query("SELECT 1 AS n"), &["n", "m"]);
    fixed.tables = vec!["events".into(), "users".into()];
    assert!(EndpointStore::replan(&store, created.id, 1, Ok(fixed)).await.unwrap());
    let endpoint = EndpointStore::get(&store, p, &name("daily")).await.unwrap();
    assert_eq!((endpoint.plan_error, endpoint.columns), (None, cols(&["n", "m"])));
    assert_eq!(endpoint.tables, Some(vec!["events".to_owned(), "users".to_owned()]));

    // A new version starts with no error; a version or endpoint that is gone is not planned.
    EndpointStore::replan(&store, created.id, 1, Err("broken again".into())).await.unwrap();
    let change = EndpointChange {
        query: Some(after_v1(planned(query("SELECT 2 AS m"), &["m"]))),
        ..Default::default()
    };
    let updated = EndpointStore::update(&store, p, &name("daily"), change, T0).await.unwrap();
    assert_eq!((updated.current_version, updated.plan_error), (2, None));
    let v1 = EndpointStore::get_version(&store, p, &name("daily"), 1).await.unwrap();
    assert_eq!(v1.plan_error.as_deref(), Some("broken again"), "history keeps its own");
    assert!(!EndpointStore::replan(&store, created.id, 9, Err("x".into())).await.unwrap());
    assert!(!EndpointStore::replan(&store, Uuid::new_v4(), 1, Err("x".into())).await.unwrap());
}

/// The endpoints `readers` finds for `tables` (in name order), each with whether its stored result follows them.
async fn readers_of(store: &DieselStore, p: ProjectId, tables: &[&str]) -> Vec<(String, bool)> {
    let tables: Vec<String> = tables.iter().map(|t| (*t).to_owned()).collect();
    let found = EndpointStore::readers(store, p, &tables).await.unwrap();
    found.into_iter().map(|r| (r.name.to_string(), r.refreshed)).collect()
}

async fn the_readers_of_a_table_follow_each_current_version(store: DieselStore) {
    let (p, other) = (project(&store).await, project(&store).await);
    EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap();
    let weekly =
        EndpointStore::insert(&store, NewEndpoint { is_materialized: true, ..new_endpoint(p, "weekly") });
    let weekly = weekly.await.unwrap();
    EndpointStore::insert(&store, NewEndpoint { tables: vec!["users".into()], ..new_endpoint(p, "people") })
        .await
        .unwrap();
    EndpointStore::insert(&store, new_endpoint(other, "elsewhere")).await.unwrap();
    let both = [("daily".to_owned(), false), ("weekly".to_owned(), true)];
    assert_eq!(readers_of(&store, p, &["events"]).await, both, "another project's readers are not");
    assert_eq!(readers_of(&store, p, &["nothing"]).await, []);

    // A new version reads what it reads; planning the current version again moves it, an old one does not.
    let mut reads_users = planned(query("SELECT 2 AS m"), &["m"]);
    reads_users.tables = vec!["users".into()];
    let change = EndpointChange { query: Some(after_v1(reads_users)), ..Default::default() };
    EndpointStore::update(&store, p, &name("daily"), change, T0).await.unwrap();
    assert_eq!(readers_of(&store, p, &["events"]).await, [("weekly".to_owned(), true)]);
    assert_eq!(
        readers_of(&store, p, &["users", "events"]).await,
        [("daily".to_owned(), false), ("people".to_owned(), false), ("weekly".to_owned(), true)]
    );
    let mut both_tables = planned(query("SELECT 1 AS n"), &["n"]);
    both_tables.tables = vec!["events".into(), "sales".into()];
    assert!(EndpointStore::replan(&store, weekly.id, 1, Ok(both_tables)).await.unwrap());
    assert_eq!(readers_of(&store, p, &["sales"]).await, [("weekly".to_owned(), true)]);
    let daily = EndpointStore::get(&store, p, &name("daily")).await.unwrap();
    assert!(EndpointStore::replan(&store, daily.id, 1, Ok(planned(query("SELECT 1 AS n"), &["n"])))
        .await
        .unwrap());
    assert_eq!(
        readers_of(&store, p, &["events"]).await,
        [("weekly".to_owned(), true)],
        "version 1 is not current"
    );

    // Every table read, by project (the store may hold other tests' projects).
    let read_tables = || async {
        let all = EndpointStore::read_tables(&store).await.unwrap();
        let ours = all.into_iter().filter(|(q, _)| *q == p || *q == other);
        ours.map(|(q, table)| (q == p, table)).collect::<Vec<_>>()
    };
    let read =
        |tables: &[(bool, &str)]| tables.iter().map(|(q, t)| (*q, (*t).to_owned())).collect::<Vec<_>>();
    assert_eq!(
        read_tables().await,
        read(&[(true, "events"), (true, "sales"), (true, "users"), (false, "events")])
    );

    // Deleted, it reads nothing.
    EndpointStore::delete(&store, p, &name("weekly")).await.unwrap();
    assert_eq!(readers_of(&store, p, &["events", "sales"]).await, []);
    assert_eq!(read_tables().await, read(&[(true, "users"), (false, "events")]));
}

async fn query_changes_make_contiguous_versions(store: DieselStore) {
    let p = project(&store).await;
    EndpointStore::insert(&store, new_endpoint(p, "daily")).await.unwrap();
    let later = T0 + Duration::from_secs(5);
    let change = EndpointChange {
        description: Some("v2 words".into()),
        cache_age: Some(CacheAge::new(Some(0)).unwrap()),
        query: Some(after_v1(PlannedQuery {
            breaking_changes: removed_n(),
            ..planned(query("SELECT 2 AS m"), &["m"])
        })),
        ..Default::default()
    };
    let updated = EndpointStore::update(&store, p, &name("daily"), change, later).await.unwrap();
    assert_eq!((updated.current_version, updated.versions_count), (2, 2));
    assert_eq!(updated.query.sql, "SELECT 2 AS m");
    assert_eq!(updated.columns, cols(&["m"]));

    let page = EndpointStore::list_versions(&store, p, &name("daily"), PageRequest::default()).await.unwrap();
    assert_eq!(page.total, 2);
    let numbers: Vec<_> = page.items.iter().map(|v| (v.version, v.is_current)).collect();
    assert_eq!(numbers, [(2, true), (1, false)], "newest first");
    let v2 = &page.items[0];
    assert_eq!(
        (v2.description.as_str(), v2.cache_age.configured(), v2.created_at),
        ("v2 words", Some(0), later)
    );
    assert_eq!(v2.breaking_changes, removed_n(), "a version keeps what it broke");
    let v1 = EndpointStore::get_version(&store, p, &name("daily"), 1).await.unwrap();
    assert_eq!((v1.query.sql.as_str(), v1.description.as_str()), ("SELECT 1 AS n", "about daily"));
    assert!(v1.breaking_changes.is_empty());
    assert!(matches!(
        EndpointStore::get_version(&store, p, &name("daily"), 3).await,
        Err(StoreError::VersionNotFound(3))
    ));

    let second_page =
        EndpointStore::list_versions(&store, p, &name("daily"), PageRequest { limit: 1, offset: 1 })
            .await
            .unwrap();
    assert_eq!(second_page.items.iter().map(|v| v.version).collect::<Vec<_>>(), [1]);
}

async fn concurrent_query_changes_stay_contiguous(store: DieselStore) {
    const WRITERS: u32 = 12;
    let p = project(&store).await;
    EndpointStore::insert(&store, new_endpoint(p, "busy")).await.unwrap();
    let store = Arc::new(store);
    let tasks: Vec<_> = (0..WRITERS)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                // As the domain does: decide the version against the one read, again when another came first.
                let mut superseded = 0;
                loop {
                    let current = EndpointStore::get(&*store, p, &name("busy")).await?.current_version;
                    let planned = planned(query(&format!("SELECT {} AS n", i + 100)), &["n"]);
                    let change = EndpointChange {
                        query: Some(NewVersion::after(current, planned)),
                        ..Default::default()
                    };
                    match EndpointStore::update(&*store, p, &name("busy"), change, T0).await {
                        Err(StoreError::Superseded { current: now }) => {
                            assert!(now > current, "superseded by a newer version");
                            superseded += 1;
                        }
                        saved => return saved.map(|_| superseded),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }

    // A version decided against one that is no longer current writes nothing.
    let stale = EndpointChange {
        description: Some("stale".into()),
        query: Some(after_v1(planned(query("SELECT 0 AS n"), &["n"]))),
        ..Default::default()
    };
    let err = EndpointStore::update(&*store, p, &name("busy"), stale, T0).await.unwrap_err();
    assert!(matches!(err, StoreError::Superseded { current } if current == WRITERS + 1), "{err:?}");
    assert_ne!(EndpointStore::get(&*store, p, &name("busy")).await.unwrap().description, "stale");
    let page =
        EndpointStore::list_versions(&*store, p, &name("busy"), PageRequest { limit: 1000, offset: 0 })
            .await
            .unwrap();
    let numbers: BTreeSet<u32> = page.items.iter().map(|v| v.version).collect();
    assert_eq!(numbers, (1..=WRITERS + 1).collect::<BTreeSet<_>>(), "versions 1..=13, no gap, no duplicate");
    let sqls: BTreeSet<_> = page.items.iter().map(|v| v.query.sql.clone()).collect();
    assert_eq!(sqls.len(), WRITERS as usize + 1, "every writer's query was kept");
    let current = EndpointStore::get(&*store, p, &name("busy")).await.unwrap();
    assert_eq!(current.current_version, WRITERS + 1);
}

async fn list_filters_searches_and_pages(store: DieselStore) {
    let p = project(&store).await;
    for (n, active, desc) in
        [("beta", true, "Revenue by day"), ("alpha", false, "signups"), ("gamma_1", true, "100% of users")]
    {
        EndpointStore::insert(
            &store,
            NewEndpoint { is_active: active, description: desc.into(), ..new_endpoint(p, n) },
        )
        .await
        .unwrap();
    }
    let names = |page: &domain::Page<domain::Endpoint>| {
        page.items.iter().map(|e| e.name.to_string()).collect::<Vec<_>>()
    };
    let all =
        EndpointStore::list(&store, p, &EndpointFilter::default(), PageRequest::default()).await.unwrap();
    assert_eq!((names(&all), all.total), (vec!["alpha".to_string(), "beta".into(), "gamma_1".into()], 3));

    let active = EndpointFilter { is_active: Some(true), ..Default::default() };
    assert_eq!(
        names(&EndpointStore::list(&store, p, &active, PageRequest::default()).await.unwrap()),
        ["beta", "gamma_1"]
    );
    let search = EndpointFilter { search: Some("REVENUE".into()), ..Default::default() };
    assert_eq!(
        names(&EndpointStore::list(&store, p, &search, PageRequest::default()).await.unwrap()),
        ["beta"]
    );
    // LIKE wildcards in the search text are matched literally: an unescaped "p_a" would match "alpha".
    let percent = EndpointFilter { search: Some("0%".into()), ..Default::default() };
    assert_eq!(
        names(&EndpointStore::list(&store, p, &percent, PageRequest::default()).await.unwrap()),
        ["gamma_1"]
    );
    let underscore = EndpointFilter { search: Some("p_a".into()), ..Default::default() };
    assert!(EndpointStore::list(&store, p, &underscore, PageRequest::default())
        .await
        .unwrap()
        .items
        .is_empty());
    let materialized = EndpointFilter { is_materialized: Some(true), ..Default::default() };
    assert_eq!(EndpointStore::list(&store, p, &materialized, PageRequest::default()).await.unwrap().total, 0);

    let page =
        EndpointStore::list(&store, p, &EndpointFilter::default(), PageRequest { limit: 1, offset: 1 })
            .await
            .unwrap();
    assert_eq!((names(&page), page.total), (vec!["beta".to_string()], 3));
    assert!(page.has_next() && page.has_previous());
}

async fn keys_are_found_by_hash_and_revoked(store: DieselStore) {
    let p = project(&store).await;
    let key = ApiKey {
        id: Uuid::new_v4(),
        project_id: p,
        label: "ci".into(),
        scopes: vec![Scope::EndpointRead, Scope::EndpointWrite],
        secret_hash: format!("{:064x}", Uuid::new_v4().as_u128()),
        prefix: "phx_abcdef".into(),
        created_at: T0,
        expires_at: Some(T0 + Duration::from_secs(3600)),
        revoked_at: None,
        last_used_at: None,
    };
    ApiKeyStore::insert(&store, key.clone()).await.unwrap();
    assert_eq!(ApiKeyStore::find_by_hash(&store, &key.secret_hash).await.unwrap(), Some(key.clone()));
    assert_eq!(ApiKeyStore::find_by_hash(&store, "0".repeat(64).as_str()).await.unwrap(), None);
    assert_eq!(ApiKeyStore::list(&store, Some(p)).await.unwrap(), vec![key.clone()]);

    let at = T0 + Duration::from_secs(10);
    ApiKeyStore::revoke(&store, key.id, at).await.unwrap();
    ApiKeyStore::revoke(&store, key.id, at + Duration::from_secs(10)).await.unwrap();
    let revoked = ApiKeyStore::find_by_hash(&store, &key.secret_hash).await.unwrap().unwrap();
    assert_eq!(revoked.revoked_at, Some(at), "the first revocation time is kept");
    assert!(matches!(ApiKeyStore::revoke(&store, Uuid::new_v4(), at).await, Err(StoreError::NotFound)));

    // Uses are recorded in batches, and a time never moves a stored one back; unknown keys are skipped.
    let later = T0 + Duration::from_secs(60);
    ApiKeyStore::record_usage(&store, vec![(key.id, later), (Uuid::new_v4(), later)]).await.unwrap();
    ApiKeyStore::record_usage(&store, vec![(key.id, T0)]).await.unwrap();
    let used = ApiKeyStore::find_by_hash(&store, &key.secret_hash).await.unwrap().unwrap();
    assert_eq!(used.last_used_at, Some(later));
}

/// Claims scan every project of the shared database, so the tests that claim run one at a time and only look at
/// their own endpoints; each leaves its endpoints not due.
static CLAIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn materialized(store: &DieselStore, p: ProjectId, raw_name: &str) -> Uuid {
    let new = NewEndpoint {
        is_materialized: true,
        sync_frequency: Some(SyncFrequency::OneHour),
        ..new_endpoint(p, raw_name)
    };
    EndpointStore::insert(store, new).await.unwrap().id
}

async fn claims_of(store: &DieselStore, p: ProjectId, now: Timestamp) -> Vec<domain::Claim> {
    let lease = now + Duration::from_secs(60);
    let claims = MaterializationRecords::claim_due(store, now, lease, 1000).await.unwrap();
    claims.into_iter().filter(|c| c.project == p).collect()
}

fn stored(location: &str, version: u32, at: Timestamp) -> StoredResult {
    StoredResult {
        version,
        location: location.into(),
        row_count: 7,
        materialized_at: at,
        data_as_of: at,
        coverage: Some(domain::Coverage(format!("read for {location}"))),
        // Both kinds of fold are kept, a reason with its kind.
        fold: Some(match location {
            "two" => domain::Fold::Incremental,
            _ => domain::Fold::FullRefreshOnly { reason: format!("reason for {location}") },
        }),
    }
}

async fn materialization_claims_are_exclusive(store: DieselStore) {
    let _serial = CLAIMING.lock().await;
    let p = project(&store).await;
    let ids: BTreeSet<Uuid> =
        [materialized(&store, p, "a").await, materialized(&store, p, "b").await].into_iter().collect();
    // Eight workers race for the same due records; each record goes to exactly one of them.
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { claims_of(&store, p, T0).await })
        })
        .collect();
    let mut won = Vec::new();
    for claimer in claimers {
        won.extend(claimer.await.unwrap());
    }
    let claimed: Vec<Uuid> = won.iter().map(|c| c.endpoint_id).collect();
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    assert_eq!(claimed.iter().copied().collect::<BTreeSet<_>>(), ids);
    assert!(won.iter().all(|c| c.version == 1 && c.sync_frequency == SyncFrequency::OneHour));
    assert!(claims_of(&store, p, T0).await.is_empty(), "leased records are not due");
    for claim in &won {
        let at = T0 + Duration::from_secs(1);
        let switch = MaterializationRecords::complete(
            &store,
            claim.endpoint_id,
            claim.token,
            stored("x", 1, at),
            at + Duration::from_secs(3600),
            None,
        )
        .await
        .unwrap();
        assert_eq!(switch, Switch::Switched { replaced: None });
    }
}

async fn materialization_records_follow_the_lease(store: DieselStore) {
    let _serial = CLAIMING.lock().await;
    let p = project(&store).await;
    let id = materialized(&store, p, "kpi").await;
    let first = claims_of(&store, p, T0).await.pop().expect("a new materialized endpoint is due");
    let record = MaterializationRecords::get(&store, id).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.version, record.result.clone()),
        (MaterializationStatus::Running, 1, None)
    );
    assert_eq!(record.lease.map(|(token, _)| token), Some(first.token));
    // The claim carries what its refresh reads: the version's query, and no result yet.
    assert_eq!(
        (&first.query, &first.eligibility, &first.current, first.version),
        (&query("SELECT 1 AS n"), &Some(eligible()), &None, 1)
    );

    // Renewal keeps the lease past its first expiry; a stranger's token renews nothing.
    let t1 = T0 + Duration::from_secs(50);
    assert!(MaterializationRecords::renew(&store, id, first.token, t1 + Duration::from_secs(60))
        .await
        .unwrap());
    assert!(!MaterializationRecords::renew(&store, id, Uuid::new_v4(), t1).await.unwrap());
    assert!(claims_of(&store, p, T0 + Duration::from_secs(90)).await.is_empty());

    let done = T0 + Duration::from_secs(100);
    let next = done + Duration::from_secs(3600);
    let switch =
        MaterializationRecords::complete(&store, id, first.token, stored("one", 1, done), next, None)
            .await
            .unwrap();
    assert_eq!(switch, Switch::Switched { replaced: None });
    let record = MaterializationRecords::get(&store, id).await.unwrap().unwrap();
    assert_eq!(record.status, MaterializationStatus::Completed);
    assert_eq!(record.result, Some(stored("one", 1, done)));
    assert_eq!((record.next_run_at, record.lease), (next, None));
    assert!(claims_of(&store, p, done).await.is_empty(), "not due before its next run");

    // Due again: the new result replaces the old one, which is handed back for removal.
    let second = claims_of(&store, p, next).await.pop().expect("due at its next run");
    assert_ne!(second.token, first.token);
    assert_eq!(second.current, Some(stored("one", 1, done)), "the result a fold starts from");
    assert!(!MaterializationRecords::fail(&store, id, first.token, "late".into(), next).await.unwrap());
    let switch = MaterializationRecords::complete(
        &store,
        id,
        second.token,
        stored("two", 1, next),
        next + Duration::from_secs(3600),
        None,
    )
    .await
    .unwrap();
    assert_eq!(switch, Switch::Switched { replaced: Some("one".into()) });

    // A crashed worker's lease expires and another claims the refresh; the first one's result is refused.
    let t2 = next + Duration::from_secs(3600);
    let crashed = claims_of(&store, p, t2).await.pop().unwrap();
    assert!(claims_of(&store, p, t2 + Duration::from_secs(59)).await.is_empty());
    let retry =
        claims_of(&store, p, t2 + Duration::from_secs(61)).await.pop().expect("an expired lease is due");
    let crashed_files = domain::attempt_location(id, 1, crashed.token);
    assert_eq!(
        (crashed.abandoned.as_deref(), retry.abandoned.as_deref()),
        (None, Some(crashed_files.as_str()))
    );
    assert_eq!(
        MaterializationRecords::complete(&store, id, crashed.token, stored("stale", 1, t2), t2, None)
            .await
            .unwrap(),
        Switch::Lost
    );
    assert!(MaterializationRecords::fail(
        &store,
        id,
        retry.token,
        "boom".into(),
        t2 + Duration::from_secs(300)
    )
    .await
    .unwrap());
    let record = MaterializationRecords::get(&store, id).await.unwrap().unwrap();
    assert_eq!((record.status, record.error.as_deref()), (MaterializationStatus::Failed, Some("boom")));
    assert_eq!(record.result, Some(stored("two", 1, next)), "a failure keeps the previous result");

    // Rescheduling makes it due at once.
    MaterializationRecords::reschedule(&store, id, t2).await.unwrap();
    let again = claims_of(&store, p, t2 + Duration::from_secs(1)).await.pop().expect("rescheduled");
    let far = t2 + Duration::from_secs(86_400 * 365);
    MaterializationRecords::complete(&store, id, again.token, stored("three", 1, t2), far, None)
        .await
        .unwrap();
    assert_eq!(
        MaterializationRecords::all(&store).await.unwrap().iter().filter(|r| r.endpoint_id == id).count(),
        1
    );
}

async fn appends_make_a_materialization_due_within_its_freshness(store: DieselStore) {
    let _serial = CLAIMING.lock().await;
    let p = project(&store).await;
    let new = NewEndpoint {
        is_materialized: true,
        sync_frequency: Some(SyncFrequency::OneDay),
        freshness: Freshness::new(Some(10)).unwrap(),
        ..new_endpoint(p, "fresh")
    };
    let id = EndpointStore::insert(&store, new).await.unwrap().id;
    let secs = Duration::from_secs;
    // Appends before the first refresh leave nothing pending: that refresh is due anyway.
    MaterializationRecords::appended(&store, vec![id], T0).await.unwrap();
    let first = claims_of(&store, p, T0).await.pop().expect("a first refresh");
    let far = T0 + secs(86_400);
    let done = MaterializationRecords::complete(&store, id, first.token, stored("one", 1, T0), far, None);
    assert_eq!(done.await.unwrap(), Switch::Switched { replaced: None });
    assert!(claims_of(&store, p, T0 + secs(60)).await.is_empty(), "nothing appended, not due");

    // The first append pending makes the refresh due its freshness later; later ones do not move it.
    let t1 = T0 + secs(100);
    MaterializationRecords::appended(&store, vec![id, Uuid::new_v4()], t1).await.unwrap();
    MaterializationRecords::appended(&store, vec![id], t1 + secs(5)).await.unwrap();
    let record = MaterializationRecords::get(&store, id).await.unwrap().unwrap();
    assert_eq!(record.appended_since, Some(t1));
    assert_eq!(record.due_at(Freshness::new(Some(10)).unwrap()), t1 + secs(10));
    assert!(claims_of(&store, p, t1 + secs(9)).await.is_empty(), "not before its freshness");
    let second = claims_of(&store, p, t1 + secs(10)).await.pop().expect("due at its freshness");
    let record = MaterializationRecords::get(&store, id).await.unwrap().unwrap();
    assert_eq!(record.appended_since, None, "the refresh reads after its claim: it includes them");

    // An append while it runs stays pending after it completes, and the refresh counts.
    let t2 = t1 + secs(11);
    MaterializationRecords::appended(&store, vec![id], t2).await.unwrap();
    let done = MaterializationRecords::complete(
        &store,
        id,
        second.token,
        stored("two", 1, t1 + secs(10)),
        far,
        Some(3),
    );
    assert_eq!(done.await.unwrap(), Switch::Switched { replaced: Some("one".into()) });
    let record = MaterializationRecords::get(&store, id).await.unwrap().unwrap();
    assert_eq!((record.appended_since, record.full_refreshes), (Some(t2), 1), "{record:?}");
    // A fold counts its rows, not a refresh; the result keeps what the engine said of its tables.
    assert_eq!((record.last_folded_at, record.rows_folded), (Some(t1 + secs(10)), 3));
    assert_eq!(record.result, Some(stored("two", 1, t1 + secs(10))));

    // A failed refresh waits for its retry time, appends pending or not.
    let third = claims_of(&store, p, t2 + secs(10)).await.pop().expect("due again");
    MaterializationRecords::appended(&store, vec![id], t2 + secs(11)).await.unwrap();
    let retry = t2 + secs(300);
    assert!(MaterializationRecords::fail(&store, id, third.token, "boom".into(), retry).await.unwrap());
    assert!(claims_of(&store, p, t2 + secs(60)).await.is_empty(), "a failure is not retried at once");
    let fourth = claims_of(&store, p, retry).await.pop().expect("retried at its time");
    let done =
        MaterializationRecords::complete(&store, id, fourth.token, stored("four", 1, retry), far, None);
    done.await.unwrap();
    assert!(claims_of(&store, p, retry + secs(3600)).await.is_empty(), "left not due");
}

async fn materialization_follows_the_endpoint(store: DieselStore) {
    let _serial = CLAIMING.lock().await;
    let p = project(&store).await;
    let id = materialized(&store, p, "kpi").await;
    let claim = claims_of(&store, p, T0).await.pop().unwrap();
    let far = T0 + Duration::from_secs(86_400);
    MaterializationRecords::complete(&store, id, claim.token, stored("v1", 1, T0), far, None).await.unwrap();

    // A new version is due at once, though the record's next run is far away.
    let change = EndpointChange {
        query: Some(after_v1(planned(query("SELECT 2 AS n"), &["n"]))),
        ..Default::default()
    };
    let updated = EndpointStore::update(&store, p, &name("kpi"), change, T0).await.unwrap();
    assert_eq!(updated.eligibility, Some(eligible()));
    assert_eq!(updated.tables, Some(vec!["events".to_owned()]), "a version keeps the tables it reads");
    let claim = claims_of(&store, p, T0).await.pop().expect("the new version is due");
    assert_eq!(claim.version, 2);
    let switch = MaterializationRecords::complete(&store, id, claim.token, stored("v2", 2, T0), far, None)
        .await
        .unwrap();
    assert_eq!(switch, Switch::Switched { replaced: Some("v1".into()) });
    assert_eq!(MaterializationRecords::get_many(&store, vec![id, Uuid::new_v4()]).await.unwrap().len(), 1);

    // An inactive endpoint is never due.
    let inactive = materialized(&store, p, "off").await;
    let change = EndpointChange { is_active: Some(false), ..Default::default() };
    EndpointStore::update(&store, p, &name("off"), change, T0).await.unwrap();
    assert!(claims_of(&store, p, T0).await.iter().all(|c| c.endpoint_id != inactive));

    // Turning materialization off removes the record with the change; so does deleting the endpoint.
    let change =
        EndpointChange { is_materialized: Some(false), sync_frequency: Some(None), ..Default::default() };
    EndpointStore::update(&store, p, &name("kpi"), change, T0).await.unwrap();
    assert_eq!(MaterializationRecords::get(&store, id).await.unwrap(), None);
    let again = EndpointChange {
        is_materialized: Some(true),
        sync_frequency: Some(Some(SyncFrequency::OneHour)),
        ..Default::default()
    };
    EndpointStore::update(&store, p, &name("kpi"), again, T0).await.unwrap();
    let claim = claims_of(&store, p, T0).await.pop().expect("turned on again");
    assert_eq!(EndpointStore::delete(&store, p, &name("kpi")).await.unwrap(), id);
    assert_eq!(MaterializationRecords::get(&store, id).await.unwrap(), None);
    let lost = MaterializationRecords::complete(&store, id, claim.token, stored("v3", 2, T0), far, None)
        .await
        .unwrap();
    assert_eq!(lost, Switch::Lost, "a refresh of a deleted endpoint switches nothing");
    EndpointStore::delete(&store, p, &name("off")).await.unwrap();
}

/// The store's claims follow the domain's rule (`Endpoint::hibernates_at`): an endpoint not run nor changed for its
/// `hibernate_after_days` is never due, until a run or a change wakes it; one that never hibernates stays due.
async fn an_unused_materialization_hibernates_until_it_runs_or_changes(store: DieselStore) {
    let _serial = CLAIMING.lock().await;
    let p = project(&store).await;
    let (day, secs) = (Duration::from_secs(86_400), Duration::from_secs);
    // A month before the other tests' times, so that no claim here takes another test's records.
    let born = T0 - 30 * day;
    let insert = async |raw: &str, hibernation: Hibernation| {
        let new = NewEndpoint {
            is_materialized: true,
            sync_frequency: Some(SyncFrequency::OneHour),
            hibernation,
            created_at: born,
            ..new_endpoint(p, raw)
        };
        EndpointStore::insert(&store, new).await.unwrap()
    };
    let week = insert("weekly", Hibernation::DEFAULT).await;
    let two = insert("two-days", Hibernation::new(Some(2)).unwrap()).await;
    let never = insert("never", Hibernation::NEVER).await;
    assert_eq!(week.hibernates_at(), Some(born + 7 * day));
    assert_eq!((two.hibernates_at(), never.hibernates_at()), (Some(born + 2 * day), None));
    let due = async |at: Timestamp| {
        let claims = claims_of(&store, p, at).await;
        // Each is left due again at once: due on every later claim while awake.
        for claim in &claims {
            let done = MaterializationRecords::complete(
                &store,
                claim.endpoint_id,
                claim.token,
                stored("r", 1, at),
                at,
                None,
            );
            assert!(matches!(done.await.unwrap(), Switch::Switched { .. }));
        }
        let mut names: Vec<String> = claims.into_iter().map(|c| c.name.to_string()).collect();
        names.sort();
        names
    };
    assert_eq!(due(born).await, ["never", "two-days", "weekly"]);
    assert_eq!(due(born + 2 * day - secs(1)).await, ["never", "two-days", "weekly"]);
    assert_eq!(due(born + 2 * day).await, ["never", "weekly"], "asleep at its hibernates_at");
    // A change wakes it.
    let change = EndpointChange { description: Some("woken".into()), ..Default::default() };
    let changed = born + 2 * day + secs(10);
    EndpointStore::update(&store, p, &name("two-days"), change, changed).await.unwrap();
    assert_eq!(due(changed + secs(1)).await, ["never", "two-days", "weekly"]);
    assert_eq!(
        due(born + 7 * day).await,
        ["never"],
        "both asleep: a week unused, and two days since the change"
    );
    // A run wakes it; the days count from the run.
    let ran = born + 8 * day;
    EndpointStore::record_executions(&store, vec![(p, name("weekly"), ran)]).await.unwrap();
    let woken = EndpointStore::get(&store, p, &name("weekly")).await.unwrap();
    assert_eq!(woken.hibernates_at(), Some(ran + 7 * day));
    assert_eq!(due(ran + secs(1)).await, ["never", "weekly"]);
    assert_eq!(due(ran + 7 * day - secs(1)).await, ["never", "weekly"]);
    assert_eq!(due(ran + 7 * day).await, ["never"]);
    // Left not due for the other tests' claims: a refresh far away, and not a record to take over.
    let claim = claims_of(&store, p, ran + 8 * day).await.pop().expect("the one that never hibernates");
    let far = T0 + 3650 * day;
    MaterializationRecords::complete(&store, never.id, claim.token, stored("r", 1, far), far, None)
        .await
        .unwrap();
}

/// Waits for a change `wanted` accepts, skipping those of tests running at the same time on the same database.
fn wait_for(changes: &std::sync::mpsc::Receiver<Change>, wanted: impl Fn(&Change) -> bool) -> Change {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let change = changes.recv_timeout(left).expect("the change is announced within 10 s");
        if wanted(&change) {
            return change;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_announces_committed_changes_to_every_listener() {
    let store = postgres_store();
    let (sender, changes) = std::sync::mpsc::channel();
    let _listener = store
        .database()
        .listen_for_changes(move |change| {
            let _ = sender.send(change);
        })
        .expect("PostgreSQL announces changes");
    // Connected: whatever happened before is unknown to a new listener, and from now on every change is heard.
    assert_eq!(wait_for(&changes, |_| true), Change::Everything);
    // (after what other tests announced meanwhile, applied first)
    assert_eq!(wait_for(&changes, |c| *c == Change::Heard), Change::Heard);

    let p = project(&store).await;
    EndpointStore::insert(&store, new_endpoint(p, "watched")).await.unwrap();
    let ours = |wanted: &'static str| {
        move |change: &Change| {
            matches!(change, Change::Endpoint { project, .. } if *project == p && wanted == "endpoint")
                || matches!(change, Change::Project { project } if *project == p && wanted == "project")
                || (wanted == "keys" && *change == Change::Keys)
        }
    };
    let change = EndpointChange { description: Some("changed".into()), ..Default::default() };
    EndpointStore::update(&store, p, &name("watched"), change, T0).await.unwrap();
    assert_eq!(wait_for(&changes, ours("endpoint")), Change::Endpoint { project: p, name: name("watched") });

    // A written table and its readers are announced together, in order, without a change of their own.
    // A stored result switched to is announced with its switch: runs cached from the one before go everywhere.
    {
        let _serial = CLAIMING.lock().await;
        let id = materialized(&store, p, "stored").await;
        let claim = claims_of(&store, p, T0).await.pop().expect("a new materialized endpoint is due");
        let far = T0 + Duration::from_secs(86_400 * 365);
        let switch = MaterializationRecords::complete(&store, id, claim.token, stored("s", 1, T0), far, None);
        assert_eq!(switch.await.unwrap(), Switch::Switched { replaced: None });
        assert_eq!(
            wait_for(&changes, ours("endpoint")),
            Change::Endpoint { project: p, name: name("stored") }
        );
    }

    let events = TableName::parse("events").unwrap();
    TableAnnouncer::announce(&store, p, vec![events.clone()], vec![name("watched")]).await.unwrap();
    let table = |change: &Change| matches!(change, Change::Table { project, .. } if *project == p);
    assert_eq!(wait_for(&changes, table), Change::Table { project: p, name: events });
    assert_eq!(wait_for(&changes, ours("endpoint")), Change::Endpoint { project: p, name: name("watched") });
    // Heard again at the listener's heartbeat, each second.
    assert_eq!(wait_for(&changes, |c| *c == Change::Heard), Change::Heard);

    // A change that fails is rolled back and announces nothing: the next change of the project is the delete.
    let ghost = EndpointChange { description: Some("x".into()), ..Default::default() };
    assert!(EndpointStore::update(&store, p, &name("ghost"), ghost, T0).await.is_err());
    EndpointStore::delete(&store, p, &name("watched")).await.unwrap();
    assert_eq!(wait_for(&changes, ours("endpoint")), Change::Endpoint { project: p, name: name("watched") });

    let key = ApiKey {
        id: Uuid::new_v4(),
        project_id: p,
        label: "watched".into(),
        scopes: vec![Scope::EndpointRead],
        secret_hash: format!("{:064x}", Uuid::new_v4().as_u128()),
        prefix: "phx_abcdef".into(),
        created_at: T0,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
    };
    ApiKeyStore::insert(&store, key.clone()).await.unwrap();
    ApiKeyStore::revoke(&store, key.id, T0).await.unwrap();
    assert_eq!(wait_for(&changes, |c| *c == Change::Keys), Change::Keys);
    ProjectStore::set_token_secret(&store, p, TokenSecret::generate(), true).await.unwrap();
    assert_eq!(wait_for(&changes, ours("project")), Change::Project { project: p });
    ProjectStore::set_allowed_origins(&store, p, vec!["https://a.example".into()]).await.unwrap();
    assert_eq!(wait_for(&changes, ours("project")), Change::Project { project: p });
}

#[tokio::test]
async fn sqlite_serves_one_process_and_announces_nothing() {
    let (store, _file) = sqlite_store();
    assert!(store.database().listen_for_changes(|_| {}).is_none());
    let (p, t) = (ProjectId::new(1).unwrap(), TableName::parse("t").unwrap());
    TableAnnouncer::announce(&store, p, vec![t.clone()], Vec::new()).await.unwrap();
    TableAnnouncer::announce_and_settle(&store, p, vec![t], Vec::new()).await;
}

async fn table_leases_are_held_by_one_holder_until_released_or_expired(store: DieselStore) {
    let p = project(&store).await;
    let events = TableName::parse("events").unwrap();
    let until = T0 + Duration::from_secs(60);
    // Eight holders race for one free lease: exactly one wins.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let (store, events) = (store.clone(), events.clone());
            tokio::spawn(async move {
                let holder = Uuid::new_v4();
                (holder, TableLeases::claim(&store, p, &events, holder, T0, until).await.unwrap())
            })
        })
        .collect();
    let mut winners = Vec::new();
    for racer in racers {
        let (holder, won) = racer.await.unwrap();
        if won {
            winners.push(holder);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let (holder, other) = (winners[0], Uuid::new_v4());
    // Another table of the project, and the same table of another project, are leased apart.
    assert!(TableLeases::claim(&store, p, &TableName::parse("orders").unwrap(), other, T0, until)
        .await
        .unwrap());
    assert!(TableLeases::claim(&store, project(&store).await, &events, other, T0, until).await.unwrap());
    // Held: refused to others until it expires; renewed by its holder.
    assert!(!TableLeases::claim(&store, p, &events, other, T0 + Duration::from_secs(59), until)
        .await
        .unwrap());
    assert!(TableLeases::claim(&store, p, &events, holder, T0, until + Duration::from_secs(60))
        .await
        .unwrap());
    assert!(!TableLeases::claim(&store, p, &events, other, until, until + Duration::from_secs(60))
        .await
        .unwrap());
    // Released by anyone else: nothing happens; by its holder: free at once.
    TableLeases::release(&store, p, &events, other).await.unwrap();
    assert!(!TableLeases::claim(&store, p, &events, other, T0, until).await.unwrap());
    TableLeases::release(&store, p, &events, holder).await.unwrap();
    assert!(TableLeases::claim(&store, p, &events, other, T0, until).await.unwrap());
    // Expired (its holder crashed): another takes it.
    let later = until + Duration::from_secs(1);
    assert!(TableLeases::claim(&store, p, &events, holder, later, later + Duration::from_secs(60))
        .await
        .unwrap());
}

async fn append_keys_are_claimed_once_answered_and_forgotten(store: DieselStore) {
    let p = project(&store).await;
    let events = TableName::parse("events").unwrap();
    let key = IdempotencyKey::parse("batch-1").unwrap();
    let expired = T0 - Duration::from_secs(86_400);
    // Eight appends race for one new key: exactly one claims it, the others see it pending under its id.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let (store, events, key) = (store.clone(), events.clone(), key.clone());
            tokio::spawn(async move {
                let id = Uuid::new_v4();
                (id, AppendKeys::claim(&store, p, &events, &key, id, T0, expired).await.unwrap())
            })
        })
        .collect();
    let mut states = Vec::new();
    for racer in racers {
        states.push(racer.await.unwrap());
    }
    let claimed: Vec<Uuid> =
        states.iter().filter(|(_, s)| *s == AppendKeyState::Claimed).map(|(id, _)| *id).collect();
    assert_eq!(claimed.len(), 1, "{states:?}");
    let first = claimed[0];
    assert!(states.iter().all(|(_, s)| *s == AppendKeyState::Claimed
        || *s == AppendKeyState::Pending { write_id: first, since: T0, writer_gone: false }));
    assert_eq!(store.pending(p, &events).await.unwrap(), vec![first]);
    // The same key on another table is another key.
    let other = TableName::parse("orders").unwrap();
    let claim = AppendKeys::claim(&store, p, &other, &key, Uuid::new_v4(), T0, expired).await.unwrap();
    assert_eq!(claim, AppendKeyState::Claimed);

    // Taken over only from the id it is pending under.
    let later = T0 + Duration::from_secs(300);
    let second = Uuid::new_v4();
    assert!(!store.take_over(p, &events, &key, Uuid::new_v4(), second, later).await.unwrap());
    assert!(store.take_over(p, &events, &key, first, second, later).await.unwrap());
    let state = AppendKeys::claim(&store, p, &events, &key, Uuid::new_v4(), later, expired).await.unwrap();
    assert_eq!(state, AppendKeyState::Pending { write_id: second, since: later, writer_gone: false });

    // Answered by the id it is pending under only; then every claim gets the answer.
    let written = Written { rows: 5, bytes: 40, created: false, rows_quarantined: 0 };
    store.answer(p, &events, &key, first, "stale", written).await.unwrap();
    store.answer(p, &events, &key, second, "abc123", written).await.unwrap();
    let state = AppendKeys::claim(&store, p, &events, &key, Uuid::new_v4(), later, expired).await.unwrap();
    assert_eq!(state, AppendKeyState::Answered { body_sha256: "abc123".into(), written });
    assert!(store.pending(p, &events).await.unwrap().is_empty());
    // An answered key is never forgotten by a failed append, nor taken over.
    store.forget(p, &events, &key, second).await.unwrap();
    assert!(!store.take_over(p, &events, &key, second, Uuid::new_v4(), later).await.unwrap());
    assert!(matches!(
        AppendKeys::claim(&store, p, &events, &key, Uuid::new_v4(), later, expired).await.unwrap(),
        AppendKeyState::Answered { .. }
    ));

    // A pending key whose append wrote nothing is forgotten, and free again.
    let refused = IdempotencyKey::parse("batch-2").unwrap();
    let id = Uuid::new_v4();
    assert_eq!(
        AppendKeys::claim(&store, p, &events, &refused, id, T0, expired).await.unwrap(),
        AppendKeyState::Claimed
    );
    store.forget(p, &events, &refused, id).await.unwrap();
    let again = AppendKeys::claim(&store, p, &events, &refused, Uuid::new_v4(), T0, expired).await.unwrap();
    assert_eq!(again, AppendKeyState::Claimed);

    // Past its window a key is new again; the sweep removes what is past it.
    let next_day = T0 + Duration::from_secs(86_400 + 1);
    let renewed =
        AppendKeys::claim(&store, p, &events, &key, Uuid::new_v4(), next_day, T0 + Duration::from_secs(1))
            .await
            .unwrap();
    assert_eq!(renewed, AppendKeyState::Claimed);
    let removed = store.sweep(T0 + Duration::from_secs(1)).await.unwrap();
    assert!(removed >= 2, "{removed}");
    let state = AppendKeys::claim(&store, p, &other, &key, Uuid::new_v4(), next_day, expired).await.unwrap();
    assert_eq!(state, AppendKeyState::Claimed, "swept");
}

/// `sql` on a connection of `store`'s PostgreSQL database: its text column `value` of each row (a change is
/// written `WITH done AS (... RETURNING x) SELECT x AS value FROM done`).
fn pg_rows(store: &DieselStore, sql: &str) -> Vec<String> {
    use diesel::sql_types::Text;
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
        value: Option<String>,
    }
    store
        .database()
        .on_connection(|conn| match conn {
            crate::connection::AnyConnection::Postgresql(conn) => {
                let rows: Vec<Row> = diesel::RunQueryDsl::load(diesel::sql_query(sql), conn).unwrap();
                rows.into_iter().map(|row| row.value.unwrap_or_default()).collect()
            }
            crate::connection::AnyConnection::Sqlite(_) => unreachable!("a PostgreSQL store"),
        })
        .unwrap()
}

/// Read your writes across processes: a writer's `settle` returns once every listening process has applied
/// the change (it is already delivered to the listener when `settle` returns); a process that beats but never
/// acknowledges is waited for at most the bound and counted out; a listener counted out forgets everything at
/// its next heartbeat, and clears its mark.
/// A writer whose process listens waits for acknowledgements on a channel its listener completes, holding no
/// connection: 64 updates on two processes settle at once on a pool of 4, each applied by the other process
/// before its settle returns; and while 64 wait for a process that never answers, the pool still serves reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_writers_wait_without_holding_a_connection() {
    let writer = postgres_store();
    let other = postgres_store();
    let applied = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let seen = Arc::clone(&applied);
    let _theirs = other
        .database()
        .listen_for_changes(move |change| {
            match change {
                Change::Endpoint { name, .. } => seen.lock().unwrap().insert(name.to_string()),
                Change::Table { name, .. } => seen.lock().unwrap().insert(name.to_string()),
                _ => false,
            };
        })
        .expect("PostgreSQL announces changes");
    let _ours = writer.database().listen_for_changes(|_| {}).expect("PostgreSQL announces changes");
    let theirs = format!("SELECT id AS value FROM endpoints_nodes WHERE id = '{}'", other.database().node());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !writer.database().waiters().listening() || pg_rows(&writer, &theirs).is_empty() {
        assert!(std::time::Instant::now() < deadline, "both listeners are in");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let p = project(&writer).await;
    for i in 0..64 {
        EndpointStore::insert(&writer, new_endpoint(p, &format!("e{i}"))).await.unwrap();
    }
    let propagation = writer.database().propagation();
    let updates: Vec<_> = (0..64)
        .map(|i| {
            let (writer, propagation, applied) =
                (writer.clone(), Arc::clone(&propagation), Arc::clone(&applied));
            tokio::spawn(async move {
                let change = EndpointChange { description: Some("changed".into()), ..Default::default() };
                EndpointStore::update(&writer, p, &name(&format!("e{i}")), change, T0).await.unwrap();
                propagation.settle().await;
                assert!(
                    applied.lock().unwrap().contains(&format!("e{i}")),
                    "e{i} applied before settle returned"
                );
                // A table write is announced and waited for in one go.
                let table = TableName::parse(&format!("t{i}")).unwrap();
                TableAnnouncer::announce_and_settle(&writer, p, vec![table], Vec::new()).await;
                assert!(
                    applied.lock().unwrap().contains(&format!("t{i}")),
                    "t{i} applied before it returned"
                );
            })
        })
        .collect();
    for update in updates {
        update.await.unwrap();
    }

    // A process that beats but never acknowledges: 64 writers wait for it at once, and the pool serves a read
    // meanwhile (each waiting writer holding a connection would keep it for the whole bound).
    let ghost = format!("ghost-{}", Uuid::new_v4().simple());
    pg_rows(
        &writer,
        &format!(
            "WITH done AS (INSERT INTO endpoints_nodes (id, seen_at) VALUES ('{ghost}', now()) RETURNING id) \
             SELECT id AS value FROM done"
        ),
    );
    let began = std::time::Instant::now();
    let waits: Vec<_> = (0..64)
        .map(|_| {
            let propagation = Arc::clone(&propagation);
            tokio::spawn(async move { propagation.settle().await })
        })
        .collect();
    while !writer.database().waiters().any() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let read = std::time::Instant::now();
    EndpointStore::get(&writer, p, &name("e0")).await.unwrap();
    let read = read.elapsed();
    for wait in waits {
        wait.await.unwrap();
    }
    let waited = began.elapsed();
    pg_rows(&writer, &format!("WITH done AS (DELETE FROM endpoints_nodes WHERE id = '{ghost}' RETURNING id) SELECT id AS value FROM done"));
    assert!(read < crate::changes::ACK_WITHIN / 2, "a read waited {read:?} for a connection");
    assert!(waited < crate::changes::ACK_WITHIN * 3, "64 waits took {waited:?}, not one bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_writers_wait_for_every_listener_and_count_out_the_silent() {
    let writer = postgres_store();
    let other = postgres_store();
    let (sender, changes) = std::sync::mpsc::channel();
    let _listener = other
        .database()
        .listen_for_changes(move |change| {
            let _ = sender.send(change);
        })
        .expect("PostgreSQL announces changes");
    assert_eq!(wait_for(&changes, |_| true), Change::Everything);
    let node = other.database().node().to_owned();
    let beat = format!("SELECT counted_out::text AS value FROM endpoints_nodes WHERE id = '{node}'");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while pg_rows(&writer, &beat) != ["false"] {
        assert!(std::time::Instant::now() < deadline, "the listener's heartbeat is not in");
        std::thread::sleep(Duration::from_millis(20));
    }

    let p = project(&writer).await;
    EndpointStore::insert(&writer, new_endpoint(p, "seen")).await.unwrap();
    let propagation = writer.database().propagation();
    for round in 0..20 {
        let change = EndpointChange { description: Some(format!("round {round}")), ..Default::default() };
        EndpointStore::update(&writer, p, &name("seen"), change, T0).await.unwrap();
        propagation.settle().await;
        // Applied (delivered to the listener's callback) before `settle` returned: no waiting here.
        let applied: Vec<Change> = changes.try_iter().collect();
        let ours = Change::Endpoint { project: p, name: name("seen") };
        assert!(applied.contains(&ours), "round {round}: {applied:?}");
    }

    // A process that beats but never acknowledges: waited for the bound, then counted out.
    let ghost = format!("ghost-{}", Uuid::new_v4().simple());
    let made = "INSERT INTO endpoints_nodes (id, seen_at) VALUES";
    pg_rows(
        &writer,
        &format!("WITH done AS ({made} ('{ghost}', now()) RETURNING id) SELECT id AS value FROM done"),
    );
    let began = std::time::Instant::now();
    propagation.settle().await;
    let waited = began.elapsed();
    let out = pg_rows(
        &writer,
        &format!("SELECT counted_out::text AS value FROM endpoints_nodes WHERE id = '{ghost}'"),
    );
    let gone = format!("DELETE FROM endpoints_nodes WHERE id = '{ghost}' RETURNING id");
    pg_rows(&writer, &format!("WITH done AS ({gone}) SELECT id AS value FROM done"));
    assert!(waited >= crate::changes::ACK_WITHIN && waited < crate::changes::ACK_WITHIN * 2, "{waited:?}");
    assert_eq!(out, ["true"]);

    // The listener counted out: it forgets everything at its next heartbeat, and clears the mark.
    let _ = changes.try_iter().count();
    let mark = format!("UPDATE endpoints_nodes SET counted_out = TRUE WHERE id = '{node}' RETURNING id");
    pg_rows(&writer, &format!("WITH done AS ({mark}) SELECT id AS value FROM done"));
    assert_eq!(wait_for(&changes, |change| *change == Change::Everything), Change::Everything);
    assert_eq!(pg_rows(&writer, &beat), ["false"]);
    EndpointStore::delete(&writer, p, &name("seen")).await.unwrap();
}
