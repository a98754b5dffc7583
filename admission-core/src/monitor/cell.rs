//! The one-shot slot through which the evaluator hands a parked waiter its outcome.
//!
//! Lock order: the monitor lock, then a cell's lock; never the other way. A cell is filled under
//! the monitor lock (so "still in the line" and "no outcome yet" are the same fact), and the
//! waiter is woken after the monitor lock is released.

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
    pub(crate) fn poll(&self, waker: &Waker) -> Option<Outcome> {
        let mut slot = self.slot.lock();
        if let Some(outcome) = slot.outcome.take() {
            return Some(outcome);
        }
        match &slot.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => slot.waker = Some(waker.clone()),
        }
        None
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
