//! [`FixedWindow`]: a fixed-window rate limiter (`limit` calls per `period`), used alone or as an
//! [`Account`](admission_core::Account) in a demand beside the other families.
//!
//! The algorithm is the classic fixed-window counter: time is cut into back-to-back windows of
//! one period each, and each window admits at most `limit` calls. Unlike GCRA (governor's
//! algorithm), which spaces calls evenly, a fixed window admits a burst of its whole limit at
//! any point of a window and forgets everything when the window turns.
//!
//! - The windows are laid on a grid anchored at the limiter's creation, as read from its
//!   [`Clock`], not at wall-clock boundaries; a call moves the window forward by the whole
//!   periods elapsed, however long the limiter sat idle.
//! - The whole state is one atomic word, the window's start and the permits used in it, updated
//!   by compare-and-swap (see [the state](self#the-state) below). There is no lock; callers race
//!   for permits.
//! - Permits left unused in a window are lost when it ends; each window begins at zero.
//! - The `with_` settings keep the window in progress, its start and its count; a new period
//!   applies from that window on. A new clock keeps the count only (see
//!   [`FixedWindow::with_clock`]).
//! - By default a call that finds the window spent is rejected at once. With a max wait it
//!   sleeps (on its own thread when it blocks, on the timer of the tokio runtime polling it when
//!   it is async, or through the [`Sleeper`] it was given) until the next window opens and races
//!   for a permit there, round after round, until it wins one or its deadline falls before the
//!   next window's start; a wait that cannot end in time is refused on the spot rather than slept
//!   through. The limiter starts no thread: an async wait with no sleeper and no tokio timer
//!   fails with [`FixedWindowError::NoTimer`] rather than block.
//! - Asked as an account, it counts the primary dimension of an amount against the same window,
//!   leaves the head's reservation aside, and reports nothing to its listener (the monitor
//!   reports its own events).
//!
//! # The state
//!
//! The word is 128 bits wide: the current window's start (a `u64` of nanoseconds, as every
//! [`Instant`]) in the high half, the permits used in it (at most the limit, a `u64`) in the low
//! half. Each half holds every value it can be asked to, so every limit of at least 1 is accepted
//! with every period of at least 1 ns, and a window anywhere on the clock's range is counted
//! exactly. It is one `AtomicU128` (`portable-atomic`): one `cmpxchg16b` on x86-64, one 128-bit
//! compare-and-swap on AArch64; only a target without a 128-bit compare-and-swap would fall back
//! to a lock.
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
//! - a reading moves the window forward by whole periods, to a start between the old one and the
//!   reading, which cannot overflow; a reading earlier than the stored window's start (a thread
//!   that read the clock before another moved the window, or a clock breaking its monotonic
//!   promise) counts against the stored window, so the window never moves backwards and no count
//!   is lost.
//!
//! # Layout
//!
//! This file holds the type, its configuration and what reads it back; `limiter.rs` the
//! standalone API (acquire, call, the listener); `account.rs` the [`Account`] implementation;
//! `word.rs` the state word; `sleep.rs`, `event.rs` and `status.rs` how waiters sleep, what the
//! listener hears and the status record.
//!
//! [`Account`]: admission_core::Account

mod account;
mod event;
mod limiter;
mod sleep;
mod status;
mod word;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{Category, Clock, Instant, SystemClock, WakeSlot};

pub use event::{FixedWindowError, FixedWindowEvent};
pub use sleep::{CancelToken, MissingTimer, SleepFuture, Sleeper};
pub use status::FixedWindowStatus;

use crate::ConfigError;
use word::{View, Word};

/// The family's name in configuration errors.
const LIMITER: &str = "fixed window";

/// The listener installed with [`FixedWindow::with_listener`].
type Listener = Arc<dyn Fn(&FixedWindowEvent) + Send + Sync>;

/// What a limiter was built from; each `with_` changes one thing.
struct Config {
    name: &'static str,
    /// At least 1.
    limit: u64,
    /// Positive.
    period: Duration,
    max_wait: Duration,
    clock: Arc<dyn Clock>,
    /// `None`: the calling thread sleeps for a blocking wait, tokio's timer serves an async one
    /// (`sleep.rs`).
    sleeper: Option<Arc<dyn Sleeper>>,
    listener: Option<Listener>,
}

/// A fixed-window rate limiter: at most `limit` permits in each window of `period`, the windows
/// back to back from the limiter's creation.
///
/// One limiter is one budget: share it (in an `Arc`) among every caller that must stay under it.
/// Build it with [`FixedWindow::of`] and the `with_` methods, which take the limiter and give it
/// back changed, its window in progress kept (start and count): a setting changed after takes
/// never forgets them. [`with_clock`](FixedWindow::with_clock) alone moves the window's start,
/// which means nothing on another clock.
///
/// Alone, it is asked with [`try_acquire`](FixedWindow::try_acquire),
/// [`acquire`](FixedWindow::acquire), [`acquire_async`](FixedWindow::acquire_async) or the
/// [`call`](FixedWindow::call) helpers, and reports each outcome to its listener. In a
/// [`Demand`](admission_core::Demand) it is an [`Account`](admission_core::Account) that never
/// blocks: a take, "not now" until the next window opens, or a refusal of an amount above the
/// limit. Both draw on the same count, and no window ever counts more than `limit`.
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
    /// Where the first window started: the clock's reading at construction (or at
    /// [`with_clock`](FixedWindow::with_clock)).
    origin: Instant,
    /// The window and its count; the only state that changes after construction.
    word: Word,
    /// The monitor's wake-up, called when a give credits the current window.
    wake: WakeSlot,
}

impl FixedWindow {
    /// The category this family reports: a fixed-window rate limiter.
    pub const CATEGORY: Category = Category::custom("fixed_window");

    /// A limiter named `name` allowing `limit` calls per `period`, on the system clock, with no
    /// max wait (a spent window rejects at once), no listener and no sleeper (see
    /// [`with_sleeper`](FixedWindow::with_sleeper) for how it waits then).
    ///
    /// The name is a `&'static str` because it keys metrics and logs: a bounded set of names.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `limit` when it is zero, or naming `period` when it is zero.
    /// Every other limit and period is accepted: the state counts up to `u64::MAX` permits in
    /// windows as short as 1 ns.
    pub fn of(
        name: &'static str,
        limit: u64,
        period: Duration,
    ) -> Result<FixedWindow, ConfigError> {
        check_period(period)?;
        check_limit(limit)?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let origin = clock.now();
        Ok(FixedWindow {
            config: Config {
                name,
                limit,
                period,
                max_wait: Duration::ZERO,
                clock,
                sleeper: None,
                listener: None,
            },
            origin,
            word: Word::new(
                View {
                    start: origin,
                    used: 0,
                },
                word::period_nanos(period),
            ),
            wake: WakeSlot::new(),
        })
    }

    /// The same limiter allowing `limit` calls per period from now on. The window in progress
    /// keeps its start and its count; a limit lowered below the count leaves that window spent
    /// until it ends.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `limit` when it is zero.
    pub fn with_limit(mut self, limit: u64) -> Result<FixedWindow, ConfigError> {
        check_limit(limit)?;
        self.config.limit = limit;
        Ok(self)
    }

    /// The same limiter with windows of `period` from now on. The window in progress keeps its
    /// start and its count and lasts `period` from that start (it ends at once if that is past);
    /// the windows after it follow on back to back.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `period` when it is zero.
    pub fn with_period(mut self, period: Duration) -> Result<FixedWindow, ConfigError> {
        check_period(period)?;
        // Placed on the old period first, so that a window already over is not revived.
        let current = self.word.read(self.config.clock.now());
        self.word = Word::new(current, word::period_nanos(period));
        self.config.period = period;
        Ok(self)
    }

    /// The same limiter, where a call that finds the window spent may wait up to `max_wait` for
    /// a later window. Zero (the default) rejects at once; any length is accepted,
    /// [`Duration::MAX`] included. The window in progress is kept.
    pub fn with_max_wait(mut self, max_wait: Duration) -> FixedWindow {
        self.config.max_wait = max_wait;
        self
    }

    /// The same limiter reporting every permit and rejection of the standalone API to
    /// `listener`. A later listener replaces an earlier one. The window in progress is kept.
    ///
    /// The listener runs on the caller's thread, after the decision; a listener that panics is
    /// ignored (the panic is caught, after the panic hook has run, and the call goes on as
    /// decided).
    pub fn with_listener(
        mut self,
        listener: impl Fn(&FixedWindowEvent) + Send + Sync + 'static,
    ) -> FixedWindow {
        self.config.listener = Some(Arc::new(listener));
        self
    }

    /// The same limiter reading `clock`. Mainly for tests: pass the test-kit's fake clock, right
    /// after [`of`](FixedWindow::of).
    ///
    /// An instant of the old clock means nothing on the new one, so the window in progress
    /// cannot keep its start: it restarts at `clock`'s present reading, which becomes the
    /// [`origin`](FixedWindow::origin), and keeps its count, so permits taken before the switch
    /// still count. Right after construction the count is zero and this is a fresh window on
    /// `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> FixedWindow {
        let used = self.word.read(self.config.clock.now()).used;
        let start = clock.now();
        self.word = Word::new(View { start, used }, word::period_nanos(self.config.period));
        self.origin = start;
        self.config.clock = clock;
        self
    }

    /// The same limiter waiting through `sleeper`. The window in progress is kept.
    ///
    /// Without a sleeper, a blocking acquire sleeps on its own thread, and an async acquire
    /// waits on the timer of the tokio runtime that polls it when the `tokio` feature is on; it
    /// starts no thread either way. Async callers on another runtime, or without the feature,
    /// pass their runtime's timer here (see [`Sleeper`]); without one, an async acquire that
    /// must wait fails with [`FixedWindowError::NoTimer`]. Tests pass a sleeper that advances a
    /// fake clock.
    pub fn with_sleeper(mut self, sleeper: Arc<dyn Sleeper>) -> FixedWindow {
        self.config.sleeper = Some(sleeper);
        self
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

    /// Where the first window started: the clock's reading when this limiter was built (or given
    /// its clock). Windows follow it back to back, a whole number of periods after it unless
    /// [`with_period`](FixedWindow::with_period) changed the period since.
    pub fn origin(&self) -> Instant {
        self.origin
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
            window_start: view.start,
        }
    }
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

fn check_limit(limit: u64) -> Result<(), ConfigError> {
    if limit == 0 {
        return Err(ConfigError::new(
            LIMITER,
            "limit",
            "must be at least 1; got 0",
        ));
    }
    Ok(())
}

impl fmt::Debug for FixedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let view = self.word.read(self.config.clock.now());
        f.debug_struct("FixedWindow")
            .field("name", &self.config.name)
            .field("limit", &self.config.limit)
            .field("period", &self.config.period)
            .field("max_wait", &self.config.max_wait)
            .field("window_start", &view.start)
            .field("used", &view.used)
            .field("listener", &self.config.listener.is_some())
            .finish_non_exhaustive()
    }
}
