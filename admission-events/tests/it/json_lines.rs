//! [`JsonLinesSink`]: exact lines, flush policies, and failing writers.

use std::io::{self, Write};
use std::num::NonZeroUsize;
use std::sync::Arc;

use admission_core::event::{Event, EventEntry, EventKind, EventSink, RejectReason};
use admission_core::{Amount, Category, Instant, JobSnapshot};
use admission_events::{FlushPolicy, JsonLinesSink};
use parking_lot::Mutex;

use crate::{event, from_hold, rejected};

/// A writer whose bytes and flush count stay readable while the sink owns a clone.
#[derive(Clone, Default)]
struct Shared {
    bytes: Arc<Mutex<Vec<u8>>>,
    flushes: Arc<Mutex<usize>>,
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8(self.bytes.lock().clone()).unwrap()
    }
    fn flushes(&self) -> usize {
        *self.flushes.lock()
    }
}

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        *self.flushes.lock() += 1;
        Ok(())
    }
}

/// A writer that fails every write.
struct Broken;

impl Write for Broken {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::other("disk full"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A writer that takes every write and fails every flush.
struct BrokenFlush;

impl Write for BrokenFlush {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Err(io::Error::other("pipe closed"))
    }
}

#[test]
fn a_rejection_is_one_line_with_exactly_its_fields() {
    let sink = JsonLinesSink::new(Vec::new());
    let event = Event {
        kind: EventKind::Rejected {
            reason: RejectReason::CircuitBlocked,
            message: "`search` is blocked".into(),
        },
        at: Instant::from_nanos(1_500),
        job: JobSnapshot {
            id: 7,
            name: "summarize".into(),
            workflow: Some("nightly".into()),
            tenant: None,
            level: None,
        },
        entries: vec![
            EventEntry {
                account: "search".into(),
                category: Category::custom("elastic_window"),
                amount: Amount::ONE,
            },
            EventEntry {
                account: "gpt".into(),
                category: Category::custom("token_bucket"),
                amount: Amount::pair(1_200, 1),
            },
        ],
    };
    sink.emit(&event).unwrap();

    let text = String::from_utf8(sink.into_inner()).unwrap();
    assert_eq!(
        text,
        concat!(
            r#"{"type":"rejected","reason":"circuit_blocked","message":"`search` is blocked","#,
            r#""at":1500,"job":{"id":7,"name":"summarize","workflow":"nightly","tenant":null},"#,
            r#""entries":[{"account":"search","category":"elastic_window","amount":[1,0,0,0]},"#,
            r#"{"account":"gpt","category":"token_bucket","amount":[1200,1,0,0]}]}"#,
            "\n"
        )
    );
}

#[test]
fn a_grant_after_waiting_carries_its_wait_in_milliseconds_and_the_waiters_left() {
    let sink = JsonLinesSink::new(Vec::new());
    sink.emit(&event(from_hold(1_500, 2), 4)).unwrap();

    let text = String::from_utf8(sink.into_inner()).unwrap();
    let value: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(value["type"], "granted_from_hold");
    assert_eq!(value["wait"], 1_500.0);
    assert_eq!(value["waiters"], 2);
    assert_eq!(value["at"], 1_000_000_000u64);
    assert_eq!(value["job"]["id"], 4);
}

#[test]
fn each_event_is_one_parseable_line() {
    let sink = JsonLinesSink::new(Vec::new());
    sink.emit(&event(EventKind::Held, 1)).unwrap();
    sink.emit(&event(rejected(RejectReason::Shutdown), 1))
        .unwrap();
    sink.emit(&event(EventKind::Released { rolled_back: true }, 2))
        .unwrap();

    let text = String::from_utf8(sink.into_inner()).unwrap();
    let types: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].to_string())
        .collect();
    assert_eq!(types, [r#""held""#, r#""rejected""#, r#""released""#]);
    assert!(text.ends_with('\n'));
}

#[test]
fn the_default_policy_flushes_after_every_line() {
    let out = Shared::default();
    let sink = JsonLinesSink::new(out.clone());
    assert_eq!(sink.flush_policy(), FlushPolicy::EveryLine);
    sink.emit(&event(EventKind::Held, 1)).unwrap();
    sink.emit(&event(EventKind::Held, 2)).unwrap();
    assert_eq!(out.flushes(), 2);
    assert_eq!(out.text().lines().count(), 2);
}

#[test]
fn every_lines_flushes_once_per_batch_and_on_request() {
    let out = Shared::default();
    let sink = JsonLinesSink::new(out.clone())
        .with_flush(FlushPolicy::EveryLines(NonZeroUsize::new(3).unwrap()));
    for id in 0..7 {
        sink.emit(&event(EventKind::Held, id)).unwrap();
    }
    assert_eq!(out.flushes(), 2);
    sink.flush().unwrap();
    assert_eq!(out.flushes(), 3);
    assert_eq!(out.text().lines().count(), 7);
}

#[test]
fn manual_flushes_only_on_request() {
    let out = Shared::default();
    let sink = JsonLinesSink::new(out.clone()).with_flush(FlushPolicy::Manual);
    for id in 0..5 {
        sink.emit(&event(EventKind::Held, id)).unwrap();
    }
    assert_eq!(out.flushes(), 0);
    sink.flush().unwrap();
    assert_eq!(out.flushes(), 1);
}

#[test]
fn a_failing_writer_yields_an_error_and_so_does_every_later_event() {
    let sink = JsonLinesSink::new(Broken);
    let first = sink.emit(&event(EventKind::Held, 1)).unwrap_err();
    assert_eq!(
        first.to_string(),
        "event sink failed: writing a `held` event as a JSON line failed: disk full"
    );
    let later = sink
        .emit(&event(EventKind::GrantedImmediate, 2))
        .unwrap_err();
    assert_eq!(
        later.to_string(),
        "event sink failed: writing a `granted_immediate` event as a JSON line failed: \
         an earlier write failed"
    );
}

#[test]
fn a_failing_flush_yields_an_error() {
    let sink = JsonLinesSink::new(BrokenFlush);
    let error = sink.emit(&event(EventKind::Held, 1)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "event sink failed: writing a `held` event as a JSON line failed: pipe closed"
    );
    assert_eq!(sink.flush().unwrap_err().to_string(), "pipe closed");
}

#[test]
fn create_writes_the_lines_to_a_file() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("admission-events-create_writes_the_lines_to_a_file.jsonl");
    let sink = JsonLinesSink::create(&path).unwrap();
    sink.emit(&event(EventKind::GrantedImmediate, 1)).unwrap();
    sink.emit(&event(EventKind::Released { rolled_back: false }, 1))
        .unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    let kinds: Vec<_> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].clone())
        .collect();
    assert_eq!(kinds, ["granted_immediate", "released"]);
    drop(sink);
    std::fs::remove_file(&path).unwrap();
}
