//! The in-memory `ResultCache`: moka, bounded by the bytes of the cached rows, with a generation per endpoint
//! so an update or delete makes every older entry unreachable at once, and an epoch over all of them for when
//! this process may have missed changes made elsewhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use domain::{ByEndpoint, CacheKey, CachedRun, EndpointName, ProjectId, ResultCache};
use foldhash::quality;
use moka::sync::Cache;
use moka::Expiry;

/// Cached runs in process memory.
pub struct MemoryResultCache {
    /// Keys carry variables as the client sent them, so the hasher is seeded and finishes with full avalanche.
    entries: Cache<CacheKey, Arc<CachedRun>, quality::RandomState>,
    /// By project, then name: a lookup borrows the name instead of building a key (no allocation per run).
    generations: Mutex<ByEndpoint<u64>>,
    /// Added to every endpoint's generation: both only grow, so a bump of either changes every key it covers.
    epoch: AtomicU64,
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
            .build_with_hasher(quality::RandomState::default());
        Self { entries, generations: Mutex::default(), epoch: AtomicU64::new(0) }
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
        let own = generations.get(&project).and_then(|names| names.get(name)).copied().unwrap_or(0);
        own + self.epoch.load(Ordering::Acquire)
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
        *generations.entry(project).or_default().entry(name.clone()).or_insert(0) += 1;
    }

    fn invalidate_all(&self) {
        // Runs computed under the old epoch are stored under keys nothing asks for again; the memory goes too.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.entries.invalidate_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use domain::{CacheKey, CachedRun, EndpointName, ProjectId, QueryResult, ResultCache};
    use time::macros::datetime;

    use super::MemoryResultCache;

    fn run() -> Arc<CachedRun> {
        let at = datetime!(2026-11-22 12:00 UTC);
        Arc::new(CachedRun {
            version: 1,
            version_created_at: at,
            result: QueryResult {
                columns: vec![],
                rows_json: "[]".into(),
                row_count: 0,
                has_more: false,
                statistics: domain::Statistics::default(),
                read: Vec::new(),
            },
            computed_at: at,
            expires_at: Some(at + time::Duration::minutes(5)),
            query_time: std::time::Duration::ZERO,
            endpoint_materialized: false,
            materialized_at: None,
            data_as_of: at,
            variables: serde_json::Value::Null,
            rendered: std::sync::OnceLock::new(),
            tag: std::sync::OnceLock::new(),
            as_of: std::sync::OnceLock::new(),
        })
    }

    fn key(cache: &MemoryResultCache, name: &EndpointName) -> CacheKey {
        let project = ProjectId::new(1).unwrap();
        CacheKey {
            project,
            name: name.clone(),
            generation: cache.generation(project, name),
            request: "r".into(),
        }
    }

    #[test]
    fn an_endpoint_or_everything_can_be_made_unreachable_at_once() {
        let cache = MemoryResultCache::new(1 << 20);
        let (a, b) = (EndpointName::parse("a").unwrap(), EndpointName::parse("b").unwrap());
        let project = ProjectId::new(1).unwrap();
        for name in [&a, &b] {
            cache.put(key(&cache, name), run());
        }
        assert!(cache.get(&key(&cache, &a)).is_some() && cache.get(&key(&cache, &b)).is_some());

        cache.invalidate(project, &a);
        assert!(cache.get(&key(&cache, &a)).is_none(), "a is gone");
        assert!(cache.get(&key(&cache, &b)).is_some(), "b is not");

        let computing = key(&cache, &b);
        cache.invalidate_all();
        assert!(cache.get(&key(&cache, &b)).is_none(), "everything is gone");
        cache.put(computing, run());
        assert!(cache.get(&key(&cache, &b)).is_none(), "a run computed before is not stored");
        cache.put(key(&cache, &b), run());
        assert!(cache.get(&key(&cache, &b)).is_some(), "a run computed after is");
    }
}
