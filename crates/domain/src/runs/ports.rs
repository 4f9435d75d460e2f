//! The result cache port: computed runs kept for their endpoint's cache age.

use std::sync::Arc;

use super::model::{CacheKey, CachedRun};
use crate::access::ProjectId;
use crate::endpoints::EndpointName;

/// Computed runs, kept for their endpoint's cache age. Expiry is checked by the caller against the `Clock`.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
pub trait ResultCache: Send + Sync {
    /// The endpoint's current generation; part of every key.
    fn generation(&self, project: ProjectId, name: &EndpointName) -> u64;

    fn get(&self, key: &CacheKey) -> Option<Arc<CachedRun>>;

    fn put(&self, key: CacheKey, run: Arc<CachedRun>);

    /// Makes every cached run of the endpoint unreachable at once (on update and delete).
    fn invalidate(&self, project: ProjectId, name: &EndpointName);

    /// Makes every cached run unreachable at once, including those being computed now (when this process may
    /// have missed changes made elsewhere).
    fn invalidate_all(&self);
}
