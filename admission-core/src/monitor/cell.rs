//! The one-shot slot through which the evaluator hands a parked waiter its outcome.
//!
//! Lock order: the monitor lock, then a cell's lock; never the other way. A cell is filled under
//! the monitor lock (so "still in the line" and "no outcome yet" are the same fact), and the
//! waiter is woken after the monitor lock is released. Nothing a caller gave the cell (a waker)
//! is cloned, called or dropped under the cell's lock.

use std::task::Waker;

use super::grant::Grant;
use crate::error::AdmitError;
use crate::sync::{Condvar, Mutex};

pub(crate) type Outcome = Result<Grant, AdmitError>;

#[derive(Default)]
struct Slot {
    outcome: Option<Outcome>,
    /// True once the outcome was filled, even after it was taken: a cell is filled once.
    filled: bool,
    waker: Option<Waker>,
}

pub(crate) struct Cell {
    slot: Mutex<Slot>,
    ready: Condvar,
}

impl Cell {
    pub(crate) fn new() -> Cell {
        Cell {
            slot: Mutex::new(Slot::default()),
            ready: Condvar::new(),
        }
    }

    /// Stores the outcome unless one was stored before (then `outcome` is handed back).
    pub(crate) fn fill(&self, outcome: Outcome) -> Result<(), Outcome> {
        let mut slot = self.slot.lock();
        if slot.filled {
            return Err(outcome);
        }
        slot.filled = true;
        slot.outcome = Some(outcome);
        Ok(())
    }

    /// Wakes whoever waits on the cell; called after the monitor lock is released.
    pub(crate) fn wake(&self) {
        let waker = {
            let mut slot = self.slot.lock();
            self.ready.notify_all();
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Takes the outcome if it is there; otherwise remembers `waker` for [`Cell::wake`].
    ///
    /// Nothing of the caller's runs under the cell's lock: a waker is cloned before the lock is
    /// taken again to store it, and the waker it replaces is dropped after the lock is released.
    /// A waker may own its task's state, a [`Grant`] among it; dropping that grant runs a pass,
    /// which may fill this very cell (and the fill locks it).
    pub(crate) fn poll(&self, waker: &Waker) -> Option<Outcome> {
        {
            let mut slot = self.slot.lock();
            if let Some(outcome) = slot.outcome.take() {
                return Some(outcome);
            }
            if slot.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                return None;
            }
        }
        // A new waker (the first, or the task moved): cloned with no lock of ours held.
        let new = waker.clone();
        let (outcome, replaced) = {
            let mut slot = self.slot.lock();
            match slot.outcome.take() {
                // Filled meanwhile: the clone is not needed.
                Some(outcome) => (Some(outcome), Some(new)),
                None => (None, slot.waker.replace(new)),
            }
        };
        drop(replaced);
        outcome
    }

    /// Takes the outcome if it is there.
    pub(crate) fn take(&self) -> Option<Outcome> {
        self.slot.lock().outcome.take()
    }

    /// Parks the calling thread until the outcome is there, then takes it.
    /// Waits at most `timeout` (real time) for the outcome.
    pub(crate) fn wait_for(&self, timeout: std::time::Duration) -> Option<Outcome> {
        let mut slot = self.slot.lock();
        if let Some(outcome) = slot.outcome.take() {
            return Some(outcome);
        }
        slot = self.ready.wait_for(slot, timeout);
        slot.outcome.take()
    }

    pub(crate) fn wait(&self) -> Outcome {
        let mut slot = self.slot.lock();
        loop {
            if let Some(outcome) = slot.outcome.take() {
                return outcome;
            }
            slot = self.ready.wait(slot);
        }
    }
}
