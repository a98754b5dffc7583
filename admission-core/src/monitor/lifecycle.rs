//! How the monitor starts and stops, and how a waiter leaves the line other than by a grant: its
//! context cancelled, its admit abandoned, its own deadline passed.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::context::{LeaveOnCancel, WaiterKey};
use crate::demand::Demand;
use crate::error::{AdmitError, StartError};
use crate::sync::{Ordering, thread};

use super::evaluator;
use super::line::{Phase, Place, State, Waiter};
use super::outbox::Outbox;
use super::pass::Scope;
use super::shared::Shared;

/// Why a waiter leaves the line outside a pass.
#[derive(Copy, Clone)]
enum Leaving {
    /// Its context was cancelled: the waiter is told so.
    Cancelled,
    /// Its admit future was dropped: nobody is left to tell.
    Abandoned,
    /// Its own timer says its deadline has passed (checked again here, on the monitor's clock).
    Expired,
}

/// A cancelled job's waiter leaves the line: the listener its ticket registered on the job's
/// context names it by its place (`wait.rs`).
impl LeaveOnCancel for Shared {
    fn leave_on_cancel(&self, waiter: WaiterKey) {
        if let Some(place) = Place::of_waiter_key(waiter) {
            self.cancel_waiter(place);
        }
    }
}

impl Shared {
    /// [`Monitor::start`](crate::Monitor::start): starts the evaluator if it is not running,
    /// in every monitor (one with manual passes too: a test may want its real thread).
    pub(crate) fn start(self: &Arc<Shared>) -> Result<(), StartError> {
        let mut st = self.state.lock();
        self.spawn_evaluator(&mut st)
    }

    /// Makes sure a waiter about to park has an evaluator to serve its deadline: starts it
    /// unless it runs or the monitor's passes are manual (`test-util`). Under the monitor lock.
    pub(crate) fn ensure_evaluator(self: &Arc<Shared>, st: &mut State) -> Result<(), StartError> {
        if self.manual {
            return Ok(());
        }
        self.spawn_evaluator(st)
    }

    fn spawn_evaluator(self: &Arc<Shared>, st: &mut State) -> Result<(), StartError> {
        if !matches!(st.phase, Phase::Open) {
            return Err(StartError::Stopped);
        }
        if st.evaluator.is_some() {
            return Ok(());
        }
        let shared = self.clone();
        let body = move || evaluator::run(&shared.bell, &*shared.clock, || shared.evaluate());
        let handle = thread::spawn("admission-evaluator", body)
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        let id = handle.thread().id();
        st.evaluator = Some((handle, id));
        Ok(())
    }

    /// Withdraws the waiter at `place` because its context was cancelled.
    pub(crate) fn cancel_waiter(&self, place: Place) {
        self.leave_line(place, Leaving::Cancelled);
    }

    /// Times the waiter at `place` out if its deadline has passed on the monitor's clock: a
    /// blocking waiter's own timer calls this, so its deadline holds even between the
    /// evaluator's passes.
    pub(crate) fn expire(&self, place: Place) {
        self.leave_line(place, Leaving::Expired);
    }

    /// Withdraws the waiter at `place` because its admit was abandoned (the future dropped).
    /// Returns false when the waiter had already left the line, i.e. its outcome is in its cell.
    pub(crate) fn withdraw(&self, place: Place) -> bool {
        self.leave_line(place, Leaving::Abandoned)
    }

    /// Takes the waiter at `place` out of the line for `why`; false when it was no longer there
    /// (or, for an expiry, not yet due).
    ///
    /// What follows depends on what the leaver can change. A waiter behind the head held
    /// nothing and set nothing aside, so the line answers as before without it: nothing is
    /// asked again (a wake-up computed from its deadline is at worst a pass with nothing to do),
    /// and emptying a long line one withdrawal at a time costs no pass over it. The head leaving
    /// frees what it set aside, as a give of its demand would, and gets the pass a give gets, on
    /// this thread: it may stop once the new head is short on every account the leaver named.
    /// With a gate, whose answer may count the waiters it holds, the evaluator is rung for a
    /// full pass whenever the head or a waiter the gate held leaves.
    fn leave_line(&self, place: Place, why: Leaving) -> bool {
        let mut out = self.outbox();
        let now = self.clock.now();
        let (left, next) = {
            let mut st = self.state.lock();
            let leaves = match why {
                Leaving::Expired => st.queue.is_due(place, now),
                _ => st.queue.get(place).is_some(),
            };
            let was_head = st.queue.is_head(place);
            let was_on_gate = st.queue.is_on_gate(place);
            let others_remain = st.queue.len() > 1;
            let left = match leaves.then(|| st.queue.remove(place)).flatten() {
                // The waiter stays in its record (its owner's); it is told how it left here,
                // under the lock, and nothing of it is kept.
                Some(w) => {
                    let error = left_with(w, why, now);
                    out.rejected(&w.ctx, &w.demand, &error);
                    if !matches!(why, Leaving::Abandoned) {
                        out.finish(&w.cell, Err(error));
                    }
                    let pass = (was_head && others_remain && self.gate.is_none())
                        .then(|| w.demand.clone());
                    Some((was_on_gate, pass))
                }
                None => None,
            };
            match left {
                Some((on_gate, pass)) => {
                    out.emptied(&mut st.queue);
                    self.publish_parked(st.queue.len());
                    if on_gate {
                        self.tell_gate_holding(&st);
                    }
                    let next = match (&self.gate, pass) {
                        (Some(_), _) if was_head || on_gate => Next::Ring,
                        (None, Some(demand)) => Next::Pass(demand),
                        _ => Next::Nothing,
                    };
                    out.seal(&self.sink);
                    (true, next)
                }
                None => (false, Next::Nothing),
            }
        };
        self.deliver(out);
        match next {
            Next::Nothing => {}
            Next::Ring => self.bell.ring(),
            Next::Pass(demand) => {
                if let Some(me) = self.me.upgrade() {
                    me.evaluate_here(Scope::Released(demand.entries()));
                }
            }
        }
        left
    }

    /// Refuses every waiter with `error` and empties the line. Under the monitor lock.
    fn drain_locked(&self, st: &mut State, out: &mut Outbox<'_>, error: &AdmitError) {
        st.queue.take_all(|w| {
            out.rejected(&w.ctx, &w.demand, error);
            out.finish(&w.cell, Err(error.clone()));
        });
        out.emptied(&mut st.queue);
        self.publish_parked(0);
    }

    /// Takes this monitor's doorbell back from every account it watched, leaving alone a slot
    /// that another monitor sharing the account has taken over since.
    fn unwatch_locked(&self, st: &mut State, out: &mut Outbox<'_>) {
        for (_, weak) in st.watched.drain() {
            if let Some(account) = weak.upgrade() {
                account.forget_capacity_change(&self.kick);
                // Maybe the last handle now: dropped once the lock is released.
                out.unwatched(account);
            }
        }
    }

    /// Closes admission for good because of a defect; every waiter fails with the cause.
    pub(crate) fn close_locked(
        &self,
        st: &mut State,
        out: &mut Outbox<'_>,
        cause: String,
    ) -> AdmitError {
        if let Some(error) = Self::phase_error(&st.phase) {
            return error;
        }
        tracing::error!(%cause, "admission closed by a defect");
        let cause: Arc<str> = Arc::from(cause);
        st.phase = Phase::Closed(cause.clone());
        self.open.store(false, Ordering::SeqCst);
        let error = AdmitError::Closed { cause };
        self.drain_locked(st, out, &error);
        self.unwatch_locked(st, out);
        error
    }

    /// Stops admission: refuses every waiter, takes back its wake-ups, joins the evaluator.
    pub(crate) fn stop(&self) {
        let mut out = self.outbox();
        let evaluator = {
            let mut st = self.state.lock();
            if matches!(st.phase, Phase::Open) {
                st.phase = Phase::Stopped;
                self.open.store(false, Ordering::SeqCst);
                self.drain_locked(&mut st, &mut out, &AdmitError::Shutdown);
            }
            self.unwatch_locked(&mut st, &mut out);
            out.seal(&self.sink);
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
}

/// The error a waiter leaving for `why` at `now` is refused with.
fn left_with(w: &Waiter, why: Leaving, now: Instant) -> AdmitError {
    let waited = now.saturating_duration_since(w.asked_at);
    match why {
        Leaving::Cancelled | Leaving::Abandoned => AdmitError::Cancelled {
            job: w.ctx.id(),
            waited,
        },
        Leaving::Expired => AdmitError::TimedOut {
            job: w.ctx.id(),
            waited,
            timeout: w.timeout.unwrap_or(Duration::ZERO),
        },
    }
}

/// What a waiter's leaving asks of the line (see `Shared::leave_line`).
enum Next {
    /// Nothing: it was behind the head.
    Nothing,
    /// A full pass by the evaluator (a gate may count who it holds).
    Ring,
    /// The pass a give of the head's demand gets, on the leaving thread.
    Pass(Demand),
}
