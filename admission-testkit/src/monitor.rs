//! Helpers for monitor tests: waiters on threads and on tasks, and waiting for the line to settle.
//!
//! Waiting here is synchronization with other threads (has the waiter parked yet?), never a wait
//! for time to pass: every deadline and refill in a test is driven by [`FakeClock`](crate::FakeClock).

use std::future::Future;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use admission_core::{AdmitError, Demand, Grant, JobContext, Monitor};

/// How long a helper waits for other threads before declaring the test hung.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Spins (yielding) until `condition` holds; panics with `what` after [`PATIENCE`].
///
/// # Panics
///
/// When the condition does not hold within [`PATIENCE`]: the test is hung.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    let mut spins = 0u32;
    while !condition() {
        assert!(
            started.elapsed() < PATIENCE,
            "timed out waiting until {what}"
        );
        spins = spins.saturating_add(1);
        if spins < 1_000 {
            thread::yield_now();
        } else {
            // Let a loaded machine's other threads run; this is not a wait for admission's time.
            thread::park_timeout(Duration::from_micros(200));
        }
    }
}

/// Waits until `monitor` has exactly `n` parked waiters.
///
/// # Panics
///
/// After [`PATIENCE`] without that count.
pub fn wait_for_queue(monitor: &Monitor, n: usize) {
    wait_until(
        &format!("the line holds {n} (it holds {})", monitor.queue_size()),
        || monitor.queue_size() == n,
    );
}

/// A waiter running `admit_blocking` on its own thread.
#[derive(Debug)]
pub struct ThreadWaiter {
    ctx: JobContext,
    result: mpsc::Receiver<Result<Grant, AdmitError>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl ThreadWaiter {
    /// The waiter's job context (cancel it to withdraw the waiter).
    pub fn context(&self) -> &JobContext {
        &self.ctx
    }

    /// The outcome if it has arrived.
    pub fn try_outcome(&self) -> Option<Result<Grant, AdmitError>> {
        self.result.try_recv().ok()
    }

    /// Waits for the outcome.
    ///
    /// # Panics
    ///
    /// After [`PATIENCE`] without one.
    pub fn outcome(mut self) -> Result<Grant, AdmitError> {
        let outcome = self
            .result
            .recv_timeout(PATIENCE)
            .expect("the waiter thread produced no outcome in time");
        if let Some(handle) = self.handle.take() {
            handle.join().expect("the waiter thread panicked");
        }
        outcome
    }
}

/// Starts `admit_blocking(demand, ctx, timeout)` on a new thread.
pub fn spawn_thread_waiter(
    monitor: &Monitor,
    demand: Demand,
    ctx: JobContext,
    timeout: Option<Duration>,
) -> ThreadWaiter {
    let (tx, rx) = mpsc::channel();
    let monitor = monitor.clone();
    let job = ctx.clone();
    let handle = thread::spawn(move || {
        let _ = tx.send(monitor.admit_blocking(demand, &job, timeout));
    });
    ThreadWaiter {
        ctx,
        result: rx,
        handle: Some(handle),
    }
}

/// A waiter running the [`admit`](Monitor::admit) future as a tokio task (feature `tokio`).
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub struct TaskWaiter {
    ctx: JobContext,
    handle: tokio::task::JoinHandle<Result<Grant, AdmitError>>,
}

#[cfg(feature = "tokio")]
impl TaskWaiter {
    /// The waiter's job context.
    pub fn context(&self) -> &JobContext {
        &self.ctx
    }

    /// Aborts the task, dropping the pending admit future.
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// Awaits the outcome (`None` if the task was aborted).
    pub async fn outcome(self) -> Option<Result<Grant, AdmitError>> {
        self.handle.await.ok()
    }
}

/// Spawns `admit(demand, ctx, timeout)` on the current tokio runtime (feature `tokio`).
///
/// # Panics
///
/// Outside a tokio runtime.
#[cfg(feature = "tokio")]
pub fn spawn_task_waiter(
    monitor: &Monitor,
    demand: Demand,
    ctx: JobContext,
    timeout: Option<Duration>,
) -> TaskWaiter {
    let admit = monitor.admit(demand, &ctx, timeout);
    TaskWaiter {
        ctx,
        handle: tokio::spawn(admit),
    }
}

/// Polls `future` once with a no-op waker; `Some` if it completed. Parks an admit in the line
/// without any executor.
///
/// An [`Admit`](admission_core::Admit) keeps its parked waiter's outcome slot inside itself, so
/// it must stay in place once polled: pin it first (`Box::pin(monitor.admit(..))`, or
/// `std::pin::pin!` and `poll_once(&mut admit)` on the pinned reference).
pub fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(future).poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

/// Parks `count` waiters in `monitor`'s line, each asking for a fresh `demand()` under a job
/// named `waiter-{i}`, and returns their admits, each pinned in a box of its own (dropping one
/// withdraws it). For benches and tests that need a long line standing still.
///
/// # Panics
///
/// When a waiter is granted or refused instead of parking.
pub fn park_waiters(
    monitor: &Monitor,
    count: usize,
    mut demand: impl FnMut() -> Demand,
) -> Vec<std::pin::Pin<Box<admission_core::Admit>>> {
    (0..count)
        .map(|i| {
            let mut admit =
                Box::pin(monitor.admit(demand(), &JobContext::new(format!("waiter-{i}")), None));
            assert!(poll_once(&mut admit).is_none(), "waiter {i} did not park");
            admit
        })
        .collect()
}
