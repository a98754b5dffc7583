//! The metrics sink (feature `metrics`), read through a `DebuggingRecorder` current on the test's
//! thread only: the events are emitted on this thread (built by hand, or by a monitor whose
//! passes run only when the test says).

use std::sync::Arc;
use std::time::Duration;

use admission_core::event::{EventKind, EventSink, RejectReason};
use admission_core::{Amount, Demand, Instant, JobContext, Level, Levels, Monitor};
use admission_events::MetricsSink;
use admission_events::metrics::{
    ADMITTED, GRANTED_UNITS, HELD, LEVEL, OTEL_ACTIVE_LEASES, OTEL_LEASE_DURATION, OTEL_QUEUED,
    OTEL_REQUESTS, OTEL_TIME_IN_QUEUE, REJECTED, RELEASED, RESULT, SIMULATED_WAIT, TENANT, WAIT,
    WAITERS,
};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use admission_testkit::reference::Permits;
use metrics::Unit;
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::{entry, event, from_hold, rejected};

/// One series: name, labels sorted, unit, value.
type Series = (String, Vec<(String, String)>, Option<Unit>, Value);

/// A snapshot value with plain floats, comparable with `==`.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

/// Runs `f` with a fresh recorder current on this thread only.
fn recorded<T>(f: impl FnOnce(&Snapshotter) -> T) -> T {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || f(&snapshotter))
}

/// The snapshot's Prometheus-named series (counters reset and histograms drained by it), sorted
/// by name and labels, without the counters that did not move since the last one (the sink
/// writes every counter of a fixed label set at zero when it is built:
/// `every_series_is_written_at_zero_first`). The OpenTelemetry-named series are read apart
/// ([`otel_series`]).
fn series(snapshotter: &Snapshotter) -> Vec<Series> {
    all_series(snapshotter)
        .into_iter()
        .filter(|(name, _, _, value)| *value != Value::Counter(0) && !is_otel(name))
        .collect()
}

/// The series under OpenTelemetry's convention (`admission.rate_limiting.*`), as [`series`]
/// reads the others.
fn otel_series(snapshot: Vec<Series>) -> Vec<Series> {
    snapshot
        .into_iter()
        .filter(|(name, _, _, value)| *value != Value::Counter(0) && is_otel(name))
        .collect()
}

fn is_otel(name: &str) -> bool {
    name.starts_with("admission.rate_limiting.")
}

/// The whole snapshot, sorted by name and labels.
fn all_series(snapshotter: &Snapshotter) -> Vec<Series> {
    let mut all: Vec<Series> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, _, value): (CompositeKey, _, _, _)| {
            let (_, key) = key.into_parts();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let value = match value {
                DebugValue::Counter(n) => Value::Counter(n),
                DebugValue::Gauge(v) => Value::Gauge(v.into_inner()),
                DebugValue::Histogram(v) => {
                    Value::Histogram(v.into_iter().map(|f| f.into_inner()).collect())
                }
            };
            (key.name().to_owned(), labels, unit, value)
        })
        .collect();
    all.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    all
}

fn s(name: &str, label: Option<(&str, &str)>, unit: Unit, value: Value) -> Series {
    let labels = label
        .map(|(k, v)| vec![(k.to_owned(), v.to_owned())])
        .unwrap_or_default();
    (name.to_owned(), labels, Some(unit), value)
}

fn at(millis: u64) -> Instant {
    Instant::from_nanos(millis * 1_000_000)
}

/// Before any event, every counter of a fixed label set and the waiters gauge are written at
/// zero (so a first scrape holds them and a rate starts from zero); `held_total` (labelled by
/// account) and the wait histograms appear with their first sample.
#[test]
fn every_series_is_written_at_zero_first() {
    recorded(|snapshotter| {
        let _sink = MetricsSink::new();
        let zero =
            |name: &str, label: (&str, &str)| s(name, Some(label), Unit::Count, Value::Counter(0));
        let all = all_series(snapshotter);
        let (otel, prometheus): (Vec<Series>, Vec<Series>) =
            all.into_iter().partition(|(name, ..)| is_otel(name));
        assert_eq!(
            otel,
            [
                s(OTEL_ACTIVE_LEASES, None, Unit::Count, Value::Gauge(0.0)),
                s(OTEL_QUEUED, None, Unit::Count, Value::Gauge(0.0)),
                zero(OTEL_REQUESTS, (RESULT, "aborted")),
                zero(OTEL_REQUESTS, (RESULT, "acquired")),
                zero(OTEL_REQUESTS, (RESULT, "cancelled")),
                zero(OTEL_REQUESTS, (RESULT, "circuit_blocked")),
                zero(OTEL_REQUESTS, (RESULT, "closed")),
                zero(OTEL_REQUESTS, (RESULT, "shutdown")),
                zero(OTEL_REQUESTS, (RESULT, "timed_out")),
            ]
        );
        assert!(
            otel.iter().all(|(name, ..)| !name.ends_with("_total")),
            "OpenTelemetry's conventions: no _total"
        );
        assert_eq!(
            prometheus,
            [
                zero(ADMITTED, ("path", "after_wait")),
                zero(ADMITTED, ("path", "immediate")),
                zero(REJECTED, ("reason", "aborted")),
                zero(REJECTED, ("reason", "cancelled")),
                zero(REJECTED, ("reason", "circuit_blocked")),
                zero(REJECTED, ("reason", "closed")),
                zero(REJECTED, ("reason", "shutdown")),
                zero(REJECTED, ("reason", "timed_out")),
                zero(RELEASED, ("kind", "release")),
                zero(RELEASED, ("kind", "rollback")),
                s(WAITERS, None, Unit::Count, Value::Gauge(0.0)),
            ]
        );
        assert!(
            [ADMITTED, REJECTED, RELEASED, HELD]
                .iter()
                .all(|name| name.ends_with("_total"))
                && WAIT.ends_with("_seconds"),
            "Prometheus's conventions"
        );
    });
}

/// A sink for a clock 300 times faster than real time records a 30 s wait of the clock as
/// 0.1 s of real time, and the 30 s in the simulated series.
#[test]
fn a_simulated_clocks_waits_are_real_seconds_and_have_their_own_series() {
    recorded(|snapshotter| {
        let sink = MetricsSink::simulated(300.0);
        let mut held = event(EventKind::Held, 1);
        held.at = at(1_000);
        held.entries = vec![entry("model", Amount::ONE)];
        sink.emit(&held).unwrap();
        let mut granted = event(from_hold(30_000, 1), 1);
        granted.at = at(31_000);
        granted.entries = vec![entry("model", Amount::ONE)];
        sink.emit(&granted).unwrap();
        let waits: Vec<Series> = series(snapshotter)
            .into_iter()
            .filter(|(name, ..)| name == WAIT || name == SIMULATED_WAIT)
            .collect();
        assert_eq!(
            waits,
            [
                s(
                    SIMULATED_WAIT,
                    Some(("outcome", "granted")),
                    Unit::Seconds,
                    Value::Histogram(vec![30.0])
                ),
                s(
                    WAIT,
                    Some(("outcome", "granted")),
                    Unit::Seconds,
                    Value::Histogram(vec![0.1])
                ),
            ]
        );
    });
}

#[test]
fn every_event_kind_moves_its_series_by_exact_amounts() {
    recorded(|snapshotter| {
        let sink = MetricsSink::new();
        let emit = |kind: EventKind, id: u64, at_ms: u64, account: &str| {
            let mut e = event(kind, id);
            e.at = at(at_ms);
            e.entries = vec![entry(account, Amount::ONE)];
            sink.emit(&e).unwrap();
        };
        // Job 1 is held on two accounts, then granted after 2 s; job 3 is held and times out
        // 3 s later; job 2 goes at once; job 4 is refused without waiting.
        emit(EventKind::Held, 1, 1_000, "http");
        emit(EventKind::Held, 1, 1_500, "model");
        emit(EventKind::Held, 3, 1_000, "http");
        assert_eq!(
            series(snapshotter),
            [
                s(
                    HELD,
                    Some(("account", "http")),
                    Unit::Count,
                    Value::Counter(2)
                ),
                s(
                    HELD,
                    Some(("account", "model")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(WAITERS, None, Unit::Count, Value::Gauge(2.0)),
            ]
        );
        emit(EventKind::GrantedImmediate, 2, 1_000, "http");
        emit(from_hold(2_000, 1), 1, 3_000, "http");
        emit(rejected(RejectReason::TimedOut), 3, 4_000, "http");
        emit(rejected(RejectReason::CircuitBlocked), 4, 4_000, "window");
        emit(EventKind::Released { rolled_back: false }, 2, 5_000, "http");
        emit(EventKind::Released { rolled_back: true }, 1, 5_000, "http");
        assert_eq!(
            series(snapshotter),
            [
                s(
                    ADMITTED,
                    Some(("path", "after_wait")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    ADMITTED,
                    Some(("path", "immediate")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    REJECTED,
                    Some(("reason", "circuit_blocked")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    REJECTED,
                    Some(("reason", "timed_out")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    RELEASED,
                    Some(("kind", "release")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    RELEASED,
                    Some(("kind", "rollback")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    WAIT,
                    Some(("outcome", "circuit_blocked")),
                    Unit::Seconds,
                    Value::Histogram(vec![0.0])
                ),
                s(
                    WAIT,
                    Some(("outcome", "granted")),
                    Unit::Seconds,
                    Value::Histogram(vec![0.0, 2.0])
                ),
                s(
                    WAIT,
                    Some(("outcome", "timed_out")),
                    Unit::Seconds,
                    Value::Histogram(vec![3.0])
                ),
                s(WAITERS, None, Unit::Count, Value::Gauge(0.0)),
            ]
        );
    });
}

/// A sink not told its tenants labels no tenant (and no sink labels a job's name or workflow).
#[test]
fn labels_never_carry_a_job_workflow_or_tenant() {
    recorded(|snapshotter| {
        let sink = MetricsSink::new();
        for kind in [
            EventKind::Held,
            EventKind::GrantedImmediate,
            from_hold(10, 0),
            rejected(RejectReason::Cancelled),
            EventKind::Released { rolled_back: false },
        ] {
            let mut e = event(kind, 4_242);
            e.job.name = "job-secret".into();
            e.job.workflow = Some("workflow-secret".into());
            e.job.tenant = Some("tenant-secret".into());
            sink.emit(&e).unwrap();
        }
        // One snapshot (it resets the counters), read whole: both conventions' labels.
        let mut keys: Vec<(String, String)> = all_series(snapshotter)
            .into_iter()
            .filter(|(_, _, _, value)| *value != Value::Counter(0))
            .flat_map(|(_, labels, _, _)| labels)
            .collect();
        keys.sort();
        keys.dedup();
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            keys,
            [
                pair("account", "http"),
                pair(RESULT, "acquired"),
                pair(RESULT, "cancelled"),
                pair("kind", "release"),
                pair("outcome", "cancelled"),
                pair("outcome", "granted"),
                pair("path", "after_wait"),
                pair("path", "immediate"),
                pair("reason", "cancelled"),
            ]
        );
    });
}

#[test]
fn a_monitors_passage_is_recorded_with_the_wait_on_its_clock() {
    recorded(|snapshotter| {
        let clock = FakeClock::new();
        let sink: Arc<dyn EventSink> = Arc::new(MetricsSink::new());
        let monitor = Monitor::builder()
            .clock(clock.shared())
            .sink(sink)
            .manual_passes()
            .build();
        let permits = Arc::new(Permits::new("permits", 1));
        let one = || Demand::new().with(permits.clone(), Amount::ONE);

        let first = monitor.admit_blocking(one(), &JobContext::new("first"), None);
        let mut second = Box::pin(monitor.admit(one(), &JobContext::new("second"), None));
        assert!(poll_once(&mut second).is_none());
        assert_eq!(monitor.queue_size(), 1);
        clock.advance(Duration::from_millis(1_250));
        drop(first); // the release hands the permit to `second` on this thread
        let second = poll_once(&mut second).expect("granted by the hand-off");
        drop(second);
        monitor.stop();

        assert_eq!(
            series(snapshotter),
            [
                s(
                    ADMITTED,
                    Some(("path", "after_wait")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    ADMITTED,
                    Some(("path", "immediate")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    HELD,
                    Some(("account", "permits")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    RELEASED,
                    Some(("kind", "release")),
                    Unit::Count,
                    Value::Counter(2)
                ),
                s(
                    WAIT,
                    Some(("outcome", "granted")),
                    Unit::Seconds,
                    Value::Histogram(vec![0.0, 1.25])
                ),
                s(WAITERS, None, Unit::Count, Value::Gauge(0.0)),
            ]
        );
    });
}

/// The same passage under OpenTelemetry's convention for a queued limiter (ASP.NET Core's
/// `rate_limiting` metrics): every decision counted by result, the time in the line of the job
/// that waited (1.25 s), the line and the leases held now, and each lease's duration from its
/// grant to its release (the first held 1.25 s, the second 0.5 s).
#[test]
fn a_monitors_passage_is_recorded_under_opentelemetrys_convention_too() {
    recorded(|snapshotter| {
        let clock = FakeClock::new();
        let sink: Arc<dyn EventSink> = Arc::new(MetricsSink::new());
        let monitor = Monitor::builder()
            .clock(clock.shared())
            .sink(sink)
            .manual_passes()
            .build();
        let permits = Arc::new(Permits::new("permits", 1));
        let one = || Demand::new().with(permits.clone(), Amount::ONE);

        let first = monitor.admit_blocking(one(), &JobContext::new("first"), None);
        let mut second = Box::pin(monitor.admit(one(), &JobContext::new("second"), None));
        assert!(poll_once(&mut second).is_none());
        let mut third = Box::pin(monitor.admit(
            one(),
            &JobContext::new("third"),
            Some(Duration::from_millis(500)),
        ));
        assert!(poll_once(&mut third).is_none());
        // Two waiting, one lease held (this snapshot resets the counters: the first grant's
        // count is read here).
        let now = otel_series(all_series(snapshotter));
        assert!(now.contains(&s(OTEL_QUEUED, None, Unit::Count, Value::Gauge(2.0))));
        assert!(now.contains(&s(OTEL_ACTIVE_LEASES, None, Unit::Count, Value::Gauge(1.0))));
        assert!(now.contains(&s(
            OTEL_REQUESTS,
            Some((RESULT, "acquired")),
            Unit::Count,
            Value::Counter(1)
        )));
        clock.advance(Duration::from_millis(1_250));
        // The third's deadline passed: refused as timed out after 1.25 s in the line.
        monitor.pass_now();
        assert!(poll_once(&mut third).expect("refused").is_err());
        drop(first); // the release hands the permit to `second`
        let second = poll_once(&mut second).expect("granted by the hand-off");
        clock.advance(Duration::from_millis(500));
        drop(second);
        monitor.stop();

        assert_eq!(
            otel_series(all_series(snapshotter)),
            [
                s(OTEL_ACTIVE_LEASES, None, Unit::Count, Value::Gauge(0.0)),
                s(OTEL_QUEUED, None, Unit::Count, Value::Gauge(0.0)),
                s(
                    OTEL_TIME_IN_QUEUE,
                    Some((RESULT, "acquired")),
                    Unit::Seconds,
                    Value::Histogram(vec![1.25])
                ),
                s(
                    OTEL_TIME_IN_QUEUE,
                    Some((RESULT, "timed_out")),
                    Unit::Seconds,
                    Value::Histogram(vec![1.25])
                ),
                s(
                    OTEL_LEASE_DURATION,
                    None,
                    Unit::Seconds,
                    Value::Histogram(vec![1.25, 0.5])
                ),
                s(
                    OTEL_REQUESTS,
                    Some((RESULT, "acquired")),
                    Unit::Count,
                    Value::Counter(1)
                ),
                s(
                    OTEL_REQUESTS,
                    Some((RESULT, "timed_out")),
                    Unit::Count,
                    Value::Counter(1)
                ),
            ]
        );
    });
}

/// A sink told its tenants labels the admission series with the named tenant or `other` (any
/// other tenant, or none), counts each tenant's units granted on each account, and writes every
/// tenant's counters at zero first; a job's name and workflow are still never labels.
#[test]
fn a_sink_told_its_tenants_labels_them_and_counts_their_units() {
    recorded(|snapshotter| {
        let sink = MetricsSink::with_tenants(["acme"], 1.0);
        let zeroes: Vec<Series> = all_series(snapshotter)
            .into_iter()
            .filter(|(name, labels, ..)| {
                name == ADMITTED && labels.iter().any(|(k, _)| k == TENANT)
            })
            .collect();
        let zero = |path: &str, tenant: &str| {
            (
                ADMITTED.to_owned(),
                vec![
                    ("path".to_owned(), path.to_owned()),
                    (TENANT.to_owned(), tenant.to_owned()),
                ],
                Some(Unit::Count),
                Value::Counter(0),
            )
        };
        assert_eq!(
            zeroes,
            [
                zero("after_wait", "acme"),
                zero("after_wait", "other"),
                zero("immediate", "acme"),
                zero("immediate", "other"),
            ]
        );
        let of = |kind: EventKind, tenant: Option<&str>, tokens: u64| {
            let mut e = event(kind, 7);
            e.job.tenant = tenant.map(Into::into);
            e.job.workflow = Some("workflow-secret".into());
            e.entries = vec![entry("model", Amount::pair(tokens, 1))];
            e
        };
        sink.emit(&of(EventKind::GrantedImmediate, Some("acme"), 300))
            .unwrap();
        sink.emit(&of(from_hold(0, 0), Some("acme"), 200)).unwrap();
        sink.emit(&of(EventKind::GrantedImmediate, Some("initech"), 40))
            .unwrap();
        sink.emit(&of(EventKind::GrantedImmediate, None, 2))
            .unwrap();
        sink.emit(&of(rejected(RejectReason::TimedOut), Some("initech"), 9))
            .unwrap();
        let labelled = |name: &str, labels: &[(&str, &str)], value: Value| {
            let labels = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            (name.to_owned(), labels, Some(Unit::Count), value)
        };
        let counters: Vec<Series> = series(snapshotter)
            .into_iter()
            .filter(|(name, ..)| [ADMITTED, REJECTED, GRANTED_UNITS].contains(&name.as_str()))
            .collect();
        assert_eq!(
            counters,
            [
                labelled(
                    ADMITTED,
                    &[("path", "after_wait"), (TENANT, "acme")],
                    Value::Counter(1)
                ),
                labelled(
                    ADMITTED,
                    &[("path", "immediate"), (TENANT, "acme")],
                    Value::Counter(1)
                ),
                labelled(
                    ADMITTED,
                    &[("path", "immediate"), (TENANT, "other")],
                    Value::Counter(2)
                ),
                labelled(
                    GRANTED_UNITS,
                    &[("account", "model"), (TENANT, "acme")],
                    Value::Counter(500)
                ),
                labelled(
                    GRANTED_UNITS,
                    &[("account", "model"), (TENANT, "other")],
                    Value::Counter(42)
                ),
                labelled(
                    REJECTED,
                    &[("reason", "timed_out"), (TENANT, "other")],
                    Value::Counter(1)
                ),
            ]
        );
    });
}

/// A sink told the monitor's levels labels the admission series with the job's level: a job
/// naming none with the default level's name, one naming a level the monitor lacks with
/// `other`; every level's counters are written at zero first, beside each tenant's.
#[test]
fn a_sink_told_the_levels_labels_each_job_with_its_level() {
    recorded(|snapshotter| {
        let levels = Levels::new()
            .level(Level::new("interactive"))
            .and_then(|l| l.level(Level::new("batch")))
            .unwrap();
        let sink = MetricsSink::with_tenants(["acme"], 1.0).with_levels(&levels);
        let zeroes = all_series(snapshotter)
            .into_iter()
            .filter(|(name, labels, ..)| {
                name == ADMITTED
                    && labels.iter().any(|(k, v)| k == "path" && v == "immediate")
                    && labels.iter().any(|(k, _)| k == LEVEL)
            })
            .count();
        assert_eq!(zeroes, 2 * 3, "two tenant labels times three level labels");
        let of = |level: Option<&str>, tokens: u64| {
            let mut e = event(EventKind::GrantedImmediate, 7);
            e.job.tenant = Some("acme".into());
            e.job.level = level.map(Into::into);
            e.entries = vec![entry("model", Amount::pair(tokens, 1))];
            e
        };
        sink.emit(&of(Some("interactive"), 300)).unwrap();
        sink.emit(&of(None, 20)).unwrap();
        sink.emit(&of(Some("batch"), 1)).unwrap();
        sink.emit(&of(Some("nightly"), 4)).unwrap();
        let units = |level: &str| {
            (
                GRANTED_UNITS.to_owned(),
                vec![
                    ("account".to_owned(), "model".to_owned()),
                    (LEVEL.to_owned(), level.to_owned()),
                    (TENANT.to_owned(), "acme".to_owned()),
                ],
                Some(Unit::Count),
            )
        };
        let granted: Vec<Series> = series(snapshotter)
            .into_iter()
            .filter(|(name, ..)| name == GRANTED_UNITS)
            .collect();
        let expect = |level: &str, n: u64| {
            let (name, labels, unit) = units(level);
            (name, labels, unit, Value::Counter(n))
        };
        assert_eq!(
            granted,
            [
                expect("batch", 21),
                expect("interactive", 300),
                expect("other", 4)
            ]
        );
    });
}
