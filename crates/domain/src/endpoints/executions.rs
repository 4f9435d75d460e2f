//! Last execution times: recorded in memory on every run, flushed to the store in batches, merged on read so a
//! run on this node shows at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::model::{ByEndpoint, EndpointName};
use super::ports::EndpointStore;
use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::error::StoreError;

/// Pending execution times, newest per endpoint, waiting for the next flush.
pub struct ExecutionTracker {
    store: Arc<dyn EndpointStore>,
    /// By project, then by name, so a run of an endpoint already pending is noted without allocating its key.
    pending: Mutex<ByEndpoint<Timestamp>>,
}

impl ExecutionTracker {
    pub fn new(store: Arc<dyn EndpointStore>) -> Self {
        Self { store, pending: Mutex::default() }
    }

    /// Notes a run. Memory only: never a database write on the request path.
    pub fn record(&self, project: ProjectId, name: &EndpointName, at: Timestamp) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let names = pending.entry(project).or_default();
        match names.get_mut(name) {
            Some(entry) if *entry < at => *entry = at,
            Some(_) => {}
            None => {
                names.insert(name.clone(), at);
            }
        }
    }

    /// Drops the pending time of a deleted endpoint, so a new endpoint of the same name does not inherit it.
    pub fn forget(&self, project: ProjectId, name: &EndpointName) {
        if let Some(names) = self.pending.lock().unwrap_or_else(PoisonError::into_inner).get_mut(&project) {
            names.remove(name);
        }
    }

    /// The pending time of one endpoint, if it ran since the last flush.
    pub fn pending(&self, project: ProjectId, name: &EndpointName) -> Option<Timestamp> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).get(&project)?.get(name).copied()
    }

    /// Writes every pending time in one batch. Times that fail to write are kept for the next flush.
    ///
    /// # Errors
    /// The store's error; the batch stays pending.
    pub async fn flush(&self) -> Result<usize, StoreError> {
        let batch: Vec<_> = {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            pending
                .drain()
                .flat_map(|(project, names)| names.into_iter().map(move |(name, at)| (project, name, at)))
                .collect()
        };
        if batch.is_empty() {
            return Ok(0);
        }
        let count = batch.len();
        if let Err(err) = self.store.record_executions(batch.clone()).await {
            for (project, name, at) in batch {
                self.record(project, &name, at);
            }
            return Err(err);
        }
        Ok(count)
    }

    /// Last execution times of `names` at or after `since`: the store's, overridden by newer pending ones; and
    /// the rows read (store rows plus pending entries).
    ///
    /// # Errors
    /// The store's error.
    pub async fn last_executed(
        &self,
        project: ProjectId,
        names: &[EndpointName],
        since: Timestamp,
    ) -> Result<(Vec<(EndpointName, Timestamp)>, u64), StoreError> {
        let (stored, mut rows_read) = self.store.last_executions(project, names.to_vec(), since).await?;
        let mut merged: HashMap<EndpointName, Timestamp> = stored.into_iter().collect();
        for name in names {
            if let Some(at) = self.pending(project, name).filter(|at| *at >= since) {
                // A pending time is a row read too, from memory instead of the store.
                rows_read += 1;
                let entry = merged.entry(name.clone()).or_insert(at);
                if *entry < at {
                    *entry = at;
                }
            }
        }
        let mut result: Vec<_> = merged.into_iter().collect();
        result.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((result, rows_read))
    }
}
