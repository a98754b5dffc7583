//! The gate slot: consulted before every account, at every attempt, for demands with entries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use admission_core::{
    Account, AccountStatus, AdmitError, Amount, Answer, Ask, Category, Demand, Gate, GateAnswer,
    GateView, Instant, JobContext, Monitor, Replenishment, WakeFn, WakeSlot,
};
use admission_testkit::monitor::{poll_once, spawn_thread_waiter, wait_for_queue};
use admission_testkit::reference::ReferenceStatus;

use super::{demand, on, permits, recorded};

/// A gate that holds whoever it is told to, counts what it hears, and can be armed to panic.
#[derive(Default)]
pub(crate) struct TestGate {
    pub(crate) hold_all: AtomicBool,
    hold_head_only: AtomicBool,
    explode: AtomicBool,
    checks: AtomicUsize,
    pub(crate) passed: AtomicUsize,
    pub(crate) completed: AtomicUsize,
    wake: WakeSlot,
}

const HOLD_UNTIL: Instant = Instant::from_nanos(2_000_000_000);

impl Gate for TestGate {
    fn name(&self) -> &str {
        "memory"
    }
    fn category(&self) -> Category {
        Category::custom("pressure")
    }
    fn check(&self, view: GateView) -> GateAnswer {
        self.checks.fetch_add(1, Ordering::SeqCst);
        assert!(!self.explode.load(Ordering::SeqCst), "gate exploded");
        let hold = self.hold_all.load(Ordering::SeqCst)
            || (view.is_head() && self.hold_head_only.load(Ordering::SeqCst));
        if hold {
            GateAnswer::Hold {
                until: Some(HOLD_UNTIL),
            }
        } else {
            GateAnswer::Pass
        }
    }
    fn passed(&self, _view: GateView) {
        self.passed.fetch_add(1, Ordering::SeqCst);
    }
    fn completed(&self) {
        self.completed.fetch_add(1, Ordering::SeqCst);
    }
    fn on_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
}

/// An always-fitting account that records each ask with how many times the gate had been
/// checked when it came: the order of gate and accounts, exactly.
struct AfterTheGate {
    gate: Arc<TestGate>,
    seen: parking_lot::Mutex<Vec<(Ask<'static>, usize)>>,
    wake: WakeSlot,
}

impl Account for AfterTheGate {
    fn name(&self) -> &str {
        "after"
    }
    fn category(&self) -> Category {
        Category::custom("probe")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, _mine: Amount, ask: Ask) -> Answer {
        let checks = self.gate.checks.load(Ordering::SeqCst);
        self.seen
            .lock()
            .push((crate::accounts::question(ask), checks));
        Answer::Taken
    }
    fn give(&self, _amount: Amount) {}
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: "after".into(),
            category: Category::custom("probe"),
            capacity: 1,
            available: 1,
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
}

#[test]
fn the_gate_is_met_before_any_account_and_an_empty_demand_never_meets_it() {
    let gate = Arc::new(TestGate::default());
    let monitor = Monitor::builder()
        .manual_passes()
        .gate(gate.clone())
        .build();
    let probe = Arc::new(AfterTheGate {
        gate: gate.clone(),
        seen: parking_lot::Mutex::new(Vec::new()),
        wake: WakeSlot::new(),
    });
    gate.hold_all.store(true, Ordering::SeqCst);

    let mut held =
        Box::pin(monitor.admit(demand(&[(on(&probe), 1)]), &JobContext::new("held"), None));
    assert!(poll_once(&mut held).is_none());
    assert_eq!(gate.checks.load(Ordering::SeqCst), 1);
    // Held by the gate, the account is only looked at, after the gate answered, for a "never"
    // (which would refuse the job now rather than after the gate lets it through).
    let look = Ask::behind(Amount::ZERO).look();
    assert_eq!(
        *probe.seen.lock(),
        [(look, 1)],
        "an account was asked before the gate, or asked to take while the gate held it"
    );

    // The line is not empty, so the orchestrator queues too; its pass never asks the gate.
    let mut orchestrator = Box::pin(monitor.admit(Demand::new(), &JobContext::new("o"), None));
    assert!(poll_once(&mut orchestrator).is_none());
    monitor.pass_now();
    assert!(poll_once(&mut orchestrator).unwrap().is_ok());
    assert_eq!(
        gate.checks.load(Ordering::SeqCst),
        2,
        "once per attempt, never for the empty demand"
    );

    gate.hold_all.store(false, Ordering::SeqCst);
    monitor.pass_now();
    let grant = poll_once(&mut held).unwrap().unwrap();
    assert_eq!(gate.checks.load(Ordering::SeqCst), 3);
    assert_eq!(gate.passed.load(Ordering::SeqCst), 1);
    assert_eq!(
        *probe.seen.lock(),
        [(look, 1), (look, 2), (Ask::HEAD, 3)],
        "every ask came after the gate's check of the same attempt"
    );
    drop(grant);
    assert_eq!(gate.completed.load(Ordering::SeqCst), 1);
}

#[test]
fn while_the_gate_holds_the_head_every_waiter_with_entries_is_held_with_the_heads_deadline() {
    let gate = Arc::new(TestGate::default());
    let (monitor_plain, clock, recorder) = recorded();
    drop(monitor_plain);
    // On the fake clock, standing at zero: the gate's hold until `HOLD_UNTIL` is ahead of it
    // however long the process has run.
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .gate(gate.clone())
        .sink(recorder.clone())
        .build();
    let a = permits("a", 5);
    gate.hold_head_only.store(true, Ordering::SeqCst);

    let mut head = Box::pin(monitor.admit(demand(&[(on(&a), 1)]), &JobContext::new("head"), None));
    let mut behind =
        Box::pin(monitor.admit(demand(&[(on(&a), 1)]), &JobContext::new("behind"), None));
    let mut orchestrator =
        Box::pin(monitor.admit(Demand::new(), &JobContext::new("orchestrator"), None));
    assert!(poll_once(&mut head).is_none());
    assert!(poll_once(&mut behind).is_none());
    assert!(poll_once(&mut orchestrator).is_none());
    let checks_before = gate.checks.load(Ordering::SeqCst);

    let wake = monitor.pass_now();
    assert_eq!(wake, Some(HOLD_UNTIL));
    assert!(
        poll_once(&mut behind).is_none(),
        "released ahead of the head"
    );
    assert!(
        poll_once(&mut orchestrator).unwrap().is_ok(),
        "an empty demand never meets the gate"
    );
    assert_eq!(
        gate.checks.load(Ordering::SeqCst) - checks_before,
        1,
        "only the head asked"
    );
    assert_eq!(a.available(), 5);
    let held_on_gate: Vec<String> = recorder
        .events()
        .iter()
        .filter(|e| e.kind.as_str() == "held")
        .map(|e| format!("{}@{}", e.job.name, e.entries[0].account))
        .collect();
    assert_eq!(held_on_gate, ["head@memory", "behind@memory"]);

    gate.hold_head_only.store(false, Ordering::SeqCst);
    monitor.pass_now();
    assert!(poll_once(&mut head).unwrap().is_ok());
    assert!(poll_once(&mut behind).unwrap().is_ok());
}

#[test]
fn a_panicking_gate_is_a_defect_that_closes_admission_for_everyone() {
    let gate = Arc::new(TestGate::default());
    let monitor = Monitor::builder().gate(gate.clone()).build();
    monitor.start().unwrap();
    let a = permits("a", 1);
    let held = monitor
        .admit_blocking(demand(&[(on(&a), 1)]), &JobContext::new("holder"), None)
        .unwrap();
    let waiter = spawn_thread_waiter(&monitor, demand(&[(on(&a), 1)]), JobContext::new("w"), None);
    wait_for_queue(&monitor, 1);

    gate.explode.store(true, Ordering::SeqCst);
    drop(held); // the give wakes the evaluator, whose pass meets the exploding gate
    match waiter.outcome() {
        Err(AdmitError::Closed { cause }) => {
            assert_eq!(&*cause, "a pass failed: gate exploded");
        }
        other => panic!("expected a closed monitor, got {other:?}"),
    }
    match monitor.admit_blocking(Demand::new(), &JobContext::new("late"), None) {
        Err(AdmitError::Closed { cause }) => assert_eq!(&*cause, "a pass failed: gate exploded"),
        other => panic!("expected a closed monitor, got {other:?}"),
    }
    assert!(!a.is_watched(), "closing clears the wake slots");
}

#[test]
fn a_job_held_by_the_gate_is_reported_with_the_gates_own_category() {
    let gate = Arc::new(TestGate::default());
    let recorder = Arc::new(admission_events::Recorder::new());
    let monitor = Monitor::builder()
        .manual_passes()
        .gate(gate.clone())
        .sink(recorder.clone())
        .build();
    let http = permits("http", 1);
    gate.hold_all.store(true, Ordering::SeqCst);
    let mut held =
        Box::pin(monitor.admit(demand(&[(on(&http), 1)]), &JobContext::new("held"), None));
    assert!(poll_once(&mut held).is_none());
    monitor.pass_now();
    let events = recorder.events();
    let held_events: Vec<_> = events
        .iter()
        .filter(|e| e.kind == admission_core::EventKind::Held)
        .collect();
    assert_eq!(held_events.len(), 1);
    assert_eq!(held_events[0].entries.len(), 1);
    assert_eq!(held_events[0].entries[0].account, "memory");
    assert_eq!(
        held_events[0].entries[0].category,
        Category::custom("pressure")
    );
}

#[test]
fn the_test_gate_passes_the_gate_contract_suite() {
    admission_testkit::gate_contract::run_all(|| {
        let gate = Arc::new(TestGate::default());
        let (up, down) = (gate.clone(), gate.clone());
        admission_testkit::gate_contract::GateSubject::new(
            gate,
            admission_testkit::FakeClock::new(),
        )
        .press(move || up.hold_all.store(true, Ordering::SeqCst))
        .relieve(move || down.hold_all.store(false, Ordering::SeqCst))
    });
}
