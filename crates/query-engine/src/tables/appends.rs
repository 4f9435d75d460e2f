//! Group commit of appends: the appends to one table that arrive while its previous write is under way are
//! written together, as one Parquet file.
//!
//! An append whose body is small is held in memory (`imports::HeldBody`) and queued on its table's group. It then
//! waits for the group's turn (a fair lock, so turns follow arrival). When its turn comes, either a previous
//! turn has written its body already, and it answers with what that write answered, or it takes every body
//! queued by then, its own among them, and writes them in one file. So one client's appends are written one by
//! one, with no wait added, and many clients' appends share writes: the more arrive during a write, the more
//! the next one carries. Each append is answered only once the file with its rows is complete in the storage.
//!
//! A turn's write runs as a task of its own on the engine's runtime: a client that goes away does not stop the
//! write that carries the other clients' rows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use domain::{EngineError, ProjectId};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::hot_tables::HotTables;
use crate::runtime::EngineRuntime;
use crate::storage::Storage;
use crate::tables::imports::{append_held, HeldBody, StagedError};

/// The most bodies held in memory at once, whatever their number of clients (each at most
/// `table_store::HELD_BODY_BYTES`): past them an append's body is staged in the storage, as a large one is.
const HELD_BODIES: usize = 64;

/// The most appends that quarantine bad rows sorting their bodies at once (each held whole in memory, up to
/// `quarantine::QUARANTINE_BODY_BYTES`); others wait for a turn.
const SORTING_BODIES: usize = 4;

/// The appends of this process, grouped by table.
#[derive(Debug)]
pub(crate) struct Appends {
    groups: Mutex<HashMap<(ProjectId, String), Arc<Group>>>,
    held: Arc<Semaphore>,
    sorting: Arc<Semaphore>,
}

impl Default for Appends {
    fn default() -> Self {
        Self {
            groups: Mutex::default(),
            held: Arc::new(Semaphore::new(HELD_BODIES)),
            sorting: Arc::new(Semaphore::new(SORTING_BODIES)),
        }
    }
}

#[derive(Debug, Default)]
struct Group {
    queued: Mutex<Vec<Queued>>,
    /// Held by the turn that writes; waited for in arrival order.
    turn: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Queued {
    body: HeldBody,
    answer: oneshot::Sender<Result<u64, StagedError>>,
}

impl std::fmt::Debug for HeldBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBody").field("bytes", &self.bytes.len()).finish_non_exhaustive()
    }
}

impl Appends {
    /// A place for one more body in memory, if there is one; the body may be held while it is kept.
    pub(crate) fn try_hold(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.held).try_acquire_owned().ok()
    }

    /// A turn to hold and sort a body whose bad rows are set aside, once one is free.
    pub(crate) async fn sort_turn(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.sorting).acquire_owned().await.ok()
    }

    fn group(&self, project: ProjectId, table: &str) -> Arc<Group> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        // Groups no append holds are dropped, so the map stays as small as the appends under way.
        groups.retain(|_, group| Arc::strong_count(group) > 1);
        Arc::clone(groups.entry((project, table.to_owned())).or_default())
    }

    /// Appends a held body to a table, with the other appends to it queued meanwhile; answers its rows once
    /// they are in the storage (and kept decoded beside the table's other files in `hot`, when they are). `lock`
    /// is the table's lock of this process, held while a turn writes.
    pub(crate) async fn append(
        &self,
        runtime: &EngineRuntime,
        (storage, hot): (&Storage, Option<Arc<HotTables>>),
        lock: Arc<tokio::sync::Mutex<()>>,
        project: ProjectId,
        table: &str,
        body: HeldBody,
    ) -> Result<u64, StagedError> {
        let group = self.group(project, table);
        let (answer, mut answered) = oneshot::channel();
        group.queued.lock().unwrap_or_else(PoisonError::into_inner).push(Queued { body, answer });
        let _turn = group.turn.lock().await;
        if let Ok(result) = answered.try_recv() {
            return result;
        }
        let queued = std::mem::take(&mut *group.queued.lock().unwrap_or_else(PoisonError::into_inner));
        let (storage, table) = (storage.clone(), table.to_owned());
        let write = runtime.run_detached(async move {
            let _held = lock.lock().await;
            let (bodies, answers): (Vec<_>, Vec<_>) = queued.into_iter().map(|q| (q.body, q.answer)).unzip();
            let results = append_held(&storage, (project, hot.as_ref()), &table, &bodies).await;
            for (index, answer) in answers.into_iter().enumerate() {
                let result = match &results {
                    Ok(each) => each.get(index).cloned().unwrap_or_else(|| {
                        Err(StagedError::Write("a grouped append has no answer of its own".into()))
                    }),
                    Err(all) => Err(all.clone()),
                };
                // An append whose client went away is not answered; its rows are written all the same.
                let _ = answer.send(result);
            }
        });
        if let Err(err) = write.await {
            tracing::error!(error = %err, "a grouped append's write failed");
        }
        answered.await.unwrap_or_else(|_| {
            Err(StagedError::Write(
                EngineError::Unavailable("the grouped write of this append stopped".into()).to_string(),
            ))
        })
    }
}
