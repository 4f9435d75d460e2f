//! The writers of this process waiting for other processes to acknowledge a barrier (see [`crate::changes`]),
//! shared by those writers and this process's change listener, which completes them as acknowledgements
//! arrive: a waiting writer holds a channel, not a database connection.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

/// One writer's barrier: the processes it still waits for, and what wakes it once none is left.
struct Waiter {
    nodes: HashSet<String>,
    done: oneshot::Sender<()>,
}

/// Barriers by token.
#[derive(Default)]
pub(crate) struct Waiters {
    waiting: Mutex<HashMap<String, Waiter>>,
    /// Whether this process's listener is connected and hears acknowledgements: only then may a writer wait on
    /// a channel (else it waits on a connection of its own, as a command without a listener does).
    listening: AtomicBool,
    /// The listener's thread, woken when a writer starts waiting so that it looks for acknowledgements at once
    /// rather than at the end of its idle pause.
    listener: Mutex<Option<std::thread::Thread>>,
}

impl Waiters {
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// The listener, on the calling thread, is connected and listens for acknowledgements.
    pub(crate) fn listen(&self) {
        *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some(std::thread::current());
        self.listening.store(true, Ordering::Release);
    }

    /// Pauses the listener's thread until `idle` passes or a writer starts waiting; while one waits, `busy`.
    pub(crate) fn pause(&self, idle: std::time::Duration, busy: std::time::Duration) {
        if self.any() {
            std::thread::sleep(busy);
        } else {
            std::thread::park_timeout(idle);
        }
    }

    /// The listener lost its connection: acknowledgements sent meanwhile are lost, so every waiting writer is
    /// told (its channel closes) and waits the other way.
    pub(crate) fn deaf(&self) {
        self.listening.store(false, Ordering::Release);
        self.lock().clear();
    }

    /// Waits for `nodes` to acknowledge the barrier `token`; the receiver completes once all did.
    pub(crate) fn register(&self, token: String, nodes: HashSet<String>) -> oneshot::Receiver<()> {
        let (done, woken) = oneshot::channel();
        self.lock().insert(token, Waiter { nodes, done });
        if let Some(listener) = &*self.listener.lock().unwrap_or_else(PoisonError::into_inner) {
            listener.unpark();
        }
        woken
    }

    /// `node` acknowledged the barrier `token`: its writer is woken once every process it waited for did. An
    /// acknowledgement of another process's barrier (every listener hears them all) is no one's here.
    pub(crate) fn acknowledged(&self, token: &str, node: &str) {
        let mut waiting = self.lock();
        let Some(waiter) = waiting.get_mut(token) else { return };
        waiter.nodes.remove(node);
        if waiter.nodes.is_empty() {
            if let Some(waiter) = waiting.remove(token) {
                // The writer may have stopped waiting already.
                let _ = waiter.done.send(());
            }
        }
    }

    /// Stops waiting for `token`; answers the processes that did not acknowledge it.
    pub(crate) fn abandon(&self, token: &str) -> HashSet<String> {
        self.lock().remove(token).map_or_else(HashSet::new, |waiter| waiter.nodes)
    }

    /// Whether any writer waits, so the listener looks for acknowledgements more often.
    pub(crate) fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiter>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[tokio::test]
    async fn a_writer_is_woken_once_every_process_acknowledged_its_barrier() {
        let waiters = Waiters::default();
        let mut woken = waiters.register("t1".into(), nodes(&["a", "b"]));
        let other = waiters.register("t2".into(), nodes(&["a"]));
        waiters.acknowledged("t1", "a");
        waiters.acknowledged("t1", "zzz");
        waiters.acknowledged("unknown", "b");
        assert!(woken.try_recv().is_err(), "b has not acknowledged");
        waiters.acknowledged("t1", "b");
        woken.await.unwrap();
        assert!(waiters.any(), "t2 still waits");
        assert_eq!(waiters.abandon("t2"), nodes(&["a"]));
        assert!(other.await.is_err(), "abandoned: its channel closes");
        assert!(!waiters.any());
    }

    #[tokio::test]
    async fn a_listener_that_loses_its_connection_releases_every_writer() {
        let waiters = Waiters::default();
        waiters.listen();
        let woken = waiters.register("t".into(), nodes(&["a"]));
        waiters.deaf();
        assert!(!waiters.listening());
        assert!(woken.await.is_err(), "told to wait the other way");
        assert!(waiters.abandon("t").is_empty());
    }
}
