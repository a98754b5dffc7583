//! What a run measures while it runs: job outcomes, admission waits, per-model call counts, and
//! exact occupancy gauges for the limits that must never be exceeded.
//!
//! The gauges are the example's own bookkeeping, independent of the accounts: a job enters a
//! gauge right after its grant (or permit) and leaves it right before giving it back, so a
//! gauge's peak is a lower bound on what the limiter really had out at that moment. A peak above
//! capacity would prove an over-grant; `--check` fails on it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::workload::JobPlan;

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// Every step's call succeeded.
    Completed,
    /// A step used up its retries.
    GaveUp,
    /// An admission (or, in the chain, an acquisition) passed its deadline.
    TimedOut,
    /// Cancelled: Ctrl-C or the run's deadline.
    Cancelled,
    /// The workflow's spend cap refused a step's price (the refusal says the numbers): an
    /// expected end, not a failure.
    OverBudget(String),
    /// Anything else (a refusal that retrying cannot fix, a bug); the message says what.
    Failed(String),
}

/// One grant of a step (an admission, or the chain's acquisition), for the tenants' and levels'
/// report (`fairness.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRecord {
    /// The agent's tenant, by its place in `--tenants`.
    pub tenant: Option<usize>,
    /// Whether the agent runs at the interactive level.
    pub interactive: bool,
    /// The model called.
    pub model: &'static str,
    /// When the grant came, simulated seconds since the run began.
    pub granted_s: f64,
    /// How long the step waited for it, simulated seconds.
    pub wait_s: f64,
    /// Tokens of the model's bucket granted (prompt + declared most output).
    pub tokens: u64,
}

/// Exact holders of one limit that has a capacity (its name is the account's).
#[derive(Debug)]
pub struct Gauge {
    /// The limit's name (the account's).
    pub name: String,
    current: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    /// A gauge for the limit `name`.
    pub fn new(name: impl Into<String>) -> Gauge {
        Gauge {
            name: name.into(),
            current: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    fn enter(&self) {
        let now = self.current.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(now, Ordering::AcqRel);
    }

    fn leave(&self) {
        self.current.fetch_sub(1, Ordering::AcqRel);
    }

    /// The most holders seen at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }
}

/// A job's place in some gauges; leaves them all when dropped.
#[must_use = "dropping the holding leaves the gauges at once"]
pub struct Holding<'a> {
    metrics: &'a Metrics,
    gauges: Vec<&'a Gauge>,
}

impl Holding<'_> {
    /// Enters one more gauge (a name without a gauge is skipped).
    pub fn enter(&mut self, name: &str) {
        if let Some(gauge) = self.metrics.gauge(name) {
            gauge.enter();
            self.gauges.push(gauge);
        }
    }

    /// Leaves the gauges now (what dropping does).
    pub fn leave(self) {}
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        for gauge in &self.gauges {
            gauge.leave();
        }
    }
}

/// Counters of one model's calls.
#[derive(Debug, Default)]
pub struct ModelTally {
    /// Calls that ran (200).
    pub calls_ok: AtomicU64,
    /// 429 answers seen by the jobs.
    pub rate_limited: AtomicU64,
    /// 529 answers seen by the jobs.
    pub overloaded: AtomicU64,
    /// Refusals by an open circuit (the model's window), retried later.
    pub circuit_refusals: AtomicU64,
    /// Jobs of this model that ended.
    pub jobs_done: AtomicU64,
    /// Simulated nanoseconds at which the model's last job ended.
    pub last_job_done: AtomicU64,
}

/// Everything a run counts.
#[derive(Debug)]
pub struct Metrics {
    /// Jobs in the plan.
    pub jobs_total: u64,
    /// Jobs that ended, whatever the outcome.
    pub jobs_done: AtomicU64,
    completed: AtomicU64,
    gave_up: AtomicU64,
    timed_out: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    over_budget: AtomicU64,
    /// Steps whose price a workflow's spend cap refused (each ends its job).
    pub refused_for_money: AtomicU64,
    /// What the workflows spent, in micro-units, summed as each job ends.
    pub spent_micros: AtomicU64,
    /// The most one workflow spent, in micro-units.
    pub most_spent_micros: AtomicU64,
    /// Admissions (or chain acquisitions) that produced a grant.
    pub grants: AtomicU64,
    /// Calls retried after a 429 or 529.
    pub retries: AtomicU64,
    /// Simulated nanoseconds HTTP connections were held, summed over calls.
    pub http_held_ns: AtomicU64,
    /// Of those, nanoseconds a connection was held while its job still waited for another limit
    /// (only the hold-and-wait chain does that).
    pub http_idle_ns: AtomicU64,
    /// Tokens debited from a bucket by a chain that then timed out before its call: paid for,
    /// never used.
    pub tokens_stranded: AtomicU64,
    /// Results committed to the results database, one per admitted attempt of a step that
    /// needs the database.
    pub results_stored: AtomicU64,
    /// Per model.
    pub models: BTreeMap<String, ModelTally>,
    /// Admission waits in simulated microseconds, per model.
    waits: Mutex<BTreeMap<String, Histogram<u64>>>,
    /// Every grant, in the order recorded.
    records: Mutex<Vec<StepRecord>>,
    /// The first few failure messages.
    failures: Mutex<Vec<String>>,
    /// Exact occupancy of the limits with a capacity.
    pub gauges: Vec<Gauge>,
}

/// Outcome counts, for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Outcomes {
    /// Jobs in the plan.
    pub total: u64,
    /// Every step done.
    pub completed: u64,
    /// A step used up its retries.
    pub gave_up: u64,
    /// A wait passed its deadline.
    pub timed_out: u64,
    /// Cancelled (Ctrl-C, run deadline).
    pub cancelled: u64,
    /// Failed otherwise.
    pub failed: u64,
    /// Stopped by the workflow's spend cap (expected, not a failure).
    #[serde(default)]
    pub over_budget: u64,
}

impl Outcomes {
    /// Jobs that reached an end of any kind.
    pub fn ended(&self) -> u64 {
        self.completed
            + self.gave_up
            + self.timed_out
            + self.cancelled
            + self.failed
            + self.over_budget
    }
}

impl Metrics {
    /// Counters for `jobs_total` jobs over `models`, with `gauges`.
    pub fn new<'a>(
        jobs_total: u64,
        models: impl IntoIterator<Item = &'a str>,
        gauges: Vec<Gauge>,
    ) -> Metrics {
        Metrics {
            jobs_total,
            jobs_done: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            gave_up: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            over_budget: AtomicU64::new(0),
            refused_for_money: AtomicU64::new(0),
            spent_micros: AtomicU64::new(0),
            most_spent_micros: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            http_held_ns: AtomicU64::new(0),
            http_idle_ns: AtomicU64::new(0),
            tokens_stranded: AtomicU64::new(0),
            results_stored: AtomicU64::new(0),
            models: models
                .into_iter()
                .map(|m| (m.to_owned(), ModelTally::default()))
                .collect(),
            waits: Mutex::new(BTreeMap::new()),
            records: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
            gauges,
        }
    }

    /// The tally of `model` (a model outside the plan has none).
    pub fn model(&self, model: &str) -> Option<&ModelTally> {
        self.models.get(model)
    }

    /// The gauge named `name`.
    pub fn gauge(&self, name: &str) -> Option<&Gauge> {
        self.gauges.iter().find(|g| g.name == name)
    }

    /// Enters every gauge named in `names` (names without a gauge are skipped).
    pub fn hold<'n>(&self, names: impl IntoIterator<Item = &'n str>) -> Holding<'_> {
        let mut holding = Holding {
            metrics: self,
            gauges: Vec::new(),
        };
        for name in names {
            holding.enter(name);
        }
        holding
    }

    /// Records one admission wait of a call on `model`.
    pub fn record_wait(&self, model: &str, wait: Duration) {
        self.grants.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        if let Ok(mut waits) = self.waits.lock() {
            waits
                .entry(model.to_owned())
                .or_insert_with(histogram)
                .saturating_record(micros);
        }
    }

    /// Records one grant of a step of `job` at simulated time `at`, after `wait`, with `tokens` of
    /// its model's bucket: its wait ([`record_wait`](Metrics::record_wait)) and its
    /// [`StepRecord`].
    pub fn record_grant(&self, job: &JobPlan, tokens: u64, wait: Duration, at: Duration) {
        self.record_wait(job.model, wait);
        let record = StepRecord {
            tenant: job.tenant,
            interactive: job.interactive,
            model: job.model,
            granted_s: at.as_secs_f64(),
            wait_s: wait.as_secs_f64(),
            tokens,
        };
        if let Ok(mut records) = self.records.lock() {
            records.push(record);
        }
    }

    /// Every grant recorded so far.
    pub fn records(&self) -> Vec<StepRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The wait histograms per model, and all of them merged under `"all"`.
    pub fn waits(&self) -> BTreeMap<String, Histogram<u64>> {
        let mut out = self.waits.lock().map(|w| w.clone()).unwrap_or_default();
        let mut all = histogram();
        for one in out.values() {
            // Same bounds and precision: adding cannot fail.
            let _ = all.add(one);
        }
        out.insert("all".to_owned(), all);
        out
    }

    /// Records how job `model` ended at simulated time `at`.
    pub fn job_ended(&self, model: &str, outcome: &JobOutcome, at: Duration) {
        let counter = match outcome {
            JobOutcome::Completed => &self.completed,
            JobOutcome::GaveUp => &self.gave_up,
            JobOutcome::TimedOut => &self.timed_out,
            JobOutcome::Cancelled => &self.cancelled,
            JobOutcome::OverBudget(_) => &self.over_budget,
            JobOutcome::Failed(message) => {
                if let Ok(mut failures) = self.failures.lock()
                    && failures.len() < 5
                {
                    failures.push(message.clone());
                }
                &self.failed
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(tally) = self.model(model) {
            tally.jobs_done.fetch_add(1, Ordering::Relaxed);
            let nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
            tally.last_job_done.fetch_max(nanos, Ordering::Relaxed);
        }
        self.jobs_done.fetch_add(1, Ordering::AcqRel);
    }

    /// The outcome counts so far.
    pub fn outcomes(&self) -> Outcomes {
        Outcomes {
            total: self.jobs_total,
            completed: self.completed.load(Ordering::Acquire),
            gave_up: self.gave_up.load(Ordering::Acquire),
            timed_out: self.timed_out.load(Ordering::Acquire),
            cancelled: self.cancelled.load(Ordering::Acquire),
            failed: self.failed.load(Ordering::Acquire),
            over_budget: self.over_budget.load(Ordering::Acquire),
        }
    }

    /// Adds what one workflow spent (in micro-units) once its job ended.
    pub fn record_spend(&self, spent_micros: u64) {
        self.spent_micros.fetch_add(spent_micros, Ordering::Relaxed);
        self.most_spent_micros
            .fetch_max(spent_micros, Ordering::Relaxed);
    }

    /// The first failure messages.
    pub fn failures(&self) -> Vec<String> {
        self.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }
}

/// The longest wait a histogram tells apart: a simulated day, in microseconds (longer waits are
/// recorded as a day).
const LONGEST_WAIT_MICROS: u64 = 86_400_000_000;

/// An empty histogram of waits in microseconds, three significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LONGEST_WAIT_MICROS, 3)
        .expect("the bounds are constant and valid: 1 <= a day, three significant digits")
}

/// Adds a simulated duration to a nanosecond counter.
pub fn add_duration(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}
