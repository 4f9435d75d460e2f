//! Admission: everything a query takes from the process, in one place, and one answer when its project has no
//! room for it.
//!
//! A query of a project takes, in this order:
//! - one of its project's **slots** ([`EngineLimits::max_concurrent_per_project`]) for as long as it plans and
//!   computes. Runs, dry runs (planning), exports, reads of stored results and of the run log take one at
//!   once or are refused with [`EngineError::Busy`] (429 with `Retry-After`), so a full project is told so the
//!   same way whatever it asked for. The service's own planning (an endpoint planned again after its table
//!   was replaced, the readers of a written table, a refresh of a version saved before its plan's facts were
//!   recorded) waits for one instead, within the query timeout, so that a busy project delays it rather than
//!   losing it. Refreshes and folds take none: holding the project's slots, they answered its own runs 429
//!   (their cores are shared through the turns below, their memory through the pool).
//! - its **turns** on the engine's cores among every project's queries ([`fair`]) while it executes;
//! - its **memory**, within its own limit and what every query holds together ([`QueryPool`]);
//! - for an export, its page's size of the **spool** once written: the slot is given back and the page's file
//!   waits for its reader holding disk, never the project's queries ([`Spool`]).
//!
//! Per-project state is kept only for the projects that hold or wait for something ([`ProjectSemaphores`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::GreedyMemoryPool;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use domain::{EngineError, ProjectId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::execute::{EngineLimits, FileCaches};
use crate::fair::{FairScheduler, Held};
use crate::memory::QueryPool;

/// One of a project's query slots, held while its query plans and computes.
pub(crate) type Slot = OwnedSemaphorePermit;

/// An export's room in the spool, held until its body is sent: its project's share and the process's.
pub(crate) type Room = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// The engine's one admission controller (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Admission {
    retry_after: Duration,
    memory_limit: usize,
    slots: Mutex<ProjectSemaphores>,
    spool: Spool,
    /// The memory every query holds together, within `limits.server_memory`.
    memory: Arc<GreedyMemoryPool>,
    /// The turns of every project's queries on the engine's cores.
    fair: Arc<FairScheduler>,
}

impl Admission {
    pub(crate) fn new(limits: &EngineLimits) -> Self {
        Self {
            retry_after: limits.retry_after,
            memory_limit: limits.memory_limit,
            slots: Mutex::new(ProjectSemaphores::new(limits.max_concurrent_per_project)),
            spool: Spool::new(limits),
            memory: Arc::new(GreedyMemoryPool::new(limits.server_memory)),
            fair: FairScheduler::per_core(),
        }
    }

    fn busy(&self) -> EngineError {
        EngineError::Busy { retry_after: self.retry_after }
    }

    fn slots_of(&self, project: ProjectId) -> Arc<Semaphore> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner).of(project)
    }

    /// One of `project`'s slots now, for work a caller waits for; [`EngineError::Busy`] when all are taken.
    pub(crate) fn enter(&self, project: ProjectId) -> Result<Slot, EngineError> {
        self.slots_of(project).try_acquire_owned().map_err(|_| self.busy())
    }

    /// One of `project`'s slots once one is free, for the service's own work that a busy project delays rather
    /// than refuses (waiters take the slots in the order they came).
    pub(crate) async fn queue(&self, project: ProjectId) -> Result<Slot, EngineError> {
        // Never closed, so never refused.
        self.slots_of(project).acquire_owned().await.map_err(|e| EngineError::Internal(Box::new(e)))
    }

    /// A query's turns on the engine's cores, once it executes.
    pub(crate) fn turns(&self, project: ProjectId) -> Held {
        Held::new(self.fair.ticket(project))
    }

    /// A per-query runtime whose memory pool refuses allocations past the query's limit or past what every
    /// query holds together, sharing the engine's `files` caches.
    pub(crate) fn runtime(&self, files: &FileCaches) -> Result<Arc<RuntimeEnv>, EngineError> {
        // No spilling: a query over its memory limit fails with `query_memory_limit` instead of filling the disk.
        RuntimeEnvBuilder::new()
            .with_disk_manager_builder(DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled))
            .with_memory_pool(Arc::new(QueryPool::new(self.memory_limit, Arc::clone(&self.memory))))
            .with_cache_manager(files.config())
            .build_arc()
            .map_err(|e| EngineError::Internal(Box::new(e)))
    }

    /// Gives a written page's `slot` back and takes its `bytes` of the spool instead, until the returned room is
    /// dropped; [`EngineError::Busy`] when the pages being sent (the project's, or everyone's) leave too little
    /// now.
    pub(crate) fn spool(&self, project: ProjectId, bytes: u64, slot: Slot) -> Result<Room, EngineError> {
        drop(slot);
        self.spool.take(project, bytes).map_err(|()| self.busy())
    }

    /// The queries executing and waiting for a turn.
    #[cfg(test)]
    pub(crate) fn load(&self) -> (usize, usize) {
        self.fair.load()
    }

    /// How many projects' slots are kept.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner).semaphores.len()
    }
}

/// The room written pages take until their bodies are sent ([`EngineLimits::export_spool_bytes`]), in KiB: every
/// project's pages together, and one project's at most half of it (at least a page's worth), so that one
/// project's slow readers leave room for the others'.
#[derive(Debug)]
struct Spool {
    all: Arc<Semaphore>,
    per_project: Mutex<ProjectSemaphores>,
}

impl Spool {
    const UNIT: u64 = 1024;

    fn new(limits: &EngineLimits) -> Self {
        let units = |bytes: u64| usize::try_from(bytes.div_ceil(Self::UNIT)).unwrap_or(usize::MAX);
        let all = units(limits.export_spool_bytes.max(limits.export_bytes)).min(Semaphore::MAX_PERMITS);
        let share = units(limits.export_bytes).max(all / 2).min(all);
        Self { all: Arc::new(Semaphore::new(all)), per_project: Mutex::new(ProjectSemaphores::new(share)) }
    }

    /// The room of `project`'s page of `bytes`, when there is enough now.
    fn take(&self, project: ProjectId, bytes: u64) -> Result<Room, ()> {
        let units = u32::try_from(bytes.div_ceil(Self::UNIT).max(1)).unwrap_or(u32::MAX);
        let share = self.per_project.lock().unwrap_or_else(PoisonError::into_inner).of(project);
        let own = share.try_acquire_many_owned(units).map_err(drop)?;
        let all = Arc::clone(&self.all).try_acquire_many_owned(units).map_err(drop)?;
        Ok((own, all))
    }
}

/// One semaphore of `permits` per project, created on first use and forgotten once idle: the map holds the
/// projects that hold or wait for a permit, plus at most as many idle ones again, whatever number of projects
/// ever came.
#[derive(Debug)]
struct ProjectSemaphores {
    semaphores: HashMap<ProjectId, Arc<Semaphore>>,
    permits: usize,
    /// The size at which idle projects are dropped next: twice what was left the last time (at least
    /// [`ProjectSemaphores::FIRST_PRUNE`]), so that the dropping costs a constant per call on average.
    prune_at: usize,
}

impl ProjectSemaphores {
    const FIRST_PRUNE: usize = 64;

    fn new(permits: usize) -> Self {
        Self { semaphores: HashMap::new(), permits, prune_at: 0 }
    }

    /// The project's semaphore, after dropping the projects nobody holds or waits for a permit of: only the map
    /// holds their semaphore (a permit and a waiter each hold it too), so a new one with every permit free is
    /// the same.
    fn of(&mut self, project: ProjectId) -> Arc<Semaphore> {
        if self.semaphores.len() >= self.prune_at.max(Self::FIRST_PRUNE) {
            self.semaphores.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
            self.prune_at = 2 * self.semaphores.len();
        }
        let permits = self.permits;
        Arc::clone(self.semaphores.entry(project).or_insert_with(|| Arc::new(Semaphore::new(permits))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(id: i64) -> ProjectId {
        ProjectId::new(id).expect("a project id")
    }

    #[tokio::test]
    async fn idle_projects_are_forgotten_and_busy_ones_keep_their_slots() {
        let limits = EngineLimits { max_concurrent_per_project: 2, ..EngineLimits::default() };
        let admission = Admission::new(&limits);
        // Projects 1 and 2 hold both their slots.
        let held = [admission.enter(project(1)).unwrap(), admission.enter(project(1)).unwrap()];
        let other = admission.enter(project(2)).unwrap();
        let _second = admission.enter(project(2)).unwrap();
        // Ten thousand projects run one query each, one after the other.
        for id in 3..10_003 {
            drop(admission.enter(project(id)).unwrap());
        }
        assert!(admission.kept() < 200, "idle projects are forgotten: {} kept", admission.kept());
        assert!(matches!(admission.enter(project(1)), Err(EngineError::Busy { .. })), "still full");
        assert!(matches!(admission.enter(project(2)), Err(EngineError::Busy { .. })), "kept, still full");
        drop(other);
        drop(admission.enter(project(2)).unwrap());
        drop(held);
        assert!(admission.enter(project(1)).is_ok());
    }

    #[tokio::test]
    async fn a_page_gives_its_slot_back_for_its_room_in_the_spool_and_one_project_takes_at_most_half() {
        let limits = EngineLimits {
            max_concurrent_per_project: 1,
            export_bytes: 8 * 1024,
            export_spool_bytes: 64 * 1024,
            ..EngineLimits::default()
        };
        let admission = Admission::new(&limits);
        let slot = admission.enter(project(1)).unwrap();
        let first = admission.spool(project(1), 30 * 1024, slot).unwrap();
        // The slot is free again while the page waits for its reader.
        let slot = admission.enter(project(1)).unwrap();
        assert!(
            matches!(admission.spool(project(1), 8 * 1024, slot), Err(EngineError::Busy { .. })),
            "over half"
        );
        let other = admission.spool(project(2), 30 * 1024, admission.enter(project(2)).unwrap()).unwrap();
        assert!(
            matches!(
                admission.spool(project(3), 8 * 1024, admission.enter(project(3)).unwrap()),
                Err(EngineError::Busy { .. })
            ),
            "the spool is full"
        );
        drop((first, other));
        let _room = admission.spool(project(3), 8 * 1024, admission.enter(project(3)).unwrap()).unwrap();
    }
}
