//! [`MemoryGate`]: the memory pressure gate that fills the monitor's gate slot.
//!
//! The gate reads a [`MemoryProbe`] (used bytes against a limit) and decides who may leave
//! memory's line, the waiters it holds. Its rule, in short (the numbers live in `rule.rs`):
//! - **Latch.** A reading at or above 95 % sets it; only a reading below 90 % clears it. While it
//!   is set no demand with entries passes, and the gate asks to be asked again every 2 s while
//!   anyone waits: memory falling is not an event anyone announces.
//! - **Drain.** Below the latch, memory's line empties one job at a time: the next job leaves at
//!   the first job completion or when the spacing since the previous release has run out,
//!   whichever comes first. A completion releases at most one job, and completions are not
//!   saved up (one that comes while memory holds nobody is forgotten). A job arriving when
//!   memory holds nobody is never spaced, and only jobs leaving memory's line count as releases.
//! - **Spacing.** The curve from 50 ms at 80 % to 30 s at 95 %, read at the level as it is now,
//!   times the growth penalty, capped at one hour (see `rule.rs` for the floor and the penalty).
//!   A spacing longer than 2 s is asked about again every 2 s, so a fall in memory shortens it.
//!
//! The spacing is a gap between releases that the monitor serves, not a sleep each job takes on
//! its own: the monitor's evaluator sleeps until the instant the gap closes and wakes one waiter
//! then. A gap that has closed is answered with a pass, and a gap still open is always answered
//! with its instant (never "only an event"), so a full line can never be parked with nothing to
//! wake it. The monitor's sharp rule does the rest: while memory holds the head of the line, it
//! holds every waiter with entries behind it too, so the drain always starts from the oldest.
//!
//! A waiter that the gate already let through and that an account then held (a full connection
//! pool, an empty token bucket) is that account's to release: below the latch the gate passes it
//! whatever the reading, and its grant is not counted as a release from memory's line.

mod manual;
mod probe;
mod reading;
mod rule;
mod status;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use admission_core::{Category, Gate, GateAnswer, GateView, Instant, WakeFn, WakeSlot};
use parking_lot::Mutex;

pub use manual::ManualProbe;
pub use probe::{CgroupV2Probe, ResidentSetProbe};
pub use reading::{MemoryProbe, MemoryReading, ProbeError};
use rule::{Growth, Latch, LatchChange, RECHECK, curve, wait};
pub use status::{MemoryStatus, MemoryZone};

/// Everything that moves, under the gate's one lock (taken only inside the monitor's calls and
/// by [`MemoryGate::status`]).
#[derive(Debug, Default)]
struct State {
    /// The instant of the cached reading: one probe read per instant of the monitor's clock, and
    /// every attempt of one pass carries the same instant.
    read_at: Option<Instant>,
    /// The last good reading.
    reading: MemoryReading,
    /// True while the probe fails: the gate then stands aside (see [`MemoryGate`]).
    failing: bool,
    latch: Latch,
    growth: Growth,
    /// When a job last left memory's line.
    last_release: Option<Instant>,
    /// A job completed since the last release; at most one, never accumulated.
    credit: bool,
}

/// The memory pressure gate: install it with `Monitor::builder().gate(..)`.
///
/// # Fairness
///
/// Jobs leave memory's line in arrival order, one per completion or per elapsed spacing. The
/// monitor holds every waiter with entries behind a head that memory holds, so nobody deep in
/// the line is released at the drain's first instant ahead of older jobs.
///
/// # Probe failures
///
/// When the probe cannot read, the gate stands aside: it passes every asker, keeps its latch,
/// floor and penalty as they were, and logs the failure once at warn (and the recovery at info).
/// A broken probe must not stop admission for good; a container without a memory limit, for
/// instance, fails every read of [`CgroupV2Probe`].
///
/// # Stopping
///
/// [`MemoryGate::stop`] makes the gate pass everyone from then on. A monitor that stops clears the
/// gate's wake-up callback but does not stop the gate.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_accounts::MemoryGate;
/// use admission_core::{Amount, Demand, JobContext, Monitor};
/// use admission_accounts::MemoryZone;
/// use admission_accounts::memory_gate::ManualProbe;
/// use admission_testkit::FakeClock;
/// use admission_testkit::reference::Permits;
///
/// let probe = ManualProbe::new();
/// probe.set_percent(50);
/// let gate = Arc::new(MemoryGate::new(probe.clone()));
/// let clock = FakeClock::new();
/// let monitor = Monitor::builder().clock(clock.shared()).gate(gate.clone()).build();
/// let pool = Arc::new(Permits::new("pool", 4));
///
/// let job = Demand::new().with(pool.clone(), Amount::ONE);
/// let grant = monitor.admit_blocking(job, &JobContext::new("job"), None).unwrap();
/// assert_eq!(gate.status().zone, MemoryZone::Green);
/// drop(grant);
/// ```
pub struct MemoryGate {
    name: String,
    probe: Box<dyn MemoryProbe>,
    /// Set once by [`MemoryGate::stop`]; from then on every asker passes.
    stopped: AtomicBool,
    /// How many waiters memory holds, as the monitor last reported (see [`Gate::holding`]).
    line: AtomicUsize,
    state: Mutex<State>,
    wake: WakeSlot,
    /// How long a reading is reused on the monitor's clock (zero: only within one instant).
    max_reading_age: Duration,
}

impl MemoryGate {
    /// The memory gate's category, as a job held on it is reported.
    pub const CATEGORY: Category = Category::custom("memory");

    /// A gate named `memory` reading `probe`.
    pub fn new(probe: impl MemoryProbe) -> MemoryGate {
        MemoryGate::named("memory", probe)
    }

    /// A gate named `name` reading `probe`; the name keys the wait time of a job held here.
    pub fn named(name: impl Into<String>, probe: impl MemoryProbe) -> MemoryGate {
        let max_reading_age = probe.default_max_age();
        MemoryGate {
            name: name.into(),
            probe: Box::new(probe),
            stopped: AtomicBool::new(false),
            line: AtomicUsize::new(0),
            state: Mutex::new(State::default()),
            wake: WakeSlot::new(),
            max_reading_age,
        }
    }

    /// Reuses a reading for up to `age` on the monitor's clock instead of reading the probe at
    /// every new instant.
    ///
    /// By default the probe says ([`MemoryProbe::default_max_age`]): the real probes here reuse
    /// a reading for 5 ms, a free probe only
    /// within one instant, which is what one pass over the line sees. On the system clock every
    /// uncontended admit is a new instant, so a real probe read at every admit would cost several
    /// microseconds for a file under `/proc`; an age of a few milliseconds makes that cost vanish
    /// while the latch and the spacing still see memory move long before any of their own
    /// intervals (2 s, 50 ms) runs out.
    pub fn with_max_reading_age(mut self, age: Duration) -> MemoryGate {
        self.max_reading_age = age;
        self
    }

    /// Lets everyone through from now on, and wakes the monitor so that its line sees it.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.wake.notify();
    }

    /// True once [`MemoryGate::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The gate's status from its last reading: `CRITICAL` while latched, `DRAINING` while
    /// memory's line is non-empty, `GREEN` otherwise, with the [`spacing`](MemoryGate::spacing)
    /// at that reading (its indicator is `pace:<n>ms` outside the green zone). Reads no probe.
    pub fn status(&self) -> MemoryStatus {
        let st = self.state.lock();
        self.status_of(&st, self.line.load(Ordering::SeqCst))
    }

    /// The wait the gate would put between two releases at its last reading (curve times
    /// penalty, capped at an hour).
    pub fn spacing(&self) -> Duration {
        Self::spacing_of(&self.state.lock())
    }

    fn spacing_of(st: &State) -> Duration {
        wait(curve(st.reading.percent()), st.growth.penalty())
    }

    fn status_of(&self, st: &State, line: usize) -> MemoryStatus {
        let zone = if st.latch.is_set() {
            MemoryZone::Critical
        } else if line > 0 {
            MemoryZone::Draining
        } else {
            MemoryZone::Green
        };
        MemoryStatus {
            name: self.name.clone(),
            zone,
            used_bytes: st.reading.used,
            limit_bytes: st.reading.limit,
            floor_percent: st.growth.floor(),
            penalty: st.growth.penalty(),
            spacing: Self::spacing_of(st),
            line,
        }
    }

    /// The reading at `now`, read from the probe at most once per instant. `None` while the
    /// probe fails. Moves the floor and the latch, logging the latch's changes.
    fn read(&self, st: &mut State, now: Instant, line: usize) -> Option<MemoryReading> {
        if let Some(at) = st.read_at
            && (at == now || (at < now && now.saturating_duration_since(at) < self.max_reading_age))
        {
            return (!st.failing).then_some(st.reading);
        }
        st.read_at = Some(now);
        match self.probe.read() {
            Ok(reading) => {
                if st.failing {
                    st.failing = false;
                    tracing::info!(gate = %self.name, "memory probe reads again");
                }
                st.reading = reading;
                let percent = reading.percent();
                st.growth.observe(percent);
                match st.latch.update(percent) {
                    Some(LatchChange::Set) => {
                        let summary =
                            admission_core::AccountStatus::summary(&self.status_of(st, line));
                        tracing::warn!(%summary, "memory latch set: nothing passes");
                    }
                    Some(LatchChange::Cleared) => {
                        let summary =
                            admission_core::AccountStatus::summary(&self.status_of(st, line));
                        tracing::info!(%summary, "memory latch cleared: memory's line drains");
                    }
                    None => {}
                }
                Some(reading)
            }
            Err(error) => {
                if !st.failing {
                    st.failing = true;
                    tracing::warn!(%error, "memory probe failed: the gate passes everyone");
                }
                None
            }
        }
    }

    /// True when the asker is on memory's line or arrives while memory holds others; false for a
    /// lone arrival and for a waiter that an account holds.
    fn is_memorys(view: &GateView) -> bool {
        !view.was_held_elsewhere() && (view.was_on_gate() || view.held() > 0)
    }
}

impl Gate for MemoryGate {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        MemoryGate::CATEGORY
    }

    fn check(&self, view: GateView) -> GateAnswer {
        if self.stopped.load(Ordering::Relaxed) {
            return GateAnswer::Pass;
        }
        let now = view.now();
        let mut st = self.state.lock();
        let line = view.held() + 1;
        let Some(reading) = self.read(&mut st, now, line) else {
            return GateAnswer::Pass;
        };
        let recheck = now.saturating_add(RECHECK);
        if st.latch.is_set() {
            return GateAnswer::Hold {
                until: Some(recheck),
            };
        }
        if !Self::is_memorys(&view) || st.credit {
            return GateAnswer::Pass;
        }
        let Some(last) = st.last_release else {
            return GateAnswer::Pass;
        };
        let due = last.saturating_add(wait(curve(reading.percent()), st.growth.penalty()));
        if due <= now {
            GateAnswer::Pass
        } else {
            GateAnswer::Hold {
                until: Some(due.min(recheck)),
            }
        }
    }

    fn passed(&self, view: GateView) {
        if !Self::is_memorys(&view) || self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let mut st = self.state.lock();
        st.last_release = Some(view.now());
        st.credit = false;
        st.growth.release();
    }

    fn completed(&self) {
        if self.line.load(Ordering::SeqCst) > 0 {
            self.state.lock().credit = true;
        }
    }

    fn on_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }

    fn holding(&self, count: usize) {
        self.line.store(count, Ordering::SeqCst);
    }
}

impl fmt::Debug for MemoryGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryGate")
            .field("name", &self.name)
            .field("probe", &self.probe.name())
            .field("stopped", &self.is_stopped())
            .field("line", &self.line.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}
