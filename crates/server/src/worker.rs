//! The background work of `serve`.
//!
//! The materialization worker claims due refreshes (a lease in the store, so processes sharing a database never
//! refresh the same materialization twice), runs a bounded number at once, renews their leases while they run,
//! sweeps orphaned files now and then, and gives unfinished claims back when the server stops.
//!
//! The table upkeep loop merges the small files of the tables this process appended to, one table at a time, and
//! forgets append keys past their window now and then.

use std::sync::Arc;
use std::time::Duration;

use domain::{Claim, CompactionOutcome, RefreshOutcome, RefreshService, TableMaintenance};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use crate::operations::WorkerMetrics;

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Refreshes this process runs at once; 0 runs none (another process refreshes).
    pub parallelism: usize,
    /// How often due refreshes are looked for.
    pub poll: Duration,
    /// How often stored results no record refers to are removed.
    pub sweep_every: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self { parallelism: 2, poll: Duration::from_millis(500), sweep_every: Duration::from_secs(600) }
    }
}

/// Runs until `stop` turns true, then gives back the claims still running and returns.
pub async fn run(
    materializer: Arc<RefreshService>,
    config: WorkerConfig,
    metrics: WorkerMetrics,
    clock: Arc<dyn domain::Clock>,
    mut stop: watch::Receiver<bool>,
) {
    let mut running: JoinSet<()> = JoinSet::new();
    let mut next_sweep = tokio::time::Instant::now();
    loop {
        while let Some(done) = running.try_join_next() {
            if let Err(err) = done {
                error!(error = %err, "a materialization refresh task failed");
            }
        }
        if tokio::time::Instant::now() >= next_sweep {
            if let Err(err) = materializer.sweep().await {
                warn!(error = %err, "could not sweep stored results; will retry");
            }
            next_sweep = tokio::time::Instant::now() + config.sweep_every;
        }
        let free = config.parallelism.saturating_sub(running.len());
        match materializer.claim(free).await {
            Ok(claims) => {
                let now = clock.now();
                for claim in claims {
                    debug!(endpoint = %claim.name, version = claim.version, "claimed a refresh");
                    let waited = claim
                        .due_at
                        .map_or(Duration::ZERO, |due| (now - due).try_into().unwrap_or(Duration::ZERO));
                    metrics.claimed(waited);
                    running.spawn(refresh(Arc::clone(&materializer), claim, metrics.clone(), stop.clone()));
                }
            }
            Err(err) => warn!(error = %err, "could not look for due materializations; will retry"),
        }
        tokio::select! {
            () = tokio::time::sleep(config.poll) => {}
            Some(done) = running.join_next(), if !running.is_empty() => {
                if let Err(err) = done {
                    error!(error = %err, "a materialization refresh task failed");
                }
            }
            _ = stop.changed() => break,
        }
    }
    // Each running refresh sees the stop too and gives its claim back; wait for that, within reason.
    let drained =
        tokio::time::timeout(Duration::from_secs(10), async { while running.join_next().await.is_some() {} })
            .await;
    if drained.is_err() {
        warn!("materialization refreshes did not stop in time; their leases will expire");
    }
}

/// One refresh, with its lease renewed every third of its length. A lost lease or a stop drops the work (which
/// cancels the engine's part) and removes what it wrote.
async fn refresh(
    materializer: Arc<RefreshService>,
    claim: Claim,
    metrics: WorkerMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let started = std::time::Instant::now();
    let mut work = Box::pin(materializer.refresh(&claim));
    let mut beat = tokio::time::interval(materializer.lease() / 3);
    beat.tick().await;
    loop {
        tokio::select! {
            outcome = &mut work => {
                metrics.ended(&outcome, started.elapsed());
                match outcome {
                    Ok(RefreshOutcome::Completed { rows }) => debug!(endpoint = %claim.name, rows, "refreshed"),
                    Ok(RefreshOutcome::Folded { added, rows }) => {
                        debug!(endpoint = %claim.name, added, rows, "appended rows folded in");
                    }
                    Ok(RefreshOutcome::Failed { .. }) => {}
                    Ok(RefreshOutcome::Lost) => info!(endpoint = %claim.name, "refresh abandoned: the endpoint changed"),
                    Err(err) => warn!(endpoint = %claim.name, error = %err, "could not record a refresh"),
                }
                return;
            }
            _ = beat.tick() => match materializer.renew(&claim).await {
                Ok(true) => {}
                Ok(false) => {
                    info!(endpoint = %claim.name, "refresh abandoned: its lease passed to another worker");
                    break;
                }
                Err(err) => warn!(endpoint = %claim.name, error = %err, "could not renew a lease; retrying"),
            },
            _ = stop.changed() => break,
        }
    }
    // Dropping the work cancels it before what it wrote is removed.
    drop(work);
    metrics.released();
    if let Err(err) = materializer.release(&claim).await {
        warn!(endpoint = %claim.name, error = %err, "could not give a refresh back; its lease will expire");
    }
}

/// One compaction, with the table's lease renewed every third of its length while it runs (a large merge can
/// take longer than a lease). A lease another process took meanwhile drops the compaction: nothing it wrote is
/// committed (its files are left to the vacuum). `None` when the server stops.
async fn compact_renewing(
    maintenance: &TableMaintenance,
    project: domain::ProjectId,
    table: &domain::TableName,
    stop: &mut watch::Receiver<bool>,
) -> Option<CompactionOutcome> {
    let mut work = std::pin::pin!(maintenance.compact(project, table));
    let mut beat = tokio::time::interval(maintenance.lease() / 3);
    beat.tick().await;
    loop {
        tokio::select! {
            outcome = &mut work => return Some(outcome),
            _ = beat.tick() => match maintenance.renew(project, table).await {
                Ok(true) => {}
                Ok(false) => {
                    info!(%project, %table, "compaction abandoned: its lease passed to another process");
                    return Some(CompactionOutcome::Leased);
                }
                Err(err) => warn!(%project, %table, error = %err, "could not renew a table's lease; retrying"),
            },
            _ = stop.changed() => return None,
        }
    }
}

/// How often append keys past their window are removed from the store.
const KEY_SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Every `every`, compacts the tables appended to since the last pass, until `stop` turns true. A compaction
/// under way when the server stops is cut off; the table is as it was and the next process compacts it.
pub async fn maintain_tables(
    maintenance: Arc<TableMaintenance>,
    every: Duration,
    metrics: WorkerMetrics,
    mut stop: watch::Receiver<bool>,
) {
    // Tables written before this process (the CLI's, an earlier release's) are laid out for their endpoints too.
    match maintenance.look_at_read_tables().await {
        Ok(count) => debug!(count, "looking at the tables endpoints read"),
        Err(err) => {
            warn!(error = %err, "cannot list the tables endpoints read; each is looked at when written")
        }
    }
    let mut ticks = ticks_of(every);
    let mut next_sweep = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return,
        }
        for (project, table) in maintenance.candidates() {
            let started = std::time::Instant::now();
            let Some(outcome) = compact_renewing(&maintenance, project, &table, &mut stop).await else {
                return;
            };
            metrics.compacted(&outcome, started.elapsed());
        }
        if tokio::time::Instant::now() >= next_sweep {
            match maintenance.forget_expired_keys().await {
                Ok(0) => {}
                Ok(count) => debug!(count, "forgot append keys past their window"),
                Err(err) => warn!(error = %err, "could not forget expired append keys; will retry"),
            }
            next_sweep = tokio::time::Instant::now() + KEY_SWEEP_EVERY;
        }
    }
}

/// A tick every `period`, the first at once; a tick missed (the work of the one before took longer) is delayed,
/// not made up for.
pub(crate) fn ticks_of(period: std::time::Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}
