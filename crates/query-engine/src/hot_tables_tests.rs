//! Tables kept decoded (`hot_tables`): runs answer exactly as from storage, through appends, compactions and
//! replaces, and what is kept stays within its bound.

use std::fmt::Write as _;

use domain::{TableFormat, TableName, TableStore, WriteMode};
use serde_json::json;

use super::*;
use crate::tests::{query, temp_dir};

fn project() -> ProjectId {
    ProjectId::new(1).unwrap()
}

fn name(table: &str) -> TableName {
    TableName::parse(table).unwrap()
}

/// `rows` rows `id,country,day,amount,note` from `first`: ids and days in arrival order (as events arrive),
/// countries in turn, a note missing from every third row.
fn rows_csv(first: usize, rows: usize) -> Vec<u8> {
    let mut csv = String::from("id,country,day,amount,note\n");
    for id in first..first + rows {
        let country = ["US", "FR", "DE", "JP", "BR"][id % 5];
        let day = time::Date::from_ordinal_date(2025, 1).unwrap() + time::Duration::days((id / 200) as i64);
        let note = if id % 3 == 0 { String::new() } else { format!("n_{}", id % 1000) };
        writeln!(csv, "{id},{country},{day},{},{note}", id as f64 * 0.5 - 100.0).unwrap();
    }
    csv.into_bytes()
}

async fn write(engine: &DataFusionEngine, table: &str, mode: WriteMode, body: Vec<u8>) {
    write_to(engine, project(), table, mode, body).await;
}

async fn write_to(
    engine: &DataFusionEngine,
    project: ProjectId,
    table: &str,
    mode: WriteMode,
    body: Vec<u8>,
) {
    let chunks = vec![Ok::<_, std::io::Error>(bytes::Bytes::from(body))];
    let upload = domain::Upload {
        format: TableFormat::Csv,
        mode,
        body: Box::pin(futures_util::stream::iter(chunks)),
        limit_bytes: 64 << 20,
        tag: None,
        quarantine: false,
    };
    TableStore::write(engine, project, &name(table), upload).await.unwrap();
}

/// Shapes endpoints are made of, each filter one the slices' bounds can prune or cannot.
const SHAPES: &[&str] = &[
    "SELECT count(*) AS n, sum(amount) AS s FROM t WHERE id BETWEEN 12000 AND 12100",
    "SELECT country, count(*) AS n FROM t WHERE country = 'FR' GROUP BY country",
    "SELECT count(*) AS n FROM t WHERE country IN ('US', 'JP') AND id > 25000",
    "SELECT id, note FROM t WHERE note IS NULL ORDER BY id DESC LIMIT 3",
    "SELECT count(*) AS n FROM t WHERE note LIKE 'n\\_1%'",
    "SELECT min(day) AS first, max(day) AS last, count(*) AS n FROM t WHERE day >= DATE '2025-03-01'",
    "SELECT count(*) AS n FROM t WHERE amount > 1000.0",
    "SELECT * FROM t WHERE id = 29999",
    "SELECT count(*) AS n FROM t WHERE id < 0",
    "SELECT count(*) AS n FROM t WHERE upper(country) = 'DE' OR id = 5",
    "SELECT day, count(*) AS n FROM t GROUP BY day ORDER BY n DESC, day LIMIT 2",
];

async fn answers(engine: &DataFusionEngine) -> Vec<String> {
    let mut answers = Vec::new();
    for sql in SHAPES {
        let run = engine.execute(project(), &query(sql, json!({})), &BTreeMap::new(), 100, 0).await;
        answers.push(run.unwrap_or_else(|err| panic!("{sql}: {err}")).rows_json);
    }
    answers
}

/// The answers of every shape, once no run of them finds a column it reads not decoded: each run has the
/// columns it read and the table's kept files lack decoded after it, while no other decoding is under way.
async fn warmed(engine: &DataFusionEngine) -> Vec<String> {
    loop {
        let before = hot(engine).decodes();
        let answers = answers(engine).await;
        hot(engine).settled().await;
        if hot(engine).decodes() == before {
            return answers;
        }
    }
}

/// How a plan shows a scan of Parquet files.
const PARQUET: &str = "file_type=parquet";

fn engine_keeping(storage: &Storage, bytes: usize) -> DataFusionEngine {
    DataFusionEngine::new(storage.clone())
        .with_limits(EngineLimits { hot_tables: bytes, ..EngineLimits::default() })
}

fn hot(engine: &DataFusionEngine) -> &hot_tables::HotTables {
    engine.hot.as_deref().expect("tables are kept")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_a_table_kept_decoded_answer_as_runs_from_storage_through_appends_compactions_and_replaces() {
    let dir = temp_dir("hot-tables");
    let storage = Storage::local(&dir).unwrap();
    let (warm, stored) = (engine_keeping(&storage, 256 << 20), engine_keeping(&storage, 0));
    assert!(stored.hot.is_none(), "a bound of 0 keeps nothing");
    write(&warm, "t", WriteMode::Replace, rows_csv(0, 30_000)).await;

    let expected = answers(&stored).await;
    assert_eq!(answers(&warm).await, expected, "the first runs read storage");
    hot(&warm).settled().await;
    assert_eq!(hot(&warm).kept().1, 1, "the table's file is kept");
    assert_eq!(warmed(&warm).await, expected, "runs of the decoded file");
    assert_eq!(hot(&warm).kept().1, 1, "its columns decoded as runs read them, kept as one file");
    let plan = crate::tests::physical_plan(&warm, &query(SHAPES[0], json!({})), &BTreeMap::new()).await;
    assert!(plan.contains("DataSourceExec: partitions=") && !plan.contains(PARQUET), "{plan}");
    // Its bounds skip the slices a filter cannot match: 101 ids read at most two slices of 8,192 rows.
    let run = warm.execute(project(), &query(SHAPES[0], json!({})), &BTreeMap::new(), 10, 0).await.unwrap();
    let read = run.statistics.rows_read.unwrap();
    assert!(read > 0 && read <= 2 * 8192, "{read} of 30,000 rows read");
    assert!(run.statistics.bytes_read.unwrap() > 0, "the bytes of the columns it read");
    let every = warm.execute(project(), &query(SHAPES[9], json!({})), &BTreeMap::new(), 10, 0).await.unwrap();
    assert_eq!(
        every.statistics.rows_read,
        Some(30_000),
        "a filter the bounds cannot judge reads every slice"
    );

    // Appends keep their files' rows beside the decoded one at once, without decoding them.
    let decodes = hot(&warm).decodes();
    for append in 0..compaction::MIN_SMALL_FILES {
        write(&warm, "t", WriteMode::Append, rows_csv(30_000 + append * 10, 10)).await;
    }
    let files = 1 + compaction::MIN_SMALL_FILES;
    assert_eq!(hot(&warm).kept().1, files, "the appended files are kept beside the first");
    assert_eq!(hot(&warm).decodes(), decodes, "without being decoded");
    let before = expected;
    let expected = answers(&stored).await;
    assert_ne!(expected, before, "the append changes answers");
    assert_eq!(answers(&warm).await, expected, "the appended rows read from memory");
    let plan = crate::tests::physical_plan(&warm, &query(SHAPES[1], json!({})), &BTreeMap::new()).await;
    assert!(!plan.contains(PARQUET), "{plan}");
    // Appended by another process, a file is read from storage, then decoded.
    write(&stored, "t", WriteMode::Append, rows_csv(40_000, 10)).await;
    let expected = answers(&stored).await;
    assert_eq!(answers(&warm).await, expected, "decoded and stored files together");
    hot(&warm).settled().await;
    assert!(hot(&warm).decodes() > decodes, "the other's file decoded");
    assert_eq!(warmed(&warm).await, expected);
    assert_eq!(hot(&warm).kept().1, files + 1, "the other's file kept");

    // A compaction's file replaces them: they are dropped at the next run, and the new one decoded.
    let after = warm.newest_version(project(), &name("t")).await.unwrap().expect("a table");
    let keep = domain::Findable { pending: Vec::new(), after };
    let compacted = warm.compact(project(), &name("t"), keep, Vec::new()).await.unwrap();
    assert!(compacted.is_some(), "small files compacted");
    assert_eq!(answers(&warm).await, expected);
    hot(&warm).settled().await;
    assert_eq!(warmed(&warm).await, expected);
    assert_eq!(hot(&warm).kept().1, 1, "the compacted file alone is kept");

    // A replace drops the table's files at its next run.
    write(&warm, "t", WriteMode::Replace, rows_csv(100, 50)).await;
    let replaced = answers(&stored).await;
    assert_ne!(replaced, expected);
    assert_eq!(answers(&warm).await, replaced);
    hot(&warm).settled().await;
    assert_eq!(warmed(&warm).await, replaced);
    assert_eq!(hot(&warm).kept().1, 1, "only the replacing file is kept");
    drop(dir);
}

/// What is kept of a file is the columns runs of it read: a run reading others has those decoded beside them,
/// and an append keeps its rows with every column the table's kept files have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_keeps_decoded_the_columns_its_runs_read() {
    let dir = temp_dir("hot-columns");
    let storage = Storage::local(&dir).unwrap();
    let (warm, whole, stored) = (
        engine_keeping(&storage, 256 << 20),
        engine_keeping(&storage, 256 << 20),
        engine_keeping(&storage, 0),
    );
    write(&warm, "t", WriteMode::Replace, rows_csv(0, 30_000)).await;
    let by_country = "SELECT country, count(*) AS n FROM t GROUP BY country ORDER BY country";
    let amounts = "SELECT round(sum(amount), 2) AS s FROM t WHERE id >= 100";
    let notes = "SELECT count(*) AS n FROM t WHERE note LIKE 'n\\_9%'";
    let answer = |engine: &DataFusionEngine, sql: &'static str| {
        let engine = engine.clone();
        async move {
            engine
                .execute(project(), &query(sql, json!({})), &BTreeMap::new(), 100, 0)
                .await
                .unwrap()
                .rows_json
        }
    };
    let from_storage = |engine: &DataFusionEngine, sql: &'static str| {
        let engine = engine.clone();
        async move {
            crate::tests::physical_plan(&engine, &query(sql, json!({})), &BTreeMap::new())
                .await
                .contains(PARQUET)
        }
    };
    answer(&whole, "SELECT * FROM t WHERE id = 1").await;
    hot(&whole).settled().await;
    let every = hot(&whole).kept().0;

    assert_eq!(answer(&warm, by_country).await, answer(&stored, by_country).await);
    hot(&warm).settled().await;
    let (country, files) = hot(&warm).kept();
    assert_eq!(files, 1);
    // Strings are kept as views, 16 bytes a row whatever their length: the country column is a third.
    assert!(country * 2 < every, "one column of five: {country} bytes of {every}");
    assert!(!from_storage(&warm, by_country).await, "the column it reads is decoded");
    assert!(from_storage(&warm, amounts).await, "the others are not");

    // Another run's columns are decoded beside it, one file still.
    assert_eq!(answer(&warm, amounts).await, answer(&stored, amounts).await, "read from storage");
    hot(&warm).settled().await;
    let (both, files) = hot(&warm).kept();
    assert!(files == 1 && both > country && both < every, "{both} bytes in {files} files");
    for sql in [by_country, amounts] {
        assert!(!from_storage(&warm, sql).await, "{sql}");
        assert_eq!(answer(&warm, sql).await, answer(&stored, sql).await, "{sql}");
    }

    // An append is kept with the columns decoded, so runs reading them read no file; others still do.
    write(&warm, "t", WriteMode::Append, rows_csv(30_000, 10)).await;
    assert_eq!(hot(&warm).kept().1, 2, "the appended rows kept");
    for sql in [by_country, amounts] {
        assert!(!from_storage(&warm, sql).await, "{sql}");
        assert_eq!(answer(&warm, sql).await, answer(&stored, sql).await, "{sql}");
    }
    assert!(from_storage(&warm, notes).await);
    assert_eq!(answer(&warm, notes).await, answer(&stored, notes).await);

    // A file new to runs (another process's append) is decoded after one run with every column runs of the
    // table read, not with that run's alone.
    write(&stored, "t", WriteMode::Append, rows_csv(40_000, 10)).await;
    assert_eq!(answer(&warm, by_country).await, answer(&stored, by_country).await);
    hot(&warm).settled().await;
    for sql in [by_country, amounts, notes] {
        assert!(!from_storage(&warm, sql).await, "{sql}");
        assert_eq!(answer(&warm, sql).await, answer(&stored, sql).await, "{sql}");
    }
    drop(dir);
}

/// Runs that find a file being decoded without the columns they read queue those, so a burst of runs reading
/// different columns has each decoded once, without running again; a column claimed is not claimed twice.
#[tokio::test]
async fn runs_finding_a_file_being_decoded_queue_the_columns_it_lacks() {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use hot_tables::{HotTable, HotTables};
    use object_store::{path::Path, ObjectMeta};
    let hot = HotTables::new(1 << 20).unwrap();
    let table = HotTable { project: project(), name: "t".into() };
    let schema = Schema::new(["a", "b", "c"].map(|name| Field::new(name, DataType::Int64, false)).to_vec());
    let file = ObjectMeta {
        location: Path::from("t/part-0.parquet"),
        last_modified: chrono::Utc::now(),
        size: 100,
        e_tag: None,
        version: None,
    };
    let claim = |columns: Option<&[usize]>| hot.claim(&table, (&file, 1), (&schema, columns));
    assert_eq!(claim(Some(&[0, 1])), Some(vec![0, 1]), "cold");
    assert_eq!(claim(Some(&[1])), None, "its column being decoded");
    assert_eq!(claim(Some(&[1, 2])), Some(vec![2]), "queued after the first");
    assert_eq!(claim(None), None, "every column claimed");
    hot.refuse(&file, &"the queued one could not be planned");
    assert_eq!(claim(Some(&[2])), None, "claimed still, until the first ends");
}

/// A run that began before an append reads the version before it, which does not name the appended file: it
/// leaves that file kept (streamed appends would otherwise lose theirs to the runs between them). Only a read of
/// a version as new as the newest that named a file drops it for not naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_the_version_before_an_append_leaves_the_appended_file_kept() {
    let dir = temp_dir("hot-tables-versions");
    let storage = Storage::local(&dir).unwrap();
    let warm = engine_keeping(&storage, 256 << 20);
    write(&warm, "t", WriteMode::Replace, rows_csv(0, 1000)).await;
    answers(&warm).await;
    hot(&warm).settled().await;
    write(&warm, "t", WriteMode::Append, rows_csv(1000, 10)).await;
    assert_eq!(hot(&warm).kept().1, 2, "the appended file kept beside the first");
    let prefix = crate::tables::catalog::table_prefix(project(), "t");
    let Some(crate::tables::catalog::Current::Files(snapshot)) =
        crate::tables::catalog::current(&storage, &prefix).await.unwrap()
    else {
        panic!("a table of files")
    };
    let table = hot_tables::HotTable { project: project(), name: "t".into() };
    hot(&warm).split(&table, (&[], snapshot.version - 1), None);
    assert_eq!(
        hot(&warm).kept().1,
        1,
        "a read of the version before drops its own file, not the appended one"
    );
    hot(&warm).split(&table, (&[], snapshot.version), None);
    assert_eq!(hot(&warm).kept().1, 0, "a read of the append's version drops it");
    drop(dir);
}

/// A replace with other types under the same names leaves the table's earlier files kept until a run drops
/// them; an append meanwhile is not kept with their columns, and runs answer as from storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_after_a_replace_with_other_types_is_not_kept_with_the_earlier_columns() {
    let dir = temp_dir("hot-tables-types");
    let storage = Storage::local(&dir).unwrap();
    let (warm, stored) = (engine_keeping(&storage, 256 << 20), engine_keeping(&storage, 0));
    write(&warm, "t", WriteMode::Replace, rows_csv(0, 1000)).await;
    answers(&warm).await;
    hot(&warm).settled().await;
    assert_eq!(hot(&warm).kept().1, 1);
    let texts = |first: usize| -> Vec<u8> {
        let rows: String = (first..first + 5).map(|id| format!("{id},FR,2025-01-01,a{id},n\n")).collect();
        format!("id,country,day,amount,note\n{rows}").into_bytes()
    };
    write(&warm, "t", WriteMode::Replace, texts(0)).await;
    write(&warm, "t", WriteMode::Append, texts(5)).await;
    assert_eq!(hot(&warm).kept().1, 1, "the appended rows are not kept with the replaced file's columns");
    let q = query("SELECT id, amount FROM t ORDER BY id", json!({}));
    let expected = stored.execute(project(), &q, &BTreeMap::new(), 100, 0).await.unwrap().rows_json;
    assert!(expected.contains("a9"), "{expected}");
    assert_eq!(warm.execute(project(), &q, &BTreeMap::new(), 100, 0).await.unwrap().rows_json, expected);
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_kept_decoded_stay_within_their_bound_the_least_recently_read_leaving_first() {
    let dir = temp_dir("hot-bound");
    let storage = Storage::local(&dir).unwrap();
    let measuring = engine_keeping(&storage, 256 << 20);
    for table in ["a", "b", "c"] {
        write(&measuring, table, WriteMode::Replace, rows_csv(0, 20_000)).await;
    }
    let count =
        |table: &str| query(&format!("SELECT count(*) AS n FROM {table} WHERE country = 'US'"), json!({}));
    let run = |engine: &DataFusionEngine, table: &str| {
        let (engine, q) = (engine.clone(), count(table));
        async move { engine.execute(project(), &q, &BTreeMap::new(), 10, 0).await.unwrap().rows_json }
    };
    run(&measuring, "a").await;
    hot(&measuring).settled().await;
    let (one, files) = hot(&measuring).kept();
    assert_eq!(files, 1);

    // Room for two of the three tables: the third read leaves the least recently read out.
    let engine = engine_keeping(&storage, one * 5 / 2);
    let reads = |table| {
        let (engine, q) = (engine.clone(), count(table));
        async move { crate::tests::physical_plan(&engine, &q, &BTreeMap::new()).await.contains(PARQUET) }
    };
    for table in ["a", "b", "c", "b"] {
        assert_eq!(run(&engine, table).await, r#"[{"n":4000}]"#, "{table}");
        hot(&engine).settled().await;
        let (bytes, _) = hot(&engine).kept();
        assert!(bytes <= one * 5 / 2, "{bytes} bytes kept within {}", one * 5 / 2);
    }
    assert_eq!(hot(&engine).kept(), (2 * one, 2), "two tables kept");
    assert_eq!((reads("a").await, reads("b").await, reads("c").await), (true, false, false), "a left");
    // A table that left is decoded again once read often enough from storage, and the one read least recently
    // (c) leaves for it; tables read in turn are not decoded at every run.
    for _ in 1..hot_tables::COLD_READS_TO_DECODE_AGAIN {
        assert_eq!(run(&engine, "b").await, r#"[{"n":4000}]"#);
        assert_eq!(run(&engine, "a").await, r#"[{"n":4000}]"#);
        hot(&engine).settled().await;
    }
    assert_eq!(hot(&engine).decodes(), 4, "a decoded a second time");
    assert_eq!((reads("a").await, reads("b").await, reads("c").await), (false, false, true), "c left");

    // A bound smaller than the column keeps nothing, and does not decode it again at every run.
    let small = engine_keeping(&storage, one / 2);
    for _ in 0..3 {
        assert_eq!(run(&small, "a").await, r#"[{"n":4000}]"#);
        hot(&small).settled().await;
        assert_eq!(hot(&small).kept(), (0, 0));
    }
    assert_eq!(hot(&small).decodes(), 1, "tried once");
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_reading_many_tables_never_pushes_out_the_files_of_one_holding_less() {
    let dir = temp_dir("hot-share");
    let storage = Storage::local(&dir).unwrap();
    let (mine, theirs) = (project(), ProjectId::new(2).unwrap());
    let measuring = engine_keeping(&storage, 256 << 20);
    for table in ["a", "b", "c"] {
        write_to(&measuring, mine, table, WriteMode::Replace, rows_csv(0, 20_000)).await;
    }
    write_to(&measuring, theirs, "t", WriteMode::Replace, rows_csv(0, 20_000)).await;
    let run = |engine: &DataFusionEngine, project: ProjectId, table: &str| {
        let engine = engine.clone();
        let q = query(&format!("SELECT count(*) AS n FROM {table} WHERE country = 'US'"), json!({}));
        async move {
            let answer = engine.execute(project, &q, &BTreeMap::new(), 10, 0).await.unwrap().rows_json;
            assert_eq!(answer, r#"[{"n":4000}]"#);
            hot(&engine).settled().await;
        }
    };
    run(&measuring, mine, "a").await;
    let one = hot(&measuring).kept().0;

    // Room for two files and a half. Their table was read before the last two of mine, so a cache of the
    // least recently read alone would drop it first; it holds less than mine would, so mine give way.
    let engine = engine_keeping(&storage, one * 5 / 2);
    run(&engine, theirs, "t").await;
    for table in ["a", "b", "c", "a", "b"] {
        run(&engine, mine, table).await;
        assert_eq!(hot(&engine).kept_by(theirs), one, "their table stays, after {table}");
        assert!(hot(&engine).kept().0 <= one * 5 / 2);
    }
    assert_eq!(hot(&engine).kept_by(mine), one, "mine take turns in what is left");
    // Alone, a project may take the whole bound: it gives way to others only once it holds more.
    let alone = engine_keeping(&storage, one * 5 / 2);
    for table in ["a", "b"] {
        run(&alone, mine, table).await;
    }
    assert_eq!(hot(&alone).kept_by(mine), 2 * one);
    run(&alone, theirs, "t").await;
    assert_eq!((hot(&alone).kept_by(mine), hot(&alone).kept_by(theirs)), (one, one), "the larger gave way");
    drop(dir);
}

/// A scan of files in storage filters their rows while decoding them (a Parquet row filter: the other columns
/// decoded only for the rows that pass, and no filter left above the scan) when it reads at least three
/// columns its filters do not name, and decodes whole columns otherwise; either way it answers as the rows kept
/// decoded in memory do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_stored_files_filters_while_decoding_only_when_it_reads_enough_other_columns() {
    let dir = temp_dir("late-filter");
    let storage = Storage::local(&dir).unwrap();
    let (stored, warm) = (engine_keeping(&storage, 0), engine_keeping(&storage, 256 << 20));
    write(&stored, "t", WriteMode::Replace, rows_csv(0, 30_000)).await;
    let cases = [
        (
            "SELECT id, day, amount, note FROM t WHERE country = 'JP' AND id BETWEEN 100 AND 140 ORDER BY id",
            true,
        ),
        ("SELECT * FROM t WHERE id = 29999", true),
        ("SELECT * FROM t WHERE note IS NULL AND amount > 14000.0 ORDER BY id DESC LIMIT 4", true),
        ("SELECT id, amount FROM t WHERE country = 'JP' AND id < 30 ORDER BY id", false),
        (
            "SELECT country, day, count(*) AS n FROM t WHERE country = 'FR' GROUP BY 1, 2 ORDER BY 2 LIMIT 3",
            false,
        ),
    ];
    for (sql, late) in cases {
        let plan = crate::tests::physical_plan(&stored, &query(sql, json!({})), &BTreeMap::new()).await;
        assert!(plan.contains(PARQUET), "{plan}");
        assert_eq!(!plan.contains("FilterExec"), late, "{sql}: {plan}");
    }
    let run = |engine: &DataFusionEngine| {
        let engine = engine.clone();
        async move {
            let mut answers = Vec::new();
            for (sql, _) in cases {
                let run = engine.execute(project(), &query(sql, json!({})), &BTreeMap::new(), 100, 0).await;
                answers.push(run.unwrap_or_else(|err| panic!("{sql}: {err}")).rows_json);
            }
            answers
        }
    };
    let from_files = run(&stored).await;
    assert!(from_files.iter().all(|rows| rows != "[]"), "{from_files:?}");
    run(&warm).await;
    hot(&warm).settled().await;
    let plan = crate::tests::physical_plan(&warm, &query(cases[0].0, json!({})), &BTreeMap::new()).await;
    assert!(!plan.contains(PARQUET), "{plan}");
    assert_eq!(run(&warm).await, from_files, "the rows kept decoded");
}
