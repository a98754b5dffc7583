//! The pass: the line walked in arrival order whenever something may have changed.
//!
//! A pass reads the clock once and asks every waiter in arrival order. The first waiter not
//! granted is the head; every waiter behind it is asked with the head's amounts set aside on each
//! account they share (EASY backfilling, Lifka 1995), so the head is never overtaken while
//! disjoint demands flow past it. Two sharper rules follow from what a head waits for:
//! - while the head is short on an account, nobody behind it takes from that account: it is only
//!   looked at, for a "never" (a demand it can never grant is refused, not left behind the head
//!   until the head is served), and any other answer counts as short. For an account that sets
//!   the head's amounts aside, as the contract requires, that is its own answer (what is free is
//!   less than the head's amount, so less than the head's and anyone's together). On a
//!   [`Time`](crate::Replenishment::Time) account it matters beyond that: every unit taken would
//!   postpone the head's grant by as much, so even an account that ignores reservations must not
//!   be drawn from, and the head's own deadline covers every follower's wake-up;
//! - while the gate holds the head, every waiter with entries is held by the gate too, with the
//!   head's deadline, so the next wake-up starts again from the head.
//!
//! The pass ends with the earliest instant at which time alone could change an answer (an
//! account's "not now" instant, the gate's hold, a waiter's deadline); the evaluator sleeps until
//! then or until the doorbell rings. There is no periodic timer. A pass runs on the evaluator, on
//! the thread that gives a grant back (`release.rs`), and in tests on demand.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::account::{Category, account_key};
use crate::amount::Amount;
use crate::clock::{Instant, Reading};
use crate::demand::Entry;
use crate::error::AdmitError;
use crate::event::{EventEntry, EventKind};
use crate::gate::{GateAnswer, GateView};
use crate::sync::{MonitorGuard, Ordering};

use super::ask::{Attempt, Head, Learn, Short, ask_demand, earlier, panic_message, refusal_of};
use super::grant::{Grant, Hold, Waits};
use super::line::{Holding, Hot, Phase, Place, State, Waiter, before_planned};
use super::outbox::{Outbox, entry_events};
use super::shared::Shared;

/// The shortest sleep after a pass whose computed wake-up was already due.
const MIN_RECHECK: Duration = Duration::from_millis(1);

/// Waiters a pass visits in one critical section before it lets others take the monitor lock
/// when someone is blocked on it or waiters it decided are to be woken (a monitor without a
/// gate): a release that grants a million waiters stalls an admit for one batch, not for the
/// whole walk (a batch of grants holds the lock for about 30-60 us on this
/// project's 2-core machine; `cargo bench --bench long_line` measures it).
pub(crate) const PASS_BATCH: usize = 64;

/// Past a full batch, how many waiters a walk visits between two looks for someone to let in.
const RECHECK_EVERY: usize = 8;

/// What a pass is for.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// Ask everyone: the evaluator's passes, and any pass that must see the whole line.
    Full,
    /// A grant gave these entries back, on the giver's thread. The pass may stop early: once the
    /// head is short on every account the pass has touched (given back here, or named by a
    /// waiter that left the line in it), everyone further back either needs one of them, and is
    /// held by the head's claim on it, or needs none, and would answer as at its last ask.
    Released(&'a [Entry]),
}

/// One pass's walk down the line: what it has learnt so far.
struct Walk {
    now: Instant,
    /// The accounts whose answers may have changed since the last ask, tracked only when the
    /// pass may stop early (a release, and no gate, whose drain reads the whole line). In place
    /// for a few accounts, as the leavers below: a hand-off pass allocates nothing.
    touched: Option<SmallVec<[usize; 4]>>,
    stopped_early: bool,
    /// The earliest wake-up any waiter asked so far needs.
    /// ([`Instant::MAX`]: none yet; kept as an instant so that taking the earlier of two is one
    /// comparison.)
    wake: Instant,
    head: Option<Head>,
    /// Waiters that leave the line in this pass (granted, refused, cancelled, late).
    leaving: SmallVec<[Place; 4]>,
    /// How many waiters the gate holds (counted only with a gate).
    on_gate: usize,
    /// How many waiters were in the line when the pass began.
    total: usize,
    /// One buffer for every waiter's short list: a pass over a long line allocates nothing per
    /// waiter that is still held.
    short: Short,
}

impl Walk {
    /// Adds the accounts of `w`, which leaves the line in this pass, to the `touched` set: what
    /// it reserved or asked for is no longer set aside.
    fn touch(&mut self, w: &Waiter) {
        if let Some(touched) = &mut self.touched {
            for entry in w.demand.entries() {
                let key = account_key(entry.account());
                if !touched.contains(&key) {
                    touched.push(key);
                }
            }
        }
    }

    /// True once the head is short on every account this pass touched (see [`Scope::Released`]).
    #[inline]
    fn may_stop(&self) -> bool {
        match (&self.touched, &self.head) {
            (Some(touched), Some(head)) => touched.iter().all(|&key| head.is_short_on(key)),
            _ => false,
        }
    }
}

impl Shared {
    /// The evaluator's pass: `None` once the monitor is no longer open (the evaluator ends),
    /// else the instant to wake at.
    pub(crate) fn evaluate(self: &Arc<Shared>) -> Option<Option<Instant>> {
        let mut out = self.outbox();
        let wake = self.pass_guarded(&mut out, Scope::Full);
        self.deliver(out);
        self.is_open().then_some(wake)
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

    /// [`Shared::pass`], closing admission if the pass fails: a panic outside the accounts (which
    /// are guarded one by one) is a defect in the monitor or its gate.
    pub(crate) fn pass_guarded(
        self: &Arc<Shared>,
        out: &mut Outbox<'_>,
        scope: Scope<'_>,
    ) -> Option<Instant> {
        match catch_unwind(AssertUnwindSafe(|| self.pass(out, scope))) {
            Ok(wake) => wake,
            Err(panic) => {
                let cause = format!("a pass failed: {}", panic_message(&*panic));
                let mut st = self.state.lock();
                self.close_locked(&mut st, out, cause);
                out.seal(&self.sink);
                None
            }
        }
    }

    /// One pass over the line. Returns the instant to wake at, `None` to sleep until rung (for
    /// a pass that stopped early, only a wake-up earlier than the one already planned).
    ///
    /// The walk holds the monitor lock for at most [`Shared::pass_batch`] waiters at a time
    /// (without a gate, whose count of the waiters it holds is kept over the whole walk): then
    /// what the batch decided is settled (its leavers leave, the line's size is published), the
    /// lock is let go while its grants are woken and its leavers dropped, and the walk goes on
    /// from the next waiter, the head and what it learnt kept. Arrivals and `try_admit`s take
    /// the lock in between; an arrival parks behind the head as at any time. A pass that another
    /// thread starts meanwhile does not interleave with this one: it leaves a note
    /// (`pass_again`) and this walk, once done, walks the line again from the start (its head may
    /// have left, or been granted, in between), once on this thread and after that by the
    /// evaluator.
    fn pass(self: &Arc<Shared>, out: &mut Outbox<'_>, scope: Scope<'_>) -> Option<Instant> {
        let mut scope = scope;
        let mut rerun = false;
        loop {
            let (wake, again) = self.walk(out, scope);
            if !again {
                return wake;
            }
            if rerun {
                // Twice in a row another thread's pass waited on this one: the evaluator walks
                // the line next, so that no thread keeps doing others' passes.
                self.bell.ring();
                return wake;
            }
            rerun = true;
            scope = Scope::Full;
        }
    }

    /// One walk of the line, in batches. Returns the instant to wake at, and whether another
    /// pass asked to run while this one let go of the lock (so the line is to be walked again).
    fn walk(self: &Arc<Shared>, out: &mut Outbox<'_>, scope: Scope<'_>) -> (Option<Instant>, bool) {
        let now = self.clock.now();
        // What the walk needs from the heap (past a few accounts and leavers, nothing) is
        // allocated before the lock is taken.
        let touched = match scope {
            Scope::Released(entries) if self.gate.is_none() => {
                Some(entries.iter().map(|e| account_key(e.account())).collect())
            }
            _ => None,
        };
        let (leaving, short) = (SmallVec::new(), Short::new());
        let mut st = self.state.lock();
        if !matches!(st.phase, Phase::Open) {
            return (None, false);
        }
        if st.pass_running {
            // Another thread's pass is between two batches: it walks the line again when done.
            st.pass_again = true;
            return (None, false);
        }
        if st.queue.is_empty() {
            if let Some(gate) = &self.gate {
                gate.holding(0);
            }
            st.planned_wake = None;
            return (None, false);
        }
        let mut walk = Walk {
            now,
            touched,
            stopped_early: false,
            wake: Instant::MAX,
            head: None,
            leaving,
            // Only a gate needs the count (and counting reads the whole line).
            on_gate: if self.gate.is_some() { st.on_gate() } else { 0 },
            total: st.queue.len(),
            short,
        };
        // Only a monitor without a gate walks in batches (the gate's count is the whole line's).
        let batch = if self.gate.is_some() {
            usize::MAX
        } else {
            self.pass_batch
        };
        let mut slot = st.queue.first_slot();
        loop {
            let mut paused = false;
            let mut visited = 0;
            while let Some(at) = slot {
                // A full batch ends when ending it helps someone: a thread blocked on the lock,
                // or waiters this walk granted or refused, to wake. A walk over waiters that all
                // stay (a deadline's pass over a long line nobody else wants) runs on.
                if visited >= batch {
                    if out.has_work() || self.state.contended() {
                        paused = true;
                        break;
                    }
                    // Nobody to let in yet: look again a few waiters on, not at every one.
                    visited -= RECHECK_EVERY.min(visited);
                }
                visited += 1;
                let (place, next, hot, w) = st.queue.step(at);
                slot = next;
                if self.visit(out, &mut walk, place, hot, w) {
                    walk.stopped_early = true;
                    break;
                }
            }
            if !paused {
                break;
            }
            // The batch's decisions stand: its leavers leave and the line's size is published
            // before anyone else takes the lock; its grants are woken and its leavers dropped
            // outside it. The line keeps the walk's place meanwhile (a waiter leaving moves it
            // on, one arriving at the end is visited).
            self.leave_batch(&mut st, &mut walk, out);
            st.queue.hold_cursor(slot);
            st.pass_running = true;
            out.seal(&self.sink);
            drop(st);
            out.flush(&self.sink);
            // The standard mutex does not hand itself over: without this, the admits blocked on
            // the lock would wake to find this walk holding it again, batch after batch.
            self.state.make_way();
            st = self.state.lock();
            if !matches!(st.phase, Phase::Open) {
                // Stopped or closed meanwhile: what is left of the line is the stop's.
                st.pass_running = false;
                st.pass_again = false;
                return (None, false);
            }
            walk.total = st.queue.len();
            slot = st.queue.resume();
        }
        let wake = self.end_pass(&mut st, walk, out);
        st.pass_running = false;
        let again = std::mem::take(&mut st.pass_again);
        out.seal(&self.sink);
        (wake, again)
    }

    /// Removes the leavers of the batch just walked and publishes the line's new size.
    fn leave_batch(&self, st: &mut MonitorGuard<'_, State>, walk: &mut Walk, out: &mut Outbox<'_>) {
        for place in walk.leaving.drain(..) {
            st.queue.remove(place);
        }
        out.emptied(&mut st.queue);
        if self.bell.parked.load(Ordering::Relaxed) != st.queue.len() {
            self.publish_parked(st.queue.len());
        }
    }

    /// Asks waiter `w` (at `place`) in this pass; true when the pass may stop here.
    fn visit(
        self: &Arc<Shared>,
        out: &mut Outbox<'_>,
        walk: &mut Walk,
        place: Place,
        hot: &mut Hot,
        w: &mut Waiter,
    ) -> bool {
        // Leavers first: a late waiter times out (a cancelled one left when it was cancelled).
        if hot.is_due(walk.now) {
            let error = timed_out(w, walk.now);
            walk.touch(w);
            self.leave(out, hot, w, error, &mut walk.on_gate);
            walk.leaving.push(place);
            return false;
        }
        walk.wake = walk.wake.min(hot.deadline_or_max());
        let is_head = walk.head.is_none();
        // Only a gate is shown the waiter; without one this costs nothing.
        let view = self.gate.is_some().then(|| gate_view(hot, is_head, walk));
        match self.attempt(hot, w, walk.head.as_ref(), view, walk.now, &mut walk.short) {
            Attempt::Granted => {
                walk.touch(w);
                let remaining = walk.total - walk.leaving.len() - 1;
                self.grant_waiter(out, hot, w, remaining, &mut walk.on_gate, walk.now);
                walk.leaving.push(place);
                false
            }
            Attempt::Refused(error) => {
                walk.touch(w);
                self.leave(out, hot, w, *error, &mut walk.on_gate);
                walk.leaving.push(place);
                false
            }
            Attempt::Held { wake: at } => {
                let gate_held = walk.short.contains(None);
                if gate_held != hot.on_gate {
                    hot.on_gate = gate_held;
                    if gate_held {
                        walk.on_gate += 1;
                    } else {
                        walk.on_gate -= 1;
                    }
                }
                self.note_held(out, hot, w, &walk.short, walk.now);
                if is_head {
                    let mut head = Head::of(&w.demand, &walk.short);
                    head.gate_hold = gate_held.then_some(at);
                    walk.head = Some(head);
                }
                walk.wake = walk.wake.min(at.unwrap_or(Instant::MAX));
                walk.may_stop()
            }
        }
    }

    /// Removes the pass's leavers, publishes the line's new size and plans the next wake-up.
    fn end_pass(
        &self,
        st: &mut MonitorGuard<'_, State>,
        walk: Walk,
        out: &mut Outbox<'_>,
    ) -> Option<Instant> {
        for &place in &walk.leaving {
            st.queue.remove(place);
        }
        out.emptied(&mut st.queue);
        if let Some(gate) = &self.gate {
            gate.holding(walk.on_gate);
        }
        // Written only under the monitor lock, so a read here is exact; an unchanged count is
        // not written again (a sequentially consistent store costs a line other cores read).
        if self.bell.parked.load(Ordering::Relaxed) != st.queue.len() {
            self.publish_parked(st.queue.len());
        }
        if st.queue.is_empty() {
            st.planned_wake = None;
            return None;
        }
        // An instant in the past means "now"; an account that keeps answering so while refusing
        // must not spin the evaluator, so such a wake-up is re-asked a millisecond later.
        let now = walk.now;
        let wake = (walk.wake != Instant::MAX).then_some(walk.wake).map(|at| {
            if at <= now {
                now.saturating_add(MIN_RECHECK)
            } else {
                at
            }
        });
        if walk.stopped_early {
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

    /// Asks the gate and every account about waiter `w`, and takes its whole demand if it fits.
    fn attempt(
        &self,
        hot: &Hot,
        w: &Waiter,
        head: Option<&Head>,
        view: Option<GateView>,
        now: Instant,
        short: &mut Short,
    ) -> Attempt {
        short.clear();
        // Every account is asked at the pass's one instant.
        let now = Reading::taken_at(&*self.clock, now);
        // The entries as the slot keeps them: the record is not read unless something changes.
        let demand = hot.entries();
        if demand.is_empty() {
            return Attempt::Granted;
        }
        if let (Some(gate), Some(view)) = (&self.gate, view) {
            let held = match head {
                Some(Head {
                    gate_hold: Some(until),
                    ..
                }) => Some(*until),
                _ => match gate.check(view) {
                    GateAnswer::Hold { until } => Some(until),
                    _ => None,
                },
            };
            if let Some(wake) = held {
                // The gate holds it, but an account that can never grant it still refuses it.
                if let Some(error) = refusal_of(demand, &w.ctx, &now) {
                    return Attempt::Refused(Box::new(error));
                }
                short.push(None);
                return Attempt::Held { wake };
            }
        }
        let attempt = ask_demand(
            &self.bell,
            demand,
            &w.ctx,
            head,
            Learn::EveryShort,
            &now,
            short,
        );
        if let (Attempt::Granted, Some(gate), Some(view)) = (&attempt, &self.gate, view) {
            gate.passed(view);
        }
        attempt
    }

    /// Records that the accounts in `short` (`None`: the gate) hold waiter `w` at `now`: holds
    /// that ended are closed, new ones opened with a `Held` event.
    #[inline]
    pub(crate) fn note_held(
        &self,
        out: &mut Outbox<'_>,
        hot: &mut Hot,
        w: &mut Waiter,
        short: &Short,
        now: Instant,
    ) {
        // The same accounts short as last time, all still holding: nothing to record (and the
        // waiter's record is not read). One comparison for the common case.
        let holding = short.holding();
        if holding == hot.holding && holding.is_exact() {
            return;
        }
        self.record_held(out, hot, w, short, now);
    }

    /// [`Shared::note_held`] past its first comparison: holds that ended are closed, new ones
    /// opened (with their `Held` events). Out of line: a pass rarely gets here.
    #[inline(never)]
    fn record_held(
        &self,
        out: &mut Outbox<'_>,
        hot: &mut Hot,
        w: &mut Waiter,
        short: &Short,
        now: Instant,
    ) {
        let gate_only = short.is_gate_only();
        // Held by the gate again, whatever else held it before: the gate asked nothing else.
        if gate_only && hot.holding.has_gate() && hot.holding.is_exact() {
            return;
        }
        if !gate_only {
            // Every account was asked: those no longer short stopped holding the waiter now.
            for hold in &mut w.held {
                let still = short.contains(hold.entry());
                if still {
                    hold.reopen();
                } else {
                    hold.end(now);
                }
            }
        }
        for s in short.iter() {
            let entry = s.map(|i| &w.demand.entries()[i]);
            if let Some(hold) = w.held.iter_mut().find(|h| h.entry() == s) {
                hold.reopen();
                continue;
            }
            // The first hold sits in the record; past it, room for exactly one more at a time:
            // a waiter is held by one or two accounts.
            w.held.reserve_exact(1);
            w.held.push(Hold::new(s, now));
            out.event(EventKind::Held, &w.ctx, || match entry {
                Some(e) => vec![EventEntry {
                    account: e.account().name().to_owned(),
                    category: e.account().category(),
                    amount: e.amount(),
                }],
                None => vec![EventEntry {
                    account: self.gate_name().to_owned(),
                    category: self
                        .gate
                        .as_ref()
                        .map_or(Category::custom("gate"), |g| g.category()),
                    amount: Amount::ZERO,
                }],
            });
        }
        hot.holding = Holding::now_of(&w.held);
    }

    fn grant_waiter(
        self: &Arc<Shared>,
        out: &mut Outbox<'_>,
        hot: &Hot,
        w: &mut Waiter,
        remaining: usize,
        on_gate: &mut usize,
        now: Instant,
    ) {
        // The pass's instant, at which every account was asked: a waiter that parked after it
        // was read reports a wait of zero.
        // The holds move into the grant as they are; it reads them only when asked.
        let waits = Waits {
            holds: std::mem::take(&mut w.held),
            asked_at: w.asked_at,
            granted_at: now,
        };
        let wall_wait = waits.wall_wait();
        out.event(
            EventKind::GrantedFromHold {
                wait: wall_wait,
                waiters: remaining,
            },
            &w.ctx,
            || entry_events(w.demand.entries()),
        );
        let demand = std::mem::take(&mut w.demand);
        let grant = Grant::new(demand, self.clone(), w.ctx.clone(), waits);
        if hot.on_gate {
            *on_gate -= 1;
        }
        out.finish(&w.cell, Ok(grant));
    }

    /// Refuses waiter `w`, which leaves the line in this pass.
    fn leave(
        &self,
        out: &mut Outbox<'_>,
        hot: &Hot,
        w: &mut Waiter,
        error: AdmitError,
        on_gate: &mut usize,
    ) {
        out.rejected(&w.ctx, &w.demand, &error);
        if hot.on_gate {
            *on_gate -= 1;
        }
        out.finish(&w.cell, Err(error));
    }
}

/// What the gate is shown of the waiter whose slot keeps `hot`.
fn gate_view(hot: &Hot, is_head: bool, walk: &Walk) -> GateView {
    let elsewhere = !hot.on_gate && hot.holding.has_account();
    let view = GateView::at(walk.now)
        .with_held(walk.on_gate - usize::from(hot.on_gate))
        .with_on_gate(hot.on_gate)
        .with_elsewhere(elsewhere);
    if is_head {
        view
    } else {
        view.behind_the_head()
    }
}

/// The error of waiter `w`, whose deadline passed by `now` (a late waiter leaves before it is
/// asked).
///
/// A cancelled job is not looked for by a pass. Cancelling runs the listener the waiter's ticket
/// registered on its context, which takes the waiter out of the line at once (and a context
/// cancelled before the listener was registered has the ticket do the same), so the pass never
/// reads the job's context: one cold cache line per waiter fewer.
#[cold]
fn timed_out(w: &Waiter, now: Instant) -> AdmitError {
    AdmitError::TimedOut {
        job: w.ctx.id(),
        waited: now.saturating_duration_since(w.asked_at),
        timeout: w.timeout.unwrap_or_default(),
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use std::sync::{Arc, Mutex, OnceLock};

    use crate::event::{Event, EventKind, EventSink, SinkError};
    use crate::{
        Account, AccountStatus, Amount, Answer, Ask, Category, Demand, JobContext, Monitor,
        Refusal, Replenishment, WakeFn, WakeSlot,
    };

    /// Permits under a lock: the smallest release account.
    struct Permits {
        free: Mutex<u64>,
        wake: WakeSlot,
    }

    #[derive(Debug, serde::Serialize)]
    struct Free(u64);

    impl AccountStatus for Free {
        fn name(&self) -> &str {
            "permits"
        }
        fn category(&self) -> Category {
            Category::custom("permits")
        }
        fn summary(&self) -> String {
            format!("{} free", self.0)
        }
    }

    impl Account for Permits {
        fn name(&self) -> &str {
            "permits"
        }
        fn category(&self) -> Category {
            Category::custom("permits")
        }
        fn replenishment(&self) -> Replenishment {
            Replenishment::Release
        }
        fn ask(&self, mine: Amount, ask: Ask) -> Answer {
            let mut free = self.free.lock().unwrap();
            if mine.primary() > 1_000 {
                return Answer::Never(Refusal::new("too many"));
            }
            if mine.primary() + ask.reserved_ahead().primary() > *free {
                return Answer::NotNow(None);
            }
            if ask.takes() {
                *free -= mine.primary();
            }
            Answer::Taken
        }
        fn give(&self, amount: Amount) {
            *self.free.lock().unwrap() += amount.primary();
            self.wake.notify();
        }
        fn status(&self) -> Box<dyn AccountStatus> {
            Box::new(Free(*self.free.lock().unwrap()))
        }
        fn on_capacity_change(&self, wake: Option<WakeFn>) {
            self.wake.install(wake);
        }
    }

    /// Records each grant from the line with the line's length seen as it is emitted: events
    /// are emitted with the monitor lock free, so the sink may look at its monitor.
    #[derive(Default)]
    struct LineSeen {
        monitor: OnceLock<Monitor>,
        seen: Mutex<Vec<(String, usize)>>,
    }

    impl EventSink for LineSeen {
        fn emit(&self, event: &Event) -> Result<(), SinkError> {
            if let EventKind::GrantedFromHold { .. } = event.kind {
                let waiting = self.monitor.get().map_or(usize::MAX, Monitor::queue_size);
                self.seen
                    .lock()
                    .unwrap()
                    .push((event.job.name.to_string(), waiting));
            }
            Ok(())
        }
    }

    #[test]
    fn a_release_granting_a_long_line_lets_go_of_the_lock_between_batches() {
        let sink = Arc::new(LineSeen::default());
        let monitor = Monitor::builder()
            .manual_passes()
            .pass_batch(2)
            .sink(sink.clone())
            .build();
        assert!(sink.monitor.set(monitor.clone()).is_ok());
        let permits = Arc::new(Permits {
            free: Mutex::new(5),
            wake: WakeSlot::new(),
        });
        let units = |n: u64| Demand::new().with(permits.clone(), Amount::units(n));
        let holder = monitor
            .admit_blocking(units(5), &JobContext::new("holder"), None)
            .unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut parked: Vec<_> = (0..5)
            .map(|i| {
                let mut admit =
                    Box::pin(monitor.admit(units(1), &JobContext::new(format!("w{i}")), None));
                assert!(admit.as_mut().poll(&mut cx).is_pending());
                admit
            })
            .collect();
        // The release's pass grants the line in three critical sections of at most two waiters;
        // between them the granted leave the line and are told while the lock is free.
        drop(holder);
        let seen = sink.seen.lock().unwrap().clone();
        let expected: Vec<(String, usize)> =
            [("w0", 3), ("w1", 3), ("w2", 1), ("w3", 1), ("w4", 0)]
                .into_iter()
                .map(|(job, waiting)| (job.to_owned(), waiting))
                .collect();
        assert_eq!(seen, expected);
        for admit in &mut parked {
            assert!(matches!(
                admit.as_mut().poll(&mut cx),
                std::task::Poll::Ready(Ok(_))
            ));
        }
        drop(parked);
        assert_eq!(*permits.free.lock().unwrap(), 5);
        monitor.stop();
    }
}
