//! The refresh side of materialization: claiming due refreshes, computing and switching to a new stored result,
//! and sweeping files that no record refers to. A worker (in the binary) drives it on a timer.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::model::{attempt_location, Claim, Eligibility, Stored, StoredResult, Switch};
use super::ports::{MaterializationRecords, ResultStorage};
use crate::clock::Clock;
use crate::endpoints::EndpointChanges;
use crate::error::{Error, Invalid};
use crate::logs::{LogKind, LogRecord, NoRunLog, RunLog};
use crate::query::QueryEngine;
use uuid::Uuid;

/// How long a failed refresh waits before it is tried again, at most (a shorter sync frequency wins).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(300);

/// What one refresh came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefreshOutcome {
    /// The whole result was computed again.
    Completed {
        rows: u64,
    },
    /// The rows appended since the previous result were folded into it: `added` rows more, `rows` in all.
    Folded {
        added: u64,
        rows: u64,
    },
    Failed {
        error: String,
    },
    /// The claim was lost on the way (endpoint deleted or changed, materialization turned off, lease taken
    /// over); what was written was removed.
    Lost,
}

/// What refreshing works through.
pub struct RefreshDeps {
    /// The records claimed and switched; a claim carries what a refresh reads of the store.
    pub states: Arc<dyn MaterializationRecords>,
    /// Plans a version saved before its eligibility was recorded.
    pub engine: Arc<dyn QueryEngine>,
    pub results: Arc<dyn ResultStorage>,
    pub clock: Arc<dyn Clock>,
    /// Told of every endpoint whose stored result was switched, so runs cached from the one before go.
    pub changes: Arc<dyn EndpointChanges>,
    /// How long a claim holds without renewal.
    pub lease: Duration,
}

/// Refreshes stored results: claims due ones, computes and switches to them, sweeps what nothing refers to.
pub struct RefreshService {
    states: Arc<dyn MaterializationRecords>,
    engine: Arc<dyn QueryEngine>,
    results: Arc<dyn ResultStorage>,
    clock: Arc<dyn Clock>,
    changes: Arc<dyn EndpointChanges>,
    lease: Duration,
    log: Arc<dyn RunLog>,
}

impl RefreshService {
    pub fn new(deps: RefreshDeps) -> Self {
        let RefreshDeps { states, engine, results, clock, changes, lease } = deps;
        Self { states, engine, results, clock, changes, lease, log: Arc::new(NoRunLog) }
    }

    /// Records each refresh that completes, folds or fails in `log` (none are by default).
    #[must_use]
    pub fn with_log(mut self, log: Arc<dyn RunLog>) -> Self {
        self.log = log;
        self
    }

    /// How long a claim holds without renewal.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Claims up to `max` due refreshes.
    ///
    /// # Errors
    /// Store failures.
    pub async fn claim(&self, max: usize) -> Result<Vec<Claim>, Error> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let now = self.clock.now();
        Ok(self.states.claim_due(now, now + self.lease, max).await?)
    }

    /// Extends the claim's lease; `false` when it is no longer held.
    ///
    /// # Errors
    /// Store failures.
    pub async fn renew(&self, claim: &Claim) -> Result<bool, Error> {
        let until = self.clock.now() + self.lease;
        Ok(self.states.renew(claim.endpoint_id, claim.token, until).await?)
    }

    /// Gives a claim back unfinished (shutdown): its lease ends now, so any worker claims it again at once, and
    /// its files are removed.
    ///
    /// # Errors
    /// Store failures.
    pub async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.states.renew(claim.endpoint_id, claim.token, self.clock.now()).await?;
        self.discard(claim).await;
        Ok(())
    }

    /// Computes the claimed version's result into a new location and switches runs to it. A failure is recorded
    /// on the record (the previous result stays readable) and retried later.
    ///
    /// # Errors
    /// Store failures while recording the outcome.
    pub async fn refresh(&self, claim: &Claim) -> Result<RefreshOutcome, Error> {
        let at = self.clock.now();
        let started = std::time::Instant::now();
        let mut failure = None;
        let outcome = self.refresh_logged(claim, &mut failure).await;
        let (status, code, rows) = match (&outcome, failure) {
            (Ok(RefreshOutcome::Completed { rows } | RefreshOutcome::Folded { rows, .. }), _) => {
                (200, None, Some(*rows))
            }
            (Ok(RefreshOutcome::Failed { .. }), Some((code, status))) => (status, Some(code), None),
            // Lost claims did nothing a team needs to see; failures to record are the worker's to report.
            _ => return outcome,
        };
        self.log.record(LogRecord {
            id: Uuid::new_v4(),
            at,
            project: claim.project,
            endpoint: claim.name.as_str().to_owned(),
            version: Some(claim.version),
            kind: LogKind::Refresh,
            status,
            code: code.map(str::to_owned),
            duration: started.elapsed(),
            rows,
            bytes_read: None,
            source: None,
            credential: None,
            transport: None,
            request_id: None,
            runs: 1,
        });
        outcome
    }

    /// [`Self::refresh`], saying in `failure` the code and status of what a failed refresh failed with.
    async fn refresh_logged(
        &self,
        claim: &Claim,
        failure: &mut Option<(&'static str, u16)>,
    ) -> Result<RefreshOutcome, Error> {
        if let Some(abandoned) = &claim.abandoned {
            self.remove_quietly(claim, abandoned).await;
        }
        let target = attempt_location(claim.endpoint_id, claim.version, claim.token);
        // Every append answered before the tables are read is in the result.
        let data_as_of = self.clock.now();
        let stored = match self.compute(claim, &target).await {
            Ok(computed) => computed,
            Err(Error::NotFound(_)) => {
                self.discard(claim).await;
                return Ok(RefreshOutcome::Lost);
            }
            Err(err) => {
                self.discard(claim).await;
                *failure = Some(err.code_and_status());
                let error = failure_text(&err);
                let frequency = claim.sync_frequency.period().min(RETRY_AFTER_FAILURE);
                let held = self
                    .states
                    .fail(claim.endpoint_id, claim.token, error.clone(), self.clock.now() + frequency)
                    .await?;
                warn!(endpoint = %claim.name, project = %claim.project, cause = ?err, "materialization failed");
                return Ok(if held { RefreshOutcome::Failed { error } } else { RefreshOutcome::Lost });
            }
        };
        let at = self.clock.now();
        let (rows, added) = (stored.rows, stored.folded);
        let result = StoredResult {
            version: claim.version,
            location: target,
            row_count: rows,
            materialized_at: at,
            data_as_of,
            coverage: stored.coverage,
            fold: Some(stored.fold),
        };
        // A result that changes with time is due again within its freshness, appends or not.
        let period = match stored.changes_with_time {
            true => claim.sync_frequency.period().min(claim.freshness.effective()),
            false => claim.sync_frequency.period(),
        };
        let next = at + period;
        match self.states.complete(claim.endpoint_id, claim.token, result, next, added).await {
            Ok(Switch::Switched { replaced }) => {
                self.switched(claim);
                if let Some(old) = replaced {
                    self.remove_quietly(claim, &old).await;
                }
                Ok(match added {
                    Some(added) => {
                        debug!(endpoint = %claim.name, project = %claim.project, added, rows, "appended rows folded in");
                        RefreshOutcome::Folded { added, rows }
                    }
                    None => {
                        info!(endpoint = %claim.name, project = %claim.project, rows, "materialization completed");
                        RefreshOutcome::Completed { rows }
                    }
                })
            }
            Ok(Switch::Lost) => {
                self.discard(claim).await;
                Ok(RefreshOutcome::Lost)
            }
            Err(err) => {
                self.discard(claim).await;
                Err(err.into())
            }
        }
    }

    /// The claimed version's result at `target`: the result it held when claimed with the rows appended since
    /// folded in when it can be, else computed in full.
    async fn compute(&self, claim: &Claim, target: &str) -> Result<Stored, Error> {
        let eligibility = match &claim.eligibility {
            Some(eligibility) => eligibility.clone(),
            None => {
                Eligibility::decide(&self.engine.describe_queued(claim.project, &claim.query).await?.outline)
            }
        };
        if let Some(reason) = eligibility.reason() {
            return Err(Error::Invalid(Invalid::field("is_materialized", reason)));
        }
        // A result the engine told what of its tables it holds, so that the rows appended since can be folded in.
        let previous = claim.current.as_ref().filter(|r| r.version == claim.version && r.coverage.is_some());
        if let Some(previous) = previous {
            let folded = self.results.fold(claim.project, &claim.query, previous, target);
            match folded.await {
                Ok(stored) => return Ok(stored),
                // A failed fold leaves nothing at the target: the full refresh writes there.
                Err(err) => {
                    debug!(endpoint = %claim.name, project = %claim.project, reason = %err, "refreshing in full")
                }
            }
        }
        Ok(self.results.write(claim.project, &claim.query, target).await?)
    }

    /// Makes the runs cached from the result before stale here (the store's switch told the other processes).
    fn switched(&self, claim: &Claim) {
        self.changes.changed(claim.project, &claim.name);
    }

    /// Removes what an attempt wrote (there may be nothing).
    async fn discard(&self, claim: &Claim) {
        let target = attempt_location(claim.endpoint_id, claim.version, claim.token);
        self.remove_quietly(claim, &target).await;
    }

    async fn remove_quietly(&self, claim: &Claim, target: &str) {
        if let Err(err) = self.results.remove(claim.project, target).await {
            warn!(endpoint = %claim.name, location = target, error = %err, "cannot remove a stored result");
        }
    }

    /// Removes stored results no record refers to: left by a crash, or by a delete whose file removal failed.
    /// Locations are listed before records are read, so an attempt that starts in between is already recorded
    /// as running when its files are seen.
    ///
    /// # Errors
    /// Store or file failures.
    pub async fn sweep(&self) -> Result<usize, Error> {
        let present = self.results.locations().await?;
        let records = self.states.all().await?;
        let mut in_use: HashSet<String> = HashSet::new();
        for record in &records {
            if let Some(result) = &record.result {
                in_use.insert(result.location.clone());
            }
            if let Some((token, _)) = record.lease {
                in_use.insert(attempt_location(record.endpoint_id, record.version, token));
            }
        }
        let mut removed = 0;
        for (project, found) in present {
            if in_use.contains(&found) {
                continue;
            }
            match self.results.remove(project, &found).await {
                Ok(()) => removed += 1,
                Err(err) => warn!(location = %found, error = %err, "cannot sweep a stored result"),
            }
        }
        if removed > 0 {
            info!(removed, "swept stored results no record refers to");
        }
        Ok(removed)
    }
}

/// The kind of the file system error behind a failure, if one is in its chain of causes: the innermost, since
/// writers wrap the operating system's error in I/O errors of their own (of kind "other").
fn storage_failure(err: &Error) -> Option<std::io::ErrorKind> {
    let mut kind = None;
    let mut cause = std::error::Error::source(err);
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            kind = Some(io.kind());
            // An I/O error's `source` skips the error it wraps; that error may carry the real kind.
            if let Some(inner) = io.get_ref() {
                cause = Some(inner as &(dyn std::error::Error + 'static));
                continue;
            }
        }
        cause = current.source();
    }
    kind
}

/// What the status shows of a failure: the reason, without internals.
fn failure_text(err: &Error) -> String {
    match err {
        Error::Invalid(invalid) => invalid.detail.clone(),
        Error::QueryTimeout(after) => format!("The query ran past its time limit ({}s).", after.as_secs()),
        Error::QueryMemoryLimit(reason) => format!("The query needed more memory than allowed: {reason}"),
        Error::Unavailable(_) => "The store or engine was unavailable; the refresh will be retried.".into(),
        _ => match storage_failure(err) {
            // The kind only ("no space left on device", "file too large", "permission denied"): never a path.
            Some(kind) => format!("The result could not be stored: {kind}."),
            None => "The refresh failed with an internal error; see the server log.".into(),
        },
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
