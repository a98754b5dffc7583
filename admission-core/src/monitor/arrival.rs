//! The arrival: a job asks for its demand, and is granted inline, refused at once, or parked.
//!
//! When the line is empty the caller's own thread asks every account (the fast path: one ask per
//! account, no clock read without a gate, no system call; without a gate, not even the monitor
//! lock: `begin_unlocked`). Otherwise the newcomer is asked where
//! a pass would ask it, at the line's tail, with the head's reservation set aside, so that joining
//! a long line costs one ask per account rather than a pass over everyone. Nothing earlier in the
//! line needs asking again: since the last pass, every change that could grant an earlier waiter
//! (a give, a relaxed limit) runs or rings for a pass of its own, and the head's reservation keeps
//! the newcomer from taking what the head waits for.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crate::account::{AccountRef, account_key};
use crate::clock::{Instant, Reading};
use crate::context::JobContext;
use crate::demand::Demand;
use crate::error::{AdmitError, TryAdmitError};
use crate::event::EventKind;
use crate::gate::{GateAnswer, GateView};
use crate::sync::{MonitorGuard, Ordering};

use super::ask::{
    Attempt, Head, Learn, Short, Whole, ask_demand, earlier, give_back, panic_message, refusal_of,
    take_whole,
};
use super::cell::{CellRef, Outcome};
use super::grant::{Grant, Holds};
use super::line::{Hot, Place, RecordRef, State, Waiter, before_planned};
use super::outbox::{Events, Outbox, entry_events};
use super::shared::Shared;

/// What an admit made of a job.
pub(crate) enum Begin {
    /// Granted inline or refused at once.
    Done(Outcome),
    /// Parked in the line.
    Parked {
        place: Place,
        /// When the waiter times out, on the monitor's clock.
        deadline: Option<Instant>,
    },
}

/// Where a waiter that parks keeps itself: its outcome cell and its record, both the caller's
/// (inside its pinned `Admit`, or on the blocking call's frame), which the line points at.
pub(crate) struct Stand {
    pub(crate) cell: CellRef,
    pub(crate) record: RecordRef,
}

/// What the unlocked fast path made of a demand.
enum Unlocked {
    /// Taken whole.
    Taken,
    /// Refused for good (an account's "never"); the rejection is in the outbox.
    Refused(AdmitError),
    /// Not now: nothing taken; the first entry short, when known.
    Held(Option<usize>),
    /// Not asked: the lock decides (a gate, a line, a phase, a cancelled job, a requirement).
    Skipped,
}

/// What asking a newcomer at the line's tail made of it.
enum Arrival {
    /// Granted on arrival (its demand does not touch what the head needs).
    Granted(Grant),
    /// Held; `due` is the earliest instant time alone could change that (its accounts' or its
    /// own deadline), `None` when only an event can.
    Held {
        due: Option<Instant>,
    },
    Refused(AdmitError),
    /// Not asked: the head could go now, so a pass is due; park and ring for it.
    Deferred,
}

/// An arrival the unlocked fast path could not settle, handed to [`Shared::begin`] with what it
/// had gathered: the demand, whether an account was asked already, the arrival's instant and
/// its events so far.
pub(crate) struct Unsettled<'a> {
    demand: Demand,
    asked: bool,
    now: Reading<'a>,
    events: Events<'a>,
}

impl Shared {
    /// The arrival's first step, before the caller has set anything up for a wait: the unlocked
    /// fast path. `Ok` when it settled the demand (granted, or refused for good); otherwise the
    /// arrival goes on in [`Shared::begin`], with a place to park.
    #[inline]
    pub(crate) fn arrive_unlocked(
        self: &Arc<Shared>,
        demand: Demand,
        ctx: &JobContext,
    ) -> Result<Outcome, Unsettled<'_>> {
        // No outbox yet: settled here, an arrival has nothing to deliver but its events.
        let mut events = Events::new(&*self.clock, &self.sink);
        // One instant for the whole arrival, read when the first account (or the line) needs it.
        let now = Reading::new(&*self.clock);
        match self.begin_unlocked(demand, ctx, &now, &mut events) {
            Ok(outcome) => {
                events.deliver(&self.sink);
                Ok(outcome)
            }
            Err((demand, asked)) => Err(Unsettled {
                demand,
                asked,
                now,
                events,
            }),
        }
    }

    /// The rest of an arrival: granted or refused under the lock, or parked in `stand` (the
    /// caller's cell and record, which the caller keeps in place: `cell.rs`).
    ///
    /// A parked waiter's place is written to `parked` as soon as it is parked, before anything
    /// that could unwind (an event sink, a waker, an account's give): a caller that unwinds out of
    /// this call with `parked` set still withdraws before its cell goes.
    pub(crate) fn begin(
        self: &Arc<Shared>,
        arrival: Unsettled<'_>,
        ctx: &JobContext,
        timeout: Option<Duration>,
        stand: Stand,
        parked: &mut Option<Place>,
    ) -> Begin {
        let Unsettled {
            demand,
            asked,
            now,
            events,
        } = arrival;
        let mut out = Outbox::with(events);
        let (begun, ring) =
            match self.begin_locked(demand, asked, ctx, timeout, stand, &now, &mut out) {
                Ok(parked) => parked,
                Err(outcome) => (Begin::Done(outcome), false),
            };
        if let Begin::Parked { place, .. } = begun {
            *parked = Some(place);
        }
        self.deliver(out);
        if ring {
            self.bell.ring();
        }
        begun
    }

    /// [`Shared::take_unlocked`] for an admit: `Ok(outcome)` when granted (or refused for good);
    /// `Err((demand, asked))` hands the demand to the locked arrival, having taken nothing
    /// (`asked`: an account said "not now", so the locked arrival parks it without a second
    /// fast path: the ask at the line's tail follows).
    #[inline]
    fn begin_unlocked(
        self: &Arc<Shared>,
        demand: Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
        out: &mut Events<'_>,
    ) -> Result<Outcome, (Demand, bool)> {
        match self.take_unlocked(&demand, ctx, now, out) {
            Unlocked::Taken => Ok(Ok(Grant::immediate(self, demand, ctx))),
            Unlocked::Refused(error) => Ok(Err(error)),
            Unlocked::Held(_) => Err((demand, true)),
            Unlocked::Skipped => Err((demand, false)),
        }
    }

    /// The fast path without the monitor lock, for a monitor without a gate whose line is empty:
    /// every account asked once, as the head; taken whole or not at all.
    ///
    /// Why no lock is needed: an empty line has no head to respect. A parker publishes
    /// `parked > 0` (and fences) before it asks anything, and this taker reads `parked` again
    /// (after a fence) once it has taken everything: if anyone parked meanwhile, the take is given
    /// back, so a grant here is ordered before every waiter it could overtake (Dekker's pattern,
    /// with the accounts' own atomics in the middle). What an attempt takes and gives back because one account said
    /// "not now" is given back muted (`ask.rs`); a parker that published in the meantime may have
    /// been refused for what was given back, so the doorbell is rung for it (a giver that read
    /// `parked` after its give: the Dekker argument of `evaluator.rs`). A stop or a close clears
    /// `open` under the lock; a grant that finds it cleared after taking gives everything back.
    /// Checked by the loom models `loom_unlocked_fast_path_racing_a_park_never_loses_the_wake_up`
    /// and `loom_unlocked_fast_path_racing_stop_grants_before_it_or_takes_nothing`.
    #[inline]
    fn take_unlocked(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
        out: &mut Events<'_>,
    ) -> Unlocked {
        if self.gate.is_some()
            || !self.open.load(Ordering::SeqCst)
            || self.bell.parked.load(Ordering::SeqCst) != 0
            || ctx.is_cancelled()
            || demand.check_requirements().is_err()
        {
            return Unlocked::Skipped;
        }
        match take_whole(&self.bell, demand.entries(), ctx, now) {
            Whole::Taken => {
                // Stopped or closed while taking (the locked path refuses), or someone parked
                // since the check above (this thread may have stalled between the two): that
                // waiter is the head now, and what was just taken may be what it waits for. Give
                // it all back and let the lock decide (an admit parks behind the head).
                let open = self.open.load(Ordering::SeqCst);
                if !open || self.bell.someone_waiting() {
                    give_back(&self.bell, demand.entries());
                    self.ring_for_given_back();
                    return if open {
                        Unlocked::Held(None)
                    } else {
                        Unlocked::Skipped
                    };
                }
                out.event(EventKind::GrantedImmediate, ctx, || {
                    entry_events(demand.entries())
                });
                Unlocked::Taken
            }
            Whole::Short(first) => {
                self.ring_for_given_back();
                Unlocked::Held(Some(first))
            }
            Whole::Refused(error) => {
                self.ring_for_given_back();
                out.rejected(ctx, demand, &error);
                Unlocked::Refused(*error)
            }
        }
    }

    /// Takes `demand` now or not at all, never parking (`Monitor::try_admit`): unlocked when it
    /// can be, else under the lock with the line empty.
    pub(crate) fn try_take(&self, demand: &Demand, ctx: &JobContext) -> Result<(), TryAdmitError> {
        let mut events = Events::new(&*self.clock, &self.sink);
        let now = Reading::new(&*self.clock);
        let taken = match self.take_unlocked(demand, ctx, &now, &mut events) {
            Unlocked::Taken => Ok(()),
            Unlocked::Refused(error) => Err(error.into()),
            Unlocked::Held(short) => match refusal_of(demand.entries(), ctx, &now) {
                // The fast path stopped at the first "not now"; a later account's "never" wins.
                Some(error) => {
                    events.rejected(ctx, demand, &error);
                    Err(error.into())
                }
                None => Err(TryAdmitError::WouldWait {
                    job: ctx.id(),
                    waiting: 0,
                    short: short.map(|i| demand.entries()[i].account().name().to_owned()),
                }),
            },
            Unlocked::Skipped => {
                let mut out = Outbox::with(events);
                let taken = self.try_take_locked(demand, ctx, &now, &mut out);
                self.deliver(out);
                return taken;
            }
        };
        events.deliver(&self.sink);
        taken
    }

    /// [`Shared::try_take`] under the monitor lock: a gate, a line, a phase or a job's state
    /// that the unlocked path leaves to the lock.
    fn try_take_locked(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
        out: &mut Outbox<'_>,
    ) -> Result<(), TryAdmitError> {
        let refused = |out: &mut Outbox<'_>, error: AdmitError| {
            out.rejected(ctx, demand, &error);
            Err(TryAdmitError::Admit(error))
        };
        if ctx.is_cancelled() {
            let error = AdmitError::Cancelled {
                job: ctx.id(),
                waited: Duration::ZERO,
            };
            return refused(out, error);
        }
        if let Err(error) = demand.check_requirements() {
            return refused(out, error);
        }
        let mut st = self.state.lock();
        if let Some(error) = Self::phase_error(&st.phase) {
            drop(st);
            return refused(out, error);
        }
        if !st.queue.is_empty() {
            // Never overtaking the line, but "never" wins over "not now": a demand no account
            // can ever grant is refused, not told to wait.
            let waiting = st.queue.len();
            if let Some(error) = refusal_of(demand.entries(), ctx, now) {
                drop(st);
                return refused(out, error);
            }
            return Err(TryAdmitError::WouldWait {
                job: ctx.id(),
                waiting,
                short: None,
            });
        }
        let mut gate_held = false;
        let taken = self.fast_path(&mut st, demand, ctx, now, &mut gate_held, out);
        drop(st);
        match taken {
            Ok(true) => {
                out.event(EventKind::GrantedImmediate, ctx, || {
                    entry_events(demand.entries())
                });
                Ok(())
            }
            Ok(false) => match (!gate_held)
                .then(|| refusal_of(demand.entries(), ctx, now))
                .flatten()
            {
                // The fast path stopped at the first "not now"; a later account's "never" wins
                // (a gate's hold looked for one already).
                Some(error) => refused(out, error),
                None => Err(TryAdmitError::WouldWait {
                    job: ctx.id(),
                    waiting: 0,
                    short: gate_held.then(|| self.gate_name().to_owned()),
                }),
            },
            Err(error) => refused(out, error),
        }
    }

    /// After an unlocked attempt gave back (muted) what it took: a waiter that parked meanwhile
    /// may have been refused for it, so it gets the pass the give would have rung for.
    #[cold]
    fn ring_for_given_back(&self) {
        if self.bell.someone_waiting() {
            self.bell.ring();
        }
    }

    /// The arrival under the lock: `Ok((parked, ring))` for a parked waiter (`ring` when the
    /// evaluator must run a pass for it), `Err(outcome)` when it is done at once.
    #[expect(
        clippy::too_many_arguments,
        reason = "the arrival's state, passed down the one path that parks"
    )]
    fn begin_locked(
        self: &Arc<Shared>,
        demand: Demand,
        asked: bool,
        ctx: &JobContext,
        timeout: Option<Duration>,
        stand: Stand,
        now: &Reading<'_>,
        out: &mut Outbox<'_>,
    ) -> Result<(Begin, bool), Outcome> {
        let refused = |out: &mut Outbox<'_>, demand: &Demand, error: AdmitError| {
            out.rejected(ctx, demand, &error);
            Err(Err(error))
        };
        if ctx.is_cancelled() {
            let error = AdmitError::Cancelled {
                job: ctx.id(),
                waited: Duration::ZERO,
            };
            return refused(out, &demand, error);
        }
        if let Err(error) = demand.check_requirements() {
            return refused(out, &demand, error);
        }
        let mut st = self.state.lock();
        if let Some(error) = Self::phase_error(&st.phase) {
            drop(st);
            return refused(out, &demand, error);
        }
        // True when the waiter about to park is behind the gate: the gate held it on the fast
        // path, or the head of the line is held on the gate (the sharp rule, applied here).
        let mut gate_held = false;
        if st.queue.is_empty() && !asked {
            match self.fast_path(&mut st, &demand, ctx, now, &mut gate_held, out) {
                Ok(true) => {
                    drop(st);
                    out.event(EventKind::GrantedImmediate, ctx, || {
                        entry_events(demand.entries())
                    });
                    return Err(Ok(Grant::immediate(self, demand, ctx)));
                }
                Ok(false) => {}
                Err(error) => {
                    drop(st);
                    return refused(out, &demand, error);
                }
            }
        }
        if self.gate.is_some() && !demand.is_empty() {
            // With a gate the evaluator asks the waiter, but a demand that can never fit is
            // refused here and now (a fast path that the gate held looked for that already).
            let looked = gate_held;
            if !gate_held {
                gate_held = st.queue.head_on_gate();
            }
            if !looked && let Some(error) = refusal_of(demand.entries(), ctx, now) {
                drop(st);
                return refused(out, &demand, error);
            }
        }
        self.park(st, demand, ctx, timeout, stand, gate_held, now, out)
    }

    /// The fast path, for an empty line: the gate, then every account asked once as the head.
    /// `Ok(false)` is "not now", with `gate_held` set when the gate said so. An account's panic
    /// is a refusal of this job; the gate's closes admission.
    fn fast_path(
        &self,
        st: &mut MonitorGuard<'_, State>,
        demand: &Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
        gate_held: &mut bool,
        out: &mut Outbox<'_>,
    ) -> Result<bool, AdmitError> {
        // Only a gate, or an account that needs the time, reads the clock here.
        let view = GateView::at(match self.gate {
            Some(_) => now.get(),
            None => Instant::ZERO,
        });
        match catch_unwind(AssertUnwindSafe(|| {
            self.take_now(demand, ctx, view, now, gate_held)
        })) {
            Ok(taken) => taken,
            Err(panic) => {
                // Only the gate can panic out of `take_now` (accounts are guarded): a defect.
                let cause = format!("the gate panicked: {}", panic_message(&*panic));
                Err(self.close_locked(st, out, cause))
            }
        }
    }

    fn take_now(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        view: GateView,
        now: &Reading<'_>,
        gate_held: &mut bool,
    ) -> Result<bool, AdmitError> {
        if demand.is_empty() {
            return Ok(true);
        }
        if let Some(gate) = &self.gate
            && let GateAnswer::Hold { .. } = gate.check(view)
        {
            // The gate holds it, but an account that can never grant it still refuses it.
            if let Some(error) = refusal_of(demand.entries(), ctx, now) {
                return Err(error);
            }
            *gate_held = true;
            return Ok(false);
        }
        match take_whole(&self.bell, demand.entries(), ctx, now) {
            Whole::Taken => {}
            Whole::Short(_) => return Ok(false),
            Whole::Refused(error) => return Err(*error),
        }
        if let Some(gate) = &self.gate {
            gate.passed(view);
        }
        Ok(true)
    }

    /// Parks a job that could not go on the fast path, asking it first at the line's tail
    /// (without a gate; with one, the evaluator asks). Under the monitor lock, given up here.
    #[expect(
        clippy::too_many_arguments,
        reason = "the arrival's state, passed down the one path that parks"
    )]
    fn park(
        self: &Arc<Shared>,
        mut st: MonitorGuard<'_, State>,
        demand: Demand,
        ctx: &JobContext,
        timeout: Option<Duration>,
        stand: Stand,
        gate_held: bool,
        reading: &Reading<'_>,
        out: &mut Outbox<'_>,
    ) -> Result<(Begin, bool), Outcome> {
        let now = reading.get();
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
            out.rejected(ctx, &demand, &error);
            return Err(Err(error));
        }
        for entry in demand.entries() {
            self.watch(&mut st, entry.account());
        }
        let mut waiter = Waiter {
            demand,
            ctx: ctx.clone(),
            asked_at: now,
            timeout,
            cell: stand.cell,
            held: Holds::new(),
        };
        let mut hot = Hot::new(deadline, gate_held);
        let ring = match self.gate {
            Some(_) => true,
            None => match self.ask_at_the_tail(&st, &mut hot, &mut waiter, out, reading) {
                Ok(ring) => ring,
                Err(outcome) => {
                    // The waiter's demand and context are the caller's: dropped unlocked.
                    drop(st);
                    drop(waiter);
                    return Err(outcome);
                }
            },
        };
        // Whoever parks has an evaluator to serve its deadline (started here at the latest).
        if let Err(error) = self.ensure_evaluator(&mut st) {
            self.publish_parked(st.queue.len());
            drop(st);
            let error = AdmitError::Unserved {
                reason: error.to_string(),
            };
            out.rejected(ctx, &waiter.demand, &error);
            return Err(Err(error));
        }
        let place = st.queue.push(stand.record, waiter, hot);
        // Without a gate the count was published before the ask, and is this already.
        self.publish_parked(st.queue.len());
        // The waiter's `held` events go out before anything a pass may build for it once the
        // lock is released.
        out.seal(&self.sink);
        Ok((Begin::Parked { place, deadline }, ring))
    }

    /// Asks newcomer `w` at the line's tail (a monitor without a gate). `Ok(ring)` when it is to
    /// park (`ring`: the evaluator must run a pass for it, or adopt an earlier deadline);
    /// `Err(outcome)` when it was granted or refused here.
    fn ask_at_the_tail(
        self: &Arc<Shared>,
        st: &MonitorGuard<'_, State>,
        hot: &mut Hot,
        w: &mut Waiter,
        out: &mut Outbox<'_>,
        now: &Reading<'_>,
    ) -> Result<bool, Outcome> {
        // Published before the ask, so a give that the ask misses finds someone waiting and runs
        // a pass (the doorbell's argument, `evaluator.rs`).
        self.publish_parked(st.queue.len() + 1);
        let arrival = self.arrive(st, hot, w, out, now);
        match arrival {
            Arrival::Granted(grant) => {
                self.publish_parked(st.queue.len());
                Err(Ok(grant))
            }
            Arrival::Refused(error) => {
                self.publish_parked(st.queue.len());
                out.rejected(&w.ctx, &w.demand, &error);
                Err(Err(error))
            }
            // The head could go now: whatever made it so (a give, a relaxed limit, time, its own
            // first ask) runs or rings for a pass, which will ask this waiter too.
            Arrival::Deferred => Ok(false),
            Arrival::Held { due } => Ok(before_planned(due, st.planned_wake)),
        }
    }

    /// Asks for newcomer `w` what a pass would ask at the line's tail: every account, with the
    /// head's amounts set aside and the accounts the head is short on untouchable (first in
    /// line, it is the head). Held, its `Held` events are out and the caller parks it.
    fn arrive(
        self: &Arc<Shared>,
        st: &State,
        hot: &mut Hot,
        w: &mut Waiter,
        out: &mut Outbox<'_>,
        now: &Reading<'_>,
    ) -> Arrival {
        // Behind a line, the head as it stands now; first in line, nobody's amounts to respect.
        let head = match st.queue.head() {
            Some(first) => match Head::now_of(&first.demand, now) {
                Some(head) => Some(head),
                // A demand that can never fit is refused now, not after the head's pass.
                None => match refusal_of(w.demand.entries(), &w.ctx, now) {
                    Some(error) => return Arrival::Refused(error),
                    None => return Arrival::Deferred,
                },
            },
            None => None,
        };
        let mut short = Short::new();
        let attempt = ask_demand(
            &self.bell,
            w.demand.entries(),
            &w.ctx,
            head.as_ref(),
            Learn::EveryShort,
            now,
            &mut short,
        );
        match attempt {
            Attempt::Granted => {
                out.event(EventKind::GrantedImmediate, &w.ctx, || {
                    entry_events(w.demand.entries())
                });
                let demand = std::mem::take(&mut w.demand);
                Arrival::Granted(Grant::immediate(self, demand, &w.ctx))
            }
            Attempt::Refused(error) => Arrival::Refused(*error),
            Attempt::Held { wake } => {
                self.note_held(out, hot, w, &short, now.get());
                Arrival::Held {
                    due: earlier(wake, hot.deadline()),
                }
            }
        }
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
}
