//! [`FixedWindow`]: a standalone fixed-window rate limiter (`limit` calls per `period`) that is
//! also an [`Account`], so a fixed window can sit in a demand beside the other families.
//!
//! The algorithm is the classic fixed-window counter: time is cut into back-to-back windows of
//! one period each, and each window admits at most `limit` calls. Unlike GCRA (governor's
//! algorithm), which spaces calls evenly, a fixed window admits a burst of its whole limit at
//! any point of a window and forgets everything when the window turns.
//!
//! - The windows are laid on a grid anchored at the limiter's creation, as read from its
//!   [`Clock`], not at wall-clock boundaries; a call places itself on the grid by whole periods,
//!   however long the limiter sat idle.
//! - The whole state is one atomic word, the window's index and the permits used in it, updated
//!   by compare-and-swap (see [the state](self#the-state) below for the packing and its bounds).
//!   There is no lock; callers race for permits.
//! - Permits left unused in a window are lost when it ends; each window begins at zero.
//! - By default a call that finds the window spent is rejected at once. With a max wait it
//!   sleeps (through its [`Sleeper`]) until the next window opens and races for a permit there,
//!   round after round, until it wins one or its deadline falls before the next window's start;
//!   a wait that cannot end in time is refused on the spot rather than slept through.
//!
//! # The state
//!
//! The word keeps the window index (periods since creation) in its high bits and the used count
//! in its low bits. The index gets exactly the bits needed to count every window a 64-bit
//! nanosecond clock can reach, so it never wraps; the count gets the rest. That bounds the limit
//! to about one permit per nanosecond of period ([`FixedWindow::max_limit`]: 536,870,911 for a
//! second, 524,287 for a millisecond); a larger limit is a [`ConfigError`].
//!
//! # Extreme values
//!
//! Instants are `u64` nanoseconds and no arithmetic here can panic:
//! - a period or max wait longer than `u64::MAX` nanoseconds (about 584 years) is cut to that
//!   before any arithmetic;
//! - a deadline beyond the clock's range is clamped to [`Instant::MAX`], which only means "wait
//!   as long as the clock lasts";
//! - a spent window whose successor would begin past [`Instant::MAX`] refuses the call on the
//!   spot, since no max wait could reach that window;
//! - a reading is placed in its window by dividing the time elapsed since creation, which cannot
//!   overflow; the one reading that cannot be placed, a clock reading earlier than the limiter's
//!   creation (a clock breaking its monotonic promise), counts against the window already
//!   current, so the window never moves backwards and no count is lost.

mod event;
mod sleep;
mod status;
mod word;

use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Clock, Instant, Refusal, Replenishment,
    SystemClock, WakeFn, WakeSlot,
};

pub use event::{FixedWindowError, FixedWindowEvent};
pub use sleep::{CancelToken, Sleeper, ThreadSleeper};
pub use status::FixedWindowStatus;

use crate::ConfigError;
use word::Word;

/// The family's name in configuration errors.
const LIMITER: &str = "fixed window";

/// The listener installed with [`FixedWindow::with_listener`].
type Listener = Arc<dyn Fn(&FixedWindowEvent) + Send + Sync>;

/// What a limiter was built from; every `with_` copies it, changes one thing and starts afresh.
#[derive(Clone)]
struct Config {
    name: &'static str,
    /// At least 1 and at most [`FixedWindow::max_limit`] of `period`.
    limit: u64,
    /// Positive.
    period: Duration,
    max_wait: Duration,
    clock: Arc<dyn Clock>,
    sleeper: Arc<dyn Sleeper>,
    listener: Option<Listener>,
}

/// A fixed-window rate limiter: at most `limit` permits in each `period`, windows aligned to the
/// limiter's creation.
///
/// Build one with [`FixedWindow::of`] and the `with_` methods; each `with_` returns a new limiter
/// with a fresh window (anchored at the moment it is built, with nothing used). Share one limiter
/// (in an `Arc`) among every caller that must stay under the same budget.
///
/// As a standalone limiter it is asked with [`try_acquire`](FixedWindow::try_acquire),
/// [`acquire`](FixedWindow::acquire), [`acquire_async`](FixedWindow::acquire_async) or the
/// [`call`](FixedWindow::call) helpers, and reports each outcome to its listener. As an
/// [`Account`] it counts the primary dimension of an amount against the current window and
/// replenishes with time: each [`ask`](Account::ask) is one compare-and-swap that takes the
/// permits when they fit the window beside the head's reservation, answers "not now" until the
/// next window opens, or refuses for good an amount above the limit
/// ([`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge)). It reports nothing to its
/// listener when asked as an account: the monitor reports its own events.
///
/// # Fairness
///
/// None: callers race for permits with compare-and-swap, and a waiter that wakes for a new
/// window competes there with everyone else, including callers that just arrived. Under
/// sustained overload a waiter can lose every round until its max wait runs out. Inside a
/// [`Demand`](admission_core::Demand), the monitor's line decides the order instead.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_accounts::fixed_window::{FixedWindow, FixedWindowError};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let sms = FixedWindow::of("sms", 2, Duration::from_secs(60))?;
/// assert_eq!(sms.call(|| "sent")?, "sent");
/// sms.try_acquire()?;
/// // The window is spent and the max wait is zero: rejected, and the operation does not run.
/// let third = sms.call(|| unreachable!("a rejected call never runs"));
/// assert!(matches!(third, Err(FixedWindowError::Rejected { limit: 2, .. })));
/// # Ok(())
/// # }
/// ```
pub struct FixedWindow {
    config: Config,
    /// The window and its count; the only state that changes after construction.
    word: Word,
    /// The monitor's wake-up, called when a give credits the current window.
    wake: WakeSlot,
}

impl FixedWindow {
    /// The category this family reports: a fixed-window rate limiter.
    pub const CATEGORY: Category = Category::custom("fixed_window");

    /// A limiter named `name` allowing `limit` calls per `period`, on the system clock, with no
    /// max wait (a spent window rejects at once), no listener, and the [`ThreadSleeper`].
    ///
    /// The name is a `&'static str` because it keys metrics and logs: a bounded set of names.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `limit` when it is zero or above [`FixedWindow::max_limit`] for
    /// the period, or naming `period` when it is zero.
    pub fn of(
        name: &'static str,
        limit: u64,
        period: Duration,
    ) -> Result<FixedWindow, ConfigError> {
        check_period(period)?;
        check_limit(limit, period, "limit")?;
        Ok(FixedWindow::fresh(Config {
            name,
            limit,
            period,
            max_wait: Duration::ZERO,
            clock: Arc::new(SystemClock::new()),
            sleeper: Arc::new(ThreadSleeper),
            listener: None,
        }))
    }

    /// The largest limit a window of `period` can count: `2^b - 1`, where `b` is what the state
    /// word has left after the window index takes the bits it needs (see the module docs). Zero
    /// for a 1 ns period.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::fixed_window::FixedWindow;
    ///
    /// assert_eq!(FixedWindow::max_limit(Duration::from_secs(1)), 536_870_911);
    /// assert_eq!(FixedWindow::max_limit(Duration::from_millis(1)), 524_287);
    /// assert!(FixedWindow::of("too-many", 524_288, Duration::from_millis(1)).is_err());
    /// ```
    pub fn max_limit(period: Duration) -> u64 {
        word::max_used(word::period_nanos(period))
    }

    /// The same limiter allowing `limit` calls per period, with a fresh window.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `limit` when it is zero or above [`FixedWindow::max_limit`].
    pub fn with_limit(&self, limit: u64) -> Result<FixedWindow, ConfigError> {
        check_limit(limit, self.config.period, "limit")?;
        Ok(self.rebuilt(|config| config.limit = limit))
    }

    /// The same limiter with windows of `period`, with a fresh window.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `period` when it is zero, or when the current limit does not fit
    /// a window that short ([`FixedWindow::max_limit`]).
    pub fn with_period(&self, period: Duration) -> Result<FixedWindow, ConfigError> {
        check_period(period)?;
        check_limit(self.config.limit, period, "period")?;
        Ok(self.rebuilt(|config| config.period = period))
    }

    /// The same limiter, where a call that finds the window spent may wait up to `max_wait` for
    /// a later window, with a fresh window. Zero (the default) rejects at once; any length is
    /// accepted, [`Duration::MAX`] included.
    pub fn with_max_wait(&self, max_wait: Duration) -> FixedWindow {
        self.rebuilt(|config| config.max_wait = max_wait)
    }

    /// The same limiter reporting every permit and rejection of the standalone API to
    /// `listener`, with a fresh window. A later listener replaces an earlier one.
    ///
    /// The listener runs on the caller's thread, after the decision; a listener that panics is
    /// ignored (the panic is caught, after the panic hook has run, and the call goes on as
    /// decided).
    pub fn with_listener(
        &self,
        listener: impl Fn(&FixedWindowEvent) + Send + Sync + 'static,
    ) -> FixedWindow {
        let listener: Listener = Arc::new(listener);
        self.rebuilt(|config| config.listener = Some(listener))
    }

    /// The same limiter reading `clock`, with a fresh window anchored at `clock`'s present
    /// reading. Mainly for tests: pass the test-kit's fake clock.
    pub fn with_clock(&self, clock: Arc<dyn Clock>) -> FixedWindow {
        self.rebuilt(|config| config.clock = clock)
    }

    /// The same limiter waiting through `sleeper`, with a fresh window. Async services pass their
    /// runtime's timer here (see [`Sleeper`] for tokio); tests pass a sleeper that advances a
    /// fake clock.
    pub fn with_sleeper(&self, sleeper: Arc<dyn Sleeper>) -> FixedWindow {
        self.rebuilt(|config| config.sleeper = sleeper)
    }

    /// The limiter's name.
    pub fn name(&self) -> &'static str {
        self.config.name
    }

    /// Permits per window.
    pub fn limit(&self) -> u64 {
        self.config.limit
    }

    /// The window's length, as configured.
    pub fn period(&self) -> Duration {
        self.config.period
    }

    /// How long a call may wait for a later window.
    pub fn max_wait(&self) -> Duration {
        self.config.max_wait
    }

    /// Where window 0 starts: the clock's reading when this limiter was built. Every window
    /// starts a whole number of periods after it.
    pub fn origin(&self) -> Instant {
        self.word.origin()
    }

    /// The current window read from the clock now: its start, the permits used in it, and the
    /// configuration. Changes nothing.
    pub fn snapshot(&self) -> FixedWindowStatus {
        let view = self.word.read(self.config.clock.now());
        FixedWindowStatus {
            name: self.config.name.to_owned(),
            limit: self.config.limit,
            period: self.config.period,
            used: view.used,
            window_start: self.word.start_of(view.index),
        }
    }

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

    /// Takes a permit, blocking the thread (through the sleeper) for later windows up to the max
    /// wait.
    ///
    /// A call that finds the window spent sleeps until the next window opens and races for a
    /// permit there, round after round. Its deadline is now plus the max wait; once the next
    /// window starts after the deadline, the call is rejected at once instead of sleeping towards
    /// a window it could not use.
    ///
    /// # Errors
    ///
    /// [`FixedWindowError::Rejected`] when no permit could be had within the max wait.
    ///
    /// # Panics
    ///
    /// When the sleeper panics; nothing is held.
    ///
    /// # Cancel safety
    ///
    /// This call cannot be cancelled; use [`acquire_cancellable`](FixedWindow::acquire_cancellable)
    /// for a wait another thread may end.
    pub fn acquire(&self) -> Result<(), FixedWindowError> {
        self.acquire_blocking(None)
    }

    /// [`acquire`](FixedWindow::acquire), ended early with an error when `cancel` is cancelled.
    ///
    /// # Errors
    ///
    /// [`FixedWindowError::Cancelled`] when `cancel` is cancelled before a permit is won (also
    /// when it already was on entry), [`FixedWindowError::Rejected`] as for `acquire`.
    ///
    /// # Cancel safety
    ///
    /// A cancelled wait fails; it is never retried silently, and it holds nothing: a permit is
    /// taken only in the step that returns `Ok`. The token is checked before every attempt; with
    /// [`ThreadSleeper`] a cancel also ends the sleep at once, while a sleeper that ignores the
    /// token is noticed when its sleep ends.
    pub fn acquire_cancellable(&self, cancel: &CancelToken) -> Result<(), FixedWindowError> {
        self.acquire_blocking(Some(cancel))
    }

    /// Takes a permit, waiting for later windows up to the max wait on the sleeper's async sleep.
    ///
    /// The deadline is read from the clock when this method is called, not at the first poll.
    /// The returned future is `Send` and runs on any executor that its sleeper's futures run on.
    ///
    /// # Errors
    ///
    /// [`FixedWindowError::Rejected`] when no permit could be had within the max wait.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is the cancellation: the pending sleep is dropped, nothing is retried
    /// and nothing is held, because a permit is taken only in the poll that returns it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::fixed_window::FixedWindow;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = FixedWindow::of("api", 100, Duration::from_secs(1))?;
    /// api.acquire_async().await?;
    /// assert_eq!(api.snapshot().used, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_async(&self) -> impl Future<Output = Result<(), FixedWindowError>> + Send + '_ {
        let deadline = self.deadline();
        async move {
            loop {
                match self.round(Some(deadline)) {
                    Round::Done(outcome) => return outcome,
                    Round::Sleep(duration) => self.config.sleeper.sleep_async(duration).await,
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

    /// A new limiter from this one's configuration, changed by `change`, with a fresh window.
    fn rebuilt(&self, change: impl FnOnce(&mut Config)) -> FixedWindow {
        let mut config = self.config.clone();
        change(&mut config);
        FixedWindow::fresh(config)
    }

    /// A limiter from a validated configuration; its window 0 starts at the clock's reading now.
    fn fresh(config: Config) -> FixedWindow {
        let word = Word::new(config.clock.now(), word::period_nanos(config.period));
        FixedWindow {
            config,
            word,
            wake: WakeSlot::new(),
        }
    }

    /// Now plus the max wait, clamped to [`Instant::MAX`].
    fn deadline(&self) -> Instant {
        self.config.clock.now().saturating_add(self.config.max_wait)
    }

    fn blocking_sleep(&self, duration: Duration, cancel: Option<&CancelToken>) {
        match cancel {
            Some(cancel) => self.config.sleeper.sleep_cancellable(duration, cancel),
            None => self.config.sleeper.sleep(duration),
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
                let next = self.word.next_start(view.index);
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

    /// The primary dimension of `mine`, or the refusal of an amount no window can hold.
    fn permits_of(&self, mine: Amount) -> Result<u64, Refusal> {
        let n = mine.primary();
        let config = &self.config;
        if n > config.limit {
            return Err(
                Refusal::too_large(mine, Amount::units(config.limit)).with_message(format!(
                    "fixed window `{}` allows {} calls per {:?} window, so a demand of {n} can \
                     never fit; ask for at most {} at a time",
                    config.name, config.limit, config.period, config.limit
                )),
            );
        }
        Ok(n)
    }
}

/// What one attempt of an acquire decided.
enum Round {
    /// A permit, or a rejection; reported to the listener already.
    Done(Result<(), FixedWindowError>),
    /// Sleep this long, then try again.
    Sleep(Duration),
}

fn check_period(period: Duration) -> Result<(), ConfigError> {
    if period.is_zero() {
        return Err(ConfigError::new(
            LIMITER,
            "period",
            "must be positive; got 0s",
        ));
    }
    Ok(())
}

/// Checks `limit` against `period`, blaming `field` when it does not fit the state word.
fn check_limit(limit: u64, period: Duration, field: &'static str) -> Result<(), ConfigError> {
    if limit == 0 {
        return Err(ConfigError::new(
            LIMITER,
            "limit",
            "must be at least 1; got 0",
        ));
    }
    let max = FixedWindow::max_limit(period);
    if limit > max {
        return Err(ConfigError::new(
            LIMITER,
            field,
            format!(
                "leaves room for at most {max} permits per {period:?} window (the count shares \
                 one 64-bit word with the window index); got a limit of {limit}"
            ),
        ));
    }
    Ok(())
}

impl Account for FixedWindow {
    fn name(&self) -> &str {
        self.config.name
    }

    fn category(&self) -> Category {
        FixedWindow::CATEGORY
    }

    fn replenishment(&self) -> Replenishment {
        Replenishment::Time
    }

    /// One compare-and-swap (one read for a look): `mine` permits are taken when they fit the
    /// current window beside the head's reservation. "Not now" names the start of the next
    /// window, when a fresh window holds `mine` with the reservation, and `None` when no window
    /// ever can (or the next one is past the end of the clock).
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let n = match self.permits_of(mine) {
            Ok(n) => n,
            Err(refusal) => return Answer::Never(refusal),
        };
        let reserved = ask.reserved_ahead().primary();
        let limit = self.config.limit;
        let now = self.config.clock.now();
        let fits = if ask.takes() {
            self.word.take(now, n, reserved, limit)
        } else {
            let view = self.word.read(now);
            if n.saturating_add(reserved) <= limit.saturating_sub(view.used) {
                Ok(view)
            } else {
                Err(view)
            }
        };
        match fits {
            Ok(_) => Answer::Taken,
            Err(_) if n.saturating_add(reserved) > limit => Answer::NotNow(None),
            Err(view) => Answer::NotNow(self.word.next_start(view.index)),
        }
    }

    /// Returns permits to the current window, never below zero used, and wakes the monitor.
    ///
    /// A give cannot tell which window its permits were taken in: it credits the window stored
    /// now if that window is still open, and credits nothing once it has ended (the window that
    /// follows starts empty anyway). The monitor rolls a take back within the same pass, so in
    /// practice the window has not turned in between.
    fn give(&self, amount: Amount) {
        let credited = self.word.give(self.config.clock.now(), amount.primary());
        if credited > 0 {
            self.wake.notify();
        }
    }

    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(self.snapshot())
    }

    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

impl fmt::Debug for FixedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let view = self.word.read(self.config.clock.now());
        f.debug_struct("FixedWindow")
            .field("name", &self.config.name)
            .field("limit", &self.config.limit)
            .field("period", &self.config.period)
            .field("max_wait", &self.config.max_wait)
            .field("window", &view.index)
            .field("used", &view.used)
            .field("listener", &self.config.listener.is_some())
            .finish_non_exhaustive()
    }
}
