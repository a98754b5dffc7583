//! The shell around the state machine: the one place that locks, reads the clock, starts the
//! evaluator and wakes.
//!
//! [`Shared`] holds the [`Machine`] under the monitor lock, with the clock, the event sink and the
//! evaluator's doorbell. Every operation here has the same shape: read the clock once (lazily: an
//! admit on accounts that need no time reads none), take the lock, let the machine decide, queue
//! the events it built while the lock is still held (so that they reach the sink in the order of
//! the critical sections), let go of the lock, then carry out the rest of the [`Effects`]: hand
//! the events to the sink, wake the waiters, drop what the monitor let go of. The two ways to
//! wait live here too, [`Admit`] and the blocking call, and so does the evaluator's loop.
//!
//! One admit without a gate on an empty line takes no lock at all: its accounts are asked as the
//! head, and the published count of parked waiters (`sync.rs`) tells whether anyone parked
//! meanwhile, in which case everything is given back and the lock decides.

use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tracing::Span;

use crate::account::{AccountRef, Replenishment};
use crate::amount::Amount;
use crate::clock::{Instant, Reading, Timer, WakeFn};
use crate::context::{JobContext, LeaveOnCancel, Listener, WaiterKey};
use crate::demand::{Demand, Entry};
use crate::error::{AdmitError, StartError, TryAdmitError};
use crate::event::{Event, EventKind, EventSink};
use crate::gate::Gate;
use crate::machine::{
    self, Arrival, Arrived, Done, Effects, Events, Leaving, LineOrder, MAX_RANKS, Machine, Next,
    Notify, Passed, Place, Ranks, Remains, Scope, Whole,
};
use crate::mute::{self, wake_key};
use crate::sync::{
    AtomicBool, AtomicUsize, Condvar, MonitorGuard, MonitorLock, Mutex, Ordering, Published,
    RwLock, thread,
};

use super::grant::{Grant, Owner};

type Outcome = Result<Grant, AdmitError>;

/// What every handle, waiter and grant of one monitor shares.
pub(crate) struct Shared {
    pub(crate) clock: Arc<dyn Timer>,
    pub(crate) gate: Option<Arc<dyn Gate>>,
    /// The monitor lock, around the machine. Never held while waking or emitting.
    state: OwnLine<MonitorLock<Locked>>,
    /// True while the machine is open: the lock-free fast path's view of it. Cleared under the
    /// monitor lock, with the machine's phase.
    open: AtomicBool,
    /// How many waiters are parked, written by the machine under the lock.
    published: Arc<Published>,
    bell: Arc<Doorbell>,
    /// The callback installed in accounts' wake slots, the gate and the clock.
    kick: WakeFn,
    /// `kick`'s identity, muted while this monitor gives back what it took.
    mute: usize,
    /// True for a monitor whose passes run only when asked (`test-util`): no evaluator unless
    /// started by hand.
    manual: bool,
    sink: Sink,
    /// What the lock-free fast path must know of the priority levels.
    unlocked: Unlocking,
    /// This monitor itself, for a grant's hand-off pass (which may grant, and a grant holds
    /// its monitor): upgraded only when someone waits.
    me: Weak<Shared>,
}

/// Everything under the monitor lock.
struct Locked {
    machine: Machine,
    evaluator: Option<(thread::JoinHandle<()>, thread::ThreadId)>,
}

/// A value on cache lines of its own. The monitor lock is taken by every thread that admits or
/// releases; next to the `Arc`'s reference counts (which every `Admit` and `Grant` moves) the two
/// would bounce one line between cores twice as often.
#[repr(align(128))]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl Shared {
    pub(crate) fn new(
        clock: Arc<dyn Timer>,
        gate: Option<Arc<dyn Gate>>,
        sink: Option<Arc<dyn EventSink>>,
        manual: bool,
        pass_batch: usize,
        time_holds: bool,
        order: LineOrder,
    ) -> Arc<Shared> {
        let bell = Arc::new(Doorbell::new());
        let published = Arc::new(Published::default());
        let kick: WakeFn = {
            let (bell, published) = (bell.clone(), published.clone());
            Arc::new(move || bell.ring_if_waiting(&published))
        };
        let mute = wake_key(&kick);
        bell.rung_by(mute);
        if let Some(gate) = &gate {
            gate.on_change(Some(kick.clone()));
        }
        let machine = Machine::new(
            gate.clone(),
            kick.clone(),
            mute,
            published.clone(),
            pass_batch,
            order.clone(),
        );
        let unlocked = Unlocking {
            ranks: order.levels.map(Ranks::new),
        };
        let lock = MonitorLock::new(Locked {
            machine,
            evaluator: None,
        });
        #[cfg(any(test, feature = "test-util"))]
        let lock = if time_holds { lock.timed() } else { lock };
        let _ = time_holds;
        let shared = Arc::new_cyclic(|me| Shared {
            clock,
            gate,
            state: OwnLine(lock),
            open: AtomicBool::new(true),
            published,
            bell,
            kick,
            mute,
            manual,
            sink: Sink::new(sink),
            unlocked,
            me: me.clone(),
        });
        shared.clock.subscribe(&shared.kick);
        shared
    }

    /// No effects yet, with events built if a sink is installed now.
    fn effects(&self) -> Effects {
        Effects::new(self.sink.is_installed())
    }

    /// No events yet, built if a sink is installed now (what the lock-free paths leave).
    fn events(&self) -> Events {
        Events::new(self.sink.is_installed())
    }

    /// The monitor lock.
    fn lock(&self) -> MonitorGuard<'_, Locked> {
        self.state.lock()
    }

    /// The end of every critical section that may have changed the line: a close the machine
    /// decided clears the lock-free `open` flag, and the events built are queued for the sink in
    /// this critical section's place. Called with the lock held, just before it is let go.
    fn seal(&self, st: &Locked, fx: &mut Effects) {
        if fx.closed.is_some() && !st.machine.is_open() {
            self.open.store(false, Ordering::SeqCst);
        }
        if let Some(events) = &mut fx.events.0 {
            self.sink.queue(events);
        }
    }

    /// Carries out what a critical section left: the events to the sink (queued behind those
    /// of earlier critical sections), then the wake-ups, then what the monitor let go of.
    /// Called with no lock held.
    fn deliver(&self, fx: Effects) {
        let Effects {
            events,
            wake,
            unwatched,
            emptied,
            closed,
        } = fx;
        if let Some(cause) = closed {
            tracing::error!(%cause, "admission closed by a defect");
        }
        if events.wanted() {
            self.sink.drain();
        }
        for notify in wake {
            notify.wake();
        }
        drop(unwatched);
        drop(emptied);
    }

    /// How many waiters are parked in the line now (under the lock: exact).
    pub(crate) fn queue_size(&self) -> usize {
        self.lock().machine.len()
    }

    pub(crate) fn set_sink(&self, sink: Option<Arc<dyn EventSink>>) {
        self.sink.set(sink);
    }

    /// The gate's name, as holds and grants report it.
    pub(crate) fn gate_name(&self) -> &str {
        self.gate.as_ref().map_or("gate", |g| g.name())
    }

    // ---- arriving ----------------------------------------------------------------------------

    /// An admit's first step, before the caller has set anything up for a wait: the lock-free
    /// fast path. `Ok` when it settled the demand (granted, or refused for good); otherwise the
    /// arrival goes on in [`Shared::arrive`].
    #[inline]
    fn arrive_unlocked(
        self: &Arc<Shared>,
        demand: Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
    ) -> Result<Outcome, Unsettled> {
        let mut events = self.events();
        match self.take_unlocked(&demand, ctx, now, &mut events) {
            Unlocked::Taken => {
                self.hand_over_events(events);
                Ok(Ok(Grant::immediate(self, demand, ctx)))
            }
            Unlocked::Refused(error) => {
                self.hand_over_events(events);
                Ok(Err(error))
            }
            // Nothing settled, so nothing built: the arrival under the lock builds its own.
            Unlocked::Held(_) => Err(Unsettled {
                demand,
                asked: true,
            }),
            Unlocked::Skipped => Err(Unsettled {
                demand,
                asked: false,
            }),
        }
    }

    /// Queues and emits the events of a step that took no lock.
    fn hand_over_events(&self, mut events: Events) {
        if let Some(events) = &mut events.0 {
            self.sink.queue(events);
            self.sink.drain();
        }
    }

    /// The fast path without the monitor lock, for a monitor without a gate whose line is empty:
    /// every account asked once, as the head; taken whole or not at all.
    ///
    /// Why no lock is needed: an empty line has no head to respect. A parker publishes its count
    /// before it asks anything, and this taker reads the count again (after a fence) once it has
    /// taken everything: if anyone parked meanwhile, the take is given back, so a grant here is
    /// ordered before every waiter it could overtake (Dekker's pattern, with the accounts' own
    /// atomics in the middle). What an attempt takes and gives back because one account said
    /// "not now" is given back muted; a parker that published in the meantime may have been
    /// refused for what was given back, so the doorbell is rung for it. A stop or a close clears
    /// `open` under the lock; a grant that finds it cleared after taking gives everything back.
    /// Checked by the loom models `loom_unlocked_fast_path_racing_a_park_never_loses_the_wake_up`
    /// and `loom_unlocked_fast_path_racing_stop_grants_before_it_or_takes_nothing`.
    #[inline]
    fn take_unlocked(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
        events: &mut Events,
    ) -> Unlocked {
        let Some(rank) = self.unlocked.rank(ctx) else {
            return Unlocked::Skipped;
        };
        if self.gate.is_some()
            || !self.open.load(Ordering::SeqCst)
            || !self.published.is_empty()
            || ctx.is_cancelled()
            || demand.check_requirements().is_err()
        {
            return Unlocked::Skipped;
        }
        let aside = |account: &AccountRef| self.unlocked.aside(rank, account);
        let aside = self
            .unlocked
            .reserving()
            .then_some(&aside as &dyn Fn(&AccountRef) -> Amount);
        match machine::take_whole(self.mute, demand.entries(), ctx, aside, now) {
            Whole::Taken => {
                // Stopped or closed while taking (the locked path refuses), or someone parked
                // since the check above: that waiter is the head now, and what was just taken
                // may be what it waits for. Give it all back and let the lock decide.
                let open = self.open.load(Ordering::SeqCst);
                if !open || self.published.someone_waiting() {
                    machine::give_back(self.mute, demand.entries());
                    self.ring_for_given_back();
                    return if open {
                        Unlocked::Held(None)
                    } else {
                        Unlocked::Skipped
                    };
                }
                events.event(EventKind::GrantedImmediate, ctx, now, || {
                    machine::entry_events(demand.entries())
                });
                Unlocked::Taken
            }
            Whole::Short(first) => {
                self.ring_for_given_back();
                Unlocked::Held(Some(first))
            }
            Whole::Refused(error) => {
                self.ring_for_given_back();
                events.rejected(ctx, demand, &error, now);
                Unlocked::Refused(*error)
            }
        }
    }

    /// After a lock-free attempt gave back (muted) what it took: a waiter that parked meanwhile
    /// may have been refused for it, so it gets the pass the give would have rung for.
    #[cold]
    fn ring_for_given_back(&self) {
        if self.published.someone_waiting() {
            self.bell.ring();
        }
    }

    /// The rest of an arrival, under the lock: granted or refused, or parked with `notify` to
    /// be woken. A parked waiter's place is written to `parked` before anything that could
    /// unwind (an event sink, a waker): a caller that unwinds with `parked` set still withdraws.
    fn arrive(
        self: &Arc<Shared>,
        unsettled: Unsettled,
        ctx: &JobContext,
        timeout: Option<Duration>,
        notify: Notify,
        now: &Reading<'_>,
        parked: &mut Option<Place>,
    ) -> Begin {
        let Unsettled { demand, asked } = unsettled;
        let mut fx = self.effects();
        let arrival = Arrival {
            demand,
            ctx,
            timeout,
            asked,
            notify,
        };
        let (begun, ring, dropped) = {
            let mut st = self.lock();
            let arrived = st.machine.arrive(arrival, now, &mut fx);
            let begun = match arrived {
                Arrived::Granted { demand, ring } => (Begin::Granted(demand), ring, None),
                Arrived::Refused { demand, error } => (Begin::Refused(error), false, Some(demand)),
                Arrived::Parked {
                    place,
                    deadline,
                    ring,
                } => match self.serve(&mut st) {
                    Ok(()) => (Begin::Parked { place, deadline }, ring, None),
                    Err(error) => {
                        let error = AdmitError::Unserved {
                            reason: error.to_string(),
                        };
                        let demand = st.machine.unserved(place, &error, now, &mut fx);
                        (Begin::Refused(error), false, demand)
                    }
                },
            };
            self.seal(&st, &mut fx);
            begun
        };
        if let Begin::Parked { place, .. } = begun {
            *parked = Some(place);
        }
        self.deliver(fx);
        drop(dropped);
        if ring {
            self.bell.ring();
        }
        begun
    }

    /// Makes sure a waiter that just parked has an evaluator to serve its deadline: starts it
    /// unless it runs or the monitor's passes are manual (`test-util`). Under the monitor lock.
    fn serve(self: &Arc<Shared>, st: &mut Locked) -> Result<(), StartError> {
        if self.manual {
            return Ok(());
        }
        self.spawn_evaluator(st)
    }

    /// Takes `demand` now or not at all, never parking (`Monitor::try_admit`): without the lock
    /// when it can be, else under it with the line empty.
    pub(crate) fn try_take(&self, demand: &Demand, ctx: &JobContext) -> Result<(), TryAdmitError> {
        let now = Reading::new(&*self.clock);
        let mut events = self.events();
        let taken = match self.take_unlocked(demand, ctx, &now, &mut events) {
            Unlocked::Taken => Ok(()),
            Unlocked::Refused(error) => Err(error.into()),
            Unlocked::Held(short) => match machine::refusal_of(demand.entries(), ctx, &now)
                .or_else(|| self.unlocked.never_beside_reserves(demand, ctx, &now))
            {
                // The fast path stopped at the first "not now"; a later account's "never" wins.
                Some(error) => {
                    events.rejected(ctx, demand, &error, &now);
                    Err(error.into())
                }
                None => Err(TryAdmitError::WouldWait {
                    job: ctx.id(),
                    waiting: 0,
                    short: short.map(|i| demand.entries()[i].account().name().to_owned()),
                }),
            },
            Unlocked::Skipped => {
                let mut fx = Effects {
                    events,
                    ..Effects::default()
                };
                let taken = {
                    let mut st = self.lock();
                    let taken = st.machine.try_take(demand, ctx, &now, &mut fx);
                    self.seal(&st, &mut fx);
                    taken
                };
                self.deliver(fx);
                return taken;
            }
        };
        self.hand_over_events(events);
        taken
    }

    // ---- passes ------------------------------------------------------------------------------

    /// The evaluator's pass: `None` once the monitor is no longer open (the evaluator ends),
    /// else the instant to wake at.
    fn evaluate(self: &Arc<Shared>) -> Option<Option<Instant>> {
        let now = Reading::new(&*self.clock);
        let wake = self.pass_guarded(Scope::Full, &now);
        self.open.load(Ordering::SeqCst).then_some(wake)
    }

    /// Runs one pass on the calling thread at `now`, then makes sure the evaluator adopts any
    /// deadline the pass computed.
    fn evaluate_here(self: &Arc<Shared>, scope: Scope<'_>, now: &Reading<'_>) -> Option<Instant> {
        let wake = self.pass_guarded(scope, now);
        if wake.is_some() {
            self.bell.ring();
        }
        wake
    }

    /// Runs one full pass now, as the evaluator would (the `test-util` hook `pass_now`).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn pass_now(self: &Arc<Shared>) -> Option<Instant> {
        let now = Reading::new(&*self.clock);
        self.pass_guarded(Scope::Full, &now)
    }

    /// [`Shared::pass`], closing admission if the pass fails: a panic outside the accounts (which
    /// are guarded one by one) is a defect in the monitor or its gate.
    fn pass_guarded(self: &Arc<Shared>, scope: Scope<'_>, now: &Reading<'_>) -> Option<Instant> {
        match catch_unwind(AssertUnwindSafe(|| self.pass(scope, now))) {
            Ok(wake) => wake,
            Err(panic) => {
                let cause = format!("a pass failed: {}", machine::panic_message(&*panic));
                let mut fx = self.effects();
                {
                    let mut st = self.lock();
                    st.machine.close(cause, now, &mut fx);
                    self.seal(&st, &mut fx);
                }
                self.deliver(fx);
                None
            }
        }
    }

    /// One pass over the line: the instant to wake at (`None`: until rung). A pass that another
    /// thread's pass waited on (it left a note while this one was paused between batches) walks
    /// the line again from the start, once on this thread and after that by the evaluator, so
    /// that no thread keeps doing others' passes.
    fn pass(self: &Arc<Shared>, scope: Scope<'_>, now: &Reading<'_>) -> Option<Instant> {
        let (wake, again) = self.walk(scope, now);
        if !again {
            return wake;
        }
        let now = Reading::new(&*self.clock);
        let (wake, again) = self.walk(Scope::Full, &now);
        if again {
            self.bell.ring();
        }
        wake
    }

    /// One walk of the line, in batches: between two, the lock is let go (fairly) while what
    /// the batch decided is carried out, and arrivals and tries get in.
    fn walk(&self, scope: Scope<'_>, now: &Reading<'_>) -> (Option<Instant>, bool) {
        let contended = || self.state.contended();
        let mut fx = self.effects();
        let mut st = self.lock();
        let mut passed = st.machine.pass(scope, now, &mut fx, &contended);
        while let Passed::Paused = passed {
            self.seal(&st, &mut fx);
            let batch = std::mem::replace(&mut fx, self.effects());
            st.unlocked_fair(|| self.deliver(batch));
            passed = st.machine.resume(now, &mut fx, &contended);
        }
        self.seal(&st, &mut fx);
        drop(st);
        self.deliver(fx);
        match passed {
            Passed::Done { wake, again } => (wake, again),
            Passed::Paused => unreachable!("resumed above"),
        }
    }

    // ---- leaving -----------------------------------------------------------------------------

    /// Withdraws the waiter at `place` because its context was cancelled.
    pub(crate) fn cancel_waiter(&self, place: Place) {
        let _ = self.leave_line(place, Leaving::Cancelled);
    }

    /// Times the waiter at `place` out if its deadline has passed on the monitor's clock: a
    /// blocking waiter's own timer calls this, so its deadline holds even between the
    /// evaluator's passes.
    pub(crate) fn expire(&self, place: Place) {
        let _ = self.leave_line(place, Leaving::Expired);
    }

    /// Withdraws the waiter at `place` because its owner is going away. `Some` when its decision
    /// had landed first: a grant in it is the caller's to roll back.
    fn withdraw(&self, place: Place) -> Option<Done> {
        match self.leave_line(place, Leaving::Abandoned) {
            Remains::Decided(done) => Some(done),
            Remains::Nothing | Remains::Record(_) => None,
        }
    }

    /// Takes the waiter at `place` out of the line for `why` (see [`Machine::leave`]), then does
    /// what its leaving asks: a pass on this thread, or a ring for the evaluator.
    fn leave_line(&self, place: Place, why: Leaving) -> Remains {
        let now = Reading::new(&*self.clock);
        let mut fx = self.effects();
        let left = {
            let mut st = self.lock();
            let left = st.machine.leave(place, why, &now, &mut fx);
            self.seal(&st, &mut fx);
            left
        };
        self.deliver(fx);
        match left.next {
            Next::Nothing => {}
            Next::Ring => self.bell.ring(),
            Next::Pass(demand) => {
                if let Some(me) = self.me.upgrade() {
                    me.evaluate_here(Scope::Released(demand.entries()), &now);
                }
            }
            Next::FullPass => {
                if let Some(me) = self.me.upgrade() {
                    me.evaluate_here(Scope::Full, &now);
                }
            }
        }
        left.remains
    }

    /// The decision kept for the waiter at `place`, collected; `None` while it waits.
    fn collect(&self, place: Place) -> Option<Done> {
        let mut fx = Effects::new(false);
        let done = self.lock().machine.collect(place, &mut fx);
        drop(fx);
        done
    }

    /// The waiter at `place`'s decision if it is there; otherwise `waker` is remembered to wake
    /// it. Nothing of the caller's runs under the monitor lock: a new waker is cloned before the
    /// lock is taken again to store it, and the waker it replaces is dropped after the lock is
    /// released (a waker may own its task's state, a grant among it, whose drop runs a pass).
    fn poll_decision(&self, place: Place, waker: &Waker) -> Option<Done> {
        let mut fx = Effects::new(false);
        {
            let mut st = self.lock();
            if let Some(done) = st.machine.collect(place, &mut fx) {
                drop(st);
                drop(fx);
                return Some(done);
            }
            if let Some(Notify::Task(stored)) = st.machine.notify_mut(place)
                && stored.will_wake(waker)
            {
                return None;
            }
        }
        // A new waker (the task moved, or the first poll of a waiter that parked without one):
        // cloned with no lock of ours held.
        let new = Notify::Task(waker.clone());
        let (done, replaced) = {
            let mut st = self.lock();
            match st.machine.collect(place, &mut fx) {
                // Decided meanwhile: the clone is not needed.
                Some(done) => (Some(done), new),
                None => match st.machine.notify_mut(place) {
                    Some(notify) => (None, std::mem::replace(notify, new)),
                    None => (None, new),
                },
            }
        };
        drop(replaced);
        drop(fx);
        done
    }

    // ---- starting and stopping -----------------------------------------------------------------

    /// [`Monitor::start`](crate::Monitor::start): starts the evaluator if it is not running, in
    /// every monitor (one with manual passes too: a test may want its real thread).
    pub(crate) fn start(self: &Arc<Shared>) -> Result<(), StartError> {
        let mut st = self.lock();
        self.spawn_evaluator(&mut st)
    }

    fn spawn_evaluator(self: &Arc<Shared>, st: &mut Locked) -> Result<(), StartError> {
        if !st.machine.is_open() {
            return Err(StartError::Stopped);
        }
        if st.evaluator.is_some() {
            return Ok(());
        }
        let shared = self.clone();
        let body = move || run_evaluator(&shared.bell, &*shared.clock, || shared.evaluate());
        let handle = thread::spawn("admission-evaluator", body)
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        let id = handle.thread().id();
        st.evaluator = Some((handle, id));
        Ok(())
    }

    /// Stops admission: refuses every waiter, takes back its wake-ups, joins the evaluator.
    pub(crate) fn stop(&self) {
        let now = Reading::new(&*self.clock);
        let mut fx = self.effects();
        let evaluator = {
            let mut st = self.lock();
            if st.machine.stop(&now, &mut fx) {
                self.open.store(false, Ordering::SeqCst);
            }
            self.seal(&st, &mut fx);
            st.evaluator.take()
        };
        if let Some(gate) = &self.gate {
            gate.holding(0);
            gate.on_change(None);
        }
        self.bell.ring();
        self.deliver(fx);
        if let Some((handle, id)) = evaluator
            && thread::current().id() != id
        {
            let _ = handle.join();
        }
    }

    /// Whether the evaluator thread is running (for the models).
    #[cfg(all(test, admission_loom))]
    pub(crate) fn has_evaluator(&self) -> bool {
        self.lock().evaluator.is_some()
    }

    /// Whether something rang the doorbell since the last call; clears it (`test-util`).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn take_ring(&self) -> bool {
        self.bell.take_ring()
    }

    /// The monitor lock's hold times (`test-util`).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn take_lock_holds(&self) -> Option<crate::sync::LockHolds> {
        self.state.take_hold_times()
    }
}

/// What the lock-free fast path must know of the priority levels: a job's rank, and the
/// reserves an ask on an empty line leaves aside (those kept always).
struct Unlocking {
    /// The levels (`None`: none).
    ranks: Option<Ranks>,
}

impl Unlocking {
    /// The rank of `ctx`'s level (0 without levels); `None` for a level there is not, left to
    /// the lock, which refuses it.
    #[inline]
    fn rank(&self, ctx: &JobContext) -> Option<u8> {
        match &self.ranks {
            None => Some(0),
            Some(ranks) => ranks.rank(ctx).ok(),
        }
    }

    /// What a job of `rank` leaves aside on `account` when nobody waits.
    fn aside(&self, rank: u8, account: &AccountRef) -> Amount {
        self.ranks.as_ref().map_or(Amount::ZERO, |ranks| {
            ranks.aside(rank, account, &[0; MAX_RANKS], true)
        })
    }

    /// The refusal of a demand that can never fit beside the reserves other levels always keep
    /// (`None` without levels, or for a level there is not: the lock refuses that).
    fn never_beside_reserves(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
    ) -> Option<AdmitError> {
        let ranks = self.ranks.as_ref()?;
        let rank = ranks.rank(ctx).ok()?;
        ranks.never_beside_reserves(demand, ctx, rank, now)
    }

    /// Whether any level reserves anything.
    #[inline]
    fn reserving(&self) -> bool {
        self.ranks.as_ref().is_some_and(Ranks::reserving)
    }
}

/// What the lock-free fast path made of a demand.
enum Unlocked {
    /// Taken whole.
    Taken,
    /// Refused for good (an account's "never"); the rejection is among the effects.
    Refused(AdmitError),
    /// Not now: nothing taken; the first entry short, when known.
    Held(Option<usize>),
    /// Not asked: the lock decides (a gate, a line, a phase, a cancelled job, a requirement).
    Skipped,
}

/// An arrival the lock-free fast path could not settle: the demand, and whether an account was
/// asked already.
struct Unsettled {
    demand: Demand,
    asked: bool,
}

/// What an arrival under the lock made of a job.
enum Begin {
    /// Granted inline: the demand is the grant's.
    Granted(Demand),
    Refused(AdmitError),
    /// Parked in the line.
    Parked {
        place: Place,
        /// When the waiter times out, on the monitor's clock.
        deadline: Option<Instant>,
    },
}

impl Begin {
    /// The outcome of an arrival settled at once (not parked).
    fn settled(
        self,
        shared: &Arc<Shared>,
        ctx: &JobContext,
    ) -> Result<Outcome, (Place, Option<Instant>)> {
        match self {
            Begin::Granted(demand) => Ok(Ok(Grant::immediate(shared, demand, ctx))),
            Begin::Refused(error) => Ok(Err(error)),
            Begin::Parked { place, deadline } => Err((place, deadline)),
        }
    }
}

/// A decision collected, as its owner sees it: a grant owned by `shared`, or the refusal.
fn outcome_of(shared: &Arc<Shared>, done: Done, ctx: &JobContext) -> Outcome {
    let Done { demand, outcome } = done;
    match outcome {
        Ok(waits) => Ok(Grant::new(demand, shared.clone(), ctx.clone(), waits)),
        Err(error) => Err(error),
    }
}

/// A cancelled job's waiter leaves the line: the listener its ticket registered on the job's
/// context names it by its place.
impl LeaveOnCancel for Shared {
    fn leave_on_cancel(&self, waiter: WaiterKey) {
        if let Some(place) = Place::of_waiter_key(waiter) {
            self.cancel_waiter(place);
        }
    }
}

impl Owner for Shared {
    /// Gives a grant back and lets the line know: the gate hears of the completion, the sink of
    /// the release, and whoever can go now is granted on this thread (a direct hand-off, as
    /// tokio's semaphore hands a released permit over, rather than waking the evaluator and
    /// leaving the waiter two context switches away). That pass may stop early: see
    /// [`Scope::Released`]. The release's one reading of the clock, if any, is shared by its
    /// event and its pass.
    fn settle(&self, entries: &[Entry], ctx: &JobContext, rolled_back: bool) {
        // The pass below covers every waiter these gives could free, so the accounts' own
        // wake-ups to this monitor stay quiet meanwhile instead of waking the evaluator for
        // nothing.
        let muted = mute::Muted::on(self.mute);
        for entry in entries {
            if rolled_back || entry.account().replenishment() == Replenishment::Release {
                entry.account().give(entry.amount());
            }
        }
        drop(muted);
        if !entries.is_empty()
            && let Some(gate) = &self.gate
        {
            gate.completed();
        }
        let now = Reading::new(&*self.clock);
        if self.sink.is_installed() {
            let mut events = self.events();
            events.event(EventKind::Released { rolled_back }, ctx, &now, || {
                machine::entry_events(entries)
            });
            self.hand_over_events(events);
        }
        // An orchestrator's empty grant gives nothing back and completes nothing: no pass.
        if !entries.is_empty()
            && self.published.someone_waiting()
            && let Some(me) = self.me.upgrade()
        {
            me.evaluate_here(Scope::Released(entries), &now);
        }
    }

    fn gate_name(&self) -> &str {
        Shared::gate_name(self)
    }

    fn to_shared(&self) -> Arc<dyn Owner> {
        // A borrowed grant borrows a `Monitor`, which holds this `Shared` alive.
        self.me
            .upgrade()
            .expect("a borrowed grant's monitor is alive")
    }
}

// ---- the evaluator and its doorbell ----------------------------------------------------------

/// The evaluator's doorbell.
///
/// A ring sets a flag and, only if the flag was clear, signals the condition variable; the
/// evaluator clears the flag before each pass, so a ring during a pass causes one more pass and
/// none is lost. The monitor's wake-up (installed in the accounts) rings only when someone is
/// parked, so an account's give on an idle monitor costs a fence and a load, not a thread
/// wake-up (why that loses nothing: `sync.rs`).
struct Doorbell {
    /// The identity of the monitor's wake-up, muted on a thread giving back a grant of this
    /// monitor (that thread runs the pass itself).
    mute: AtomicUsize,
    rung: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Doorbell {
    fn new() -> Doorbell {
        Doorbell {
            mute: AtomicUsize::new(0),
            rung: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Names the identity of the wake-up that rings this bell.
    fn rung_by(&self, mute: usize) {
        self.mute.store(mute, Ordering::Relaxed);
    }

    /// Wakes the evaluator for one more pass.
    fn ring(&self) {
        if !self.rung.swap(true, Ordering::SeqCst) {
            drop(self.lock.lock());
            self.cv.notify_one();
        }
    }

    /// Rings only if someone is parked, and not while this thread is handing back a grant of
    /// this same monitor (it runs the pass itself).
    fn ring_if_waiting(&self, published: &Published) {
        if mute::muted() == self.mute.load(Ordering::Relaxed) {
            return;
        }
        if published.someone_waiting() {
            self.ring();
        }
    }

    /// Whether the doorbell was rung since the last call; clears it.
    #[cfg(any(test, feature = "test-util"))]
    fn take_ring(&self) -> bool {
        self.rung.swap(false, Ordering::SeqCst)
    }

    /// Clears the flag before a pass; a ring after this causes another pass.
    fn answer(&self) {
        self.rung.swap(false, Ordering::AcqRel);
    }

    /// Sleeps until rung or until `deadline` on `clock` (never, for `None`).
    fn sleep(&self, clock: &dyn Timer, deadline: Option<Instant>) {
        let guard = self.lock.lock();
        if self.rung.load(Ordering::SeqCst) {
            return;
        }
        match deadline.map(|d| clock.real_wait(d)) {
            None | Some(None) => drop(self.cv.wait(guard)),
            Some(Some(wait)) if wait == Duration::ZERO => {}
            Some(Some(wait)) => drop(self.cv.wait_for(guard, wait)),
        }
    }
}

/// The evaluator's loop: answer the bell, run `pass`, sleep until rung or until the instant the
/// pass asked to be woken at. Returns when `pass` says the monitor is no longer open (`None`).
///
/// The thread starts with the first waiter that parks (or at `Monitor::start`), so no parked
/// waiter ever depends on a pass that nobody runs; a monitor that grants everything inline never
/// starts it.
fn run_evaluator(
    bell: &Doorbell,
    clock: &dyn Timer,
    mut pass: impl FnMut() -> Option<Option<Instant>>,
) {
    loop {
        bell.answer();
        let Some(wake) = pass() else {
            return;
        };
        bell.sleep(clock, wake);
    }
}

// ---- the event sink --------------------------------------------------------------------------

/// The monitor's event sink, swappable at any time.
///
/// Events reach the sink in the order of the critical sections that built them: each critical
/// section queues its events before it lets go of the lock ([`Shared::seal`]), and one thread at
/// a time hands the queue to the sink ([`Sink::drain`]). A thread that finds another handing
/// events over leaves its own to that one and goes on, so a slow sink delays events but never an
/// admission, and a sink may call into its monitor. A caller's events have reached the sink when
/// its operation returns unless another thread was handing events over at that moment.
struct Sink {
    sink: RwLock<Option<Arc<dyn EventSink>>>,
    /// Whether a sink is installed: read without the lock by every operation.
    installed: AtomicBool,
    /// Events built and not yet handed to the sink, in the order of their critical sections. A
    /// leaf lock: taken under the monitor lock, and nothing is taken under it.
    queue: Mutex<Vec<Event>>,
    /// Held by the one thread handing the queue to the sink.
    turn: Mutex<()>,
}

impl Sink {
    fn new(sink: Option<Arc<dyn EventSink>>) -> Sink {
        Sink {
            installed: AtomicBool::new(sink.is_some()),
            sink: RwLock::new(sink),
            queue: Mutex::new(Vec::new()),
            turn: Mutex::new(()),
        }
    }

    fn is_installed(&self) -> bool {
        self.installed.load(Ordering::Acquire)
    }

    /// Queues `events` behind those already queued.
    fn queue(&self, events: &mut Vec<Event>) {
        if !events.is_empty() {
            self.queue.lock().append(events);
        }
    }

    /// Hands every queued event to the sink, in order, one thread at a time (see the type's
    /// documentation); the one handing over looks at the queue again after giving up its turn,
    /// so nothing queued meanwhile is left behind.
    fn drain(&self) {
        loop {
            let Some(turn) = self.turn.try_lock() else {
                return;
            };
            loop {
                let batch = std::mem::take(&mut *self.queue.lock());
                if batch.is_empty() {
                    break;
                }
                self.emit(&batch);
            }
            drop(turn);
            if self.queue.lock().is_empty() {
                return;
            }
        }
    }

    /// Installs or removes the sink; the one it replaces is dropped after the lock is released.
    fn set(&self, sink: Option<Arc<dyn EventSink>>) {
        let replaced = {
            let mut slot = self.sink.write();
            self.installed.store(sink.is_some(), Ordering::Release);
            std::mem::replace(&mut *slot, sink)
        };
        drop(replaced);
    }

    /// Hands each event to the sink. A sink that fails or panics loses that event only.
    fn emit(&self, events: &[Event]) {
        let Some(sink) = self.sink.read().clone() else {
            return;
        };
        for event in events {
            let failure = match catch_unwind(AssertUnwindSafe(|| sink.emit(event))) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("the sink panicked: {}", machine::panic_message(&*panic)),
            };
            tracing::warn!(
                %failure,
                kind = event.kind.as_str(),
                job = event.job.id,
                "an event sink failed; the event is lost"
            );
        }
    }
}

// ---- the two ways to wait ----------------------------------------------------------------------

/// What a waiter keeps while it may be in the line: its place, and the cancellation listener it
/// registered on its job's context once parked. (A job granted at once keeps nothing.)
#[derive(Default)]
struct Ticket {
    /// Where the waiter stands; `Some` from the moment it parked until it has collected its
    /// decision or withdrawn.
    place: Option<Place>,
    /// The context the cancellation listener is registered on, and its key; forgotten when the
    /// wait ends.
    listener: Option<(JobContext, u64)>,
}

impl Ticket {
    /// Called once the waiter is parked: cancelling its job takes it out of the line.
    fn listen(&mut self, shared: &Arc<Shared>, ctx: &JobContext) {
        let Some(place) = self.place else { return };
        let line: Weak<dyn LeaveOnCancel> = Arc::downgrade(shared) as Weak<Shared>;
        match ctx.on_cancel(Listener::Leave(line, place.waiter_key())) {
            Some(key) => self.listener = Some((ctx.clone(), key)),
            // Cancelled between asking and parking.
            None => shared.cancel_waiter(place),
        }
    }

    /// Forgets the cancellation listener, if one was registered.
    fn forget_listener(&mut self) {
        if let Some((ctx, key)) = self.listener.take() {
            ctx.forget(key);
        }
    }

    /// The decision was collected: the wait is over.
    fn settle(&mut self) {
        self.forget_listener();
        self.place = None;
    }

    /// The waiter goes away without its decision (a dropped future, an unwinding call): it
    /// leaves the line, and a grant that landed meanwhile is given back in full.
    fn leave(&mut self, shared: &Arc<Shared>, ctx: &JobContext) {
        self.forget_listener();
        if let Some(place) = self.place.take()
            && let Some(done) = shared.withdraw(place)
            && let Ok(mut grant) = outcome_of(shared, done, ctx)
        {
            grant.rollback();
        }
    }
}

/// The blocking call's waiter: a ticket that leaves the line if the call unwinds before its
/// decision is collected.
struct Blocked<'a> {
    shared: &'a Arc<Shared>,
    ctx: &'a JobContext,
    ticket: Ticket,
}

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.ticket.leave(self.shared, self.ctx);
    }
}

/// [`Monitor::admit_blocking`](crate::Monitor::admit_blocking).
pub(crate) fn admit_blocking(
    shared: &Arc<Shared>,
    demand: Demand,
    ctx: &JobContext,
    timeout: Option<Duration>,
) -> Outcome {
    let span = AdmissionSpan::begin(ctx, &demand);
    let _entered = span.span().enter();
    let now = Reading::new(&*shared.clock);
    // The fast path first: a job granted at once sets nothing up for a wait.
    let outcome = match shared.arrive_unlocked(demand, ctx, &now) {
        Ok(outcome) => outcome,
        Err(unsettled) => arrive_and_wait(shared, unsettled, ctx, timeout, &now),
    };
    span.end(&outcome);
    outcome
}

/// The rest of a blocking admit the fast path did not settle: the arrival under the lock, and
/// the wait if it parks. Out of line, so the fast path's frame stays small.
#[inline(never)]
fn arrive_and_wait(
    shared: &Arc<Shared>,
    unsettled: Unsettled,
    ctx: &JobContext,
    timeout: Option<Duration>,
    now: &Reading<'_>,
) -> Outcome {
    let mut blocked = Blocked {
        shared,
        ctx,
        ticket: Ticket::default(),
    };
    let notify = Notify::Thread(thread::current());
    let begun = shared.arrive(
        unsettled,
        ctx,
        timeout,
        notify,
        now,
        &mut blocked.ticket.place,
    );
    match begun.settled(shared, ctx) {
        Ok(outcome) => outcome,
        Err((place, deadline)) => {
            blocked.ticket.listen(shared, ctx);
            let done = wait_until(shared, place, deadline);
            blocked.ticket.settle();
            outcome_of(shared, done, ctx)
        }
    }
}

/// Waits for a blocking waiter's decision. Its deadline is kept by its own timer as well as by
/// the evaluator: when the clock says the deadline has passed, the waiter times itself out.
fn wait_until(shared: &Shared, place: Place, deadline: Option<Instant>) -> Done {
    loop {
        if let Some(done) = shared.collect(place) {
            return done;
        }
        // `None`: real time does not move this clock (a fake one); its passes keep the deadline.
        match deadline.map(|d| shared.clock.real_wait(d)) {
            None | Some(None) => thread::park(),
            // Due: leave the line unless a decision got there first; either way one is coming.
            Some(Some(wait)) if wait.is_zero() => shared.expire(place),
            Some(Some(wait)) => thread::park_timeout(wait),
        }
    }
}

enum State {
    Init {
        demand: Demand,
        ctx: JobContext,
        timeout: Option<Duration>,
    },
    Waiting {
        ctx: JobContext,
        ticket: Ticket,
    },
    Done,
}

/// The future returned by [`Monitor::admit`](crate::Monitor::admit).
///
/// It does nothing until first polled; then it is granted at once, refused at once, or parks in
/// the line and completes when a pass grants or refuses it. It holds no more than its job and
/// its place while it waits: the line keeps the waiter's record.
///
/// # Cancel safety
///
/// Dropping the future withdraws the waiter from the line. If a grant landed concurrently, it is
/// rolled back (everything returned, metered debits included): an abandoned admit never keeps a
/// permit.
#[must_use = "futures do nothing unless polled"]
pub struct Admit {
    shared: Arc<Shared>,
    state: State,
    /// The admission's `tracing` span, from the first poll on.
    span: Option<AdmissionSpan>,
}

impl Admit {
    pub(crate) fn new(
        shared: Arc<Shared>,
        demand: Demand,
        ctx: JobContext,
        timeout: Option<Duration>,
    ) -> Admit {
        Admit {
            shared,
            state: State::Init {
                demand,
                ctx,
                timeout,
            },
            span: None,
        }
    }

    /// The first poll: the fast path, then the arrival under the lock.
    fn begin(&mut self, waker: &Waker) -> Poll<Outcome> {
        let State::Init {
            demand,
            ctx,
            timeout,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            unreachable!("called in the initial state")
        };
        let span = self.span.insert(AdmissionSpan::begin(&ctx, &demand));
        let _entered = span.span().enter();
        let now = Reading::new(&*self.shared.clock);
        let unsettled = match self.shared.arrive_unlocked(demand, &ctx, &now) {
            Ok(outcome) => {
                span.end(&outcome);
                return Poll::Ready(outcome);
            }
            Err(unsettled) => unsettled,
        };
        let mut ticket = Ticket::default();
        let notify = Notify::Task(waker.clone());
        let begun = self
            .shared
            .arrive(unsettled, &ctx, timeout, notify, &now, &mut ticket.place);
        match begun.settled(&self.shared, &ctx) {
            Ok(outcome) => {
                span.end(&outcome);
                Poll::Ready(outcome)
            }
            Err(_) => {
                ticket.listen(&self.shared, &ctx);
                self.state = State::Waiting { ctx, ticket };
                Poll::Pending
            }
        }
    }
}

impl Future for Admit {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            State::Init { .. } => this.begin(cx.waker()),
            State::Waiting { ctx, ticket } => {
                let place = ticket.place.expect("a waiting admit has a place");
                match this.shared.poll_decision(place, cx.waker()) {
                    Some(done) => {
                        ticket.settle();
                        let outcome = outcome_of(&this.shared, done, ctx);
                        this.state = State::Done;
                        if let Some(span) = &this.span {
                            span.end(&outcome);
                        }
                        Poll::Ready(outcome)
                    }
                    None => Poll::Pending,
                }
            }
            State::Done => panic!("`Admit` polled after completion"),
        }
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        if let State::Waiting { ctx, ticket } = &mut self.state {
            ticket.leave(&self.shared, ctx);
            if let Some(span) = &self.span {
                span.abandon();
            }
        }
    }
}

impl fmt::Debug for Admit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Init { .. } => "init",
            State::Waiting { .. } => "waiting",
            State::Done => "done",
        };
        f.debug_struct("Admit").field("state", &state).finish()
    }
}

// ---- the admission's span ----------------------------------------------------------------------

/// One `tracing` span per admission (`admit`, `admit_blocking`): target `admission`, name `admit`,
/// level DEBUG, with the job (`job_id`, `job_name`, `tenant`, `level`), the accounts asked of (`accounts`,
/// their names in demand order), and, once it ends, how long it waited (`waited_ms`: on the
/// monitor's clock for a grant, a timeout or a cancellation, as the grant or the error says; on
/// the system clock otherwise) and its `outcome` (`granted`, `abandoned` for a future dropped
/// while it waited, or the refusal's reason). An admission granted or refused at once has a span
/// too.
///
/// A span costs one check of the dispatcher's interest when nothing listens at that level, and
/// nothing more: the accounts' names are joined, and the clock read, only for an enabled span.
struct AdmissionSpan {
    span: Span,
    began: Option<std::time::Instant>,
}

impl AdmissionSpan {
    /// The span of `ctx`'s admission of `demand`, begun now.
    fn begin(ctx: &JobContext, demand: &Demand) -> AdmissionSpan {
        let job = ctx.snapshot();
        let span = tracing::debug_span!(
            target: "admission",
            "admit",
            job_id = job.id,
            job_name = &*job.name,
            tenant = job.tenant.as_deref(),
            level = job.level.as_deref(),
            accounts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if span.is_disabled() {
            return AdmissionSpan { span, began: None };
        }
        let accounts = demand
            .entries()
            .iter()
            .map(|entry| entry.account().name())
            .collect::<Vec<_>>()
            .join(",");
        span.record("accounts", accounts.as_str());
        AdmissionSpan {
            span,
            began: Some(std::time::Instant::now()),
        }
    }

    /// The span itself, to enter while the admission runs.
    fn span(&self) -> &Span {
        &self.span
    }

    /// Records how `outcome` ended the admission.
    fn end(&self, outcome: &Outcome) {
        let waited = match outcome {
            Ok(grant) => Some(grant.wall_wait()),
            Err(AdmitError::TimedOut { waited, .. } | AdmitError::Cancelled { waited, .. }) => {
                Some(*waited)
            }
            Err(_) => None,
        };
        let outcome = match outcome {
            Ok(_) => "granted",
            Err(error) => error.reason().as_str(),
        };
        self.finish(outcome, waited);
    }

    /// Records that the admission was given up while it waited (its future dropped).
    fn abandon(&self) {
        self.finish("abandoned", None);
    }

    fn finish(&self, outcome: &'static str, waited: Option<Duration>) {
        let Some(began) = self.began else {
            return;
        };
        let waited = waited.unwrap_or_else(|| began.elapsed());
        self.span
            .record("waited_ms", waited.as_secs_f64() * 1e3)
            .record("outcome", outcome);
    }
}
