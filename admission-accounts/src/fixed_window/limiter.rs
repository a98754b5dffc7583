//! The standalone limiter: what a user of the fixed window alone calls. A permit now or never
//! ([`try_acquire`](FixedWindow::try_acquire)), a permit within the max wait, blocking
//! ([`acquire`](FixedWindow::acquire), [`acquire_cancellable`](FixedWindow::acquire_cancellable))
//! or async ([`acquire_async`](FixedWindow::acquire_async)), an operation run on a permit
//! ([`call`](FixedWindow::call), [`call_async`](FixedWindow::call_async)), and the listener that
//! hears each outcome.
//!
//! Every acquire is a loop of rounds: one compare-and-swap on the state word, then either an
//! outcome (reported to the listener) or a sleep until the next window opens, when that window
//! opens no later than the caller's deadline. How it sleeps is `sleep.rs`'s.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use admission_core::Instant;

use super::sleep::{self, SleepFuture};
use super::{CancelToken, FixedWindow, FixedWindowError, FixedWindowEvent};

/// What one attempt of an acquire decided.
enum Round {
    /// A permit, or a rejection; reported to the listener already.
    Done(Result<(), FixedWindowError>),
    /// Sleep this long, then try again.
    Sleep(Duration),
}

impl FixedWindow {
    /// Takes a permit of the current window if one is left; never waits, whatever the max wait.
    ///
    /// # Errors
    ///
    /// [`FixedWindowError::Rejected`] when the window is spent.
    pub fn try_acquire(&self) -> Result<(), FixedWindowError> {
        match self.round(None) {
            Round::Done(outcome) => outcome,
            Round::Sleep(_) => Err(self.rejected()),
        }
    }

    /// Takes a permit, blocking the thread for later windows up to the max wait: through the
    /// sleeper, or with none given, asleep on the calling thread.
    ///
    /// A call that finds the window spent sleeps until the next window opens and races for a
    /// permit there, round after round. Its deadline is now plus the max wait; once the next
    /// window starts after the deadline, the call is rejected at once instead of sleeping towards
    /// a window it could not use. The wait cannot be ended from outside; use
    /// [`acquire_cancellable`](FixedWindow::acquire_cancellable) for a wait another thread may
    /// end.
    ///
    /// # Errors
    ///
    /// [`FixedWindowError::Rejected`] when no permit could be had within the max wait.
    ///
    /// # Panics
    ///
    /// When the sleeper panics; nothing is held.
    pub fn acquire(&self) -> Result<(), FixedWindowError> {
        self.acquire_blocking(None)
    }

    /// [`acquire`](FixedWindow::acquire), ended early with an error when `cancel` is cancelled.
    ///
    /// A cancelled wait fails; it is never retried silently, and it holds nothing: a permit is
    /// taken only in the step that returns `Ok`. The token is checked before every attempt; with
    /// no sleeper given a cancel also ends the sleep at once, while a sleeper that ignores the
    /// token is noticed when its sleep ends.
    ///
    /// # Errors
    ///
    /// [`FixedWindowError::Cancelled`] when `cancel` is cancelled before a permit is won (also
    /// when it already was on entry), [`FixedWindowError::Rejected`] as for `acquire`.
    pub fn acquire_cancellable(&self, cancel: &CancelToken) -> Result<(), FixedWindowError> {
        self.acquire_blocking(Some(cancel))
    }

    /// Takes a permit, waiting for later windows up to the max wait without blocking the thread.
    ///
    /// The wait is the given [`Sleeper`](super::Sleeper)'s async sleep, or with none given (and
    /// the `tokio` feature on) a timer of the tokio runtime that polls the future. The future
    /// starts no thread and never blocks inside `poll`. The deadline is read from the clock when
    /// this method is called, not at the first poll. The returned future is `Send`.
    ///
    /// # Errors
    ///
    /// [`FixedWindowError::Rejected`] when no permit could be had within the max wait;
    /// [`FixedWindowError::NoTimer`] when the call must wait for a later window but has nothing
    /// to wait on: no sleeper given, and no tokio runtime polling it or no `tokio` feature. A call
    /// that takes a permit at once, or is rejected at once, needs no timer.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is the cancellation: the pending sleep is dropped, nothing is retried
    /// and nothing is held, because a permit is taken only in the poll that returns it.
    ///
    /// # Panics
    ///
    /// With no sleeper given, on a tokio runtime built without its time driver (`enable_time`),
    /// as every tokio timer does.
    ///
    /// # Examples
    ///
    /// On tokio, with the `tokio` feature (a wait for the next window would sleep on the
    /// runtime's timer):
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::fixed_window::FixedWindow;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = FixedWindow::of("api", 100, Duration::from_secs(1))?
    ///     .with_max_wait(Duration::from_millis(500));
    /// api.acquire_async().await?;
    /// assert_eq!(api.snapshot().used, 1);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Polled where no tokio runtime runs, with no sleeper given, a call that must wait fails at
    /// once, holding nothing, and says what is missing:
    ///
    /// ```
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    /// use std::time::Duration;
    /// use admission_accounts::fixed_window::{FixedWindow, FixedWindowError};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let sms = FixedWindow::of("sms", 1, Duration::from_secs(60))?
    ///     .with_max_wait(Duration::from_secs(60));
    /// sms.try_acquire()?;
    /// let mut call = pin!(sms.acquire_async());
    /// let polled = call.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    /// let Poll::Ready(Err(error @ FixedWindowError::NoTimer { .. })) = polled else {
    ///     panic!("expected NoTimer, got {polled:?}");
    /// };
    /// assert!(error.to_string().contains("`FixedWindow::with_sleeper`"));
    /// assert_eq!(sms.snapshot().used, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_async(&self) -> impl Future<Output = Result<(), FixedWindowError>> + Send + '_ {
        let deadline = self.deadline();
        async move {
            loop {
                match self.round(Some(deadline)) {
                    Round::Done(outcome) => return outcome,
                    Round::Sleep(duration) => self.async_sleep(duration)?.await,
                }
            }
        }
    }

    /// Runs `operation` on a permit from [`acquire`](FixedWindow::acquire) and returns what it
    /// returns.
    ///
    /// # Errors
    ///
    /// As for `acquire`; on an error `operation` has not run.
    ///
    /// # Panics
    ///
    /// When `operation` panics; the permit stays spent.
    pub fn call<T>(&self, operation: impl FnOnce() -> T) -> Result<T, FixedWindowError> {
        self.acquire()?;
        Ok(operation())
    }

    /// Runs the future `operation` makes on a permit from
    /// [`acquire_async`](FixedWindow::acquire_async) and returns its output. `operation` is
    /// called only once the permit is won.
    ///
    /// # Errors
    ///
    /// As for `acquire_async`; on an error `operation` has not been called.
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting, nothing is held and `operation` is never called. Dropped while the
    /// operation runs, the permit stays spent, as it would had the operation finished.
    pub fn call_async<F, Fut>(
        &self,
        operation: F,
    ) -> impl Future<Output = Result<Fut::Output, FixedWindowError>>
    where
        F: FnOnce() -> Fut,
        Fut: Future,
    {
        let permit = self.acquire_async();
        async move {
            permit.await?;
            Ok(operation().await)
        }
    }

    /// Now plus the max wait, clamped to [`Instant::MAX`].
    fn deadline(&self) -> Instant {
        self.config.clock.now().saturating_add(self.config.max_wait)
    }

    fn blocking_sleep(&self, duration: Duration, cancel: Option<&CancelToken>) {
        match (&self.config.sleeper, cancel) {
            (Some(sleeper), Some(cancel)) => sleeper.sleep_cancellable(duration, cancel),
            (Some(sleeper), None) => sleeper.sleep(duration),
            (None, cancel) => sleep::sleep_here(duration, cancel),
        }
    }

    /// The sleep of `duration` an async acquire awaits: the sleeper's, or the runtime's timer, or
    /// the error that says neither is there.
    fn async_sleep(&self, duration: Duration) -> Result<SleepFuture, FixedWindowError> {
        match &self.config.sleeper {
            Some(sleeper) => Ok(sleeper.sleep_async(duration)),
            None => {
                sleep::sleep_on_runtime(duration).map_err(|missing| FixedWindowError::NoTimer {
                    name: self.config.name,
                    wait: duration,
                    missing,
                })
            }
        }
    }

    fn acquire_blocking(&self, cancel: Option<&CancelToken>) -> Result<(), FixedWindowError> {
        let deadline = self.deadline();
        loop {
            if cancel.is_some_and(CancelToken::is_cancelled) {
                return Err(FixedWindowError::Cancelled {
                    name: self.config.name,
                });
            }
            match self.round(Some(deadline)) {
                Round::Done(outcome) => return outcome,
                Round::Sleep(duration) => self.blocking_sleep(duration, cancel),
            }
        }
    }

    /// One attempt: a permit (reported), a rejection (reported), or how long to sleep until the
    /// next window when it opens no later than `deadline`. `None` never sleeps.
    fn round(&self, deadline: Option<Instant>) -> Round {
        let config = &self.config;
        let now = config.clock.now();
        match self.word.take(now, 1, 0, config.limit) {
            Ok(view) => {
                self.emit(|| FixedWindowEvent::Permitted {
                    at: now,
                    name: config.name,
                    remaining: config.limit.saturating_sub(view.used),
                });
                Round::Done(Ok(()))
            }
            Err(view) => {
                let next = self.word.next_start(view);
                if let (Some(next), Some(deadline)) = (next, deadline)
                    && next <= deadline
                {
                    return Round::Sleep(next.saturating_duration_since(now));
                }
                self.emit(|| FixedWindowEvent::Rejected {
                    at: now,
                    name: config.name,
                    estimated_wait: next
                        .map_or(Duration::MAX, |next| next.saturating_duration_since(now)),
                });
                Round::Done(Err(self.rejected()))
            }
        }
    }

    fn rejected(&self) -> FixedWindowError {
        FixedWindowError::Rejected {
            name: self.config.name,
            limit: self.config.limit,
            period: self.config.period,
            max_wait: self.config.max_wait,
        }
    }

    /// Hands the event `make` builds to the listener, if there is one; a panic in it is caught
    /// and dropped. No event is built without a listener.
    fn emit(&self, make: impl FnOnce() -> FixedWindowEvent) {
        let Some(listener) = &self.config.listener else {
            return;
        };
        let event = make();
        if catch_unwind(AssertUnwindSafe(|| listener(&event))).is_err() {
            tracing::debug!(
                limiter = self.config.name,
                "a fixed window listener panicked; the panic was ignored"
            );
        }
    }
}
