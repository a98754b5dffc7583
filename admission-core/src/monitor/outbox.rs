//! The outbox: what a critical section leaves to do once the monitor lock is released (events to
//! emit, waiters to wake, grants to roll back), and the sink events go to.
//!
//! Events are built under the lock, where the transition is exact, and emitted after it, so a
//! slow sink never holds the line. With no sink installed no event is ever built.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::clock::Clock;
use crate::context::JobContext;
use crate::demand::{Demand, Entry};
use crate::error::AdmitError;
use crate::event::{Event, EventEntry, EventKind, EventSink};
use crate::sync::{AtomicBool, Ordering, RwLock};

use super::ask::panic_message;
use super::cell::{Cell, Outcome};
use super::grant::Grant;

/// The monitor's event sink, swappable at any time.
pub(crate) struct Sink {
    sink: RwLock<Option<Arc<dyn EventSink>>>,
    /// Whether a sink is installed: read without the lock by every transition.
    installed: AtomicBool,
}

impl Sink {
    pub(crate) fn new(sink: Option<Arc<dyn EventSink>>) -> Sink {
        Sink {
            installed: AtomicBool::new(sink.is_some()),
            sink: RwLock::new(sink),
        }
    }

    pub(crate) fn set(&self, sink: Option<Arc<dyn EventSink>>) {
        let mut slot = self.sink.write();
        self.installed.store(sink.is_some(), Ordering::Release);
        *slot = sink;
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

/// What a critical section leaves to do once the lock is released.
pub(crate) struct Outbox<'a> {
    clock: &'a dyn Clock,
    /// `None` when no sink is installed: then no event is ever built.
    events: Option<Vec<Event>>,
    wake: Vec<Arc<Cell>>,
    /// Grants to roll back once the lock is released.
    discard: Vec<Grant>,
}

impl<'a> Outbox<'a> {
    /// An empty outbox; events are built only if `sink` has a sink installed now.
    pub(crate) fn new(clock: &'a dyn Clock, sink: &Sink) -> Outbox<'a> {
        Outbox {
            clock,
            events: sink.is_installed().then(Vec::new),
            wake: Vec::new(),
            discard: Vec::new(),
        }
    }

    /// True when events are being collected.
    pub(crate) fn wants_events(&self) -> bool {
        self.events.is_some()
    }

    /// Records an event of `kind` for job `ctx` on `entries`, stamped now; built only when a
    /// sink is installed.
    pub(crate) fn event(
        &mut self,
        kind: EventKind,
        ctx: &JobContext,
        entries: impl FnOnce() -> Vec<EventEntry>,
    ) {
        if let Some(events) = &mut self.events {
            events.push(Event {
                kind,
                at: self.clock.now(),
                job: ctx.snapshot().clone(),
                entries: entries(),
            });
        }
    }

    /// Records the refusal of `demand` for job `ctx` with `error`.
    pub(crate) fn rejected(&mut self, ctx: &JobContext, demand: &Demand, error: &AdmitError) {
        if self.wants_events() {
            let kind = EventKind::Rejected {
                reason: error.reason(),
                message: error.to_string(),
            };
            self.event(kind, ctx, || entry_events(demand.entries()));
        }
    }

    /// Fills a waiter's cell with `outcome` and schedules its wake-up.
    pub(crate) fn finish(&mut self, cell: &Arc<Cell>, outcome: Outcome) {
        if let Err(Ok(grant)) = cell.fill(outcome) {
            // Unreachable by construction (a waiter leaves the line when it is filled); if it
            // ever happened, the grant must not leak. It is rolled back once the lock is free.
            self.discard.push(grant);
        }
        self.wake.push(cell.clone());
    }

    /// Emits the events, then wakes the waiters, then rolls back what was discarded. Called with
    /// no lock held.
    pub(crate) fn deliver(self, sink: &Sink) {
        if let Some(events) = self.events
            && !events.is_empty()
        {
            sink.emit(&events);
        }
        for cell in self.wake {
            cell.wake();
        }
        for mut grant in self.discard {
            grant.rollback();
        }
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
