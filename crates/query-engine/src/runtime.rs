//! The engine's own runtime: DataFusion's CPU-bound planning and execution run here, on threads with deep
//! stacks, instead of on the HTTP server's threads.
//!
//! DataFusion formats and walks expression trees recursively; a query with thousands of chained operators needs
//! far more stack than a default 2 MiB thread has (a 1,000-term sum overflowed one and aborted the process).
//! Stack is reserved, not committed, so the large size costs address space only.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use domain::EngineError;
use tokio::runtime::{Builder, Runtime};
use tokio::task::{JoinError, JoinHandle};

/// Stack of each engine thread.
const STACK_BYTES: usize = 256 * 1024 * 1024;

/// Engine threads per core. Which queries execute is the fair scheduler's to say (`fair`: one per core), but a
/// query's operator can spend a long while in one step (a join filling a batch from a large build side), which
/// no scheduler inside the process can cut short: with spare threads, the query whose turn it is runs on
/// another thread meanwhile, and the operating system shares the cores between them.
const THREADS_PER_CORE: usize = 4;

#[derive(Debug)]
pub(crate) struct EngineRuntime(Option<Runtime>);

impl EngineRuntime {
    pub(crate) fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        let runtime = Builder::new_multi_thread()
            .worker_threads(cores * THREADS_PER_CORE)
            .thread_stack_size(STACK_BYTES)
            .thread_name("query-engine")
            .enable_all()
            .build()
            .expect("the query engine's runtime starts (threads and timers are available)");
        Self(Some(runtime))
    }

    /// Runs `work` on the engine's threads. Dropping the returned future aborts the work.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, EngineError>> + Send + 'static,
    ) -> Result<T, EngineError> {
        let runtime =
            self.0.as_ref().ok_or_else(|| EngineError::Unavailable("the query engine has stopped".into()))?;
        let cancelled = Arc::new(AtomicBool::new(false));
        let task = runtime.spawn(CANCELLED.scope(Arc::clone(&cancelled), work));
        match (AbortOnDrop { task, cancelled }).await {
            Ok(result) => result,
            Err(err) if err.is_panic() => Err(panicked(err.into_panic())),
            Err(err) => Err(EngineError::Internal(Box::new(err))),
        }
    }
}

impl EngineRuntime {
    /// Runs `work` on the engine's runtime to its end, whether or not its caller still waits for it (work that
    /// answers other callers too); answers when it has ended.
    pub(crate) async fn run_detached(
        &self,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), EngineError> {
        let runtime =
            self.0.as_ref().ok_or_else(|| EngineError::Unavailable("the query engine has stopped".into()))?;
        // A dropped handle detaches the task; it is not aborted.
        match runtime.spawn(work).await {
            Ok(()) => Ok(()),
            Err(err) if err.is_panic() => Err(panicked(err.into_panic())),
            Err(err) => Err(EngineError::Internal(Box::new(err))),
        }
    }
}

/// A runtime of one worker thread for background work, made when first used, its threads (the blocking ones, for
/// file I/O, likewise) at a lower priority than the requests': at the lowest ([`BackgroundRuntime::idle`]), work
/// on it takes at most one core and only what queries leave idle; just below them
/// ([`BackgroundRuntime::below_requests`]), it keeps up with what requests hand it.
#[derive(Debug)]
pub(crate) struct BackgroundRuntime {
    name: &'static str,
    /// Whether its threads run at the lowest priority (niceness 19) or just below the requests' (10).
    lowest: bool,
    runtime: std::sync::OnceLock<Runtime>,
}

impl BackgroundRuntime {
    /// A runtime at the lowest priority (niceness 19).
    pub(crate) const fn idle(name: &'static str) -> Self {
        Self { name, lowest: true, runtime: std::sync::OnceLock::new() }
    }

    /// A runtime of one thread at niceness 10, for work that must keep up with what requests hand it (writing
    /// their records) without taking a core from them at equal weight: beside a busy request thread it has about
    /// a tenth of a core (one at 19, under 2%), in shorter turns.
    pub(crate) const fn below_requests(name: &'static str) -> Self {
        Self { name, lowest: false, runtime: std::sync::OnceLock::new() }
    }

    /// Its handle, the runtime made at the first call.
    pub(crate) fn handle(&self) -> Result<tokio::runtime::Handle, EngineError> {
        if let Some(runtime) = self.runtime.get() {
            return Ok(runtime.handle().clone());
        }
        let (name, lowest) = (self.name, self.lowest);
        let runtime = Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .thread_name(name)
            .on_thread_start(move || {
                if let Err(err) = lower_current_thread(lowest) {
                    tracing::warn!(error = %err, thread = name, "could not lower a background thread's priority");
                }
            })
            .enable_all()
            .build()
            .map_err(|err| EngineError::Internal(format!("the {name} thread: {err}").into()))?;
        if let Err(made_twice) = self.runtime.set(runtime) {
            made_twice.shutdown_background();
        }
        Ok(self.runtime.get().expect("set just above").handle().clone())
    }
}

impl Drop for BackgroundRuntime {
    fn drop(&mut self) {
        // Dropped from anywhere, an async context included: its thread is left to stop on its own.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Lowers the current thread's priority (on Linux its niceness, the thread's own): to the lowest, or to 10.
fn lower_current_thread(lowest: bool) -> Result<(), thread_priority::Error> {
    use thread_priority::{set_current_thread_priority, ThreadPriority, ThreadPriorityValue};
    set_current_thread_priority(if lowest {
        ThreadPriority::Min
    } else {
        // The crate maps 0..=99 onto niceness 19..=-20, rounding down: 22 is 10.
        ThreadPriority::Crossplatform(ThreadPriorityValue::try_from(22_u8).expect("22 is within 0..=99"))
    })
}

/// What a panic in the engine's work means to its caller. Work here only ever reads what a client sent (its
/// query, its upload) with DataFusion and Arrow, whose kernels panic on some inputs (a string array past 2 GiB,
/// a corrupt file's impossible lengths): the client's request failed on its own input, so it is told so (400)
/// with the panic's message, which names what overflowed, never where; the process goes on, and the panic is
/// logged as the bug in the engine it also is.
fn panicked(payload: Box<dyn std::any::Any + Send>) -> EngineError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    tracing::error!(panic = %message, "the engine panicked on a request's input");
    EngineError::InvalidQuery(format!(
        "The engine could not process this input: {}.",
        message.lines().next().unwrap_or("").trim_end_matches('.')
    ))
}

impl Drop for EngineRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is not allowed inside another runtime; this does not.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

tokio::task_local! {
    /// Set once the caller of the work running in this task went away ([`EngineRuntime::run`]).
    static CANCELLED: Arc<AtomicBool>;
}

/// Whether the caller of the current task's work went away: the flag an operator inside a long step (a join's
/// filter, `fair`) reads, since an aborted task stops only at its next poll. `None` outside [`EngineRuntime::run`].
pub(crate) fn cancellation() -> Option<Arc<AtomicBool>> {
    CANCELLED.try_with(Arc::clone).ok()
}

/// A task handle that aborts its task when dropped, so cancellation reaches the engine's threads: at the task's
/// next poll, and, through its flag, inside a step that polls nothing.
struct AbortOnDrop<T> {
    task: JoinHandle<T>,
    cancelled: Arc<AtomicBool>,
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Release);
        self.task.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.task).poll(cx)
    }
}
