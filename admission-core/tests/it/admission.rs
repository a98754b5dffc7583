//! The monitor's rules ("The monitor" in the statement of record).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use admission_core::{
    Account, AdmitError, Amount, Ask, Demand, Instant, JobContext, Monitor, StartError,
};
use admission_testkit::FakeClock;
use admission_testkit::monitor::{
    poll_once, spawn_task_waiter, spawn_thread_waiter, wait_for_queue,
};
use admission_testkit::reference::Permits;

use super::accounts::{GreedyWindow, Moody, Recording};
use super::{demand, meter, on, permits, recorded};

fn job(name: &str) -> JobContext {
    JobContext::new(name)
}

#[test]
fn start_is_idempotent_and_refused_after_stop() {
    let monitor = Monitor::new();
    assert_eq!(monitor.start(), Ok(()));
    assert_eq!(monitor.start(), Ok(()));
    monitor.stop();
    assert_eq!(monitor.start(), Err(StartError::Stopped));
}

#[test]
fn a_demand_that_fits_an_empty_line_is_granted_inline_by_the_caller() {
    // Never started: only the caller's own thread can grant.
    let monitor = Monitor::builder().manual_passes().build();
    let http = permits("http", 2);
    let grant = monitor
        .admit_blocking(demand(&[(on(&http), 2)]), &job("a"), None)
        .unwrap();
    assert_eq!(http.available(), 0);
    assert_eq!(grant.wall_wait(), Duration::ZERO);
    assert!(grant.wait_times().is_empty());
    assert_eq!(monitor.queue_size(), 0);
}

#[test]
fn the_whole_demand_is_granted_or_the_job_waits_holding_nothing() {
    let monitor = Monitor::builder().manual_passes().build();
    let http = permits("http", 2);
    let db = permits("db", 1);
    let blocker = monitor
        .admit_blocking(demand(&[(on(&db), 1)]), &job("blocker"), None)
        .unwrap();

    let mut waiting =
        Box::pin(monitor.admit(demand(&[(on(&http), 1), (on(&db), 1)]), &job("w"), None));
    assert!(poll_once(&mut waiting).is_none());
    assert_eq!(monitor.queue_size(), 1);
    assert_eq!(http.available(), 2, "a waiter holds nothing");

    drop(blocker);
    monitor.pass_now();
    let grant = poll_once(&mut waiting).expect("granted").unwrap();
    assert_eq!((http.available(), db.available()), (1, 0));
    assert_eq!(monitor.queue_size(), 0);
    drop(grant);
    assert_eq!((http.available(), db.available()), (2, 1));
}

#[test]
fn the_head_is_never_overtaken_and_one_give_cascades_in_arrival_order() {
    let (monitor, _clock, recorder) = recorded();
    let gate = permits("gate", 4);
    let blocker = monitor
        .admit_blocking(demand(&[(on(&gate), 3)]), &job("blocker"), None)
        .unwrap();

    let head = job("head");
    let small = job("small");
    let mut w1 = Box::pin(monitor.admit(demand(&[(on(&gate), 3)]), &head, None));
    let mut w2 = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &small, None));
    assert!(poll_once(&mut w1).is_none());
    assert!(poll_once(&mut w2).is_none());

    // One permit is free and `small` needs one, but the head's three are set aside.
    monitor.pass_now();
    assert!(poll_once(&mut w2).is_none(), "the head was overtaken");
    assert_eq!(gate.available(), 1);

    drop(blocker);
    monitor.pass_now();
    let g1 = poll_once(&mut w1).unwrap().unwrap();
    let g2 = poll_once(&mut w2).unwrap().unwrap();
    assert_eq!(gate.available(), 0);
    let granted: Vec<u64> = recorder
        .events()
        .iter()
        .filter(|e| e.kind.as_str() == "granted_from_hold")
        .map(|e| e.job.id)
        .collect();
    assert_eq!(granted, vec![head.id(), small.id()]);
    drop((g1, g2));
}

#[test]
fn the_heads_reservation_holds_on_its_sixth_account_as_on_its_first() {
    // The head keeps the first four accounts' keys at hand and looks further ones up in its
    // entries: a reservation on an account past them holds all the same, on arrival and at a
    // pass.
    let monitor = Monitor::builder().manual_passes().build();
    let plenty: Vec<_> = (0..5)
        .map(|i| permits(&format!("plenty-{i}"), 10))
        .collect();
    let gate = permits("gate", 4);
    let blocker = monitor
        .admit_blocking(demand(&[(on(&gate), 3)]), &job("blocker"), None)
        .unwrap();
    let mut parts: Vec<(admission_core::AccountRef, u64)> =
        plenty.iter().map(|p| (on(p), 1)).collect();
    parts.push((on(&gate), 3));
    let mut head = Box::pin(monitor.admit(demand(&parts), &job("head"), None));
    assert!(poll_once(&mut head).is_none());

    // One permit is free and `small` needs one, but the head's three are set aside.
    let mut small = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("small"), None));
    assert!(
        poll_once(&mut small).is_none(),
        "the head was overtaken on arrival"
    );
    monitor.pass_now();
    assert!(
        poll_once(&mut small).is_none(),
        "the head was overtaken at a pass"
    );
    assert_eq!(gate.available(), 1);
    assert_eq!(monitor.queue_size(), 2);

    // The blocker's three come back: the head takes three, `small` the fourth, in that order.
    drop(blocker);
    monitor.pass_now();
    let granted = poll_once(&mut head).unwrap().unwrap();
    let second = poll_once(&mut small).unwrap().unwrap();
    assert_eq!(gate.available(), 0);
    assert!(plenty.iter().all(|p| p.available() == 9));
    drop((granted, second));
    assert_eq!(gate.available(), 4);
}

#[test]
fn a_demand_disjoint_from_the_heads_short_accounts_passes_on_arrival() {
    let monitor = Monitor::builder().manual_passes().build();
    let a = permits("a", 1);
    let b = permits("b", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&a), 1)]), &job("holder"), None)
        .unwrap();
    let mut head = Box::pin(monitor.admit(demand(&[(on(&a), 1)]), &job("head"), None));
    assert!(poll_once(&mut head).is_none());
    // The line is not empty, so the newcomer is asked as the line's tail, with the head's
    // amounts set aside: nothing it needs is the head's, so it goes at once.
    let mut other = Box::pin(monitor.admit(demand(&[(on(&b), 1)]), &job("other"), None));
    let _granted = poll_once(&mut other).expect("granted on arrival").unwrap();
    assert_eq!(b.available(), 0);
    assert_eq!(monitor.queue_size(), 1);

    // One that does need the head's account waits behind it, though nothing else does.
    let mut behind = Box::pin(monitor.admit(demand(&[(on(&a), 1)]), &job("behind"), None));
    assert!(poll_once(&mut behind).is_none());
    assert_eq!(monitor.queue_size(), 2);
    monitor.pass_now();
    assert!(poll_once(&mut head).is_none());
}

#[test]
fn nothing_behind_a_head_short_on_a_time_account_takes_from_it() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    // One slot free of two, and the window ignores reservations: only the sharp rule protects
    // the head.
    let window = Arc::new(GreedyWindow::new(2, 1, Instant::from_nanos(5_000)));
    let mut head = Box::pin(monitor.admit(demand(&[(on(&window), 2)]), &job("head"), None));
    let mut behind = Box::pin(monitor.admit(demand(&[(on(&window), 1)]), &job("behind"), None));
    assert!(poll_once(&mut head).is_none());
    assert!(poll_once(&mut behind).is_none());
    let wake = monitor.pass_now();
    assert!(
        poll_once(&mut behind).is_none(),
        "took from the head's short Time account"
    );
    assert_eq!(*window.free.lock(), 1);
    assert_eq!(wake, Some(Instant::from_nanos(5_000)));
}

#[test]
fn an_account_refusal_refuses_that_waiter_only() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 3);
    match monitor.admit_blocking(demand(&[(on(&gate), 5)]), &job("big"), None) {
        Err(AdmitError::Refused { account, refusal }) => {
            assert_eq!(account, "gate");
            assert_eq!(
                refusal.message(),
                "`gate` has 3 permits in all; a demand of 5 can never fit"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }

    let _held = monitor
        .admit_blocking(demand(&[(on(&gate), 3)]), &job("holder"), None)
        .unwrap();
    let mut head = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("head"), None));
    let moody = Arc::new(Moody::new("moody"));
    moody.refuse.store(true, Ordering::SeqCst);
    let mut refused = Box::pin(monitor.admit(demand(&[(on(&moody), 1)]), &job("refused"), None));
    assert!(poll_once(&mut head).is_none());
    // Asked on arrival, as the line's tail: refused then and there.
    let error = poll_once(&mut refused).unwrap().unwrap_err();
    assert_eq!(
        error.to_string(),
        "account `moody` refused the demand: circuit open for 30 s; pick another tool"
    );
    monitor.pass_now();
    assert!(poll_once(&mut head).is_none());
    assert_eq!(monitor.queue_size(), 1);
}

#[test]
fn a_panicking_account_aborts_that_waiter_only_and_admission_goes_on() {
    let monitor = Monitor::builder().manual_passes().build();
    let moody = Arc::new(Moody::new("moody"));
    let gate = permits("gate", 1);
    moody.panic.store(true, Ordering::SeqCst);
    let ctx = job("victim");
    match monitor.admit_blocking(demand(&[(on(&gate), 1), (on(&moody), 1)]), &ctx, None) {
        Err(AdmitError::Aborted {
            account,
            job,
            panic,
        }) => {
            assert_eq!(account, "moody");
            assert_eq!(job, ctx.id());
            assert_eq!(panic, "moody account exploded");
        }
        other => panic!("expected an abort, got {other:?}"),
    }
    assert_eq!(gate.available(), 1, "the partial take was compensated");
    assert!(
        monitor
            .admit_blocking(demand(&[(on(&gate), 1)]), &job("next"), None)
            .is_ok()
    );
}

#[test]
fn the_evaluator_wakes_at_the_computed_deadline_and_not_before() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    monitor.start().unwrap();
    let tokens = meter("tokens", 10, 10, &clock);
    let _spent = monitor
        .admit_blocking(demand(&[(on(&tokens), 10)]), &job("spender"), None)
        .unwrap();

    let waiter = spawn_thread_waiter(&monitor, demand(&[(on(&tokens), 5)]), job("w"), None);
    wait_for_queue(&monitor, 1);
    clock.advance(Duration::from_millis(499));
    assert_eq!(tokens.level(), 4, "4.99 tokens: not yet");
    clock.advance(Duration::from_millis(1));
    let grant = waiter.outcome().unwrap();
    assert_eq!(grant.wall_wait(), Duration::from_millis(500));
    assert_eq!(tokens.level(), 0);
    assert_eq!(monitor.queue_size(), 0);
    monitor.stop();
}

#[test]
fn a_give_wakes_a_parked_thread_and_a_parked_task() {
    let monitor = Monitor::new();
    monitor.start().unwrap();
    let gate = permits("gate", 1);
    let held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &job("holder"), None)
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let thread = spawn_thread_waiter(&monitor, demand(&[(on(&gate), 1)]), job("thread"), None);
        wait_for_queue(&monitor, 1);
        let task = spawn_task_waiter(&monitor, demand(&[(on(&gate), 1)]), job("task"), None);
        tokio::task::yield_now().await;
        wait_for_queue(&monitor, 2);

        drop(held);
        let first = tokio::task::spawn_blocking(move || thread.outcome())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            monitor.queue_size(),
            1,
            "blocking and async waiters share one line"
        );
        drop(first);
        let second = task.outcome().await.unwrap().unwrap();
        assert_eq!(gate.available(), 0);
        drop(second);
    });
    assert_eq!(gate.available(), 1);
    monitor.stop();
}

#[test]
fn stop_refuses_every_waiter_clears_every_wake_slot_and_every_later_admit() {
    let monitor = Monitor::new();
    monitor.start().unwrap();
    let gate = permits("gate", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &job("holder"), None)
        .unwrap();
    let a = spawn_thread_waiter(&monitor, demand(&[(on(&gate), 1)]), job("a"), None);
    wait_for_queue(&monitor, 1);
    let b = spawn_thread_waiter(&monitor, demand(&[(on(&gate), 1)]), job("b"), None);
    wait_for_queue(&monitor, 2);
    assert!(gate.is_watched());

    monitor.stop();
    assert!(matches!(a.outcome(), Err(AdmitError::Shutdown)));
    assert!(matches!(b.outcome(), Err(AdmitError::Shutdown)));
    assert!(!gate.is_watched());
    assert_eq!(monitor.queue_size(), 0);
    assert!(matches!(
        monitor.admit_blocking(Demand::new(), &job("late"), None),
        Err(AdmitError::Shutdown)
    ));
}

#[test]
fn cancelling_the_context_withdraws_the_waiter_at_once() {
    let monitor = Monitor::builder().manual_passes().build();
    // Not started: nothing but the cancellation itself can answer the waiter.
    let gate = permits("gate", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &job("holder"), None)
        .unwrap();
    let ctx = job("cancelled");
    let waiter = spawn_thread_waiter(&monitor, demand(&[(on(&gate), 1)]), ctx.clone(), None);
    wait_for_queue(&monitor, 1);
    ctx.cancel();
    assert!(matches!(waiter.outcome(), Err(AdmitError::Cancelled { job, .. }) if job == ctx.id()));
    assert_eq!(monitor.queue_size(), 0);
    assert!(matches!(
        monitor.admit_blocking(Demand::new(), &ctx, None),
        Err(AdmitError::Cancelled { .. })
    ));
}

#[test]
fn a_cancelled_head_stops_reserving() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 4);
    let _held = monitor
        .admit_blocking(demand(&[(on(&gate), 3)]), &job("holder"), None)
        .unwrap();
    let head = job("head");
    let mut w1 = Box::pin(monitor.admit(demand(&[(on(&gate), 3)]), &head, None));
    let mut w2 = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("behind"), None));
    assert!(poll_once(&mut w1).is_none());
    assert!(poll_once(&mut w2).is_none());
    monitor.pass_now();
    assert!(poll_once(&mut w2).is_none());

    head.cancel();
    assert!(matches!(
        poll_once(&mut w1),
        Some(Err(AdmitError::Cancelled { .. }))
    ));
    monitor.pass_now();
    assert!(poll_once(&mut w2).unwrap().is_ok());
}

#[test]
fn dropping_a_pending_admit_withdraws_the_waiter() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &job("holder"), None)
        .unwrap();
    let mut pending = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("gone"), None));
    assert!(poll_once(&mut pending).is_none());
    assert_eq!(monitor.queue_size(), 1);
    drop(pending);
    assert_eq!(monitor.queue_size(), 0);
}

/// A waiter behind the head that leaves (dropped or cancelled) asks nothing of anyone: it held
/// nothing and set nothing aside, so nobody's answer changes, and no pass is asked for. The head
/// leaving frees what it set aside: the pass a give would get runs on the leaving thread, asks
/// the new head once, and grants it.
#[test]
fn only_the_head_leaving_asks_the_line_again() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let gate = Arc::new(Recording::new("gate", 2));
    let held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &job("holder"), None)
        .unwrap();
    // The head needs 2 (1 is free); each follower needs 1, which the head sets aside.
    let mut head = Box::pin(monitor.admit(demand(&[(on(&gate), 2)]), &job("head"), None));
    let mut dropped = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("dropped"), None));
    let cancelled = job("cancelled");
    let mut by_cancel = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &cancelled, None));
    let mut timed = Box::pin(monitor.admit(
        demand(&[(on(&gate), 1)]),
        &job("timed"),
        Some(Duration::from_secs(1)),
    ));
    let mut last = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job("last"), None));
    for admit in [
        &mut head,
        &mut dropped,
        &mut by_cancel,
        &mut timed,
        &mut last,
    ] {
        assert!(poll_once(admit).is_none());
    }
    monitor.pass_now();
    monitor.take_doorbell();
    gate.take_asks();
    assert_eq!(monitor.queue_size(), 5);

    drop(dropped);
    assert_eq!(monitor.queue_size(), 4);
    assert_eq!(
        (gate.take_asks().len(), monitor.take_doorbell()),
        (0, false)
    );
    cancelled.cancel();
    assert!(matches!(
        poll_once(&mut by_cancel),
        Some(Err(AdmitError::Cancelled { .. }))
    ));
    assert_eq!(monitor.queue_size(), 3);
    assert_eq!(
        (gate.take_asks().len(), monitor.take_doorbell()),
        (0, false)
    );
    clock.advance(Duration::from_secs(1));
    monitor.pass_now();
    assert!(matches!(
        poll_once(&mut timed),
        Some(Err(AdmitError::TimedOut { .. }))
    ));
    assert_eq!(monitor.queue_size(), 2);
    gate.take_asks();

    drop(head);
    assert_eq!(monitor.queue_size(), 0, "the new head was granted at once");
    assert_eq!(gate.take_asks().len(), 1, "the new head, asked once");
    let granted = poll_once(&mut last).expect("granted").unwrap();
    assert_eq!(gate.inner.in_use(), 2);
    drop(granted);
    drop(held);
    assert_eq!(gate.inner.in_use(), 0);
}

#[test]
fn a_grant_that_landed_as_the_admit_was_dropped_is_rolled_back_in_full() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let gate = permits("gate", 1);
    let tokens = meter("tokens", 100, 1, &clock);
    let held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &job("holder"), None)
        .unwrap();
    let mut pending = Box::pin(monitor.admit(
        demand(&[(on(&gate), 1), (on(&tokens), 40)]),
        &job("late"),
        None,
    ));
    assert!(poll_once(&mut pending).is_none());
    drop(held);
    monitor.pass_now(); // the grant lands in the abandoned admit's slot
    assert_eq!((gate.available(), tokens.level()), (0, 60));
    drop(pending);
    assert_eq!(
        (gate.available(), tokens.level()),
        (1, 100),
        "an abandoned admit kept a permit"
    );
}

#[test]
fn a_deadline_refuses_the_waiter_with_timed_out() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    monitor.start().unwrap();
    let gate = permits("gate", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &job("holder"), None)
        .unwrap();
    let ctx = job("impatient");
    let waiter = spawn_thread_waiter(
        &monitor,
        demand(&[(on(&gate), 1)]),
        ctx.clone(),
        Some(Duration::from_secs(2)),
    );
    wait_for_queue(&monitor, 1);
    clock.advance(Duration::from_secs(2));
    match waiter.outcome() {
        Err(AdmitError::TimedOut {
            job,
            waited,
            timeout,
        }) => {
            assert_eq!(job, ctx.id());
            assert_eq!(waited, Duration::from_secs(2));
            assert_eq!(timeout, Duration::from_secs(2));
        }
        other => panic!("expected a time-out, got {other:?}"),
    }
    assert!(matches!(
        monitor.admit_blocking(
            demand(&[(on(&gate), 1)]),
            &job("zero"),
            Some(Duration::ZERO)
        ),
        Err(AdmitError::TimedOut {
            waited: Duration::ZERO,
            ..
        })
    ));
    monitor.stop();
}

#[test]
fn an_empty_demand_is_an_orchestrators_and_is_granted_without_accounts() {
    let monitor = Monitor::builder().manual_passes().build();
    let grant = monitor
        .admit_blocking(Demand::new(), &job("orchestrator"), None)
        .unwrap();
    assert!(grant.is_empty());
}

#[test]
fn a_pass_over_ten_thousand_parked_waiters_grants_them_all_in_order() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 10_000);
    let held = monitor
        .admit_blocking(demand(&[(on(&gate), 10_000)]), &job("holder"), None)
        .unwrap();
    let mut waiters: Vec<_> = (0..10_000)
        .map(|i| Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &job(&format!("w{i}")), None)))
        .collect();
    for w in &mut waiters {
        assert!(poll_once(w).is_none());
    }
    assert_eq!(monitor.queue_size(), 10_000);
    monitor.pass_now();
    assert_eq!(monitor.queue_size(), 10_000, "nothing was free");
    // The release hands off on this thread: one pass grants all ten thousand. The statement of
    // record bounds it at well under two seconds; a debug build on a loaded CI core is the slow
    // case, so the bound asserted is the statement's own. Under valgrind (`cargo xtask
    // memcheck`, which checks memory, not time) the code runs tens of times slower and the
    // bound is not held.
    let started = std::time::Instant::now();
    drop(held);
    let took = started.elapsed();
    println!("a release's pass over 10,000 parked waiters took {took:?}");
    if std::env::var_os("ADMISSION_UNDER_VALGRIND").is_none() {
        assert!(
            took < Duration::from_secs(2),
            "the pass over 10,000 waiters took {took:?}"
        );
    }
    assert_eq!(monitor.queue_size(), 0);
    let grants: Vec<_> = waiters
        .iter_mut()
        .map(|w| poll_once(w).unwrap().unwrap())
        .collect();
    assert_eq!(gate.available(), 0);
    drop(grants);
    assert_eq!(gate.available(), 10_000);
}

#[test]
fn admit_amounts_merge_on_one_account() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 5);
    let mut d = Demand::new();
    d.add(on(&gate), Amount::units(2))
        .add(on(&gate), Amount::units(3));
    let grant = monitor.admit_blocking(d, &job("merged"), None).unwrap();
    assert_eq!(gate.available(), 0);
    drop(grant);
}

#[test]
fn a_demand_missing_a_required_capability_is_refused_at_once() {
    use admission_core::Capability;
    let monitor = Monitor::builder().manual_passes().build();
    let mut window = Moody::new("window");
    window.requires = Some(Capability::HTTP_CONNECTION);
    let window = Arc::new(window);
    let mut http = Moody::new("http");
    http.provides = Some(Capability::HTTP_CONNECTION);
    let http = Arc::new(http);

    let error = monitor
        .admit_blocking(demand(&[(on(&window), 1)]), &job("alone"), None)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "account `window` requires a `http_connection` in the same demand, and none of its accounts provides one"
    );
    assert_eq!(
        window.asked.load(Ordering::SeqCst),
        0,
        "refused before any account was asked"
    );
    assert!(
        monitor
            .admit_blocking(
                demand(&[(on(&window), 1), (on(&http), 1)]),
                &job("paired"),
                None
            )
            .is_ok()
    );
}

#[test]
fn a_release_s_pass_stops_at_a_head_short_on_what_was_given_back_and_only_there() {
    let monitor = Monitor::builder().manual_passes().build();
    let a = permits("a", 2);
    let b = permits("b", 1);
    let on_a = monitor
        .admit_blocking(demand(&[(on(&a), 2)]), &job("holds a"), None)
        .unwrap();
    let on_b = monitor
        .admit_blocking(demand(&[(on(&b), 1)]), &job("holds b"), None)
        .unwrap();
    let mut head = Box::pin(monitor.admit(demand(&[(on(&a), 2)]), &job("head"), None));
    assert!(poll_once(&mut head).is_none());
    let mut behind_on_a =
        Box::pin(monitor.admit(demand(&[(on(&a), 1)]), &job("behind on a"), None));
    assert!(poll_once(&mut behind_on_a).is_none());
    let mut behind_on_b =
        Box::pin(monitor.admit(demand(&[(on(&b), 1)]), &job("behind on b"), None));
    assert!(poll_once(&mut behind_on_b).is_none());
    assert_eq!(monitor.queue_size(), 3);

    // `b` comes back: the head is not short on `b`, so the release's pass goes on past it and
    // grants the waiter that needs only `b`.
    drop(on_b);
    let _b = poll_once(&mut behind_on_b)
        .expect("granted by the release's own pass")
        .unwrap();
    assert_eq!(b.available(), 0);

    // `a` comes back, both permits: the head goes, and the waiter behind it on `a` stays (the
    // head took everything).
    drop(on_a);
    let head = poll_once(&mut head).expect("the head is granted").unwrap();
    assert!(poll_once(&mut behind_on_a).is_none());
    assert_eq!((a.available(), monitor.queue_size()), (0, 1));
    drop(head);
    let _a = poll_once(&mut behind_on_a)
        .expect("granted once the head gives back")
        .unwrap();
    assert_eq!((a.available(), monitor.queue_size()), (1, 0));
}

#[test]
fn a_release_in_one_monitor_wakes_a_waiter_of_another_on_a_shared_account() {
    // One account in two monitors' demands: the release is handed off in the first monitor,
    // and the second, whose doorbell the account rings, must still hear of it.
    let first = Monitor::new();
    let recorder = Arc::new(admission_events::Recorder::new());
    let second = Monitor::builder().sink(recorder.clone()).build();
    first.start().unwrap();
    second.start().unwrap();
    let shared = permits("shared", 1);
    let held = first
        .admit_blocking(demand(&[(on(&shared), 1)]), &job("holder"), None)
        .unwrap();
    let waiter = spawn_thread_waiter(
        &second,
        demand(&[(on(&shared), 1)]),
        job("waiter"),
        Some(Duration::from_secs(10)),
    );
    // The evaluator's pass has held it (and gone back to sleep with nothing to wait for).
    admission_testkit::monitor::wait_until("the waiter is held", || {
        recorder.kinds().contains(&"held")
    });
    drop(held);
    let granted = waiter
        .outcome()
        .expect("woken by the other monitor's release");
    assert_eq!(shared.available(), 0);
    drop(granted);
    assert_eq!(shared.available(), 1);
    first.stop();
    second.stop();
}

/// How far past its timeout a waiter on the system clock may return: a loaded two-core machine
/// (CI runs the tests two at a time beside the build) may be slow to schedule the waiting
/// thread, but never by this much. A hang, the defect these tests hold, is waiting for ever.
const TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// How much earlier than its timeout the test's own stopwatch may see a waiter return: the
/// monitor's clock and `std::time::Instant` are read from different sources, a few
/// microseconds apart.
const CLOCK_SKEW: Duration = Duration::from_millis(5);

/// The case of a new user: `Monitor::new()` never started, every permit held, a 200 ms timeout.
fn a_drained_never_started_monitor() -> (Monitor, Arc<Permits>, admission_core::Grant) {
    let monitor = Monitor::new();
    let http = permits("http", 1);
    let held = monitor
        .admit_blocking(demand(&[(on(&http), 1)]), &job("holder"), None)
        .unwrap();
    (monitor, http, held)
}

fn assert_timed_out_in_time(
    outcome: Result<admission_core::Grant, AdmitError>,
    took: Duration,
    timeout: Duration,
) {
    match outcome {
        Err(AdmitError::TimedOut {
            timeout: reported, ..
        }) => assert_eq!(reported, timeout),
        other => panic!("expected a time-out, got {other:?}"),
    }
    println!("timed out after {took:?} (timeout {timeout:?}, margin {TIMEOUT_MARGIN:?})");
    assert!(
        took + CLOCK_SKEW >= timeout,
        "returned before its timeout: {took:?}"
    );
    assert!(
        took <= timeout + TIMEOUT_MARGIN,
        "returned {took:?} after asking with a {timeout:?} timeout"
    );
}

#[test]
fn a_blocking_wait_on_a_monitor_never_started_times_out_on_time() {
    let (monitor, http, _held) = a_drained_never_started_monitor();
    let timeout = Duration::from_millis(200);
    let started = std::time::Instant::now();
    let outcome = monitor.admit_blocking(demand(&[(on(&http), 1)]), &job("late"), Some(timeout));
    assert_timed_out_in_time(outcome, started.elapsed(), timeout);
    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(http.available(), 0, "the holder still holds its permit");
}

#[test]
fn an_async_wait_on_a_monitor_never_started_times_out_on_time() {
    let (monitor, http, _held) = a_drained_never_started_monitor();
    let timeout = Duration::from_millis(200);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let outcome = runtime.block_on(Box::pin(monitor.admit(
        demand(&[(on(&http), 1)]),
        &job("late"),
        Some(timeout),
    )));
    assert_timed_out_in_time(outcome, started.elapsed(), timeout);
    assert_eq!(monitor.queue_size(), 0);
}

#[test]
fn a_blocking_waiter_keeps_its_own_deadline_even_without_an_evaluator() {
    // Manual passes: no evaluator runs at all, and no test pass is made. The blocking waiter's
    // own timer still ends its wait.
    let monitor = Monitor::builder().manual_passes().build();
    let http = permits("http", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&http), 1)]), &job("holder"), None)
        .unwrap();
    let timeout = Duration::from_millis(200);
    let started = std::time::Instant::now();
    let outcome = monitor.admit_blocking(demand(&[(on(&http), 1)]), &job("late"), Some(timeout));
    assert_timed_out_in_time(outcome, started.elapsed(), timeout);
    assert_eq!(monitor.queue_size(), 0);
}

#[test]
fn a_clocked_refill_reaches_a_waiter_of_a_monitor_never_started() {
    // The evaluator starts with the first park and adopts the refill's deadline on its own.
    let clock = FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    let tokens = meter("tokens", 10, 1, &clock);
    let first = monitor
        .admit_blocking(demand(&[(on(&tokens), 10)]), &job("first"), None)
        .unwrap();
    drop(first); // clocked: the tokens stay spent
    let waiter = spawn_thread_waiter(&monitor, demand(&[(on(&tokens), 3)]), job("second"), None);
    wait_for_queue(&monitor, 1);
    clock.advance(Duration::from_secs(2));
    assert_eq!(monitor.queue_size(), 1, "2 of 3 tokens back: still waiting");
    clock.advance(Duration::from_secs(1));
    let grant = waiter.outcome().unwrap();
    assert_eq!(grant.wall_wait(), Duration::from_secs(3));
}

#[test]
fn stop_takes_back_only_its_own_wake_up_from_a_shared_account() {
    let http = permits("http", 1);
    let taken = http.ask(Amount::ONE, Ask::HEAD);
    assert!(
        taken.is_taken(),
        "someone outside admission holds the one permit"
    );
    // The first monitor watches the account, then the second takes its wake slot over.
    let first = Monitor::new();
    let first_waiter = spawn_thread_waiter(&first, demand(&[(on(&http), 1)]), job("first"), None);
    wait_for_queue(&first, 1);
    let second = Monitor::new();
    let second_waiter =
        spawn_thread_waiter(&second, demand(&[(on(&http), 1)]), job("second"), None);
    wait_for_queue(&second, 1);
    first.stop();
    assert!(matches!(first_waiter.outcome(), Err(AdmitError::Shutdown)));
    // The permit comes back outside both monitors: only the account's wake slot can tell.
    http.give(Amount::ONE);
    let grant = second_waiter.outcome().unwrap();
    assert_eq!(http.available(), 0);
    drop(grant);
    assert_eq!(http.available(), 1);
    second.stop();
}

#[test]
fn a_waiter_behind_a_head_that_does_not_use_an_account_is_not_asked_as_the_head() {
    let monitor = Monitor::builder().manual_passes().build();
    let scarce = permits("scarce", 1);
    let _held = monitor
        .admit_blocking(demand(&[(on(&scarce), 1)]), &job("holder"), None)
        .unwrap();
    let mut head = Box::pin(monitor.admit(demand(&[(on(&scarce), 1)]), &job("head"), None));
    assert!(poll_once(&mut head).is_none());
    // The follower's account is one the head does not use: nothing is set aside on it, and the
    // follower is still not the head.
    let other = Arc::new(Recording::new("other", 1));
    let follower = monitor
        .admit_blocking(demand(&[(on(&other), 1)]), &job("follower"), None)
        .unwrap();
    assert_eq!(other.take_asks(), [Ask::behind(Amount::ZERO)]);
    drop(follower);
    // Meeting an empty line, a job asks as the head.
    let empty_line = Monitor::builder().manual_passes().build();
    let mut alone = Box::pin(empty_line.admit(demand(&[(on(&other), 1)]), &job("alone"), None));
    assert!(matches!(poll_once(&mut alone), Some(Ok(_))));
    assert_eq!(other.take_asks(), [Ask::HEAD]);
}

#[test]
fn once_an_account_says_not_now_the_rest_are_looked_at_and_what_was_taken_goes_back() {
    let monitor = Monitor::builder().manual_passes().build();
    let first = Arc::new(Recording::new("first", 2));
    let scarce = permits("scarce", 1);
    let last = Arc::new(Recording::new("last", 2));
    let _held = monitor
        .admit_blocking(demand(&[(on(&scarce), 1)]), &job("holder"), None)
        .unwrap();
    first.take_asks();
    let mut waiter = Box::pin(monitor.admit(
        demand(&[(on(&first), 1), (on(&scarce), 1), (on(&last), 1)]),
        &job("waiter"),
        None,
    ));
    assert!(poll_once(&mut waiter).is_none());
    // The fast path stops at the first "not now"; the arrival asks every account once: `first`
    // taken and given back, `last` only looked at.
    assert_eq!(first.take_asks(), [Ask::HEAD, Ask::HEAD]);
    assert_eq!(last.take_asks(), [Ask::HEAD.look()]);
    assert_eq!(
        first.inner.available(),
        2,
        "what was taken before the short account came back"
    );
    assert_eq!(last.inner.available(), 2);
    assert_eq!(monitor.queue_size(), 1);
}
