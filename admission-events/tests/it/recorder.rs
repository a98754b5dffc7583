//! [`Recorder`]: order, filters, bounds and sharing across threads.

use std::sync::Arc;
use std::thread;

use admission_core::event::{EventKind, EventSink, RejectReason};
use admission_events::Recorder;

use crate::{event, from_hold, rejected};

#[test]
fn records_every_event_in_arrival_order() {
    let recorder = Recorder::new();
    assert!(recorder.is_empty());
    recorder.emit(&event(EventKind::Held, 1)).unwrap();
    recorder.emit(&event(from_hold(20, 0), 1)).unwrap();
    recorder
        .emit(&event(EventKind::Released { rolled_back: false }, 1))
        .unwrap();
    recorder
        .emit(&event(EventKind::GrantedImmediate, 2))
        .unwrap();

    assert_eq!(
        recorder.kinds(),
        ["held", "granted_from_hold", "released", "granted_immediate"]
    );
    assert_eq!(recorder.len(), 4);
    assert!(!recorder.is_empty());
    assert_eq!(recorder.events()[1], event(from_hold(20, 0), 1));
}

#[test]
fn count_matches_wire_names_only() {
    let recorder = Recorder::new();
    recorder.emit(&event(EventKind::Held, 1)).unwrap();
    recorder.emit(&event(EventKind::Held, 2)).unwrap();
    recorder
        .emit(&event(rejected(RejectReason::TimedOut), 2))
        .unwrap();

    assert_eq!(recorder.count("held"), 2);
    assert_eq!(recorder.count("rejected"), 1);
    assert_eq!(recorder.count("released"), 0);
    assert_eq!(recorder.count("Held"), 0);
}

#[test]
fn for_job_keeps_only_that_jobs_events_in_order() {
    let recorder = Recorder::new();
    recorder.emit(&event(EventKind::Held, 1)).unwrap();
    recorder
        .emit(&event(EventKind::GrantedImmediate, 2))
        .unwrap();
    recorder.emit(&event(from_hold(5, 1), 1)).unwrap();

    assert_eq!(
        recorder.for_job(1),
        [event(EventKind::Held, 1), event(from_hold(5, 1), 1)]
    );
    assert_eq!(recorder.for_job(2), [event(EventKind::GrantedImmediate, 2)]);
    assert_eq!(recorder.for_job(3), []);
}

#[test]
fn clear_forgets_everything_kept() {
    let recorder = Recorder::new();
    recorder.emit(&event(EventKind::Held, 1)).unwrap();
    recorder.clear();
    assert!(recorder.is_empty());
    assert_eq!(recorder.kinds(), Vec::<&str>::new());
    recorder
        .emit(&event(EventKind::GrantedImmediate, 1))
        .unwrap();
    assert_eq!(recorder.kinds(), ["granted_immediate"]);
}

#[test]
fn a_bounded_recorder_keeps_only_the_most_recent_events() {
    let recorder = Recorder::with_capacity(3);
    for id in 1..=5 {
        recorder
            .emit(&event(EventKind::GrantedImmediate, id))
            .unwrap();
    }
    let ids: Vec<u64> = recorder.events().iter().map(|e| e.job.id).collect();
    assert_eq!(ids, [3, 4, 5]);
    assert_eq!(recorder.len(), 3);
    assert_eq!(recorder.capacity(), Some(3));
    assert_eq!(Recorder::new().capacity(), None);
}

#[test]
fn a_recorder_of_capacity_zero_keeps_nothing_and_never_fails() {
    let recorder = Recorder::with_capacity(0);
    assert!(recorder.emit(&event(EventKind::Held, 1)).is_ok());
    assert!(recorder.is_empty());
}

#[test]
fn a_shared_recorder_is_a_dyn_sink_and_sees_what_it_is_sent() {
    let recorder = Arc::new(Recorder::new());
    let sink: Arc<dyn EventSink> = recorder.clone();
    sink.emit(&event(EventKind::Held, 9)).unwrap();
    assert_eq!(recorder.kinds(), ["held"]);
}

#[test]
fn concurrent_emitters_lose_no_event() {
    let recorder = Arc::new(Recorder::new());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let recorder = recorder.clone();
            thread::spawn(move || {
                for i in 0..250 {
                    recorder
                        .emit(&event(EventKind::Held, t * 1_000 + i))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(recorder.len(), 2_000);
    assert_eq!(recorder.for_job(7_249).len(), 1);
}
