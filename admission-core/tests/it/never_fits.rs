//! "Never" wins over "not now" on every path: a demand that an account can never grant is refused
//! at once, on arrival (behind a head short on that very account, behind a head about to go,
//! behind a gate), at a pass, and by `try_admit`, whatever the other accounts and the line say.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, AdmitError, Amount, Answer, Ask, Category, JobContext, Monitor,
    Refusal, RefusalKind, Replenishment, TryAdmitError, WakeFn, WakeSlot,
};
use admission_testkit::monitor::poll_once;
use admission_testkit::reference::{Permits, ReferenceStatus};

use super::gate::TestGate;
use super::{demand, on, permits};

fn job(name: &str) -> JobContext {
    JobContext::new(name)
}

/// Asserts `error` is `account`'s refusal of `asked` as more than its `max`.
#[track_caller]
fn assert_too_large(error: &AdmitError, account: &str, asked: u64, max: u64) {
    match error {
        AdmitError::Refused {
            account: name,
            refusal,
        } => {
            assert_eq!(name, account);
            assert_eq!(
                refusal.kind(),
                RefusalKind::TooLarge {
                    asked: Amount::units(asked),
                    max: Amount::units(max),
                }
            );
        }
        other => panic!("expected `{account}` to refuse {asked} as too large, got {other:?}"),
    }
}

/// A try's refusal, as [`assert_too_large`] checks it.
#[track_caller]
fn assert_try_refused(
    result: Result<admission_core::BorrowedGrant<'_>, TryAdmitError>,
    account: &str,
    asked: u64,
    max: u64,
) {
    match result {
        Err(TryAdmitError::Admit(error)) => assert_too_large(&error, account, asked, max),
        other => panic!("expected the try to be refused by `{account}`, got {other:?}"),
    }
}

/// A 5-permit gate whose five permits a holder keeps, and a head parked for one more: the line
/// of the defect as it was found.
fn full_gate_with_a_head(
    monitor: &Monitor,
) -> (
    Arc<Permits>,
    admission_core::Grant,
    std::pin::Pin<Box<admission_core::Admit>>,
) {
    let gate = permits("gate", 5);
    let holder = monitor
        .admit_blocking(demand(&[(on(&gate), 5)]), &job("holder"), None)
        .unwrap();
    let mut head = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("head"), None));
    assert!(poll_once(&mut head).is_none(), "the head parks");
    (gate, holder, head)
}

#[test]
fn a_demand_that_can_never_fit_is_refused_at_once_behind_a_head_short_on_the_same_account() {
    let monitor = Monitor::builder().manual_passes().build();
    let (gate, holder, mut head) = full_gate_with_a_head(&monitor);

    // The future is refused on its first poll, not parked until the head is served.
    let mut six = Box::pin(monitor.admit(demand(&[(on(&gate), 6)]), &job("six"), None));
    let error = poll_once(&mut six)
        .expect("refused on the first poll, not pending")
        .unwrap_err();
    assert_too_large(&error, "gate", 6, 5);

    // With a timeout it is the same refusal, never a `TimedOut` after waiting.
    let mut timed = Box::pin(monitor.admit(
        demand(&[(on(&gate), 6)]),
        &job("timed"),
        Some(Duration::from_millis(50)),
    ));
    let error = poll_once(&mut timed).expect("refused at once").unwrap_err();
    assert_too_large(&error, "gate", 6, 5);

    // The blocking call, too.
    let error = monitor
        .admit_blocking(demand(&[(on(&gate), 6)]), &job("blocking"), None)
        .unwrap_err();
    assert_too_large(&error, "gate", 6, 5);

    // And a try, which used to answer `WouldWait { waiting: 1 }` without asking anyone.
    let six = demand(&[(on(&gate), 6)]);
    assert_try_refused(monitor.try_admit(&six, &job("try")), "gate", 6, 5);
    // A demand that only has to wait still waits, naming the line.
    let one = demand(&[(on(&gate), 1)]);
    match monitor.try_admit(&one, &job("try-one")) {
        Err(TryAdmitError::WouldWait { waiting, short, .. }) => {
            assert_eq!((waiting, short), (1, None));
        }
        other => panic!("expected WouldWait behind the head, got {other:?}"),
    }

    assert_eq!(monitor.queue_size(), 1, "only the head waits");
    assert_eq!(gate.available(), 0, "nothing was taken by a refused demand");
    drop(holder);
    let grant = poll_once(&mut head).expect("the head goes").unwrap();
    assert_eq!(gate.available(), 4);
    drop(grant);
}

#[test]
fn never_wins_whichever_entry_the_head_is_short_on_and_in_any_order() {
    let monitor = Monitor::builder().manual_passes().build();
    let (gate, _holder, mut head) = full_gate_with_a_head(&monitor);
    let roomy = permits("roomy", 3);

    // Short on `gate` with the head (only looked at), never on `roomy`.
    for (name, parts) in [
        ("gate-first", vec![(on(&gate), 1), (on(&roomy), 4)]),
        ("roomy-first", vec![(on(&roomy), 4), (on(&gate), 1)]),
    ] {
        let mut admit = Box::pin(monitor.admit(demand(&parts), &job(name), None));
        let error = poll_once(&mut admit).expect("refused at once").unwrap_err();
        assert_too_large(&error, "roomy", 4, 3);
        assert_try_refused(
            monitor.try_admit(&demand(&parts), &job(name)),
            "roomy",
            4,
            3,
        );
    }
    // Never on `gate`, the account the head is short on, with a fitting `roomy` before it.
    let parts = [(on(&roomy), 1), (on(&gate), 6)];
    let mut admit = Box::pin(monitor.admit(demand(&parts), &job("roomy-then-six"), None));
    let error = poll_once(&mut admit).expect("refused at once").unwrap_err();
    assert_too_large(&error, "gate", 6, 5);
    assert_eq!(roomy.available(), 3, "what was looked at was not taken");
    assert!(poll_once(&mut head).is_none());
    assert_eq!(monitor.queue_size(), 1);
}

#[test]
fn a_try_on_an_empty_line_refuses_a_never_behind_an_account_that_says_not_now() {
    let monitor = Monitor::builder().manual_passes().build();
    let full = permits("full", 1);
    let roomy = permits("roomy", 3);
    let _held = monitor
        .admit_blocking(demand(&[(on(&full), 1)]), &job("holder"), None)
        .unwrap();
    // The unlocked fast path stops at `full`'s "not now"; `roomy` can never hold 4.
    let parts = demand(&[(on(&full), 1), (on(&roomy), 4)]);
    assert_try_refused(monitor.try_admit(&parts, &job("try")), "roomy", 4, 3);
    // The admit, too (asked again at the tail of the empty line, every account).
    let error = monitor
        .admit_blocking(parts, &job("admit"), None)
        .unwrap_err();
    assert_too_large(&error, "roomy", 4, 3);
    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(roomy.available(), 3);
}

#[test]
fn a_demand_behind_a_head_about_to_go_is_still_refused_at_once() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 5);
    // Taken outside the monitor, so that giving it back runs no pass of the monitor's.
    assert!(gate.ask(Amount::units(5), Ask::HEAD).is_taken());
    let mut head = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("head"), None));
    assert!(poll_once(&mut head).is_none());
    // The head could go now; only a pass (none runs: manual passes) would grant it. A newcomer
    // is not asked where a pass is due, but a "never" is still looked for.
    gate.give(Amount::ONE);
    let mut six = Box::pin(monitor.admit(demand(&[(on(&gate), 6)]), &job("six"), None));
    let error = poll_once(&mut six).expect("refused at once").unwrap_err();
    assert_too_large(&error, "gate", 6, 5);
    assert_eq!(monitor.queue_size(), 1);
    monitor.pass_now();
    assert!(poll_once(&mut head).unwrap().is_ok());
}

/// Permits whose capacity can be lowered while waiters stand in the line.
struct Shrinking {
    capacity: AtomicU64,
    in_use: AtomicU64,
    wake: WakeSlot,
}

impl Shrinking {
    fn new(capacity: u64) -> Arc<Shrinking> {
        Arc::new(Shrinking {
            capacity: AtomicU64::new(capacity),
            in_use: AtomicU64::new(0),
            wake: WakeSlot::new(),
        })
    }
}

impl Account for Shrinking {
    fn name(&self) -> &str {
        "shrinking"
    }
    fn category(&self) -> Category {
        Category::custom("shrinking")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let capacity = self.capacity.load(Ordering::SeqCst);
        if mine.primary() > capacity {
            return Answer::Never(Refusal::too_large(mine, Amount::units(capacity)));
        }
        let in_use = self.in_use.load(Ordering::SeqCst);
        if mine.primary() + ask.reserved_ahead().primary() + in_use > capacity {
            return Answer::NotNow(None);
        }
        if ask.takes() {
            self.in_use.fetch_add(mine.primary(), Ordering::SeqCst);
        }
        Answer::Taken
    }
    fn give(&self, amount: Amount) {
        self.in_use.fetch_sub(amount.primary(), Ordering::SeqCst);
        self.wake.notify();
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: "shrinking".into(),
            category: Category::custom("shrinking"),
            capacity: self.capacity.load(Ordering::SeqCst),
            available: 0,
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

#[test]
fn a_pass_refuses_a_waiter_that_can_no_longer_fit_while_the_head_still_waits() {
    let monitor = Monitor::builder().manual_passes().build();
    let account = Shrinking::new(5);
    let holder = monitor
        .admit_blocking(demand(&[(on(&account), 5)]), &job("holder"), None)
        .unwrap();
    let mut head = Box::pin(monitor.admit(demand(&[(on(&account), 1)]), &job("head"), None));
    let mut four = Box::pin(monitor.admit(demand(&[(on(&account), 4)]), &job("four"), None));
    assert!(poll_once(&mut head).is_none());
    assert!(poll_once(&mut four).is_none());
    assert_eq!(monitor.queue_size(), 2);

    // Lowered to 3 while both wait: 4 can never fit now; the head's 1 still can.
    account.capacity.store(3, Ordering::SeqCst);
    monitor.pass_now();
    let error = poll_once(&mut four)
        .expect("refused by the pass, not left behind the head")
        .unwrap_err();
    assert_too_large(&error, "shrinking", 4, 3);
    assert!(poll_once(&mut head).is_none(), "the head still waits");
    assert_eq!(monitor.queue_size(), 1);
    drop(holder);
    assert!(poll_once(&mut head).unwrap().is_ok());
}

#[test]
fn a_gate_that_holds_the_line_does_not_park_a_demand_that_can_never_fit() {
    let gate = Arc::new(TestGate::default());
    let monitor = Monitor::builder()
        .manual_passes()
        .gate(gate.clone())
        .build();
    let account = Shrinking::new(5);
    gate.hold_all.store(true, Ordering::SeqCst);

    // An empty line: the gate holds, the account can never grant 6.
    let mut six = Box::pin(monitor.admit(demand(&[(on(&account), 6)]), &job("six"), None));
    let error = poll_once(&mut six).expect("refused at once").unwrap_err();
    assert_too_large(&error, "shrinking", 6, 5);
    let parts = demand(&[(on(&account), 6)]);
    assert_try_refused(monitor.try_admit(&parts, &job("try")), "shrinking", 6, 5);

    // A line held by the gate: a newcomer that can never fit is refused on arrival.
    let mut head = Box::pin(monitor.admit(demand(&[(on(&account), 1)]), &job("head"), None));
    assert!(poll_once(&mut head).is_none());
    let mut behind = Box::pin(monitor.admit(demand(&[(on(&account), 6)]), &job("behind"), None));
    let error = poll_once(&mut behind)
        .expect("refused at once")
        .unwrap_err();
    assert_too_large(&error, "shrinking", 6, 5);

    // And a waiter the gate holds is refused by the pass once its account shrinks under it.
    let mut four = Box::pin(monitor.admit(demand(&[(on(&account), 4)]), &job("four"), None));
    assert!(poll_once(&mut four).is_none());
    account.capacity.store(3, Ordering::SeqCst);
    monitor.pass_now();
    let error = poll_once(&mut four)
        .expect("refused by the pass")
        .unwrap_err();
    assert_too_large(&error, "shrinking", 4, 3);
    assert!(
        poll_once(&mut head).is_none(),
        "the gate still holds the head"
    );
    assert_eq!(monitor.queue_size(), 1);
    assert_eq!(account.in_use.load(Ordering::SeqCst), 0);
}

#[test]
fn an_empty_line_gives_back_what_it_took_before_a_later_account_says_never() {
    // The fast path takes account by account; a "never" after a take gives the take back and is
    // the refusal, for `admit_blocking` and for `try_admit` alike.
    let monitor = Monitor::builder().manual_passes().build();
    let (http, db) = (permits("http", 2), permits("db", 3));
    let too_big = demand(&[(on(&http), 1), (on(&db), 4)]);
    let error = monitor
        .admit_blocking(too_big.clone(), &job("blocking"), None)
        .unwrap_err();
    assert_too_large(&error, "db", 4, 3);
    assert_eq!((http.available(), db.available()), (2, 3));
    assert_try_refused(monitor.try_admit(&too_big, &job("try")), "db", 4, 3);
    assert_eq!((http.available(), db.available()), (2, 3));
    assert_eq!(monitor.queue_size(), 0, "nothing parked");
}
