//! A parked waiter's record and its decision are kept in the line's slot until the waiter
//! collects the decision. These tests hold the rule that makes that leak-free: whatever way the
//! waiter goes away (its outcome taken, the future dropped before or after the outcome landed,
//! the blocking call unwinding), its slot is freed, and nothing it was granted is kept. And the
//! listener that takes a cancelled job's waiter out of the line is kept in the job's context
//! without allocating.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use admission_core::{Clock, Instant, JobContext, Monitor, SystemClock, Timer};
use admission_testkit::monitor::{poll_once, wait_for_queue};

use super::{demand, on, permits};

/// A real clock whose timer panics: a blocking waiter with a deadline asks it how long to sleep
/// once it is parked, so the call unwinds with its waiter in the line.
#[derive(Debug)]
struct PanickingTimer(SystemClock);

impl Clock for PanickingTimer {
    fn now(&self) -> Instant {
        self.0.now()
    }
}

impl Timer for PanickingTimer {
    fn real_wait(&self, _deadline: Instant) -> Option<Duration> {
        panic!("the timer failed");
    }
}

#[test]
fn a_blocking_admit_that_unwinds_while_parked_leaves_the_line_and_keeps_nothing() {
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(Arc::new(PanickingTimer(SystemClock::new())))
        .build();
    let gate = permits("gate", 1);
    let holder = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("holder"), None)
        .expect("the permit is free");
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        monitor.admit_blocking(
            demand(&[(on(&gate), 1)]),
            &JobContext::new("waiter"),
            Some(Duration::from_secs(60)),
        )
    }));
    assert!(unwound.is_err(), "the timer's panic reaches the caller");
    assert_eq!(
        monitor.queue_size(),
        0,
        "the unwinding waiter left the line"
    );
    drop(holder);
    assert_eq!(monitor.pass_now(), None, "nobody is left to serve");
    assert_eq!(
        gate.available(),
        1,
        "nothing was granted to the waiter that went"
    );
    let again = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("again"), None)
        .expect("the permit is free again");
    assert_eq!(gate.available(), 0);
    drop(again);
    assert_eq!(gate.available(), 1);
}

#[test]
fn an_admit_dropped_after_its_grant_landed_unseen_gives_the_grant_back() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 2);
    let holder = monitor
        .admit_blocking(demand(&[(on(&gate), 2)]), &JobContext::new("holder"), None)
        .expect("both permits are free");
    let mut first =
        Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &JobContext::new("first"), None));
    let mut second =
        Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &JobContext::new("second"), None));
    assert!(poll_once(&mut first).is_none());
    assert!(poll_once(&mut second).is_none());
    assert_eq!(monitor.queue_size(), 2);
    drop(holder);
    monitor.pass_now();
    assert_eq!(
        monitor.queue_size(),
        0,
        "both were granted into their futures"
    );
    assert_eq!(gate.available(), 0);
    // The first future's grant sits in it, never polled out: dropping the future gives it back.
    drop(first);
    assert_eq!(gate.available(), 1);
    let grant = poll_once(&mut second)
        .expect("the outcome is in the future")
        .expect("granted");
    drop(second);
    assert_eq!(
        gate.available(),
        1,
        "a future whose grant was taken gives nothing back"
    );
    drop(grant);
    assert_eq!(gate.available(), 2);
}

#[test]
fn a_blocking_waiter_is_woken_on_its_own_thread_by_a_release_on_another() {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let gate = permits("gate", 1);
    let holder = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("holder"), None)
        .expect("the permit is free");
    let waiters: Vec<_> = (0..4)
        .map(|i| {
            let monitor = monitor.clone();
            let gate = gate.clone();
            std::thread::spawn(move || {
                let grant = monitor
                    .admit_blocking(
                        demand(&[(on(&gate), 1)]),
                        &JobContext::new(format!("waiter-{i}")),
                        Some(Duration::from_secs(30)),
                    )
                    .expect("each waiter is served in turn");
                assert_eq!(gate.available(), 0, "waiter {i} holds the only permit");
                drop(grant);
            })
        })
        .collect();
    wait_for_queue(&monitor, 4);
    drop(holder);
    for waiter in waiters {
        waiter.join().expect("no waiter failed");
    }
    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(gate.available(), 1);
}

/// A job's context keeps room for one cancellation listener in place (a waiter's listener
/// allocates nothing); a job waiting in two lines and on its own `cancelled()` future registers
/// three, past that room, and one cancel reaches all three. A listener whose waiter was served
/// is forgotten: cancelling afterwards touches neither line.
#[test]
fn one_cancel_withdraws_a_job_from_two_lines_and_wakes_its_cancelled_future() {
    let first = Monitor::builder().manual_passes().build();
    let second = Monitor::builder().manual_passes().build();
    let (a, b) = (permits("a", 1), permits("b", 1));
    let held_a = first
        .admit_blocking(demand(&[(on(&a), 1)]), &JobContext::new("holder-a"), None)
        .expect("free");
    let held_b = second
        .admit_blocking(demand(&[(on(&b), 1)]), &JobContext::new("holder-b"), None)
        .expect("free");
    let job = JobContext::new("two lines");
    let mut in_first = Box::pin(first.admit(demand(&[(on(&a), 1)]), &job, None));
    let mut in_second = Box::pin(second.admit(demand(&[(on(&b), 1)]), &job, None));
    let mut cancelled = Box::pin(job.cancelled());
    assert!(poll_once(&mut in_first).is_none());
    assert!(poll_once(&mut in_second).is_none());
    assert!(poll_once(&mut cancelled).is_none());
    assert_eq!((first.queue_size(), second.queue_size()), (1, 1));
    job.cancel();
    assert_eq!((first.queue_size(), second.queue_size()), (0, 0));
    for (outcome, line) in [
        (poll_once(&mut in_first), "first"),
        (poll_once(&mut in_second), "second"),
    ] {
        assert!(
            matches!(outcome, Some(Err(admission_core::AdmitError::Cancelled { job: id, .. })) if id == job.id()),
            "the {line} line's waiter was told it was cancelled"
        );
    }
    assert_eq!(poll_once(&mut cancelled), Some(()));
    drop((held_a, held_b));
    assert_eq!((a.available(), b.available()), (1, 1));

    // Served, then cancelled: the listener went with the wait.
    let served = JobContext::new("served");
    let held = first
        .admit_blocking(demand(&[(on(&a), 1)]), &JobContext::new("holder"), None)
        .expect("free");
    let mut admit = Box::pin(first.admit(demand(&[(on(&a), 1)]), &served, None));
    assert!(poll_once(&mut admit).is_none());
    drop(held);
    let grant = poll_once(&mut admit)
        .expect("granted by the release's pass")
        .expect("granted");
    served.cancel();
    assert_eq!(
        a.available(),
        0,
        "cancelling after the grant takes nothing back"
    );
    drop(grant);
    assert_eq!(a.available(), 1);
}
