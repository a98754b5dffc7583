//! Test accounts with behaviour the reference accounts do not have: panics, refusals, a Time
//! account that ignores reservations, and call counters.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Capability, Category, Instant, Refusal,
    Replenishment, WakeFn, WakeSlot,
};
use admission_testkit::reference::ReferenceStatus;
use parking_lot::Mutex;

/// A `Time` account of `capacity` slots that never refill by themselves and that, unlike a fair
/// account, ignores `reserved_ahead`: only the monitor's sharp rule keeps a waiter behind a short
/// head from taking its slots.
pub(crate) struct GreedyWindow {
    pub(crate) free: Mutex<u64>,
    pub(crate) capacity: u64,
    pub(crate) refill_at: Instant,
    wake: WakeSlot,
}

impl GreedyWindow {
    pub(crate) fn new(capacity: u64, free: u64, refill_at: Instant) -> GreedyWindow {
        GreedyWindow {
            free: Mutex::new(free),
            capacity,
            refill_at,
            wake: WakeSlot::new(),
        }
    }
}

impl Account for GreedyWindow {
    fn name(&self) -> &str {
        "greedy"
    }
    fn category(&self) -> Category {
        Category::custom("greedy_window")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Time
    }
    /// Ignores the reservation on purpose: only the monitor's sharp rule protects the head.
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let mut free = self.free.lock();
        if mine.primary() > *free {
            return Answer::NotNow(Some(self.refill_at));
        }
        if ask.takes() {
            *free -= mine.primary();
        }
        Answer::Taken
    }
    fn give(&self, amount: Amount) {
        *self.free.lock() += amount.primary();
        self.wake.notify();
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: "greedy".into(),
            category: Category::custom("greedy_window"),
            capacity: self.capacity,
            available: *self.free.lock(),
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

/// An account that refuses everyone with a message, or panics, when told to; otherwise it
/// always fits. Counts every question it is asked.
pub(crate) struct Moody {
    pub(crate) name: &'static str,
    pub(crate) refuse: AtomicBool,
    pub(crate) panic: AtomicBool,
    pub(crate) asked: AtomicUsize,
    pub(crate) provides: Option<Capability>,
    pub(crate) requires: Option<Capability>,
    wake: WakeSlot,
}

impl Moody {
    pub(crate) fn new(name: &'static str) -> Moody {
        Moody {
            name,
            refuse: AtomicBool::new(false),
            panic: AtomicBool::new(false),
            asked: AtomicUsize::new(0),
            provides: None,
            requires: None,
            wake: WakeSlot::new(),
        }
    }

    fn answer(&self) -> Answer {
        self.asked.fetch_add(1, Ordering::SeqCst);
        assert!(!self.panic.load(Ordering::SeqCst), "moody account exploded");
        if self.refuse.load(Ordering::SeqCst) {
            return Answer::Never(Refusal::new("circuit open for 30 s; pick another tool"));
        }
        Answer::Taken
    }
}

impl Account for Moody {
    fn name(&self) -> &str {
        self.name
    }
    fn category(&self) -> Category {
        Category::custom("moody")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, _mine: Amount, _ask: Ask) -> Answer {
        self.answer()
    }
    fn give(&self, _amount: Amount) {}
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: self.name.into(),
            category: Category::custom("moody"),
            capacity: 1,
            available: 1,
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
    fn provides(&self) -> Option<Capability> {
        self.provides
    }
    fn requires(&self) -> Option<Capability> {
        self.requires
    }
}

/// The question `ask` puts (who asks, whether to take), without its instant, to keep.
pub(crate) fn question(ask: admission_core::Ask<'_>) -> admission_core::Ask<'static> {
    use admission_core::Ask;
    let asked = if ask.is_head() {
        Ask::HEAD
    } else {
        Ask::behind(ask.reserved_ahead())
    };
    if ask.takes() { asked } else { asked.look() }
}

/// Permits that record every [`Ask`](admission_core::Ask) they are asked with, and answer it
/// natively.
pub(crate) struct Recording {
    pub(crate) inner: admission_testkit::reference::Permits,
    pub(crate) asks: Mutex<Vec<admission_core::Ask<'static>>>,
}

impl Recording {
    pub(crate) fn new(name: &str, capacity: u64) -> Recording {
        Recording {
            inner: admission_testkit::reference::Permits::new(name, capacity),
            asks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn take_asks(&self) -> Vec<admission_core::Ask<'static>> {
        std::mem::take(&mut self.asks.lock())
    }
}

impl Account for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn category(&self) -> Category {
        self.inner.category()
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: admission_core::Ask) -> admission_core::Answer {
        self.asks.lock().push(question(ask));
        self.inner.ask(mine, ask)
    }
    fn give(&self, amount: Amount) {
        self.inner.give(amount);
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        self.inner.status()
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.inner.on_capacity_change(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.inner.forget_capacity_change(wake);
    }
}
