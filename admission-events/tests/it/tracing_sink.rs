//! [`TracingSink`]: levels, target and fields, read back from a real `fmt` subscriber.

use std::io;
use std::sync::Arc;

use admission_core::event::{Event, EventEntry, EventKind, EventSink, RejectReason};
use admission_core::{Amount, Category, Instant, JobSnapshot};
use admission_events::TracingSink;
use parking_lot::Mutex;

use crate::{event, from_hold, rejected};

/// A `MakeWriter` target that appends to a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the sink writes for `event` through a plain-text subscriber that shows everything.
fn emitted(event: &Event) -> String {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .without_time()
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        TracingSink::new().emit(event).unwrap();
    });
    let bytes = out.0.lock().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn a_rejection_for_a_closed_monitor_is_a_warning() {
    let line = emitted(&event(rejected(RejectReason::Closed), 3));
    assert!(line.starts_with(" WARN admission: job rejected"), "{line}");
    assert!(line.contains(r#"kind="rejected""#), "{line}");
    assert!(line.contains(r#"reason="closed""#), "{line}");
    assert!(line.contains(r#"detail="no way""#), "{line}");
}

#[test]
fn a_rejection_for_an_aborted_account_is_a_warning() {
    let line = emitted(&event(rejected(RejectReason::Aborted), 3));
    assert!(line.starts_with(" WARN admission:"), "{line}");
    assert!(line.contains(r#"reason="aborted""#), "{line}");
}

#[test]
fn other_rejections_are_info() {
    for reason in [
        RejectReason::Cancelled,
        RejectReason::CircuitBlocked,
        RejectReason::Shutdown,
        RejectReason::TimedOut,
    ] {
        let line = emitted(&event(rejected(reason), 3));
        assert!(line.starts_with(" INFO admission: job rejected"), "{line}");
        assert!(line.contains(&format!(r#"reason="{reason}""#)), "{line}");
    }
}

#[test]
fn grants_holds_and_releases_are_debug() {
    for kind in [
        EventKind::GrantedImmediate,
        EventKind::Held,
        from_hold(10, 0),
        EventKind::Released { rolled_back: false },
    ] {
        let line = emitted(&event(kind.clone(), 3));
        assert!(line.starts_with("DEBUG admission:"), "{line}");
        assert!(
            line.contains(&format!(r#"kind="{}""#, kind.as_str())),
            "{line}"
        );
    }
}

#[test]
fn every_event_names_the_job_its_accounts_and_its_amount() {
    let event = Event {
        kind: EventKind::GrantedImmediate,
        at: Instant::from_nanos(42),
        job: JobSnapshot {
            id: 11,
            name: "summarize chapter 3".into(),
            workflow: Some("nightly".into()),
            tenant: Some("acme".into()),
            level: None,
        },
        entries: vec![
            EventEntry {
                account: "http".into(),
                category: Category::custom("semaphore"),
                amount: Amount::units(2),
            },
            EventEntry {
                account: "gpt".into(),
                category: Category::custom("token_bucket"),
                amount: Amount::pair(1_200, 1),
            },
        ],
    };
    let line = emitted(&event);
    assert_eq!(
        line,
        "DEBUG admission: job granted on arrival kind=\"granted_immediate\" job_id=11 \
         job_name=\"summarize chapter 3\" workflow=\"nightly\" tenant=\"acme\" \
         accounts=\"http,gpt\" amount=1202 at_ns=42\n"
    );
}

#[test]
fn a_grant_after_waiting_reports_the_wait_and_the_waiters_left() {
    let line = emitted(&event(from_hold(250, 4), 5));
    assert!(line.contains("wait_ms=250.0"), "{line}");
    assert!(line.contains("waiters=4"), "{line}");
    assert!(line.contains(r#"job_name="job""#), "{line}");
}

#[test]
fn a_release_says_whether_it_rolled_back() {
    let line = emitted(&event(EventKind::Released { rolled_back: true }, 5));
    assert!(line.contains("rolled_back=true"), "{line}");
}
