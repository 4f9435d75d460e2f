//! Table writes told to the other processes in rounds: a write joins the round being gathered, and one round at
//! a time is announced and waited for, so any number of concurrent writes cost one announcement and one wait
//! per round rather than one each (a stream of appends through several connections, say).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use futures_util::lock::Mutex as Turn;
use tracing::warn;

use super::model::TableName;
use super::ports::TableAnnouncer;
use crate::access::ProjectId;
use crate::endpoints::{EndpointChanges, EndpointName};

/// What a round tells, per project: the tables written and the endpoints that read them.
type Told = BTreeMap<ProjectId, (BTreeSet<TableName>, BTreeSet<EndpointName>)>;

/// The round being gathered, and its number.
#[derive(Default)]
struct Gathering {
    round: u64,
    told: Told,
}

/// Rounds of announcements (see the module's documentation).
#[derive(Default)]
pub(super) struct Rounds {
    gathering: Mutex<Gathering>,
    /// Held while a round is announced and waited for.
    turn: Turn<()>,
    /// The last round announced and waited for (rounds are numbered from 1).
    done: AtomicU64,
}

impl Rounds {
    /// Tells the other processes, through `announcer`, that `tables` of `project` were written and that the
    /// `stale` endpoints changed with them, and returns once they applied it (`changes` waits): the caller's
    /// write was made before, so the round it joins is announced after it.
    pub(super) async fn tell(
        &self,
        announcer: &dyn TableAnnouncer,
        changes: &dyn EndpointChanges,
        project: ProjectId,
        tables: &[&TableName],
        stale: Vec<EndpointName>,
    ) {
        let joined = {
            let mut gathering = self.gathering.lock().unwrap_or_else(PoisonError::into_inner);
            let (written, readers) = gathering.told.entry(project).or_default();
            written.extend(tables.iter().map(|&name| name.clone()));
            readers.extend(stale);
            gathering.round + 1
        };
        let _turn = self.turn.lock().await;
        // Another write's turn took this one's round along with its own.
        if self.done.load(Ordering::Acquire) >= joined {
            return;
        }
        let told = {
            let mut gathering = self.gathering.lock().unwrap_or_else(PoisonError::into_inner);
            gathering.round += 1;
            std::mem::take(&mut gathering.told)
        };
        for (project, (tables, readers)) in told {
            let tables = tables.into_iter().collect();
            if let Err(err) = announcer.announce(project, tables, readers.into_iter().collect()).await {
                warn!(%project, error = %err, "cannot tell other processes that a table was written");
            }
        }
        changes.settled().await;
        self.done.store(joined, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;
    use crate::endpoints::MockEndpointChanges;
    use crate::tables::MockTableAnnouncer;
    use crate::testing::project;

    /// Writes told at once share rounds: every write is in an announcement made after it joined, and the
    /// announcements and waits are fewer than the writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writes_share_announcements_and_each_is_told_before_it_returns() {
        let told = Arc::new(Mutex::new(Vec::<String>::new()));
        let announcements = Arc::new(AtomicUsize::new(0));
        let mut announcer = MockTableAnnouncer::new();
        let (record, count) = (Arc::clone(&told), Arc::clone(&announcements));
        announcer.expect_announce().returning(move |_, tables, _| {
            count.fetch_add(1, Ordering::SeqCst);
            record.lock().unwrap().extend(tables.iter().map(ToString::to_string));
            // A round takes a while, as a database round trip does: writes arriving meanwhile gather.
            std::thread::sleep(std::time::Duration::from_millis(5));
            Ok(())
        });
        let waits = Arc::new(AtomicUsize::new(0));
        let mut changes = MockEndpointChanges::new();
        let counted = Arc::clone(&waits);
        changes.expect_settled().returning(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let (announcer, changes) = (Arc::new(announcer), Arc::new(changes));
        let rounds = Arc::new(Rounds::default());
        let writes = (0..64).map(|i| {
            let (rounds, announcer, changes, told) =
                (Arc::clone(&rounds), Arc::clone(&announcer), Arc::clone(&changes), Arc::clone(&told));
            tokio::spawn(async move {
                let table = TableName::parse(&format!("t{i}")).unwrap();
                rounds.tell(announcer.as_ref(), changes.as_ref(), project(1), &[&table], Vec::new()).await;
                assert!(
                    told.lock().unwrap().contains(&table.to_string()),
                    "t{i} returned before it was told"
                );
            })
        });
        for write in writes.collect::<Vec<_>>() {
            write.await.unwrap();
        }
        let told = told.lock().unwrap();
        assert_eq!(told.len(), 64, "each write told once: {told:?}");
        let (announced, waited) = (announcements.load(Ordering::SeqCst), waits.load(Ordering::SeqCst));
        assert_eq!(announced, waited, "one wait per announcement (one project)");
        assert!(announced < 64, "concurrent writes share rounds: {announced} announcements");
    }
}
