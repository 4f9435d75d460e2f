//! Changes that make what this process keeps in memory stale, applied as they happen.
//!
//! Several processes may serve one store. Each keeps computed runs and the keys it read; a change made through
//! another process (a query changed, an endpoint deactivated or deleted, a key revoked) must be honoured here at
//! once. Stores that can announce changes (PostgreSQL's `LISTEN`/`NOTIFY`) deliver a [`Change`] per commit; a
//! channel that drops delivers [`Change::Everything`] until it is back, so nothing kept is trusted longer than
//! the channel's reconnection interval. Changes made in this process reach [`Invalidator`] directly, through the
//! [`EndpointChanges`] port the endpoint service is given.
//!
//! Read your writes on every process: a writer waits, before it answers, until every other live process has
//! applied its change ([`Propagation::settle`]); a process that does not acknowledge within the store's bound is
//! counted out and told to distrust everything it keeps, as when its channel drops.
//!
//! Tables follow the same feed: a write to a table is announced ([`Change::Table`], by the tables' own
//! `TableAnnouncer` port) and waited for, so a process
//! that hears every announcement ([`Change::Heard`]) reads a table's version it keeps without asking the storage
//! whether a newer one was committed ([`KeptTables`]).

use std::sync::Arc;

use async_trait::async_trait;

use crate::access::{ApiKeyService, ProjectId};
use crate::endpoints::{EndpointChanges, EndpointName};
use crate::propagation::{NoPropagation, Propagation};
use crate::runs::ResultCache;
use crate::tables::TableName;

/// A change made by some process that every process keeping the changed thing in memory must honour at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The endpoint was updated (its query, settings or activation) or deleted.
    Endpoint { project: ProjectId, name: EndpointName },
    /// A key was revoked.
    Keys,
    /// A project's token secret was rotated or its allowed origins changed.
    Project { project: ProjectId },
    /// Rows of the table were written, or it was replaced, compacted or deleted.
    Table { project: ProjectId, name: TableName },
    /// Changes may have been missed (the channel was down): forget everything kept from the store.
    Everything,
    /// Not announced: this process's channel is up, every change announced before its last heartbeat was
    /// delivered and applied, and writers wait for this process. Delivered after each heartbeat (every second,
    /// the first as the channel comes up); trusting what was kept ends soon after they stop.
    Heard,
}

/// What a process keeps of its tables' newest versions, so that a run reads a table without asking the
/// storage whether a newer version was committed. It may trust a kept version only while it hears every write
/// of every process (they are all announced, and waited for, before they are answered).
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
pub trait KeptTables: Send + Sync {
    /// The table was written (by any process, this one included): the storage is asked at its next read.
    fn written(&self, project: ProjectId, name: &TableName);
    /// Every announcement is heard now ([`Change::Heard`]); `false`: some may have been missed
    /// ([`Change::Everything`]), and every table is checked at its next read until they are heard again.
    fn hearing(&self, heard: bool);
}

/// What this process keeps in memory, cleared change by change.
#[derive(Clone)]
pub struct Invalidator {
    cache: Arc<dyn ResultCache>,
    keys: Arc<ApiKeyService>,
    propagation: Arc<dyn Propagation>,
    tables: Option<Arc<dyn KeptTables>>,
}

impl Invalidator {
    pub fn new(cache: Arc<dyn ResultCache>, keys: Arc<ApiKeyService>) -> Self {
        Self { cache, keys, propagation: Arc::new(NoPropagation), tables: None }
    }

    /// The tables' versions this process keeps follow announced table writes.
    #[must_use]
    pub fn with_tables(mut self, tables: Arc<dyn KeptTables>) -> Self {
        self.tables = Some(tables);
        self
    }

    /// Changes saved here are waited for on the other processes through `propagation`.
    #[must_use]
    pub fn with_propagation(mut self, propagation: Arc<dyn Propagation>) -> Self {
        self.propagation = propagation;
        self
    }

    /// Forgets what `change` makes stale: the endpoint's cached runs, the keys read, a project's token secret,
    /// origins and verified tokens, a table's kept version, or everything.
    pub fn apply(&self, change: &Change) {
        match change {
            Change::Endpoint { project, name } => self.cache.invalidate(*project, name),
            Change::Keys => self.keys.forget_cached_keys(),
            Change::Project { project } => self.keys.forget_project(*project),
            Change::Table { project, name } => {
                if let Some(tables) = &self.tables {
                    tables.written(*project, name);
                }
            }
            Change::Everything => {
                if let Some(tables) = &self.tables {
                    tables.hearing(false);
                }
                self.cache.invalidate_all();
                self.keys.forget_everything();
            }
            Change::Heard => {
                if let Some(tables) = &self.tables {
                    tables.hearing(true);
                }
            }
        }
    }
}

#[async_trait]
impl EndpointChanges for Invalidator {
    fn changed(&self, project: ProjectId, name: &EndpointName) {
        self.apply(&Change::Endpoint { project, name: name.clone() });
    }

    async fn settled(&self) {
        self.propagation.settle().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use mockall::predicate::eq;

    use super::{Change, Invalidator, MockKeptTables};
    use crate::access::{ApiKeyService, MockApiKeyStore, MockProjectStore, Scope};
    use crate::endpoints::{EndpointChanges, EndpointName};
    use crate::runs::MockResultCache;
    use crate::tables::TableName;
    use crate::testing::{api_key, project, ManualClock, T0};

    const SECRET: &str = "phx_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    /// A key service that trusts keys it read for an hour, and how many times it read the store.
    fn keys() -> (Arc<ApiKeyService>, Arc<AtomicUsize>) {
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let mut store = MockApiKeyStore::new();
        store.expect_find_by_hash().returning(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(Some(api_key(SECRET, vec![Scope::EndpointRead])))
        });
        let service = ApiKeyService::new(
            Arc::new(store),
            Arc::new(MockProjectStore::new()),
            Arc::new(ManualClock::new(T0)),
        )
        .with_key_cache_ttl(std::time::Duration::from_secs(3600));
        (Arc::new(service), reads)
    }

    #[tokio::test]
    async fn each_change_clears_what_it_makes_stale() {
        let name = EndpointName::parse("daily").unwrap();
        let mut cache = MockResultCache::new();
        // The endpoint change is made twice: announced by another process, and made here.
        cache.expect_invalidate().with(eq(project(3)), eq(name.clone())).times(2).return_const(());
        cache.expect_invalidate_all().times(1).return_const(());
        let (keys, reads) = keys();
        let kept = Invalidator::new(Arc::new(cache), Arc::clone(&keys));
        let read_again = |expected: usize| {
            let keys = Arc::clone(&keys);
            let reads = Arc::clone(&reads);
            async move {
                keys.authenticate(SECRET).await.unwrap();
                assert_eq!(reads.load(Ordering::SeqCst), expected);
            }
        };
        read_again(1).await;
        read_again(1).await;

        kept.apply(&Change::Endpoint { project: project(3), name: name.clone() });
        kept.changed(project(3), &name);
        read_again(1).await; // an endpoint change leaves keys alone
        kept.apply(&Change::Keys);
        read_again(2).await; // the key was forgotten, so it is read from the store again
        kept.apply(&Change::Everything);
        read_again(3).await;
    }

    #[test]
    fn table_writes_and_what_is_heard_reach_the_kept_tables() {
        let events = TableName::parse("events").unwrap();
        let mut tables = MockKeptTables::new();
        let mut order = mockall::Sequence::new();
        tables.expect_hearing().with(eq(true)).times(1).in_sequence(&mut order).return_const(());
        tables
            .expect_written()
            .with(eq(project(3)), eq(events.clone()))
            .times(1)
            .in_sequence(&mut order)
            .return_const(());
        tables.expect_hearing().with(eq(false)).times(1).in_sequence(&mut order).return_const(());
        let mut cache = MockResultCache::new();
        cache.expect_invalidate_all().times(1).return_const(());
        let (keys, _) = keys();
        let kept = Invalidator::new(Arc::new(cache), keys).with_tables(Arc::new(tables));
        kept.apply(&Change::Heard);
        kept.apply(&Change::Table { project: project(3), name: events });
        kept.apply(&Change::Everything);
    }
}
