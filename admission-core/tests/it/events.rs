//! The event vocabulary as the monitor emits it ("Events" in the statement of record).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use admission_core::event::{EventKind, RejectReason, SinkError};
use admission_core::{AdmitError, Event, EventSink, JobContext, Monitor};
use admission_events::Recorder;
use admission_testkit::monitor::poll_once;

use super::accounts::Moody;
use super::{demand, meter, on, permits, recorded};

#[test]
fn a_fast_path_emits_granted_immediate_and_nothing_else() {
    let (monitor, _clock, recorder) = recorded();
    let http = permits("http", 1);
    let grant = monitor
        .admit_blocking(demand(&[(on(&http), 1)]), &JobContext::new("fast"), None)
        .unwrap();
    assert_eq!(recorder.kinds(), ["granted_immediate"]);
    drop(grant);
    assert_eq!(recorder.kinds(), ["granted_immediate", "released"]);
    assert_eq!(
        recorder.events()[1].kind,
        EventKind::Released { rolled_back: false }
    );
}

#[test]
fn a_slow_path_emits_held_once_per_short_account_then_granted_from_hold() {
    let (monitor, clock, recorder) = recorded();
    let http = permits("http", 1);
    let tokens = meter("tokens", 10, 1, &clock);
    let held = monitor
        .admit_blocking(
            demand(&[(on(&http), 1), (on(&tokens), 10)]),
            &JobContext::new("first"),
            None,
        )
        .unwrap();
    recorder.clear();

    let ctx = JobContext::new("slow");
    let mut w = Box::pin(monitor.admit(demand(&[(on(&http), 1), (on(&tokens), 3)]), &ctx, None));
    assert!(poll_once(&mut w).is_none());
    monitor.pass_now();
    monitor.pass_now(); // held again on both: no new events
    clock.advance(Duration::from_secs(3));
    drop(held);
    monitor.pass_now();
    assert!(poll_once(&mut w).unwrap().is_ok());

    let events: Vec<Event> = recorder
        .events()
        .into_iter()
        .filter(|e| e.kind.as_str() != "released")
        .collect();
    let summary: Vec<(&str, Vec<&str>)> = events
        .iter()
        .map(|e| {
            (
                e.kind.as_str(),
                e.entries.iter().map(|x| x.account.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("held", vec!["http"]),
            ("held", vec!["tokens"]),
            ("granted_from_hold", vec!["http", "tokens"]),
        ]
    );
    assert_eq!(
        events[2].kind,
        EventKind::GrantedFromHold {
            wait: Duration::from_secs(3),
            waiters: 0
        }
    );
    assert!(events.iter().all(|e| e.job == *ctx.snapshot()));
}

#[test]
fn n_slow_path_waiters_on_one_account_make_exactly_2n_balanced_transitions() {
    const N: usize = 50;
    let (monitor, _clock, recorder) = recorded();
    let gate = permits("gate", N as u64);
    let held = monitor
        .admit_blocking(
            demand(&[(on(&gate), N as u64)]),
            &JobContext::new("holder"),
            None,
        )
        .unwrap();
    recorder.clear();
    let mut waiters: Vec<_> = (0..N)
        .map(|i| {
            Box::pin(monitor.admit(
                demand(&[(on(&gate), 1)]),
                &JobContext::new(format!("w{i}")),
                None,
            ))
        })
        .collect();
    for w in &mut waiters {
        assert!(poll_once(w).is_none());
    }
    monitor.pass_now();
    drop(held);
    monitor.pass_now();
    let grants: Vec<_> = waiters
        .iter_mut()
        .map(|w| poll_once(w).unwrap().unwrap())
        .collect();
    assert_eq!(grants.len(), N);
    assert_eq!(recorder.count("held"), N);
    assert_eq!(recorder.count("granted_from_hold"), N);
    assert_eq!(recorder.count("released"), 1, "the holder's release");
    assert_eq!(recorder.len(), 2 * N + 1);
    let after: Vec<usize> = recorder
        .events()
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::GrantedFromHold { waiters, .. } => Some(waiters),
            _ => None,
        })
        .collect();
    assert_eq!(
        after,
        (0..N).rev().collect::<Vec<_>>(),
        "the line drains to zero"
    );
}

fn reasons(recorder: &Recorder) -> Vec<RejectReason> {
    recorder
        .events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Rejected { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

#[test]
fn rejections_carry_their_reason() {
    let (monitor, clock, recorder) = recorded();
    let gate = permits("gate", 1);
    let moody = Arc::new(Moody::new("moody"));

    // circuit_blocked: an account's refusal
    moody.refuse.store(true, Ordering::SeqCst);
    assert!(
        monitor
            .admit_blocking(demand(&[(on(&moody), 1)]), &JobContext::new("a"), None)
            .is_err()
    );
    moody.refuse.store(false, Ordering::SeqCst);
    // aborted: an account's panic
    moody.panic.store(true, Ordering::SeqCst);
    assert!(
        monitor
            .admit_blocking(demand(&[(on(&moody), 1)]), &JobContext::new("b"), None)
            .is_err()
    );
    moody.panic.store(false, Ordering::SeqCst);

    let _held = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("holder"), None)
        .unwrap();
    // cancelled: through the context
    let ctx = JobContext::new("c");
    let mut c = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &ctx, None));
    assert!(poll_once(&mut c).is_none());
    ctx.cancel();
    // cancelled: an abandoned admit
    let mut d = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &JobContext::new("d"), None));
    assert!(poll_once(&mut d).is_none());
    drop(d);
    // timed_out
    let mut e = Box::pin(monitor.admit(
        demand(&[(on(&gate), 1)]),
        &JobContext::new("e"),
        Some(Duration::from_secs(1)),
    ));
    assert!(poll_once(&mut e).is_none());
    clock.advance(Duration::from_secs(1));
    monitor.pass_now();
    assert!(matches!(
        poll_once(&mut e),
        Some(Err(AdmitError::TimedOut { .. }))
    ));
    // shutdown
    let mut f = Box::pin(monitor.admit(demand(&[(on(&gate), 1)]), &JobContext::new("f"), None));
    assert!(poll_once(&mut f).is_none());
    monitor.stop();

    assert_eq!(
        reasons(&recorder),
        [
            RejectReason::CircuitBlocked,
            RejectReason::Aborted,
            RejectReason::Cancelled,
            RejectReason::Cancelled,
            RejectReason::TimedOut,
            RejectReason::Shutdown,
        ]
    );
    let first = &recorder.events()[0];
    assert_eq!(
        first.kind,
        EventKind::Rejected {
            reason: RejectReason::CircuitBlocked,
            message: "account `moody` refused the demand: circuit open for 30 s; pick another tool"
                .into()
        }
    );
}

#[test]
fn every_event_carries_the_jobs_snapshot() {
    let (monitor, _clock, recorder) = recorded();
    let gate = permits("gate", 1);
    let ctx = JobContext::new("agent-7")
        .with_workflow("nightly")
        .with_tenant("acme");
    let mut g = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &ctx, None)
        .unwrap();
    g.rollback();
    let events = recorder.events();
    assert_eq!(events.len(), 2);
    for e in &events {
        assert_eq!(e.job, *ctx.snapshot());
        assert_eq!(e.job.workflow.as_deref(), Some("nightly"));
        assert_eq!(e.job.tenant.as_deref(), Some("acme"));
    }
    assert_eq!(events[1].kind, EventKind::Released { rolled_back: true });
}

/// A sink that fails on its first event, by panicking or by returning an error, and records the
/// kinds of the events it accepts after that.
struct FailsOnce {
    panics: bool,
    calls: AtomicUsize,
    accepted: parking_lot::Mutex<Vec<&'static str>>,
}

impl FailsOnce {
    fn new(panics: bool) -> Arc<FailsOnce> {
        Arc::new(FailsOnce {
            panics,
            calls: AtomicUsize::new(0),
            accepted: parking_lot::Mutex::new(Vec::new()),
        })
    }
}

impl EventSink for FailsOnce {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            if self.panics {
                panic!("sink exploded");
            }
            return Err(SinkError("disk full".into()));
        }
        self.accepted.lock().push(event.kind.as_str());
        Ok(())
    }
}

#[test]
fn a_sink_that_panics_or_fails_loses_that_event_only() {
    for panics in [true, false] {
        let gate = permits("gate", 1);
        let sink = FailsOnce::new(panics);
        let monitor = Monitor::builder()
            .manual_passes()
            .sink(sink.clone())
            .build();
        for _ in 0..3 {
            let grant =
                monitor.admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("j"), None);
            assert!(grant.is_ok(), "admission never fails because of a sink");
        }
        assert_eq!(sink.calls.load(Ordering::SeqCst), 6, "panics: {panics}");
        assert_eq!(
            *sink.accepted.lock(),
            [
                "released",
                "granted_immediate",
                "released",
                "granted_immediate",
                "released"
            ],
            "only the first event is lost (panics: {panics})"
        );
    }
}

/// A clock that counts its reads: building an event reads the clock, an uncontended admit
/// without a gate does not.
#[derive(Debug, Default)]
struct CountingClock(AtomicUsize);

impl admission_core::Clock for CountingClock {
    fn now(&self) -> admission_core::Instant {
        self.0.fetch_add(1, Ordering::SeqCst);
        admission_core::Instant::ZERO
    }
}

impl admission_core::Timer for CountingClock {}

#[test]
fn with_no_sink_no_event_is_built() {
    let clock = Arc::new(CountingClock::default());
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.clone())
        .build();
    let gate = permits("gate", 1);
    for _ in 0..3 {
        drop(monitor.admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("unseen"), None));
    }
    assert_eq!(
        clock.0.load(Ordering::SeqCst),
        0,
        "no sink: no event built, so the clock was never read"
    );
    let recorder = Arc::new(Recorder::new());
    monitor.set_sink(Some(recorder.clone()));
    drop(monitor.admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("seen"), None));
    assert_eq!(
        clock.0.load(Ordering::SeqCst),
        2,
        "with a sink, each of the two events reads the clock once"
    );
    assert_eq!(recorder.events().len(), 2);
}

/// A sink that records kinds and holds the thread emitting a `held` event until let go, as a
/// preempted arriving thread would be held between parking and emitting.
#[derive(Default)]
struct HoldsOnHeld {
    kinds: std::sync::Mutex<Vec<String>>,
    /// (entered, let go)
    gate: std::sync::Mutex<(bool, bool)>,
    cv: std::sync::Condvar,
}

impl EventSink for HoldsOnHeld {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        if matches!(event.kind, EventKind::Held) {
            let mut gate = self.gate.lock().unwrap();
            gate.0 = true;
            self.cv.notify_all();
            while !gate.1 {
                gate = self.cv.wait(gate).unwrap();
            }
        }
        self.kinds
            .lock()
            .unwrap()
            .push(event.kind.as_str().to_owned());
        Ok(())
    }
}

#[test]
fn a_waiters_held_reaches_the_sink_before_its_grant_built_on_another_thread() {
    let sink = Arc::new(HoldsOnHeld::default());
    let monitor = Monitor::builder().sink(sink.clone()).build();
    let gate = permits("gate", 1);
    let holder = monitor
        .admit_blocking(demand(&[(on(&gate), 1)]), &JobContext::new("holder"), None)
        .unwrap();
    // The waiter parks; its thread is then held inside the sink, emitting its `held`.
    let (m, g) = (monitor.clone(), gate.clone());
    let waiter = std::thread::spawn(move || {
        m.admit_blocking(demand(&[(on(&g), 1)]), &JobContext::new("waiter"), None)
    });
    {
        let mut entered = sink.gate.lock().unwrap();
        while !entered.0 {
            entered = sink.cv.wait(entered).unwrap();
        }
    }
    // Another thread releases: its hand-off pass grants the waiter and builds `granted_from_hold`.
    let releaser = std::thread::spawn(move || drop(holder));
    admission_testkit::monitor::wait_for_queue(&monitor, 0);
    sink.gate.lock().unwrap().1 = true;
    sink.cv.notify_all();
    releaser.join().unwrap();
    let grant = waiter.join().unwrap().expect("granted by the release");
    drop(grant);
    // Whichever thread holds the sink's turn (the waiter's, or the evaluator's if its pass
    // drained first) emits what the others queued, after they have returned: wait for all five.
    admission_testkit::monitor::wait_until("the sink has all five events", || {
        sink.kinds.lock().unwrap().len() == 5
    });
    assert_eq!(
        *sink.kinds.lock().unwrap(),
        [
            "granted_immediate",
            "held",
            "released",
            "granted_from_hold",
            "released"
        ],
        "in the order of the critical sections: the waiter parked, the holder released, the \
         release's pass granted the waiter, the waiter released"
    );
}
