//! The monitor's shared state: the line, the lifecycle, and every transition a job can make.
//!
//! Everything here that touches the line runs under the one monitor lock (`Shared::state`).
//! Events are collected while the lock is held and emitted after it is released, and parked
//! waiters are woken after it too (see [`Outbox`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::account::{Account, AccountRef, account_key};
use crate::clock::{Clock, Instant, WakeFn};
use crate::context::JobContext;
use crate::demand::Demand;
use crate::error::AdmitError;
use crate::event::{Event, EventEntry, EventKind, EventSink};
use crate::gate::{Gate, GateAnswer, GateView};
use crate::grant::Grant;
use crate::sync::{MonitorLock, Ordering, thread};

use super::ask::{Attempt, Learn, ask_demand};
use super::cell::{Cell, Outcome};
use super::doorbell::Doorbell;
use super::pass::{Arrival, Scope, before_planned};

/// Where the monitor is in its life.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    Open,
    Stopped,
    Closed(Arc<str>),
}

/// A job parked in the line.
pub(crate) struct Waiter {
    pub(crate) demand: Demand,
    pub(crate) ctx: JobContext,
    pub(crate) asked_at: Instant,
    pub(crate) timeout: Option<Duration>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) cell: Arc<Cell>,
    /// The accounts (by key; [`GATE_KEY`] for the gate) this waiter has been held on. Feeds
    /// `Held` events and `Grant::wait_times`.
    pub(crate) held: Vec<Hold>,
    /// True while the gate is what holds this waiter.
    pub(crate) on_gate: bool,
}

/// One account's hold on a waiter.
pub(crate) struct Hold {
    pub(crate) key: usize,
    /// The held entry's index in the waiter's demand; `None` for the gate. (Names are looked up
    /// only when a grant reports its waits, so holding costs no copy.)
    pub(crate) entry: Option<usize>,
    /// When the account first refused the waiter.
    pub(crate) since: Instant,
    /// When it last stopped refusing (`None` while it still refuses).
    pub(crate) until: Option<Instant>,
}

/// The key under which the gate appears in a waiter's `held` list.
pub(crate) const GATE_KEY: usize = usize::MAX;

/// A value on cache lines of its own. The monitor lock is taken by every thread that admits or
/// releases; next to the `Arc`'s reference counts (which every `Admit` and `Grant` moves) the two
/// would bounce one line between cores twice as often.
#[repr(align(128))]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// The hasher of the `watched` map, whose keys are account addresses: one multiply (Fibonacci
/// hashing, high bits first) is hash enough, and the lookup runs on every admit that parks.
#[derive(Default, Clone, Copy)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*byte)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64).wrapping_mul(FIBONACCI);
    }
}

/// 2^64 divided by the golden ratio.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// Everything under the monitor lock.
pub(crate) struct State {
    pub(crate) phase: Phase,
    /// The line, in arrival order (the key is the arrival sequence number).
    pub(crate) queue: BTreeMap<u64, Waiter>,
    pub(crate) next_seq: u64,
    pub(crate) evaluator: Option<(thread::JoinHandle<()>, thread::ThreadId)>,
    /// Accounts whose wake slot holds our doorbell, so `stop` can clear them.
    pub(crate) watched: HashMap<usize, Weak<dyn Account>, BuildHasherDefault<AddressHasher>>,
    /// The wake-up the latest pass computed (`None`: only an event helps). Some pass runs by
    /// then: the evaluator sleeps until it, or was rung to adopt it. An arrival whose own
    /// deadline is no earlier need not ring.
    pub(crate) planned_wake: Option<Instant>,
}

/// What a critical section leaves to do once the lock is released.
pub(crate) struct Outbox {
    /// `None` when no sink is installed: then no event is ever built.
    pub(crate) events: Option<Vec<Event>>,
    pub(crate) wake: Vec<Arc<Cell>>,
    /// Grants to roll back once the lock is released.
    pub(crate) discard: Vec<Grant>,
}

impl Outbox {
    pub(crate) fn push_event(&mut self, build: impl FnOnce() -> Event) {
        if let Some(events) = &mut self.events {
            events.push(build());
        }
    }
}

pub(crate) struct Shared {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) gate: Option<Arc<dyn Gate>>,
    /// The monitor lock. Only touched through `lock()`; never held while waking or emitting.
    pub(crate) state: OwnLine<MonitorLock<State>>,
    pub(crate) bell: Arc<Doorbell>,
    /// The callback installed in accounts' wake slots, the gate and the clock.
    pub(crate) kick: WakeFn,
    /// True for a monitor whose passes run only when asked (`test-util`): no evaluator.
    pub(crate) manual: bool,
    sink: parking_lot::RwLock<Option<Arc<dyn EventSink>>>,
    has_sink: std::sync::atomic::AtomicBool,
}

pub(crate) enum Begin {
    Done(Outcome),
    Parked {
        seq: u64,
        cell: Arc<Cell>,
        /// True when the evaluator must run a pass for this waiter (its first ask, or a
        /// deadline earlier than any pass already planned).
        ring: bool,
        /// When the waiter times out, on the monitor's clock.
        deadline: Option<Instant>,
    },
}

pub(crate) fn entry_events(demand_entries: &[crate::demand::Entry]) -> Vec<EventEntry> {
    demand_entries
        .iter()
        .map(|e| EventEntry {
            account: e.account().name().to_owned(),
            category: e.account().category(),
            amount: e.amount(),
        })
        .collect()
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

impl Shared {
    pub(crate) fn new(
        clock: Arc<dyn Clock>,
        gate: Option<Arc<dyn Gate>>,
        sink: Option<Arc<dyn EventSink>>,
        manual: bool,
    ) -> Arc<Shared> {
        let bell = Arc::new(Doorbell::new());
        let for_kick = bell.clone();
        let kick: WakeFn = Arc::new(move || for_kick.ring_if_waiting());
        if let Some(gate) = &gate {
            gate.on_change(Some(kick.clone()));
        }
        Arc::new(Shared {
            clock,
            gate,
            state: OwnLine(MonitorLock::new(State {
                phase: Phase::Open,
                queue: BTreeMap::new(),
                next_seq: 0,
                evaluator: None,
                watched: HashMap::default(),
                planned_wake: None,
            })),
            bell,
            kick,
            manual,
            has_sink: std::sync::atomic::AtomicBool::new(sink.is_some()),
            sink: parking_lot::RwLock::new(sink),
        })
    }

    pub(crate) fn outbox(&self) -> Outbox {
        let events = self
            .has_sink
            .load(std::sync::atomic::Ordering::Acquire)
            .then(Vec::new);
        Outbox {
            events,
            wake: Vec::new(),
            discard: Vec::new(),
        }
    }

    pub(crate) fn set_sink(&self, sink: Option<Arc<dyn EventSink>>) {
        let mut slot = self.sink.write();
        self.has_sink
            .store(sink.is_some(), std::sync::atomic::Ordering::Release);
        *slot = sink;
    }

    /// Emits the outbox's events, then wakes its waiters. Called with no lock held.
    pub(crate) fn deliver(&self, outbox: Outbox) {
        if let Some(events) = outbox.events
            && !events.is_empty()
        {
            self.emit(&events);
        }
        for cell in outbox.wake {
            cell.wake();
        }
        for mut grant in outbox.discard {
            grant.rollback();
        }
    }

    fn emit(&self, events: &[Event]) {
        let Some(sink) = self.sink.read().clone() else {
            return;
        };
        for event in events {
            let failure = match catch_unwind(AssertUnwindSafe(|| sink.emit(event))) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("the sink panicked: {}", panic_message(&*panic)),
            };
            // That event only is lost; the sink stays and hears the next one.
            tracing::warn!(%failure, kind = event.kind.as_str(), job = event.job.id, "an event sink failed; the event is lost");
        }
    }

    pub(crate) fn event(
        &self,
        kind: EventKind,
        ctx: &JobContext,
        entries: Vec<EventEntry>,
    ) -> Event {
        Event {
            kind,
            at: self.clock.now(),
            job: ctx.snapshot().clone(),
            entries,
        }
    }

    /// Fills a waiter's cell with `outcome` and schedules its wake-up.
    pub(crate) fn finish(&self, out: &mut Outbox, cell: &Arc<Cell>, outcome: Outcome) {
        if let Err(Ok(grant)) = cell.fill(outcome) {
            // Unreachable by construction (a waiter leaves the line when it is filled); if it
            // ever happened, the grant must not leak. It is rolled back once the lock is free.
            out.discard.push(grant);
        }
        out.wake.push(cell.clone());
    }

    /// Rejects with `error`, reporting it as an event.
    pub(crate) fn reject_event(
        &self,
        out: &mut Outbox,
        ctx: &JobContext,
        demand: &Demand,
        error: &AdmitError,
    ) {
        out.push_event(|| {
            self.event(
                EventKind::Rejected {
                    reason: error.reason(),
                    message: error.to_string(),
                },
                ctx,
                entry_events(demand.entries()),
            )
        });
    }

    fn phase_error(phase: &Phase) -> Option<AdmitError> {
        match phase {
            Phase::Open => None,
            Phase::Stopped => Some(AdmitError::Shutdown),
            Phase::Closed(cause) => Some(AdmitError::Closed {
                cause: cause.clone(),
            }),
        }
    }

    /// Asks for `demand`: grants it inline when the line is empty and it fits, parks it otherwise.
    pub(crate) fn begin(
        self: &Arc<Shared>,
        demand: Demand,
        ctx: &JobContext,
        timeout: Option<Duration>,
    ) -> Begin {
        let mut out = self.outbox();
        let begun = self.begin_locked(demand, ctx, timeout, &mut out);
        self.deliver(out);
        match begun {
            Begin::Done(outcome) => Begin::Done(outcome),
            Begin::Parked {
                seq,
                cell,
                ring,
                deadline,
            } => {
                if ring {
                    self.bell.ring();
                }
                Begin::Parked {
                    seq,
                    cell,
                    ring,
                    deadline,
                }
            }
        }
    }

    fn begin_locked(
        self: &Arc<Shared>,
        demand: Demand,
        ctx: &JobContext,
        timeout: Option<Duration>,
        out: &mut Outbox,
    ) -> Begin {
        if ctx.is_cancelled() {
            let error = AdmitError::Cancelled {
                job: ctx.id(),
                waited: Duration::ZERO,
            };
            self.reject_event(out, ctx, &demand, &error);
            return Begin::Done(Err(error));
        }
        if let Err(error) = demand.check_requirements() {
            self.reject_event(out, ctx, &demand, &error);
            return Begin::Done(Err(error));
        }
        let mut st = self.state.lock();
        if let Some(error) = Self::phase_error(&st.phase) {
            drop(st);
            self.reject_event(out, ctx, &demand, &error);
            return Begin::Done(Err(error));
        }
        // True when the waiter about to park is behind the gate: the gate held it on the fast
        // path, or the head of the line is held on the gate (the sharp rule, applied at arrival).
        let mut gate_held = false;
        if st.queue.is_empty() {
            // The fast path reads the clock only for a gate: an uncontended admit makes no
            // system call.
            let view = GateView {
                head: true,
                held: 0,
                now: if self.gate.is_some() {
                    self.clock.now()
                } else {
                    Instant::ZERO
                },
                on_gate: false,
                elsewhere: false,
            };
            match catch_unwind(AssertUnwindSafe(|| {
                self.take_now(&demand, ctx, view, &mut gate_held)
            })) {
                Ok(Ok(true)) => {
                    drop(st);
                    out.push_event(|| {
                        self.event(
                            EventKind::GrantedImmediate,
                            ctx,
                            entry_events(demand.entries()),
                        )
                    });
                    let grant = Grant::new(
                        demand.into_entries(),
                        self.clone(),
                        ctx.clone(),
                        Duration::ZERO,
                        crate::grant::Waits::none(),
                    );
                    return Begin::Done(Ok(grant));
                }
                Ok(Ok(false)) => {}
                Ok(Err(error)) => {
                    drop(st);
                    self.reject_event(out, ctx, &demand, &error);
                    return Begin::Done(Err(error));
                }
                Err(panic) => {
                    // Only the gate can panic out of `take_now` (accounts are guarded): a defect.
                    let cause = format!("the gate panicked: {}", panic_message(&*panic));
                    let error = self.close_locked(&mut st, out, cause);
                    drop(st);
                    self.reject_event(out, ctx, &demand, &error);
                    return Begin::Done(Err(error));
                }
            }
        }
        let now = self.clock.now();
        let deadline = timeout.map(|t| now.saturating_add(t));
        if let (Some(deadline), Some(timeout)) = (deadline, timeout)
            && deadline <= now
        {
            drop(st);
            let error = AdmitError::TimedOut {
                job: ctx.id(),
                waited: Duration::ZERO,
                timeout,
            };
            self.reject_event(out, ctx, &demand, &error);
            return Begin::Done(Err(error));
        }
        if self.gate.is_some() && !demand.is_empty() && !gate_held {
            gate_held = st.queue.values().next().is_some_and(|head| head.on_gate);
        }
        for entry in demand.entries() {
            self.watch(&mut st, entry.account());
        }
        let cell = Arc::new(Cell::new());
        let mut waiter = Waiter {
            demand,
            ctx: ctx.clone(),
            asked_at: now,
            timeout,
            deadline,
            cell: cell.clone(),
            held: Vec::new(),
            on_gate: gate_held,
        };
        // Ask for this waiter here, as the next pass would at the line's tail: an arrival costs
        // one ask, not a pass over everyone (nothing earlier in the line changed; anything that
        // did runs or rings for a pass of its own). With a gate, the evaluator asks.
        let mut ring = true;
        if self.gate.is_none() {
            // Published before the ask, so a give that the ask misses finds someone waiting and
            // runs a pass (the doorbell's argument, `doorbell.rs`).
            self.bell.parked.store(st.queue.len() + 1, Ordering::SeqCst);
            match self.arrive(&st, &mut waiter, out, now) {
                Arrival::Granted(grant) => {
                    self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
                    drop(st);
                    return Begin::Done(Ok(grant));
                }
                Arrival::Refused(error) => {
                    self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
                    drop(st);
                    self.reject_event(out, ctx, &waiter.demand, &error);
                    return Begin::Done(Err(error));
                }
                // The head could go now: whatever made it so (a give, a relaxed limit, time, its
                // own first ask) runs or rings for a pass, which will ask this waiter too.
                Arrival::Deferred => ring = false,
                Arrival::Held { due } => ring = before_planned(due, st.planned_wake),
            }
        }
        // Whoever parks has an evaluator to serve its deadline (started here at the latest).
        if let Err(error) = self.ensure_evaluator(&mut st) {
            self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
            drop(st);
            let error = AdmitError::Unserved {
                reason: error.to_string(),
            };
            self.reject_event(out, ctx, &waiter.demand, &error);
            return Begin::Done(Err(error));
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.queue.insert(seq, waiter);
        if self.gate.is_some() {
            // Without a gate the count was published before the ask, and is this already.
            self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
        }
        Begin::Parked {
            seq,
            cell,
            ring,
            deadline,
        }
    }

    /// The fast path: gate, then every account's `try_take` with nothing reserved, compensating a
    /// partial take. `Ok(false)` is "not now", with `gate_held` set when the gate said so. Account
    /// panics are refusals of this job; a gate panic unwinds to the caller.
    fn take_now(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        view: GateView,
        gate_held: &mut bool,
    ) -> Result<bool, AdmitError> {
        if demand.is_empty() {
            return Ok(true);
        }
        if let Some(gate) = &self.gate
            && let GateAnswer::Hold { .. } = gate.check(view)
        {
            *gate_held = true;
            return Ok(false);
        }
        let mut short = Vec::new();
        match ask_demand(&self.bell, demand, ctx, None, Learn::FirstShort, &mut short) {
            Attempt::Granted => {}
            Attempt::Held { .. } => return Ok(false),
            Attempt::Refused(error) => return Err(error),
        }
        if let Some(gate) = &self.gate {
            gate.passed(view);
        }
        Ok(true)
    }

    /// Installs the doorbell in `account`'s wake slot, once per account.
    fn watch(&self, st: &mut State, account: &AccountRef) {
        let key = account_key(account);
        if st.watched.contains_key(&key) {
            return;
        }
        if st.watched.len() >= 64 && st.watched.len().is_power_of_two() {
            st.watched.retain(|_, weak| weak.strong_count() > 0);
        }
        account.on_capacity_change(Some(self.kick.clone()));
        st.watched.insert(key, Arc::downgrade(account));
    }

    /// Withdraws waiter `seq` because its context was cancelled.
    pub(crate) fn cancel_waiter(&self, seq: u64) {
        let mut out = self.outbox();
        {
            let mut st = self.state.lock();
            if let Some(w) = st.queue.remove(&seq) {
                self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
                if w.on_gate {
                    self.tell_gate_holding(&st);
                }
                let error = AdmitError::Cancelled {
                    job: w.ctx.id(),
                    waited: self.clock.now().saturating_duration_since(w.asked_at),
                };
                self.reject_event(&mut out, &w.ctx, &w.demand, &error);
                self.finish(&mut out, &w.cell, Err(error));
            }
        }
        self.deliver(out);
        self.bell.ring();
    }

    /// Times waiter `seq` out if its deadline has passed on the monitor's clock: a blocking
    /// waiter's own timer calls this, so its deadline holds even between the evaluator's passes.
    pub(crate) fn expire(&self, seq: u64) {
        let mut out = self.outbox();
        let now = self.clock.now();
        let expired = {
            let mut st = self.state.lock();
            let due = st
                .queue
                .get(&seq)
                .is_some_and(|w| w.deadline.is_some_and(|d| d <= now));
            match due.then(|| st.queue.remove(&seq)).flatten() {
                Some(w) => {
                    self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
                    if w.on_gate {
                        self.tell_gate_holding(&st);
                    }
                    let error = AdmitError::TimedOut {
                        job: w.ctx.id(),
                        waited: now.saturating_duration_since(w.asked_at),
                        timeout: w.timeout.unwrap_or_default(),
                    };
                    self.reject_event(&mut out, &w.ctx, &w.demand, &error);
                    self.finish(&mut out, &w.cell, Err(error));
                    true
                }
                None => false,
            }
        };
        self.deliver(out);
        if expired {
            // What it set aside as the head is free for the next in line.
            self.bell.ring();
        }
    }

    /// Withdraws waiter `seq` because its admit was abandoned (the future dropped). Returns false
    /// when the waiter had already left the line, i.e. its outcome is in its cell.
    pub(crate) fn withdraw(&self, seq: u64) -> bool {
        let mut out = self.outbox();
        let removed = {
            let mut st = self.state.lock();
            match st.queue.remove(&seq) {
                Some(w) => {
                    self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
                    if w.on_gate {
                        self.tell_gate_holding(&st);
                    }
                    let error = AdmitError::Cancelled {
                        job: w.ctx.id(),
                        waited: self.clock.now().saturating_duration_since(w.asked_at),
                    };
                    self.reject_event(&mut out, &w.ctx, &w.demand, &error);
                    true
                }
                None => false,
            }
        };
        self.deliver(out);
        if removed {
            self.bell.ring();
        }
        removed
    }

    /// After a grant was settled: tell the gate, wake the evaluator if anyone waits, report.
    pub(crate) fn settled(
        self: &Arc<Shared>,
        entries: &[crate::demand::Entry],
        ctx: &JobContext,
        rolled_back: bool,
    ) {
        if !entries.is_empty()
            && let Some(gate) = &self.gate
        {
            gate.completed();
        }
        if self.has_sink.load(std::sync::atomic::Ordering::Acquire) {
            let event = self.event(
                EventKind::Released { rolled_back },
                ctx,
                entry_events(entries),
            );
            self.emit(std::slice::from_ref(&event));
        }
        // Hand-off: the giver grants whoever can go now on its own thread, rather than waking
        // the evaluator and leaving the waiter two context switches away (tokio's semaphore hands
        // a released permit over the same way).
        // An orchestrator's empty grant gives nothing back and completes nothing: no pass.
        if !entries.is_empty() && self.bell.someone_waiting() {
            self.evaluate_here(Scope::Released(entries));
        }
    }

    /// Runs one pass on the calling thread, then makes sure the evaluator adopts any deadline
    /// the pass computed.
    pub(crate) fn evaluate_here(self: &Arc<Shared>, scope: Scope<'_>) -> Option<Instant> {
        let mut out = self.outbox();
        let wake = self.pass_guarded(&mut out, scope);
        self.deliver(out);
        if wake.is_some() {
            self.bell.ring();
        }
        wake
    }

    /// The gate's name, as holds and events report it.
    pub(crate) fn gate_name(&self) -> &str {
        self.gate.as_ref().map_or("gate", |g| g.name())
    }

    /// Tells the gate how many waiters it holds after one left the line. Under the monitor lock.
    fn tell_gate_holding(&self, st: &State) {
        if let Some(gate) = &self.gate {
            gate.holding(st.queue.values().filter(|w| w.on_gate).count());
        }
    }

    /// Refuses every waiter with `error_for` and empties the line. Under the monitor lock.
    fn drain_locked(&self, st: &mut State, out: &mut Outbox, error: &AdmitError) {
        let queue = std::mem::take(&mut st.queue);
        self.bell.parked.store(0, Ordering::SeqCst);
        for (_, w) in queue {
            self.reject_event(out, &w.ctx, &w.demand, error);
            self.finish(out, &w.cell, Err(error.clone()));
        }
    }

    /// Takes this monitor's doorbell back from every account it watched, leaving alone a slot
    /// that another monitor sharing the account has taken over since.
    fn unwatch_locked(&self, st: &mut State) {
        for (_, weak) in st.watched.drain() {
            if let Some(account) = weak.upgrade() {
                account.forget_capacity_change(&self.kick);
            }
        }
    }

    /// Closes admission for good because of a defect; every waiter fails with the cause.
    pub(crate) fn close_locked(
        &self,
        st: &mut State,
        out: &mut Outbox,
        cause: String,
    ) -> AdmitError {
        if let Some(error) = Self::phase_error(&st.phase) {
            return error;
        }
        tracing::error!(%cause, "admission closed by a defect");
        let cause: Arc<str> = Arc::from(cause);
        st.phase = Phase::Closed(cause.clone());
        let error = AdmitError::Closed { cause };
        self.drain_locked(st, out, &error);
        self.unwatch_locked(st);
        error
    }

    /// Stops admission: refuses every waiter, clears every wake slot, joins the evaluator.
    pub(crate) fn stop(&self) {
        let mut out = self.outbox();
        let evaluator = {
            let mut st = self.state.lock();
            if matches!(st.phase, Phase::Open) {
                st.phase = Phase::Stopped;
                self.drain_locked(&mut st, &mut out, &AdmitError::Shutdown);
            }
            self.unwatch_locked(&mut st);
            st.evaluator.take()
        };
        if let Some(gate) = &self.gate {
            gate.holding(0);
            gate.on_change(None);
        }
        self.bell.ring();
        self.deliver(out);
        if let Some((handle, id)) = evaluator
            && thread::current().id() != id
        {
            let _ = handle.join();
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        matches!(self.state.lock().phase, Phase::Open)
    }
}

/// Calls into an account, turning a panic into [`AdmitError::Aborted`] and a refusal into
/// [`AdmitError::Refused`].
pub(crate) fn guarded<T>(
    account: &AccountRef,
    ctx: &JobContext,
    call: impl FnOnce() -> Result<T, crate::Refusal>,
) -> Result<T, AdmitError> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(refusal)) => Err(AdmitError::Refused {
            account: account.name().to_owned(),
            refusal,
        }),
        Err(panic) => Err(AdmitError::Aborted {
            account: account.name().to_owned(),
            job: ctx.id(),
            panic: panic_message(&*panic),
        }),
    }
}
