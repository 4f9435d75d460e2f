//! The in-memory `ResultCache`: moka, bounded by the bytes of the cached rows, with a generation per endpoint
//! so an update or delete makes every older entry unreachable at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use domain::ports::{CacheKey, CachedRun, ResultCache};
use domain::{EndpointName, ProjectId};
use moka::sync::Cache;
use moka::Expiry;

/// Cached runs in process memory.
pub struct MemoryResultCache {
    entries: Cache<CacheKey, Arc<CachedRun>>,
    generations: Mutex<HashMap<(ProjectId, EndpointName), u64>>,
}

/// Evicts an entry when its own cache age has passed (the caller checks expiry too, against its clock).
struct UntilExpiry;

impl Expiry<CacheKey, Arc<CachedRun>> for UntilExpiry {
    fn expire_after_create(&self, _key: &CacheKey, run: &Arc<CachedRun>, _now: Instant) -> Option<Duration> {
        let lifetime = run.expires_at.map_or(Duration::ZERO, |at| (at - run.computed_at).unsigned_abs());
        Some(lifetime)
    }
}

impl MemoryResultCache {
    /// A cache holding at most about `max_bytes` of results.
    pub fn new(max_bytes: u64) -> Self {
        let entries = Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|_key: &CacheKey, run: &Arc<CachedRun>| u32::try_from(run.weight()).unwrap_or(u32::MAX))
            .expire_after(UntilExpiry)
            .build();
        Self { entries, generations: Mutex::new(HashMap::new()) }
    }
}

impl std::fmt::Debug for MemoryResultCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryResultCache").field("entries", &self.entries.entry_count()).finish()
    }
}

impl ResultCache for MemoryResultCache {
    fn generation(&self, project: ProjectId, name: &EndpointName) -> u64 {
        let generations = self.generations.lock().unwrap_or_else(PoisonError::into_inner);
        generations.get(&(project, name.clone())).copied().unwrap_or(0)
    }

    fn get(&self, key: &CacheKey) -> Option<Arc<CachedRun>> {
        (key.generation == self.generation(key.project, &key.name)).then(|| self.entries.get(key)).flatten()
    }

    fn put(&self, key: CacheKey, run: Arc<CachedRun>) {
        // A run that started before an invalidation carries the old generation: storing it would be harmless
        // (unreachable) but wasteful.
        if key.generation == self.generation(key.project, &key.name) {
            self.entries.insert(key, run);
        }
    }

    fn invalidate(&self, project: ProjectId, name: &EndpointName) {
        let mut generations = self.generations.lock().unwrap_or_else(PoisonError::into_inner);
        *generations.entry((project, name.clone())).or_insert(0) += 1;
    }
}
