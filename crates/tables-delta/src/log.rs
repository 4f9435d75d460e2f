//! The log store of one table: delta-rs's own (commits by put-if-absent), with the newest version found by
//! existence checks of the commits after a known one instead of a listing of the whole log.
//!
//! delta-rs finds the newest version before every commit by listing the log from the version it read. An
//! object store's listing from an offset is one request on S3, but a local directory has no such listing: the
//! whole `_delta_log` folder is walked, so each commit of a table with 10,000 commits cost milliseconds more than
//! one of a new table. Commit files are numbered without gaps from the oldest the log keeps, so the commits
//! after a version that exists are found by asking for them one by one, doubling the step. Everything else is
//! the inner store's (the methods it does not override are the trait's own, from its configuration and stores).

use std::sync::Arc;

use bytes::Bytes;
use deltalake::kernel::transaction::TransactionError;
use deltalake::kernel::Version;
use deltalake::logstore::{CommitOrBytes, LogStore, LogStoreConfig, LogStoreRef};
use deltalake::{DeltaResult, DeltaTableError};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use uuid::Uuid;

/// A table's log store, finding its newest version by existence checks.
#[derive(Debug)]
pub(crate) struct ProbedLog {
    inner: LogStoreRef,
}

impl ProbedLog {
    pub(crate) fn wrapping(inner: LogStoreRef) -> LogStoreRef {
        Arc::new(Self { inner })
    }

    async fn has(&self, version: Version) -> DeltaResult<bool> {
        let path = ObjectPath::from_iter(["_delta_log", &format!("{version:020}.json")]);
        match self.inner.object_store(None).head(&path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(err) => Err(DeltaTableError::from(err)),
        }
    }
}

#[async_trait::async_trait]
impl LogStore for ProbedLog {
    /// The inner store's: delta-rs hands a put-if-absent store ("DefaultLogStore") the commit's bytes, and
    /// this one commits exactly as it does.
    fn name(&self) -> String {
        self.inner.name()
    }

    async fn read_commit_entry(&self, version: Version) -> DeltaResult<Option<Bytes>> {
        self.inner.read_commit_entry(version).await
    }

    async fn write_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        self.inner.write_commit_entry(version, commit_or_bytes, operation_id).await
    }

    async fn abort_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        self.inner.abort_commit_entry(version, commit_or_bytes, operation_id).await
    }

    /// The newest version from `start`: the commits after it are asked for by doubling steps, then the last
    /// one that exists is found by halving. Only when `start` itself is gone (the log's clean-up removed it, or
    /// it never was) is the log listed, as delta-rs does: a clean-up removes the oldest commits, never one after
    /// a commit it keeps, so every commit after a kept one exists up to the newest.
    async fn get_latest_version(&self, start: Version) -> DeltaResult<Version> {
        if !self.has(start + 1).await? {
            return if self.has(start).await? {
                Ok(start)
            } else {
                self.inner.get_latest_version(start).await
            };
        }
        // `known` exists; `missing` does not (once found).
        let (mut known, mut step) = (start + 1, 1);
        let mut missing = loop {
            step *= 2;
            let probe = known + step;
            if !self.has(probe).await? {
                break probe;
            }
            known = probe;
        };
        while missing - known > 1 {
            let middle = known + (missing - known) / 2;
            if self.has(middle).await? {
                known = middle;
            } else {
                missing = middle;
            }
        }
        Ok(known)
    }

    fn object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.object_store(operation_id)
    }

    fn root_object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.root_object_store(operation_id)
    }

    fn config(&self) -> &LogStoreConfig {
        self.inner.config()
    }
}
