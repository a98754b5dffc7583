//! A release: what a [`Grant`](super::grant::Grant) gives back, and who gets it.
//!
//! A grant settles through [`Owner::settle`]: every account gets its amount back (a metered
//! debit only on a rollback), with this monitor's own wake-up muted meanwhile, the gate hears of
//! the completion and the sink of the release; then, if anyone waits, the pass runs on the
//! giver's thread (a direct hand-off, as tokio's semaphore hands a released permit over, rather
//! than waking the evaluator and leaving the waiter two context switches away). That pass may
//! stop early: see [`Scope::Released`].

use std::sync::Arc;

use crate::account::Replenishment;
use crate::context::JobContext;
use crate::demand::Entry;
use crate::event::EventKind;

use super::evaluator::handing_off;
use super::grant::Owner;
use super::outbox::{Events, entry_events};
use super::pass::Scope;
use super::shared::Shared;

impl Owner for Shared {
    /// Gives a grant back and lets the line know: the gate hears of the completion, the sink of
    /// the release, and whoever can go now is granted on this thread (a direct hand-off, rather
    /// than waking the evaluator and leaving the waiter two context switches away, as tokio's
    /// semaphore hands a released permit over).
    fn settle(&self, entries: &[Entry], ctx: &JobContext, rolled_back: bool) {
        // The pass below covers every waiter these gives could free, so the accounts' own
        // wake-ups to this monitor stay quiet meanwhile instead of waking the evaluator for
        // nothing.
        handing_off(&self.bell, || {
            for entry in entries {
                if rolled_back || entry.account().replenishment() == Replenishment::Release {
                    entry.account().give(entry.amount());
                }
            }
        });
        if !entries.is_empty()
            && let Some(gate) = &self.gate
        {
            gate.completed();
        }
        if self.sink.is_installed() {
            let mut events = Events::new(&*self.clock, &self.sink);
            events.event(EventKind::Released { rolled_back }, ctx, || {
                entry_events(entries)
            });
            events.deliver(&self.sink);
        }
        // An orchestrator's empty grant gives nothing back and completes nothing: no pass.
        if !entries.is_empty()
            && self.bell.someone_waiting()
            && let Some(me) = self.me.upgrade()
        {
            me.evaluate_here(Scope::Released(entries));
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
