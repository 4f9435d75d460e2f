use std::sync::{Arc, Mutex};

use futures_util::stream;
use mockall::predicate::{always, eq};
use serde_json::json;

use super::super::model::{ExternalSource, TableFormat, TableSource, WriteMode};
use super::super::ports::{MockAppendKeys, MockTableAnnouncer, MockTableStore};
use super::*;
use crate::endpoints::{
    Endpoint, MockEndpointChanges, MockEndpointStore, MockTableReadersChanged, TableReader,
};
use crate::error::UploadError;
use crate::materialization::MockMaterializationRecords;
use crate::query::{ColumnType, MockQueryEngine, QueryDescription};
use crate::testing::{endpoint, project, query, T0};

/// The service called as its adapters call it: a name from a path, a body read into its source first.
impl TableService {
    async fn write_named(
        &self,
        project: ProjectId,
        name: &str,
        upload: Upload,
    ) -> Result<(Table, Written), Error> {
        self.write(project, &TableName::parse(name)?, upload).await
    }

    async fn register_json(
        &self,
        project: ProjectId,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<(Table, bool), Error> {
        self.register(project, &TableName::parse(name)?, ExternalSource::try_from(body)?).await
    }

    async fn delete_named(&self, project: ProjectId, name: &str) -> Result<(), Error> {
        self.delete(project, &TableName::from_path(name)?).await
    }

    async fn preview_named(
        &self,
        project: ProjectId,
        name: &str,
        limit: Option<i64>,
    ) -> Result<(QueryResult, u32), Error> {
        self.preview(project, &TableName::from_path(name)?, limit).await
    }
}

fn info(name: &str) -> TableInfo {
    crate::testing::table_info(name, &[("n", ColumnType::Integer)])
}

/// `readers()`, read one by one, telling other processes of changes.
fn endpoints() -> MockEndpointStore {
    let mut store = readers();
    store
        .expect_get()
        .returning(|_, name| all().into_iter().find(|e| e.name == *name).ok_or(StoreError::NotFound));
    store
}

/// An announcer that takes anything.
fn announcer() -> MockTableAnnouncer {
    let mut announcer = MockTableAnnouncer::new();
    announcer.expect_announce_and_settle().return_const(());
    announcer
}

/// The id of `sales_by_day`, the one materialized reader.
const MATERIALIZED: uuid::Uuid = uuid::Uuid::from_u128(7);

/// `sales_by_day` reads `sales` (recorded) and is materialized, `legacy` reads `sales` too (not recorded:
/// planned on demand), and `other` reads `events`.
fn readers() -> MockEndpointStore {
    let mut store = MockEndpointStore::new();
    store.expect_readers().returning(|_, tables| {
        Ok(all().iter().map(TableReader::of).filter(|r| r.may_read(tables)).collect())
    });
    store
}

/// The project's endpoints: see [`readers`].
fn all() -> Vec<Endpoint> {
    let reads = |name: &str, tables: Option<&[&str]>| Endpoint {
        tables: tables.map(|t| t.iter().map(|s| (*s).to_owned()).collect()),
        ..endpoint(
            name,
            query(json!({"kind": "SQLQuery", "query": format!("SELECT 1 AS {}", name.replace('-', "_"))})),
        )
    };
    vec![
        Endpoint { id: MATERIALIZED, is_materialized: true, ..reads("sales_by_day", Some(&["sales"])) },
        reads("legacy", None),
        reads("other", Some(&["events"])),
    ]
}

fn engine() -> MockQueryEngine {
    let mut engine = MockQueryEngine::new();
    engine.expect_describe_queued().returning(|_, q| {
        assert_eq!(q.sql, "SELECT 1 AS legacy", "only the version without recorded tables is planned");
        Ok(QueryDescription { tables: vec!["sales".into()], ..QueryDescription::default() })
    });
    engine
}

fn service(tables: MockTableStore, engine: MockQueryEngine, changes: MockEndpointChanges) -> TableService {
    service_over(tables, endpoints(), engine, changes)
}

fn service_over(
    tables: MockTableStore,
    endpoints: MockEndpointStore,
    engine: MockQueryEngine,
    changes: MockEndpointChanges,
) -> TableService {
    service_with_keys(tables, endpoints, engine, changes, MockAppendKeys::new())
}

fn service_with_keys(
    tables: MockTableStore,
    endpoints: MockEndpointStore,
    engine: MockQueryEngine,
    changes: MockEndpointChanges,
    keys: MockAppendKeys,
) -> TableService {
    let mut materializations = MockMaterializationRecords::new();
    materializations.expect_appended().returning(|_, _| Ok(()));
    service_with(tables, endpoints, engine, changes, keys, materializations, announcer())
}

fn service_with(
    tables: MockTableStore,
    endpoints: MockEndpointStore,
    engine: MockQueryEngine,
    changes: MockEndpointChanges,
    keys: MockAppendKeys,
    materializations: MockMaterializationRecords,
    announcer: MockTableAnnouncer,
) -> TableService {
    TableService::new(TableDeps {
        tables: Arc::new(tables),
        endpoints: Arc::new(endpoints),
        engine: Arc::new(engine),
        changes: Arc::new(changes),
        announcer: Arc::new(announcer),
        materializations: Arc::new(materializations),
        keys: Arc::new(keys),
        // Only a layout set is told (a call it does not expect fails the test).
        layouts: Arc::new(MockTableReadersChanged::new()),
        clock: Arc::new(crate::testing::ManualClock::new(T0)),
        append_in_flight: crate::tables::APPEND_IN_FLIGHT,
    })
}

fn upload(mode: WriteMode) -> Upload {
    Upload {
        format: TableFormat::Csv,
        mode,
        body: Box::pin(stream::empty()),
        limit_bytes: 1024,
        tag: None,
        quarantine: false,
    }
}

#[tokio::test]
async fn a_write_makes_the_cached_runs_of_its_readers_stale_and_only_theirs() {
    let mut tables = MockTableStore::new();
    tables
        .expect_write()
        .with(eq(project(1)), eq(TableName::parse("sales").unwrap()), always())
        .times(1)
        .returning(|_, _, _| Ok(Written { rows: 2, bytes: 10, created: false, rows_quarantined: 0 }));
    tables.expect_get().returning(|_, name| Ok(Some(info(name.as_str()))));
    let told = Arc::new(Mutex::new(Vec::new()));
    let mut changes = MockEndpointChanges::new();
    let seen = Arc::clone(&told);
    changes.expect_changed().returning(move |_, name| seen.lock().unwrap().push(name.to_string()));
    changes.expect_settled().never();
    // Answered once the other processes applied the announcement of the table and its readers.
    let mut announcer = MockTableAnnouncer::new();
    let announced = Arc::clone(&told);
    announcer.expect_announce_and_settle().times(1).returning(move |p, tables, readers| {
        let name = |n: &str| EndpointName::parse(n).unwrap();
        assert_eq!(p, project(1));
        assert_eq!(tables, vec![TableName::parse("sales").unwrap()]);
        assert_eq!(readers, vec![name("sales_by_day"), name("legacy")]);
        announced.lock().unwrap().push("announced and settled".into());
    });
    let mut materializations = MockMaterializationRecords::new();
    materializations.expect_appended().returning(|_, _| Ok(()));
    let service = service_with(
        tables,
        endpoints(),
        engine(),
        changes,
        MockAppendKeys::new(),
        materializations,
        announcer,
    );
    let (table, written) = service.write_named(project(1), "sales", upload(WriteMode::Append)).await.unwrap();
    assert_eq!(written.rows, 2);
    let readers = vec!["sales_by_day".to_owned(), "legacy".to_owned()];
    assert_eq!(*told.lock().unwrap(), [&readers[..], &["announced and settled".into()]].concat());
    assert_eq!(table.used_by.iter().map(|n| n.to_string()).collect::<Vec<_>>(), readers);
}

/// A reader whose tables were not recorded and that cannot be planned now (its project's slots stayed busy
/// past the query timeout) is taken to read the table: its cached runs are dropped rather than left to answer old rows. One whose query
/// no longer plans reads nothing.
#[tokio::test]
async fn a_reader_that_cannot_be_planned_now_is_taken_to_read_the_written_table() {
    for (refusal, stale) in [
        (EngineError::Timeout(std::time::Duration::from_secs(30)), true),
        (EngineError::InvalidQuery("no such column".into()), false),
    ] {
        let mut tables = MockTableStore::new();
        tables
            .expect_write()
            .returning(|_, _, _| Ok(Written { rows: 1, bytes: 5, created: false, rows_quarantined: 0 }));
        tables.expect_get().returning(|_, name| Ok(Some(info(name.as_str()))));
        let mut engine = MockQueryEngine::new();
        let refused = std::sync::Mutex::new(Some(refusal));
        engine
            .expect_describe_queued()
            .times(1)
            .returning(move |_, _| Err(refused.lock().unwrap().take().unwrap()));
        let told = Arc::new(Mutex::new(Vec::new()));
        let mut changes = MockEndpointChanges::new();
        let seen = Arc::clone(&told);
        changes.expect_changed().returning(move |_, name| seen.lock().unwrap().push(name.to_string()));
        let service = service(tables, engine, changes);
        let (table, _) = service.write_named(project(1), "sales", upload(WriteMode::Append)).await.unwrap();
        let expected: &[&str] = if stale { &["sales_by_day", "legacy"] } else { &["sales_by_day"] };
        assert_eq!(*told.lock().unwrap(), expected);
        assert_eq!(table.used_by.iter().map(|n| n.to_string()).collect::<Vec<_>>(), expected);
    }
}

#[tokio::test]
async fn a_write_makes_its_materialized_readers_due_within_their_freshness_before_it_is_answered() {
    for mode in [WriteMode::Append, WriteMode::Replace] {
        let mut tables = MockTableStore::new();
        tables
            .expect_write()
            .returning(|_, _, _| Ok(Written { rows: 2, bytes: 10, created: false, rows_quarantined: 0 }));
        tables.expect_get().returning(|_, name| Ok(Some(info(name.as_str()))));
        let mut materializations = MockMaterializationRecords::new();
        // Only the materialized reader, at the time of the write.
        materializations
            .expect_appended()
            .with(eq(vec![MATERIALIZED]), eq(T0))
            .times(1)
            .returning(|_, _| Ok(()));
        let mut store = endpoints();
        store.expect_get().returning(|_, name| {
            Ok(endpoint(name.as_str(), query(json!({"kind": "SQLQuery", "query": "SELECT 1 AS n"}))))
        });
        store.expect_replan().returning(|_, _, _| Ok(true));
        let mut engine = MockQueryEngine::new();
        engine.expect_describe_queued().returning(|_, _| {
            Ok(QueryDescription { tables: vec!["sales".into()], ..QueryDescription::default() })
        });
        let mut changes = MockEndpointChanges::new();
        changes.expect_changed().return_const(());
        let service = service_with(
            tables,
            store,
            engine,
            changes,
            MockAppendKeys::new(),
            materializations,
            announcer(),
        );
        service.write_named(project(1), "sales", upload(mode)).await.unwrap();
    }
    // A write to a table no materialized endpoint reads records nothing; one that cannot be recorded fails, so
    // that an answered append is never left out of a stored result.
    let mut tables = MockTableStore::new();
    tables
        .expect_write()
        .returning(|_, _, _| Ok(Written { rows: 2, bytes: 10, created: false, rows_quarantined: 0 }));
    tables.expect_get().returning(|_, name| Ok(Some(info(name.as_str()))));
    let mut materializations = MockMaterializationRecords::new();
    materializations.expect_appended().times(1).returning(|_, _| Err(StoreError::Unavailable("down".into())));
    let mut changes = MockEndpointChanges::new();
    changes.expect_changed().return_const(());
    let service = service_with(
        tables,
        endpoints(),
        engine(),
        changes,
        MockAppendKeys::new(),
        materializations,
        announcer(),
    );
    service.write_named(project(1), "events", upload(WriteMode::Append)).await.unwrap();
    assert!(service.write_named(project(1), "sales", upload(WriteMode::Append)).await.is_err());
}

#[tokio::test]
async fn a_replace_plans_its_readers_again_and_records_what_that_told() {
    let mut tables = MockTableStore::new();
    tables
        .expect_write()
        .returning(|_, _, _| Ok(Written { rows: 2, bytes: 10, created: false, rows_quarantined: 0 }));
    tables.expect_get().returning(|_, name| Ok(Some(info(name.as_str()))));
    let mut store = readers();
    store.expect_get().returning(|_, name| {
        let sql = format!("SELECT 1 AS {name}");
        Ok(Endpoint {
            current_version: 4,
            ..endpoint(name.as_str(), query(json!({"kind": "SQLQuery", "query": sql})))
        })
    });
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&recorded);
    store.expect_replan().returning(move |_, version, replanned| {
        record.lock().unwrap().push((version, replanned));
        Ok(true)
    });
    let mut engine = MockQueryEngine::new();
    engine.expect_describe_queued().returning(|_, q| match q.sql.as_str() {
        // `legacy` has no recorded tables: it is planned once to find them, and once again as a reader.
        "SELECT 1 AS legacy" => Ok(QueryDescription {
            tables: vec!["sales".into()],
            columns: vec![crate::query::Column { name: "n".into(), column_type: ColumnType::Float }],
            ..QueryDescription::default()
        }),
        "SELECT 1 AS sales_by_day" => {
            Err(EngineError::InvalidQuery("Schema error: No field named day.".into()))
        }
        other => panic!("{other} does not read sales"),
    });
    let mut changes = MockEndpointChanges::new();
    changes.expect_changed().times(2).return_const(());
    service_over(tables, store, engine, changes)
        .write_named(project(1), "sales", upload(WriteMode::Replace))
        .await
        .unwrap();
    let recorded = recorded.lock().unwrap();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0], (4, Err("Schema error: No field named day.".to_owned())));
    let (version, Ok(planned)) = &recorded[1] else { panic!("{:?}", recorded[1]) };
    assert_eq!((*version, planned.tables.clone()), (4, vec!["sales".to_owned()]));
    assert_eq!(planned.columns[0].column_type, ColumnType::Float, "the new columns are recorded");
}

#[tokio::test]
async fn registering_a_source_replaces_the_table_and_stales_its_readers() {
    let mut tables = MockTableStore::new();
    let registered = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&registered);
    tables.expect_register().times(1).returning(move |_, name, source| {
        record.lock().unwrap().push((name.to_string(), source));
        Ok(true)
    });
    tables.expect_get().returning(|_, name| Ok(Some(info(name.as_str()))));
    let mut store = endpoints();
    store.expect_get().returning(|_, name| {
        Ok(endpoint(name.as_str(), query(json!({"kind": "SQLQuery", "query": "SELECT 1 AS legacy"}))))
    });
    store.expect_replan().times(2).returning(|_, _, _| Ok(true));
    let mut engine = MockQueryEngine::new();
    engine.expect_describe_queued().returning(|_, _| {
        Ok(QueryDescription { tables: vec!["sales".into()], ..QueryDescription::default() })
    });
    let mut changes = MockEndpointChanges::new();
    changes.expect_changed().times(2).return_const(());
    let body = json!({"source": {"url": "s3://bucket/sales/", "format": "parquet"}});
    let (table, created) =
        service_over(tables, store, engine, changes).register_json(project(1), "sales", &body).await.unwrap();
    assert!(created);
    assert_eq!(table.used_by.len(), 2);
    let want = ExternalSource::Files { url: "s3://bucket/sales/".into(), format: TableFormat::Parquet };
    assert_eq!(*registered.lock().unwrap(), vec![("sales".to_owned(), want)]);

    // A body that names no usable source reaches no store.
    let mut untouched = MockTableStore::new();
    untouched.expect_register().never();
    let service = service(untouched, MockQueryEngine::new(), MockEndpointChanges::new());
    let err =
        service.register_json(project(1), "sales", &json!({"source": {"url": "s3://b/"}})).await.unwrap_err();
    assert!(matches!(err, Error::Invalid(ref i) if i.attr.as_deref() == Some("source.format")), "{err:?}");
}

#[test]
fn a_source_body_is_files_with_a_format_a_delta_table_or_a_postgres_table() {
    let files = ExternalSource::try_from(&json!({"source": {"url": "s3://b/p/", "format": "csv"}})).unwrap();
    assert_eq!(files, ExternalSource::Files { url: "s3://b/p/".into(), format: TableFormat::Csv });
    let delta =
        ExternalSource::try_from(&json!({"source": {"url": "s3://b/orders", "format": "delta"}})).unwrap();
    assert_eq!(delta, ExternalSource::Delta { url: "s3://b/orders".into() });
    assert_eq!(TableSource::External(delta).format(), "delta");
    for scheme in ["postgres", "postgresql", "POSTGRES"] {
        let body =
            json!({"source": {"url": format!("{scheme}://u:secret@db/app"), "table": "public.orders"}});
        let ExternalSource::Postgres { table, .. } = ExternalSource::try_from(&body).unwrap() else {
            panic!()
        };
        assert_eq!(table, "public.orders");
    }
    let postgres =
        ExternalSource::try_from(&json!({"source": {"url": "postgres://u:secret@db/app", "table": "t"}}));
    assert!(!format!("{postgres:?}").contains("secret"), "Debug leaves the URL out: {postgres:?}");
    let refused = [
        (json!([]), None),
        (json!({}), Some("source")),
        (json!({"source": "s3://b/"}), Some("source")),
        (json!({"source": {"url": "s3://b/"}, "x": 1}), Some("x")),
        (json!({"source": {"format": "csv"}}), Some("source.url")),
        (json!({"source": {"url": 3, "format": "csv"}}), Some("source.url")),
        (json!({"source": {"url": "bucket/prefix", "format": "csv"}}), Some("source.url")),
        (json!({"source": {"url": "s3://b/", "format": "xlsx"}}), Some("source.format")),
        (json!({"source": {"url": "s3://b/", "format": "csv", "table": "t"}}), Some("source.table")),
        (json!({"source": {"url": "s3://b/", "format": "csv", "sep": ";"}}), Some("source.sep")),
        (json!({"source": {"url": "postgres://db/app"}}), Some("source.table")),
        (json!({"source": {"url": "postgres://db/app", "table": "a;drop"}}), Some("source.table")),
        (json!({"source": {"url": "postgres://db/app", "table": "a.b.c"}}), Some("source.table")),
        (
            json!({"source": {"url": "postgres://db/app", "table": "t", "format": "csv"}}),
            Some("source.format"),
        ),
    ];
    for (body, attr) in refused {
        let err = ExternalSource::try_from(&body).unwrap_err();
        assert_eq!(err.attr.as_deref(), attr, "{body}: {err:?}");
    }
}

#[tokio::test]
async fn a_failed_write_makes_nothing_stale() {
    let mut tables = MockTableStore::new();
    tables.expect_write().returning(|_, _, _| Err(UploadError::Invalid("line 3: expected 2 fields".into())));
    let err = service(tables, MockQueryEngine::new(), MockEndpointChanges::new())
        .write_named(project(1), "sales", upload(WriteMode::Replace))
        .await
        .unwrap_err();
    match err {
        Error::Invalid(invalid) => assert!(invalid.detail.contains("line 3"), "{invalid:?}"),
        other => panic!("{other:?}"),
    }
    let bad_name = service(MockTableStore::new(), MockQueryEngine::new(), MockEndpointChanges::new())
        .write_named(project(1), "no-dashes", upload(WriteMode::Replace))
        .await
        .unwrap_err();
    assert!(matches!(bad_name, Error::Invalid(ref i) if i.attr.as_deref() == Some("table")), "{bad_name:?}");
}

#[tokio::test]
async fn a_table_an_endpoint_reads_cannot_be_deleted() {
    let mut tables = MockTableStore::new();
    tables.expect_delete().never();
    let err = service(tables, engine(), MockEndpointChanges::new())
        .delete_named(project(1), "sales")
        .await
        .unwrap_err();
    match err {
        Error::InUse(detail) => {
            assert!(detail.contains("sales_by_day") && detail.contains("legacy"), "{detail}")
        }
        other => panic!("{other:?}"),
    }

    let mut tables = MockTableStore::new();
    tables
        .expect_delete()
        .with(always(), eq(TableName::parse("unread").unwrap()))
        .times(1)
        .returning(|_, _| Ok(true));
    tables
        .expect_delete()
        .with(always(), eq(TableName::parse("missing").unwrap()))
        .returning(|_, _| Ok(false));
    let service = service(tables, engine(), MockEndpointChanges::new());
    service.delete_named(project(1), "unread").await.unwrap();
    assert!(matches!(service.delete_named(project(1), "missing").await, Err(Error::NotFound(_))));
    assert!(matches!(service.delete_named(project(1), "not a name").await, Err(Error::NotFound(_))));
}

#[tokio::test]
async fn lists_are_paged_by_name_with_their_readers() {
    let mut tables = MockTableStore::new();
    tables.expect_list().returning(|_| Ok(vec![info("events"), info("sales"), info("zeta")]));
    let page = service(tables, engine(), MockEndpointChanges::new())
        .list(project(1), PageRequest { limit: 2, offset: 1 })
        .await
        .unwrap();
    assert_eq!((page.total, page.items.len()), (3, 2));
    assert_eq!(page.items[0].info.name.as_str(), "sales");
    assert_eq!(page.items[0].used_by.len(), 2);
    assert!(page.items[1].used_by.is_empty());
}

#[tokio::test]
async fn a_preview_runs_every_column_of_the_table_for_the_first_rows() {
    let mut tables = MockTableStore::new();
    tables.expect_get().returning(|_, name| Ok((name.as_str() != "missing").then(|| info(name.as_str()))));
    let mut engine = MockQueryEngine::new();
    engine.expect_execute().times(2).returning(|_, q, vars, limit, offset| {
        assert_eq!((q.sql.as_str(), vars.len(), offset), ("SELECT * FROM \"Sales\"", 0, 0));
        Ok(QueryResult {
            columns: vec![],
            rows_json: format!("[{limit}]"),
            row_count: 0,
            has_more: false,
            statistics: crate::query::Statistics::default(),
            read: Vec::new(),
        })
    });
    let service = service(tables, engine, MockEndpointChanges::new());
    let (rows, limit) = service.preview_named(project(1), "Sales", None).await.unwrap();
    assert_eq!((rows.rows_json.as_str(), limit), ("[20]", 20));
    assert_eq!(service.preview_named(project(1), "Sales", Some(5)).await.unwrap().1, 5);
    for limit in [0, 5000, -1] {
        assert!(matches!(
            service.preview_named(project(1), "Sales", Some(limit)).await,
            Err(Error::Invalid(_))
        ));
    }
    assert!(matches!(service.preview_named(project(1), "missing", None).await, Err(Error::NotFound(_))));
}

mod idempotency {
    use std::time::Duration;

    use bytes::Bytes;
    use uuid::Uuid;

    use super::*;
    use crate::tables::{AppendKeyState, IdempotencyKey, TaggedWrite, APPEND_IN_FLIGHT};

    const BODY: &str = "id\n1\n2\n";
    const WRITTEN: Written = Written { rows: 2, bytes: 7, created: false, rows_quarantined: 0 };

    fn key() -> IdempotencyKey {
        IdempotencyKey::parse("batch-1").unwrap()
    }

    fn sales() -> TableName {
        TableName::parse("sales").unwrap()
    }

    fn append(body: &'static str) -> Upload {
        let chunks = vec![Ok::<_, std::io::Error>(Bytes::from_static(body.as_bytes()))];
        Upload { body: Box::pin(stream::iter(chunks)), ..upload(WriteMode::Append) }
    }

    fn sha256(body: &str) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(body.as_bytes()))
    }

    /// A table store whose `get` answers the table; `write` is set by each test.
    fn tables() -> MockTableStore {
        let mut tables = MockTableStore::new();
        tables.expect_get().returning(|_, name| Ok(Some(info(name.as_str()))));
        tables.expect_newest_version().returning(|_, _| Ok(Some(7)));
        tables
    }

    fn keys_answering(state: AppendKeyState) -> MockAppendKeys {
        let mut keys = MockAppendKeys::new();
        keys.expect_claim()
            .withf(|p, table, key, _, now, expired| {
                *p == project(1)
                    && table.as_str() == "sales"
                    && key.as_str() == "batch-1"
                    && *now == T0
                    && *expired == T0 - IDEMPOTENCY_WINDOW
            })
            .times(1)
            .return_once(move |_, _, _, _, _, _| Ok(state));
        keys
    }

    fn service(tables: MockTableStore, keys: MockAppendKeys) -> TableService {
        service_with_keys(tables, endpoints(), engine(), MockEndpointChanges::new(), keys)
    }

    /// An append of `BODY` under the key that writes (its readers told), and what it wrote.
    async fn appended(tables: MockTableStore, keys: MockAppendKeys) -> Written {
        let mut changes = MockEndpointChanges::new();
        changes.expect_changed().returning(|_, _| ());
        let service = service_with_keys(tables, endpoints(), engine(), changes, keys);
        service.append_once(project(1), &sales(), append(BODY), &key()).await.unwrap().1
    }

    fn conflict(result: Result<(Table, Written), Error>) -> String {
        match result {
            Err(Error::IdempotencyConflict(detail)) => detail,
            other => panic!("expected an idempotency conflict, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_new_key_writes_the_rows_tagged_and_records_the_answer() {
        let mut tables = tables();
        let write_id = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&write_id);
        tables.expect_write().times(1).returning(move |_, _, upload| {
            let tag = upload.tag.expect("an append under a key is tagged");
            *seen.lock().unwrap() = Some(tag.write_id);
            // Claimed with the table's version read before the key was: no other append under it lands after.
            assert_eq!((tag.key.as_str(), tag.after), ("batch-1", 7));
            // The engine reads the body; the digest follows it.
            futures_util::FutureExt::now_or_never(BodyDigest::of(upload.body, 1024)).unwrap().unwrap();
            assert_eq!(tag.digest.hex(), sha256(BODY));
            Ok(WRITTEN)
        });
        let mut keys = keys_answering(AppendKeyState::Claimed);
        let recorded = Arc::clone(&write_id);
        keys.expect_answer()
            .withf(move |_, _, _, id, sha, written| {
                Some(*id) == *recorded.lock().unwrap() && *sha == sha256(BODY) && *written == WRITTEN
            })
            .times(1)
            .returning(|_, _, _, _, _, _| Ok(()));
        assert_eq!(appended(tables, keys).await, WRITTEN);
    }

    #[tokio::test]
    async fn a_retry_with_the_same_body_writes_nothing_and_gets_the_first_answer() {
        let mut tables = tables();
        tables.expect_write().never();
        let keys = keys_answering(AppendKeyState::Answered { body_sha256: sha256(BODY), written: WRITTEN });
        let (table, written) =
            service(tables, keys).append_once(project(1), &sales(), append(BODY), &key()).await.unwrap();
        assert_eq!((written, table.info.name), (WRITTEN, sales()));
    }

    #[tokio::test]
    async fn a_key_used_with_another_body_is_a_conflict() {
        let mut tables = tables();
        tables.expect_write().never();
        let keys = keys_answering(AppendKeyState::Answered { body_sha256: sha256(BODY), written: WRITTEN });
        let detail = conflict(
            service(tables, keys).append_once(project(1), &sales(), append("id\n3\n"), &key()).await,
        );
        assert!(detail.contains("another body"), "{detail}");
    }

    #[tokio::test]
    async fn a_retry_while_the_first_append_is_in_flight_is_told_to_wait() {
        let mut tables = tables();
        tables.expect_write().never();
        tables.expect_holds().never();
        let since = T0 - APPEND_IN_FLIGHT + Duration::from_secs(1);
        let pending = AppendKeyState::Pending { write_id: Uuid::from_u128(9), since, writer_gone: false };
        let detail = conflict(
            service(tables, keys_answering(pending))
                .append_once(project(1), &sales(), append(BODY), &key())
                .await,
        );
        assert!(detail.contains("still being written"), "{detail}");
    }

    /// An append whose process is known to have stopped (a crash, then a restart) is resolved by the first
    /// retry, however recently it was claimed.
    #[tokio::test]
    async fn a_retry_of_an_append_whose_process_stopped_is_taken_at_once() {
        let theirs = Uuid::from_u128(9);
        let mut tables = tables();
        tables.expect_holds().withf(move |_, _, id| *id == theirs).times(1).returning(|_, _, _| Ok(None));
        tables.expect_write().times(1).returning(|_, _, _| Ok(WRITTEN));
        let mut keys =
            keys_answering(AppendKeyState::Pending { write_id: theirs, since: T0, writer_gone: true });
        keys.expect_take_over().times(1).returning(|_, _, _, _, _, _| Ok(true));
        keys.expect_answer().times(1).returning(|_, _, _, _, _, _| Ok(()));
        assert_eq!(appended(tables, keys).await, WRITTEN);
    }

    #[tokio::test]
    async fn a_retry_after_a_cut_off_append_whose_rows_landed_records_and_gives_their_answer() {
        let theirs = Uuid::from_u128(9);
        let mut tables = tables();
        tables.expect_write().never();
        tables
            .expect_holds()
            .withf(move |_, _, id| *id == theirs)
            .returning(|_, _, _| Ok(Some(TaggedWrite { written: WRITTEN, body_sha256: sha256(BODY) })));
        let mut keys = keys_answering(AppendKeyState::Pending {
            write_id: theirs,
            since: T0 - APPEND_IN_FLIGHT,
            writer_gone: false,
        });
        keys.expect_answer()
            .withf(move |_, _, _, id, sha, written| {
                *id == theirs && *sha == sha256(BODY) && *written == WRITTEN
            })
            .times(1)
            .returning(|_, _, _, _, _, _| Ok(()));
        // The cut-off append may not have made its readers' cached runs stale: the retry does.
        let told = Arc::new(Mutex::new(Vec::new()));
        let mut changes = MockEndpointChanges::new();
        let seen = Arc::clone(&told);
        changes.expect_changed().returning(move |_, name| seen.lock().unwrap().push(name.to_string()));
        let service = service_with_keys(tables, endpoints(), engine(), changes, keys);
        let (_, written) = service.append_once(project(1), &sales(), append(BODY), &key()).await.unwrap();
        assert_eq!(written, WRITTEN);
        assert!(told.lock().unwrap().contains(&"sales_by_day".to_owned()), "{told:?}");
    }

    #[tokio::test]
    async fn a_retry_after_a_cut_off_append_that_wrote_nothing_takes_the_key_over_and_writes() {
        let theirs = Uuid::from_u128(9);
        let mut tables = tables();
        tables.expect_holds().returning(|_, _, _| Ok(None));
        tables.expect_write().times(1).returning(|_, _, _| Ok(WRITTEN));
        let mut keys = keys_answering(AppendKeyState::Pending {
            write_id: theirs,
            since: T0 - APPEND_IN_FLIGHT,
            writer_gone: false,
        });
        keys.expect_take_over()
            .withf(move |_, _, _, from, _, _| *from == theirs)
            .times(1)
            .returning(|_, _, _, _, _, _| Ok(true));
        keys.expect_answer().times(1).returning(|_, _, _, _, _, _| Ok(()));
        assert_eq!(appended(tables, keys).await, WRITTEN);
    }

    /// A writer that went silent past the in-flight time (not gone) while a retry took its key over and wrote:
    /// the engine refuses its rows, and the key stays the retry's.
    #[tokio::test]
    async fn an_append_whose_key_a_retry_took_over_and_wrote_is_a_conflict_that_keeps_the_key() {
        let mut tables = tables();
        tables.expect_write().times(1).returning(|_, _, _| Err(UploadError::TakenOver));
        let mut keys = keys_answering(AppendKeyState::Claimed);
        keys.expect_forget().never();
        keys.expect_answer().never();
        let detail =
            conflict(service(tables, keys).append_once(project(1), &sales(), append(BODY), &key()).await);
        assert!(detail.contains("'batch-1' (a retry) wrote its rows first"), "{detail}");
    }

    #[tokio::test]
    async fn a_refused_body_frees_its_key_and_a_storage_failure_keeps_it_pending() {
        let mut refusing = tables();
        refusing.expect_write().times(1).returning(|_, _, _| Err(UploadError::Invalid("Row 2: no".into())));
        let mut keys = keys_answering(AppendKeyState::Claimed);
        keys.expect_forget().times(1).returning(|_, _, _, _| Ok(()));
        let refused = service(refusing, keys).append_once(project(1), &sales(), append(BODY), &key()).await;
        assert!(matches!(refused, Err(Error::Invalid(_))), "{refused:?}");

        let mut failing = tables();
        failing.expect_write().times(1).returning(|_, _, _| {
            Err(UploadError::Engine(crate::error::EngineError::Unavailable("disk".into())))
        });
        let mut keys = keys_answering(AppendKeyState::Claimed);
        keys.expect_forget().never();
        let failed = service(failing, keys).append_once(project(1), &sales(), append(BODY), &key()).await;
        assert!(matches!(failed, Err(Error::Unavailable(_))), "{failed:?}");
    }
}

#[tokio::test]
async fn a_tables_versions_are_its_stores_and_a_missing_table_is_not_found() {
    let mut tables = MockTableStore::new();
    let commit = crate::tables::TableCommit {
        version: 0,
        at: T0,
        operation: "WRITE".into(),
        rows_added: Some(2),
        rows_removed: None,
    };
    let listed = commit.clone();
    tables
        .expect_versions()
        .with(eq(project(1)), eq(TableName::parse("sales").unwrap()), always())
        .returning(move |_, _, request| Ok(Some(Page { items: vec![listed.clone()], total: 1, request })));
    tables.expect_versions().returning(|_, _, _| Ok(None));
    let service = service(tables, engine(), MockEndpointChanges::new());
    let page =
        service.versions(project(1), &TableName::parse("sales").unwrap(), PageRequest::default()).await;
    assert_eq!(page.unwrap().items, vec![commit]);
    let missing =
        service.versions(project(1), &TableName::parse("other").unwrap(), PageRequest::default()).await;
    assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
}

/// A table's layout is set to columns it has whose values have an order, or given back to its endpoints; its
/// next compaction is told; a table read where it is, a missing one or a bad body is refused before anything is
/// kept.
#[tokio::test]
async fn a_tables_layout_is_set_to_its_own_orderable_columns_and_its_compaction_told() {
    let events =
        || crate::testing::table_info("events", &[("ts", ColumnType::Datetime), ("tags", ColumnType::Array)]);
    let mut tables = MockTableStore::new();
    tables.expect_get().returning(move |_, name| match name.as_str() {
        "events" => Ok(Some(events())),
        "remote" => Ok(Some(TableInfo {
            source: TableSource::External(ExternalSource::Postgres {
                url: "postgres://db/x".into(),
                table: "t".into(),
            }),
            ..events()
        })),
        _ => Ok(None),
    });
    let pinned = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&pinned);
    tables.expect_pin_layout().returning(move |_, name, columns| {
        seen.lock().unwrap().push((name.as_str().to_owned(), columns));
        Ok(true)
    });
    let mut layouts = MockTableReadersChanged::new();
    layouts
        .expect_readers_changed()
        .withf(|p, tables| *p == project(1) && tables == ["events".to_owned()])
        .times(2)
        .return_const(());
    let mut service = service(tables, engine(), MockEndpointChanges::new());
    service.layouts = Arc::new(layouts);
    let pin = |name: &str, body: serde_json::Value| {
        let service = &service;
        let name = TableName::parse(name).unwrap();
        async move { service.pin_layout(project(1), &name, &body).await }
    };
    let table = pin("events", json!({"cluster_by": ["ts"]})).await.unwrap();
    assert_eq!(table.info.name.as_str(), "events");
    pin("events", json!({"cluster_by": null})).await.unwrap();
    assert_eq!(
        *pinned.lock().unwrap(),
        vec![("events".to_owned(), Some(vec!["ts".to_owned()])), ("events".to_owned(), None)]
    );
    for (name, body) in [
        ("events", json!({"cluster_by": ["tags"]})),
        ("events", json!({"cluster_by": ["missing"]})),
        ("events", json!({})),
        ("remote", json!({"cluster_by": ["ts"]})),
    ] {
        let refused = pin(name, body.clone()).await;
        assert!(
            matches!(&refused, Err(Error::Invalid(invalid)) if invalid.attr.as_deref() == Some("cluster_by")),
            "{name} {body}: {refused:?}"
        );
    }
    assert!(matches!(pin("gone", json!({"cluster_by": []})).await, Err(Error::NotFound(_))));
    assert_eq!(pinned.lock().unwrap().len(), 2, "nothing refused was kept");
}
