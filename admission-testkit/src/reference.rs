//! Two small reference accounts, one of each [`Replenishment`]: the core's own tests, the docs and
//! the contract suite's self-test run on them.
//!
//! They are deliberately plain (a counter under a lock), so a test failure points at the monitor,
//! not at them; the production families live in `admission-accounts`.

use std::sync::Arc;
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Clock, Instant, Refusal, Replenishment,
    SystemClock, WakeFn, WakeSlot,
};
use parking_lot::Mutex;
use serde::Serialize;

/// The status record of a reference account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReferenceStatus {
    /// The account's name.
    pub name: String,
    /// Its category.
    pub category: Category,
    /// The most it can hold.
    pub capacity: u64,
    /// What is available now.
    pub available: u64,
}

impl AccountStatus for ReferenceStatus {
    fn name(&self) -> &str {
        &self.name
    }
    fn category(&self) -> Category {
        self.category
    }
    fn summary(&self) -> String {
        format!(
            "{} [{}]: {} of {} available",
            self.name, self.category, self.available, self.capacity
        )
    }
}

/// A counting gate of `capacity` permits that come back on release ([`Replenishment::Release`]).
///
/// Reads only the primary dimension of an amount. A demand of more than `capacity` permits is
/// refused as [`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge); a shortfall is
/// "not now" with no instant, since only a give brings permits back.
#[derive(Debug)]
pub struct Permits {
    name: String,
    capacity: u64,
    /// Permits taken and not given back.
    in_use: Mutex<u64>,
    wake: WakeSlot,
}

impl Permits {
    /// The category permits report.
    pub const CATEGORY: Category = Category::custom("permits");

    /// A gate named `name` with `capacity` permits, all free.
    pub fn new(name: impl Into<String>, capacity: u64) -> Permits {
        Permits {
            name: name.into(),
            capacity,
            in_use: Mutex::new(0),
            wake: WakeSlot::new(),
        }
    }

    /// Permits free now.
    pub fn available(&self) -> u64 {
        self.capacity - *self.in_use.lock()
    }

    /// Permits taken now.
    pub fn in_use(&self) -> u64 {
        *self.in_use.lock()
    }

    /// The configured capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// True while the monitor's wake-up is installed here.
    pub fn is_watched(&self) -> bool {
        self.wake.is_installed()
    }

    /// The refusal of `mine` when it is more than the gate holds in all.
    fn too_large(&self, mine: Amount) -> Option<Refusal> {
        (mine.primary() > self.capacity).then(|| {
            Refusal::too_large(mine, Amount::units(self.capacity)).with_message(format!(
                "`{}` has {} permits in all; a demand of {} can never fit",
                self.name,
                self.capacity,
                mine.primary()
            ))
        })
    }
}

impl Account for Permits {
    fn name(&self) -> &str {
        &self.name
    }
    fn category(&self) -> Category {
        Permits::CATEGORY
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn capacity(&self) -> Option<Amount> {
        Some(Amount::units(self.capacity))
    }
    /// One lock, one answer: too large is refused, a shortfall waits for a give (no instant),
    /// and a fitting taking ask is debited under the same lock that checked it.
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        if let Some(refusal) = self.too_large(mine) {
            return Answer::Never(refusal);
        }
        let mut in_use = self.in_use.lock();
        let want = mine
            .primary()
            .saturating_add(ask.reserved_ahead().primary());
        if want > self.capacity - *in_use {
            return Answer::NotNow(None);
        }
        if ask.takes() {
            *in_use += mine.primary();
        }
        Answer::Taken
    }
    fn give(&self, amount: Amount) {
        {
            let mut in_use = self.in_use.lock();
            *in_use = in_use.saturating_sub(amount.primary());
        }
        if amount.primary() > 0 {
            self.wake.notify();
        }
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: self.name.clone(),
            category: Permits::CATEGORY,
            capacity: self.capacity,
            available: self.available(),
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// A clocked bucket of `capacity` units refilled at `per_second` units a second
/// ([`Replenishment::Time`]): the level at any instant is the stored level plus what the rate
/// produced since it was last read, capped at the capacity. No refill thread.
///
/// Reads only the primary dimension of an amount. A demand of more than `capacity` units is
/// refused as [`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge); a shortfall is
/// "not now" until the instant the refill covers it (the deficit over the rate), or with no
/// instant when the refill never will (a zero rate, or more than the capacity reserved ahead).
#[derive(Debug)]
pub struct Meter {
    name: String,
    capacity: u64,
    per_second: u64,
    clock: Arc<dyn Clock>,
    /// The level in billionths of a unit, and the instant it was last brought up to date.
    level: Mutex<(u128, Instant)>,
    wake: WakeSlot,
}

impl Meter {
    /// The category a meter reports.
    pub const CATEGORY: Category = Category::custom("meter");

    /// A full meter on `clock`. A zero rate never refills.
    pub fn new(
        name: impl Into<String>,
        capacity: u64,
        per_second: u64,
        clock: Arc<dyn Clock>,
    ) -> Meter {
        let now = clock.now();
        Meter {
            name: name.into(),
            capacity,
            per_second,
            clock,
            level: Mutex::new((u128::from(capacity) * NANOS_PER_SECOND, now)),
            wake: WakeSlot::new(),
        }
    }

    /// A full meter on the system clock.
    pub fn per_second(name: impl Into<String>, capacity: u64, per_second: u64) -> Meter {
        Meter::new(name, capacity, per_second, Arc::new(SystemClock::new()))
    }

    /// Whole units available now.
    pub fn level(&self) -> u64 {
        let mut level = self.level.lock();
        self.refill(&mut level, self.clock.now());
        u64::try_from(level.0 / NANOS_PER_SECOND).unwrap_or(u64::MAX)
    }

    /// True while the monitor's wake-up is installed here.
    pub fn is_watched(&self) -> bool {
        self.wake.is_installed()
    }

    fn cap(&self) -> u128 {
        u128::from(self.capacity) * NANOS_PER_SECOND
    }

    /// Brings `level` up to `now` (an instant before the last one changes nothing).
    fn refill(&self, level: &mut (u128, Instant), now: Instant) {
        let elapsed = now.saturating_duration_since(level.1).as_nanos();
        level.0 = level
            .0
            .saturating_add(elapsed.saturating_mul(u128::from(self.per_second)))
            .min(self.cap());
        level.1 = level.1.max(now);
    }

    /// The refusal of `mine` when it is more than the meter holds when full.
    fn too_large(&self, mine: Amount) -> Option<Refusal> {
        (mine.primary() > self.capacity).then(|| {
            Refusal::too_large(mine, Amount::units(self.capacity)).with_message(format!(
                "`{}` holds at most {} units; a demand of {} can never fit",
                self.name,
                self.capacity,
                mine.primary()
            ))
        })
    }

    /// The instant the refill alone brings a `level` read at `at` up to `want` billionths:
    /// the deficit over the rate, rounded up to the next nanosecond. `None` when it never will
    /// (no refill, or more than the meter holds: only the reservation leaving can help).
    fn refilled_to(&self, want: u128, level: u128, at: Instant) -> Option<Instant> {
        if self.per_second == 0 || want > self.cap() {
            return None;
        }
        let nanos = (want - level).div_ceil(u128::from(self.per_second));
        Some(at.saturating_add(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        )))
    }
}

impl Account for Meter {
    fn name(&self) -> &str {
        &self.name
    }
    fn category(&self) -> Category {
        Meter::CATEGORY
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Time
    }
    fn capacity(&self) -> Option<Amount> {
        Some(Amount::units(self.capacity))
    }
    /// One lock, one answer: too large is refused; otherwise the level is brought up to the
    /// ask's instant, and either a fitting taking ask is debited or the answer names when the
    /// refill alone covers `mine` beside the reservation.
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        if let Some(refusal) = self.too_large(mine) {
            return Answer::Never(refusal);
        }
        let now = ask.now(&*self.clock);
        let mut level = self.level.lock();
        self.refill(&mut level, now);
        let want = u128::from(
            mine.primary()
                .saturating_add(ask.reserved_ahead().primary()),
        ) * NANOS_PER_SECOND;
        if want > level.0 {
            return Answer::NotNow(self.refilled_to(want, level.0, level.1));
        }
        if ask.takes() {
            level.0 -= u128::from(mine.primary()) * NANOS_PER_SECOND;
        }
        Answer::Taken
    }
    fn give(&self, amount: Amount) {
        {
            let mut level = self.level.lock();
            self.refill(&mut level, self.clock.now());
            level.0 = level
                .0
                .saturating_add(u128::from(amount.primary()) * NANOS_PER_SECOND)
                .min(self.cap());
        }
        if amount.primary() > 0 {
            self.wake.notify();
        }
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: self.name.clone(),
            category: Meter::CATEGORY,
            capacity: self.capacity,
            available: self.level(),
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}
