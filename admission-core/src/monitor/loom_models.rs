//! Loom models of the monitor's races (run by `cargo xtask loom`, under `--cfg admission_loom`).
//!
//! Each model runs the real monitor, evaluator thread included, on loom's scheduler, which tries
//! every interleaving of its synchronization points up to a preemption bound:
//! (a) a fast path racing a give, (b) an arrival asked at the line's tail racing a give,
//! (c) an abandoned or cancelled waiter racing its grant, (d) `stop` racing an admit, (e) the
//! first park starting the evaluator racing `stop`, (f) a blocking waiter's own expiry racing its
//! grant, (g) an ask that takes then gives back racing a give, (h) the unlocked fast path giving
//! back (muted) what a parker was refused for, (i) the unlocked fast path racing `stop`, (j) and
//! (k) a release and an unlocked give-back racing a park on an account built on an atomic counter
//! rather than a lock (the parker's fence in `Published::publish`), (l) the unlocked fast
//! path racing a cancel, (m) a waker that owns a grant, dropped as its admit is polled again,
//! its grant's pass deciding that admit while a newcomer races it, (n) the head leaving
//! (its own pass on the dropping thread) racing an asker held behind it, (o) a pass that lets
//! go of the lock between its batches racing an arrival, (p) two such passes racing, (q) such a
//! pass racing the withdrawal of the waiter it visits next, (r) `stop` deciding a parked future
//! (its decision kept in the line's slot until collected) racing that future's drop on another
//! thread, and a release granting it, (s) a higher priority level's newcomer placed before a
//! lower level's head racing a release, (t) the last parked waiter of a level that reserves a
//! permit withdrawing while a lower level's asker is held by that reserve, (u) under fair shares,
//! a waiter keeping its turn on a gate withdrawing while a release lets a waiter behind it fit.

use std::future::Future;
use std::sync::Arc;

use loom::thread;

use crate::{
    Account, AccountStatus, AdmitError, Amount, Answer, Ask, Category, Demand, FairShares, Instant,
    JobContext, Level, Levels, Monitor, Refusal, Replenishment, WakeFn, WakeSlot,
};

/// A counting gate whose counter sits under a loom-visible lock: a real account's lock is what
/// orders a give after the pass that found it short (the doorbell's skip relies on that edge, see
/// `evaluator.rs`), so the model must see it too.
struct Gate {
    name: &'static str,
    free: crate::sync::Mutex<u64>,
    /// More than this is refused for good.
    capacity: u64,
    wake: WakeSlot,
}

#[derive(Debug, serde::Serialize)]
struct GateStatus {
    free: u64,
}

impl AccountStatus for GateStatus {
    fn name(&self) -> &str {
        "gate"
    }
    fn category(&self) -> Category {
        Category::custom("gate")
    }
    fn summary(&self) -> String {
        format!("gate: {} free", self.free)
    }
}

impl Gate {
    fn new(free: u64) -> Arc<Gate> {
        Gate::with_capacity(free, u64::MAX)
    }
    fn with_capacity(free: u64, capacity: u64) -> Arc<Gate> {
        Gate::named("gate", free, capacity)
    }
    fn named(name: &'static str, free: u64, capacity: u64) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            free: crate::sync::Mutex::new(free),
            capacity,
            wake: WakeSlot::new(),
        })
    }
    fn free(&self) -> u64 {
        *self.free.lock()
    }
}

impl Account for Gate {
    fn name(&self) -> &str {
        self.name
    }
    fn category(&self) -> Category {
        Category::custom("gate")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        if mine.primary() > self.capacity {
            return Answer::Never(Refusal::too_large(mine, Amount::units(self.capacity)));
        }
        let mut free = self.free.lock();
        if mine.primary() + ask.reserved_ahead().primary() <= *free {
            if ask.takes() {
                *free -= mine.primary();
            }
            return Answer::Taken;
        }
        Answer::NotNow(None)
    }
    fn give(&self, amount: Amount) {
        *self.free.lock() += amount.primary();
        self.wake.notify();
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(GateStatus { free: self.free() })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

fn one(gate: &Arc<Gate>) -> Demand {
    Demand::new().with(gate.clone(), Amount::ONE)
}

/// A started monitor and a one-permit gate whose permit a first job holds: every model races
/// something against that permit's release.
fn started_with_its_one_permit_held() -> (Monitor, Arc<Gate>, crate::Grant) {
    let monitor = Monitor::new();
    monitor.start().unwrap();
    let gate = Gate::new(1);
    let held = monitor
        .admit_blocking(one(&gate), &JobContext::new("holder"), None)
        .unwrap();
    (monitor, gate, held)
}

/// An asker wants the gate's one permit while another thread gives `held` back: the asker must
/// be granted (a lost wake-up leaves it parked forever, which loom reports as a deadlock), hold
/// the permit, and give it back.
fn ask_while_the_permit_comes_back(monitor: &Monitor, gate: &Arc<Gate>, held: crate::Grant) {
    let (m, g) = (monitor.clone(), gate.clone());
    let asker = thread::spawn(move || m.admit_blocking(one(&g), &JobContext::new("asker"), None));
    let giver = thread::spawn(move || drop(held));

    giver.join().unwrap();
    let grant = asker
        .join()
        .unwrap()
        .expect("the asker is granted once the give lands");
    assert_eq!(gate.free(), 0);
    drop(grant);
}

#[test]
fn loom_fast_path_racing_a_give_never_loses_the_wake_up() {
    loom::model(|| {
        let (monitor, gate, held) = started_with_its_one_permit_held();
        ask_while_the_permit_comes_back(&monitor, &gate, held);
        assert_eq!(gate.free(), 1);
        monitor.stop();
    });
}

#[test]
fn loom_an_arrival_behind_a_head_racing_a_give_never_loses_the_wake_up() {
    loom::model(|| {
        let (monitor, gate, held) = started_with_its_one_permit_held();
        // A head that stays short for the whole model, so the asker joins a line that exists
        // and is asked on arrival rather than by a pass.
        let never = Gate::new(0);
        let mut head = Box::pin(monitor.admit(one(&never), &JobContext::new("head"), None));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(head.as_mut().poll(&mut cx).is_pending());

        ask_while_the_permit_comes_back(&monitor, &gate, held);
        drop(head);
        monitor.stop();
        assert_eq!(gate.free(), 1);
        assert_eq!(monitor.queue_size(), 0);
    });
}

/// The head, short on the gate (it wants 2 of the 1 free), leaves (its admit dropped) while an
/// asker for the 1 free arrives behind it and is held by the head's reservation. Nothing else
/// gives anything: only the pass the head's leaving runs (on the dropping thread, instead of
/// ringing the evaluator) can grant the asker, so losing it leaves the asker parked forever
/// (loom reports a deadlock).
#[test]
fn loom_the_head_leaving_racing_an_arrival_behind_it_never_loses_the_wake_up() {
    loom::model(|| {
        let monitor = Monitor::new();
        monitor.start().unwrap();
        let gate = Gate::new(1);
        let two = Demand::new().with(gate.clone(), Amount::units(2));
        let mut head = Box::pin(monitor.admit(two, &JobContext::new("head"), None));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(head.as_mut().poll(&mut cx).is_pending());

        let (m, g) = (monitor.clone(), gate.clone());
        let asker =
            thread::spawn(move || m.admit_blocking(one(&g), &JobContext::new("asker"), None));
        drop(head);
        let grant = asker
            .join()
            .unwrap()
            .expect("the asker is granted once the head left");
        assert_eq!(gate.free(), 0);
        drop(grant);
        monitor.stop();
        assert_eq!(gate.free(), 1);
        assert_eq!(monitor.queue_size(), 0);
    });
}

#[test]
fn loom_an_abandoned_admit_racing_its_grant_keeps_nothing() {
    loom::model(|| {
        let (monitor, gate, held) = started_with_its_one_permit_held();

        let (m, g) = (monitor.clone(), gate.clone());
        let asker = thread::spawn(move || {
            let mut admit = Box::pin(m.admit(one(&g), &JobContext::new("asker"), None));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match admit.as_mut().poll(&mut cx) {
                std::task::Poll::Ready(outcome) => drop(outcome),
                std::task::Poll::Pending => drop(admit),
            }
        });
        drop(held);
        asker.join().unwrap();
        monitor.stop();
        assert_eq!(gate.free(), 1, "an abandoned admit kept a permit");
        assert_eq!(monitor.queue_size(), 0);
    });
}

/// (r) A parked future's decision is kept in its slot of the line until collected. `stop` decides
/// it under the monitor lock while the future is dropped on another thread and a release may
/// grant it first: the drop's withdrawal and the decisions are ordered by the monitor lock, so
/// the withdrawal either takes the waiter out of the line or collects the decision that landed
/// first; a grant that landed unseen is given back; nothing stays parked or kept.
#[test]
fn loom_stop_and_a_release_racing_the_drop_of_a_parked_future_leave_nothing_kept() {
    loom::model(|| {
        let (monitor, gate, held) = started_with_its_one_permit_held();
        let mut admit = Box::pin(monitor.admit(one(&gate), &JobContext::new("parked"), None));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            admit.as_mut().poll(&mut cx).is_pending(),
            "the permit is held"
        );

        let dropper = thread::spawn(move || drop(admit));
        let giver = thread::spawn(move || drop(held));
        monitor.stop();
        dropper.join().unwrap();
        giver.join().unwrap();
        assert_eq!(gate.free(), 1, "the dropped future kept a permit");
        assert_eq!(monitor.queue_size(), 0);
    });
}

#[test]
fn loom_a_cancelled_waiter_racing_its_grant_keeps_nothing() {
    loom::model(|| {
        let (monitor, gate, held) = started_with_its_one_permit_held();
        let ctx = JobContext::new("asker");

        let (m, g, c) = (monitor.clone(), gate.clone(), ctx.clone());
        let asker = thread::spawn(move || match m.admit_blocking(one(&g), &c, None) {
            Ok(grant) => drop(grant),
            Err(AdmitError::Cancelled { .. }) => {}
            Err(other) => panic!("unexpected {other}"),
        });
        let canceller = thread::spawn(move || ctx.cancel());
        drop(held);
        asker.join().unwrap();
        canceller.join().unwrap();
        monitor.stop();
        assert_eq!(gate.free(), 1, "a cancelled waiter kept a permit");
        assert_eq!(monitor.queue_size(), 0);
    });
}

#[test]
fn loom_stop_racing_an_admit_refuses_it_and_leaves_nothing_parked() {
    loom::model(|| {
        let (monitor, gate, held) = started_with_its_one_permit_held();

        let (m, g) = (monitor.clone(), gate.clone());
        let asker =
            thread::spawn(move || m.admit_blocking(one(&g), &JobContext::new("asker"), None));
        monitor.stop();
        let outcome = asker.join().unwrap();
        assert!(
            matches!(outcome, Err(AdmitError::Shutdown)),
            "got {outcome:?}"
        );
        assert_eq!(monitor.queue_size(), 0);
        drop(held);
        assert_eq!(gate.free(), 1);
    });
}

#[test]
fn loom_the_first_park_starting_the_evaluator_racing_stop_leaves_nothing_behind() {
    loom::model(|| {
        // Never started: the asker's park is what starts the evaluator, if stop is not first.
        let monitor = Monitor::new();
        let gate = Gate::new(1);
        let held = monitor
            .admit_blocking(one(&gate), &JobContext::new("holder"), None)
            .unwrap();
        let (m, g) = (monitor.clone(), gate.clone());
        let asker =
            thread::spawn(move || m.admit_blocking(one(&g), &JobContext::new("asker"), None));
        monitor.stop();
        let outcome = asker.join().unwrap();
        assert!(
            matches!(outcome, Err(AdmitError::Shutdown)),
            "got {outcome:?}"
        );
        assert_eq!(monitor.queue_size(), 0);
        assert!(!monitor.shared.has_evaluator(), "stop joined it");
        drop(held);
        assert_eq!(gate.free(), 1);
    });
}

/// A clock that stands still until a test moves it (a plain atomic: the models order its moves
/// through their threads' joins and loom's own points).
#[derive(Debug, Default)]
struct StillClock(std::sync::atomic::AtomicU64);

impl crate::Clock for StillClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// The models never sleep on a deadline: real time's defaults do.
impl crate::Timer for StillClock {}

#[test]
fn loom_a_waiters_own_expiry_racing_its_grant_settles_once_and_keeps_nothing() {
    loom::model(|| {
        let clock = Arc::new(StillClock::default());
        let monitor = Monitor::builder().clock(clock.clone()).build();
        let gate = Gate::new(1);
        let held = monitor
            .admit_blocking(one(&gate), &JobContext::new("holder"), None)
            .unwrap();
        let timeout = std::time::Duration::from_nanos(10);
        let mut admit =
            Box::pin(monitor.admit(one(&gate), &JobContext::new("late"), Some(timeout)));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(admit.as_mut().poll(&mut cx).is_pending());

        let giver = thread::spawn(move || drop(held));
        let (shared, c) = (monitor.shared.clone(), clock.clone());
        let expirer = thread::spawn(move || {
            c.0.store(20, std::sync::atomic::Ordering::SeqCst);
            // The first (and only) waiter parked in this line.
            shared.expire(crate::machine::Place::FIRST);
        });
        giver.join().unwrap();
        expirer.join().unwrap();
        match admit.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(grant)) => drop(grant),
            std::task::Poll::Ready(Err(AdmitError::TimedOut { timeout: t, .. })) => {
                assert_eq!(t, timeout);
            }
            other => panic!("expected a grant or a time-out, got {other:?}"),
        }
        drop(admit);
        monitor.stop();
        assert_eq!(gate.free(), 1, "the permit came back exactly once");
        assert_eq!(monitor.queue_size(), 0);
    });
}

#[test]
fn loom_an_ask_that_takes_then_gives_back_racing_a_give_never_loses_the_wake_up() {
    loom::model(|| {
        let (monitor, scarce, held) = started_with_its_one_permit_held();
        // The asker's first account fits and is taken, then given back when the scarce one says
        // "not now": that give-back, muted for this monitor, must not hide the racing give.
        let plenty = Gate::new(1);
        let (m, p, s) = (monitor.clone(), plenty.clone(), scarce.clone());
        let asker = thread::spawn(move || {
            let demand = Demand::new()
                .with(p.clone(), Amount::ONE)
                .with(s.clone(), Amount::ONE);
            m.admit_blocking(demand, &JobContext::new("asker"), None)
        });
        let giver = thread::spawn(move || drop(held));
        giver.join().unwrap();
        let grant = asker
            .join()
            .unwrap()
            .expect("the asker is granted once the give lands");
        assert_eq!((plenty.free(), scarce.free()), (0, 0));
        drop(grant);
        monitor.stop();
        assert_eq!((plenty.free(), scarce.free()), (1, 1));
    });
}

#[test]
fn loom_unlocked_fast_path_racing_a_park_never_loses_the_wake_up() {
    loom::model(|| {
        let monitor = Monitor::new();
        monitor.start().unwrap();
        // `a` has one permit both jobs want. The first job also asks `b` for more than it will
        // ever have: having taken `a` without the monitor lock, it gives it back (muted) and is
        // refused, so it never parks (a waiter leaving the line would run a pass for the other).
        let (a, b) = (Gate::new(1), Gate::with_capacity(1, 1));
        let (m, a1, b1) = (monitor.clone(), a.clone(), b.clone());
        let too_big = thread::spawn(move || {
            let demand = Demand::new()
                .with(a1.clone(), Amount::ONE)
                .with(b1.clone(), Amount::units(2));
            m.admit_blocking(demand, &JobContext::new("too big"), None)
        });
        let (m, a2) = (monitor.clone(), a.clone());
        let one_of_a =
            thread::spawn(move || m.admit_blocking(one(&a2), &JobContext::new("a"), None));
        assert!(matches!(
            too_big.join().unwrap(),
            Err(AdmitError::Refused { .. })
        ));
        let grant = one_of_a
            .join()
            .unwrap()
            .expect("granted once the give-back lands");
        assert_eq!(a.free(), 0);
        drop(grant);
        monitor.stop();
        assert_eq!((a.free(), b.free()), (1, 1));
        assert_eq!(monitor.queue_size(), 0);
    });
}

#[test]
fn loom_unlocked_fast_path_racing_stop_grants_before_it_or_takes_nothing() {
    loom::model(|| {
        let monitor = Monitor::new();
        let gate = Gate::new(1);
        let (m, g) = (monitor.clone(), gate.clone());
        let asker =
            thread::spawn(move || m.admit_blocking(one(&g), &JobContext::new("asker"), None));
        monitor.stop();
        match asker.join().unwrap() {
            Ok(grant) => {
                assert_eq!(gate.free(), 0);
                drop(grant);
            }
            Err(AdmitError::Shutdown) => {}
            Err(other) => panic!("expected a grant or Shutdown, got {other}"),
        }
        assert_eq!(gate.free(), 1, "a grant rolled back at stop kept a permit");
        assert_eq!(monitor.queue_size(), 0);
        assert!(matches!(
            monitor.admit_blocking(one(&gate), &JobContext::new("late"), None),
            Err(AdmitError::Shutdown)
        ));
    });
}

/// An account on an atomic counter, as `admission-accounts`' `CountingGate`: a take is a
/// `fetch_update(AcqRel, Acquire)`, a "not now" the failed update's Acquire load, a give a
/// `fetch_update`; no lock orders anything.
struct AtomicGate {
    in_use: loom::sync::atomic::AtomicU64,
    capacity: u64,
    wake: WakeSlot,
}

impl AtomicGate {
    fn new(capacity: u64) -> Arc<AtomicGate> {
        Arc::new(AtomicGate {
            in_use: loom::sync::atomic::AtomicU64::new(0),
            capacity,
            wake: WakeSlot::new(),
        })
    }
    fn free(&self) -> u64 {
        self.capacity - self.in_use.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Account for AtomicGate {
    fn name(&self) -> &str {
        "atomic"
    }
    fn category(&self) -> Category {
        Category::custom("atomic")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let asked = mine.primary();
        if asked > self.capacity {
            return Answer::Never(Refusal::too_large(mine, Amount::units(self.capacity)));
        }
        let want = asked + ask.reserved_ahead().primary();
        let room = |in_use: u64| self.capacity - in_use >= want;
        let fits = if ask.takes() {
            self.in_use
                .fetch_update(AcqRel, Acquire, |u| room(u).then(|| u + asked))
                .is_ok()
        } else {
            room(self.in_use.load(Acquire))
        };
        if fits {
            Answer::Taken
        } else {
            Answer::NotNow(None)
        }
    }
    fn give(&self, amount: Amount) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let _ = self
            .in_use
            .fetch_update(AcqRel, Acquire, |u| Some(u - amount.primary()));
        self.wake.notify();
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(GateStatus { free: self.free() })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

#[test]
fn loom_a_release_racing_a_park_on_an_atomic_account_never_loses_the_wake_up() {
    loom::model(|| {
        let monitor = Monitor::new();
        monitor.start().unwrap();
        let a = AtomicGate::new(1);
        let held = monitor
            .admit_blocking(
                Demand::new().with(a.clone(), Amount::ONE),
                &JobContext::new("holder"),
                None,
            )
            .unwrap();
        let (m, a2) = (monitor.clone(), a.clone());
        let asker = thread::spawn(move || {
            m.admit_blocking(
                Demand::new().with(a2.clone(), Amount::ONE),
                &JobContext::new("asker"),
                None,
            )
        });
        let giver = thread::spawn(move || drop(held));
        giver.join().unwrap();
        let grant = asker.join().unwrap().expect("granted once the give lands");
        assert_eq!(a.free(), 0);
        drop(grant);
        monitor.stop();
        assert_eq!(a.free(), 1);
    });
}

#[test]
fn loom_an_unlocked_give_back_racing_a_park_on_an_atomic_account_never_loses_the_wake_up() {
    loom::model(|| {
        let monitor = Monitor::new();
        monitor.start().unwrap();
        let (a, b) = (AtomicGate::new(1), AtomicGate::new(1));
        let (m, a1, b1) = (monitor.clone(), a.clone(), b.clone());
        let too_big = thread::spawn(move || {
            let demand = Demand::new()
                .with(a1.clone(), Amount::ONE)
                .with(b1.clone(), Amount::units(2));
            m.admit_blocking(demand, &JobContext::new("too big"), None)
        });
        let (m, a2) = (monitor.clone(), a.clone());
        let one_of_a = thread::spawn(move || {
            m.admit_blocking(
                Demand::new().with(a2.clone(), Amount::ONE),
                &JobContext::new("a"),
                None,
            )
        });
        assert!(matches!(
            too_big.join().unwrap(),
            Err(AdmitError::Refused { .. })
        ));
        let grant = one_of_a
            .join()
            .unwrap()
            .expect("granted once the give-back lands");
        drop(grant);
        monitor.stop();
        assert_eq!((a.free(), b.free()), (1, 1));
    });
}

#[test]
fn loom_unlocked_fast_path_racing_a_cancel_grants_or_refuses_and_keeps_nothing() {
    loom::model(|| {
        let monitor = Monitor::new();
        let gate = Gate::new(1);
        let ctx = JobContext::new("asker");
        let (m, g, c) = (monitor.clone(), gate.clone(), ctx.clone());
        let asker = thread::spawn(move || match m.admit_blocking(one(&g), &c, None) {
            Ok(grant) => {
                assert_eq!(g.free(), 0);
                drop(grant);
            }
            Err(AdmitError::Cancelled { .. }) => {}
            Err(other) => panic!("expected a grant or Cancelled, got {other}"),
        });
        let canceller = thread::spawn(move || ctx.cancel());
        asker.join().unwrap();
        canceller.join().unwrap();
        assert_eq!(gate.free(), 1, "a cancelled unlocked admit kept a permit");
        assert_eq!(monitor.queue_size(), 0);
        monitor.stop();
    });
}

/// A waker that owns its task's state, a grant among it: dropping the waker releases the grant.
// The grant is held only to be dropped with the waker.
#[allow(dead_code)]
struct OwningWaker(std::sync::Mutex<Option<crate::Grant>>);

impl std::task::Wake for OwningWaker {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn loom_a_waker_that_owns_a_grant_dropped_as_its_admit_is_decided_never_deadlocks() {
    loom::model(|| {
        let (monitor, gate, held) = started_with_its_one_permit_held();
        let mut admit = Box::pin(monitor.admit(one(&gate), &JobContext::new("task"), None));
        // The first poll's waker owns the holder's grant; the admit keeps its only handle.
        let first =
            std::task::Waker::from(Arc::new(OwningWaker(std::sync::Mutex::new(Some(held)))));
        let mut cx = std::task::Context::from_waker(&first);
        assert!(admit.as_mut().poll(&mut cx).is_pending());
        drop(first);

        // Another job arrives behind it while the task is polled again with a new waker (loom's
        // own): replacing the first drops it, which releases the grant, whose pass decides this
        // very admit, on this thread, racing the newcomer.
        let (m, g) = (monitor.clone(), gate.clone());
        let other = thread::spawn(move || {
            m.admit_blocking(one(&g), &JobContext::new("other"), None)
                .map(drop)
        });
        let grant = loom::future::block_on(admit).expect("the task is granted");
        drop(grant);
        other
            .join()
            .unwrap()
            .expect("the newcomer is granted after the task");
        assert_eq!(gate.free(), 1);
        assert_eq!(monitor.queue_size(), 0);
        monitor.stop();
    });
}

/// A started monitor whose passes let go of the lock after every waiter, a gate of `permits`
/// held by one job each, and `waiting` admits parked behind them (polled once).
fn batched_line(
    permits: u64,
    waiting: usize,
) -> (
    Monitor,
    Arc<Gate>,
    Vec<crate::Grant>,
    Vec<std::pin::Pin<Box<crate::Admit>>>,
) {
    let monitor = Monitor::builder().pass_batch(1).build();
    monitor.start().unwrap();
    let gate = Gate::new(permits);
    let held = (0..permits)
        .map(|i| {
            monitor
                .admit_blocking(one(&gate), &JobContext::new(format!("holder-{i}")), None)
                .unwrap()
        })
        .collect();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let parked = (0..waiting)
        .map(|i| {
            let mut admit =
                Box::pin(monitor.admit(one(&gate), &JobContext::new(format!("w{i}")), None));
            assert!(admit.as_mut().poll(&mut cx).is_pending());
            admit
        })
        .collect();
    (monitor, gate, held, parked)
}

/// (o) A release whose pass grants two waiters in two critical sections, racing a newcomer
/// that arrives between them: both waiters are granted in line order, the newcomer never
/// overtakes the second (it parks behind it, or arrives after it was granted) and is granted
/// once a permit comes back, and nothing is lost or left parked.
#[test]
fn loom_a_batched_pass_racing_an_arrival_between_its_batches_keeps_the_order_and_the_wake_up() {
    loom::model(|| {
        let (monitor, gate, mut held, parked) = batched_line(2, 2);
        let giver = {
            let holder = held.pop().unwrap();
            let other = held.pop().unwrap();
            thread::spawn(move || {
                drop(holder);
                drop(other);
            })
        };
        let (m, g) = (monitor.clone(), gate.clone());
        let newcomer =
            thread::spawn(move || m.admit_blocking(one(&g), &JobContext::new("late"), None));
        giver.join().unwrap();
        let mut granted = Vec::new();
        for admit in parked {
            granted.push(loom::future::block_on(admit).expect("a waiter ahead is granted"));
        }
        // The newcomer cannot have both permits' holders ahead of it granted and itself too.
        drop(granted);
        let late = newcomer.join().unwrap().expect("the newcomer is granted");
        drop(late);
        assert_eq!(gate.free(), 2);
        assert_eq!(monitor.queue_size(), 0);
        monitor.stop();
    });
}

/// (p) Two releases whose passes both walk a line of three in batches of one: the one that
/// finds the other between its batches leaves it a note, and the note is honoured (the line
/// walked again), so the two permits go to the first two waiters and the third is granted when
/// one of them gives back; no wake-up is lost.
#[test]
fn loom_two_batched_passes_never_interleave_and_lose_no_wake_up() {
    loom::model(|| {
        let (monitor, gate, mut held, mut parked) = batched_line(2, 3);
        let first = held.pop().unwrap();
        let second = held.pop().unwrap();
        let a = thread::spawn(move || drop(first));
        let b = thread::spawn(move || drop(second));
        a.join().unwrap();
        b.join().unwrap();
        let third = parked.pop().unwrap();
        let mut granted = Vec::new();
        for admit in parked {
            granted.push(loom::future::block_on(admit).expect("the first two are granted"));
        }
        assert_eq!(gate.free(), 0);
        drop(granted.pop());
        let last = loom::future::block_on(third).expect("the third is granted after a give");
        drop(last);
        drop(granted);
        assert_eq!(gate.free(), 2);
        assert_eq!(monitor.queue_size(), 0);
        monitor.stop();
    });
}

/// (q) A release of two permits whose pass grants one waiter per critical section, racing the
/// withdrawal of the waiter it visits next. The head waits on another account, so the pass
/// stops after granting the second waiter with its place at the third, behind the head (whose
/// leaving would run a pass of its own): while the pass is between its batches the line moves
/// that place on to the fourth, so the second and the fourth are granted whenever the third
/// leaves (before the pass, between its batches, or after its grant, which the dropped admit
/// gives back), and nothing is lost.
#[test]
fn loom_a_batched_pass_racing_the_withdrawal_of_its_next_waiter_moves_on_to_the_one_after() {
    loom::model(|| {
        let monitor = Monitor::builder().pass_batch(1).build();
        monitor.start().unwrap();
        let (gate, other) = (Gate::new(2), Gate::new(0));
        let holder = monitor
            .admit_blocking(
                Demand::new().with(gate.clone(), Amount::units(2)),
                &JobContext::new("holder"),
                None,
            )
            .unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut park = |demand: Demand, name: &str| {
            let mut admit = Box::pin(monitor.admit(demand, &JobContext::new(name), None));
            assert!(admit.as_mut().poll(&mut cx).is_pending());
            admit
        };
        let head = park(one(&other), "head");
        let second = park(one(&gate), "second");
        let third = park(one(&gate), "third");
        let fourth = park(one(&gate), "fourth");
        let leaver = thread::spawn(move || drop(third));
        let giver = thread::spawn(move || drop(holder));
        leaver.join().unwrap();
        giver.join().unwrap();
        let b = loom::future::block_on(second).expect("the second is granted");
        let d = loom::future::block_on(fourth).expect("the fourth is granted");
        assert_eq!(gate.free(), 0);
        drop((b, d));
        assert_eq!(gate.free(), 2);
        assert_eq!(
            monitor.queue_size(),
            1,
            "the head still waits on the other account"
        );
        monitor.stop();
        assert!(matches!(
            loom::future::block_on(head),
            Err(AdmitError::Shutdown)
        ));
    });
}

/// A started monitor with the levels `health`, `interactive` (reserving `reserve` permits of
/// `gate`) and `batch`.
fn leveled(reserve: u64) -> Monitor {
    let levels = Levels::new()
        .level(Level::new("health"))
        .and_then(|levels| {
            levels.level(Level::new("interactive").reserve("gate", Amount::units(reserve)))
        })
        .and_then(|levels| levels.level(Level::new("batch")))
        .unwrap();
    let monitor = Monitor::builder().levels(levels).build();
    monitor.start().unwrap();
    monitor
}

/// (s) A batch job holds the one permit and another waits for it at the head; an interactive
/// job arrives (polled once on this thread: placed before that head when it must wait, so it is
/// the head then) while the holder gives the permit back on another thread. Both are granted in
/// whichever order the race allows, each giving the permit back: a newcomer placed before the
/// head whose wake-up was lost stays parked, a deadlock to loom.
#[test]
fn loom_a_higher_levels_newcomer_before_the_head_racing_a_release_is_granted() {
    loom::model(|| {
        let monitor = leveled(0);
        let gate = Gate::new(1);
        let batch = JobContext::new("batch").with_level("batch");
        let held = monitor.admit_blocking(one(&gate), &batch, None).unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut waiting = Box::pin(monitor.admit(one(&gate), &batch, None));
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        let giver = thread::spawn(move || drop(held));
        let job = JobContext::new("interactive").with_level("interactive");
        let mut interactive = Box::pin(monitor.admit(one(&gate), &job, None));
        let first = match interactive.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(outcome) => Some(outcome.expect("granted on arrival")),
            std::task::Poll::Pending => None,
        };
        giver.join().unwrap();
        // Whichever was granted first gives the permit back, and the other is granted then.
        let batch_waiter = thread::spawn(move || {
            drop(loom::future::block_on(waiting).expect("the batch waiter is granted"));
        });
        match first {
            Some(grant) => drop(grant),
            None => drop(loom::future::block_on(interactive).expect("the interactive job")),
        }
        batch_waiter.join().unwrap();
        assert_eq!(gate.free(), 1);
        assert_eq!(monitor.queue_size(), 0);
        monitor.stop();
    });
}

/// (t) The interactive level reserves one of the gate's two permits; its one waiter is parked on
/// another account (empty) behind a health job's (the head, on a third), so a batch asker
/// wanting both permits is held by the reserve. The interactive waiter's future is dropped on
/// one thread while the batch job asks on another: once the level has nobody parked it lends its
/// permit, and the asker is granted (a leave that did not ring, the leaver not being the head,
/// would leave it parked: a deadlock to loom).
#[test]
fn loom_a_reserving_levels_last_waiter_leaving_racing_a_held_asker_lends_again() {
    loom::model(|| {
        let monitor = leveled(1);
        let gate = Gate::new(2);
        let other = Gate::named("other", 0, u64::MAX);
        let third = Gate::named("third", 0, u64::MAX);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let health = JobContext::new("health").with_level("health");
        let mut head = Box::pin(monitor.admit(one(&third), &health, None));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        let job = JobContext::new("interactive").with_level("interactive");
        let mut interactive = Box::pin(monitor.admit(one(&other), &job, None));
        assert!(interactive.as_mut().poll(&mut cx).is_pending());
        let leaver = thread::spawn(move || drop(interactive));
        let (m, g) = (monitor.clone(), gate.clone());
        let asker = thread::spawn(move || {
            let job = JobContext::new("batch").with_level("batch");
            m.admit_blocking(Demand::new().with(g, Amount::units(2)), &job, None)
                .map(drop)
        });
        leaver.join().unwrap();
        asker
            .join()
            .unwrap()
            .expect("the batch job borrows the reserve");
        drop(head);
        assert_eq!(gate.free(), 2);
        assert_eq!(monitor.queue_size(), 0);
        monitor.stop();
    });
}

/// (u) Under fair shares, behind a head parked on another account: tenant `b` waits for both of
/// the gate's permits (its turn there), tenant `a` for one (behind `b` by their tags). One
/// thread gives back the permit held, another drops `b`'s future. Whichever comes first, `a` is
/// granted: a release first finds `b` short and `a` leaving `b`'s two aside; `b`'s leave then
/// runs a pass (a leave that did not, `b` not being the head, would leave `a` parked with its
/// permit free: a deadlock to loom).
#[test]
fn loom_a_waiter_keeping_its_turn_leaving_racing_a_release_lets_the_next_in() {
    loom::model(|| {
        let monitor = Monitor::builder().fair_shares(FairShares::new()).build();
        monitor.start().unwrap();
        let gate = Gate::with_capacity(1, 2);
        let third = Gate::named("third", 0, u64::MAX);
        let a = |name: &str| JobContext::new(name).with_tenant("a");
        let held = monitor
            .admit_blocking(one(&gate), &a("held"), None)
            .unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut head = Box::pin(monitor.admit(one(&third), &a("head"), None));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        let both = Demand::new().with(gate.clone(), Amount::units(2));
        let b = JobContext::new("b").with_tenant("b");
        let mut turn = Box::pin(monitor.admit(both, &b, None));
        assert!(turn.as_mut().poll(&mut cx).is_pending());
        let mut next = Box::pin(monitor.admit(one(&gate), &a("next"), None));
        assert!(next.as_mut().poll(&mut cx).is_pending());
        let leaver = thread::spawn(move || drop(turn));
        let giver = thread::spawn(move || drop(held));
        drop(loom::future::block_on(next).expect("the next waiter is granted"));
        leaver.join().unwrap();
        giver.join().unwrap();
        drop(head);
        assert_eq!(gate.free(), 1);
        assert_eq!(monitor.queue_size(), 0);
        monitor.stop();
    });
}
