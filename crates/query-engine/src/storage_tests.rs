//! Tables on an object store with no directories and no rename (an in-memory store, as S3 is): Delta commits of
//! replaces and appends, failed imports, tables of earlier releases converted, and what `--storage` accepts.

use std::path::PathBuf;

use domain::QueryEngine;
use futures_util::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::json;

use super::*;
use crate::tables::imports::{import_files, ImportError, ImportMode};
use crate::tests::Asked;

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
async fn a_replace_commits_a_new_version_and_an_append_adds_to_it() {
    let (storage, store) = memory();
    let engine = crate::tests::engine_on(storage.clone()).await;
    let inputs = Inputs::new();
    let first = inputs.file("first.csv", "id,name\n1,a\n2,b\n");
    let second = inputs.file("second.csv", "id,name\n10,x\n");

    assert_eq!(import(&storage, &first, ImportMode::Replace).await.unwrap(), 2);
    let before = objects(&store).await;
    assert_eq!(before.len(), 2, "{before:?}");
    assert_eq!(before[0], "projects/7/tables/things/_delta_log/00000000000000000000.json");
    assert!(before[1].starts_with("projects/7/tables/things/part-") && before[1].ends_with(".parquet"));
    assert_eq!(total(&engine).await, r#"[{"n":2,"s":3}]"#);

    import(&storage, &second, ImportMode::Replace).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":1,"s":10}]"#);
    let after = objects(&store).await;
    assert_eq!(after.len(), 4, "the replaced file stays for older versions until a vacuum: {after:?}");

    // An append joins the newest version, and a failed append leaves it as it was.
    import(&storage, &first, ImportMode::Append).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":3,"s":13}]"#);
    let other = inputs.file("other.csv", "x\n1\n");
    let err = import(&storage, &other, ImportMode::Append).await.unwrap_err();
    assert!(matches!(err, ImportError::SchemaMismatch { .. }), "{err:?}");
    assert_eq!(objects(&store).await.len(), 6);
    let tables = engine.tables(project()).await.unwrap();
    assert_eq!((tables[0].name.as_str(), tables[0].files), ("things", 2));
    assert_eq!(tables[0].location, "memory:///projects/7/tables/things/");
}

#[tokio::test]
async fn a_run_reads_the_files_the_log_names_without_listing_or_asking_about_each() {
    let store = Arc::new(Asked::default());
    let storage = Storage::from_store(Arc::clone(&store) as Arc<dyn ObjectStore>, "memory:///");
    let engine = crate::tests::engine_on(storage.clone()).await;
    let inputs = Inputs::new();
    let rows = inputs.file("rows.csv", "id,name\n1,a\n2,b\n");
    import(&storage, &rows, ImportMode::Replace).await.unwrap();
    for _ in 0..3 {
        import(&storage, &rows, ImportMode::Append).await.unwrap();
    }
    assert_eq!(total(&engine).await, r#"[{"n":8,"s":12}]"#);
    store.take();

    // A new session and a new scan each time (a changing SQL text is never a kept plan).
    for run in 0..3 {
        let sql = format!("SELECT count(*) AS n, sum(id) + {run} AS s FROM things");
        let q = Query::try_from(&json!({"kind": "SQLQuery", "query": sql})).unwrap();
        engine.execute(project(), &q, &Default::default(), 10, 0).await.unwrap();
    }
    let (heads, listed) = store.take();
    assert_eq!(listed, Vec::<String>::new(), "nothing is listed");
    if engine.scheduler().is_none() {
        // The one question per run is whether the log has a commit after the version this node knows.
        let next = "projects/7/tables/things/_delta_log/00000000000000000004.json";
        assert_eq!(heads, vec![next; 3], "no file of the table is asked about");
    }
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

    // A new version (an append's) is planned again: the plan reads the files of the version it was made for.
    import(&storage, &first, ImportMode::Append).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":4,"s":6}]"#);
    assert_eq!(engine.metrics().plans(), (1, 2));
    assert_eq!(total(&engine).await, r#"[{"n":4,"s":6}]"#);
    assert_eq!(engine.metrics().plans(), (2, 2));

    // A replace: the next run plans against the new version.
    import(&storage, &second, ImportMode::Replace).await.unwrap();
    assert_eq!(total(&engine).await, r#"[{"n":1,"s":10}]"#);
    assert_eq!(engine.metrics().plans(), (2, 3));

    // Deleted through another node: the next run here says the table is unknown, it does not read a plan.
    let other =
        DataFusionEngine::new(Storage::from_store(Arc::clone(&store) as Arc<dyn ObjectStore>, "memory:///"));
    let things = domain::TableName::parse("things").unwrap();
    assert!(domain::TableStore::delete(&other, project(), &things).await.unwrap());
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

/// Writes a table as an earlier release kept it: `files` (Parquet of `id, name`) under `folder` of the table, and a
/// `_current` pointer with `pointer` as its text when given.
async fn legacy(store: &InMemory, folder: &str, files: &[(&str, &[i64])], pointer: Option<&str>) {
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
        datafusion::arrow::datatypes::Field::new("id", datafusion::arrow::datatypes::DataType::Int64, true),
        datafusion::arrow::datatypes::Field::new("name", datafusion::arrow::datatypes::DataType::Utf8, true),
    ]));
    for (name, ids) in files {
        let names: datafusion::arrow::array::StringArray = ids.iter().map(|_| Some("n")).collect();
        let columns: Vec<datafusion::arrow::array::ArrayRef> =
            vec![Arc::new(datafusion::arrow::array::Int64Array::from(ids.to_vec())), Arc::new(names)];
        let batch = datafusion::arrow::array::RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
        let mut bytes = Vec::new();
        let mut writer =
            datafusion::parquet::arrow::ArrowWriter::try_new(&mut bytes, Arc::clone(&schema), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let path = format!("projects/7/tables/things/{folder}{name}");
        store.put(&object_store::path::Path::from(path.as_str()), PutPayload::from(bytes)).await.unwrap();
    }
    if let Some(text) = pointer {
        let path = object_store::path::Path::from("projects/7/tables/things/_current");
        store.put(&path, PutPayload::from(text.to_owned())).await.unwrap();
    }
}

#[tokio::test]
async fn tables_of_every_earlier_layout_become_delta_tables_with_the_same_rows() {
    let version = "v-6f1c3d5e-8b5a-4a2e-9a53-5b2d1f7e9c01";
    // The first layout (loose files), a version, and a version with the full files of compactions.
    type Files<'a> = Vec<(&'a str, &'a str, &'a [i64])>;
    let layouts: Vec<(Files, Option<String>)> = vec![
        (vec![("", "part-0.parquet", &[1, 2]), ("", "part-1.parquet", &[3])], None),
        (vec![(version, "/p.parquet", &[1, 2, 3])], Some(format!("{version}\n2025-11-26T10:00:00Z\n"))),
        (
            vec![(version, "/p.parquet", &[1]), ("full", "/f-1.parquet", &[2, 3]), (version, "/old", &[])],
            Some(format!("{version}\n2025-11-26T10:00:00Z\nf-1.parquet\n")),
        ),
    ];
    for (files, pointer) in layouts {
        let (storage, store) = memory();
        for (folder, name, ids) in &files {
            if !ids.is_empty() {
                legacy(&store, folder, &[(name, ids)], None).await;
            }
        }
        // A version nothing names (a replace cut off long ago): not part of the table.
        legacy(&store, "v-00000000-0000-0000-0000-000000000000/", &[("x.parquet", &[100])], None).await;
        if let Some(text) = &pointer {
            legacy(&store, "", &[], Some(text)).await;
        }
        let engine = crate::tests::engine_on(storage.clone()).await;
        let upgraded = engine.upgrade_tables().await.unwrap();
        assert_eq!(upgraded.converted, vec!["7/things".to_owned()], "{pointer:?}");
        assert_eq!(total(&engine).await, r#"[{"n":3,"s":6}]"#, "{pointer:?}");
        let left = objects(&store).await;
        assert!(!left.iter().any(|o| o.ends_with("_current") || o.contains("v-0000")), "{left:?}");
        if pointer.is_some() {
            let things = domain::TableName::parse("things").unwrap();
            let record = domain::TableStore::get(&engine, project(), &things).await.unwrap().unwrap();
            assert_eq!(
                record.created_at.unix_timestamp(),
                1_764_151_200,
                "the table keeps its creation time"
            );
        }
        // Converted once: `migrate` again changes nothing; appends and replaces work on the Delta table.
        assert!(engine.upgrade_tables().await.unwrap().converted.is_empty());
        let inputs = Inputs::new();
        let more = inputs.file("more.csv", "id,name\n4,d\n");
        import(&storage, &more, ImportMode::Append).await.unwrap();
        assert_eq!(total(&engine).await, r#"[{"n":4,"s":10}]"#);
        import(&storage, &more, ImportMode::Replace).await.unwrap();
        assert_eq!(total(&engine).await, r#"[{"n":1,"s":4}]"#);
    }
}

#[tokio::test]
async fn two_nodes_starting_together_convert_a_table_once() {
    let version = "v-6f1c3d5e-8b5a-4a2e-9a53-5b2d1f7e9c01";
    let store = Arc::new(InMemory::new());
    legacy(&store, version, &[("/p.parquet", &[1, 2, 3])], None).await;
    legacy(&store, "", &[], Some(&format!("{version}\n2025-11-26T10:00:00Z\n"))).await;
    // Two processes: each its own storage (and kept snapshots) on the one store.
    let node = || Storage::from_store(Arc::clone(&store) as Arc<dyn ObjectStore>, "memory:///");
    let (a, b) = (crate::tests::engine_on(node()).await, crate::tests::engine_on(node()).await);
    let (first, second) = futures_util::future::join(a.upgrade_tables(), b.upgrade_tables()).await;
    let converted = [first.unwrap().converted, second.unwrap().converted].concat();
    assert_eq!(converted, vec!["7/things".to_owned()], "converted by one of them");
    assert_eq!(total(&a).await, r#"[{"n":3,"s":6}]"#);
    let log: Vec<String> = objects(&store)
        .await
        .into_iter()
        .filter(|o| o.contains("_delta_log/") && o.ends_with(".json"))
        .collect();
    assert_eq!(log.len(), 1, "one commit: {log:?}");
}

#[tokio::test]
async fn an_earlier_pointer_that_names_no_version_is_an_error_not_a_path() {
    let (storage, store) = memory();
    let engine = crate::tests::engine_on(storage).await;
    legacy(&store, "", &[], Some("../../../8/tables/secret")).await;
    let err = engine.upgrade_tables().await.unwrap_err();
    assert!(matches!(err, EngineError::Internal(_)), "{err:?}");
    // It is no table: nothing reads anything it names.
    let q =
        Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT count(*) AS n FROM things"})).unwrap();
    let err = engine.execute(project(), &q, &Default::default(), 10, 0).await.unwrap_err();
    assert!(matches!(err, EngineError::InvalidQuery(ref m) if m.contains("things")), "{err:?}");
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

/// A fold copies the earlier parts of a stored result into its new location: every part, under its own name, the
/// originals left as they are, on a bucket (copies) as on a local disk (hard links).
#[tokio::test]
async fn objects_are_copied_into_a_new_prefix_under_their_names_on_a_bucket_and_on_a_disk() {
    let parts: Vec<ObjectPath> = (0..20)
        .map(|n| ObjectPath::from(format!("projects/7/materializations/e/v1-a/part-{n}.parquet")))
        .collect();
    let to = ObjectPath::from("projects/7/materializations/e/v1-b");
    let expected: Vec<String> = {
        let mut all: Vec<String> = parts.iter().map(ToString::to_string).collect();
        all.extend((0..20).map(|n| format!("{to}/part-{n}.parquet")));
        all.sort();
        all
    };

    let (storage, store) = memory();
    for (n, part) in parts.iter().enumerate() {
        store.put(part, PutPayload::from(n.to_string())).await.unwrap();
    }
    storage.copy_into(&parts, &to).await.unwrap();
    assert_eq!(objects(&store).await, expected);
    let copied = store.get(&to.clone().join("part-13.parquet")).await.unwrap().bytes().await.unwrap();
    assert_eq!(copied.as_ref(), b"13");

    let dir = Inputs::new();
    let storage = Storage::local(&dir.0).unwrap();
    for (n, part) in parts.iter().enumerate() {
        storage.store().put(part, PutPayload::from(n.to_string())).await.unwrap();
    }
    storage.copy_into(&parts, &to).await.unwrap();
    let mut listed: Vec<String> =
        storage.store().list(None).map_ok(|meta| meta.location.to_string()).try_collect().await.unwrap();
    listed.sort();
    assert_eq!(listed, expected);
    let copied = std::fs::read(dir.0.join(to.as_ref()).join("part-13.parquet")).unwrap();
    assert_eq!(copied, b"13");
    // On a disk, a name already there fails the copy rather than passing for it.
    assert!(storage.copy_into(&parts[..1], &to).await.is_err());
}
