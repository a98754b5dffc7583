//! [`MetricsSink`]: admission events as series of the `metrics` facade (feature `metrics`), for
//! whatever exporter the process installs (Prometheus, StatsD, OpenTelemetry).
//!
//! | name | kind | unit | labels |
//! |---|---|---|---|
//! | `admission.admitted_total` | counter | jobs | `path` = `immediate` \| `after_wait` |
//! | `admission.rejected_total` | counter | jobs | `reason` = a [`RejectReason`]'s wire name |
//! | `admission.released_total` | counter | grants | `kind` = `release` \| `rollback` |
//! | `admission.wait_seconds` | histogram | real seconds | `outcome` = `granted` or the rejection's reason |
//! | `admission.waiters` | gauge | jobs | |
//! | `admission.held_total` | counter | holds | `account` = the account (or gate) a waiter was held on |
//! | `admission.simulated_wait_seconds` | histogram | the monitor clock's seconds | as `admission.wait_seconds`; only from a sink whose clock is not real time ([`MetricsSink::simulated`]) |
//! | `admission.granted_units_total` | counter | units | `account`, `tenant`; only from a sink told its tenants ([`MetricsSink::with_tenants`]); `level` too from a sink told the levels |
//!
//! Beside them, the same facts under OpenTelemetry's conventions for a queued rate limiter, which
//! ASP.NET Core's rate-limiting middleware defined (`aspnetcore.rate_limiting.*`, the only
//! stable convention of its kind), in this crate's namespace: dotted names with the unit in the
//! description rather than the name, and no `_total` (an OpenTelemetry exporter or a dashboard
//! built on those conventions reads them as they are; a Prometheus exporter writes the dots as
//! underscores):
//!
//! | name | kind | unit | labels |
//! |---|---|---|---|
//! | `admission.rate_limiting.requests` | counter | `{request}` | `admission.rate_limiting.result` = `acquired` or the rejection's reason |
//! | `admission.rate_limiting.request.time_in_queue` | histogram | s | `admission.rate_limiting.result`; only for a job that waited |
//! | `admission.rate_limiting.queued_requests` | gauge | `{request}` | |
//! | `admission.rate_limiting.active_request_leases` | gauge | `{request}` | |
//! | `admission.rate_limiting.request_lease.duration` | histogram | s | from the grant to its release |
//!
//! The names follow Prometheus's conventions as its exporters write them (dots become
//! underscores): counters end in `_total`, durations are `_seconds` of real time. A monitor whose
//! clock runs faster than real time (a simulation) builds its sink with
//! [`MetricsSink::simulated`]: `admission.wait_seconds` is then divided back into real seconds,
//! and the clock's own seconds go to `admission.simulated_wait_seconds`. Every counter and
//! the gauge are written at zero when the sink is created (each label value of the fixed
//! enums), so the first scrape already holds every series and a rate starts from zero.
//!
//! Labels are bounded: account names and fixed enums only, never a job's id or name or its
//! workflow (those belong in logs and events, where cardinality costs nothing). A job's tenant is
//! a label only for a sink told which tenants to name ([`MetricsSink::with_tenants`], for a
//! monitor in fair shares): then `admission.admitted_total`, `admission.rejected_total` and
//! `admission.wait_seconds` (and `admission.simulated_wait_seconds`) carry `tenant`, a named
//! tenant's name or `other` (any other tenant, or none), and `admission.granted_units_total` counts the units granted to each on each
//! account (each entry's primary amount): the tenants' shares of every account. Likewise a job's
//! priority level is a label only for a sink told the monitor's levels
//! ([`MetricsSink::with_levels`]): the same series carry `level`, the job's level (a job naming
//! none is of the default level) or `other` for a level the monitor does not have.
//! `admission.wait_seconds` has one sample per outcome: zero for a grant on arrival or a refusal that
//! did not wait, the grant's own wait after a hold, and, for a refusal after a hold, the time
//! from the job's first hold to the refusal, read on the monitor's clock (the events' instants).
//! `admission.waiters` counts the jobs held and not yet granted or refused, as the events tell
//! it, set on every hold, grant after a hold and refusal.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::metrics::{
    Label, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use admission_core::event::{Event, EventKind, EventSink, RejectReason, SinkError};
use admission_core::{Instant, Levels};
use parking_lot::Mutex;

/// `admission.admitted_total`: jobs granted, label `path` = `immediate` | `after_wait`.
pub const ADMITTED: &str = "admission.admitted_total";
/// `admission.rejected_total`: jobs refused, label `reason`.
pub const REJECTED: &str = "admission.rejected_total";
/// `admission.released_total`: grants given back, label `kind` = `release` | `rollback`.
pub const RELEASED: &str = "admission.released_total";
/// `admission.wait_seconds`, real seconds: how long a job waited, label `outcome`.
pub const WAIT: &str = "admission.wait_seconds";
/// `admission.simulated_wait_seconds`, seconds of a simulated monitor clock
/// ([`MetricsSink::simulated`]): how long a job waited, label `outcome`.
pub const SIMULATED_WAIT: &str = "admission.simulated_wait_seconds";
/// `admission.waiters`: jobs held now.
pub const WAITERS: &str = "admission.waiters";
/// `admission.held_total`: how often a waiter was held on an account, label `account`.
pub const HELD: &str = "admission.held_total";
/// `admission.granted_units_total`: units granted, labels `account` and [`TENANT`] (only from a
/// sink told its tenants, [`MetricsSink::with_tenants`]).
pub const GRANTED_UNITS: &str = "admission.granted_units_total";
/// The tenant label: a named tenant's name, or [`OTHER_TENANT`].
pub const TENANT: &str = "tenant";
/// The tenant label of a job whose tenant the sink was not told to name, or that has none.
pub const OTHER_TENANT: &str = "other";
/// The priority level label: the job's level's name, or [`OTHER_LEVEL`].
pub const LEVEL: &str = "level";
/// The level label of a job naming a level the monitor does not have.
pub const OTHER_LEVEL: &str = "other";
/// `admission.rate_limiting.requests` (OpenTelemetry's convention): admissions decided, label
/// [`RESULT`].
pub const OTEL_REQUESTS: &str = "admission.rate_limiting.requests";
/// `admission.rate_limiting.request.time_in_queue`, seconds: how long a job that waited waited,
/// label [`RESULT`].
pub const OTEL_TIME_IN_QUEUE: &str = "admission.rate_limiting.request.time_in_queue";
/// `admission.rate_limiting.queued_requests`: jobs waiting now.
pub const OTEL_QUEUED: &str = "admission.rate_limiting.queued_requests";
/// `admission.rate_limiting.active_request_leases`: grants held now.
pub const OTEL_ACTIVE_LEASES: &str = "admission.rate_limiting.active_request_leases";
/// `admission.rate_limiting.request_lease.duration`, seconds: from a grant to its release.
pub const OTEL_LEASE_DURATION: &str = "admission.rate_limiting.request_lease.duration";
/// The label of the OpenTelemetry-convention series: `acquired`, or the rejection's reason.
pub const RESULT: &str = "admission.rate_limiting.result";

/// Every [`RejectReason`], for the series written at zero.
const REASONS: [RejectReason; 6] = [
    RejectReason::Cancelled,
    RejectReason::CircuitBlocked,
    RejectReason::Aborted,
    RejectReason::Shutdown,
    RejectReason::TimedOut,
    RejectReason::Closed,
];

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
    /// When each grant now held was made, by job id (a job may hold several: their instants in
    /// order); a release takes the oldest. Never exported.
    leased: Mutex<HashMap<u64, VecDeque<Instant>>>,
    /// How many times faster than real time the monitor's clock runs: 1 for a real clock.
    clock_rate: f64,
    /// The tenants named in the `tenant` label (`None`: no tenant label at all).
    tenants: Option<HashSet<Arc<str>>>,
    /// The levels named in the `level` label, and the default level's name (`None`: no level
    /// label at all).
    levels: Option<(Vec<Arc<str>>, Arc<str>)>,
}

/// The labels that say whose a job is: its tenant and its level, as the sink was told to name
/// them (none for a sink told neither).
type Who = Vec<Label>;

impl MetricsSink {
    /// A sink recording into the current recorder; it [`describe`](MetricsSink::describe)s its
    /// series there first and writes them at zero, so create it after installing the recorder.
    pub fn new() -> MetricsSink {
        MetricsSink::with_clock_rate(1.0)
    }

    /// A sink for a monitor whose clock runs `clock_rate` times faster than real time (a
    /// simulation): waits are recorded in real seconds in `admission.wait_seconds` (the clock's
    /// durations divided by `clock_rate`) and as the clock read them in
    /// `admission.simulated_wait_seconds`. A rate that is not finite and positive is taken as 1.
    ///
    /// ```
    /// use admission_events::MetricsSink;
    ///
    /// // A monitor on a clock 300 times faster than real time.
    /// let sink = MetricsSink::simulated(300.0);
    /// # drop(sink);
    /// ```
    pub fn simulated(clock_rate: f64) -> MetricsSink {
        MetricsSink::with_clock_rate(clock_rate)
    }

    /// A sink whose admission series carry the job's tenant as a label, `tenants` by name and
    /// every other tenant (or none) as `other`, and that counts the units granted to each on each
    /// account (`admission.granted_units_total`), for a monitor in fair shares; `clock_rate` as
    /// for [`simulated`](MetricsSink::simulated) (1 for a real clock). Each tenant's admitted and
    /// rejected counters are written at zero as the others are; `admission.granted_units_total`
    /// appears with its first grant on each account. A tenant named `other` counts with the
    /// others.
    ///
    /// ```
    /// use admission_events::MetricsSink;
    ///
    /// let sink = MetricsSink::with_tenants(["acme", "globex"], 1.0);
    /// # drop(sink);
    /// ```
    pub fn with_tenants<T: Into<Arc<str>>>(
        tenants: impl IntoIterator<Item = T>,
        clock_rate: f64,
    ) -> MetricsSink {
        let tenants = tenants
            .into_iter()
            .map(Into::into)
            .filter(|tenant: &Arc<str>| &**tenant != OTHER_TENANT)
            .collect();
        MetricsSink::build(clock_rate, Some(tenants))
    }

    /// The same sink with the job's priority level as a label on its admission series (`level`:
    /// the level's name, the default level's for a job naming none, `other` for a level the
    /// monitor does not have, so a level named `other` counts with them), for a monitor built
    /// with `levels`. Its counters are written at zero for each level (and each tenant); the
    /// series the constructor wrote at zero without a level stay at zero.
    ///
    /// ```
    /// use admission_core::{Level, Levels};
    /// use admission_events::MetricsSink;
    ///
    /// # fn main() -> Result<(), admission_core::LevelError> {
    /// let levels = Levels::new().level(Level::new("interactive"))?.level(Level::new("batch"))?;
    /// let sink = MetricsSink::with_tenants(["acme"], 1.0).with_levels(&levels);
    /// # drop(sink);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_levels(mut self, levels: &Levels) -> MetricsSink {
        let names: Vec<Arc<str>> = levels.iter().map(|l| Arc::from(l.name())).collect();
        let default = levels
            .rank_of(None)
            .and_then(|rank| names.get(rank).cloned())
            .unwrap_or_else(|| Arc::from(OTHER_LEVEL));
        self.levels = (!names.is_empty()).then_some((names, default));
        self.zeroes();
        self
    }

    fn with_clock_rate(clock_rate: f64) -> MetricsSink {
        MetricsSink::build(clock_rate, None)
    }

    fn build(clock_rate: f64, tenants: Option<HashSet<Arc<str>>>) -> MetricsSink {
        let clock_rate = if clock_rate.is_finite() && clock_rate > 0.0 {
            clock_rate
        } else {
            1.0
        };
        MetricsSink::describe();
        if clock_rate != 1.0 {
            describe_histogram!(
                SIMULATED_WAIT,
                Unit::Seconds,
                "how long a job waited, by outcome, in seconds of the monitor's simulated clock"
            );
        }
        if tenants.is_some() {
            describe_counter!(
                GRANTED_UNITS,
                Unit::Count,
                "units granted, by account and tenant"
            );
        }
        let sink = MetricsSink {
            waiting: Mutex::new(HashMap::new()),
            leased: Mutex::new(HashMap::new()),
            clock_rate,
            tenants,
            levels: None,
        };
        sink.zeroes();
        sink
    }

    /// Every combination of the labels that say whose a job is (one empty set for a sink told
    /// neither tenants nor levels).
    fn everyone(&self) -> Vec<Who> {
        let mut tenants: Vec<Option<String>> = match &self.tenants {
            None => vec![None],
            Some(tenants) => tenants.iter().map(|t| Some(t.to_string())).collect(),
        };
        if self.tenants.is_some() {
            tenants.push(Some(OTHER_TENANT.to_owned()));
        }
        let levels: Vec<Option<String>> = match &self.levels {
            None => vec![None],
            Some((levels, _)) => levels
                .iter()
                .map(|l| Some(l.to_string()))
                .chain([Some(OTHER_LEVEL.to_owned())])
                .collect(),
        };
        let mut everyone = Vec::new();
        for tenant in &tenants {
            for level in &levels {
                everyone.push(who(tenant.clone(), level.clone()));
            }
        }
        everyone
    }

    /// The labels that say whose `event`'s job is.
    fn who_of(&self, event: &Event) -> Who {
        let tenant = self
            .tenants
            .as_ref()
            .map(|tenants| match &event.job.tenant {
                Some(tenant) if tenants.contains(tenant) => tenant.to_string(),
                _ => OTHER_TENANT.to_owned(),
            });
        let level = self
            .levels
            .as_ref()
            .map(|(levels, default)| match &event.job.level {
                Some(level) if levels.contains(level) => level.to_string(),
                Some(_) => OTHER_LEVEL.to_owned(),
                None => default.to_string(),
            });
        who(tenant, level)
    }

    fn admitted(&self, path: &'static str, who: &Who) -> ::metrics::Counter {
        counter!(ADMITTED, with(Label::new("path", path), who))
    }

    fn rejected(&self, reason: &'static str, who: &Who) -> ::metrics::Counter {
        counter!(REJECTED, with(Label::new("reason", reason), who))
    }

    /// Every counter of a fixed label set, and the gauge, at zero.
    fn zeroes(&self) {
        for who in &self.everyone() {
            for path in ["immediate", "after_wait"] {
                self.admitted(path, who).absolute(0);
            }
            for reason in REASONS {
                self.rejected(reason.as_str(), who).absolute(0);
            }
        }
        for kind in ["release", "rollback"] {
            counter!(RELEASED, "kind" => kind).absolute(0);
        }
        gauge!(WAITERS).set(0.0);
        counter!(OTEL_REQUESTS, RESULT => "acquired").absolute(0);
        for reason in REASONS {
            counter!(OTEL_REQUESTS, RESULT => reason.as_str()).absolute(0);
        }
        gauge!(OTEL_QUEUED).set(0.0);
        gauge!(OTEL_ACTIVE_LEASES).set(0.0);
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
        describe_histogram!(
            WAIT,
            Unit::Seconds,
            "how long a job waited, by outcome, in real seconds"
        );
        describe_gauge!(WAITERS, Unit::Count, "jobs waiting in the line now");
        describe_counter!(
            HELD,
            Unit::Count,
            "waiters held, by the account that held them"
        );
        describe_counter!(
            OTEL_REQUESTS,
            Unit::Count,
            "admissions decided, by result ({request})"
        );
        describe_histogram!(
            OTEL_TIME_IN_QUEUE,
            Unit::Seconds,
            "how long a job that waited waited, by result (s)"
        );
        describe_gauge!(OTEL_QUEUED, Unit::Count, "jobs waiting now ({request})");
        describe_gauge!(
            OTEL_ACTIVE_LEASES,
            Unit::Count,
            "grants held now ({request})"
        );
        describe_histogram!(
            OTEL_LEASE_DURATION,
            Unit::Seconds,
            "from a grant to its release (s)"
        );
    }

    /// A job first held at `at` is waiting; later holds of the same wait change nothing.
    fn held(&self, job: u64, at: Instant) {
        let mut waiting = self.waiting.lock();
        waiting.entry(job).or_insert(at);
        gauge!(WAITERS).set(waiting.len() as f64);
        gauge!(OTEL_QUEUED).set(waiting.len() as f64);
    }

    /// The job is no longer waiting; when it was first held, if it was.
    fn left(&self, job: u64) -> Option<Instant> {
        let mut waiting = self.waiting.lock();
        let since = waiting.remove(&job);
        gauge!(WAITERS).set(waiting.len() as f64);
        gauge!(OTEL_QUEUED).set(waiting.len() as f64);
        since
    }

    /// A grant to `job` at `at`: one more lease held.
    fn leased(&self, job: u64, at: Instant) {
        let mut leased = self.leased.lock();
        leased.entry(job).or_default().push_back(at);
        let held: usize = leased.values().map(VecDeque::len).sum();
        gauge!(OTEL_ACTIVE_LEASES).set(held as f64);
    }

    /// A release of `job`'s oldest grant at `at`: its lease's duration, if the grant was seen.
    fn released(&self, job: u64, at: Instant) -> Option<Duration> {
        let mut leased = self.leased.lock();
        let since = leased.get_mut(&job).and_then(VecDeque::pop_front);
        if leased.get(&job).is_some_and(VecDeque::is_empty) {
            leased.remove(&job);
        }
        let held: usize = leased.values().map(VecDeque::len).sum();
        gauge!(OTEL_ACTIVE_LEASES).set(held as f64);
        since.map(|since| at.saturating_duration_since(since))
    }

    /// Real seconds of a duration on the monitor's clock.
    fn real_seconds(&self, duration: Duration) -> f64 {
        duration.as_secs_f64() / self.clock_rate
    }

    /// Each entry's primary amount, by account, tenant (and level), for a sink with tenants.
    fn granted_units(&self, event: &Event, who: &Who) {
        if self.tenants.is_none() {
            return;
        }
        for entry in &event.entries {
            counter!(
                GRANTED_UNITS,
                with(Label::new("account", entry.account.clone()), who)
            )
            .increment(entry.amount.primary());
        }
    }

    fn wait(&self, outcome: &'static str, wait: Duration, who: &Who) {
        let seconds = wait.as_secs_f64();
        histogram!(WAIT, with(Label::new("outcome", outcome), who))
            .record(seconds / self.clock_rate);
        if self.clock_rate != 1.0 {
            histogram!(SIMULATED_WAIT, with(Label::new("outcome", outcome), who)).record(seconds);
        }
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
                let who = self.who_of(event);
                self.admitted("immediate", &who).increment(1);
                self.wait("granted", Duration::ZERO, &who);
                counter!(OTEL_REQUESTS, RESULT => "acquired").increment(1);
                self.leased(event.job.id, event.at);
                self.granted_units(event, &who);
            }
            EventKind::Held => {
                for entry in &event.entries {
                    counter!(HELD, "account" => entry.account.clone()).increment(1);
                }
                self.held(event.job.id, event.at);
            }
            EventKind::GrantedFromHold { wait, .. } => {
                let who = self.who_of(event);
                self.admitted("after_wait", &who).increment(1);
                self.left(event.job.id);
                self.wait("granted", *wait, &who);
                counter!(OTEL_REQUESTS, RESULT => "acquired").increment(1);
                histogram!(OTEL_TIME_IN_QUEUE, RESULT => "acquired")
                    .record(self.real_seconds(*wait));
                self.leased(event.job.id, event.at);
                self.granted_units(event, &who);
            }
            EventKind::Rejected { reason, .. } => {
                let reason: &'static str = RejectReason::as_str(reason);
                let who = self.who_of(event);
                self.rejected(reason, &who).increment(1);
                counter!(OTEL_REQUESTS, RESULT => reason).increment(1);
                let since = self.left(event.job.id);
                if let Some(since) = since {
                    let waited = event.at.saturating_duration_since(since);
                    histogram!(OTEL_TIME_IN_QUEUE, RESULT => reason)
                        .record(self.real_seconds(waited));
                }
                let waited = since.map_or(Duration::ZERO, |since| {
                    event.at.saturating_duration_since(since)
                });
                self.wait(reason, waited, &who);
            }
            EventKind::Released { rolled_back } => {
                let kind = if *rolled_back { "rollback" } else { "release" };
                counter!(RELEASED, "kind" => kind).increment(1);
                if let Some(held) = self.released(event.job.id, event.at) {
                    histogram!(OTEL_LEASE_DURATION).record(self.real_seconds(held));
                }
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
            .field("leased", &self.leased.lock().len())
            .field("clock_rate", &self.clock_rate)
            .field("tenants", &self.tenants.as_ref().map(HashSet::len))
            .field(
                "levels",
                &self.levels.as_ref().map(|(levels, _)| levels.len()),
            )
            .finish()
    }
}

/// The labels of a tenant and a level, each when named.
fn who(tenant: Option<String>, level: Option<String>) -> Who {
    let mut who = Vec::with_capacity(2);
    if let Some(tenant) = tenant {
        who.push(Label::new(TENANT, tenant));
    }
    if let Some(level) = level {
        who.push(Label::new(LEVEL, level));
    }
    who
}

/// `first`, then `who`: one series' labels.
fn with(first: Label, who: &Who) -> Vec<Label> {
    let mut labels = Vec::with_capacity(1 + who.len());
    labels.push(first);
    labels.extend(who.iter().cloned());
    labels
}
