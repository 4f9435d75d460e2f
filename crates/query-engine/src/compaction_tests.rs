//! Compaction on a real storage: small files merged with every row kept once by an `OPTIMIZE` commit, appends of
//! other processes during compactions all landing, and a compaction cut off before its commit changing nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use domain::{KeptTables, ProjectId, QueryEngine, TableFormat, TableName, TableStore, Upload, WriteMode};
use futures_util::stream;
use object_store::ObjectStoreExt;
use serde_json::{json, Value};

use crate::tables::compaction::MIN_SMALL_FILES;
use crate::tables::imports::{append_held, HeldBody, Keyed, StagedError};
use crate::tests::temp_dir;
use crate::{DataFusionEngine, Storage};

fn project() -> ProjectId {
    ProjectId::new(1).unwrap()
}

fn events() -> TableName {
    TableName::parse("events").unwrap()
}

fn upload(mode: WriteMode, body: String) -> Upload {
    let chunks = vec![Ok::<_, std::io::Error>(Bytes::from(body))];
    Upload {
        format: TableFormat::Csv,
        mode,
        body: Box::pin(stream::iter(chunks)),
        limit_bytes: 1 << 20,
        tag: None,
        quarantine: false,
    }
}

/// `count` rows with ids from `first`, as CSV.
fn ids(first: u64, count: u64) -> String {
    let mut body = String::from("id,kind\n");
    for id in first..first + count {
        body.push_str(&format!("{id},k{}\n", id % 3));
    }
    body
}

async fn counts(engine: &DataFusionEngine) -> (u64, u64) {
    counts_at(engine, &domain::ReadAt::Newest).await.0
}

/// The rows and distinct ids of `events` as read `at` the versions given, and the versions it read.
async fn counts_at(
    engine: &DataFusionEngine,
    at: &domain::ReadAt,
) -> ((u64, u64), Vec<domain::TableVersion>) {
    let query = domain::Query::try_from(
        &json!({"kind": "SQLQuery", "query": "SELECT count(*) AS n, count(DISTINCT id) AS d FROM events"}),
    )
    .unwrap();
    let result = engine.execute_at(project(), &query, &BTreeMap::new(), 10, 0, at).await.unwrap();
    let rows: Value = serde_json::from_str(&result.rows_json).unwrap();
    ((rows[0]["n"].as_u64().unwrap(), rows[0]["d"].as_u64().unwrap()), result.read)
}

fn table_dir(dir: &Path) -> PathBuf {
    dir.join("projects/1/tables/events")
}

/// The files of the table's newest version, as its Delta log says.
async fn files_of(engine: &DataFusionEngine) -> Vec<String> {
    let prefix = object_store::path::Path::from("projects/1/tables/events");
    let snapshot = engine.storage().tables().snapshot(&prefix).await.unwrap().expect("a table");
    let mut names: Vec<String> =
        snapshot.files.iter().map(|f| f.location.filename().unwrap().to_owned()).collect();
    names.sort();
    names
}

fn parquet_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|f| f.path().extension().is_some_and(|ext| ext == "parquet"))
        .count()
}

/// The operations of the table's commits, newest first.
async fn operations(engine: &DataFusionEngine) -> Vec<String> {
    let prefix = object_store::path::Path::from("projects/1/tables/events");
    let tables = engine.storage().tables();
    let newest = tables.snapshot(&prefix).await.unwrap().expect("a table").version;
    let commits = tables.commits(&prefix, newest + 1, 100).await.unwrap();
    commits.into_iter().map(|c| c.operation).collect()
}

/// Two engines on one storage: two processes, each with its own locks and its own appends.
/// What a compaction keeps findable as the domain reads it: the newest version first, then `pending`.
async fn keeping(engine: &DataFusionEngine, pending: Vec<uuid::Uuid>) -> domain::Findable {
    let after = engine.newest_version(project(), &events()).await.unwrap().expect("a table");
    domain::Findable { pending, after }
}

fn two_nodes() -> (Arc<DataFusionEngine>, Arc<DataFusionEngine>, crate::tests::TempDir) {
    let dir = temp_dir("qe-compaction");
    let a = DataFusionEngine::new(Storage::local(&dir).unwrap());
    let b = DataFusionEngine::new(Storage::local(&dir).unwrap());
    (Arc::new(a), Arc::new(b), dir)
}

#[tokio::test]
async fn small_files_are_merged_into_one_and_every_row_is_kept_once() {
    let (engine, _, dir) = two_nodes();
    engine.write(project(), &events(), upload(WriteMode::Replace, ids(0, 5))).await.unwrap();
    assert_eq!(engine.appended(), vec![], "a replace is no candidate");
    assert!(
        engine
            .compact(project(), &events(), keeping(&engine, Vec::new()).await, Vec::new())
            .await
            .unwrap()
            .is_none(),
        "one file: nothing to do"
    );
    for i in 1..20 {
        engine.write(project(), &events(), upload(WriteMode::Append, ids(i * 5, 5))).await.unwrap();
    }
    assert_eq!(engine.appended(), vec![(project(), events())]);
    let before = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!((before.files, before.row_count, before.last_compacted_at), (Some(20), Some(100), None));
    // A cursor's snapshot: the version of the 20 small files.
    let (_, pinned) = counts_at(&engine, &domain::ReadAt::Newest).await;

    let done = engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, Vec::new())
        .await
        .unwrap()
        .expect("20 small files are compacted");
    assert_eq!((done.files_before, done.files_merged, done.files_after, done.rows_merged), (20, 20, 1, 100));
    assert_eq!(engine.appended(), vec![], "compacted: no longer a candidate");
    assert_eq!(files_of(&engine).await.len(), 1);
    assert!(files_of(&engine).await[0].starts_with("compacted-"));
    assert_eq!(operations(&engine).await[0], "OPTIMIZE");
    let after = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!((after.files, after.row_count, after.columns), (Some(1), Some(100), before.columns));
    assert!(after.last_compacted_at.is_some());
    assert_eq!(after.created_at, before.created_at, "the table keeps its creation time");
    assert_eq!(counts(&engine).await, (100, 100));
    // The merged small files stay for runs (and readers of older versions) until a vacuum past the retention:
    // the pinned snapshot reads them, exactly its rows, after the compaction and after appends.
    assert_eq!(parquet_in(&table_dir(&dir)), 21);
    let at_pin = domain::ReadAt::Pinned(pinned.clone());
    assert_eq!(counts_at(&engine, &at_pin).await, ((100, 100), pinned.clone()));

    // Appends go on into the new version; a few more small files are not worth a compaction yet.
    for i in 20..20 + MIN_SMALL_FILES as u64 - 2 {
        engine.write(project(), &events(), upload(WriteMode::Append, ids(i * 5, 5))).await.unwrap();
    }
    assert!(engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, Vec::new())
        .await
        .unwrap()
        .is_none());
    assert_eq!(counts(&engine).await, (130, 130));
    assert_eq!(counts_at(&engine, &at_pin).await.0, (100, 100), "the pinned snapshot, still");
    // A replace takes the table whatever compactions did.
    engine.write(project(), &events(), upload(WriteMode::Replace, ids(0, 2))).await.unwrap();
    assert_eq!(counts(&engine).await, (2, 2));
    assert_eq!(files_of(&engine).await.len(), 1);
    assert_eq!(&operations(&engine).await[..2], ["WRITE", "WRITE"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_of_two_processes_during_compactions_all_land_once_and_runs_never_see_a_row_twice() {
    let (a, b, dir) = two_nodes();
    a.write(project(), &events(), upload(WriteMode::Replace, ids(0, 1))).await.unwrap();
    let acknowledged = Arc::new(AtomicU64::new(1));
    let next_id = Arc::new(AtomicU64::new(1));
    // Sixteen writers, half through each process, each appending 25 bodies of 3 rows.
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let engine = if w % 2 == 0 { Arc::clone(&a) } else { Arc::clone(&b) };
            let (acknowledged, next_id) = (Arc::clone(&acknowledged), Arc::clone(&next_id));
            tokio::spawn(async move {
                for _ in 0..25 {
                    let first = next_id.fetch_add(3, Ordering::SeqCst);
                    engine
                        .write(project(), &events(), upload(WriteMode::Append, ids(first, 3)))
                        .await
                        .unwrap();
                    acknowledged.fetch_add(3, Ordering::SeqCst);
                }
            })
        })
        .collect();
    // Meanwhile each process compacts again and again (one at a time: the table's lease), and runs count: no
    // row twice, no acknowledged row missing.
    let lease = Arc::new(tokio::sync::Mutex::new(()));
    let compactors: Vec<_> = [Arc::clone(&a), Arc::clone(&b)]
        .into_iter()
        .map(|engine| {
            let lease = Arc::clone(&lease);
            tokio::spawn(async move {
                let mut compacted = 0;
                for _ in 0..40 {
                    let _leased = lease.lock().await;
                    if engine
                        .compact(project(), &events(), keeping(&engine, Vec::new()).await, Vec::new())
                        .await
                        .unwrap()
                        .is_some()
                    {
                        compacted += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                compacted
            })
        })
        .collect();
    let reader = {
        let (a, acknowledged) = (Arc::clone(&a), Arc::clone(&acknowledged));
        tokio::spawn(async move {
            for _ in 0..40 {
                let at_least = acknowledged.load(Ordering::SeqCst);
                let (n, distinct) = counts(&a).await;
                assert_eq!(n, distinct, "a run saw a row twice");
                assert!(n >= at_least, "a run missed acknowledged rows: {n} < {at_least}");
            }
        })
    };
    for writer in writers {
        writer.await.unwrap();
    }
    let mut compactions = 0;
    for compactor in compactors {
        compactions += compactor.await.unwrap();
    }
    reader.await.unwrap();
    assert!(compactions > 0, "compactions ran while rows were appended");
    assert_eq!(counts(&a).await, (1201, 1201));
    assert_eq!(counts(&b).await, (1201, 1201));
    while a.compact(project(), &events(), keeping(&a, Vec::new()).await, Vec::new()).await.unwrap().is_some()
    {
    }
    let files = files_of(&a).await.len();
    assert!(files < MIN_SMALL_FILES + 1, "{files} files");
    assert_eq!(counts(&b).await, (1201, 1201));
    assert!(table_dir(&dir).join("_delta_log").is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compaction_cut_off_before_its_commit_changes_nothing_and_appends_never_wait() {
    let (a, b, dir) = two_nodes();
    a.write(project(), &events(), upload(WriteMode::Replace, ids(0, 5))).await.unwrap();
    // What a compaction killed before its commit leaves: a merged file beside the table's, in no version.
    let only = files_of(&a).await.remove(0);
    std::fs::copy(table_dir(&dir).join(&only), table_dir(&dir).join("compacted-cut-off.parquet")).unwrap();
    assert_eq!(counts(&a).await, (5, 5), "a file no commit added is never read");
    // Appends of either process go on at once, and land once.
    let written = tokio::time::timeout(
        Duration::from_secs(10),
        b.write(project(), &events(), upload(WriteMode::Append, ids(5, 5))),
    )
    .await
    .expect("an append never waits for a compaction")
    .unwrap();
    assert_eq!(written.rows, 5);
    assert_eq!(counts(&a).await, (10, 10));
    assert!(
        a.compact(project(), &events(), keeping(&a, Vec::new()).await, Vec::new()).await.unwrap().is_none(),
        "two small files"
    );
    assert_eq!(files_of(&b).await.len(), 2);
}

#[tokio::test]
async fn an_append_committed_after_the_version_read_before_the_pending_list_keeps_its_file() {
    let (engine, _, _dir) = two_nodes();
    engine.write(project(), &events(), upload(WriteMode::Replace, ids(0, 5))).await.unwrap();
    for i in 0..MIN_SMALL_FILES as u64 {
        engine.write(project(), &events(), upload(WriteMode::Append, ids(100 + i, 1))).await.unwrap();
    }
    // The compaction reads the version, then the pending appends (none); an append claimed in between
    // commits before the compaction reads the table. Its writer may stop before answering: it must stay
    // findable, though the list did not name it.
    let keep = keeping(&engine, Vec::new()).await;
    let late = uuid::Uuid::new_v4();
    engine.write(project(), &events(), tagged(ids(5, 1), late, 1 << 20)).await.unwrap();
    let done = engine.compact(project(), &events(), keep, Vec::new()).await.unwrap().expect("compacted");
    assert_eq!(done.files_merged, 1 + MIN_SMALL_FILES as u64, "the late append's file left: {done:?}");
    assert!(engine.holds(project(), &events(), late).await.unwrap().is_some(), "the late append is findable");
    // The next compaction reads a version that has it: merged then, being neither pending nor newer.
    let keep = keeping(&engine, Vec::new()).await;
    assert!(engine.compact(project(), &events(), keep, Vec::new()).await.unwrap().is_none(), "too few files");
    assert_eq!(counts(&engine).await, (6 + MIN_SMALL_FILES as u64, 6 + MIN_SMALL_FILES as u64));
}

fn tagged(body: String, write_id: uuid::Uuid, limit_bytes: u64) -> Upload {
    keyed(body, write_id, &write_id.to_string(), 0, limit_bytes)
}

/// An append under `key`, claimed when the table was at version `after`.
fn keyed(body: String, write_id: uuid::Uuid, key: &str, after: u64, limit_bytes: u64) -> Upload {
    let digest = domain::BodyDigest::default();
    let upload = upload(WriteMode::Append, body);
    let body = digest.wrap(upload.body);
    let key = domain::IdempotencyKey::parse(key).unwrap();
    Upload { body, limit_bytes, tag: Some(domain::AppendTag { write_id, digest, key, after }), ..upload }
}

/// A writer whose key was taken over while it was silent (not gone: a pause longer than the in-flight time)
/// wakes up and commits after the retry that took its key wrote the rows: its rows are refused, on whichever
/// node and by whichever path (held and grouped with other appends, or staged) they come, and the others of its
/// group land.
#[tokio::test]
async fn an_append_whose_key_another_append_wrote_after_its_claim_adds_nothing() {
    let (engine, other, _dir) = two_nodes();
    engine.write(project(), &events(), upload(WriteMode::Replace, ids(0, 5))).await.unwrap();
    let after = engine.newest_version(project(), &events()).await.unwrap().expect("a table");
    let (slow, retry) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    // The retry, on the other node, takes the key and writes first.
    other.write(project(), &events(), keyed(ids(5, 3), retry, "batch-1", after, 1 << 20)).await.unwrap();
    let refused = engine.write(project(), &events(), keyed(ids(5, 3), slow, "batch-1", after, 1 << 20)).await;
    assert!(matches!(refused, Err(domain::UploadError::TakenOver)), "{refused:?}");
    assert_eq!(counts(&engine).await, (8, 8));
    assert!(engine.holds(project(), &events(), slow).await.unwrap().is_none());
    assert!(engine.holds(project(), &events(), retry).await.unwrap().is_some());

    // Grouped with an append under another key and one under none: those two land.
    let bodies: Vec<HeldBody> =
        [(ids(5, 3), Some("batch-1")), (ids(8, 2), Some("batch-2")), (ids(10, 1), None)]
            .into_iter()
            .map(|(body, key)| {
                let tag = key.map(|key| {
                    let tag = domain::AppendTag {
                        write_id: uuid::Uuid::new_v4(),
                        digest: domain::BodyDigest::default(),
                        key: domain::IdempotencyKey::parse(key).unwrap(),
                        after,
                    };
                    Keyed::of(&tag, body.len() as u64)
                });
                HeldBody { bytes: body.into(), format: TableFormat::Csv, tag }
            })
            .collect();
    let answers = append_held(&engine.storage, (project(), None), "events", &bodies).await.expect("written");
    assert!(matches!(answers[0], Err(StagedError::TakenOver)), "{:?}", answers[0]);
    assert_eq!((answers[1].as_ref().ok(), answers[2].as_ref().ok()), (Some(&2), Some(&1)));
    assert_eq!(counts(&other).await, (11, 11));

    // Staged (past what is held in memory): refused the same, nothing of it left.
    let big = uuid::Uuid::new_v4();
    other
        .write(project(), &events(), keyed(ids(11, 1), uuid::Uuid::new_v4(), "big", after, 1 << 20))
        .await
        .unwrap();
    let refused =
        engine.write(project(), &events(), keyed(ids(100, 140_000), big, "big", after, 1 << 30)).await;
    assert!(matches!(refused, Err(domain::UploadError::TakenOver)), "{refused:?}");
    assert_eq!(counts(&engine).await, (12, 12));
    // The same key claimed again after that commit (used again, past its window) writes.
    let now = engine.newest_version(project(), &events()).await.unwrap().expect("a table");
    engine
        .write(project(), &events(), keyed(ids(12, 2), uuid::Uuid::new_v4(), "batch-1", now, 1 << 20))
        .await
        .unwrap();
    assert_eq!(counts(&other).await, (14, 14));
}

#[tokio::test]
async fn a_tagged_append_is_found_by_its_write_id_until_a_compaction_not_told_to_keep_it() {
    let (engine, other, _dir) = two_nodes();
    engine.write(project(), &events(), upload(WriteMode::Replace, ids(0, 5))).await.unwrap();
    // The other node hears every write and has read the table: it reads the version it keeps.
    other.hearing(true);
    assert_eq!(counts(&other).await, (5, 5));
    let (held, kept, merged) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let body = ids(5, 4);
    let sha = domain::BodyDigest::of(Box::pin(stream::iter(vec![Ok(Bytes::from(body.clone()))])), 1 << 20)
        .await
        .unwrap();
    engine.write(project(), &events(), tagged(body.clone(), held, 1 << 20)).await.unwrap();
    let found = engine.holds(project(), &events(), held).await.unwrap().expect("found by its id");
    assert_eq!((found.written.rows, found.written.bytes, found.body_sha256), (4, body.len() as u64, sha));
    // Its writer stopped before announcing it: a run on the other node does not see it yet, a retry's search
    // does (else the retry would write the rows again).
    assert_eq!(counts(&other).await, (5, 5));
    assert!(other.holds(project(), &events(), held).await.unwrap().is_some(), "a commit not announced");
    assert!(engine.holds(project(), &events(), uuid::Uuid::new_v4()).await.unwrap().is_none());
    // A body past what is held in memory is staged, and tagged the same.
    let big = ids(100, 140_000);
    let staged = uuid::Uuid::new_v4();
    engine.write(project(), &events(), tagged(big.clone(), staged, 1 << 30)).await.unwrap();
    let found = engine.holds(project(), &events(), staged).await.unwrap().expect("a staged append too");
    assert_eq!((found.written.rows, found.written.bytes), (140_000, big.len() as u64));

    engine.write(project(), &events(), tagged(ids(9, 1), kept, 1 << 20)).await.unwrap();
    engine.write(project(), &events(), tagged(ids(10, 1), merged, 1 << 20)).await.unwrap();
    for i in 0..MIN_SMALL_FILES as u64 {
        engine.write(project(), &events(), upload(WriteMode::Append, ids(200_000 + i, 1))).await.unwrap();
    }
    // Appends not answered yet keep their files through a compaction; the others are merged.
    let done = engine
        .compact(project(), &events(), keeping(&engine, vec![held, kept]).await, Vec::new())
        .await
        .unwrap()
        .expect("compacted");
    assert_eq!(done.files_merged, 2 + MIN_SMALL_FILES as u64, "{done:?}");
    assert!(engine.holds(project(), &events(), held).await.unwrap().is_some());
    assert!(engine.holds(project(), &events(), kept).await.unwrap().is_some());
    assert!(
        engine.holds(project(), &events(), staged).await.unwrap().is_some(),
        "a full file is never merged"
    );
    assert!(engine.holds(project(), &events(), merged).await.unwrap().is_none());
    assert_eq!(counts(&engine).await, (140_011 + MIN_SMALL_FILES as u64, 140_011 + MIN_SMALL_FILES as u64));
}

#[tokio::test]
async fn full_files_are_never_merged_and_a_replace_takes_the_whole_table() {
    let (engine, _, _dir) = two_nodes();
    engine.write(project(), &events(), upload(WriteMode::Replace, ids(0, 5))).await.unwrap();
    // A big append (a full file as written) and small ones.
    let big = Upload { limit_bytes: 1 << 30, ..upload(WriteMode::Append, ids(5, 140_000)) };
    engine.write(project(), &events(), big).await.unwrap();
    let full = files_of(&engine).await;
    let mut next = 140_005;
    let mut small_appends = |engine: Arc<DataFusionEngine>, count: u64| {
        let first = next;
        next += count;
        async move {
            for id in first..first + count {
                engine.write(project(), &events(), upload(WriteMode::Append, ids(id, 1))).await.unwrap();
            }
        }
    };
    small_appends(Arc::clone(&engine), MIN_SMALL_FILES as u64).await;
    let done = engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, Vec::new())
        .await
        .unwrap()
        .expect("compacted");
    assert_eq!(
        done.files_merged,
        1 + MIN_SMALL_FILES as u64,
        "the first small file and the appends: {done:?}"
    );
    let files = files_of(&engine).await;
    assert_eq!(files.len(), 2, "{files:?}");
    let kept: Vec<_> = full.iter().filter(|name| files.contains(name)).collect();
    assert_eq!(kept.len(), 1, "the big file stays as it was written: {files:?}");
    let record = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!((record.files, record.row_count), (Some(2), Some(140_005 + MIN_SMALL_FILES as u64)));
    assert_eq!(counts(&engine).await, (140_005 + MIN_SMALL_FILES as u64, 140_005 + MIN_SMALL_FILES as u64));

    // Another round: the full file is not merged again.
    small_appends(Arc::clone(&engine), MIN_SMALL_FILES as u64).await;
    let done = engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, Vec::new())
        .await
        .unwrap()
        .expect("compacted again");
    assert_eq!(done.files_merged, 1 + MIN_SMALL_FILES as u64, "{done:?}");
    assert!(files_of(&engine).await.contains(kept[0]));
    let total = 140_005 + 2 * MIN_SMALL_FILES as u64;
    assert_eq!(counts(&engine).await, (total, total));
    let found = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!((found.files, found.row_count), (Some(2), Some(total)));

    // A replace takes the table whole.
    engine.write(project(), &events(), upload(WriteMode::Replace, ids(0, 2))).await.unwrap();
    assert_eq!(counts(&engine).await, (2, 2));
    assert_eq!(files_of(&engine).await.len(), 1);
}

/// `count` rows with ids from `first` and a `score` out of the ids' order, as CSV.
fn scored(first: u64, count: u64) -> String {
    let mut body = String::from("id,kind,score\n");
    for id in first..first + count {
        body.push_str(&format!("{id},k{},{}\n", id % 3, (id * 7919) % 100_003));
    }
    body
}

/// Each of the table's files as `(name, rows of the columns named, sorting columns its row groups state)`.
async fn file_rows(
    engine: &DataFusionEngine,
    dir: &Path,
    columns: &[&str],
) -> Vec<(String, Vec<Vec<String>>, Vec<i32>)> {
    use datafusion::arrow::util::display::array_value_to_string;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let mut all = Vec::new();
    for name in files_of(engine).await {
        let file = std::fs::File::open(table_dir(dir).join(&name)).unwrap();
        let options = datafusion::parquet::arrow::arrow_reader::ArrowReaderOptions::new()
            .with_page_index_policy(datafusion::parquet::file::metadata::PageIndexPolicy::Required);
        let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(file, options).unwrap();
        // Page statistics and indexes, which let a run skip pages within a row group.
        assert!(builder.metadata().column_index().is_some() && builder.metadata().offset_index().is_some());
        let sorting = builder.metadata().row_groups()[0].sorting_columns().cloned().unwrap_or_default();
        let mut rows = Vec::new();
        for batch in builder.build().unwrap() {
            let batch = batch.unwrap();
            for row in 0..batch.num_rows() {
                let value = |c: &&str| array_value_to_string(batch.column_by_name(c).unwrap(), row).unwrap();
                rows.push(columns.iter().map(value).collect());
            }
        }
        all.push((name, rows, sorting.iter().map(|s| s.column_idx).collect()));
    }
    all
}

/// The sum of the table's scores and its rows and distinct ids: the same rows, however they are laid out.
async fn scores(engine: &DataFusionEngine) -> Value {
    let sql = "SELECT count(*) AS n, count(DISTINCT id) AS d, sum(score) AS s FROM events";
    let query = domain::Query::try_from(&json!({"kind": "SQLQuery", "query": sql})).unwrap();
    let result = engine.execute(project(), &query, &BTreeMap::new(), 10, 0).await.unwrap();
    serde_json::from_str::<Value>(&result.rows_json).unwrap()[0].clone()
}

#[tokio::test]
async fn a_layout_sorts_the_tables_files_by_its_columns_and_follows_them_when_they_change() {
    let (engine, _, dir) = two_nodes();
    let big = Upload { limit_bytes: 1 << 30, ..upload(WriteMode::Replace, scored(0, 140_000)) };
    engine.write(project(), &events(), big).await.unwrap();
    let before = scores(&engine).await;
    let record = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!(record.layout, domain::TableLayout::default(), "no layout until one is chosen");
    let layout = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<String>>();

    // A layout sorts the full file written unsorted; a column the table lacks is left out.
    let done = engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, layout(&["score", "gone"]))
        .await
        .unwrap()
        .expect("the unsorted full file is sorted");
    assert_eq!((done.files_merged, done.rows_merged), (1, 140_000));
    let files = file_rows(&engine, &dir, &["score"]).await;
    for (name, rows, sorting) in &files {
        let values: Vec<u64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
        assert!(values.is_sorted(), "{name} is sorted by score");
        assert!(sorting.is_empty(), "{name} does not state its order");
        let tag = crate::tables::layout::tag(&layout(&["score"])).unwrap();
        assert!(name.starts_with(&format!("compacted-{tag}-")), "{name}");
    }
    assert_eq!(scores(&engine).await, before, "the same rows");
    // The files do not state their order: DataFusion would then keep it through every repartition of an
    // aggregation by that column (`preserve_order=true`), which cost a `count(DISTINCT)` by it a third more.
    let grouped = domain::Query::try_from(&json!({"kind": "SQLQuery",
        "query": "SELECT score, count(DISTINCT kind) AS d FROM events GROUP BY score ORDER BY d DESC LIMIT 5"}))
    .unwrap();
    let plan = crate::tests::physical_plan(&engine, &grouped, &BTreeMap::new()).await;
    assert!(!plan.contains("preserve_order=true") && !plan.contains("ordering_mode=Sorted"), "{plan}");
    let record = engine.get(project(), &events()).await.unwrap().unwrap();
    let files_clustered = files.len() as u64;
    let expected = domain::TableLayout { cluster_by: layout(&["score"]), files_clustered, pinned: None };
    assert_eq!(record.layout, expected);
    assert_eq!(operations(&engine).await[..2], ["OPTIMIZE", "SET TBLPROPERTIES"]);
    // Sorted as asked, there is nothing to do.
    let again = engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, layout(&["score"]))
        .await
        .unwrap();
    assert!(again.is_none());

    // An endpoint filtering other columns came: the files are sorted by them at the next compaction.
    let done = engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, layout(&["kind", "id"]))
        .await
        .unwrap()
        .expect("sorted again");
    assert_eq!(done.rows_merged, 140_000);
    for (name, rows, sorting) in file_rows(&engine, &dir, &["kind", "id"]).await {
        let keys: Vec<(String, u64)> = rows.iter().map(|r| (r[0].clone(), r[1].parse().unwrap())).collect();
        assert!(keys.is_sorted(), "{name} is sorted by kind, then id");
        assert!(sorting.is_empty());
    }
    assert_eq!(scores(&engine).await, before);
    let record = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!(record.layout.cluster_by, layout(&["kind", "id"]));

    // Small appends are merged sorted; the sorted full files stay as they are.
    let sorted_files = files_of(&engine).await;
    for i in 0..MIN_SMALL_FILES as u64 {
        engine.write(project(), &events(), upload(WriteMode::Append, scored(200_000 + i, 1))).await.unwrap();
    }
    let done = engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, layout(&["kind", "id"]))
        .await
        .unwrap();
    assert_eq!(done.expect("the small files are merged").files_merged, MIN_SMALL_FILES as u64);
    let now = files_of(&engine).await;
    assert!(sorted_files.iter().all(|f| now.contains(f)), "{now:?}");
    for (name, rows, _) in file_rows(&engine, &dir, &["kind", "id"]).await {
        let keys: Vec<(String, u64)> = rows.iter().map(|r| (r[0].clone(), r[1].parse().unwrap())).collect();
        assert!(keys.is_sorted(), "{name} is sorted by kind, then id");
    }

    // No endpoint filters the table any more: the layout is dropped, the files stay.
    assert!(engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, Vec::new())
        .await
        .unwrap()
        .is_none());
    let record = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!(record.layout, domain::TableLayout::default());
    assert_eq!(files_of(&engine).await, now);

    // A table too small to have a full file records no layout: nothing is sorted, and no commit is made.
    engine.write(project(), &events(), upload(WriteMode::Replace, scored(0, 5))).await.unwrap();
    assert!(engine
        .compact(project(), &events(), keeping(&engine, Vec::new()).await, layout(&["score"]))
        .await
        .unwrap()
        .is_none());
    assert_eq!(operations(&engine).await[0], "WRITE");
    let record = engine.get(project(), &events()).await.unwrap().unwrap();
    assert_eq!(record.layout, domain::TableLayout::default());
}

/// Columns set for a table are kept with it (one property commit, no rows changed), through a replace, until
/// they are given back; a table deleted and written again starts without them.
#[tokio::test]
async fn columns_set_for_a_table_are_kept_through_replaces_until_given_back() {
    async fn pinned(engine: &DataFusionEngine) -> Option<Vec<String>> {
        engine.get(project(), &events()).await.unwrap().unwrap().layout.pinned
    }
    let (engine, _, _dir) = two_nodes();
    assert!(!engine.pin_layout(project(), &events(), Some(vec!["score".into()])).await.unwrap(), "no table");
    engine.write(project(), &events(), upload(WriteMode::Replace, scored(0, 5))).await.unwrap();
    let before = scores(&engine).await;
    assert!(engine.pin_layout(project(), &events(), Some(vec!["score".into()])).await.unwrap());
    assert_eq!(pinned(&engine).await, Some(vec!["score".to_owned()]));
    assert_eq!(operations(&engine).await[0], "SET TBLPROPERTIES");
    assert_eq!(scores(&engine).await, before);

    engine.write(project(), &events(), upload(WriteMode::Replace, scored(10, 5))).await.unwrap();
    assert_eq!(pinned(&engine).await, Some(vec!["score".to_owned()]), "kept through a replace");
    assert!(engine.pin_layout(project(), &events(), Some(Vec::new())).await.unwrap());
    assert_eq!(pinned(&engine).await, Some(Vec::new()), "not sorted, as set");
    assert!(engine.pin_layout(project(), &events(), None).await.unwrap());
    assert_eq!(pinned(&engine).await, None);

    assert!(engine.pin_layout(project(), &events(), Some(vec!["id".into()])).await.unwrap());
    assert!(engine.delete(project(), &events()).await.unwrap());
    assert!(!engine.pin_layout(project(), &events(), None).await.unwrap(), "a deleted table is no table");
    engine.write(project(), &events(), upload(WriteMode::Replace, scored(0, 5))).await.unwrap();
    assert_eq!(pinned(&engine).await, None, "written again after a delete: a new table");
}

/// A sort larger than its memory spills and merges what it spilled within the bound (with the engine's default
/// of one merge reservation per partition, two partitions' merges of 10M rows took the whole 256 MB of a
/// compaction's sort and its resort failed, again on every retry while it competed with runs).
#[tokio::test]
async fn a_sort_of_many_times_its_memory_spills_and_keeps_every_row_in_order() {
    let (engine, _, _dir) = two_nodes();
    let rows = 200_000;
    let mut body = String::from("id,name\n");
    for id in 0..rows {
        body.push_str(&format!("{id},n{:0>40}\n", (id * 7919) % 100_003));
    }
    let big = Upload { limit_bytes: 1 << 30, ..upload(WriteMode::Replace, body) };
    engine.write(project(), &events(), big).await.unwrap();
    let prefix = crate::tables::catalog::table_prefix(project(), events().as_str());
    let snapshot = engine.storage().tables().snapshot(&prefix).await.unwrap().unwrap();
    let locations: Vec<_> = snapshot.files.iter().map(|f| f.location.clone()).collect();
    let target = object_store::path::Path::from("projects/1/sorted");
    // About 10 MB of rows (counted twice while buffered) sorted within 8 MB.
    let merged =
        crate::tables::compaction::merge(engine.storage(), &locations, &target, &["name".into()], 8 << 20)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(merged.rows, rows);
    let mut names = Vec::new();
    for (path, _) in &merged.files {
        let bytes = engine.storage().store().get(path).await.unwrap().bytes().await.unwrap();
        let reader =
            datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes, 8192).unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let column = datafusion::arrow::compute::cast(
                batch.column_by_name("name").unwrap(),
                &datafusion::arrow::datatypes::DataType::Utf8,
            )
            .unwrap();
            let strings = datafusion::arrow::array::AsArray::as_string::<i32>(&column);
            names.extend(strings.iter().map(|s| s.unwrap().to_owned()));
        }
    }
    assert_eq!(names.len() as u64, rows);
    assert!(names.windows(2).all(|w| w[0] <= w[1]), "the merged rows are sorted by name");
}
