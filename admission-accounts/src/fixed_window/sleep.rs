//! How a waiting caller passes the time until the next window: the [`Sleeper`] trait a caller may
//! pass, what the limiter waits with when none was given, and the [`CancelToken`] that ends a
//! blocking wait early.
//!
//! The limiter never sleeps by itself and starts no thread. It computes from its
//! [`Clock`](admission_core::Clock) how long until the next window opens and waits that long:
//!
//! - through the [`Sleeper`] given to
//!   [`FixedWindow::with_sleeper`](super::FixedWindow::with_sleeper), if there is one (a
//!   runtime's timer, or a fake that advances a fake clock in tests);
//! - otherwise a blocking acquire sleeps on the calling thread, which asked to block (on the
//!   [`CancelToken`] when it has one, so a cancel wakes it);
//! - and an async acquire waits on the timer of the tokio runtime that polls it (feature `tokio`:
//!   `tokio::runtime::Handle::try_current`, then `tokio::time::sleep`). With no runtime there, or
//!   without the feature, it fails with
//!   [`FixedWindowError::NoTimer`](super::FixedWindowError::NoTimer) naming what is missing
//!   ([`MissingTimer`]), rather than block the executor's thread inside `poll` or start a thread
//!   to sleep on.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// The future an async sleep returns.
pub type SleepFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a fixed window waits with, when the default will not do: a blocking sleep and an async
/// one.
///
/// Without a sleeper, a blocking wait sleeps on the calling thread and an async wait on the timer
/// of the tokio runtime polling it (feature `tokio`), and fails with
/// [`FixedWindowError::NoTimer`](super::FixedWindowError::NoTimer) where there is none; see
/// [`FixedWindow::with_sleeper`](super::FixedWindow::with_sleeper). A caller on another runtime
/// passes one whose async sleep is that runtime's timer; a test passes one that advances a fake
/// clock.
///
/// The limiter asks for one sleep per window it waits for, of exactly the time until that window
/// opens by its clock, then competes for a permit again; a sleeper that wakes early only costs
/// another round.
///
/// # Examples
///
/// A sleeper on a runtime's own timer, passed to
/// [`FixedWindow::with_sleeper`](super::FixedWindow::with_sleeper) so that
/// [`acquire_async`](super::FixedWindow::acquire_async) waits on it. This one is tokio's, as a
/// build without the `tokio` feature would write it; for another runtime, return its sleep
/// (async-std's `task::sleep`, smol's `Timer::after`) boxed the same way:
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use admission_accounts::fixed_window::{FixedWindow, SleepFuture, Sleeper};
///
/// struct RuntimeSleeper;
///
/// impl Sleeper for RuntimeSleeper {
///     fn sleep(&self, duration: Duration) {
///         std::thread::sleep(duration);
///     }
///     fn sleep_async(&self, duration: Duration) -> SleepFuture {
///         Box::pin(tokio::time::sleep(duration))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let sms = FixedWindow::of("sms", 10, Duration::from_secs(1))?
///     .with_max_wait(Duration::from_secs(2))
///     .with_sleeper(Arc::new(RuntimeSleeper));
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
    /// returns; the limiter's own blocking wait (no sleeper given) wakes at the cancel.
    fn sleep_cancellable(&self, duration: Duration, cancel: &CancelToken) {
        let _ = cancel;
        self.sleep(duration);
    }

    /// A future that completes after `duration`. Dropping it must stop the wait.
    ///
    /// It is called inside the acquire's `poll`, so it must neither block nor wait for anything:
    /// it registers the sleep with a timer and returns.
    fn sleep_async(&self, duration: Duration) -> SleepFuture;
}

/// Why an async acquire with no sleeper found no timer to wait on, as
/// [`FixedWindowError::NoTimer`](super::FixedWindowError::NoTimer) reports it.
///
/// # Examples
///
/// ```
/// use admission_accounts::fixed_window::MissingTimer;
///
/// assert_eq!(
///     MissingTimer::NoRuntime.to_string(),
///     "no tokio runtime is running on the thread that polled the call"
/// );
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MissingTimer {
    /// `admission-accounts` was built without its `tokio` feature, which lends an async acquire
    /// the timer of the tokio runtime polling it.
    TokioFeatureOff,
    /// The `tokio` feature is on, but the thread that polled the acquire runs no tokio runtime
    /// (nor is inside one entered with `Runtime::enter`).
    NoRuntime,
}

impl fmt::Display for MissingTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MissingTimer::TokioFeatureOff => {
                "admission-accounts was built without its `tokio` feature"
            }
            MissingTimer::NoRuntime => {
                "no tokio runtime is running on the thread that polled the call"
            }
        })
    }
}

/// The blocking wait with no sleeper given: the calling thread sleeps `duration`, on `cancel`
/// when there is one, so that a cancel ends the sleep at once.
pub(super) fn sleep_here(duration: Duration, cancel: Option<&CancelToken>) {
    match cancel {
        Some(cancel) => {
            cancel.wait_timeout(duration);
        }
        None => thread::sleep(duration),
    }
}

/// The async wait with no sleeper given: tokio's timer, on the runtime polling the caller.
///
/// # Panics
///
/// Inside a tokio runtime built without its time driver (`enable_time`), as every tokio timer
/// does.
#[cfg(feature = "tokio")]
pub(super) fn sleep_on_runtime(duration: Duration) -> Result<SleepFuture, MissingTimer> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(Box::pin(tokio::time::sleep(duration))),
        Err(_) => Err(MissingTimer::NoRuntime),
    }
}

/// The async wait with no sleeper given, in a build without the `tokio` feature: there is no
/// timer to wait on.
#[cfg(not(feature = "tokio"))]
pub(super) fn sleep_on_runtime(duration: Duration) -> Result<SleepFuture, MissingTimer> {
    let _ = duration;
    Err(MissingTimer::TokioFeatureOff)
}

/// A cancellation switch for a blocking wait, shared by clones.
///
/// Pass it to [`FixedWindow::acquire_cancellable`](super::FixedWindow::acquire_cancellable) and
/// call [`cancel`](CancelToken::cancel) from another thread: the waiter wakes (at once when no
/// sleeper was given) and fails with
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
    fn a_cancel_from_another_thread_wakes_the_blocking_wait() {
        let token = CancelToken::new();
        let canceller = token.clone();
        let sleeper = thread::spawn(move || {
            sleep_here(Duration::MAX, Some(&token));
            token.is_cancelled()
        });
        canceller.cancel();
        assert!(sleeper.join().expect("the sleeping thread panicked"));
    }

    #[cfg(feature = "tokio")]
    #[test]
    fn outside_a_runtime_the_async_wait_names_the_missing_runtime() {
        assert_eq!(
            sleep_on_runtime(Duration::from_secs(1)).err(),
            Some(MissingTimer::NoRuntime)
        );
    }

    #[cfg(not(feature = "tokio"))]
    #[test]
    fn without_the_tokio_feature_the_async_wait_names_the_feature() {
        assert_eq!(
            sleep_on_runtime(Duration::from_secs(1)).err(),
            Some(MissingTimer::TokioFeatureOff)
        );
    }
}
