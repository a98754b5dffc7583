//! [`Monitor`]: one line, one evaluator, whole demands or nothing.
//!
//! A job asks for its whole [`Demand`] at once (Havender's second way of avoiding deadlock: ask
//! for everything together and proceed only when all of it is granted). The demand is granted in
//! one critical section under the monitor lock, or the job waits in one FIFO line holding nothing.
//! The line's condition, "does the head's demand fit?", is re-evaluated on every event that moves a
//! counter (Hoare's conditional wait, made affordable by putting the line itself in the monitor's
//! state): by the releasing thread itself when a grant is given back (a direct hand-off), and
//! otherwise by the one evaluator thread, which also wakes at the earliest instant the clock could
//! change an answer. Every pass runs under the monitor lock, whoever runs it. See `pass.rs` for
//! the head reservation.

// The shell around the state machine (`crate::machine`), and the grant it hands out.
mod grant;
mod shell;

#[cfg(all(test, admission_loom))]
mod loom_models;
#[cfg(all(test, not(admission_loom)))]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use grant::{BorrowedGrant, Grant};
pub use shell::Admit;

use shell::Shared;

use crate::clock::{SystemClock, Timer};
use crate::context::JobContext;
use crate::demand::Demand;
use crate::error::{AdmitError, StartError, TryAdmitError};
use crate::event::EventSink;
use crate::fair::{FairShares, Levels};
use crate::gate::Gate;
use crate::machine::{LineOrder, PASS_BATCH};

/// Stops the monitor when the last [`Monitor`] handle is dropped.
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The admission monitor: grants whole demands, in one fair line, woken by events and deadlines.
///
/// Handles are cheap to clone and share one monitor. Dropping the last handle stops it, as
/// [`stop`](Monitor::stop) does. Grants and pending admissions keep the internals alive but not
/// the evaluator.
///
/// # Fairness
///
/// One FIFO line with head reservation (EASY backfilling): the head is never overtaken; a waiter
/// behind it is granted only if it fits with the head's amounts set aside on every account they
/// share, and never takes from a [`Time`](crate::Replenishment::Time) account the head is short
/// on. A demand disjoint from what the head lacks passes at the first pass after it arrives. A
/// demand that fits when the line is empty is granted inline by the caller.
///
/// # The gate
///
/// A monitor may carry one [`Gate`] (the memory pressure gate in practice). Every demand with
/// entries meets it before any account, on the fast path and at every pass; an orchestrator's
/// empty demand never does. While the gate holds the head of the line, every waiter with entries
/// is held by the gate too, with the head's deadline, and the next pass starts again from the
/// head, so the gate releases its line in arrival order. A waiter that an account holds is that
/// account's to release. The gate hears of each grant it let through and of each completion.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_accounts::token_bucket::TokenBucketConfig;
/// use admission_accounts::{CountingGate, TokenBucket};
/// use admission_core::{Amount, Demand, JobContext, Monitor};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let monitor = Monitor::new();
/// monitor.start()?;
/// // The accounts read time on the monitor's clock.
/// let clock = monitor.clock().clone();
/// let http = Arc::new(CountingGate::http(16, clock.clone())?);
/// let model = Arc::new(TokenBucket::new("model", TokenBucketConfig::new(90_000, 60), clock)?);
///
/// let demand = Demand::new()
///     .with(http.clone(), Amount::ONE)
///     .with(model.clone(), Amount::pair(1_500, 1)); // 1,500 tokens and one request
/// let grant = monitor.admit_blocking(demand, &JobContext::new("summarize"), None)?;
/// assert_eq!(http.available(), 15);
/// drop(grant); // the HTTP permit comes back; the tokens stay spent
/// assert_eq!(http.available(), 16);
/// monitor.stop();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Monitor {
    shared: Arc<Shared>,
    _owner: Arc<StopOnDrop>,
}

/// Configures a [`Monitor`]: its clock, its event sink, its gate and the order of its line.
#[derive(Default)]
pub struct MonitorBuilder {
    clock: Option<Arc<dyn Timer>>,
    sink: Option<Arc<dyn EventSink>>,
    gate: Option<Arc<dyn Gate>>,
    manual: bool,
    /// Waiters a pass visits per critical section (`None`: [`PASS_BATCH`]).
    pass_batch: Option<usize>,
    /// Whether the monitor lock's holds are timed (a test hook).
    time_holds: bool,
    /// Tenants' weights, for a line in fair shares (`None`: arrival order).
    fair: Option<FairShares>,
    /// Priority levels (`None`: one level).
    levels: Option<Levels>,
}

impl MonitorBuilder {
    /// The clock every deadline is read on (default: [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Timer>) -> MonitorBuilder {
        self.clock = Some(clock);
        self
    }

    /// Where events go (default: nowhere, and then no event is ever built).
    pub fn sink(mut self, sink: Arc<dyn EventSink>) -> MonitorBuilder {
        self.sink = Some(sink);
        self
    }

    /// The gate every demand with entries meets before any account (default: none).
    pub fn gate(mut self, gate: Arc<dyn Gate>) -> MonitorBuilder {
        self.gate = Some(gate);
        self
    }

    /// Serves the line in fair shares between tenants, weighed by `shares`, instead of in arrival
    /// order (the default): see [`FairShares`] for the rule. The head of the line keeps its place
    /// and its reservation either way, and a line no one waits in grants at once either way.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{FairShares, Monitor};
    ///
    /// # fn main() -> Result<(), admission_core::WeightError> {
    /// let monitor = Monitor::builder()
    ///     .fair_shares(FairShares::new().weight("interactive", 4)?)
    ///     .build();
    /// # drop(monitor);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fair_shares(mut self, shares: FairShares) -> MonitorBuilder {
        self.fair = Some(shares);
        self
    }

    /// Serves the line by priority level, highest first, keeping each level's reserves: see
    /// [`Levels`] for the rules. A job names its level with
    /// [`JobContext::with_level`](crate::JobContext::with_level); without levels (the default)
    /// a job's level is ignored. With [`fair_shares`](MonitorBuilder::fair_shares) too, the
    /// tenants of each level share it by their weights. An empty [`Levels`] is the same as none.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{Level, LevelError, Levels, Monitor};
    ///
    /// # fn main() -> Result<(), LevelError> {
    /// let monitor = Monitor::builder()
    ///     .levels(Levels::new().level(Level::new("interactive"))?.level(Level::new("batch"))?)
    ///     .build();
    /// # drop(monitor);
    /// # Ok(())
    /// # }
    /// ```
    pub fn levels(mut self, levels: Levels) -> MonitorBuilder {
        self.levels = (!levels.is_empty()).then_some(levels);
        self
    }

    /// A monitor without an evaluator: passes run only when the test calls
    /// [`Monitor::pass_now`] (and on the threads that admit and release, as always), so a test
    /// decides exactly when deadlines and refills are looked at, and events come in a fixed
    /// order.
    ///
    /// This is a test hook, as tokio's paused clock is: until the test calls
    /// [`Monitor::start`], a parked waiter's deadline is honoured only by a pass the test runs
    /// (a blocking waiter on a real clock also times itself out).
    #[cfg(any(test, feature = "test-util"))]
    pub fn manual_passes(mut self) -> MonitorBuilder {
        self.manual = true;
        self
    }

    /// Visits at most `n` waiters (at least one) per critical section of a pass: the loom models
    /// and unit tests make passes release the lock between every waiter or two.
    #[cfg(test)]
    pub(crate) fn pass_batch(mut self, n: usize) -> MonitorBuilder {
        self.pass_batch = Some(n.max(1));
        self
    }

    /// Times every hold of the monitor's lock, for [`Monitor::take_lock_holds`]: a test hook
    /// (feature `test-util`) for benches that measure how long an admit, a release or a pass
    /// keeps others out. Each hold costs two readings of the standard library's clock more.
    #[cfg(any(test, feature = "test-util"))]
    pub fn time_lock_holds(mut self) -> MonitorBuilder {
        self.time_holds = true;
        self
    }

    /// Builds the monitor. It grants inline at once; its evaluator thread starts with the first
    /// waiter that has to park (or earlier, with [`Monitor::start`]).
    pub fn build(self) -> Monitor {
        let clock = self
            .clock
            .unwrap_or_else(|| Arc::new(SystemClock::new()) as Arc<dyn Timer>);
        let batch = self.pass_batch.unwrap_or(PASS_BATCH);
        let shared = Shared::new(
            clock,
            self.gate,
            self.sink,
            self.manual,
            batch,
            self.time_holds,
            LineOrder {
                fair: self.fair,
                levels: self.levels,
            },
        );
        Monitor {
            _owner: Arc::new(StopOnDrop(shared.clone())),
            shared,
        }
    }
}

impl Monitor {
    /// A monitor on the system clock, with no sink and no gate. Its evaluator starts with the
    /// first waiter that parks.
    pub fn new() -> Monitor {
        Monitor::builder().build()
    }

    /// A builder for a monitor with a clock, a sink or a gate.
    pub fn builder() -> MonitorBuilder {
        MonitorBuilder::default()
    }

    /// Starts the evaluator thread now rather than when the first waiter parks. Idempotent:
    /// `Ok` when it already runs. (On a monitor built with manual passes this is the one way to
    /// give it an evaluator.)
    ///
    /// # Errors
    ///
    /// [`StartError::Stopped`] after [`stop`](Monitor::stop), [`StartError::Spawn`] if the
    /// thread cannot be created.
    pub fn start(&self) -> Result<(), StartError> {
        self.shared.start()
    }

    /// Stops admission: every parked waiter is refused with [`AdmitError::Shutdown`], every wake
    /// slot this monitor installed is cleared, the evaluator is joined, and every later admit is
    /// refused the same way. Idempotent. Grants already given stay valid and release normally.
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// How many waiters are parked in the line now.
    ///
    /// Read under the monitor lock, so it agrees with every outcome already delivered: a waiter
    /// whose grant or refusal another thread has seen is never still counted (a pass fills its
    /// waiters' cells and takes them out of the line in one critical section).
    pub fn queue_size(&self) -> usize {
        self.shared.queue_size()
    }

    /// Installs or removes the event sink.
    pub fn set_sink(&self, sink: Option<Arc<dyn EventSink>>) {
        self.shared.set_sink(sink);
    }

    /// The monitor's clock.
    pub fn clock(&self) -> &Arc<dyn Timer> {
        &self.shared.clock
    }

    /// Asks for `demand` on behalf of `ctx`, waiting at most `timeout` (on the monitor's clock).
    ///
    /// The returned future is runtime-agnostic: it is woken through its `Waker`, so it runs
    /// under tokio, async-std or any executor.
    ///
    /// # Errors
    ///
    /// The future resolves to [`AdmitError::Refused`] at once (on its first poll, whoever waits
    /// ahead and whatever the other accounts say) when an account can never grant the demand, [`AdmitError::Cancelled`] when `ctx` is cancelled, [`AdmitError::TimedOut`] when
    /// the timeout passes, [`AdmitError::Shutdown`] or [`AdmitError::Closed`] when admission ends,
    /// and [`AdmitError::Aborted`] when an account panics.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the waiter; a grant that landed concurrently is rolled back.
    ///
    /// # Tracing
    ///
    /// Each admission (this and [`admit_blocking`](Monitor::admit_blocking)) runs in a `tracing`
    /// span, target `admission`, name `admit`, level DEBUG, with `job_id`, `job_name`, `tenant`,
    /// `accounts` (the names, in demand order) and, once it ends, `waited_ms` and `outcome`
    /// (`granted`, `abandoned` for a future dropped while it waited, or the refusal's reason:
    /// `timed_out`, `cancelled`, `circuit_blocked`, `shutdown`, `aborted`, `closed`). With
    /// nothing listening at DEBUG the span costs one check of the dispatcher's interest.
    ///
    /// # Panics
    ///
    /// Polling the future again after it completed panics, as most futures do.
    pub fn admit(&self, demand: Demand, ctx: &JobContext, timeout: Option<Duration>) -> Admit {
        Admit::new(self.shared.clone(), demand, ctx.clone(), timeout)
    }

    /// Runs one full pass over the line on the calling thread, as the evaluator would, and
    /// returns the instant the evaluator would then sleep until (`None`: until an event).
    ///
    /// A test hook (feature `test-util`), for monitors built with
    /// [`MonitorBuilder::manual_passes`]: a third party testing its own account parks waiters,
    /// moves a fake clock, and decides when the line is looked at.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "test-util")] {
    /// use admission_core::Monitor;
    ///
    /// let monitor = Monitor::builder().manual_passes().build();
    /// assert_eq!(monitor.pass_now(), None); // nobody waits: nothing to wake up for
    /// # }
    /// ```
    #[cfg(any(test, feature = "test-util"))]
    pub fn pass_now(&self) -> Option<crate::Instant> {
        self.shared.pass_now()
    }

    /// Whether something asked for a pass (rang the evaluator's doorbell) since the last call,
    /// or since the monitor was built; clears it.
    ///
    /// A test hook (feature `test-util`), for monitors built with
    /// [`MonitorBuilder::manual_passes`], where no evaluator answers the doorbell: a test can
    /// tell an event that makes the monitor look at the line again (a release, the head leaving)
    /// from one that does not (a waiter behind the head leaving).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "test-util")] {
    /// use admission_core::Monitor;
    ///
    /// let monitor = Monitor::builder().manual_passes().build();
    /// assert!(!monitor.take_doorbell());
    /// # }
    /// ```
    #[cfg(any(test, feature = "test-util"))]
    pub fn take_doorbell(&self) -> bool {
        self.shared.take_ring()
    }

    /// How long the monitor's lock was held since it was built or since the last call, for a
    /// monitor built with [`MonitorBuilder::time_lock_holds`] (`None` otherwise); the count
    /// starts afresh. A test hook (feature `test-util`); see [`LockHolds`](crate::sync::LockHolds) for an example.
    #[cfg(any(test, feature = "test-util"))]
    pub fn take_lock_holds(&self) -> Option<crate::sync::LockHolds> {
        self.shared.take_lock_holds()
    }

    /// [`admit`](Monitor::admit), parking the calling thread instead of a task.
    ///
    /// Blocking and async waiters stand in the same line. The blocking call's cancellation token
    /// is its context: [`JobContext::cancel`] from another thread withdraws it at once.
    ///
    /// # Errors
    ///
    /// As for [`admit`](Monitor::admit).
    pub fn admit_blocking(
        &self,
        demand: Demand,
        ctx: &JobContext,
        timeout: Option<Duration>,
    ) -> Result<Grant, AdmitError> {
        shell::admit_blocking(&self.shared, demand, ctx, timeout)
    }

    /// Grants `demand` now, whole, or nothing, and never waits: tokio's `try_acquire` for many
    /// limits at once.
    ///
    /// A try never overtakes the line: while anyone waits it answers
    /// [`TryAdmitError::WouldWait`], as it does when an account (or the gate) has no room now.
    /// What [`admit`](Monitor::admit) would refuse for good it refuses alike
    /// ([`TryAdmitError::Admit`]), and that wins over waiting: a demand that an account can
    /// never grant is refused even while others wait or another account is short. The grant borrows the demand, the job and the monitor, so a
    /// prebuilt demand is tried again and again without a copy; with no gate, the whole try
    /// takes no lock of the monitor's and allocates nothing. Like `compare_exchange_weak`, a try
    /// may answer "would wait" for capacity that another admit held only for an instant (taken,
    /// then given back because its demand did not fit whole); nothing is lost, and `admit` waits
    /// through such an instant.
    ///
    /// # Errors
    ///
    /// [`TryAdmitError::WouldWait`] naming what is short (or how many wait), nothing taken;
    /// [`TryAdmitError::Admit`] for a demand that can never fit, a cancelled job, an unmet
    /// requirement, or a stopped or closed monitor.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use admission_accounts::CountingGate;
    /// use admission_core::{Amount, Demand, JobContext, Monitor, TryAdmitError};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let monitor = Monitor::new();
    /// let http = Arc::new(CountingGate::on_system_clock("http", 1)?);
    /// let db = Arc::new(CountingGate::on_system_clock("db", 1)?);
    /// let both = Demand::new().with(http.clone(), Amount::ONE).with(db.clone(), Amount::ONE);
    /// let job = JobContext::new("job");
    ///
    /// let db_only = Demand::new().with(db.clone(), Amount::ONE);
    /// let held = monitor.try_admit(&db_only, &job)?;
    /// match monitor.try_admit(&both, &job) {
    ///     Err(TryAdmitError::WouldWait { short, .. }) => assert_eq!(short.as_deref(), Some("db")),
    ///     other => panic!("expected to wait, got {other:?}"),
    /// }
    /// assert_eq!(http.available(), 1, "nothing taken when the demand would wait");
    /// drop(held);
    /// let grant = monitor.try_admit(&both, &job)?;
    /// assert_eq!((http.available(), db.available()), (0, 0));
    /// drop(grant);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_admit<'a>(
        &'a self,
        demand: &'a Demand,
        ctx: &'a JobContext,
    ) -> Result<BorrowedGrant<'a>, TryAdmitError> {
        self.shared.try_take(demand, ctx)?;
        Ok(BorrowedGrant::new(&*self.shared, demand, ctx))
    }
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::new()
    }
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("queue_size", &self.queue_size())
            .field("clock", &self.shared.clock)
            .field("gate", &self.shared.gate)
            .finish_non_exhaustive()
    }
}
