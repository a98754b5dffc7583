//! [`MetricsSink`]: admission events as series of the `metrics` facade (feature `metrics`), for
//! whatever exporter the process installs (Prometheus, StatsD, OpenTelemetry).
//!
//! | name | kind | unit | labels |
//! |---|---|---|---|
//! | `admission.admitted` | counter | jobs | `path` = `immediate` \| `after_wait` |
//! | `admission.rejected` | counter | jobs | `reason` = a [`RejectReason`]'s wire name |
//! | `admission.released` | counter | grants | `kind` = `release` \| `rollback` |
//! | `admission.wait` | histogram | seconds | `outcome` = `granted` or the rejection's reason |
//! | `admission.waiters` | gauge | jobs | |
//! | `admission.held` | counter | holds | `account` = the account (or gate) a waiter was held on |
//!
//! Labels are bounded: account names and fixed enums only, never a job's id or name, its
//! workflow or its tenant (those belong in logs and events, where cardinality costs nothing).
//! `admission.wait` has one sample per outcome: zero for a grant on arrival or a refusal that
//! did not wait, the grant's own wait after a hold, and, for a refusal after a hold, the time
//! from the job's first hold to the refusal, read on the monitor's clock (the events' instants).
//! `admission.waiters` counts the jobs held and not yet granted or refused, as the events tell
//! it, set on every hold, grant after a hold and refusal.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use ::metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use admission_core::Instant;
use admission_core::event::{Event, EventKind, EventSink, RejectReason, SinkError};
use parking_lot::Mutex;

/// `admission.admitted`: jobs granted, label `path` = `immediate` | `after_wait`.
pub const ADMITTED: &str = "admission.admitted";
/// `admission.rejected`: jobs refused, label `reason`.
pub const REJECTED: &str = "admission.rejected";
/// `admission.released`: grants given back, label `kind` = `release` | `rollback`.
pub const RELEASED: &str = "admission.released";
/// `admission.wait`, seconds: how long a job waited, label `outcome`.
pub const WAIT: &str = "admission.wait";
/// `admission.waiters`: jobs held now.
pub const WAITERS: &str = "admission.waiters";
/// `admission.held`: how often a waiter was held on an account, label `account`.
pub const HELD: &str = "admission.held";

/// Records each admission event in the `metrics` facade's current recorder (see the module's
/// table for the series).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_core::Monitor;
/// use admission_events::MetricsSink;
///
/// // Install the exporter's recorder first (`metrics::set_global_recorder`), then:
/// let monitor = Monitor::builder().sink(Arc::new(MetricsSink::new())).build();
/// # drop(monitor);
/// ```
pub struct MetricsSink {
    /// The instant each job now waiting was first held, by job id; a job leaves it when granted
    /// or refused. Never exported: ids are not labels.
    waiting: Mutex<HashMap<u64, Instant>>,
}

impl MetricsSink {
    /// A sink recording into the current recorder; it [`describe`](MetricsSink::describe)s its
    /// series there first, so create it after installing the recorder.
    pub fn new() -> MetricsSink {
        MetricsSink::describe();
        MetricsSink {
            waiting: Mutex::new(HashMap::new()),
        }
    }

    /// Describes every series (unit and help text) to the current recorder.
    pub fn describe() {
        describe_counter!(
            ADMITTED,
            Unit::Count,
            "jobs granted their whole demand, by path"
        );
        describe_counter!(REJECTED, Unit::Count, "jobs refused, by reason");
        describe_counter!(RELEASED, Unit::Count, "grants given back, by kind");
        describe_histogram!(WAIT, Unit::Seconds, "how long a job waited, by outcome");
        describe_gauge!(WAITERS, Unit::Count, "jobs waiting in the line now");
        describe_counter!(
            HELD,
            Unit::Count,
            "waiters held, by the account that held them"
        );
    }

    /// A job first held at `at` is waiting; later holds of the same wait change nothing.
    fn held(&self, job: u64, at: Instant) {
        let mut waiting = self.waiting.lock();
        waiting.entry(job).or_insert(at);
        gauge!(WAITERS).set(waiting.len() as f64);
    }

    /// The job is no longer waiting; when it was first held, if it was.
    fn left(&self, job: u64) -> Option<Instant> {
        let mut waiting = self.waiting.lock();
        let since = waiting.remove(&job);
        gauge!(WAITERS).set(waiting.len() as f64);
        since
    }

    fn wait(outcome: &'static str, wait: Duration) {
        histogram!(WAIT, "outcome" => outcome).record(wait.as_secs_f64());
    }
}

impl Default for MetricsSink {
    fn default() -> MetricsSink {
        MetricsSink::new()
    }
}

impl EventSink for MetricsSink {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        match &event.kind {
            EventKind::GrantedImmediate => {
                counter!(ADMITTED, "path" => "immediate").increment(1);
                MetricsSink::wait("granted", Duration::ZERO);
            }
            EventKind::Held => {
                for entry in &event.entries {
                    counter!(HELD, "account" => entry.account.clone()).increment(1);
                }
                self.held(event.job.id, event.at);
            }
            EventKind::GrantedFromHold { wait, .. } => {
                counter!(ADMITTED, "path" => "after_wait").increment(1);
                self.left(event.job.id);
                MetricsSink::wait("granted", *wait);
            }
            EventKind::Rejected { reason, .. } => {
                let reason: &'static str = RejectReason::as_str(reason);
                counter!(REJECTED, "reason" => reason).increment(1);
                let waited = self.left(event.job.id).map_or(Duration::ZERO, |since| {
                    event.at.saturating_duration_since(since)
                });
                MetricsSink::wait(reason, waited);
            }
            EventKind::Released { rolled_back } => {
                let kind = if *rolled_back { "rollback" } else { "release" };
                counter!(RELEASED, "kind" => kind).increment(1);
            }
            // A kind added to the vocabulary later is not counted until it has a series.
            _ => {}
        }
        Ok(())
    }
}

impl fmt::Debug for MetricsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsSink")
            .field("waiting", &self.waiting.lock().len())
            .finish()
    }
}
