//! [`CountingGate`]: a fixed number of permits, taken at admission and handed back at release.
//!
//! This is the semaphore of the family: the limit on HTTP connections to one upstream, on calls a
//! model serves at once, on database connections. Time gives nothing back
//! ([`Replenishment::Release`]); only a [`give`](Account::give) does, and every give calls the
//! monitor's wake slot so the next waiter is looked at.
//!
//! The permit count is one atomic word moved by compare-and-swap, so a check and its debit are a
//! single step without a lock (as in tokio's `batch_semaphore`, minus the waiter queue, which here
//! belongs to the monitor).

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Capability, Category, Clock, Instant, Refusal,
    Replenishment, SystemClock, WakeFn, WakeSlot,
};

use crate::ConfigError;

mod status;
pub use status::SemaphoreStatus;

/// The family name used in configuration errors.
const LIMITER: &str = "counting gate";

/// Stored in `last_activity` while nothing was ever taken or given.
const NO_ACTIVITY: u64 = 0;

/// A counting semaphore of `capacity` permits, as an [`Account`].
///
/// Reads only the primary dimension of an [`Amount`]. Each [`ask`](Account::ask) is one
/// compare-and-swap and one [`Answer`]: a demand for more permits than the gate has is
/// [`Answer::Never`] at once, a [`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge)
/// whose message names the gate, the demand and the capacity, whether the asker takes or only
/// looks; anything smaller is [`Answer::Taken`] as soon as enough permits are free beside the
/// head's reservation. "Not now" is always [`Answer::NotNow(None)`](Answer::NotNow): time frees
/// no permit, only a give does.
///
/// Every successful take and every give stamps the last-activity instant. The stamp's
/// resolution is about a millisecond, not a nanosecond: a take stamps the instant its [`Ask`]
/// carries when an account of the demand has read one already, else a
/// [coarse reading](admission_core::Clock::coarse_now) of the clock; a give stamps a coarse
/// reading. On the system clock a coarse reading is an exact one (the library keeps no clock
/// thread to cache one), so a take and a give on a demand that read no time cost two clock
/// readings. Build it on the monitor's clock, so that stamps are on the monitor's scale.
///
/// # Fairness
///
/// The gate itself is not a queue: an ask either debits now or answers "not now". Order among
/// waiters is the monitor's business (one line, head reservation).
///
/// # Panics
///
/// Never. Counts saturate; a give of more than is in use empties the gate's tally instead of
/// underflowing.
///
/// # Examples
///
/// ```
/// use admission_accounts::counting_gate::CountingGate;
/// use admission_core::{Account, Amount, Answer, Ask, Capability, RefusalKind};
/// use admission_testkit::FakeClock;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::new();
/// let http = CountingGate::http(2, clock.shared())?;
/// assert_eq!(http.provides(), Some(Capability::HTTP_CONNECTION));
///
/// assert!(matches!(http.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
/// assert!(matches!(http.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
/// // Not now, and only a give can change that: both permits are out.
/// assert_eq!(http.ask(Amount::ONE, Ask::HEAD).not_now(), Some(None));
/// // Never: the gate has two.
/// let never = http.ask(Amount::units(3), Ask::HEAD.look());
/// assert_eq!(
///     never.refusal().map(|r| r.kind()),
///     Some(RefusalKind::TooLarge { asked: Amount::units(3), max: Amount::units(2) })
/// );
/// http.give(Amount::ONE);
/// assert_eq!((http.available(), http.in_use()), (1, 1));
///
/// let refused = CountingGate::new("db", 0, clock.shared()).unwrap_err();
/// assert_eq!(refused.field, "capacity");
/// # Ok(())
/// # }
/// ```
pub struct CountingGate {
    /// The name events and statuses carry.
    name: String,
    /// How many permits exist; positive, fixed at construction.
    capacity: u64,
    /// Permits held now. Changed only by compare-and-swap (take) and `fetch_update` (give);
    /// never above `capacity`.
    in_use: AtomicU64,
    /// The last take or give as nanoseconds on `clock`, plus one; `NO_ACTIVITY` (0) until the
    /// first. Written only when the new reading is later than the stored one (see `stamp`).
    last_activity: AtomicU64,
    /// Where the last-activity stamp is read.
    clock: Arc<dyn Clock>,
    /// What the gate stands for in a demand (the HTTP gate provides an HTTP connection).
    capability: Option<Capability>,
    /// The monitor's wake-up, called after every give.
    wake: WakeSlot,
}

impl CountingGate {
    /// The category this family reports: a counting gate (a semaphore of permits).
    pub const CATEGORY: Category = Category::custom("semaphore");

    /// A gate named `name` with `capacity` permits, all free, stamping its activity on `clock`
    /// (the monitor's: `monitor.clock().clone()`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field `capacity` when it is zero.
    pub fn new(
        name: impl Into<String>,
        capacity: u64,
        clock: Arc<dyn Clock>,
    ) -> Result<CountingGate, ConfigError> {
        let Some(capacity) = NonZeroU64::new(capacity) else {
            return Err(ConfigError::new(
                LIMITER,
                "capacity",
                "must be positive, was 0 (a gate without permits would refuse everyone)",
            ));
        };
        Ok(CountingGate::with_capacity(name, capacity, clock))
    }

    /// A gate named `name` with `capacity` permits, all free, stamping its activity on `clock`;
    /// cannot fail, the capacity being positive by its type.
    pub fn with_capacity(
        name: impl Into<String>,
        capacity: NonZeroU64,
        clock: Arc<dyn Clock>,
    ) -> CountingGate {
        CountingGate {
            name: name.into(),
            capacity: capacity.get(),
            in_use: AtomicU64::new(0),
            last_activity: AtomicU64::new(NO_ACTIVITY),
            clock,
            capability: None,
            wake: WakeSlot::new(),
        }
    }

    /// A gate named `name` with `capacity` permits on the operating system's clock.
    ///
    /// Its stamps then count from the process's first system-clock reading, which is the
    /// monitor's scale too when the monitor runs on the system clock ([`Monitor::new`]).
    ///
    /// # Errors
    ///
    /// As [`CountingGate::new`].
    ///
    /// [`Monitor::new`]: admission_core::Monitor::new
    pub fn on_system_clock(
        name: impl Into<String>,
        capacity: u64,
    ) -> Result<CountingGate, ConfigError> {
        CountingGate::new(name, capacity, Arc::new(SystemClock::new()))
    }

    /// The HTTP connection gate: named `http`, `capacity` permits, providing
    /// [`Capability::HTTP_CONNECTION`] to the demands it sits in, stamping on `clock`.
    ///
    /// # Errors
    ///
    /// As [`CountingGate::new`].
    pub fn http(capacity: u64, clock: Arc<dyn Clock>) -> Result<CountingGate, ConfigError> {
        Ok(
            CountingGate::new("http", capacity, clock)?
                .with_capability(Capability::HTTP_CONNECTION),
        )
    }

    /// The same gate standing for `capability` ([`Account::provides`]).
    pub fn with_capability(mut self, capability: Capability) -> CountingGate {
        self.capability = Some(capability);
        self
    }

    /// The gate's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits exist.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Permits free now.
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.in_use())
    }

    /// Permits held now.
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// The instant of the last take or give, `None` before the first.
    pub fn last_activity(&self) -> Option<Instant> {
        match self.last_activity.load(Ordering::Acquire) {
            NO_ACTIVITY => None,
            stamp => Some(Instant::from_nanos(stamp - 1)),
        }
    }

    /// The status record, typed (what [`Account::status`] boxes).
    pub fn semaphore_status(&self) -> SemaphoreStatus {
        SemaphoreStatus {
            name: self.name.clone(),
            max_concurrent: self.capacity,
            available_permits: self.available(),
            last_activity: self.last_activity(),
        }
    }

    /// The "never" of `mine`, a demand of more permits than the gate has.
    #[cold]
    #[inline(never)]
    fn too_large(&self, mine: Amount) -> Refusal {
        let capacity = self.capacity;
        Refusal::too_large(mine, Amount::units(capacity)).with_message(format!(
            "`{}` has {capacity} permits in all; a demand of {} can never fit (ask for at most \
             {capacity})",
            self.name,
            mine.primary(),
        ))
    }

    /// Whether `want` permits (the asking demand plus the reservation) are free besides `in_use`.
    fn room(&self, in_use: u64, want: u64) -> bool {
        want <= self.capacity.saturating_sub(in_use)
    }

    /// Records `now` as the last activity.
    ///
    /// A load and a store rather than a read-modify-write: this sits on every take and give, and
    /// a locked instruction here costs as much as the take itself. Two stamps racing may land in
    /// either order, so the stamp is the instant of one of the latest operations, never older
    /// than any operation that finished before the racing ones began.
    fn stamp(&self, now: Instant) {
        let now = now.as_nanos().saturating_add(1);
        if now > self.last_activity.load(Ordering::Relaxed) {
            self.last_activity.store(now, Ordering::Release);
        }
    }
}

impl Account for CountingGate {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        CountingGate::CATEGORY
    }

    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }

    /// One compare-and-swap: `mine` permits are taken when they are free beside the head's
    /// reservation; "not now" waits for a give.
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let asked = mine.primary();
        if asked > self.capacity {
            return Answer::Never(self.too_large(mine));
        }
        let want = asked.saturating_add(ask.reserved_ahead().primary());
        let fits = if ask.takes() {
            let taken = self
                .in_use
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                    self.room(in_use, want)
                        .then(|| in_use.saturating_add(asked))
                })
                .is_ok();
            if taken {
                self.stamp(ask.coarse_now(&*self.clock));
            }
            taken
        } else {
            self.room(self.in_use(), want)
        };
        if fits {
            Answer::Taken
        } else {
            Answer::NotNow(None)
        }
    }

    fn give(&self, amount: Amount) {
        let back = amount.primary();
        if back > 0 {
            let _ = self
                .in_use
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                    Some(in_use.saturating_sub(back))
                });
        }
        self.stamp(self.clock.coarse_now());
        if back > 0 {
            self.wake.notify();
        }
    }

    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(self.semaphore_status())
    }

    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }

    fn provides(&self) -> Option<Capability> {
        self.capability
    }
}

impl fmt::Debug for CountingGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingGate")
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .field("in_use", &self.in_use())
            .field("last_activity", &self.last_activity())
            .field("capability", &self.capability)
            .field("clock", &self.clock)
            .field("wake", &self.wake)
            .finish()
    }
}
