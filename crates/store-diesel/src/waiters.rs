//! The writers of this process waiting for other processes to acknowledge a barrier (see [`crate::changes`]),
//! shared by those writers and this process's change listener, which completes them as acknowledgements
//! arrive: a waiting writer holds a channel, not a database connection.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// One writer's barrier: the processes it still waits for (unknown until its barrier is sent: the processes
/// that acknowledged it meanwhile are kept aside), and what wakes it once none is left.
struct Waiter {
    nodes: Option<HashSet<String>>,
    early: HashSet<String>,
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

    /// Starts waiting for the barrier `token`, before it is sent; the receiver completes once every process
    /// named by [`Waiters::expect`] acknowledged it.
    pub(crate) fn register(&self, token: String) -> oneshot::Receiver<()> {
        let (done, woken) = oneshot::channel();
        self.lock().insert(token, Waiter { nodes: None, early: HashSet::new(), done });
        if let Some(listener) = &*self.listener.lock().unwrap_or_else(PoisonError::into_inner) {
            listener.unpark();
        }
        woken
    }

    /// The barrier `token` was sent, and `nodes` must acknowledge it: its writer is woken at once if they all
    /// did already (or none must). Returns whether it still waits.
    pub(crate) fn expect(&self, token: &str, mut nodes: HashSet<String>) -> bool {
        let mut waiting = self.lock();
        let Some(waiter) = waiting.get_mut(token) else { return false };
        nodes.retain(|node| !waiter.early.contains(node));
        waiter.nodes = Some(nodes);
        Self::wake_if_done(&mut waiting, token)
    }

    /// `node` acknowledged the barrier `token`: its writer is woken once every process it waited for did. An
    /// acknowledgement of another process's barrier (every listener hears them all) is no one's here.
    pub(crate) fn acknowledged(&self, token: &str, node: &str) {
        let mut waiting = self.lock();
        let Some(waiter) = waiting.get_mut(token) else { return };
        match &mut waiter.nodes {
            Some(nodes) => {
                nodes.remove(node);
                Self::wake_if_done(&mut waiting, token);
            }
            None => {
                waiter.early.insert(node.to_owned());
            }
        }
    }

    /// Wakes the writer of `token` if no process it waits for is left; whether it still waits.
    fn wake_if_done(waiting: &mut HashMap<String, Waiter>, token: &str) -> bool {
        if waiting.get(token).is_some_and(|waiter| waiter.nodes.as_ref().is_some_and(HashSet::is_empty)) {
            if let Some(waiter) = waiting.remove(token) {
                // The writer may have stopped waiting already.
                let _ = waiter.done.send(());
            }
            return false;
        }
        waiting.contains_key(token)
    }

    /// Whether `token` is a barrier of this process's own writers (which its listener need not acknowledge).
    pub(crate) fn own(&self, token: &str) -> bool {
        self.lock().contains_key(token)
    }

    /// Stops waiting for `token`; answers the processes that did not acknowledge it.
    pub(crate) fn abandon(&self, token: &str) -> HashSet<String> {
        self.lock().remove(token).and_then(|waiter| waiter.nodes).unwrap_or_else(HashSet::new)
    }

    /// Whether any writer waits, so the listener looks for acknowledgements more often.
    pub(crate) fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiter>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The news of this process's writers on their way to the change channel, each with what wakes its writer once
/// the barrier sent after it was acknowledged. One statement at a time sends what is queued, with one barrier:
/// the writes that come while it is sent go together in the next one, so a stream of concurrent writes costs a
/// statement and a wait per batch rather than per write.
#[derive(Default)]
pub(crate) struct Outbox {
    queued: Mutex<Vec<(Vec<String>, oneshot::Sender<()>)>>,
    sending: AtomicBool,
}

/// The right to send what is queued, held by one task at a time; given back when dropped.
pub(crate) struct Turn(Arc<Outbox>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.sending.store(false, Ordering::Release);
    }
}

impl Outbox {
    /// Queues a writer's `payloads`; the receiver completes once they were sent with a barrier after them and
    /// the barrier was waited for (it closes if they could not be sent).
    pub(crate) fn queue(&self, payloads: Vec<String>) -> oneshot::Receiver<()> {
        let (done, woken) = oneshot::channel();
        self.lock().push((payloads, done));
        woken
    }

    /// The turn to send, unless another task has it (that task sends what was queued before it looks again).
    pub(crate) fn turn(self: &Arc<Self>) -> Option<Turn> {
        let free = self.sending.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok();
        free.then(|| Turn(Arc::clone(self)))
    }

    /// Takes everything queued: the payloads in the order they were queued, and their writers.
    pub(crate) fn take(&self, _turn: &Turn) -> (Vec<String>, Vec<oneshot::Sender<()>>) {
        let queued = std::mem::take(&mut *self.lock());
        let mut payloads = Vec::new();
        let writers = queued
            .into_iter()
            .map(|(mut theirs, done)| {
                payloads.append(&mut theirs);
                done
            })
            .collect();
        (payloads, writers)
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<String>, oneshot::Sender<()>)>> {
        self.queued.lock().unwrap_or_else(PoisonError::into_inner)
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
        let mut woken = waiters.register("t1".into());
        let other = waiters.register("t2".into());
        waiters.acknowledged("t1", "a"); // before its writer knows who must acknowledge
        assert!(waiters.own("t1") && !waiters.own("t3"));
        assert!(waiters.expect("t1", nodes(&["a", "b"])));
        assert!(waiters.expect("t2", nodes(&["a"])));
        waiters.acknowledged("t1", "zzz");
        waiters.acknowledged("unknown", "b");
        assert!(woken.try_recv().is_err(), "b has not acknowledged");
        waiters.acknowledged("t1", "b");
        woken.await.unwrap();
        assert!(waiters.any(), "t2 still waits");
        assert_eq!(waiters.abandon("t2"), nodes(&["a"]));
        assert!(other.await.is_err(), "abandoned: its channel closes");
        assert!(!waiters.any());

        let alone = waiters.register("t4".into());
        assert!(!waiters.expect("t4", HashSet::new()), "no other process: woken at once");
        alone.await.unwrap();
        let early = waiters.register("t5".into());
        waiters.acknowledged("t5", "a");
        assert!(!waiters.expect("t5", nodes(&["a"])), "acknowledged before it was sent");
        early.await.unwrap();
        assert!(!waiters.any());
    }

    #[tokio::test]
    async fn writes_queued_while_one_is_sent_go_together_in_order() {
        let outbox = Arc::new(Outbox::default());
        let first = outbox.queue(vec!["a".into()]);
        let turn = outbox.turn().expect("nobody sends yet");
        assert!(outbox.turn().is_none(), "one sender at a time");
        let (payloads, writers) = outbox.take(&turn);
        assert_eq!((payloads, writers.len()), (vec!["a".to_owned()], 1));
        // Queued while the first is sent: taken together by the next look.
        let second = outbox.queue(vec!["b".into(), "c".into()]);
        let third = outbox.queue(Vec::new());
        let fourth = outbox.queue(vec!["d".into()]);
        assert!(!outbox.is_empty());
        let (payloads, more) = outbox.take(&turn);
        assert_eq!(payloads, ["b", "c", "d"]);
        assert_eq!(more.len(), 3);
        assert!(outbox.is_empty());
        drop(turn);
        assert!(outbox.turn().is_some(), "given back when dropped");
        for writer in writers.into_iter().chain(more) {
            writer.send(()).unwrap();
        }
        for woken in [first, second, third, fourth] {
            woken.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_listener_that_loses_its_connection_releases_every_writer() {
        let waiters = Waiters::default();
        waiters.listen();
        let woken = waiters.register("t".into());
        waiters.deaf();
        assert!(!waiters.listening());
        assert!(woken.await.is_err(), "told to wait the other way");
        assert!(waiters.abandon("t").is_empty());
    }
}
