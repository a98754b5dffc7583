//! Nothing a caller hands the monitor runs under a lock of the monitor's: a waker, a wake
//! callback, an event sink or an account may own a grant or call back into the monitor when it is
//! dropped or called, and the monitor must not be holding the lock that call needs.
//!
//! Each test runs the re-entering step on a thread of its own under a watchdog: a deadlock fails
//! the test after [`PATIENCE`] instead of hanging the run.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Event, EventSink, Grant, JobContext,
    Monitor, Replenishment, WakeFn, WakeSlot,
};
use admission_testkit::FakeClock;
use admission_testkit::monitor::{PATIENCE, poll_once};
use admission_testkit::reference::{Permits, ReferenceStatus};

use super::{demand, on, permits};

/// Runs `step` on its own thread and returns its result, or fails the test when it has not
/// returned within [`PATIENCE`] (a deadlock).
#[track_caller]
fn within_patience<T: Send + 'static>(what: &str, step: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(step());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(value) => value,
        Err(_) => panic!("{what} did not return within {PATIENCE:?}: a deadlock"),
    }
}

/// A waker that owns its task's state, a grant among it (tokio's `release_permits_at_drop`
/// builds one), and counts its wake-ups.
struct OwningWaker {
    /// Released when the waker's last handle is dropped.
    _grant: Mutex<Option<Grant>>,
    woken: AtomicUsize,
}

impl Wake for OwningWaker {
    fn wake(self: Arc<Self>) {
        self.woken.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_pending_admit_re_polled_with_a_new_waker_whose_predecessor_owns_a_grant_is_granted() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 1);
    let holder = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("holder"), None)
        .unwrap();
    let mut admit =
        Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &JobContext::new("task"), None));

    // First poll with a waker that owns the holder's grant; the admit keeps the only handle.
    let first = Arc::new(OwningWaker {
        _grant: Mutex::new(Some(holder)),
        woken: AtomicUsize::new(0),
    });
    let first_waker = Waker::from(first.clone());
    assert!(
        std::pin::Pin::new(&mut admit)
            .poll(&mut Context::from_waker(&first_waker))
            .is_pending()
    );
    drop(first_waker);
    drop(first);
    assert_eq!(monitor.queue_size(), 1);

    // The task moves: polled with a new waker, the old one is dropped, its grant released, and
    // the release's pass grants this very waiter.
    let second = Arc::new(OwningWaker {
        _grant: Mutex::new(None),
        woken: AtomicUsize::new(0),
    });
    let (admit, second, polled) = within_patience("re-polling with a new waker", move || {
        let waker = Waker::from(second.clone());
        let polled = std::pin::Pin::new(&mut admit).poll(&mut Context::from_waker(&waker));
        (admit, second, polled.is_ready())
    });
    let mut admit = admit;
    if !polled {
        // Granted as the old waker went: the new one was woken for it.
        assert_eq!(second.woken.load(Ordering::SeqCst), 1);
    }
    let grant = match polled {
        true => None,
        false => Some(poll_once(&mut admit).expect("granted").unwrap()),
    };
    assert_eq!(gate.available(), 0, "the waiter holds the permit");
    assert_eq!(monitor.queue_size(), 0);
    drop(grant);
    assert_eq!(gate.available(), 1);
}

#[test]
fn a_wake_callback_may_install_into_its_own_slot() {
    let slot = Arc::new(WakeSlot::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let (s, c) = (Arc::downgrade(&slot), calls.clone());
    let reinstalling: WakeFn = Arc::new(move || {
        c.fetch_add(1, Ordering::SeqCst);
        if let Some(slot) = s.upgrade() {
            slot.install(None);
        }
    });
    slot.install(Some(reinstalling));
    let notified = slot.clone();
    within_patience("a notify whose callback installs", move || {
        notified.notify()
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(!slot.is_installed(), "the callback's install took effect");
    slot.notify();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A wake callback whose drop calls back into the slot that held it.
struct Reentrant(std::sync::Weak<WakeSlot>);

impl Drop for Reentrant {
    fn drop(&mut self) {
        if let Some(slot) = self.0.upgrade() {
            let _ = slot.is_installed();
        }
    }
}

#[test]
fn a_wake_callback_replaced_or_cleared_is_dropped_outside_its_slot() {
    let slot = Arc::new(WakeSlot::new());
    let make = |slot: &Arc<WakeSlot>| -> WakeFn {
        let probe = Reentrant(Arc::downgrade(slot));
        Arc::new(move || {
            let _ = &probe;
        })
    };
    slot.install(Some(make(&slot)));
    let replaced = slot.clone();
    let next = make(&slot);
    within_patience("an install that drops its predecessor", move || {
        replaced.install(Some(next));
    });
    let cleared = slot.clone();
    within_patience("an install of None", move || cleared.install(None));
    assert!(!slot.is_installed());
}

/// A sink that, when dropped, reads its monitor (which takes the monitor's own locks).
struct ReentrantSink {
    monitor: Monitor,
    dropped: Arc<AtomicUsize>,
}

impl EventSink for ReentrantSink {
    fn emit(&self, _event: &Event) -> Result<(), admission_core::event::SinkError> {
        Ok(())
    }
}

impl Drop for ReentrantSink {
    fn drop(&mut self) {
        self.monitor.set_sink(None);
        let _ = self.monitor.queue_size();
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_sink_dropped_when_replaced_may_call_its_monitor() {
    let monitor = Monitor::builder().manual_passes().build();
    let dropped = Arc::new(AtomicUsize::new(0));
    monitor.set_sink(Some(Arc::new(ReentrantSink {
        monitor: monitor.clone(),
        dropped: dropped.clone(),
    })));
    let m = monitor.clone();
    within_patience("replacing the sink", move || m.set_sink(None));
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

/// An account that, when its last handle goes, reads the monitor it was used with.
struct ReadsItsMonitor {
    inner: Permits,
    monitor: Mutex<Option<Monitor>>,
    dropped: Arc<AtomicUsize>,
}

impl Drop for ReadsItsMonitor {
    fn drop(&mut self) {
        if let Some(monitor) = self.monitor.lock().unwrap().take() {
            let _ = monitor.queue_size();
        }
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Account for ReadsItsMonitor {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn category(&self) -> Category {
        self.inner.category()
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        self.inner.ask(mine, ask)
    }
    fn give(&self, amount: Amount) {
        self.inner.give(amount);
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: self.inner.name().to_owned(),
            category: self.inner.category(),
            capacity: self.inner.capacity(),
            available: self.inner.available(),
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.inner.on_capacity_change(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.inner.forget_capacity_change(wake);
    }
}

#[test]
/// A waiter's demand lives in its record, inside its admit: leaving the line keeps it there, and
/// the admit lets go of it (taking its outcome, or dropped), never under the monitor lock.
fn an_account_whose_last_handle_leaves_the_line_is_dropped_by_its_admit_outside_the_monitor_lock() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let dropped = Arc::new(AtomicUsize::new(0));
    let scarce = permits("scarce", 1);
    let _held = monitor
        .admit_blocking(
            demand(&[(on(&scarce), 1)]),
            &JobContext::new("holder"),
            None,
        )
        .unwrap();

    // Two waiters, each the only holder of its own account: one leaves by cancellation, one by
    // its deadline at a pass.
    let mut admits = Vec::new();
    for (name, timeout) in [("cancelled", None), ("late", Some(Duration::from_secs(1)))] {
        let own = Arc::new(ReadsItsMonitor {
            inner: Permits::new(name, 1),
            monitor: Mutex::new(Some(monitor.clone())),
            dropped: dropped.clone(),
        });
        let ctx = JobContext::new(name);
        let mut admit =
            Box::pin(monitor.admit(demand(&[(on(&scarce), 1), (on(&own), 1)]), &ctx, timeout));
        assert!(poll_once(&mut admit).is_none());
        drop(own);
        admits.push((ctx, admit));
    }
    assert_eq!(monitor.queue_size(), 2);
    let (cancelled, admit) = admits.remove(0);
    within_patience("cancelling a waiter", move || cancelled.cancel());
    assert_eq!(
        monitor.queue_size(),
        1,
        "the cancelled waiter left the line"
    );
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        0,
        "the cancelled waiter's demand is its admit's, not the monitor's"
    );
    let refused = within_patience("taking the cancelled outcome", move || {
        let mut admit = admit;
        poll_once(&mut admit).map(|outcome| outcome.is_err())
    });
    assert_eq!(refused, Some(true));
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the cancelled waiter's account went with its outcome"
    );

    clock.advance(Duration::from_secs(1));
    let m = monitor.clone();
    within_patience("a pass that times a waiter out", move || m.pass_now());
    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the late admit still holds its demand"
    );
    let (_, late) = admits.remove(0);
    within_patience("dropping the late admit", move || drop(late));
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2,
        "the late waiter's account went with its admit"
    );
}
