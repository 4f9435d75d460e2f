//! Things read from the store, kept in memory for a short while.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::clock::Timestamp;

/// Things read from the store recently, so most requests need no store read. An entry is trusted for `ttl`: a
/// change made by this process is applied at once (the entry is forgotten or no longer matches), one made by
/// another process (the CLI, another node) within `ttl`, or at once where the store announces changes. A map of
/// things that do not exist (unknown keys) is bounded by its size alone: past `max_entries` it starts again.
pub(crate) struct RecentReads<K, V> {
    pub(crate) ttl: Duration,
    /// More entries than a deployment has; past it the map starts again rather than grow.
    max_entries: usize,
    /// Keyed by ids and digests (SHA-256 of a secret, which a caller cannot aim), so a seeded fast hasher is
    /// enough.
    entries: Mutex<HashMap<K, (Arc<V>, Timestamp), foldhash::fast::RandomState>>,
}

impl<K: Hash + Eq, V> RecentReads<K, V> {
    pub(crate) fn new(ttl: Duration, max_entries: usize) -> Self {
        Self { ttl, max_entries, entries: Mutex::default() }
    }

    pub(crate) fn get<Q>(&self, key: &Q, now: Timestamp) -> Option<Arc<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(key).filter(|(_, fetched)| now < *fetched + self.ttl).map(|(value, _)| Arc::clone(value))
    }

    /// The entry however old it is.
    pub(crate) fn any_age<Q>(&self, key: &Q) -> Option<Arc<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|(value, _)| Arc::clone(value))
    }

    pub(crate) fn put(&self, key: K, value: &Arc<V>, now: Timestamp) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.max_entries {
            entries.clear();
        }
        entries.insert(key, (Arc::clone(value), now));
    }

    /// Forgets the entry of `key`: the next read goes to the store.
    pub(crate) fn forget(&self, key: &K) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }

    pub(crate) fn retain(&self, keep: impl Fn(&K, &V) -> bool) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|key, (value, _)| keep(key, value));
    }

    pub(crate) fn clear(&self) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}
