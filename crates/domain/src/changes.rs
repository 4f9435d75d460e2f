//! Changes announced by other processes, applied to what this process keeps from the store in memory.
//!
//! Several processes may serve one store. Each keeps computed runs and the keys it read; a change made through
//! another process (a query changed, an endpoint deactivated or deleted, a key revoked) must be honoured here at
//! once. Stores that can announce changes (PostgreSQL's `LISTEN`/`NOTIFY`) deliver a [`Change`] per commit; a
//! channel that drops delivers [`Change::Everything`] until it is back, so nothing kept is trusted longer than
//! the channel's reconnection interval.

use std::sync::Arc;

use crate::auth::ApiKeyService;
use crate::ports::{Change, ResultCache};

/// What this process keeps in memory, cleared change by change.
#[derive(Clone)]
pub struct KeptState {
    cache: Arc<dyn ResultCache>,
    keys: Arc<ApiKeyService>,
}

impl KeptState {
    pub fn new(cache: Arc<dyn ResultCache>, keys: Arc<ApiKeyService>) -> Self {
        Self { cache, keys }
    }

    /// Forgets what `change` makes stale: the endpoint's cached runs, the keys read, or everything.
    pub fn apply(&self, change: &Change) {
        match change {
            Change::Endpoint { project, name } => self.cache.invalidate(*project, name),
            Change::Keys => self.keys.forget_cached_keys(),
            Change::Everything => {
                self.cache.invalidate_all();
                self.keys.forget_cached_keys();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mockall::predicate::eq;

    use super::KeptState;
    use crate::auth::ApiKeyService;
    use crate::ports::{Change, MockApiKeyStore, MockClock, MockProjectStore, MockResultCache};
    use crate::{EndpointName, ProjectId};

    fn keys() -> Arc<ApiKeyService> {
        Arc::new(ApiKeyService::new(
            Arc::new(MockApiKeyStore::new()),
            Arc::new(MockProjectStore::new()),
            Arc::new(MockClock::new()),
        ))
    }

    #[test]
    fn each_change_clears_what_it_makes_stale() {
        let project = ProjectId::new(3).unwrap();
        let name = EndpointName::parse("daily").unwrap();
        let mut cache = MockResultCache::new();
        cache.expect_invalidate().with(eq(project), eq(name.clone())).times(1).return_const(());
        cache.expect_invalidate_all().times(1).return_const(());
        let kept = KeptState::new(Arc::new(cache), keys());
        kept.apply(&Change::Endpoint { project, name });
        kept.apply(&Change::Keys);
        kept.apply(&Change::Everything);
    }
}
