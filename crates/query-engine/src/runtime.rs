//! The engine's own runtime: DataFusion's CPU-bound planning and execution run here, on threads with deep
//! stacks, instead of on the HTTP server's threads.
//!
//! DataFusion formats and walks expression trees recursively; a query with thousands of chained operators needs
//! far more stack than a default 2 MiB thread has (a 1,000-term sum overflowed one and aborted the process).
//! Stack is reserved, not committed, so the large size costs address space only.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use domain::EngineError;
use tokio::runtime::{Builder, Runtime};
use tokio::task::{JoinError, JoinHandle};

/// Stack of each engine thread.
const STACK_BYTES: usize = 256 * 1024 * 1024;

#[derive(Debug)]
pub(crate) struct EngineRuntime(Option<Runtime>);

impl EngineRuntime {
    pub(crate) fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads)
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
        match (AbortOnDrop(runtime.spawn(work))).await {
            Ok(result) => result,
            Err(err) => Err(EngineError::Internal(Box::new(err))),
        }
    }
}

impl Drop for EngineRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is not allowed inside another runtime; this does not.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// A task handle that aborts its task when dropped, so cancellation reaches the engine's threads.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}
