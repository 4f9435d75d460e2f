use std::time::Duration;

use domain::{
    Interval, LogFilter, LogKind, LogRecord, LogSource, RunLog, StatusFilter, Timestamp, Transport,
    UsageQuery,
};
use futures_util::TryStreamExt;
use serde_json::json;
use uuid::Uuid;

use super::run_log::{LogSettings, ParquetRunLog, PRUNE_EVERY};
use super::tests::{engine_on, query, temp_dir};
use super::*;

fn project(id: i64) -> ProjectId {
    ProjectId::new(id).unwrap()
}

fn record(project_id: i64, endpoint: &str, at: Timestamp, n: u64) -> LogRecord {
    LogRecord {
        id: Uuid::new_v4(),
        at,
        project: project(project_id),
        endpoint: endpoint.into(),
        version: Some(2),
        kind: if n % 10 == 9 { LogKind::Refresh } else { LogKind::Run },
        status: if n % 7 == 3 { 429 } else { 200 },
        code: (n % 7 == 3).then(|| "rate_limited".into()),
        duration: Duration::from_micros(1000 + n * 10),
        rows: Some(n),
        bytes_read: Some(100),
        source: Some(if n % 2 == 0 { LogSource::Cache } else { LogSource::Live }),
        credential: Some("ci key".into()),
        transport: Some(if n % 3 == 0 { Transport::Mcp } else { Transport::Rest }),
        request_id: Some(format!("req-{n}")),
        runs: 1,
    }
}

/// `start`, or a start before it, so that `seconds` from it stay in one hour (merges are per hour).
fn within_one_hour(start: Timestamp, seconds: i64) -> Timestamp {
    let end = start + time::Duration::seconds(seconds);
    if end.hour() == start.hour() {
        start
    } else {
        end.replace_time(time::Time::MIDNIGHT) + time::Duration::hours(i64::from(end.hour()))
            - time::Duration::seconds(seconds + 1)
    }
}

fn all(limit: u32) -> LogFilter {
    LogFilter { since: None, until: None, kind: None, status: None, limit, cursor: None }
}

fn now() -> Timestamp {
    let now = Timestamp::now_utc();
    now.replace_nanosecond(now.nanosecond() / 1000 * 1000).unwrap()
}

/// Records go to the storage at each flush, read back whole and newest first, page by page, filtered; many
/// flushes merged read the same; two projects never see each other's.
#[tokio::test]
async fn records_read_back_whole_paged_filtered_and_merged_per_project() {
    let dir = temp_dir("run-log");
    let storage = Storage::local(&dir).unwrap();
    let log = ParquetRunLog::new(storage.clone(), LogSettings::default());
    let start = within_one_hour(now() - time::Duration::seconds(100), 60);
    let mut written = Vec::new();
    // Twelve flushes of five records each for project 1 (across two endpoints), and one for project 2.
    for flush in 0..12_u64 {
        for i in 0..5 {
            let n = flush * 5 + i;
            let r = record(
                1,
                if n % 4 == 0 { "other" } else { "kpi" },
                start + time::Duration::seconds(n as i64),
                n,
            );
            written.push(r.clone());
            log.record(r);
        }
        log.record(record(2, "kpi", start, 1000 + flush));
        log.flush().await.unwrap();
    }
    let mut kpi: Vec<_> = written.iter().filter(|r| r.endpoint == "kpi").cloned().collect();
    kpi.sort_by(|a, b| b.at.cmp(&a.at).then(b.id.cmp(&a.id)));

    let read = |filter: LogFilter| {
        let log = log.clone();
        async move { log.records(project(1), "kpi", &filter).await.unwrap() }
    };
    assert_eq!(read(all(1000)).await, kpi, "whole, newest first");
    // Paged by the cursor: every record once.
    let mut paged = Vec::new();
    let mut filter = all(7);
    loop {
        let page = domain::LogPage::of(read(filter.clone()).await, 7);
        paged.extend(page.records);
        match page.next {
            Some(next) => filter.cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(paged, kpi);
    let errors =
        read(LogFilter { status: Some(StatusFilter::Error), kind: Some(LogKind::Run), ..all(1000) }).await;
    let expected: Vec<_> =
        kpi.iter().filter(|r| r.status >= 400 && r.kind == LogKind::Run).cloned().collect();
    assert!(!expected.is_empty());
    assert_eq!(errors, expected);
    let window = LogFilter {
        since: Some(start + time::Duration::seconds(10)),
        until: Some(start + time::Duration::seconds(20)),
        ..all(1000)
    };
    let expected: Vec<_> = kpi.iter().filter(|r| window.keeps(r)).cloned().collect();
    assert_eq!(read(window).await, expected);

    // Twelve flushes in one hour are more than a merge waits for: the oldest eight become one file, read the
    // same, and the newest four wait for the next.
    let hours = std::fs::read_dir(dir.join("projects/1/logs")).unwrap().count();
    assert_eq!(hours, 1);
    let files = || -> usize {
        std::fs::read_dir(dir.join("projects/1/logs"))
            .unwrap()
            .map(|hour| std::fs::read_dir(hour.unwrap().path()).unwrap().count())
            .sum()
    };
    let flushed = files();
    assert_eq!(flushed, 12);
    log.maintain(now()).await.unwrap();
    assert_eq!(read(all(1000)).await, kpi, "merged files read once");
    assert_eq!(files(), flushed + 1, "one merged file beside the flushed ones, until the grace");
    // After the grace, the merged ones are deleted and the records stay.
    log.maintain(now() + LOG_MERGE_GRACE + time::Duration::SECOND).await.unwrap();
    assert_eq!(files(), 1 + 4);
    assert_eq!(read(all(1000)).await, kpi);

    // Project 2 sees its own records only, and none of project 1's endpoint of the same name.
    let other = log.records(project(2), "kpi", &all(1000)).await.unwrap();
    assert_eq!(other.len(), 12);
    assert!(other.iter().all(|r| r.rows.unwrap() >= 1000 && r.project == project(2)));

    // Usage: runs only, by minute, with exact percentiles.
    let since = start - time::Duration::minutes(1);
    let query =
        UsageQuery::new(Some(since), Some(now() + time::Duration::SECOND), Some(Interval::Minute), now())
            .unwrap();
    let buckets = log.usage(project(1), "kpi", &query).await.unwrap();
    let runs: Vec<_> = kpi.iter().filter(|r| r.kind == LogKind::Run).collect();
    assert_eq!(buckets.iter().map(|b| b.requests).sum::<u64>(), runs.len() as u64);
    assert_eq!(
        buckets.iter().map(|b| b.errors).sum::<u64>(),
        runs.iter().filter(|r| r.status >= 400).count() as u64
    );
    assert_eq!(
        buckets.iter().map(|b| b.cache_hits).sum::<u64>(),
        runs.iter().filter(|r| r.source == Some(LogSource::Cache)).count() as u64
    );
    let mut expected = domain::UsageAccumulator::new(query);
    for r in &runs {
        expected.add(&domain::UsageSample::from(*r));
    }
    assert_eq!(buckets, expected.finish());
}

/// Reading a project's records is one of its queries: with its slots taken, its logs and usage are refused as
/// its runs are (429), another project's are read meanwhile, and its own once the slot is free again.
#[tokio::test]
async fn reading_a_projects_records_takes_one_of_its_query_slots() {
    let dir = temp_dir("run-log-slots");
    let limits = EngineLimits { max_concurrent_per_project: 1, ..EngineLimits::default() };
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap()).with_limits(limits);
    let log = engine.run_log(LogSettings::default());
    let at = now();
    for id in [1, 2] {
        log.record(record(id, "kpi", at, 0));
    }
    log.flush().await.unwrap();
    let usage = UsageQuery::new(
        Some(at - time::Duration::MINUTE),
        Some(at + time::Duration::SECOND),
        Some(Interval::Minute),
        at,
    )
    .unwrap();
    let requests = |buckets: Vec<domain::UsageBucket>| buckets.iter().map(|b| b.requests).sum::<u64>();

    let held = engine.admission.enter(project(1)).unwrap();
    let err = log.records(project(1), "kpi", &all(10)).await.unwrap_err();
    assert!(matches!(err, EngineError::Busy { .. }), "{err:?}");
    let err = log.usage(project(1), "kpi", &usage).await.unwrap_err();
    assert!(matches!(err, EngineError::Busy { .. }), "{err:?}");
    assert_eq!(log.records(project(2), "kpi", &all(10)).await.unwrap().len(), 1);
    assert_eq!(requests(log.usage(project(2), "kpi", &usage).await.unwrap()), 1);
    drop(held);
    assert_eq!(log.records(project(1), "kpi", &all(10)).await.unwrap().len(), 1);
    assert_eq!(requests(log.usage(project(1), "kpi", &usage).await.unwrap()), 1);
}

/// `_logs` is a table of the project's own records in SQL, never listed among its tables; records past the
/// retention are in none of the readings, and their hours are deleted.
#[tokio::test]
async fn logs_are_a_table_of_the_projects_own_records_within_the_retention() {
    let dir = temp_dir("run-log-sql");
    let storage = Storage::local(&dir).unwrap();
    let retention = Duration::from_secs(3600);
    let log = ParquetRunLog::new(storage.clone(), LogSettings { retention, ..LogSettings::default() });
    let engine = engine_on(storage.clone()).await.with_log_retention(retention);
    let sql =
        query("SELECT endpoint, count(*) AS runs FROM _logs GROUP BY endpoint ORDER BY endpoint", json!({}));
    // No records yet: an empty table, not an error.
    let empty = engine.execute(project(1), &sql, &Default::default(), 10, 0).await.unwrap();
    assert_eq!(empty.rows_json, "[]");

    let now = now();
    for n in 0..3 {
        log.record(record(1, "kpi", now - time::Duration::seconds(5), n));
    }
    log.record(record(1, "old", now - time::Duration::hours(3), 7));
    log.record(record(2, "secret", now, 8));
    log.flush().await.unwrap();
    let rows = engine.execute(project(1), &sql, &Default::default(), 10, 0).await.unwrap().rows_json;
    assert_eq!(
        rows, r#"[{"endpoint":"kpi","runs":3}]"#,
        "the old record is past the retention; project 2's is not here"
    );
    let two = engine.execute(project(2), &sql, &Default::default(), 10, 0).await.unwrap().rows_json;
    assert_eq!(two, r#"[{"endpoint":"secret","runs":1}]"#);
    assert!(log.records(project(1), "old", &all(10)).await.unwrap().is_empty());
    let tables = engine.tables(project(1)).await.unwrap();
    assert!(tables.iter().all(|t| t.name != "_logs"), "{tables:?}");

    // The old hour is deleted; the current one stays.
    let hours = || std::fs::read_dir(dir.join("projects/1/logs")).unwrap().count();
    assert_eq!(hours(), 2);
    log.maintain(now).await.unwrap();
    assert_eq!(hours(), 1);
    assert_eq!(log.records(project(1), "kpi", &all(10)).await.unwrap().len(), 3);
}

/// A record is in the files of the hour it began in, so only the files of an hour a range cuts through are
/// filtered by time: `_logs` (within the retention, which cuts through its oldest hour) and the readings of a
/// range count exactly the records in it, at its bounds too, across whole hours and cut ones, newest first.
#[tokio::test]
async fn only_an_hour_the_range_cuts_through_is_filtered_by_time() {
    use time::macros::datetime;
    let dir = temp_dir("run-log-cut");
    let clock = Arc::new(domain::testing::ManualClock::new(datetime!(2026-03-04 12:20:00 UTC)));
    let storage = Storage::local(&dir).unwrap().timed_by(clock);
    // The retention reaches back to 10:20: it cuts through the 10 o'clock hour; 11 and 12 are wholly inside.
    let retention = Duration::from_secs(2 * 3600);
    let log = ParquetRunLog::new(storage.clone(), LogSettings { retention, ..LogSettings::default() });
    let engine = engine_on(storage.clone()).await.with_log_retention(retention);
    let times = [
        datetime!(2026-03-04 10:19:59.999999 UTC),
        datetime!(2026-03-04 10:20:00 UTC),
        datetime!(2026-03-04 10:45:00 UTC),
        datetime!(2026-03-04 11:30:00 UTC),
        datetime!(2026-03-04 12:10:00 UTC),
    ];
    for (n, at) in (0..).zip(times) {
        log.record(record(1, "kpi", at, n * 2));
    }
    log.flush().await.unwrap();
    let sql = |text: &str| query(text, json!({}));
    let rows = |text: &str| {
        let engine = engine.clone();
        let sql = sql(text);
        async move { engine.execute(project(1), &sql, &Default::default(), 10, 0).await.unwrap().rows_json }
    };
    assert_eq!(
        rows("SELECT count(*) AS n FROM _logs").await,
        r#"[{"n":4}]"#,
        "10:19:59 is past the retention"
    );
    assert_eq!(rows("SELECT count(*) AS n FROM _logs WHERE endpoint = 'kpi'").await, r#"[{"n":4}]"#);
    assert_eq!(
        rows("SELECT sum(runs) AS n FROM _logs").await,
        r#"[{"n":4}]"#,
        "each record stands for one run"
    );
    assert_eq!(
        rows("SELECT CAST(at AS VARCHAR) AS at FROM _logs ORDER BY at DESC LIMIT 2").await,
        r#"[{"at":"2026-03-04T12:10:00Z"},{"at":"2026-03-04T11:30:00Z"}]"#
    );
    assert_eq!(
        rows("SELECT CAST(min(at) AS VARCHAR) AS at FROM _logs").await,
        r#"[{"at":"2026-03-04T10:20:00Z"}]"#,
        "the retention's bound is in"
    );

    let between = |since, until| LogFilter { since: Some(since), until: Some(until), ..all(10) };
    let at = |records: Vec<LogRecord>| records.iter().map(|r| r.at).collect::<Vec<_>>();
    // Cut at both ends (10:30 in the 10 o'clock hour, 11:30 in the 11 o'clock one; `until` is not in).
    let found =
        log.records(project(1), "kpi", &between(datetime!(2026-03-04 10:30 UTC), times[3])).await.unwrap();
    assert_eq!(at(found), [times[2]]);
    // Whole hours and a cut one: 11 and 12 whole, 10 cut by the retention.
    let found = log
        .records(project(1), "kpi", &between(datetime!(2026-03-04 9:00 UTC), datetime!(2026-03-04 13:00 UTC)))
        .await
        .unwrap();
    assert_eq!(at(found), [times[4], times[3], times[2], times[1]]);
    let usage = UsageQuery::new(
        Some(datetime!(2026-03-04 10:00 UTC)),
        Some(datetime!(2026-03-04 12:20 UTC)),
        Some(Interval::Hour),
        datetime!(2026-03-04 12:20 UTC),
    )
    .unwrap();
    let buckets = log.usage(project(1), "kpi", &usage).await.unwrap();
    let requests: Vec<u64> = buckets.iter().map(|b| b.requests).collect();
    assert_eq!(requests, [2, 1, 1], "10:20 and 10:45 in the 10 o'clock bucket, 10:19:59 past the retention");

    // A retention of whole hours (back to 10:00) cuts through none: `_logs` is its files, unfiltered.
    let plan = |retention| {
        let storage = storage.clone();
        async move {
            let ctx = crate::tables::catalog::empty_session(&storage, None, None).unwrap();
            run_log::register(&storage, &ctx, project(1), retention).await.unwrap();
            ctx.table(run_log::LOGS_TABLE).await.unwrap().logical_plan().display_indent().to_string()
        }
    };
    assert!(!plan(Duration::from_secs(8400)).await.contains("Filter"));
    let cut = plan(retention).await;
    assert!(cut.contains("Filter: ") && cut.contains(".at >= "), "{cut}");
}

/// The names of the log files of project 1's only hour, sorted.
fn hour_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let hours: Vec<_> = std::fs::read_dir(dir.join("projects/1/logs")).unwrap().collect();
    assert_eq!(hours.len(), 1);
    let mut files: Vec<_> =
        std::fs::read_dir(hours[0].as_ref().unwrap().path()).unwrap().map(|f| f.unwrap().path()).collect();
    files.sort();
    files
}

fn level(file: &std::path::Path) -> String {
    file.file_name().unwrap().to_str().unwrap().split('_').nth(1).unwrap().to_owned()
}

/// A file's rows, as (endpoint, at) pairs in the file's order.
fn rows_of(file: &std::path::Path) -> Vec<(String, i64)> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::TimestampMicrosecondType;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(file).unwrap()).unwrap();
    let mut rows = Vec::new();
    for batch in reader.build().unwrap() {
        let batch = batch.unwrap();
        let endpoint = batch.column_by_name("endpoint").unwrap().as_string::<i32>();
        let at = batch.column_by_name("at").unwrap().as_primitive::<TimestampMicrosecondType>();
        rows.extend((0..batch.num_rows()).map(|i| (endpoint.value(i).to_owned(), at.value(i))));
    }
    rows
}

/// Merges go by levels: eight flushed files become one, eight of those one more, and the records read the same
/// at every step; a record is written again once per level, an hour keeps a few files, and every file's rows
/// are in order (by endpoint, then time) however many files were merged into it.
#[tokio::test]
async fn merges_go_by_levels_and_lose_nothing() {
    let dir = temp_dir("run-log-levels");
    let log = ParquetRunLog::new(Storage::local(&dir).unwrap(), LogSettings::default());
    // Ahead of now, so that the hour never closes while the test runs (a closed hour is merged whole).
    let start = within_one_hour(now() + time::Duration::minutes(10), 130);
    let mut n = 0;
    for round in 1..=8 {
        for _ in 0..8 {
            // Two endpoints in every flush: a file's rows are "alpha"'s, then "kpi"'s.
            log.record(record(1, "kpi", start + time::Duration::seconds(n as i64), n));
            log.record(record(1, "alpha", start + time::Duration::seconds(n as i64), n));
            n += 1;
            log.flush().await.unwrap();
        }
        // Past the grace: the merged files go at once, and what is left is what readers read.
        log.maintain(now() + LOG_MERGE_GRACE + time::Duration::SECOND).await.unwrap();
        log.maintain(now() + LOG_MERGE_GRACE * 2).await.unwrap();
        let files = hour_files(&dir);
        let levels: Vec<_> = files.iter().map(|file| level(file)).collect();
        if round < 8 {
            assert_eq!(levels, vec!["1".to_owned(); round], "{files:?}");
        } else {
            assert_eq!(levels, ["2"], "eight files of level 1 became one of level 2: {files:?}");
        }
        for file in &files {
            let rows = rows_of(file);
            assert!(rows.is_sorted(), "{file:?} is not sorted by endpoint and time: {rows:?}");
        }
        assert_eq!(log.records(project(1), "kpi", &all(1000)).await.unwrap().len() as u64, n);
        assert_eq!(log.records(project(1), "alpha", &all(1000)).await.unwrap().len() as u64, n);
    }
}

/// A flush is not held up by a merge: while a merge of the node's eight files waits for the storage (as a merge
/// at the lowest priority does under load), a flush writes its file; the merge covers the eight alone, the
/// ninth counts towards the next merge, and every record reads back once.
#[tokio::test]
async fn a_flush_goes_on_while_a_merge_waits_and_nothing_is_lost() {
    let store = Arc::new(crate::tests::Asked::default());
    let storage = Storage::from_store(Arc::clone(&store) as Arc<dyn object_store::ObjectStore>, "memory:///");
    let log = ParquetRunLog::new(storage, LogSettings::default());
    let start = within_one_hour(now() + time::Duration::minutes(10), 20);
    let at = |n: u64| start + time::Duration::seconds(n as i64);
    for n in 0..8 {
        log.record(record(1, "kpi", at(n), n));
        log.flush().await.unwrap();
    }
    store.hold_reads(true);
    let merging = tokio::spawn({
        let log = log.clone();
        async move { log.maintain(now()).await }
    });
    store.waiting.notified().await;
    log.record(record(1, "kpi", at(8), 8));
    let flushed = tokio::time::timeout(Duration::from_secs(60), log.flush()).await;
    assert_eq!(flushed.expect("a flush waited for the merge").unwrap(), 1);
    assert!(!merging.is_finished(), "the merge still waits for its reads");
    store.hold_reads(false);
    merging.await.unwrap().unwrap();

    let levels = || async {
        let mut levels: Vec<String> = object_store::ObjectStore::list(&store.inner, None)
            .map_ok(|meta| meta.location.filename().unwrap_or_default().split('_').nth(1).unwrap().to_owned())
            .try_collect()
            .await
            .unwrap();
        levels.sort();
        levels
    };
    // The eight merged are left for the grace; the ninth is on its own.
    assert_eq!(levels().await, [["0"; 9].as_slice(), &["1"]].concat());
    assert_eq!(log.records(project(1), "kpi", &all(100)).await.unwrap().len(), 9);
    // Past the grace: the merged files go, the ninth stays (one flush since the merge: no merge due).
    log.maintain(now() + LOG_MERGE_GRACE + time::Duration::SECOND).await.unwrap();
    assert_eq!(levels().await, ["0", "1"]);
    assert_eq!(log.records(project(1), "kpi", &all(100)).await.unwrap().len(), 9);
}

/// A merge takes eight files at a time, the oldest first: twenty flushed between two merges (a busy node flushes
/// as its buffers fill) become two files of the next level, each of eight consecutive flushes, and the newest
/// four stay for the next merge; every record reads back once.
#[tokio::test]
async fn a_merge_takes_eight_files_at_a_time() {
    let dir = temp_dir("run-log-eight");
    let log = ParquetRunLog::new(Storage::local(&dir).unwrap(), LogSettings::default());
    let start = within_one_hour(now() + time::Duration::minutes(10), 30);
    for n in 0..20 {
        log.record(record(1, "kpi", start + time::Duration::seconds(n as i64), n));
        log.flush().await.unwrap();
    }
    log.maintain(now() + LOG_MERGE_GRACE + time::Duration::SECOND).await.unwrap();
    log.maintain(now() + LOG_MERGE_GRACE * 2).await.unwrap();
    let mut names: Vec<String> = hour_files(&dir)
        .iter()
        .map(|file| file.file_name().unwrap().to_string_lossy().split_once('_').unwrap().1.to_owned())
        .collect();
    names.sort();
    let name = |level: u32, first: u64, last: u64| format!("{level}_{first:016x}_{last:016x}.parquet");
    let mut expected: Vec<String> = (16..20).map(|n| name(0, n, n)).collect();
    expected.extend([name(1, 0, 7), name(1, 8, 15)]);
    assert_eq!(names, expected);
    assert_eq!(log.records(project(1), "kpi", &all(100)).await.unwrap().len(), 20);
}

/// A closed hour's files become one, its runs of eight or more merged eight at a time first: twenty flushed
/// files are two of the next level and four, then one of the level after (a merge of the twenty at once would
/// have been of level 1).
#[tokio::test]
async fn a_closed_hours_files_become_one_eight_at_a_time() {
    let dir = temp_dir("run-log-closed");
    let log = ParquetRunLog::new(Storage::local(&dir).unwrap(), LogSettings::default());
    let start = within_one_hour(now() - time::Duration::hours(2), 30);
    for n in 0..20 {
        log.record(record(1, "kpi", start + time::Duration::seconds(n as i64), n));
        log.flush().await.unwrap();
    }
    log.maintain(now()).await.unwrap();
    log.maintain(now() + LOG_MERGE_GRACE * 2).await.unwrap();
    let files = hour_files(&dir);
    assert_eq!(files.iter().map(|file| level(file)).collect::<Vec<_>>(), ["2"], "{files:?}");
    assert_eq!(log.records(project(1), "kpi", &all(100)).await.unwrap().len(), 20);
}

/// A file of [`LogSettings::full_file`] bytes or more is never merged again: flushes keep merging into files
/// of the first level, each full, and none of the next; a closed hour's whole merge leaves them too.
#[tokio::test]
async fn full_files_are_merged_no_more() {
    let burst = |log: &ParquetRunLog, start: Timestamp, flush: u64| {
        for i in 0..400 {
            log.record(record(1, "kpi", start + time::Duration::milliseconds((flush * 400 + i) as i64), i));
        }
    };
    let start = within_one_hour(now() + time::Duration::minutes(10), 130);
    // One flush's file on its own, to size the test by: a merge of eight is more than one and a half of them.
    let sizing = temp_dir("run-log-full-sizing");
    let one = ParquetRunLog::new(Storage::local(&sizing).unwrap(), LogSettings::default());
    burst(&one, start, 0);
    one.flush().await.unwrap();
    let flushed = std::fs::metadata(&hour_files(&sizing)[0]).unwrap().len();
    let dir = temp_dir("run-log-full");
    let settings = LogSettings { full_file: flushed * 3 / 2, ..LogSettings::default() };
    let log = ParquetRunLog::new(Storage::local(&dir).unwrap(), settings);
    for flush in 0..64 {
        burst(&log, start, flush);
        log.flush().await.unwrap();
        if flush % 8 == 7 {
            log.maintain(now() + LOG_MERGE_GRACE * 2).await.unwrap();
        }
    }
    log.maintain(now() + LOG_MERGE_GRACE * 3).await.unwrap();
    let files = hour_files(&dir);
    let levels: Vec<_> = files.iter().map(|file| level(file)).collect();
    assert_eq!(levels, vec!["1".to_owned(); 8], "{files:?}");
    assert!(files.iter().all(|file| std::fs::metadata(file).unwrap().len() >= settings.full_file));
    // The hour closed: nothing to merge into one, as every file is full.
    log.maintain(start + time::Duration::hours(2)).await.unwrap();
    log.maintain(start + time::Duration::hours(2) + LOG_MERGE_GRACE * 2).await.unwrap();
    assert_eq!(hour_files(&dir).len(), 8);
    let since = start - time::Duration::HOUR;
    let query = UsageQuery::new(Some(since), Some(start + time::Duration::HOUR), Some(Interval::Hour), now());
    let usage = log.usage(project(1), "kpi", &query.unwrap()).await.unwrap();
    // Every record once (a tenth of them refreshes, which usage leaves out).
    assert_eq!(usage.iter().map(|bucket| bucket.requests).sum::<u64>(), 64 * 360);
    // Merges ran on their own thread at the lowest priority (nice 19), and flushes sorted and encoded on one just
    // below the requests' (nice 10).
    let merges = niceness_of_threads("run-log-merge");
    assert!(!merges.is_empty() && merges.iter().all(|nice| *nice == 19), "{merges:?}");
    let flushes = niceness_of_threads("run-log-flush");
    assert!(!flushes.is_empty() && flushes.iter().all(|nice| *nice == 10), "{flushes:?}");
}

/// The niceness of each of this process's threads named `name`.
fn niceness_of_threads(name: &str) -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| {
            let task = task.ok()?.path();
            let comm = std::fs::read_to_string(task.join("comm")).ok()?;
            let stat = std::fs::read_to_string(task.join("stat")).ok()?;
            // The fields after the name: the nice value is the 19th of the line, the 17th of these.
            let nice = stat.rsplit_once(") ")?.1.split_whitespace().nth(16)?.parse().ok()?;
            (comm.trim() == name).then_some(nice)
        })
        .collect()
}

/// A table written under the name `_logs` before the run log existed stays that project's `_logs` (its rows
/// are kept and read as they were); no new table may take the name.
#[tokio::test]
async fn a_table_named_logs_from_before_stays_and_no_new_one_takes_the_name() {
    let dir = temp_dir("run-log-legacy");
    let legacy = dir.join("projects/3/tables/_logs");
    std::fs::create_dir_all(&legacy).unwrap();
    super::tests::write_events(&legacy.join("part-0.parquet"), &[("US", 10), ("FR", 20)]);
    let storage = Storage::local(&dir).unwrap();
    let engine = engine_on(storage.clone()).await;
    assert_eq!(engine.upgrade_tables().await.unwrap().converted, vec!["3/_logs".to_owned()]);
    let sum = query("SELECT sum(revenue) AS total FROM _logs", json!({}));
    let rows = engine.execute(project(3), &sum, &Default::default(), 10, 0).await.unwrap().rows_json;
    assert_eq!(rows, r#"[{"total":30}]"#);
    assert!(engine.tables(project(3)).await.unwrap().iter().any(|t| t.name == "_logs"));

    let csv = dir.join("rows.csv");
    std::fs::write(&csv, "a\n1\n").unwrap();
    let imported = crate::tables::imports::import_files(
        &storage,
        project(1),
        "_logs",
        &[csv],
        None,
        crate::tables::imports::ImportMode::Replace,
        &|_| {},
    )
    .await;
    assert!(
        matches!(imported, Err(crate::tables::imports::ImportError::InvalidTableName(_))),
        "{imported:?}"
    );
}

/// A flush that cannot write one project's file writes the others' and keeps that project's records for the
/// next flush, which writes them once the storage takes them: none lost, none twice.
#[tokio::test]
async fn a_failed_flush_keeps_what_it_could_not_write_for_the_next() {
    let dir = temp_dir("run-log-fail");
    let log = ParquetRunLog::new(Storage::local(&dir).unwrap(), LogSettings::default());
    let start = within_one_hour(now() - time::Duration::seconds(100), 10);
    let (ones, twos): (Vec<_>, Vec<_>) = (0..6_u64)
        .map(|n| record(if n < 3 { 1 } else { 2 }, "kpi", start + time::Duration::seconds(n as i64), n))
        .partition(|r| r.project == project(1));
    // A file where project 2's log directory would be: its files cannot be written.
    std::fs::create_dir_all(dir.join("projects/2")).unwrap();
    std::fs::write(dir.join("projects/2/logs"), b"in the way").unwrap();
    for r in ones.iter().chain(&twos) {
        log.record(r.clone());
    }
    assert!(log.flush().await.is_err(), "project 2's file cannot be written");
    let newest_first = |records: &[LogRecord]| {
        let mut records = records.to_vec();
        records.sort_by(|a, b| b.at.cmp(&a.at).then(b.id.cmp(&a.id)));
        records
    };
    assert_eq!(log.records(project(1), "kpi", &all(100)).await.unwrap(), newest_first(&ones));

    std::fs::remove_file(dir.join("projects/2/logs")).unwrap();
    assert_eq!(log.flush().await.unwrap(), 3, "only the records kept back");
    assert_eq!(log.records(project(2), "kpi", &all(100)).await.unwrap(), newest_first(&twos));
    assert_eq!(log.records(project(1), "kpi", &all(100)).await.unwrap(), newest_first(&ones), "once");
}

/// A log whose records, taken on one thread, go to one buffer of 80 records (a project's share: 10), with its
/// settings and directory.
fn one_buffer_log(prefix: &str) -> (ParquetRunLog, LogSettings, crate::tests::TempDir) {
    let dir = temp_dir(prefix);
    let settings = LogSettings { buffered: 80 * 8, ..LogSettings::default() };
    (ParquetRunLog::new(Storage::local(&dir).unwrap(), settings), settings, dir)
}

/// A buffer filled to half its room asks for a flush at once (a node taking records faster than its flush
/// interval writes them before its buffers fill): once per filling, and again once the emptied buffer is half
/// full; with a flush each time, three times what a buffer holds go through it and none is dropped.
#[tokio::test]
async fn a_half_full_buffer_asks_for_a_flush_and_nothing_is_dropped() {
    use futures_util::FutureExt;
    let (log, _, _dir) = one_buffer_log("run-log-half-full");
    let start = within_one_hour(now() - time::Duration::minutes(10), 240);
    // Runs answered (a refused one past its project's share may be left out, sampled).
    let answered = |n: u64| LogRecord {
        status: 200,
        code: None,
        ..record(1, "kpi", start + time::Duration::seconds(n as i64), n)
    };
    let take = |n: u64| log.record(answered(n));
    let asked = || log.filling().now_or_never().is_some();
    (0..39).for_each(take);
    assert!(!asked(), "39 records of 80");
    take(39);
    assert!(asked(), "40 records of 80: a flush is due");
    assert!(!asked(), "asked once");
    let mut written = log.flush().await.unwrap();
    assert_eq!(written, 40);
    for n in 40..240 {
        take(n);
        if asked() {
            written += log.flush().await.unwrap();
        }
    }
    assert_eq!(written, 240, "a flush at every 40 records, none dropped");
    assert_eq!(log.records(project(1), "kpi", &all(1000)).await.unwrap().len(), 240);
}

#[tokio::test]
async fn a_project_flooding_the_log_drops_its_own_records_past_its_share_never_anothers() {
    // A project past its share of 10 stops at 70.
    let (log, _, _dir) = one_buffer_log("run-log-share");
    let start = within_one_hour(now() - time::Duration::seconds(100), 10);
    for n in 0..1000_u64 {
        log.record(record(1, "flood", start, n));
    }
    // Without shares the flood would have filled the buffer, and every record of the other project been lost.
    let quiet: Vec<LogRecord> = (0..10_u64).map(|n| record(2, "kpi", start, 10_000 + n)).collect();
    for r in &quiet {
        log.record(r.clone());
    }
    assert_eq!(
        log.flush().await.unwrap(),
        80,
        "the flood up to the last share, and every record of the other"
    );
    assert_eq!(log.records(project(2), "kpi", &all(100)).await.unwrap().len(), 10);
    assert_eq!(log.records(project(1), "flood", &all(100)).await.unwrap().len(), 70);
    // After a flush the share is the project's again.
    log.record(record(1, "flood", start, 5_000));
    assert_eq!(log.flush().await.unwrap(), 1);
}

/// Runs a project's rate limit refuses, flooding past its share of the buffer, are kept one in 64, each kept
/// one standing for those left out: the log holds a sixty-fourth of the flood, and usage counts all of it.
#[tokio::test]
async fn a_flood_of_refused_runs_is_sampled_past_the_projects_share_and_counted_in_full() {
    let (log, settings, _dir) = one_buffer_log("run-log-sample");
    let start = within_one_hour(now() - time::Duration::seconds(100), 10);
    let refused = |n: u64| LogRecord {
        kind: LogKind::Run,
        status: 429,
        code: Some("rate_limited".into()),
        rows: None,
        ..record(1, "flood", start, n)
    };
    let flood = 10 + 64 * 20;
    for n in 0..flood {
        log.record(refused(n));
    }
    // A run that is not refused is kept whole past the share.
    log.record(LogRecord { kind: LogKind::Run, ..record(1, "flood", start, 7) });
    assert_eq!(log.flush().await.unwrap(), 10 + 20 + 1);
    let kept = log.records(project(1), "flood", &all(100)).await.unwrap();
    let standing: Vec<u32> = kept.iter().map(|r| r.runs).filter(|runs| *runs > 1).collect();
    assert_eq!(standing, vec![64; 20], "each sample stands for 64 runs");
    let query = UsageQuery::new(
        Some(start - time::Duration::minutes(1)),
        Some(now() + time::Duration::SECOND),
        Some(Interval::Hour),
        now(),
    )
    .unwrap();
    let buckets = log.usage(project(1), "flood", &query).await.unwrap();
    assert_eq!(buckets.iter().map(|b| b.requests).sum::<u64>(), flood + 1, "usage counts every run");
    assert_eq!(buckets.iter().map(|b| b.errors).sum::<u64>(), flood);
    // Those left out since the last sample wait for the next one, across flushes: 53 left out here, and 54
    // more in the next second, of which the 64th is kept for them.
    for n in 0..63 {
        log.record(refused(n));
    }
    assert_eq!(log.flush().await.unwrap(), 10, "the share, after a flush");
    for n in 0..64 {
        log.record(refused(n));
    }
    assert_eq!(log.flush().await.unwrap(), 10 + 1);
    let buckets = log.usage(project(1), "flood", &query).await.unwrap();
    assert_eq!(buckets.iter().map(|b| b.requests).sum::<u64>(), flood + 1 + 10 + 10 + 64, "43 still wait");

    // Files written before records had `runs` read as one run each.
    let older = temp_dir("run-log-older");
    let log = ParquetRunLog::new(Storage::local(&older).unwrap(), settings);
    for n in 0..3 {
        log.record(refused(n));
    }
    log.flush().await.unwrap();
    let hour = std::fs::read_dir(older.join("projects/1/logs")).unwrap().next().unwrap().unwrap().path();
    let file = std::fs::read_dir(hour).unwrap().next().unwrap().unwrap().path();
    without_runs(&file);
    assert!(log.records(project(1), "flood", &all(10)).await.unwrap().iter().all(|r| r.runs == 1));
    let buckets = log.usage(project(1), "flood", &query).await.unwrap();
    assert_eq!(buckets.iter().map(|b| b.requests).sum::<u64>(), 3);
    let engine = engine_on(Storage::local(&older).unwrap()).await;
    let sql = crate::tests::query("SELECT sum(runs) AS runs, count(runs) AS records FROM _logs", json!({}));
    let rows = engine.execute(project(1), &sql, &Default::default(), 10, 0).await.unwrap().rows_json;
    assert_eq!(rows, r#"[{"runs":3,"records":3}]"#, "in SQL too");
}

/// Rewrites a log file as a release before `runs` wrote it: without that column.
fn without_runs(file: &std::path::Path) {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(file).unwrap()).unwrap();
    let batches: Vec<_> = reader.build().unwrap().map(Result::unwrap).collect();
    let columns: Vec<usize> = (0..batches[0].num_columns() - 1).collect();
    let older: Vec<_> = batches.iter().map(|batch| batch.project(&columns).unwrap()).collect();
    assert!(older[0].schema().column_with_name("runs").is_none());
    let mut writer = datafusion::parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(file).unwrap(),
        older[0].schema(),
        None,
    )
    .unwrap();
    for batch in &older {
        writer.write(batch).unwrap();
    }
    writer.close().unwrap();
}

/// A node that stopped (a restart draws a new name) leaves its last hour unmerged: an hour after the hour ended,
/// another node merges those files into one under the stopped node's name, and deletes them after the grace;
/// no record is lost or doubled, and an hour with nothing left over is not listed again.
#[tokio::test]
async fn the_files_a_stopped_node_left_are_merged_by_another_and_nothing_is_lost() {
    let dir = temp_dir("run-log-left-over");
    let storage = Storage::local(&dir).unwrap();
    let stopped = ParquetRunLog::new(storage.clone(), LogSettings::default());
    let start = within_one_hour(now() - time::Duration::hours(3), 10);
    for n in 0..5 {
        stopped.record(record(1, "kpi", start + time::Duration::seconds(n as i64), n));
        stopped.flush().await.unwrap();
    }
    drop(stopped);
    let left = hour_files(&dir);
    assert_eq!(left.len(), 5, "one file per flush: {left:?}");
    let node = |file: &std::path::Path| {
        file.file_name().unwrap().to_str().unwrap().split('_').next().unwrap().to_owned()
    };

    let other = ParquetRunLog::new(storage, LogSettings::default());
    let ended = start.replace_time(time::Time::from_hms(start.hour(), 0, 0).unwrap()) + time::Duration::HOUR;
    // Within an hour of its end the stopped node might still be merging: left alone.
    other.maintain(ended + time::Duration::minutes(30)).await.unwrap();
    assert_eq!(hour_files(&dir), left);
    // Later: one file of the stopped node's name holds the five; they stay for the grace, then go.
    other.maintain(now()).await.unwrap();
    let files = hour_files(&dir);
    assert_eq!(files.len(), 6, "{files:?}");
    assert!(files.iter().all(|file| node(file) == node(&left[0])), "{files:?}");
    assert_eq!(other.records(project(1), "kpi", &all(100)).await.unwrap().len(), 5);
    other.maintain(now() + PRUNE_EVERY + LOG_MERGE_GRACE).await.unwrap();
    let files = hour_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!((level(&files[0]), node(&files[0])), ("1".to_owned(), node(&left[0])));
    let records = other.records(project(1), "kpi", &all(100)).await.unwrap();
    assert_eq!(records.len(), 5, "{records:?}");
    other.maintain(now() + PRUNE_EVERY * 2 + LOG_MERGE_GRACE * 2).await.unwrap();
    assert_eq!(hour_files(&dir), files);
}
