//! The upkeep of tables fed by appends: the tables a process appended to have their small files merged, one
//! compaction of a table at a time across processes (a lease in the store), so that a table fed by a stream of
//! small appends keeps few, full files; and append keys past their window are forgotten.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};
use uuid::Uuid;

use super::idempotency::IDEMPOTENCY_WINDOW;
use super::model::{Compaction, TableName};
use super::ports::{AppendKeys, TableAnnouncer, TableLeases, TableStore};
use crate::access::ProjectId;
use crate::clock::Clock;
use crate::error::Error;

/// What happened to one table a pass looked at.
#[derive(Debug)]
pub enum CompactionOutcome {
    /// Its small files were merged.
    Compacted(Compaction),
    /// It had too few small files to be worth it.
    NothingToDo,
    /// Another process holds its lease (it is compacting it): it stays a candidate.
    Leased,
    Failed(Error),
}

/// Compacts the tables this process appended to, and forgets expired append keys.
pub struct TableMaintenance {
    tables: Arc<dyn TableStore>,
    leases: Arc<dyn TableLeases>,
    keys: Arc<dyn AppendKeys>,
    announcer: Arc<dyn TableAnnouncer>,
    clock: Arc<dyn Clock>,
    /// How long a lease lasts: longer than a compaction takes, and how long a crashed holder keeps others out.
    lease: Duration,
    /// This process, as the holder of the leases it takes.
    holder: Uuid,
}

/// What table upkeep works through.
pub struct MaintenanceDeps {
    pub tables: Arc<dyn TableStore>,
    pub leases: Arc<dyn TableLeases>,
    pub keys: Arc<dyn AppendKeys>,
    /// Tells the other processes of a compaction, so that they read the merged files.
    pub announcer: Arc<dyn TableAnnouncer>,
    pub clock: Arc<dyn Clock>,
    /// How long a lease lasts.
    pub lease: Duration,
}

impl TableMaintenance {
    pub fn new(deps: MaintenanceDeps) -> Self {
        let MaintenanceDeps { tables, leases, keys, announcer, clock, lease } = deps;
        Self { tables, leases, keys, announcer, clock, lease, holder: Uuid::new_v4() }
    }

    /// The tables appended to since this process last compacted them.
    pub fn candidates(&self) -> Vec<(ProjectId, TableName)> {
        self.tables.appended()
    }

    /// Compacts one table if its lease is free.
    pub async fn compact(&self, project: ProjectId, table: &TableName) -> CompactionOutcome {
        let now = self.clock.now();
        let until = now + self.lease;
        match self.leases.claim(project, table, self.holder, now, until).await {
            Ok(true) => {}
            Ok(false) => return CompactionOutcome::Leased,
            Err(err) => return CompactionOutcome::Failed(err.into()),
        }
        // The files of appends not answered yet stay as they are, so that their retries can find them.
        let compacted = match self.keys.pending(project, table).await {
            Ok(keep) => self.tables.compact(project, table, keep).await.map_err(Error::from),
            Err(err) => Err(err.into()),
        };
        if let Err(err) = self.leases.release(project, table, self.holder).await {
            warn!(%project, %table, error = %err, "could not give a table's lease back; it will expire");
        }
        match compacted {
            Ok(Some(done)) => {
                debug!(%project, %table, ?done, "compacted a table");
                // Not waited for: the rows are the same; a process that has not heard yet reads the files merged.
                if let Err(err) = self.announcer.announce(project, vec![table.clone()], Vec::new()).await {
                    warn!(%project, %table, error = %err, "cannot tell other processes of a compaction");
                }
                CompactionOutcome::Compacted(done)
            }
            Ok(None) => CompactionOutcome::NothingToDo,
            Err(err) => {
                warn!(%project, %table, error = %err, "could not compact a table; will retry");
                CompactionOutcome::Failed(err)
            }
        }
    }

    /// How long a lease lasts: a compaction running longer renews it ([`TableMaintenance::renew`]) every third.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Extends this process's lease on the table by a lease's length; `false` when another process holds it
    /// (this one's expired meanwhile): the compaction under way is then to be abandoned.
    ///
    /// # Errors
    /// Store failures.
    pub async fn renew(&self, project: ProjectId, table: &TableName) -> Result<bool, Error> {
        let now = self.clock.now();
        Ok(self.leases.claim(project, table, self.holder, now, now + self.lease).await?)
    }

    /// Forgets the append keys past their window; answers how many.
    ///
    /// # Errors
    /// Store failures.
    pub async fn forget_expired_keys(&self) -> Result<u64, Error> {
        Ok(self.keys.sweep(self.clock.now() - IDEMPOTENCY_WINDOW).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EngineError;
    use crate::tables::{MockAppendKeys, MockTableAnnouncer, MockTableLeases, MockTableStore};
    use crate::testing::{project, ManualClock, T0};

    /// A service whose compactions announce nothing (`announcer` expects nothing).
    fn service(tables: MockTableStore, leases: MockTableLeases) -> TableMaintenance {
        announcing(tables, leases, MockTableAnnouncer::new())
    }

    fn announcing(
        tables: MockTableStore,
        leases: MockTableLeases,
        announcer: MockTableAnnouncer,
    ) -> TableMaintenance {
        let pending = uuid::Uuid::from_u128(7);
        let mut keys = MockAppendKeys::new();
        keys.expect_pending().returning(move |_, _| Ok(vec![pending]));
        keys.expect_sweep().withf(|expired| *expired == T0 - IDEMPOTENCY_WINDOW).returning(|_| Ok(3));
        TableMaintenance::new(MaintenanceDeps {
            tables: Arc::new(tables),
            leases: Arc::new(leases),
            keys: Arc::new(keys),
            announcer: Arc::new(announcer),
            clock: Arc::new(ManualClock::new(T0)),
            lease: Duration::from_secs(60),
        })
    }

    fn events() -> TableName {
        TableName::parse("events").unwrap()
    }

    #[tokio::test]
    async fn a_table_is_compacted_under_its_lease_which_is_then_given_back() {
        let mut tables = MockTableStore::new();
        tables.expect_appended().returning(|| vec![(project(1), events())]);
        let done = Compaction { files_before: 40, files_after: 1, files_merged: 40, rows_merged: 200 };
        tables
            .expect_compact()
            .withf(|_, _, keep| *keep == vec![uuid::Uuid::from_u128(7)])
            .times(1)
            .returning(move |_, _, _| Ok(Some(done)));
        let mut leases = MockTableLeases::new();
        leases
            .expect_claim()
            .withf(|project_id, table, _, now, until| {
                *project_id == project(1)
                    && table.as_str() == "events"
                    && *now == T0
                    && *until == T0 + Duration::from_secs(60)
            })
            .times(1)
            .returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().times(1).returning(|_, _, _| Ok(()));
        // Other processes are told, so that they read the merged files.
        let mut announcer = MockTableAnnouncer::new();
        announcer
            .expect_announce()
            .withf(|p, tables, readers| *p == project(1) && *tables == vec![events()] && readers.is_empty())
            .times(1)
            .returning(|_, _, _| Ok(()));
        let service = announcing(tables, leases, announcer);
        assert_eq!(service.candidates(), vec![(project(1), events())]);
        let outcome = service.compact(project(1), &events()).await;
        assert!(matches!(outcome, CompactionOutcome::Compacted(d) if d == done));
        assert_eq!(service.forget_expired_keys().await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_renewal_extends_the_compactions_own_lease_and_says_when_another_took_it() {
        let mut tables = MockTableStore::new();
        tables.expect_compact().returning(|_, _, _| Ok(None));
        let holders = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&holders);
        let mut leases = MockTableLeases::new();
        leases
            .expect_claim()
            .withf(|_, table, _, now, until| {
                table.as_str() == "events" && *now == T0 && *until == T0 + Duration::from_secs(60)
            })
            .times(3)
            .returning(move |_, _, holder, _, _| {
                let mut holders = seen.lock().unwrap();
                holders.push(holder);
                // The third claim finds the lease taken by another process.
                Ok(holders.len() < 3)
            });
        leases.expect_release().returning(|_, _, _| Ok(()));
        let service = service(tables, leases);
        assert!(matches!(service.compact(project(1), &events()).await, CompactionOutcome::NothingToDo));
        assert!(service.renew(project(1), &events()).await.unwrap());
        assert!(!service.renew(project(1), &events()).await.unwrap());
        let holders = holders.lock().unwrap();
        assert!(holders.iter().all(|h| *h == holders[0]), "renewed as the holder that claimed it");
        assert_eq!(service.lease(), Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_table_leased_elsewhere_is_left_alone() {
        let mut tables = MockTableStore::new();
        tables.expect_compact().never();
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(false));
        leases.expect_release().never();
        let outcome = service(tables, leases).compact(project(1), &events()).await;
        assert!(matches!(outcome, CompactionOutcome::Leased));
    }

    #[tokio::test]
    async fn a_failed_compaction_gives_its_lease_back_and_says_why() {
        let mut tables = MockTableStore::new();
        tables.expect_compact().returning(|_, _, _| Err(EngineError::Unavailable("disk gone".into())));
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().times(1).returning(|_, _, _| Ok(()));
        let outcome = service(tables, leases).compact(project(1), &events()).await;
        assert!(matches!(outcome, CompactionOutcome::Failed(Error::Unavailable(_))));
    }
}
