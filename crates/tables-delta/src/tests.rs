use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::*;

/// A storage root in a temporary directory, and the tables of as many "nodes" as asked (each keeps its own
/// snapshots, as two processes do).
struct Root {
    _dir: tempfile::TempDir,
    store: Arc<dyn ObjectStore>,
    nodes: Vec<DeltaTables>,
}

/// The wall clock, in the Delta kernel's terms: what the service's clock is outside tests.
#[derive(Debug)]
struct WallClock;

impl Clock for WallClock {
    fn current_timestamp_millis(&self) -> i64 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
        i64::try_from(now.as_millis()).expect("in range")
    }
}

fn root(nodes: usize) -> Root {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = std::fs::canonicalize(dir.path()).expect("its path");
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(&path).expect("a local store"));
    let url = Url::from_directory_path(&path).expect("its URL");
    let nodes = (0..nodes)
        .map(|_| {
            DeltaTables::new(
                Arc::clone(&store),
                Arc::new(LocalFileSystem::new()),
                url.clone(),
                Arc::new(WallClock),
            )
        })
        .collect();
    Root { _dir: dir, store, nodes }
}

fn table() -> ObjectPath {
    ObjectPath::from("projects/1/tables/events")
}

fn schema(columns: &[&str]) -> Schema {
    Schema::new(columns.iter().map(|name| Field::new(*name, DataType::Int64, true)).collect::<Vec<_>>())
}

/// Writes a Parquet file of `values` (one column per name) under the table, as the engine does.
async fn file(store: &Arc<dyn ObjectStore>, columns: &[&str], values: &[i64]) -> NewFile {
    let schema = Arc::new(schema(columns));
    let arrays = columns.iter().map(|_| Arc::new(Int64Array::from(values.to_vec())) as _).collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).expect("a batch");
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, schema, None).expect("a writer");
    writer.write(&batch).expect("written");
    writer.close().expect("closed");
    let location = table().join(format!("part-{}.parquet", uuid::Uuid::new_v4()));
    let size = bytes.len() as u64;
    store.put(&location, PutPayload::from(bytes)).await.expect("stored");
    NewFile { location, size, rows: values.len() as u64, modified_ms: WallClock.current_timestamp_millis() }
}

fn note() -> HashMap<String, serde_json::Value> {
    HashMap::new()
}

#[tokio::test]
async fn a_replace_creates_the_table_and_appends_add_to_it_as_commits() {
    let root = root(1);
    let tables = &root.nodes[0];
    assert!(tables.snapshot(&table()).await.expect("read").is_none());
    let first = file(&root.store, &["a"], &[1, 2, 3]).await;
    let (version, created) = tables
        .replace(&table(), &schema(&["a"]), std::slice::from_ref(&first), &HashMap::new(), None)
        .await
        .expect("created");
    assert_eq!((version, created), (0, true));
    let second = file(&root.store, &["a"], &[4]).await;
    assert_eq!(
        tables.append(&table(), 0, std::slice::from_ref(&second), note(), &[]).await.expect("appended"),
        1
    );

    let snapshot = tables.snapshot(&table()).await.expect("read").expect("a table");
    assert_eq!(snapshot.version, 1);
    assert_eq!(snapshot.rows(), Some(4));
    let mut locations: Vec<_> = snapshot.files.iter().map(|f| f.location.clone()).collect();
    locations.sort();
    let mut expected = vec![first.location, second.location];
    expected.sort();
    assert_eq!(locations, expected);
    assert_eq!(snapshot.schema.as_ref(), &schema(&["a"]));

    let commits = tables.commits(&table(), snapshot.version + 1, 10).await.expect("history");
    assert_eq!(commits.iter().map(|c| c.version).collect::<Vec<_>>(), vec![1, 0]);
    assert_eq!(commits[0].rows_added, Some(1));
    assert_eq!(commits[1].rows_added, Some(3));
    assert_eq!(commits[0].operation, "WRITE");
    // The log is a Delta log any reader finds.
    let log = root.store.head(&table().join("_delta_log").join("00000000000000000001.json")).await;
    assert!(log.is_ok());
}

#[tokio::test]
async fn concurrent_appends_of_two_nodes_all_land_exactly_once() {
    let root = root(3);
    let first = file(&root.store, &["a"], &[0]).await;
    root.nodes[0].replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    let mut files = Vec::new();
    for i in 1..=40 {
        files.push(file(&root.store, &["a"], &[i]).await);
    }
    let appends = files.iter().enumerate().map(|(i, f)| {
        let tables = &root.nodes[i % 2];
        async move { tables.append(&table(), 0, std::slice::from_ref(f), note(), &[]).await }
    });
    let versions = futures_util::future::join_all(appends).await;
    let mut versions: Vec<u64> = versions.into_iter().map(|v| v.expect("appended")).collect();
    versions.sort_unstable();
    assert_eq!(versions, (1..=40).collect::<Vec<u64>>(), "each append is a commit of its own");
    // Each node followed the other's commits one by one; a third reads the log afresh: the same files.
    let fresh = root.nodes[2].snapshot(&table()).await.expect("read").expect("a table");
    let mut expected: Vec<_> = fresh.files.iter().map(|f| (f.location.clone(), f.rows)).collect();
    expected.sort();
    assert_eq!((fresh.version, expected.len()), (40, 41));
    for node in &root.nodes[..2] {
        let snapshot = node.snapshot(&table()).await.expect("read").expect("a table");
        assert_eq!(snapshot.version, 40);
        assert_eq!(snapshot.rows(), Some(41));
        let mut files: Vec<_> = snapshot.files.iter().map(|f| (f.location.clone(), f.rows)).collect();
        files.sort();
        assert_eq!(files, expected);
    }
}

/// The version `node` reads of the table.
async fn version_read(node: &DeltaTables) -> u64 {
    node.snapshot(&table()).await.expect("read").expect("a table").version
}

#[tokio::test]
async fn a_node_that_hears_every_write_reads_its_kept_version_until_a_write_is_announced() {
    let root = root(2);
    let (writer, reader) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[0]).await;
    writer.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    let append = || async {
        let rows = file(&root.store, &["a"], &[1]).await;
        writer.append(&table(), 0, &[rows], note(), &[]).await.expect("appended")
    };
    // Not hearing: each read asks the log, and sees a commit at once.
    assert_eq!(version_read(reader).await, 0);
    append().await;
    assert_eq!(version_read(reader).await, 1);

    // Hearing: the version checked since is read as it is; the log is not asked (it holds version 2 now).
    reader.hearing(true);
    assert_eq!(version_read(reader).await, 1);
    append().await;
    assert_eq!(version_read(reader).await, 1, "a write not announced is not looked for");
    // Unless the log is asked whatever was heard (a writer may have stopped before announcing its commit).
    let checked = reader.checked_snapshot(&table()).await.expect("read").expect("a table");
    assert_eq!(checked.version, 2);
    assert_eq!(version_read(reader).await, 2, "the version checked is the one kept");
    // The write announced: the next read asks the log.
    reader.written(&table());
    assert_eq!(version_read(reader).await, 2);
    append().await;
    assert_eq!(version_read(reader).await, 2);

    // Announcements may have been missed (the channel dropped): every read asks the log, and a check made
    // then (the read of version 4) is not relied on once they are heard again: a writer may have answered
    // without waiting for this process meanwhile.
    reader.hearing(false);
    assert_eq!(version_read(reader).await, 3);
    append().await;
    assert_eq!(version_read(reader).await, 4);
    reader.hearing(true);
    append().await;
    assert_eq!(version_read(reader).await, 5);
    append().await;
    assert_eq!(version_read(reader).await, 5);

    // Hearing goes stale without news each second (a stalled channel): the log is asked.
    reader.hearing.until.store(1, Ordering::Release);
    assert_eq!(version_read(reader).await, 6);
    reader.hearing(true);
    append().await;
    assert_eq!(version_read(reader).await, 6);
    // A version checked longer ago than it is trusted for is checked again (a lost announcement's bound).
    let kept = reader.kept(&table());
    kept.snapshot.lock().unwrap().as_mut().expect("kept").at = Instant::now() - TRUST_FOR;
    assert_eq!(version_read(reader).await, 7);
    // Each read counted by how it found its version.
    assert_eq!(reader.reads(), (5, 10));

    // The writer's own commit is the newest it knows, until its own announcement comes back.
    writer.hearing(true);
    assert_eq!(version_read(writer).await, 7);
    let rows = file(&root.store, &["a"], &[1]).await;
    reader.append(&table(), 0, &[rows], note(), &[]).await.expect("appended by the other node");
    assert_eq!(version_read(writer).await, 7);
    writer.written(&table());
    assert_eq!(version_read(writer).await, 8);
}

#[tokio::test]
async fn a_replace_removes_what_another_node_appended_after_it_read_the_table() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[1]).await;
    a.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    // Node a knows version 0; node b appends behind its back.
    assert_eq!(a.snapshot(&table()).await.expect("read").expect("table").version, 0);
    let appended = file(&root.store, &["a"], &[2]).await;
    b.append(&table(), 0, &[appended], note(), &[]).await.expect("appended");
    let replacing = file(&root.store, &["a"], &[7, 8]).await;
    let (_, created) = a
        .replace(&table(), &schema(&["a"]), std::slice::from_ref(&replacing), &HashMap::new(), None)
        .await
        .expect("replaced");
    assert!(!created);
    for node in [a, b] {
        let snapshot = node.snapshot(&table()).await.expect("read").expect("table");
        assert_eq!(
            snapshot.files.iter().map(|f| f.location.clone()).collect::<Vec<_>>(),
            vec![replacing.location.clone()]
        );
    }
    let commits = b.commits(&table(), 3, 1).await.expect("history");
    assert_eq!(commits[0].rows_removed, Some(2));
}

#[tokio::test]
async fn of_two_appends_claiming_one_name_after_a_version_only_the_first_commits() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    a.replace(&table(), &schema(&["a"]), &[file(&root.store, &["a"], &[1]).await], &HashMap::new(), None)
        .await
        .expect("created");
    let claim = |name: &str, after| Claim { name: name.into(), after };
    // Node b keeps version 0 and trusts it (it hears every write): its next commit is put on top of version 0
    // and finds version 1 taken, so the claim is checked among the commits it follows.
    b.hearing(true);
    assert_eq!(b.snapshot(&table()).await.expect("read").expect("a table").version, 0);
    let first = file(&root.store, &["a"], &[2]).await;
    a.append(&table(), 0, &[first], note(), &[claim("key-1", 0), claim("key-2", 0)]).await.expect("appended");
    let late = file(&root.store, &["a"], &[3]).await;
    let refused = b.append(&table(), 0, std::slice::from_ref(&late), note(), &[claim("key-2", 0)]).await;
    assert!(
        matches!(&refused, Err(CommitError::Claimed { names, .. }) if names == &["key-2".to_owned()]),
        "{refused:?}"
    );
    // The same when the commit that claimed the name is already in the snapshot the commit is made on.
    let refused = a.append(&table(), 1, std::slice::from_ref(&late), note(), &[claim("key-1", 0)]).await;
    assert!(matches!(&refused, Err(CommitError::Claimed { .. })), "{refused:?}");
    // A name claimed after that commit (used again later), and other names, commit.
    b.append(&table(), 1, std::slice::from_ref(&late), note(), &[claim("key-1", 1), claim("key-3", 0)])
        .await
        .expect("appended");
    let snapshot = a.checked_snapshot(&table()).await.expect("read").expect("a table");
    assert_eq!((snapshot.version, snapshot.rows()), (2, Some(3)), "the refused appends added nothing");
    // Claims are the commit's application metadata.
    let actions = a.actions(&table(), 2).await.expect("read").expect("a commit");
    assert_eq!(claimed_in(&actions), ["key-1", "key-3"]);
}

#[tokio::test]
async fn an_append_overtaken_by_a_replace_with_other_columns_is_refused() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[1]).await;
    a.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    let read = b.snapshot(&table()).await.expect("read").expect("a table").version;
    let other = file(&root.store, &["b"], &[1]).await;
    a.replace(&table(), &schema(&["b"]), &[other], &HashMap::new(), None).await.expect("replaced");
    // b still keeps version 0 with column a, but its append's commit sees the new columns.
    let late = file(&root.store, &["a"], &[5]).await;
    let refused = b.append(&table(), read, &[late], note(), &[]).await;
    assert!(matches!(refused, Err(CommitError::Replaced(_))), "{refused:?}");
    let snapshot = b.snapshot(&table()).await.expect("read").expect("table");
    assert_eq!(snapshot.schema.as_ref(), &schema(&["b"]));
    assert_eq!(snapshot.rows(), Some(1));
}

#[tokio::test]
async fn a_compaction_keeps_concurrent_appends_and_yields_to_a_replace() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[1]).await;
    a.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    a.append(&table(), 0, &[file(&root.store, &["a"], &[2]).await], note(), &[]).await.expect("appended");
    let read = a.snapshot(&table()).await.expect("read").expect("table");
    // Node b appends while a merges what it read.
    let late = file(&root.store, &["a"], &[3]).await;
    b.append(&table(), read.version, std::slice::from_ref(&late), note(), &[]).await.expect("appended");
    let merged = file(&root.store, &["a"], &[1, 2]).await;
    let version = a.rewrite(&table(), &read.files, std::slice::from_ref(&merged)).await.expect("compacted");
    let snapshot = b.snapshot(&table()).await.expect("read").expect("table");
    assert_eq!(snapshot.version, version);
    let mut locations: Vec<_> = snapshot.files.iter().map(|f| f.location.clone()).collect();
    locations.sort();
    let mut expected = vec![merged.location, late.location];
    expected.sort();
    assert_eq!(locations, expected);
    assert_eq!(snapshot.rows(), Some(3));
    // A compaction is no change of the data: a fold after it sees only the append.
    match a.changes_since(&table(), read.version, version).await.expect("changes") {
        Changes::Appended(files) => {
            assert_eq!(files.iter().map(|f| f.rows).collect::<Vec<_>>(), vec![Some(1)])
        }
        Changes::Rewritten => panic!("a compaction and an append are no rewrite"),
    }

    // A compaction of files a replace took away changes nothing.
    let read = a.snapshot(&table()).await.expect("read").expect("table");
    b.replace(&table(), &schema(&["a"]), &[file(&root.store, &["a"], &[9]).await], &HashMap::new(), None)
        .await
        .expect("replaced");
    let merged = file(&root.store, &["a"], &[1, 2, 3]).await;
    let refused = a.rewrite(&table(), &read.files, &[merged]).await;
    assert!(matches!(refused, Err(CommitError::Conflict(_))), "{refused:?}");
    assert_eq!(a.snapshot(&table()).await.expect("read").expect("table").rows(), Some(1));
    let now = a.snapshot(&table()).await.expect("read").expect("table").version;
    assert_eq!(a.changes_since(&table(), read.version, now).await.expect("changes"), Changes::Rewritten);
}

#[tokio::test]
async fn the_changes_since_a_version_are_its_appends_in_commit_order_over_many_commits() {
    // Node b asks: it made none of the commits, so it reads them from the log.
    let root = root(2);
    let (tables, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[0]).await;
    tables.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    // More commits than are read at once, each appending one file of its own number of rows.
    let mut version = 0;
    for n in 1..=20_i64 {
        let rows: Vec<i64> = (0..n).collect();
        version = tables
            .append(&table(), version, &[file(&root.store, &["a"], &rows).await], note(), &[])
            .await
            .expect("appended");
    }
    let Changes::Appended(files) = b.changes_since(&table(), 0, version).await.expect("changes") else {
        panic!("only appends");
    };
    let rows: Vec<Option<u64>> = files.iter().map(|f| f.rows).collect();
    assert_eq!(rows, (1..=20).map(Some).collect::<Vec<_>>(), "every appended file once, in commit order");
    // From a later version, only what came after it.
    let Changes::Appended(last) = b.changes_since(&table(), version - 2, version).await.expect("changes")
    else {
        panic!("only appends");
    };
    assert_eq!(last.iter().map(|f| f.rows).collect::<Vec<_>>(), [Some(19), Some(20)]);
    // A replace among the commits since is a rewrite, wherever it stands among them.
    let (replaced, _) = tables
        .replace(&table(), &schema(&["a"]), &[file(&root.store, &["a"], &[7]).await], &HashMap::new(), None)
        .await
        .expect("replaced");
    let after =
        tables.append(&table(), replaced, &[file(&root.store, &["a"], &[8]).await], note(), &[]).await;
    let after = after.expect("appended");
    assert_eq!(b.changes_since(&table(), 0, after).await.expect("changes"), Changes::Rewritten);
}

/// The rows of each file appended since `version`, as `tables` tells them.
async fn appended_rows(
    tables: &DeltaTables,
    version: u64,
    until: u64,
) -> Result<Vec<Option<u64>>, CommitError> {
    match tables.changes_since(&table(), version, until).await? {
        Changes::Appended(files) => Ok(files.iter().map(|f| f.rows).collect()),
        Changes::Rewritten => panic!("only appends since {version}"),
    }
}

#[tokio::test]
async fn a_process_tells_what_was_appended_from_the_commits_it_made_or_followed_without_reading_them_again() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[0]).await;
    a.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    // Three appends of node a, then three of node b, which a follows when it reads the table next.
    let mut version = 0;
    for (n, node) in (1..=6_i64).zip([a, a, a, b, b, b]) {
        let rows: Vec<i64> = (0..n).collect();
        let new = [file(&root.store, &["a"], &rows).await];
        version = node.append(&table(), version, &new, note(), &[]).await.expect("appended");
    }
    assert_eq!(a.snapshot(&table()).await.expect("read").expect("table").version, version);
    // Their commits gone from the log, node a still tells them, in order, from any version among them.
    for at in 1..=version {
        let entry = table().join("_delta_log").join(format!("{at:020}.json"));
        root.store.delete(&entry).await.expect("removed");
    }
    let all: Vec<Option<u64>> = (1..=6).map(Some).collect();
    assert_eq!(appended_rows(a, 0, version).await.expect("from memory"), all);
    assert_eq!(appended_rows(a, 4, version).await.expect("from memory"), [Some(5), Some(6)]);
    assert_eq!(appended_rows(a, version, version).await.expect("from memory"), []);
    // Node b read the table whole before its appends: it knows only its own, and asks the log for the rest.
    assert_eq!(appended_rows(b, 3, version).await.expect("from memory"), [Some(4), Some(5), Some(6)]);
    assert!(appended_rows(b, 2, version).await.is_err(), "commit 3 was read from the log, which lost it");

    // A replace is not told step by step: what spans it is read from the log (here, lost too).
    let root = self::root(1);
    let a = &root.nodes[0];
    let (mut version, mut replaced) = (0, 0);
    let first = [file(&root.store, &["a"], &[0]).await];
    a.replace(&table(), &schema(&["a"]), &first, &HashMap::new(), None).await.expect("created");
    for step in 1..=4 {
        let new = [file(&root.store, &["a"], &[step, step]).await];
        version = if step == 3 {
            replaced =
                a.replace(&table(), &schema(&["a"]), &new, &HashMap::new(), None).await.expect("replaced").0;
            replaced
        } else {
            a.append(&table(), version, &new, note(), &[]).await.expect("appended")
        };
    }
    for at in 1..=version {
        root.store.delete(&table().join("_delta_log").join(format!("{at:020}.json"))).await.expect("removed");
    }
    assert_eq!(appended_rows(a, replaced, version).await.expect("from memory"), [Some(2)]);
    assert!(appended_rows(a, 1, version).await.is_err(), "the replace's commit is read from the log");
}

#[test]
fn a_process_keeps_an_unbroken_run_of_its_newest_commits() {
    let mut recent = changes::Recent::default();
    let total = changes::KEPT_COMMITS as u64 + 44;
    for version in 1..=total {
        recent.made(&table(), version, &[]);
    }
    assert_eq!(recent.since(total - 256, total), Some(Changes::Appended(Vec::new())));
    assert_eq!(recent.since(total - 257, total), None, "older commits are let go");
    // A commit after a gap starts the run again; one told twice is kept once.
    recent.made(&table(), total + 2, &[]);
    recent.made(&table(), total + 2, &[]);
    assert_eq!(recent.since(total, total + 2), None);
    assert_eq!(recent.since(total + 1, total + 2), Some(Changes::Appended(Vec::new())));
    recent.forget();
    assert_eq!(recent.since(total + 1, total + 2), None);
}

#[tokio::test]
async fn a_table_is_read_as_of_a_time_and_not_before_its_first_version() {
    let root = root(1);
    let tables = &root.nodes[0];
    let first = file(&root.store, &["a"], &[1]).await;
    tables.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    let v0 = tables.snapshot(&table()).await.expect("read").expect("table");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    tables
        .append(&table(), 0, &[file(&root.store, &["a"], &[2]).await], note(), &[])
        .await
        .expect("appended");
    let v1 = tables.snapshot(&table()).await.expect("read").expect("table");
    assert!(v1.committed_ms > v0.committed_ms);

    let then = tables.snapshot_at(&table(), v0.committed_ms).await.expect("read").expect("version 0");
    assert_eq!((then.version, then.rows()), (0, Some(1)));
    let now = tables.snapshot_at(&table(), v1.committed_ms + 1).await.expect("read").expect("version 1");
    assert_eq!((now.version, now.rows()), (1, Some(2)));
    assert!(tables.snapshot_at(&table(), v0.committed_ms - 1).await.expect("read").is_none());

    // By number, as a cursor pins it: a version the log does not have is said to be gone, not a storage failure.
    assert_eq!(tables.snapshot_of_version(&table(), 0).await.expect("version 0").rows(), Some(1));
    let missing = tables.snapshot_of_version(&table(), 7).await.unwrap_err();
    assert!(matches!(missing, CommitError::NoVersion { version: 7, .. }), "{missing:?}");
}

#[tokio::test]
async fn files_in_folders_of_an_earlier_layout_become_a_table_in_place() {
    let root = root(1);
    let tables = &root.nodes[0];
    let mut kept = file(&root.store, &["a"], &[1, 2]).await;
    let moved = table().join("v-00000000-0000-0000-0000-000000000001").join("part-0.parquet");
    root.store.rename(&kept.location, &moved).await.expect("moved");
    kept.location = moved;
    let created = Some(1_700_000_000_000);
    tables
        .replace(&table(), &schema(&["a"]), std::slice::from_ref(&kept), &HashMap::new(), created)
        .await
        .expect("converted");
    let snapshot = tables.snapshot(&table()).await.expect("read").expect("table");
    assert_eq!(snapshot.files.iter().map(|f| f.location.clone()).collect::<Vec<_>>(), vec![kept.location]);
    assert_eq!(snapshot.created_ms, created);
}

#[tokio::test]
async fn a_vacuum_removes_only_files_no_version_reads() {
    let root = root(1);
    let tables = &root.nodes[0];
    let old = file(&root.store, &["a"], &[1]).await;
    tables
        .replace(&table(), &schema(&["a"]), std::slice::from_ref(&old), &HashMap::new(), None)
        .await
        .expect("created");
    let new = file(&root.store, &["a"], &[2]).await;
    tables
        .replace(&table(), &schema(&["a"]), std::slice::from_ref(&new), &HashMap::new(), None)
        .await
        .expect("replaced");
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(tables.vacuum(&table(), hour).await.expect("vacuumed"), 0);
    // An hour and a minute later by the owner's clock, the replaced file is past the retention.
    #[derive(Debug)]
    struct Later(i64);
    impl Clock for Later {
        fn current_timestamp_millis(&self) -> i64 {
            self.0
        }
    }
    let later = tables.timed_by(Arc::new(Later(WallClock.current_timestamp_millis() + 3_660_000)));
    assert_eq!(later.vacuum(&table(), hour).await.expect("vacuumed"), 1);
    assert!(root.store.head(&old.location).await.is_err());
    assert!(root.store.head(&new.location).await.is_ok());
}

#[tokio::test]
async fn timestamps_without_a_time_zone_bring_their_table_feature() {
    use datafusion::arrow::datatypes::TimeUnit;
    let root = root(1);
    let tables = &root.nodes[0];
    let first = file(&root.store, &["a"], &[1]).await;
    tables.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    let naive = Schema::new(vec![Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true)]);
    tables.replace(&table(), &naive, &[], &HashMap::new(), None).await.expect("replaced");
    let snapshot = tables.snapshot(&table()).await.expect("read").expect("table");
    assert_eq!(snapshot.schema.as_ref(), &naive);
    let log =
        root.store.get(&table().join("_delta_log").join("00000000000000000001.json")).await.expect("log");
    let text = String::from_utf8(log.bytes().await.expect("read").to_vec()).expect("text");
    assert!(text.contains("\"readerFeatures\":[\"timestampNtz\"]"), "{text}");
}

#[tokio::test]
async fn properties_of_a_version_are_kept_until_a_replace_sets_others() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[1]).await;
    a.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), Some(1_000)).await.expect("created");
    let marked = HashMap::from([("endpoints.deleted".to_owned(), "true".to_owned())]);
    a.replace(&table(), &schema(&["a"]), &[], &marked, None).await.expect("marked");
    let seen = b.snapshot(&table()).await.expect("read").expect("table");
    assert_eq!((seen.properties.clone(), seen.files.len(), seen.created_ms), (marked, 0, Some(1_000)));
    let again = file(&root.store, &["a"], &[2]).await;
    a.replace(&table(), &schema(&["a"]), &[again], &HashMap::new(), Some(2_000))
        .await
        .expect("written again");
    let seen = b.snapshot(&table()).await.expect("read").expect("table");
    assert!(seen.properties.is_empty());
    assert_eq!((seen.rows(), seen.created_ms), (Some(1), Some(2_000)));
}

#[tokio::test]
async fn commits_are_checkpointed_so_another_process_opens_the_table_from_the_checkpoint() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[0]).await;
    a.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    for i in 1..=120_u64 {
        let appended = file(&root.store, &["a"], &[i64::try_from(i).expect("small")]).await;
        a.append(&table(), i - 1, &[appended], note(), &[]).await.expect("appended");
    }
    let log = table().join("_delta_log");
    // Delta checkpoints every 100 commits: the state after the 100th commit (version 99).
    // It is written in the background, after the commit returned.
    let checkpoint = log.clone().join("00000000000000000099.checkpoint.parquet");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while root.store.head(&log.clone().join("_last_checkpoint")).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint was written");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(root.store.head(&checkpoint).await.is_ok(), "a checkpoint at version 99");
    assert!(root.store.head(&log.clone().join("_last_checkpoint")).await.is_ok());
    // The commits before the checkpoint are not needed to open the table: without them it opens the same.
    for version in 0..99_u64 {
        root.store.delete(&log.clone().join(format!("{version:020}.json"))).await.expect("removed");
    }
    let opened = b.snapshot(&table()).await.expect("read").expect("a table");
    assert_eq!((opened.version, opened.rows(), opened.files.len()), (120, Some(121), 121));
}

#[tokio::test]
async fn the_newest_version_is_found_from_any_version_before_it_even_past_a_clean_up() {
    let root = root(1);
    let tables = &root.nodes[0];
    let first = file(&root.store, &["a"], &[0]).await;
    tables.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    for i in 1..=37_u64 {
        let appended = file(&root.store, &["a"], &[i64::try_from(i).expect("small")]).await;
        tables.append(&table(), i - 1, &[appended], note(), &[]).await.expect("appended");
    }
    let log = tables.log_store(&table());
    for start in 0..=37 {
        assert_eq!(log.get_latest_version(start).await.expect("found"), 37, "from version {start}");
    }
    // From a version a clean-up removed, the log is listed as delta-rs does (which refuses a version it no
    // longer has): the version before a gap is never taken for the newest.
    for version in 0..10_u64 {
        let entry = table().join("_delta_log").join(format!("{version:020}.json"));
        root.store.delete(&entry).await.expect("removed");
    }
    assert!(log.get_latest_version(3).await.is_err());
    assert_eq!(log.get_latest_version(10).await.expect("found"), 37);
}

#[tokio::test]
async fn columns_a_delta_table_cannot_have_are_refused_saying_which() {
    let root = root(1);
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("amount", DataType::Decimal256(40, 2), true),
    ]);
    let refused = root.nodes[0].replace(&table(), &schema, &[], &HashMap::new(), None).await;
    match refused {
        Err(CommitError::Columns { reason, .. }) => {
            assert!(reason.contains("Decimal256(40, 2)"), "{reason}");
            assert!(!reason.contains('\n'), "one line, no backtrace: {reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(root.nodes[0].snapshot(&table()).await.expect("read").is_none(), "nothing was committed");
}

#[tokio::test]
async fn a_process_keeps_a_bounded_number_of_tables_it_does_not_use() {
    let root = root(1);
    let tables = &root.nodes[0];
    let first = file(&root.store, &["a"], &[1]).await;
    tables.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    for i in 0..KEPT_TABLES + 100 {
        let missing = ObjectPath::from(format!("projects/2/tables/t{i}"));
        assert!(tables.snapshot(&missing).await.expect("read").is_none());
    }
    let kept = tables.kept.lock().expect("not poisoned");
    assert!(kept.len() <= KEPT_TABLES, "{} tables kept", kept.len());
    assert!(kept.contains_key(&table()), "a table read within the hour is kept");
}

#[tokio::test]
async fn a_node_far_behind_another_reads_the_log_instead_of_following_each_commit() {
    let root = root(2);
    let (a, b) = (&root.nodes[0], &root.nodes[1]);
    let first = file(&root.store, &["a"], &[0]).await;
    a.replace(&table(), &schema(&["a"]), &[first], &HashMap::new(), None).await.expect("created");
    assert_eq!(b.snapshot(&table()).await.expect("read").expect("table").version, 0);
    let far = CHECKPOINT_INTERVAL + 20;
    for i in 1..=far {
        let appended = file(&root.store, &["a"], &[i64::try_from(i).expect("small")]).await;
        a.append(&table(), i - 1, &[appended], note(), &[]).await.expect("appended");
    }
    let seen = b.snapshot(&table()).await.expect("read").expect("table");
    assert_eq!((seen.version, seen.rows(), seen.files.len()), (far, Some(far + 1), 121));
    // And b's own append lands after them.
    let last = file(&root.store, &["a"], &[7]).await;
    assert_eq!(b.append(&table(), far, &[last], note(), &[]).await.expect("appended"), far + 1);
}
