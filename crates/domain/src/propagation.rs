//! Read your writes on every process: how a change saved by one process is waited for on the others.
//!
//! Several processes may serve one store, each keeping what it read (runs, keys) in memory. A writer that
//! answered must be able to rely on the next request, on any process, seeing its change: before it answers, it
//! waits ([`Propagation::settle`]) until every other live process has applied the changes it saved; a process
//! that does not acknowledge within the store's bound is counted out, and told to distrust everything it keeps.

use async_trait::async_trait;

/// How the changes a process saved reach the others.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait Propagation: Send + Sync {
    /// Returns once every other live process has applied the changes saved here so far, or was counted out
    /// (it then distrusts what it keeps). Never fails: the change is saved; when the store cannot be reached to
    /// wait, the other processes have lost their channel to it too, and distrust what they keep for that.
    async fn settle(&self);
}

/// One process serves the store (SQLite, or a program embedding the domain): nothing to wait for.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPropagation;

#[async_trait]
impl Propagation for NoPropagation {
    async fn settle(&self) {}
}
