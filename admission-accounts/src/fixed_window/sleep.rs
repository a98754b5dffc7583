//! How a waiting caller passes the time until the next window: the [`Sleeper`] trait, the
//! default [`ThreadSleeper`], and the [`CancelToken`] that ends a blocking wait early.
//!
//! The limiter never sleeps by itself and depends on no async runtime. It computes from its
//! [`Clock`](admission_core::Clock) how long until the next window opens and hands that duration
//! to its sleeper: a thread sleep by default, a runtime's timer for async callers, a fake that
//! advances a fake clock in tests.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// What a fixed window waits with: a blocking sleep and an async one.
///
/// The limiter asks for one sleep per window it waits for, of exactly the time until that window
/// opens by its clock, then competes for a permit again; a sleeper that wakes early only costs
/// another round.
///
/// # Examples
///
/// A sleeper for tokio, passed to [`FixedWindow::with_sleeper`](super::FixedWindow::with_sleeper)
/// so that [`acquire_async`](super::FixedWindow::acquire_async) waits on tokio's timer instead of
/// a helper thread:
///
/// ```
/// use std::future::Future;
/// use std::pin::Pin;
/// use std::sync::Arc;
/// use std::time::Duration;
/// use admission_accounts::fixed_window::{FixedWindow, Sleeper};
///
/// struct TokioSleeper;
///
/// impl Sleeper for TokioSleeper {
///     fn sleep(&self, duration: Duration) {
///         std::thread::sleep(duration);
///     }
///     fn sleep_async(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
///         Box::pin(tokio::time::sleep(duration))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let sms = FixedWindow::of("sms", 10, Duration::from_secs(1))?
///     .with_max_wait(Duration::from_secs(2))
///     .with_sleeper(Arc::new(TokioSleeper));
/// sms.acquire_async().await?;
/// # Ok(())
/// # }
/// ```
pub trait Sleeper: Send + Sync + 'static {
    /// Blocks the calling thread for `duration`.
    fn sleep(&self, duration: Duration);

    /// Blocks for `duration`, or less once `cancel` is cancelled.
    ///
    /// The default sleeps the whole `duration` and leaves the cancellation to be seen when it
    /// returns; [`ThreadSleeper`] wakes at the cancel.
    fn sleep_cancellable(&self, duration: Duration, cancel: &CancelToken) {
        let _ = cancel;
        self.sleep(duration);
    }

    /// A future that completes after `duration`. Dropping it must stop the wait.
    fn sleep_async(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The default [`Sleeper`]: the thread sleeps, and an async wait parks a helper thread.
///
/// The async sleep starts one short-lived helper thread per wait, which ends early when the
/// future is dropped. That works under any executor but costs a thread per waiting task; async
/// services should pass their runtime's timer instead (see [`Sleeper`]).
#[derive(Copy, Clone, Debug, Default)]
pub struct ThreadSleeper;

impl Sleeper for ThreadSleeper {
    fn sleep(&self, duration: Duration) {
        thread::sleep(duration);
    }

    fn sleep_cancellable(&self, duration: Duration, cancel: &CancelToken) {
        cancel.wait_timeout(duration);
    }

    fn sleep_async(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(HelperSleep::new(duration))
    }
}

/// A cancellation switch for a blocking wait, shared by clones.
///
/// Pass it to [`FixedWindow::acquire_cancellable`](super::FixedWindow::acquire_cancellable) and
/// call [`cancel`](CancelToken::cancel) from another thread: the waiter wakes (with
/// [`ThreadSleeper`]) and fails with
/// [`FixedWindowError::Cancelled`](super::FixedWindowError::Cancelled).
///
/// # Examples
///
/// ```
/// use admission_accounts::fixed_window::CancelToken;
///
/// let token = CancelToken::new();
/// let same = token.clone();
/// assert!(!token.is_cancelled());
/// same.cancel();
/// assert!(token.is_cancelled());
/// ```
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<CancelInner>,
}

#[derive(Default)]
struct CancelInner {
    /// Set once, never cleared.
    cancelled: AtomicBool,
    /// Held only to pair the flag with `signal`, so a cancel cannot slip between a sleeper's
    /// check of the flag and its wait.
    lock: Mutex<()>,
    signal: Condvar,
}

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancels: every wait on this token ends. Idempotent.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::Release);
        let _paired = self.inner.lock.lock();
        self.inner.signal.notify_all();
    }

    /// True once [`cancel`](CancelToken::cancel) has been called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// Parks the calling thread for up to `timeout`, returning early at the cancel. Returns
    /// whether the token is cancelled.
    ///
    /// The wait may also end early spuriously; callers that need the full time re-check their
    /// clock, as the fixed window does.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let mut paired = self.inner.lock.lock();
        if !self.is_cancelled() {
            // parking_lot waits forever when `timeout` overflows its deadline; no panic.
            let _ = self.inner.signal.wait_for(&mut paired, timeout);
        }
        self.is_cancelled()
    }
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// [`ThreadSleeper`]'s async sleep: a helper thread waits on a [`CancelToken`] and wakes the task.
struct HelperSleep {
    duration: Duration,
    /// Shared with the helper thread; `None` until the first poll starts it.
    shared: Option<Arc<HelperShared>>,
}

struct HelperShared {
    /// Cancelled by the future's drop, so the helper ends with the wait it serves.
    stop: CancelToken,
    /// The waker to call when the time is up, and whether it is.
    state: Mutex<(bool, Option<Waker>)>,
}

impl HelperSleep {
    fn new(duration: Duration) -> HelperSleep {
        HelperSleep {
            duration,
            shared: None,
        }
    }
}

impl Future for HelperSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if let Some(shared) = &this.shared {
            let mut state = shared.state.lock();
            if state.0 {
                return Poll::Ready(());
            }
            state.1 = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let shared = Arc::new(HelperShared {
            stop: CancelToken::new(),
            state: Mutex::new((false, Some(cx.waker().clone()))),
        });
        let helper = shared.clone();
        let duration = this.duration;
        let spawned = thread::Builder::new()
            .name("fixed-window-sleep".into())
            .spawn(move || {
                if helper.stop.wait_timeout(duration) {
                    return;
                }
                let waker = {
                    let mut state = helper.state.lock();
                    state.0 = true;
                    state.1.take()
                };
                if let Some(waker) = waker {
                    waker.wake();
                }
            });
        if spawned.is_err() {
            // No thread to spare: sleep here rather than spin the executor.
            thread::sleep(duration);
            return Poll::Ready(());
        }
        this.shared = Some(shared);
        Poll::Pending
    }
}

impl Drop for HelperSleep {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.stop.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_token_ends_a_wait_at_once() {
        let token = CancelToken::new();
        token.cancel();
        assert!(token.wait_timeout(Duration::MAX));
    }

    #[test]
    fn a_cancel_from_another_thread_wakes_the_sleeper() {
        let token = CancelToken::new();
        let canceller = token.clone();
        let sleeper = thread::spawn(move || {
            ThreadSleeper.sleep_cancellable(Duration::MAX, &token);
            token.is_cancelled()
        });
        canceller.cancel();
        assert!(sleeper.join().expect("the sleeper thread panicked"));
    }

    #[test]
    fn dropping_the_async_sleep_stops_its_helper() {
        let mut sleep = HelperSleep::new(Duration::MAX);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        let shared = sleep
            .shared
            .clone()
            .expect("the first poll starts the helper");
        drop(sleep);
        assert!(shared.stop.is_cancelled());
    }
}
