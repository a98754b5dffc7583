//! The fast path without the monitor lock: a taker that stalls between its look at the line and
//! its take must not overtake a waiter that parked meanwhile.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use admission_accounts::CountingGate;
use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Demand, JobContext, Monitor,
    Replenishment, TryAdmitError, WakeFn,
};
use admission_testkit::monitor::wait_for_queue;

/// An account with room for everyone whose first ask blocks until the test lets it go: it holds
/// an unlocked attempt right after the attempt found the line empty.
#[derive(Default)]
struct Stall {
    /// (entered, let go)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Stall {
    fn wait_entered(&self) {
        let mut state = self.state.lock().unwrap();
        while !state.0 {
            state = self.cv.wait(state).unwrap();
        }
    }
    fn let_go(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

#[derive(Debug, serde::Serialize)]
struct StallStatus;

impl AccountStatus for StallStatus {
    fn name(&self) -> &str {
        "stall"
    }
    fn category(&self) -> Category {
        Category::custom("stall")
    }
    fn summary(&self) -> String {
        "stall".to_owned()
    }
}

impl Account for Stall {
    fn name(&self) -> &str {
        "stall"
    }
    fn category(&self) -> Category {
        Category::custom("stall")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, _mine: Amount, _ask: Ask) -> Answer {
        let mut state = self.state.lock().unwrap();
        if !state.0 {
            state.0 = true;
            self.cv.notify_all();
            while !state.1 {
                state = self.cv.wait(state).unwrap();
            }
        }
        Answer::Taken
    }
    fn give(&self, _amount: Amount) {}
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(StallStatus)
    }
    fn on_capacity_change(&self, _wake: Option<WakeFn>) {}
}

#[test]
fn a_taker_stalled_after_finding_the_line_empty_does_not_overtake_the_head_that_parked_meanwhile() {
    let monitor = Monitor::new();
    let a = Arc::new(CountingGate::on_system_clock("a", 1).unwrap());
    let b = Arc::new(CountingGate::on_system_clock("b", 1).unwrap());
    let stall = Arc::new(Stall::default());
    let holder = JobContext::new("holder");
    let held_a = monitor
        .admit_blocking(Demand::new().with(a.clone(), Amount::ONE), &holder, None)
        .unwrap();
    let held_b = monitor
        .admit_blocking(Demand::new().with(b.clone(), Amount::ONE), &holder, None)
        .unwrap();

    // The taker: {stall, a}. It finds the line empty, then stalls in its first ask.
    let (m, s, a1) = (monitor.clone(), stall.clone(), a.clone());
    let taker = thread::spawn(move || {
        let demand = Demand::new()
            .with(s as Arc<dyn Account>, Amount::ONE)
            .with(a1, Amount::ONE);
        m.admit_blocking(demand, &JobContext::new("taker"), None)
    });
    stall.wait_entered();
    // The head: {a, b}, parked while the taker stalls.
    let (m, a2, b2) = (monitor.clone(), a.clone(), b.clone());
    let head = thread::spawn(move || {
        let demand = Demand::new().with(a2, Amount::ONE).with(b2, Amount::ONE);
        m.admit_blocking(demand, &JobContext::new("head"), None)
    });
    wait_for_queue(&monitor, 1);
    // `a` comes back only now, with the head in the line (short on `b`): it is the head's.
    drop(held_a);
    assert_eq!(a.available(), 1);
    let probe = Demand::new().with(a.clone(), Amount::ONE);
    let late = JobContext::new("late");
    assert!(matches!(
        monitor.try_admit(&probe, &late),
        Err(TryAdmitError::WouldWait { waiting: 1, .. })
    ));

    // The taker resumes, takes `a`, sees the head, gives `a` back and parks behind it.
    stall.let_go();
    wait_for_queue(&monitor, 2);
    assert_eq!(a.available(), 1, "the taker kept the head's `a`");
    drop(held_b);
    let head_grant = head.join().unwrap().expect("the head goes first");
    assert_eq!((a.available(), b.available()), (0, 0));
    drop(head_grant);
    let taker_grant = taker.join().unwrap().expect("then the taker");
    assert_eq!((a.available(), b.available()), (0, 1));
    drop(taker_grant);
    assert_eq!(a.available(), 1);
    assert_eq!(monitor.queue_size(), 0);
}

/// The lock's own count of its holds: an admit and a release on an empty line, without a gate,
/// never take the monitor lock (`admit_blocking`, `try_admit` and each release); a park takes
/// it, and so does the release that hands the permit to the parked waiter.
#[test]
fn an_uncontended_admit_and_its_release_never_take_the_monitor_lock() {
    let monitor = Monitor::builder().time_lock_holds().build();
    let holds = || monitor.take_lock_holds().expect("timed");
    assert_eq!(holds().count, 0);
    let gate: Arc<CountingGate> = Arc::new(
        CountingGate::new("gate", 1, monitor.clock().clone()).expect("a positive capacity"),
    );
    let one = || Demand::new().with(gate.clone(), Amount::ONE);
    let ctx = JobContext::new("job");
    for _ in 0..3 {
        drop(monitor.admit_blocking(one(), &ctx, None).expect("free"));
        drop(monitor.try_admit(&one(), &ctx).expect("free"));
    }
    assert_eq!(holds().count, 0, "six admits and releases on an empty line");
    let held = monitor.admit_blocking(one(), &ctx, None).expect("free");
    assert_eq!(holds().count, 0);
    let waiter = {
        let (monitor, demand) = (monitor.clone(), one());
        thread::spawn(move || monitor.admit_blocking(demand, &JobContext::new("waiter"), None))
    };
    wait_for_queue(&monitor, 1);
    assert!(holds().count >= 1, "parking takes the lock");
    drop(held);
    let grant = waiter.join().unwrap().expect("handed the permit");
    let handed = holds();
    assert!(handed.count >= 1, "the hand-off takes the lock");
    assert!(handed.longest <= handed.total);
    assert!(handed.at_most(1.0) >= handed.longest);
    drop(grant);
}
