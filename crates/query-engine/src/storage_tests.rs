//! Tables on an object store with no directories and no rename (an in-memory store, as S3 is): versions switched
//! by `_current`, appends, failed imports, tables written before versions, and what `--storage` accepts.

use std::path::PathBuf;

use domain::QueryEngine;
use futures_util::TryStreamExt;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::json;

use super::*;
use crate::imports::{import_files, ImportError, ImportMode};

fn project() -> ProjectId {
    ProjectId::new(7).unwrap()
}

fn memory() -> (Storage, Arc<InMemory>) {
    let store = Arc::new(InMemory::new());
    (Storage::from_store(Arc::clone(&store) as Arc<dyn ObjectStore>, "memory:///"), store)
}

/// Every object's path in the store, sorted.
async fn objects(store: &InMemory) -> Vec<String> {
    let mut all: Vec<String> =
        store.list(None).map_ok(|meta| meta.location.to_string()).try_collect().await.unwrap();
    all.sort();
    all
}

/// An input file under a fresh directory, removed with it.
struct Inputs(PathBuf);

impl Inputs {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("qe-storage-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }
}

impl Drop for Inputs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn import(storage: &Storage, file: &PathBuf, mode: ImportMode) -> Result<u64, ImportError> {
    import_files(storage, project(), "things", std::slice::from_ref(file), None, mode, &|_| {})
        .await
        .map(|report| report.rows)
}

async fn total(engine: &DataFusionEngine) -> String {
    let q = Query::try_from(
        &json!({"kind": "SQLQuery", "query": "SELECT count(*) AS n, sum(id) AS s FROM things"}),
    )
    .unwrap();
    engine.execute(project(), &q, &Default::default(), 10, 0).await.unwrap().rows_json
}

#[tokio::test]
async fn a_replace_switches_the_pointer_and_removes_the_old_version() {
    let (storage, store) = memory();
    let engine = crate::tests::engine_on(storage.clone()).await;
    let inputs = Inputs::new();
    let first = inputs.file("first.csv", "id,name\n1,a\n2,b\n");
    let second = inputs.file("second.csv", "id,name\n10,x\n");

    assert_eq!(import(&storage, &first, ImportMode::Replace).await.unwrap(), 2);
    let before = objects(&store).await;
    assert_eq!(before.len(), 2, "{before:?}");
    assert_eq!(before[0], "projects/7/tables/things/_current");
    assert!(before[1].starts_with("projects/7/tables/things/v-") && before[1].ends_with(".parquet"));
    assert_eq!(total(&engine).await, r#"[{"n":2,"s":3}]"#);

    import(&storage, &second, ImportMode::Replace).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":1,"s":10}]"#);
    let after = objects(&store).await;
    assert_eq!(after.len(), 2, "the replaced version is removed: {after:?}");
    assert_ne!(after[1], before[1]);

    // An append joins the current version, and a failed append leaves it as it was.
    import(&storage, &first, ImportMode::Append).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":3,"s":13}]"#);
    let other = inputs.file("other.csv", "x\n1\n");
    let err = import(&storage, &other, ImportMode::Append).await.unwrap_err();
    assert!(matches!(err, ImportError::SchemaMismatch { .. }), "{err:?}");
    assert_eq!(objects(&store).await.len(), 3);
    let tables = engine.tables(project()).await.unwrap();
    assert_eq!((tables[0].name.as_str(), tables[0].files), ("things", 2));
    assert!(
        tables[0].location.starts_with("memory:///projects/7/tables/things/v-"),
        "{}",
        tables[0].location
    );
}

#[tokio::test]
async fn a_kept_plan_answers_until_a_table_it_names_is_replaced_or_gone() {
    let (storage, store) = memory();
    let engine = crate::tests::engine_on(storage.clone()).await;
    if engine.scheduler().is_some() {
        return; // A cluster's plans are not kept.
    }
    let inputs = Inputs::new();
    let first = inputs.file("first.csv", "id,name\n1,a\n2,b\n");
    let second = inputs.file("second.csv", "id,name\n10,x\n");
    import(&storage, &first, ImportMode::Replace).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":2,"s":3}]"#);
    assert_eq!(engine.metrics().plans(), (0, 1), "(kept, new)");
    assert_eq!(total(&engine).await, r#"[{"n":2,"s":3}]"#);
    assert_eq!(engine.metrics().plans(), (1, 1), "the same SQL over the same tables is not planned again");

    // An append's file is read by the kept plan: files are listed when a run is planned physically.
    import(&storage, &first, ImportMode::Append).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":4,"s":6}]"#);
    assert_eq!(engine.metrics().plans(), (2, 1));

    // A replace switches the pointer: the next run plans against the new version.
    import(&storage, &second, ImportMode::Replace).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":1,"s":10}]"#);
    assert_eq!(engine.metrics().plans(), (2, 2));

    // Gone (as another node would delete it): the next run says the table is unknown, it does not read a plan.
    for object in objects(&store).await {
        store.delete(&object_store::path::Path::from(object.as_str())).await.unwrap();
    }
    let q = Query::try_from(
        &json!({"kind": "SQLQuery", "query": "SELECT count(*) AS n, sum(id) AS s FROM things"}),
    )
    .unwrap();
    let err = engine.execute(project(), &q, &Default::default(), 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::InvalidQuery(ref m) if m.contains("things")), "{err:?}");
}

#[tokio::test]
async fn a_failed_replace_leaves_the_table_and_no_objects_behind() {
    let (storage, store) = memory();
    let engine = crate::tests::engine_on(storage.clone()).await;
    let inputs = Inputs::new();
    let good = inputs.file("good.csv", "id,name\n1,a\n");
    // The second file breaks after the first is written: neither becomes visible, and both are removed.
    let broken = inputs.file("broken.csv", "id,name\n1,a,extra\n\"unterminated\n");
    import(&storage, &good, ImportMode::Replace).await.unwrap();
    let before = objects(&store).await;
    let err =
        import_files(&storage, project(), "things", &[good, broken], None, ImportMode::Replace, &|_| {})
            .await
            .unwrap_err();
    assert!(matches!(err, ImportError::Read { .. }), "{err:?}");
    assert_eq!(objects(&store).await, before);
    assert_eq!(total(&engine).await, r#"[{"n":1,"s":1}]"#);
}

#[tokio::test]
async fn a_table_written_before_versions_is_read_appended_and_replaced() {
    let (storage, store) = memory();
    let engine = crate::tests::engine_on(storage.clone()).await;
    let inputs = Inputs::new();
    let first = inputs.file("first.csv", "id,name\n1,a\n");
    // Write a versioned table, then move its file to where tables used to keep them.
    import(&storage, &first, ImportMode::Replace).await.unwrap();
    let written = objects(&store).await;
    let legacy = object_store::path::Path::from("projects/7/tables/things/part-old.parquet");
    store.copy(&object_store::path::Path::from(written[1].as_str()), &legacy).await.unwrap();
    store.delete(&object_store::path::Path::from(written[1].as_str())).await.unwrap();
    store.delete(&object_store::path::Path::from(written[0].as_str())).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":1,"s":1}]"#);

    import(&storage, &first, ImportMode::Append).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":2,"s":2}]"#);
    let second = inputs.file("second.csv", "id,name\n5,e\n");
    import(&storage, &second, ImportMode::Replace).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":1,"s":5}]"#);
    let after = objects(&store).await;
    assert_eq!(after.len(), 2, "the loose files are gone: {after:?}");
    assert!(after[1].starts_with("projects/7/tables/things/v-"), "{after:?}");
}

#[tokio::test]
async fn a_pointer_that_names_no_version_is_an_error_not_a_path() {
    let (storage, store) = memory();
    let engine = crate::tests::engine_on(storage).await;
    let pointer = object_store::path::Path::from("projects/7/tables/things/_current");
    store.put(&pointer, PutPayload::from("../../../8/tables/secret")).await.unwrap();
    let q =
        Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT count(*) AS n FROM things"})).unwrap();
    let err = engine.execute(project(), &q, &Default::default(), 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::Internal(_)), "{err:?}");
    // Only the queries that read the table fail: its pointer is read for the tables a query names.
    let q = Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT 1 AS one"})).unwrap();
    let answer = engine.execute(project(), &q, &Default::default(), 10, 0).await.unwrap();
    assert_eq!(answer.rows_json, r#"[{"one":1}]"#);
}

#[test]
fn storage_locations_are_directories_file_urls_or_s3_buckets() {
    let inputs = Inputs::new();
    let dir = inputs.0.join("data");
    let local = Storage::open(dir.to_str().unwrap()).unwrap();
    assert!(dir.is_dir(), "a missing directory is created");
    assert_eq!(local.location(), format!("file://{}", std::fs::canonicalize(&dir).unwrap().display()));
    let url = format!("file://{}", dir.display());
    assert_eq!(Storage::open(&url).unwrap().location(), local.location());
    let s3 = Storage::open("s3://bucket/some/prefix/").unwrap();
    assert_eq!(s3.location(), "s3://bucket/some/prefix");
    assert_eq!(Storage::open("s3://bucket").unwrap().location(), "s3://bucket");
    for refused in ["s3:///prefix", "gs://bucket", "http://example.com/x"] {
        assert!(matches!(Storage::open(refused), Err(StorageError::Unsupported(_))), "{refused}");
    }
}
