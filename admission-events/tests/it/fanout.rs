//! [`Fanout`]: delivery to every member, and dropping the ones that fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use admission_core::event::{Event, EventKind, EventSink, SinkError};
use admission_events::{Fanout, Recorder};

use crate::event;

/// A member that panics on every event, counting its calls.
#[derive(Default)]
struct Panics(AtomicUsize);

impl EventSink for Panics {
    fn emit(&self, _: &Event) -> Result<(), SinkError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("sink bug");
    }
}

/// A member that errs on every event, counting its calls.
#[derive(Default)]
struct Fails(AtomicUsize);

impl EventSink for Fails {
    fn emit(&self, _: &Event) -> Result<(), SinkError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(SinkError("disk full".into()))
    }
}

#[test]
fn every_member_receives_every_event() {
    let a = Arc::new(Recorder::new());
    let b = Arc::new(Recorder::new());
    let fanout = Fanout::new().with(a.clone()).with(b.clone());
    fanout.emit(&event(EventKind::Held, 1)).unwrap();
    fanout.emit(&event(EventKind::GrantedImmediate, 2)).unwrap();

    assert_eq!(a.kinds(), ["held", "granted_immediate"]);
    assert_eq!(b.kinds(), ["held", "granted_immediate"]);
    assert_eq!(fanout.len(), 2);
}

#[test]
fn a_panicking_member_is_dropped_and_the_other_keeps_receiving() {
    let panics = Arc::new(Panics::default());
    let recorder = Arc::new(Recorder::new());
    let fanout = Fanout::new().with(panics.clone()).with(recorder.clone());

    assert!(fanout.emit(&event(EventKind::Held, 1)).is_ok());
    assert!(fanout.emit(&event(EventKind::GrantedImmediate, 1)).is_ok());

    assert_eq!(panics.0.load(Ordering::SeqCst), 1);
    assert_eq!(recorder.kinds(), ["held", "granted_immediate"]);
    assert_eq!(fanout.len(), 1);
}

#[test]
fn an_erring_member_is_dropped_and_never_called_again() {
    let fails = Arc::new(Fails::default());
    let recorder = Arc::new(Recorder::new());
    let fanout: Fanout = [
        fails.clone() as Arc<dyn EventSink>,
        recorder.clone() as Arc<dyn EventSink>,
    ]
    .into_iter()
    .collect();

    fanout.emit(&event(EventKind::Held, 1)).unwrap();
    fanout.emit(&event(EventKind::Held, 2)).unwrap();

    assert_eq!(fails.0.load(Ordering::SeqCst), 1);
    assert_eq!(recorder.len(), 2);
}

#[test]
fn the_fanout_fails_only_once_every_member_is_gone() {
    let fanout = Fanout::new()
        .with(Arc::new(Fails::default()))
        .with(Arc::new(Panics::default()));

    let error = fanout.emit(&event(EventKind::Held, 1)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "event sink failed: every member of the fanout failed: event sink failed: disk full; \
         the sink panicked: sink bug"
    );
    assert!(fanout.is_empty());
}

#[test]
fn an_empty_fanout_fails() {
    let fanout = Fanout::new();
    let error = fanout.emit(&event(EventKind::Held, 1)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "event sink failed: the fanout has no member"
    );
}

#[test]
fn a_member_pushed_later_receives_later_events() {
    let first = Arc::new(Recorder::new());
    let later = Arc::new(Recorder::new());
    let fanout = Fanout::new().with(first.clone());
    fanout.emit(&event(EventKind::Held, 1)).unwrap();
    fanout.push(later.clone());
    fanout.emit(&event(EventKind::GrantedImmediate, 1)).unwrap();

    assert_eq!(first.len(), 2);
    assert_eq!(later.kinds(), ["granted_immediate"]);
}
