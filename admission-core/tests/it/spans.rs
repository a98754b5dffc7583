//! One `tracing` span per admission: target `admission`, name `admit`, with the job, the
//! accounts asked of, how long it waited (on the monitor's clock, exact here on a fake one) and
//! how it ended, seen by a real subscriber (a `tracing-subscriber` registry with a layer that
//! keeps what each span recorded).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{AdmitError, Monitor};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::{demand, on, permits};

fn job(name: &str) -> admission_core::JobContext {
    admission_core::JobContext::new(name)
}

/// Every `admit` span's fields, by span id, as recorded.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<BTreeMap<u64, BTreeMap<String, String>>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().target() != "admission" || attrs.metadata().name() != "admit" {
            return;
        }
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0.lock().insert(id.into_u64(), fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(fields) = self.0.lock().get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
}

impl Spans {
    /// The spans' fields in the order they began, without the ids.
    fn all(&self) -> Vec<BTreeMap<String, String>> {
        self.0.lock().values().cloned().collect()
    }
}

fn field<'a>(span: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    span.get(name).map_or("<none>", String::as_str)
}

#[test]
fn every_admission_has_a_span_with_its_job_accounts_wait_and_outcome() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    tracing::subscriber::with_default(subscriber, || {
        // Another test's thread may have registered the `admit` callsite while no subscriber
        // wanted it, racing this one's registration: ask every callsite again now.
        tracing::callsite::rebuild_interest_cache();
        let clock = FakeClock::new();
        let monitor = Monitor::builder()
            .manual_passes()
            .clock(clock.shared())
            .build();
        let http = permits("http", 2);
        let db = permits("db", 1);
        // Granted at once.
        let first = monitor
            .admit_blocking(demand(&[(on(&http), 1), (on(&db), 1)]), &job("first"), None)
            .expect("granted");
        // Parked behind it, granted 250 ms later on the monitor's clock.
        let mut second = Box::pin(monitor.admit(
            demand(&[(on(&http), 1), (on(&db), 1)]),
            &job("second"),
            None,
        ));
        assert!(poll_once(&mut second).is_none());
        clock.advance(Duration::from_millis(250));
        drop(first);
        monitor.pass_now();
        let second = poll_once(&mut second).expect("granted").expect("granted");
        // Refused at once: more than the gate has.
        let refused = monitor.admit_blocking(demand(&[(on(&http), 5)]), &job("too-big"), None);
        assert!(matches!(refused, Err(AdmitError::Refused { .. })));
        // Given up while it waited.
        let mut dropped = Box::pin(monitor.admit(demand(&[(on(&db), 1)]), &job("dropped"), None));
        assert!(poll_once(&mut dropped).is_none());
        drop(dropped);
        drop(second);
    });
    let all = spans.all();
    let by_job = |name: &str| {
        all.iter()
            .find(|s| field(s, "job_name") == name)
            .unwrap_or_else(|| panic!("no span for {name}: {all:?}"))
    };
    assert_eq!(all.len(), 4, "{all:?}");
    let first = by_job("first");
    assert_eq!(field(first, "accounts"), "http,db");
    assert_eq!(field(first, "outcome"), "granted");
    assert_eq!(field(first, "waited_ms"), "0.0");
    let second = by_job("second");
    assert_eq!(field(second, "outcome"), "granted");
    assert_eq!(field(second, "waited_ms"), "250.0");
    let refused = by_job("too-big");
    assert_eq!(field(refused, "accounts"), "http");
    assert_eq!(field(refused, "outcome"), "circuit_blocked");
    let dropped = by_job("dropped");
    assert_eq!(field(dropped, "accounts"), "db");
    assert_eq!(field(dropped, "outcome"), "abandoned");
    // Each span names its job's id.
    assert!(
        all.iter()
            .all(|s| field(s, "job_id").parse::<u64>().is_ok())
    );
}
