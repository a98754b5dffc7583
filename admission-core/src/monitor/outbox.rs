//! The outbox: what a critical section leaves to do once the monitor lock is released (events to
//! emit, waiters to wake, grants to roll back, accounts and a slab to drop), and the sink events
//! go to.
//!
//! Nothing a caller gave the monitor is dropped under its lock: an account the monitor stops
//! watching is moved here and dropped once the lock is released, since dropping the last handle
//! to it runs code that is not ours. (A waiter that leaves the line drops nothing here: its
//! demand and context stay in its record, which its owner drops.)
//!
//! Events are built under the lock, where the transition is exact, and emitted after it, so a
//! slow sink never holds the line. With no sink installed no event is ever built.
//!
//! Events reach the sink in the order of the critical sections that built them: each critical
//! section that changes the line queues its events before it releases the lock
//! ([`Outbox::seal`]), and one thread at a time hands the queue to the sink, in order
//! ([`Sink::drain`]). Without that, a job whose arriving thread was preempted between parking and
//! emitting could have its `granted_from_hold`, built later by a pass on another thread, reach the
//! sink before its `held`. A thread that finds another handing events over leaves its own to that
//! one and goes on, so a slow sink delays events but never an admission, and a sink may call into
//! its monitor (what that queues is emitted by the loop already running). A caller's events have
//! reached the sink when its `deliver` returns unless another thread was handing events over at
//! that moment.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::clock::Clock;
use crate::context::JobContext;
use crate::demand::{Demand, Entry};
use crate::error::AdmitError;
use crate::event::{Event, EventEntry, EventKind, EventSink};
use crate::sync::{AtomicBool, Mutex, Ordering, RwLock};

use super::ask::panic_message;
use super::cell::{CellRef, Notify, Outcome};
use super::grant::Grant;
use super::line::{Emptied, Line};
use crate::account::AccountRef;

/// The monitor's event sink, swappable at any time.
pub(crate) struct Sink {
    sink: RwLock<Option<Arc<dyn EventSink>>>,
    /// Whether a sink is installed: read without the lock by every transition.
    installed: AtomicBool,
    /// Events built and not yet handed to the sink, in the order of their critical sections. A
    /// leaf lock: taken under the monitor lock, and nothing is taken under it.
    queue: Mutex<Vec<Event>>,
    /// Held by the one thread handing the queue to the sink.
    turn: Mutex<()>,
}

impl Sink {
    pub(crate) fn new(sink: Option<Arc<dyn EventSink>>) -> Sink {
        Sink {
            installed: AtomicBool::new(sink.is_some()),
            sink: RwLock::new(sink),
            queue: Mutex::new(Vec::new()),
            turn: Mutex::new(()),
        }
    }

    /// Queues `events` behind those already queued.
    fn queue(&self, events: &mut Vec<Event>) {
        if !events.is_empty() {
            self.queue.lock().append(events);
        }
    }

    /// Hands every queued event to the sink, in order, one thread at a time. A thread that finds
    /// another handing the queue over leaves its events to it and goes on (a slow sink delays
    /// events, never an admission); the one handing over looks at the queue again after giving
    /// up its turn, so nothing queued meanwhile is left behind.
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
    pub(crate) fn set(&self, sink: Option<Arc<dyn EventSink>>) {
        let replaced = {
            let mut slot = self.sink.write();
            self.installed.store(sink.is_some(), Ordering::Release);
            std::mem::replace(&mut *slot, sink)
        };
        drop(replaced);
    }

    pub(crate) fn is_installed(&self) -> bool {
        self.installed.load(Ordering::Acquire)
    }

    /// Hands each event to the sink. A sink that fails or panics loses that event only.
    pub(crate) fn emit(&self, events: &[Event]) {
        let Some(sink) = self.sink.read().clone() else {
            return;
        };
        for event in events {
            let failure = match catch_unwind(AssertUnwindSafe(|| sink.emit(event))) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("the sink panicked: {}", panic_message(&*panic)),
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

/// The events one step of the monitor builds, stamped on its clock: all an arrival that settles
/// without the lock has to deliver, so that path builds no [`Outbox`]. Nothing is built when no
/// sink was installed as the step began.
pub(crate) struct Events<'a> {
    clock: &'a dyn Clock,
    /// `None` when no sink is installed: then no event is ever built.
    list: Option<Vec<Event>>,
}

impl<'a> Events<'a> {
    /// None yet; events are built only if `sink` has a sink installed now.
    pub(crate) fn new(clock: &'a dyn Clock, sink: &Sink) -> Events<'a> {
        Events {
            clock,
            list: sink.is_installed().then(Vec::new),
        }
    }

    /// True when events are being collected.
    pub(crate) fn wanted(&self) -> bool {
        self.list.is_some()
    }

    /// Records an event of `kind` for job `ctx` on `entries`, stamped now; built only when a
    /// sink is installed.
    #[inline]
    pub(crate) fn event(
        &mut self,
        kind: EventKind,
        ctx: &JobContext,
        entries: impl FnOnce() -> Vec<EventEntry>,
    ) {
        if let Some(list) = &mut self.list {
            push_event(list, self.clock, kind, ctx, entries);
        }
    }

    /// Records the refusal of `demand` for job `ctx` with `error`.
    pub(crate) fn rejected(&mut self, ctx: &JobContext, demand: &Demand, error: &AdmitError) {
        if self.wanted() {
            let kind = EventKind::Rejected {
                reason: error.reason(),
                message: error.to_string(),
            };
            self.event(kind, ctx, || entry_events(demand.entries()));
        }
    }

    /// Queues the events behind those already queued and has them emitted (by this thread, or
    /// by the one handing the queue over now). Called with no lock held.
    #[inline]
    pub(crate) fn deliver(self, sink: &Sink) {
        if let Some(list) = self.list {
            hand_over(list, sink);
        }
    }
}

/// [`Events::event`] once a sink is installed.
#[inline(never)]
fn push_event(
    list: &mut Vec<Event>,
    clock: &dyn Clock,
    kind: EventKind,
    ctx: &JobContext,
    entries: impl FnOnce() -> Vec<EventEntry>,
) {
    list.push(Event {
        kind,
        at: clock.now(),
        job: ctx.snapshot().clone(),
        entries: entries(),
    });
}

/// [`Events::deliver`] once a sink is installed.
#[inline(never)]
fn hand_over(mut list: Vec<Event>, sink: &Sink) {
    sink.queue(&mut list);
    sink.drain();
}

/// What a critical section leaves to do once the lock is released.
pub(crate) struct Outbox<'a> {
    events: Events<'a>,
    /// In place for the one or two waiters a hand-off most often grants: no allocation.
    wake: SmallVec<[Notify; 2]>,
    /// Grants to roll back once the lock is released.
    discard: Vec<Grant>,
    /// Accounts no longer watched, dropped once the lock is released.
    unwatched: Vec<AccountRef>,
    /// A long line's slab, freed once the lock is released.
    emptied: Option<Emptied>,
}

impl<'a> Outbox<'a> {
    /// An empty outbox; events are built only if `sink` has a sink installed now.
    pub(crate) fn new(clock: &'a dyn Clock, sink: &Sink) -> Outbox<'a> {
        Outbox::with(Events::new(clock, sink))
    }

    /// An outbox that goes on with `events`, built before it.
    pub(crate) fn with(events: Events<'a>) -> Outbox<'a> {
        Outbox {
            events,
            wake: SmallVec::new(),
            discard: Vec::new(),
            unwatched: Vec::new(),
            emptied: None,
        }
    }

    /// Records an event of `kind` for job `ctx` on `entries`, stamped now; built only when a
    /// sink is installed.
    pub(crate) fn event(
        &mut self,
        kind: EventKind,
        ctx: &JobContext,
        entries: impl FnOnce() -> Vec<EventEntry>,
    ) {
        self.events.event(kind, ctx, entries);
    }

    /// Records the refusal of `demand` for job `ctx` with `error`.
    pub(crate) fn rejected(&mut self, ctx: &JobContext, demand: &Demand, error: &AdmitError) {
        self.events.rejected(ctx, demand, error);
    }

    /// Queues the events built so far for the sink, in this critical section's place: called
    /// under the monitor lock by every critical section that changes the line, just before it
    /// releases the lock.
    pub(crate) fn seal(&mut self, sink: &Sink) {
        if let Some(events) = &mut self.events.list {
            sink.queue(events);
        }
    }

    /// Fills a waiter's cell with `outcome` and schedules its wake-up.
    ///
    /// Called under the monitor lock for a waiter whose slot was in the line when the lock was
    /// taken, and leaves it in this critical section: the only time a cell may be touched
    /// (`cell.rs`). What is kept for after the lock is whom to wake, not the cell.
    pub(crate) fn finish(&mut self, cell: &CellRef, outcome: Outcome) {
        // SAFETY: every caller holds the monitor lock and takes the waiter that holds `cell` out
        // of the line in this critical section, as this function requires.
        let cell = unsafe { cell.get() };
        match cell.fill(outcome) {
            Ok(notify) => self.wake.push(notify),
            Err(outcome) => {
                // Unreachable by construction (a waiter leaves the line when it is filled); if
                // it ever happened, the grant must not leak. It is rolled back once the lock is
                // free.
                if let Ok(grant) = outcome {
                    self.discard.push(grant);
                }
            }
        }
    }

    /// Takes what `line` left behind when it emptied, to free it after the lock.
    pub(crate) fn emptied(&mut self, line: &mut Line) {
        if let Some(emptied) = line.take_emptied() {
            self.emptied = Some(emptied);
        }
    }

    /// Keeps `account`, no longer watched, until the lock is released.
    pub(crate) fn unwatched(&mut self, account: AccountRef) {
        self.unwatched.push(account);
    }

    /// True when delivering would wake or roll back something (events alone do not count: they
    /// wait for the next delivery).
    pub(crate) fn has_work(&self) -> bool {
        !(self.wake.is_empty() && self.discard.is_empty())
    }

    /// Delivers what this outbox holds so far and goes on empty: between the critical sections
    /// of one long pass. Called with no lock held.
    pub(crate) fn flush(&mut self, sink: &Sink) {
        let full = std::mem::replace(self, Outbox::new(self.events.clock, sink));
        full.deliver(sink);
    }

    /// Emits the events, then wakes the waiters, then rolls back what was discarded and drops
    /// what the monitor let go of. Called with no lock held.
    pub(crate) fn deliver(self, sink: &Sink) {
        if !self.has_work()
            && !self.events.wanted()
            && self.unwatched.is_empty()
            && self.emptied.is_none()
        {
            // Nothing was left for after the lock.
            return;
        }
        // Queued behind what earlier critical sections sealed, then emitted (by this thread, or
        // by the one handing the queue over now, which this waits for).
        self.events.deliver(sink);
        for notify in self.wake {
            notify.notify();
        }
        for mut grant in self.discard {
            grant.rollback();
        }
        drop(self.unwatched);
        drop(self.emptied);
    }
}

/// The event entries of a demand's entries.
pub(crate) fn entry_events(entries: &[Entry]) -> Vec<EventEntry> {
    entries
        .iter()
        .map(|e| EventEntry {
            account: e.account().name().to_owned(),
            category: e.account().category(),
            amount: e.amount(),
        })
        .collect()
}
