//! `Monitor::try_admit`: the whole demand now or nothing, never waiting, never overtaking the
//! line, with a grant that borrows what it was given.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use admission_core::{AdmitError, Demand, JobContext, Monitor, TryAdmitError};
use admission_testkit::monitor::poll_once;

use super::gate::TestGate;
use super::{demand, on, permits, recorded};

#[test]
fn a_try_takes_the_whole_demand_and_its_grant_gives_it_back_on_drop_release_or_rollback() {
    let (monitor, _clock, recorder) = recorded();
    let (http, db) = (permits("http", 2), permits("db", 3));
    let both = demand(&[(on(&http), 1), (on(&db), 2)]);
    let job = JobContext::new("job");

    let grant = monitor.try_admit(&both, &job).expect("room for all of it");
    assert_eq!((http.available(), db.available()), (1, 1));
    assert_eq!(grant.entries().len(), 2);
    assert_eq!(grant.context().id(), job.id());
    drop(grant);
    assert_eq!((http.available(), db.available()), (2, 3));

    let mut grant = monitor.try_admit(&both, &job).unwrap();
    grant.release();
    assert!(grant.is_settled());
    grant.rollback();
    assert_eq!((http.available(), db.available()), (2, 3), "settled once");
    drop(grant);
    assert_eq!((http.available(), db.available()), (2, 3));
    assert_eq!(
        recorder.kinds(),
        [
            "granted_immediate",
            "released",
            "granted_immediate",
            "released"
        ]
    );
    assert_eq!(monitor.queue_size(), 0);
}

#[test]
fn a_demand_that_would_wait_takes_nothing_and_names_the_account_short() {
    let monitor = Monitor::builder().manual_passes().build();
    let (http, db) = (permits("http", 2), permits("db", 1));
    let _db_out = monitor
        .admit_blocking(demand(&[(on(&db), 1)]), &JobContext::new("holder"), None)
        .unwrap();
    let both = demand(&[(on(&http), 1), (on(&db), 1)]);
    let job = JobContext::new("job");
    match monitor.try_admit(&both, &job) {
        Err(error @ TryAdmitError::WouldWait { .. }) => {
            let TryAdmitError::WouldWait {
                job: id,
                waiting,
                ref short,
            } = error
            else {
                unreachable!()
            };
            assert_eq!((id, waiting, short.as_deref()), (job.id(), 0, Some("db")));
            assert_eq!(
                error.to_string(),
                format!(
                    "job {} would have to wait: `db` has no room for it now",
                    job.id()
                )
            );
        }
        other => panic!("expected WouldWait, got {other:?}"),
    }
    assert_eq!(
        (http.available(), db.available()),
        (2, 0),
        "the http permit taken before `db` said not now came back"
    );
    assert_eq!(monitor.queue_size(), 0, "a try never parks");
}

#[test]
fn a_try_never_overtakes_a_waiter_even_when_its_own_demand_fits() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 3);
    let _two = monitor
        .admit_blocking(demand(&[(on(&gate), 2)]), &JobContext::new("holder"), None)
        .unwrap();
    // The head wants 2 of the 1 left; a try of 1 would fit but must not go first.
    let mut head =
        Box::pin(monitor.admit(demand(&[(on(&gate), 2)]), &JobContext::new("head"), None));
    assert!(poll_once(&mut head).is_none());
    let one = demand(&[(on(&gate), 1)]);
    let job = JobContext::new("try");
    match monitor.try_admit(&one, &job) {
        Err(TryAdmitError::WouldWait { waiting, short, .. }) => {
            assert_eq!((waiting, short), (1, None));
        }
        other => panic!("expected WouldWait behind the head, got {other:?}"),
    }
    assert_eq!(gate.available(), 1);
    let error = monitor.try_admit(&one, &job).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "job {} would have to wait: 1 job is already waiting",
            job.id()
        )
    );
}

#[test]
fn what_admit_refuses_for_good_a_try_refuses_alike() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 2);
    let too_big = demand(&[(on(&gate), 3)]);
    let job = JobContext::new("job");
    assert!(matches!(
        monitor.try_admit(&too_big, &job),
        Err(TryAdmitError::Admit(AdmitError::Refused { ref account, .. })) if account == "gate"
    ));
    assert_eq!(gate.available(), 2);

    let one = demand(&[(on(&gate), 1)]);
    let cancelled = JobContext::new("cancelled");
    cancelled.cancel();
    assert!(matches!(
        monitor.try_admit(&one, &cancelled),
        Err(TryAdmitError::Admit(AdmitError::Cancelled { job, .. })) if job == cancelled.id()
    ));

    monitor.stop();
    assert!(matches!(
        monitor.try_admit(&one, &job),
        Err(TryAdmitError::Admit(AdmitError::Shutdown))
    ));
    assert_eq!(gate.available(), 2);
}

#[test]
fn an_owned_grant_made_from_a_borrowed_one_holds_until_it_is_dropped() {
    let monitor = Monitor::new();
    let gate = permits("gate", 1);
    let one = demand(&[(on(&gate), 1)]);
    let job = JobContext::new("job");
    let owned = monitor.try_admit(&one, &job).unwrap().into_owned();
    drop(one);
    assert_eq!(gate.available(), 0, "into_owned gave nothing back");
    let handle = std::thread::spawn(move || drop(owned));
    handle.join().unwrap();
    assert_eq!(gate.available(), 1);

    let one = demand(&[(on(&gate), 1)]);
    let mut borrowed = monitor.try_admit(&one, &job).unwrap();
    borrowed.release();
    let settled = borrowed.into_owned();
    assert!(settled.is_settled());
    drop(settled);
    assert_eq!(
        gate.available(),
        1,
        "a settled grant gives nothing back twice"
    );
}

#[test]
fn a_released_borrowed_grant_hands_its_permit_to_the_waiter_it_held_back() {
    let monitor = Monitor::builder().manual_passes().build();
    let gate = permits("gate", 1);
    let one = demand(&[(on(&gate), 1)]);
    let job = JobContext::new("job");
    let grant = monitor.try_admit(&one, &job).unwrap();
    let mut waiter =
        Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &JobContext::new("w"), None));
    assert!(poll_once(&mut waiter).is_none());
    drop(grant);
    let handed = poll_once(&mut waiter)
        .expect("the release ran the hand-off pass")
        .unwrap();
    assert_eq!(gate.available(), 0);
    drop(handed);
    assert_eq!(gate.available(), 1);
}

#[test]
fn behind_a_gate_a_try_is_asked_under_the_lock_and_a_holding_gate_is_named() {
    let gate = Arc::new(TestGate::default());
    let monitor = Monitor::builder()
        .manual_passes()
        .gate(gate.clone())
        .build();
    let http = permits("http", 1);
    let one = demand(&[(on(&http), 1)]);
    let job = JobContext::new("job");
    gate.hold_all.store(true, Ordering::SeqCst);
    match monitor.try_admit(&one, &job) {
        Err(TryAdmitError::WouldWait { waiting, short, .. }) => {
            assert_eq!((waiting, short.as_deref()), (0, Some("memory")));
        }
        other => panic!("expected the gate to hold it, got {other:?}"),
    }
    assert_eq!(http.available(), 1);
    gate.hold_all.store(false, Ordering::SeqCst);
    let grant = monitor.try_admit(&one, &job).unwrap();
    assert_eq!(http.available(), 0);
    assert_eq!(gate.passed.load(Ordering::SeqCst), 1);
    drop(grant);
    assert_eq!(gate.completed.load(Ordering::SeqCst), 1);
    assert_eq!(http.available(), 1);
}

#[test]
fn an_empty_demand_is_granted_at_once_by_a_try() {
    let monitor = Monitor::new();
    let nothing = Demand::new();
    let orchestrator = JobContext::new("orchestrator");
    let grant = monitor.try_admit(&nothing, &orchestrator).unwrap();
    assert!(grant.entries().is_empty());
    assert!(!grant.is_settled());
}
