//! Time, read in exactly one place.
//!
//! Everything in admission that needs "now" asks a [`Clock`]. [`SystemClock`] is the only code that
//! reads the operating system's monotonic clock; tests inject the test-kit's fake clock, whose
//! `advance()` moves every holder at once and wakes a monitor parked on a deadline (the shape of
//! governor's `FakeRelativeClock`).
//!
//! Instants are nanoseconds on the clock's own scale. All arithmetic saturates: a deadline far in
//! the future is clamped to [`Instant::MAX`], never an overflow panic.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A callback that wakes whoever installed it. It must be cheap and must never block: it is called
/// from inside accounts and clocks, possibly while they hold their own locks.
pub type WakeFn = Arc<dyn Fn() + Send + Sync>;

/// A point on a [`Clock`]'s monotonic scale, in nanoseconds since the clock's origin.
///
/// Unlike [`std::time::Instant`], every operation saturates instead of panicking.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Instant(u64);

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant (about 584 years after the origin); "never" in practice.
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + duration`, clamped to [`Instant::MAX`].
    pub fn saturating_add(self, duration: Duration) -> Instant {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }

    /// `self - duration`, clamped to [`Instant::ZERO`].
    pub fn saturating_sub(self, duration: Duration) -> Instant {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_sub(nanos))
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instant({:?})", Duration::from_nanos(self.0))
    }
}

/// A monotonic source of [`Instant`]s: what an account reads.
///
/// Implementations are cheap to call and never go backwards. A clock a monitor sleeps on is also
/// a [`Timer`], its sleeping half.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// The current instant to within about a millisecond, for stamps that record when something
    /// last happened (a counting gate's last activity) and need no finer time: a clock may
    /// answer it more cheaply than [`now`](Clock::now). The default is `now`, exact.
    ///
    /// A coarse reading is never later than the precise reading taken right after it, and never
    /// goes backwards.
    fn coarse_now(&self) -> Instant {
        self.now()
    }
}

/// The sleeping half of a [`Clock`]: what a monitor needs to sleep until a deadline on it.
///
/// A timer tells a sleeping thread how long to wait in real time for a deadline
/// ([`Timer::real_wait`]) and lets a sleeper register to be woken when the clock jumps
/// ([`Timer::subscribe`]); together these let the monitor sleep until a computed deadline on the
/// system clock and be woken by `advance()` on a fake one, with no polling on either. Accounts
/// read time only ([`Clock`]); a monitor is built on a timer
/// ([`MonitorBuilder::clock`](crate::MonitorBuilder::clock)), and hands it to accounts as a
/// clock.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use admission_core::{Clock, Instant, SystemClock, Timer};
///
/// let timer: Arc<dyn Timer> = Arc::new(SystemClock::new());
/// // A clock that follows real time sleeps as long as the deadline is ahead.
/// assert_eq!(timer.real_wait(Instant::ZERO), Some(Duration::ZERO));
/// // The same object, as an account reads it.
/// let clock: Arc<dyn Clock> = timer.clone();
/// assert!(clock.now() <= timer.now());
/// ```
pub trait Timer: Clock {
    /// How long a thread should sleep in real time before this clock can read `deadline`.
    ///
    /// `Some(Duration::ZERO)` means the deadline has passed. `None` means real time does not move
    /// this clock: sleep until woken through [`Timer::subscribe`]. The default suits any clock
    /// that runs at real speed.
    fn real_wait(&self, deadline: Instant) -> Option<Duration> {
        Some(deadline.saturating_duration_since(self.now()))
    }

    /// Registers `wake` to be called whenever the clock moves other than by real time passing.
    ///
    /// Clocks that only follow real time ignore it (the default). Implementations hold the
    /// callback weakly, so a subscriber that is dropped is forgotten.
    fn subscribe(&self, wake: &WakeFn) {
        let _ = wake;
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Instant {
        (**self).now()
    }
    fn coarse_now(&self) -> Instant {
        (**self).coarse_now()
    }
}

impl<C: Timer + ?Sized> Timer for Arc<C> {
    fn real_wait(&self, deadline: Instant) -> Option<Duration> {
        (**self).real_wait(deadline)
    }
    fn subscribe(&self, wake: &WakeFn) {
        (**self).subscribe(wake)
    }
}

/// One instant of a [`Clock`], read the first time somebody needs it and the same for everyone
/// after: "now" for one admission, however many accounts it asks.
///
/// The monitor makes one for each admit, each pass over its line and each release, and hands it
/// to every account it asks through [`Ask`](crate::Ask): a demand on five accounts reads the
/// clock once, and a demand on accounts that need no time (counting gates) not at all.
///
/// # Examples
///
/// ```
/// use admission_core::{Clock, Instant, Reading, SystemClock};
///
/// let clock = SystemClock::new();
/// let now = Reading::new(&clock);
/// assert_eq!(now.taken(), None);
/// let first = now.get();
/// assert_eq!(now.get(), first);
/// assert_eq!(now.taken(), Some(first));
/// ```
pub struct Reading<'c> {
    clock: &'c dyn Clock,
    /// The instant read, or [`UNREAD`]. Relaxed: a reading is one thread's, the atomic only
    /// keeps it `Sync` (a future that holds one across an await stays `Send`).
    read: AtomicU64,
}

/// No instant read yet (a clock reading `u64::MAX` is read again each time, which is harmless).
const UNREAD: u64 = u64::MAX;

impl<'c> Reading<'c> {
    /// A reading of `clock`, not taken yet.
    pub fn new(clock: &'c dyn Clock) -> Reading<'c> {
        Reading {
            clock,
            read: AtomicU64::new(UNREAD),
        }
    }

    /// A reading of `clock` already taken at `at` (an instant the caller read itself).
    pub fn taken_at(clock: &'c dyn Clock, at: Instant) -> Reading<'c> {
        Reading {
            clock,
            read: AtomicU64::new(at.0),
        }
    }

    /// The instant: read from the clock now if nobody has yet, else the one read before.
    #[inline]
    pub fn get(&self) -> Instant {
        match self.read.load(Ordering::Relaxed) {
            UNREAD => {
                let now = self.clock.now();
                self.read.store(now.0, Ordering::Relaxed);
                now
            }
            read => Instant(read),
        }
    }

    /// The instant if it was read, without reading the clock.
    #[inline]
    pub fn taken(&self) -> Option<Instant> {
        match self.read.load(Ordering::Relaxed) {
            UNREAD => None,
            read => Some(Instant(read)),
        }
    }

    /// The instant if it was read, else the clock's [`coarse_now`](Clock::coarse_now) (which
    /// does not fix the reading).
    #[inline]
    pub fn coarse(&self) -> Instant {
        self.taken().unwrap_or_else(|| self.clock.coarse_now())
    }

    /// The clock this reads.
    pub fn clock(&self) -> &'c dyn Clock {
        self.clock
    }
}

impl fmt::Debug for Reading<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reading")
            .field("taken", &self.taken())
            .finish_non_exhaustive()
    }
}

/// The machine's monotonic clock, read through `quanta` (the CPU's invariant time-stamp counter
/// where it is reliable, the operating system's monotonic clock elsewhere; governor's default
/// clock does the same).
///
/// Every `SystemClock` in the process shares one origin, taken the first time any of them is
/// created, so instants from an account's clock and from the monitor's clock are on one scale.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock {
    _private: (),
}

/// The process-wide reading source and its origin in scaled nanoseconds.
fn source() -> &'static (quanta::Clock, u64) {
    static SOURCE: OnceLock<(quanta::Clock, u64)> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let clock = quanta::Clock::new();
        let origin = clock.delta_as_nanos(0, clock.raw());
        (clock, origin)
    })
}

impl SystemClock {
    /// The process's system clock.
    pub fn new() -> SystemClock {
        let _ = source();
        SystemClock { _private: () }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        let (clock, origin) = source();
        Instant(clock.delta_as_nanos(0, clock.raw()).saturating_sub(*origin))
    }
}

/// Real time moves the system clock, and nothing else does.
impl Timer for SystemClock {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_arithmetic_saturates_instead_of_panicking() {
        assert_eq!(
            Instant::MAX.saturating_add(Duration::from_secs(1)),
            Instant::MAX
        );
        assert_eq!(Instant::ZERO.saturating_add(Duration::MAX), Instant::MAX);
        assert_eq!(
            Instant::from_nanos(5).saturating_sub(Duration::from_nanos(9)),
            Instant::ZERO
        );
        assert_eq!(
            Instant::from_nanos(5).saturating_duration_since(Instant::from_nanos(9)),
            Duration::ZERO
        );
        assert_eq!(
            Instant::from_nanos(1_500).saturating_duration_since(Instant::from_nanos(500)),
            Duration::from_nanos(1_000)
        );
    }

    #[test]
    fn system_clock_never_goes_backwards() {
        let clock = SystemClock::new();
        let mut last = clock.now();
        for _ in 0..1_000 {
            let now = clock.now();
            assert!(now >= last);
            last = now;
        }
        assert_eq!(clock.real_wait(Instant::ZERO), Some(Duration::ZERO));
    }

    /// The system clock's coarse reading is its exact one (no refresher thread): never later
    /// than a reading taken after it, never earlier than one taken before.
    #[test]
    fn the_system_clocks_coarse_reading_is_exact() {
        let clock = SystemClock::new();
        for _ in 0..1_000 {
            let before = clock.now();
            let coarse = clock.coarse_now();
            let after = clock.now();
            assert!(
                before <= coarse && coarse <= after,
                "{before:?} {coarse:?} {after:?}"
            );
        }
    }

    #[test]
    fn every_system_clock_shares_one_origin_and_follows_real_time() {
        let first = SystemClock::new();
        let started = std::time::Instant::now();
        let a = first.now();
        // Real time is the point of this test: the system clock must follow it.
        while started.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let later = SystemClock::new();
        let b = later.now();
        let elapsed = b.saturating_duration_since(a);
        assert!(
            elapsed >= Duration::from_millis(19),
            "a clock made later starts at its own zero: {elapsed:?}"
        );
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }
}
