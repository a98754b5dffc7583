//! Loom models of the monitor's races (run by `cargo xtask loom`, under `--cfg admission_loom`).
//!
//! Each model runs the real monitor, evaluator thread included, on loom's scheduler, which tries
//! every interleaving of its synchronization points up to a preemption bound:
//! (a) a fast path racing a give, (b) an arrival asked at the line's tail racing a give,
//! (c) an abandoned or cancelled waiter racing its grant, (d) `stop` racing an admit.

use std::future::Future;
use std::sync::Arc;

use loom::thread;

use crate::{
    Account, AccountStatus, AdmitError, Amount, Category, Demand, Instant, JobContext, Monitor,
    Refusal, Replenishment, WakeFn, WakeSlot,
};

/// A counting gate whose counter sits under a loom-visible lock: a real account's lock is what
/// orders a give after the pass that found it short (the doorbell's skip relies on that edge, see
/// `doorbell.rs`), so the model must see it too.
struct Gate {
    free: crate::sync::Mutex<u64>,
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
        Category::SEMAPHORE
    }
    fn summary(&self) -> String {
        format!("gate: {} free", self.free)
    }
}

impl Gate {
    fn new(free: u64) -> Arc<Gate> {
        Arc::new(Gate {
            free: crate::sync::Mutex::new(free),
            wake: WakeSlot::new(),
        })
    }
    fn free(&self) -> u64 {
        *self.free.lock()
    }
}

impl Account for Gate {
    fn name(&self) -> &str {
        "gate"
    }
    fn category(&self) -> Category {
        Category::SEMAPHORE
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn fits(&self, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
        Ok(mine.primary() + reserved.primary() <= *self.free.lock())
    }
    fn try_take(&self, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
        let mut free = self.free.lock();
        if mine.primary() + reserved.primary() <= *free {
            *free -= mine.primary();
            return Ok(true);
        }
        Ok(false)
    }
    fn give(&self, amount: Amount) {
        *self.free.lock() += amount.primary();
        self.wake.notify();
    }
    fn earliest_fit(&self, _mine: Amount, _reserved: Amount) -> Option<Instant> {
        None
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
