//! `Demand` and `Grant` ("Demand and Grant" in the statement of record).

use std::future::Future;
use std::time::Duration;

use admission_core::{Amount, Demand, JobContext, Monitor, Replenishment};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;

use super::{demand, meter, on, permits};

#[test]
fn add_merges_into_the_entry_for_the_same_account_and_keeps_first_add_order() {
    let clock = FakeClock::new();
    let a = permits("a", 10);
    let b = meter("b", 1_000, 10, &clock);
    let mut d = Demand::new();
    d.add(on(&a), Amount::units(1))
        .add(on(&b), Amount::pair(300, 1))
        .add(on(&a), Amount::units(2))
        .add(on(&b), Amount::pair(200, 1));
    let names: Vec<&str> = d.entries().iter().map(|e| e.account().name()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(d.entries()[0].amount(), Amount::units(3));
    assert_eq!(d.entries()[1].amount(), Amount::pair(500, 2));
    assert_eq!(d.amount_on(&on(&b)), Amount::pair(500, 2));
    assert_eq!(d.amount_on(&on(&permits("c", 1))), Amount::ZERO);
    assert_eq!(d.len(), 2);
}

#[test]
fn a_clone_shares_its_entries_and_keeps_them_when_the_other_changes() {
    let a = permits("a", 10);
    let b = permits("b", 10);
    let original = Demand::new().with(on(&a), Amount::units(1));
    let mut merged = original.clone();
    // A clone is the same entries, not a copy of them.
    assert!(std::ptr::eq(original.entries(), merged.entries()));
    merged.add(on(&a), Amount::units(2));
    let mut grown = original.clone();
    grown.add(on(&b), Amount::units(4));
    assert_eq!(original.entries().len(), 1);
    assert_eq!(original.amount_on(&on(&a)), Amount::units(1));
    assert_eq!(merged.amount_on(&on(&a)), Amount::units(3));
    assert_eq!(grown.amount_on(&on(&a)), Amount::units(1));
    assert_eq!(grown.amount_on(&on(&b)), Amount::units(4));
    // Once no other holds them, a merge changes the entries in place.
    let before = merged.entries().as_ptr();
    merged.add(on(&a), Amount::units(1));
    assert_eq!(merged.entries().as_ptr(), before);
    assert_eq!(merged.amount_on(&on(&a)), Amount::units(4));
}

#[test]
fn an_orchestrators_demand_and_grant_are_empty() {
    assert!(Demand::new().is_empty());
    let grant = Monitor::builder()
        .manual_passes()
        .build()
        .admit_blocking(Demand::new(), &JobContext::new("o"), None)
        .unwrap();
    assert!(grant.is_empty());
    assert!(grant.entries().is_empty());
}

#[test]
fn release_returns_release_accounts_and_keeps_metered_debits_spent() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let http = permits("http", 2);
    let tokens = meter("tokens", 1_000, 1, &clock);
    assert_eq!(
        admission_core::Account::replenishment(&*tokens),
        Replenishment::Time
    );
    let mut grant = monitor
        .admit_blocking(
            demand(&[(on(&http), 1), (on(&tokens), 400)]),
            &JobContext::new("j"),
            None,
        )
        .unwrap();
    grant.release();
    assert_eq!((http.available(), tokens.level()), (2, 600));
    grant.rollback();
    assert_eq!(
        (http.available(), tokens.level()),
        (2, 600),
        "settled once: rollback after release is a no-op"
    );
}

#[test]
fn rollback_returns_everything_and_a_second_settle_is_a_no_op() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let http = permits("http", 2);
    let tokens = meter("tokens", 1_000, 1, &clock);
    let mut grant = monitor
        .admit_blocking(
            demand(&[(on(&http), 1), (on(&tokens), 400)]),
            &JobContext::new("j"),
            None,
        )
        .unwrap();
    assert!(!grant.is_settled());
    grant.rollback();
    assert!(grant.is_settled());
    assert_eq!((http.available(), tokens.level()), (2, 1_000));
    grant.rollback();
    grant.release();
    drop(grant);
    assert_eq!((http.available(), tokens.level()), (2, 1_000));
}

#[test]
fn dropping_a_grant_releases_it() {
    let monitor = Monitor::builder().manual_passes().build();
    let http = permits("http", 1);
    let grant = monitor
        .admit_blocking(demand(&[(on(&http), 1)]), &JobContext::new("j"), None)
        .unwrap();
    assert_eq!(http.available(), 0);
    drop(grant);
    assert_eq!(http.available(), 1);
}

#[test]
fn wall_wait_is_asking_to_granted_and_wait_times_are_per_account_holding_time() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let http = permits("http", 1);
    let tokens = meter("tokens", 100, 10, &clock);
    let held = monitor
        .admit_blocking(demand(&[(on(&http), 1)]), &JobContext::new("holder"), None)
        .unwrap();
    let spent = monitor
        .admit_blocking(
            demand(&[(on(&tokens), 100)]),
            &JobContext::new("spender"),
            None,
        )
        .unwrap();
    drop(spent);

    let mut w = Box::pin(monitor.admit(
        demand(&[(on(&http), 1), (on(&tokens), 50)]),
        &JobContext::new("w"),
        None,
    ));
    assert!(poll_once(&mut w).is_none());
    monitor.pass_now(); // t = 0: short on both
    clock.advance(Duration::from_secs(5)); // 50 tokens back; http still held
    monitor.pass_now();
    clock.advance(Duration::from_secs(2));
    drop(held);
    monitor.pass_now(); // t = 7 s: granted
    let grant = poll_once(&mut w).unwrap().unwrap();
    assert_eq!(grant.wall_wait(), Duration::from_secs(7));
    let wait_times = grant.wait_times();
    let times: Vec<(&str, Duration)> = wait_times.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    // The tokens stopped holding the job at 5 s, the connection at 7 s; they overlap, so they do
    // not add up to the wall wait.
    assert_eq!(
        times,
        [
            ("http", Duration::from_secs(7)),
            ("tokens", Duration::from_secs(5))
        ]
    );
}

#[test]
fn an_immediate_grant_has_no_wait_times() {
    let monitor = Monitor::builder().manual_passes().build();
    let http = permits("http", 1);
    let grant = monitor
        .admit_blocking(demand(&[(on(&http), 1)]), &JobContext::new("j"), None)
        .unwrap();
    assert!(grant.wait_times().is_empty());
    assert_eq!(grant.wall_wait(), Duration::ZERO);
}

#[test]
fn a_labelled_context_keeps_the_jobs_cancellation_switch() {
    let ctx = JobContext::new("job");
    let taken_before = ctx.clone();
    let labelled = ctx.with_workflow("nightly").with_tenant("acme");
    assert_eq!(labelled.snapshot().workflow.as_deref(), Some("nightly"));
    assert_eq!(labelled.snapshot().tenant.as_deref(), Some("acme"));
    assert_eq!(labelled.id(), taken_before.id());
    assert!(!labelled.is_cancelled());
    taken_before.cancel();
    assert!(
        labelled.is_cancelled(),
        "cancelled through a clone taken before labelling"
    );

    let ctx = JobContext::new("other");
    let taken_before = ctx.clone();
    ctx.with_workflow("w").cancel();
    assert!(taken_before.is_cancelled(), "and the other way round");
}

#[test]
fn cancelling_through_an_earlier_clone_withdraws_a_labelled_waiter() {
    let monitor = Monitor::builder().manual_passes().build();
    let http = permits("http", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&http), 1)]), &JobContext::new("holder"), None)
        .unwrap();
    let ctx = JobContext::new("waiter");
    let switch = ctx.clone();
    let mut admit = Box::pin(monitor.admit(
        demand(&[(on(&http), 1)]),
        &ctx.with_workflow("nightly"),
        None,
    ));
    assert!(admission_testkit::monitor::poll_once(&mut admit).is_none());
    assert_eq!(monitor.queue_size(), 1);
    switch.cancel();
    assert_eq!(monitor.queue_size(), 0);
    assert!(matches!(
        admission_testkit::monitor::poll_once(&mut admit),
        Some(Err(admission_core::AdmitError::Cancelled { .. }))
    ));
}

/// A waker that counts its wake-ups.
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_jobs_cancelled_future_completes_on_cancel_and_wakes_its_latest_waker_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Waker};

    let job = JobContext::new("watched");
    let mut cancelled = Box::pin(job.cancelled());
    let (first, second) = (
        Arc::new(CountingWaker(AtomicUsize::new(0))),
        Arc::new(CountingWaker(AtomicUsize::new(0))),
    );
    let first_waker = Waker::from(first.clone());
    let second_waker = Waker::from(second.clone());
    assert!(
        cancelled
            .as_mut()
            .poll(&mut Context::from_waker(&first_waker))
            .is_pending()
    );
    // Polled again with another waker (the task moved): only the latest is woken.
    assert!(
        cancelled
            .as_mut()
            .poll(&mut Context::from_waker(&second_waker))
            .is_pending()
    );
    job.clone().cancel();
    assert_eq!(
        (
            first.0.load(Ordering::SeqCst),
            second.0.load(Ordering::SeqCst)
        ),
        (0, 1)
    );
    assert!(
        cancelled
            .as_mut()
            .poll(&mut Context::from_waker(&second_waker))
            .is_ready()
    );
    // Already cancelled: ready at once, nothing registered.
    let mut again = Box::pin(job.cancelled());
    assert!(
        again
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    );
    // Dropped before the cancellation: its listener goes, and a cancel wakes nobody.
    let other = JobContext::new("dropped");
    let counting = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let waker = Waker::from(counting.clone());
    let mut dropped = Box::pin(other.cancelled());
    assert!(
        dropped
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    drop(dropped);
    other.cancel();
    assert_eq!(counting.0.load(Ordering::SeqCst), 0);
}
