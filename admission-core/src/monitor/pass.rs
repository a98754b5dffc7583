//! The evaluator: one thread that walks the line whenever something may have changed.
//!
//! A pass reads the clock once and asks every waiter in arrival order. The first waiter not
//! granted is the head; every waiter behind it is asked with the head's amounts set aside on each
//! account they share (EASY backfilling, Lifka 1995), so the head is never overtaken while
//! disjoint demands flow past it. Two sharper rules follow from what a head waits for:
//! - while the head is short on an account, nobody behind it takes from that account, and nobody
//!   behind it is even asked about it. For an account that sets the head's amounts aside, as the
//!   contract requires, that is its own answer (what is free is less than the head's amount, so
//!   less than the head's and anyone's together), so the rule only spares a long line the asking.
//!   On a [`Time`](crate::Replenishment::Time) account it matters beyond that: every unit
//!   taken would postpone the head's grant by as much, so even an account that ignores
//!   reservations must not be drawn from, and the head's own deadline covers every follower's
//!   wake-up;
//! - while the gate holds the head, every waiter with entries is held by the gate too, with the
//!   head's deadline, so the next wake-up starts again from the head.
//!
//! The pass ends with the earliest instant at which time alone could change an answer (an
//! account's `earliest_fit`, the gate's hold, a waiter's deadline); the evaluator sleeps until
//! then or until the doorbell rings. There is no periodic timer.
//!
//! An arrival at a line that already exists is asked by [`Shared::arrive`] the way a pass would
//! ask it at the tail, so joining a long line costs one ask rather than a pass over everyone.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crate::account::account_key;
use crate::amount::Amount;
use crate::clock::Instant;
use crate::error::AdmitError;
use crate::event::{EventEntry, EventKind};
use crate::gate::{GateAnswer, GateView};
use crate::grant::{Grant, Waits};
use crate::sync::Ordering;

use super::ask::{Attempt, Head, Learn, ask_demand, earlier};
use super::shared::{GATE_KEY, Hold, Outbox, Phase, Shared, Waiter, entry_events, panic_message};

/// The shortest sleep after a pass whose computed wake-up was already due.
const MIN_RECHECK: Duration = Duration::from_millis(1);

/// What a pass is for.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// Ask everyone: the evaluator's passes, and any pass that must see the whole line.
    Full,
    /// A grant gave these entries back, on the giver's thread. The pass may stop early: once the
    /// head is short on every account the pass has touched (given back here, or named by a
    /// waiter that left the line in it), everyone further back either needs one of them, and is
    /// held by the head's claim on it, or needs none, and would answer as at its last ask.
    Released(&'a [crate::demand::Entry]),
}

/// What [`Shared::arrive`] made of a newcomer.
pub(crate) enum Arrival {
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

/// Adds the accounts of `w`, which leaves the line in this pass, to the pass's `touched` set:
/// what it reserved or asked for is no longer set aside.
fn touch(touched: &mut Option<Vec<usize>>, w: &Waiter) {
    if let Some(touched) = touched {
        for entry in w.demand.entries() {
            let key = account_key(entry.account());
            if !touched.contains(&key) {
                touched.push(key);
            }
        }
    }
}

/// True when `at` is an instant that comes before the wake-up `planned` by the last pass
/// (`None` planned: only an event would wake the evaluator, so any instant comes first).
pub(crate) fn before_planned(at: Option<Instant>, planned: Option<Instant>) -> bool {
    match (at, planned) {
        (None, _) => false,
        (Some(at), Some(planned)) => at < planned,
        (Some(_), None) => true,
    }
}

impl Shared {
    /// [`Shared::pass`], closing admission if the pass fails: a panic outside the accounts (which
    /// are guarded one by one) is a defect in the monitor or its gate.
    pub(crate) fn pass_guarded(
        self: &Arc<Shared>,
        out: &mut Outbox,
        scope: Scope<'_>,
    ) -> Option<Instant> {
        match catch_unwind(AssertUnwindSafe(|| self.pass(out, scope))) {
            Ok(wake) => wake,
            Err(panic) => {
                let cause = format!("a pass failed: {}", panic_message(&*panic));
                let mut st = self.state.lock();
                self.close_locked(&mut st, out, cause);
                None
            }
        }
    }

    /// One pass over the line. Returns the instant to wake at, `None` to sleep until rung (for
    /// a pass that stopped early, only a wake-up earlier than the one already planned).
    pub(crate) fn pass(self: &Arc<Shared>, out: &mut Outbox, scope: Scope<'_>) -> Option<Instant> {
        let now = self.clock.now();
        let mut st = self.state.lock();
        if !matches!(st.phase, Phase::Open) {
            return None;
        }
        if st.queue.is_empty() {
            if let Some(gate) = &self.gate {
                gate.holding(0);
            }
            st.planned_wake = None;
            return None;
        }
        // The accounts whose answers may have changed since the last ask, tracked only when the
        // pass may stop early (a release, and no gate, whose drain reads the whole line).
        let mut touched: Option<Vec<usize>> = match scope {
            Scope::Released(entries) if self.gate.is_none() => {
                Some(entries.iter().map(|e| account_key(e.account())).collect())
            }
            _ => None,
        };
        let mut stopped_early = false;
        let mut wake: Option<Instant> = None;
        let mut head: Option<Head> = None;
        let mut leaving: Vec<u64> = Vec::new();
        // Only a gate needs the count (and counting reads the whole line).
        let mut on_gate = match self.gate {
            Some(_) => st.queue.values().filter(|w| w.on_gate).count(),
            None => 0,
        };
        let total = st.queue.len();
        // One buffer for every waiter's short list: a pass over a long line allocates nothing
        // per waiter that is still held.
        let mut short: Vec<Option<usize>> = Vec::new();

        for (&seq, w) in st.queue.iter_mut() {
            // Leavers first: a cancelled job stops reserving, a late one times out.
            if w.ctx.is_cancelled() {
                let error = AdmitError::Cancelled {
                    job: w.ctx.id(),
                    waited: now.saturating_duration_since(w.asked_at),
                };
                touch(&mut touched, w);
                self.leave(out, w, Err(error), &mut on_gate);
                leaving.push(seq);
                continue;
            }
            if let (Some(deadline), Some(timeout)) = (w.deadline, w.timeout) {
                if deadline <= now {
                    let error = AdmitError::TimedOut {
                        job: w.ctx.id(),
                        waited: now.saturating_duration_since(w.asked_at),
                        timeout,
                    };
                    touch(&mut touched, w);
                    self.leave(out, w, Err(error), &mut on_gate);
                    leaving.push(seq);
                    continue;
                }
                wake = earlier(wake, Some(deadline));
            }

            let is_head = head.is_none();
            // Only a gate reads where the waiter was held last; without one this costs nothing.
            let elsewhere = self.gate.is_some()
                && !w.on_gate
                && w.held
                    .iter()
                    .any(|h| h.key != GATE_KEY && h.until.is_none());
            let view = GateView {
                head: is_head,
                held: on_gate - usize::from(w.on_gate),
                now,
                on_gate: w.on_gate,
                elsewhere,
            };
            match self.attempt(w, head.as_ref(), view, &mut short) {
                Attempt::Granted => {
                    touch(&mut touched, w);
                    let remaining = total - leaving.len() - 1;
                    self.grant_waiter(out, w, remaining, &mut on_gate);
                    leaving.push(seq);
                }
                Attempt::Refused(error) => {
                    touch(&mut touched, w);
                    self.leave(out, w, Err(error), &mut on_gate);
                    leaving.push(seq);
                }
                Attempt::Held { wake: at } => {
                    let gate_held = short.contains(&None);
                    if gate_held != w.on_gate {
                        w.on_gate = gate_held;
                        if gate_held {
                            on_gate += 1;
                        } else {
                            on_gate -= 1;
                        }
                    }
                    self.note_held(out, w, &short, now);
                    if is_head {
                        let mut h = Head::of(&w.demand, &short);
                        if gate_held {
                            h.gate_hold = Some(at);
                        }
                        head = Some(h);
                    }
                    wake = earlier(wake, at);
                    if let (Some(touched), Some(head)) = (&touched, &head)
                        && touched.iter().all(|key| head.short.contains(key))
                    {
                        stopped_early = true;
                        break;
                    }
                }
            }
        }
        for seq in leaving {
            st.queue.remove(&seq);
        }
        if let Some(gate) = &self.gate {
            gate.holding(on_gate);
        }
        // Written only under the monitor lock, so a read here is exact; an unchanged count is
        // not written again (a sequentially consistent store costs a line other cores read).
        if self.bell.parked.load(Ordering::Relaxed) != st.queue.len() {
            self.bell.parked.store(st.queue.len(), Ordering::SeqCst);
        }
        if st.queue.is_empty() {
            st.planned_wake = None;
            return None;
        }
        // An instant in the past means "now"; an account that keeps answering so while refusing
        // must not spin the evaluator, so such a wake-up is re-asked a millisecond later.
        let wake = wake.map(|at| {
            if at <= now {
                now.saturating_add(MIN_RECHECK)
            } else {
                at
            }
        });
        if stopped_early {
            // The waiters not asked keep the wake-up planned for them; only an earlier one from
            // the waiters asked here is news for the evaluator.
            let planned = st.planned_wake;
            st.planned_wake = earlier(planned, wake);
            return if before_planned(wake, planned) {
                wake
            } else {
                None
            };
        }
        st.planned_wake = wake;
        wake
    }

    /// Asks for newcomer `w`, joining the line `st.queue` of a monitor without a gate, what a
    /// pass would ask at the line's tail: every account, with the head's amounts set aside and
    /// the accounts the head is short on untouchable (first in line, it is the head). Granted, it
    /// never joins the line; held, its `Held` events are out and the caller parks it. Under the
    /// monitor lock, with `parked` already counting `w` (see `doorbell.rs`: the ask must follow
    /// the publication for a concurrent give to find someone waiting).
    ///
    /// Nothing earlier in the line needs asking again: since the last pass, every change that
    /// could grant an earlier waiter (a give, a relaxed limit) runs or rings for a pass of its
    /// own, and the head's reservation keeps this newcomer from taking what the head waits for.
    pub(crate) fn arrive(
        self: &Arc<Shared>,
        st: &super::shared::State,
        w: &mut Waiter,
        out: &mut Outbox,
        now: Instant,
    ) -> Arrival {
        // Behind a line, the head as it stands now; first in line, nobody's amounts to respect.
        let head = match st.queue.values().next() {
            Some(first) => match Head::now_of(&first.demand, &first.ctx) {
                Some(head) => Some(head),
                None => return Arrival::Deferred,
            },
            None => None,
        };
        let view = GateView {
            head: head.is_none(),
            held: 0,
            now,
            on_gate: false,
            elsewhere: false,
        };
        let mut short = Vec::new();
        match self.attempt(w, head.as_ref(), view, &mut short) {
            Attempt::Granted => {
                out.push_event(|| {
                    self.event(
                        EventKind::GrantedImmediate,
                        &w.ctx,
                        entry_events(w.demand.entries()),
                    )
                });
                let demand = std::mem::take(&mut w.demand);
                Arrival::Granted(Grant::new(
                    demand.into_entries(),
                    self.clone(),
                    w.ctx.clone(),
                    Duration::ZERO,
                    Waits::none(),
                ))
            }
            Attempt::Refused(error) => Arrival::Refused(error),
            Attempt::Held { wake } => {
                self.note_held(out, w, &short, now);
                Arrival::Held {
                    due: earlier(wake, w.deadline),
                }
            }
        }
    }

    /// Asks the gate and every account about waiter `w`, and takes its whole demand if it fits.
    fn attempt(
        &self,
        w: &Waiter,
        head: Option<&Head>,
        view: GateView,
        short: &mut Vec<Option<usize>>,
    ) -> Attempt {
        short.clear();
        let demand = &w.demand;
        if demand.is_empty() {
            return Attempt::Granted;
        }
        if let Some(gate) = &self.gate {
            if let Some(Head {
                gate_hold: Some(until),
                ..
            }) = head
            {
                short.push(None);
                return Attempt::Held { wake: *until };
            }
            if let GateAnswer::Hold { until } = gate.check(view) {
                short.push(None);
                return Attempt::Held { wake: until };
            }
        }
        match ask_demand(&self.bell, demand, &w.ctx, head, Learn::EveryShort, short) {
            Attempt::Granted => {
                if let Some(gate) = &self.gate {
                    gate.passed(view);
                }
                Attempt::Granted
            }
            other => other,
        }
    }

    /// Reports the accounts a waiter is newly short on and stamps when each started holding it.
    fn note_held(&self, out: &mut Outbox, w: &mut Waiter, short: &[Option<usize>], now: Instant) {
        let gate_only = short == [None];
        if !gate_only {
            // Every account was asked: those no longer short stopped holding the waiter now.
            for hold in &mut w.held {
                let still = short.iter().any(|s| match s {
                    None => hold.key == GATE_KEY,
                    Some(i) => account_key(w.demand.entries()[*i].account()) == hold.key,
                });
                if still {
                    hold.until = None;
                } else if hold.until.is_none() {
                    hold.until = Some(now);
                }
            }
        }
        for s in short {
            let entry = s.map(|i| &w.demand.entries()[i]);
            let key = entry.map_or(GATE_KEY, |e| account_key(e.account()));
            if let Some(hold) = w.held.iter_mut().find(|h| h.key == key) {
                hold.until = None;
                continue;
            }
            w.held.push(Hold {
                key,
                entry: *s,
                since: now,
                until: None,
            });
            out.push_event(|| {
                let entries = match entry {
                    Some(e) => vec![EventEntry {
                        account: e.account().name().to_owned(),
                        category: e.account().category(),
                        amount: e.amount(),
                    }],
                    None => vec![EventEntry {
                        account: self.gate_name().to_owned(),
                        category: crate::Category::MEMORY,
                        amount: Amount::ZERO,
                    }],
                };
                self.event(EventKind::Held, &w.ctx, entries)
            });
        }
    }

    fn grant_waiter(
        self: &Arc<Shared>,
        out: &mut Outbox,
        w: &mut Waiter,
        remaining: usize,
        on_gate: &mut usize,
    ) {
        // Accounts read the clock when asked, which may be later than the pass's start: the
        // grant's instant is read now, so a wait is never reported shorter than it was.
        let now = self.clock.now();
        let wall_wait = now.saturating_duration_since(w.asked_at);
        // The holds move into the grant as they are; it reads them only when asked.
        let waits = Waits {
            holds: std::mem::take(&mut w.held),
            granted_at: now,
        };
        out.push_event(|| {
            self.event(
                EventKind::GrantedFromHold {
                    wait: wall_wait,
                    waiters: remaining,
                },
                &w.ctx,
                entry_events(w.demand.entries()),
            )
        });
        let demand = std::mem::take(&mut w.demand);
        let grant = Grant::new(
            demand.into_entries(),
            self.clone(),
            w.ctx.clone(),
            wall_wait,
            waits,
        );
        if w.on_gate {
            *on_gate -= 1;
        }
        self.finish(out, &w.cell, Ok(grant));
    }

    fn leave(
        &self,
        out: &mut Outbox,
        w: &mut Waiter,
        outcome: Result<Grant, AdmitError>,
        on_gate: &mut usize,
    ) {
        if let Err(error) = &outcome {
            self.reject_event(out, &w.ctx, &w.demand, error);
        }
        if w.on_gate {
            *on_gate -= 1;
        }
        self.finish(out, &w.cell, outcome);
    }
}
