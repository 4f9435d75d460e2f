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

use std::sync::Arc;

use async_trait::async_trait;

use crate::access::{ApiKeyService, ProjectId};
use crate::endpoints::{EndpointChanges, EndpointName};
use crate::propagation::{NoPropagation, Propagation};
use crate::runs::ResultCache;

/// A change made by some process that every process keeping the changed thing in memory must honour at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The endpoint was updated (its query, settings or activation) or deleted.
    Endpoint { project: ProjectId, name: EndpointName },
    /// A key was revoked.
    Keys,
    /// A project's token secret was rotated or its allowed origins changed.
    Project { project: ProjectId },
    /// Changes may have been missed (the channel was down): forget everything kept from the store.
    Everything,
}

/// What this process keeps in memory, cleared change by change.
#[derive(Clone)]
pub struct Invalidator {
    cache: Arc<dyn ResultCache>,
    keys: Arc<ApiKeyService>,
    propagation: Arc<dyn Propagation>,
}

impl Invalidator {
    pub fn new(cache: Arc<dyn ResultCache>, keys: Arc<ApiKeyService>) -> Self {
        Self { cache, keys, propagation: Arc::new(NoPropagation) }
    }

    /// Changes saved here are waited for on the other processes through `propagation`.
    #[must_use]
    pub fn with_propagation(mut self, propagation: Arc<dyn Propagation>) -> Self {
        self.propagation = propagation;
        self
    }

    /// Forgets what `change` makes stale: the endpoint's cached runs, the keys read, a project's token secret,
    /// origins and verified tokens, or everything.
    pub fn apply(&self, change: &Change) {
        match change {
            Change::Endpoint { project, name } => self.cache.invalidate(*project, name),
            Change::Keys => self.keys.forget_cached_keys(),
            Change::Project { project } => self.keys.forget_project(*project),
            Change::Everything => {
                self.cache.invalidate_all();
                self.keys.forget_everything();
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

    use super::{Change, Invalidator};
    use crate::access::{ApiKeyService, MockApiKeyStore, MockProjectStore, Scope};
    use crate::endpoints::{EndpointChanges, EndpointName};
    use crate::runs::MockResultCache;
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
}
