use std::sync::{Arc, Mutex};
use std::time::Duration;

use mockall::predicate::{always, eq};
use serde_json::json;
use time::macros::datetime;
use uuid::Uuid;

use super::super::model::{Coverage, Fold, MaterializationState, MaterializationStatus};
use super::super::ports::{MockMaterializationRecords, MockResultStorage};
use super::*;
use crate::access::ProjectId;
use crate::clock::{MockClock, Timestamp};
use crate::endpoints::{EndpointName, Freshness, MockEndpointChanges, SyncFrequency};
use crate::error::EngineError;
use crate::query::{MockQueryEngine, Query};

const NOW: Timestamp = datetime!(2026-11-22 10:00 UTC);

/// What the engine says of a query that reads its table twice.
fn twice() -> Fold {
    Fold::FullRefreshOnly { reason: "the query reads `t` 2 times".into() }
}
const LEASE: Duration = Duration::from_secs(60);

fn claim() -> Claim {
    Claim {
        endpoint_id: Uuid::from_u128(1),
        project: ProjectId::new(4).unwrap(),
        name: EndpointName::parse("kpi").unwrap(),
        version: 3,
        sync_frequency: SyncFrequency::OneHour,
        freshness: Freshness::new(Some(60)).unwrap(),
        token: Uuid::from_u128(9),
        abandoned: None,
        due_at: None,
        query: Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT 1 AS n"})).unwrap(),
        eligibility: eligible(),
        current: None,
    }
}

fn target() -> String {
    attempt_location(Uuid::from_u128(1), 3, Uuid::from_u128(9))
}

fn eligible() -> Option<Eligibility> {
    Some(Eligibility::Eligible { filters: vec![], rollup: None })
}

/// Records what was removed, so each test can say exactly which files went.
fn results(write: Result<u64, ()>, removed: Arc<Mutex<Vec<String>>>) -> MockResultStorage {
    let mut results = MockResultStorage::new();
    results.expect_write().with(always(), always(), eq(target())).returning(move |_, _, _| {
        write
            .map(|rows| Stored {
                rows,
                folded: None,
                coverage: Some(Coverage("full".into())),
                changes_with_time: false,
                fold: twice(),
            })
            .map_err(|()| EngineError::InvalidQuery("Column 'x' not found".into()))
    });
    results.expect_remove().returning(move |_, location| {
        removed.lock().unwrap().push(location.to_owned());
        Ok(())
    });
    results
}

fn materializer(states: MockMaterializationRecords, results: MockResultStorage) -> RefreshService {
    let mut changes = MockEndpointChanges::new();
    changes.expect_changed().return_const(());
    materializer_telling(states, results, changes)
}

/// The refresh reads nothing of the store but its claim: the records answer only the calls a test expects.
fn materializer_telling(
    states: MockMaterializationRecords,
    results: MockResultStorage,
    changes: MockEndpointChanges,
) -> RefreshService {
    let mut clock = MockClock::new();
    clock.expect_now().return_const(NOW);
    RefreshService::new(RefreshDeps {
        states: Arc::new(states),
        engine: Arc::new(MockQueryEngine::new()),
        results: Arc::new(results),
        clock: Arc::new(clock),
        changes: Arc::new(changes),
        lease: LEASE,
    })
}

#[tokio::test]
async fn a_completed_refresh_switches_and_removes_the_replaced_result() {
    let removed = Arc::new(Mutex::new(Vec::new()));
    let mut states = MockMaterializationRecords::new();
    states
        .expect_complete()
        .withf(|id, token, result, next, folded| {
            *id == Uuid::from_u128(1)
                && *token == Uuid::from_u128(9)
                && *result
                    == StoredResult {
                        version: 3,
                        location: target(),
                        row_count: 42,
                        materialized_at: NOW,
                        data_as_of: NOW,
                        coverage: Some(Coverage("full".into())),
                        fold: Some(twice()),
                    }
                && *next == NOW + Duration::from_secs(3600)
                && folded.is_none()
        })
        .times(1)
        .returning(|_, _, _, _, _| Ok(Switch::Switched { replaced: Some("old".into()) }));
    // Runs cached here from the replaced result go (the store's switch tells the other processes).
    let kpi = EndpointName::parse("kpi").unwrap();
    let mut changes = MockEndpointChanges::new();
    changes.expect_changed().with(eq(ProjectId::new(4).unwrap()), eq(kpi)).times(1).return_const(());
    let m = materializer_telling(states, results(Ok(42), Arc::clone(&removed)), changes);
    assert_eq!(m.refresh(&claim()).await.unwrap(), RefreshOutcome::Completed { rows: 42 });
    assert_eq!(*removed.lock().unwrap(), vec!["old".to_owned()]);
}

/// A result whose query calls `now()` (or `random()`) is due again within its freshness, whether rows are
/// appended or not; others at their sync frequency.
#[tokio::test]
async fn a_result_that_changes_with_time_is_due_again_within_its_freshness() {
    for (changes_with_time, due_in) in [(true, 60), (false, 3600)] {
        let mut states = MockMaterializationRecords::new();
        states
            .expect_complete()
            .withf(move |_, _, _, next, _| *next == NOW + Duration::from_secs(due_in))
            .times(1)
            .returning(|_, _, _, _, _| Ok(Switch::Switched { replaced: None }));
        let mut results = MockResultStorage::new();
        results.expect_write().returning(move |_, _, _| {
            let coverage = Some(Coverage("full".into()));
            Ok(Stored { rows: 3, folded: None, coverage, changes_with_time, fold: twice() })
        });
        let m = materializer(states, results);
        assert_eq!(m.refresh(&claim()).await.unwrap(), RefreshOutcome::Completed { rows: 3 });
    }
}

#[tokio::test]
async fn a_claim_that_took_over_a_crashed_attempt_removes_its_files_first() {
    let removed = Arc::new(Mutex::new(Vec::new()));
    let mut states = MockMaterializationRecords::new();
    states.expect_complete().returning(|_, _, _, _, _| Ok(Switch::Switched { replaced: None }));
    let m = materializer(states, results(Ok(1), Arc::clone(&removed)));
    let crashed = attempt_location(Uuid::from_u128(1), 3, Uuid::from_u128(8));
    let claim = Claim { abandoned: Some(crashed.clone()), ..claim() };
    assert_eq!(m.refresh(&claim).await.unwrap(), RefreshOutcome::Completed { rows: 1 });
    assert_eq!(*removed.lock().unwrap(), vec![crashed]);
}

#[tokio::test]
async fn a_refresh_whose_claim_was_lost_removes_what_it_wrote() {
    let removed = Arc::new(Mutex::new(Vec::new()));
    let mut states = MockMaterializationRecords::new();
    states.expect_complete().times(1).returning(|_, _, _, _, _| Ok(Switch::Lost));
    let m = materializer(states, results(Ok(5), Arc::clone(&removed)));
    assert_eq!(m.refresh(&claim()).await.unwrap(), RefreshOutcome::Lost);
    assert_eq!(*removed.lock().unwrap(), vec![target()]);
}

#[tokio::test]
async fn a_failed_refresh_is_recorded_and_retried_within_five_minutes() {
    let removed = Arc::new(Mutex::new(Vec::new()));
    let mut states = MockMaterializationRecords::new();
    states
        .expect_fail()
        .withf(|_, _, error, next| error.contains("'x' not found") && *next == NOW + RETRY_AFTER_FAILURE)
        .times(1)
        .returning(|_, _, _, _| Ok(true));
    let m = materializer(states, results(Err(()), Arc::clone(&removed)));
    let outcome = m.refresh(&claim()).await.unwrap();
    assert!(matches!(outcome, RefreshOutcome::Failed { ref error } if error.contains("'x' not found")));
    assert_eq!(*removed.lock().unwrap(), vec![target()]);
}

#[tokio::test]
async fn a_query_that_became_ineligible_fails_without_writing() {
    let mut states = MockMaterializationRecords::new();
    states
        .expect_fail()
        .withf(|_, _, error, _| error.contains("LIMIT"))
        .times(1)
        .returning(|_, _, _, _| Ok(true));
    let mut results = MockResultStorage::new();
    results.expect_write().never();
    results.expect_remove().returning(|_, _| Ok(()));
    let ineligible = Some(Eligibility::Ineligible { reason: "The query has an outermost LIMIT".into() });
    let m = materializer(states, results);
    let claim = Claim { eligibility: ineligible, ..claim() };
    assert!(matches!(m.refresh(&claim).await.unwrap(), RefreshOutcome::Failed { .. }));
}

#[tokio::test]
async fn claims_are_leased_from_now() {
    let mut states = MockMaterializationRecords::new();
    states
        .expect_claim_due()
        .with(eq(NOW), eq(NOW + LEASE), eq(2))
        .times(1)
        .returning(|_, _, _| Ok(vec![claim()]));
    let m = materializer(states, MockResultStorage::new());
    assert_eq!(m.claim(2).await.unwrap(), vec![claim()]);
    assert!(m.claim(0).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_sweep_removes_only_locations_no_record_refers_to() {
    let project = ProjectId::new(4).unwrap();
    let id = Uuid::from_u128(1);
    let completed = attempt_location(id, 2, Uuid::from_u128(5));
    let running = attempt_location(id, 3, Uuid::from_u128(6)); // the lease's attempt: kept
    let orphan = attempt_location(id, 3, Uuid::from_u128(7));
    let deleted_endpoint = attempt_location(Uuid::from_u128(2), 1, Uuid::from_u128(8));
    let removed = Arc::new(Mutex::new(Vec::new()));
    let mut results = MockResultStorage::new();
    let present = [completed.clone(), running.clone(), orphan.clone(), deleted_endpoint.clone()];
    results.expect_locations().returning(move || Ok(present.iter().map(|l| (project, l.clone())).collect()));
    let sink = Arc::clone(&removed);
    results.expect_remove().returning(move |_, location| {
        sink.lock().unwrap().push(location.to_owned());
        Ok(())
    });
    let mut states = MockMaterializationRecords::new();
    let record = MaterializationState {
        endpoint_id: id,
        version: 3,
        status: MaterializationStatus::Running,
        next_run_at: NOW,
        error: None,
        result: Some(StoredResult {
            version: 2,
            location: completed,
            row_count: 1,
            materialized_at: NOW,
            data_as_of: NOW,
            coverage: None,
            fold: None,
        }),
        lease: Some((Uuid::from_u128(6), NOW + LEASE)),
        appended_since: None,
        full_refreshes: 1,
        last_folded_at: None,
        rows_folded: 0,
    };
    states.expect_all().returning(move || Ok(vec![record.clone()]));
    let m = materializer(states, results);
    assert_eq!(m.sweep().await.unwrap(), 2);
    let mut removed = removed.lock().unwrap().clone();
    removed.sort();
    let mut expected = vec![orphan, deleted_endpoint];
    expected.sort();
    assert_eq!(removed, expected);
}

#[test]
fn a_storage_failure_is_reported_by_its_kind_and_other_failures_without_internals() {
    let full = Error::Internal(Box::new(std::io::Error::from(std::io::ErrorKind::StorageFull)));
    assert_eq!(super::failure_text(&full), "The result could not be stored: no storage space.");
    // A writer that wraps the operating system's error in one of its own: the innermost kind is the one told.
    let wrapped = std::io::Error::other(std::io::Error::from(std::io::ErrorKind::FileTooLarge));
    let wrapped = Error::Internal(Box::new(wrapped));
    assert_eq!(super::failure_text(&wrapped), "The result could not be stored: file too large.");
    let other = Error::Internal("/secret/path: parquet footer is corrupt".into());
    assert_eq!(super::failure_text(&other), "The refresh failed with an internal error; see the server log.");
}

/// A claim of a record whose completed result of version 3 holds 40 rows and says what of its tables it read.
fn claim_with_result() -> Claim {
    let current = StoredResult {
        version: 3,
        location: "previous".into(),
        row_count: 40,
        materialized_at: NOW,
        data_as_of: NOW,
        coverage: Some(Coverage("read".into())),
        fold: Some(Fold::Incremental),
    };
    Claim { current: Some(current), ..claim() }
}

#[tokio::test]
async fn rows_appended_since_the_result_are_folded_into_it() {
    let mut states = MockMaterializationRecords::new();
    states
        .expect_complete()
        .withf(|_, _, result, _, folded| {
            (result.row_count, &result.location, result.coverage.as_ref(), result.fold.as_ref(), *folded)
                == (45, &target(), Some(&Coverage("folded".into())), Some(&Fold::Incremental), Some(5))
        })
        .times(1)
        .returning(|_, _, _, _, _| Ok(Switch::Switched { replaced: Some("previous".into()) }));
    let removed = Arc::new(Mutex::new(Vec::new()));
    let mut results = MockResultStorage::new();
    results
        .expect_fold()
        .withf(|_, _, from, to| {
            let read = Coverage("read".into());
            (from.location.as_str(), from.coverage.as_ref(), to)
                == ("previous", Some(&read), target().as_str())
        })
        .times(1)
        .returning(|_, _, _, _| {
            // 40 rows before, 5 added.
            Ok(Stored {
                rows: 45,
                folded: Some(5),
                coverage: Some(Coverage("folded".into())),
                changes_with_time: false,
                fold: Fold::Incremental,
            })
        });
    results.expect_write().never();
    let sink = Arc::clone(&removed);
    results.expect_remove().returning(move |_, location| {
        sink.lock().unwrap().push(location.to_owned());
        Ok(())
    });
    let m = materializer(states, results);
    assert_eq!(m.refresh(&claim_with_result()).await.unwrap(), RefreshOutcome::Folded { added: 5, rows: 45 });
    assert_eq!(*removed.lock().unwrap(), vec!["previous".to_owned()]);
}

#[tokio::test]
async fn rows_that_cannot_be_folded_in_are_refreshed_in_full() {
    let mut states = MockMaterializationRecords::new();
    states
        .expect_complete()
        .withf(|_, _, result, _, folded| (result.row_count, *folded) == (42, None))
        .times(1)
        .returning(|_, _, _, _, _| Ok(Switch::Switched { replaced: None }));
    let mut results = results(Ok(42), Arc::new(Mutex::new(Vec::new())));
    results
        .expect_fold()
        .times(1)
        .returning(|_, _, _, _| Err(EngineError::InvalidQuery("both tables changed".into())));
    let m = materializer(states, results);
    assert_eq!(m.refresh(&claim_with_result()).await.unwrap(), RefreshOutcome::Completed { rows: 42 });
}

/// The record's result is of the version before, or does not say what of its tables it holds: nothing to fold
/// into, the new version's result is computed in full.
#[tokio::test]
async fn a_result_of_another_version_or_without_coverage_is_refreshed_in_full() {
    let before = claim_with_result().current.unwrap();
    let unknown = StoredResult { coverage: None, ..before.clone() };
    for current in [StoredResult { version: 2, ..before }, unknown] {
        let mut states = MockMaterializationRecords::new();
        states
            .expect_complete()
            .withf(|_, _, result, _, folded| (result.row_count, *folded) == (42, None))
            .times(1)
            .returning(|_, _, _, _, _| Ok(Switch::Switched { replaced: Some("previous".into()) }));
        let mut results = results(Ok(42), Arc::new(Mutex::new(Vec::new())));
        results.expect_fold().never();
        let m = materializer(states, results);
        let claim = Claim { current: Some(current), ..claim() };
        assert_eq!(m.refresh(&claim).await.unwrap(), RefreshOutcome::Completed { rows: 42 });
    }
}

/// A log that keeps what it is given.
fn kept_log() -> (Arc<Mutex<Vec<crate::logs::LogRecord>>>, crate::logs::MockRunLog) {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let mut log = crate::logs::MockRunLog::new();
    let into = Arc::clone(&kept);
    log.expect_record().returning(move |record| into.lock().unwrap().push(record));
    (kept, log)
}

#[tokio::test]
async fn completed_and_failed_refreshes_are_logged_and_lost_ones_are_not() {
    let (kept, log) = kept_log();
    let log: Arc<dyn RunLog> = Arc::new(log);
    let mut states = MockMaterializationRecords::new();
    states.expect_complete().times(1).returning(|_, _, _, _, _| Ok(Switch::Switched { replaced: None }));
    let removed = Arc::new(Mutex::new(Vec::new()));
    let m = materializer(states, results(Ok(42), Arc::clone(&removed))).with_log(Arc::clone(&log));
    m.refresh(&claim()).await.unwrap();
    let mut states = MockMaterializationRecords::new();
    states.expect_fail().returning(|_, _, _, _| Ok(true));
    let m = materializer(states, results(Err(()), Arc::clone(&removed))).with_log(Arc::clone(&log));
    m.refresh(&claim()).await.unwrap();
    let mut states = MockMaterializationRecords::new();
    states.expect_complete().returning(|_, _, _, _, _| Ok(Switch::Lost));
    let m = materializer(states, results(Ok(5), removed)).with_log(log);
    assert_eq!(m.refresh(&claim()).await.unwrap(), RefreshOutcome::Lost);

    let kept = kept.lock().unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let (done, failed) = (&kept[0], &kept[1]);
    assert_eq!(
        (done.kind, done.status, done.rows, done.code.as_deref()),
        (crate::logs::LogKind::Refresh, 200, Some(42), None)
    );
    assert_eq!((done.endpoint.as_str(), done.version, done.at, done.transport), ("kpi", Some(3), NOW, None));
    assert_eq!((failed.status, failed.code.as_deref(), failed.rows), (400, Some("invalid"), None));
}
