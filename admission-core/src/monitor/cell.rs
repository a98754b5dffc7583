//! The one-shot slot through which the evaluator hands a parked waiter its outcome.
//!
//! A cell lives where its waiter waits, not on the heap: inside the pinned [`Admit`] future, or in
//! the frame of the blocking call, beside the waiter's record (`line.rs`), which points at it
//! ([`CellRef`]) while the waiter's slot is in the line. So parking allocates no cell; the price
//! is a rule about who may touch it, which is what makes the pointer sound:
//!
//! - **The monitor touches a cell only under the monitor lock, and only while the waiter's slot
//!   is in the line.** Every fill ([`Outbox::finish`]) happens in the critical section that takes
//!   the slot out of the line; after the fill, the monitor keeps nothing of the cell but the
//!   waker it took out of it, which it calls once the lock is released.
//! - **The owner frees a cell only once its slot is out of the line, and it has seen that.**
//!   Either the owner took the outcome (the fill that put it there took the slot out of the
//!   line), or it withdrew under the monitor lock ([`Shared::withdraw`]: the slot is gone
//!   afterwards, whichever of the two removed it). The [`Admit`] future does this in its `Drop`
//!   (a pinned future is dropped before its memory is reused), the blocking call in a guard that
//!   runs even when a panic unwinds through it.
//!
//! Lock order: the monitor lock, then a cell's lock; never the other way. Nothing a caller gave the
//! cell (a waker) is cloned, called or dropped under the cell's lock.
//!
//! [`Admit`]: super::Admit
//! [`Outbox::finish`]: super::outbox::Outbox::finish
//! [`Shared::withdraw`]: super::shared::Shared::withdraw

use std::ptr::NonNull;
use std::task::Waker;
use std::time::Duration;

use super::grant::Grant;
use crate::error::AdmitError;
use crate::sync::{Mutex, thread};

pub(crate) type Outcome = Result<Grant, AdmitError>;

/// Who to wake when the outcome lands.
#[derive(Default)]
pub(crate) enum Notify {
    /// Nobody yet (a future not polled since it parked has no waker to call).
    #[default]
    Nobody,
    /// A task, through its waker.
    Task(Waker),
    /// A thread blocked in `admit_blocking`, through its handle.
    Thread(thread::Thread),
}

impl Notify {
    /// Wakes whoever this names; called with no lock held.
    pub(crate) fn notify(self) {
        match self {
            Notify::Nobody => {}
            Notify::Task(waker) => waker.wake(),
            Notify::Thread(thread) => thread.unpark(),
        }
    }
}

#[derive(Default)]
struct Slot {
    outcome: Option<Outcome>,
    /// True once the outcome was filled, even after it was taken: a cell is filled once.
    filled: bool,
    notify: Notify,
}

/// A waiter's outcome slot. See the module's documentation for who may touch it when.
pub(crate) struct Cell {
    slot: Mutex<Slot>,
}

impl Cell {
    /// An empty cell. Whoever waits on it says who they are when they find it empty: a task
    /// stores its waker at each poll ([`Cell::poll`]), a thread its handle the first time it
    /// parks ([`Cell::wait`]), so a caller granted at once pays for neither.
    pub(crate) fn new() -> Cell {
        Cell {
            slot: Mutex::new(Slot::default()),
        }
    }

    /// Stores the outcome unless one was stored before (then `outcome` is handed back), and takes
    /// out whom to wake, for the caller to wake once it holds no lock.
    pub(crate) fn fill(&self, outcome: Outcome) -> Result<Notify, Outcome> {
        let mut slot = self.slot.lock();
        if slot.filled {
            return Err(outcome);
        }
        slot.filled = true;
        slot.outcome = Some(outcome);
        Ok(std::mem::take(&mut slot.notify))
    }

    /// Takes the outcome if it is there; otherwise remembers `waker` for the fill.
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
            if let Notify::Task(stored) = &slot.notify
                && stored.will_wake(waker)
            {
                return None;
            }
        }
        // A new waker (the first, or the task moved): cloned with no lock of ours held.
        let new = Notify::Task(waker.clone());
        let (outcome, replaced) = {
            let mut slot = self.slot.lock();
            match slot.outcome.take() {
                // Filled meanwhile: the clone is not needed.
                Some(outcome) => (Some(outcome), new),
                None => (None, std::mem::replace(&mut slot.notify, new)),
            }
        };
        drop(replaced);
        outcome
    }

    /// Takes the outcome if it is there.
    pub(crate) fn take(&self) -> Option<Outcome> {
        self.slot.lock().outcome.take()
    }

    /// Takes the outcome if it is there; otherwise names the calling thread as the one the fill
    /// unparks (once: a thread that waits again is named already).
    fn take_or_name_this_thread(&self) -> Option<Outcome> {
        let mut slot = self.slot.lock();
        if let Some(outcome) = slot.outcome.take() {
            return Some(outcome);
        }
        if matches!(slot.notify, Notify::Nobody) {
            slot.notify = Notify::Thread(thread::current());
        }
        None
    }

    /// Parks the calling thread until the outcome is there, then takes it.
    pub(crate) fn wait(&self) -> Outcome {
        loop {
            if let Some(outcome) = self.take_or_name_this_thread() {
                return outcome;
            }
            // Named under the cell's lock before the look found it empty, so a fill after the
            // look unparks this thread: an unpark before this park makes it return at once, as
            // does one left over from an earlier use of the thread's token; the loop looks
            // again.
            thread::park();
        }
    }

    /// Parks the calling thread at most `timeout` (real time) for the outcome; `None` when it
    /// is not there yet (the time is up, or the thread woke early: the caller looks again).
    pub(crate) fn wait_for(&self, timeout: Duration) -> Option<Outcome> {
        if let Some(outcome) = self.take_or_name_this_thread() {
            return Some(outcome);
        }
        thread::park_timeout(timeout);
        self.take()
    }
}

/// A parked waiter's pointer to its [`Cell`] (in its record), which lives with the waiter.
pub(crate) struct CellRef(NonNull<Cell>);

// SAFETY: a `Cell` is `Sync` (its state is behind a mutex), and the pointer is followed only
// under the monitor lock, by whichever thread holds it, while the waiter's slot is in the line
// (the module's rule); moving or sharing the pointer between threads adds nothing to that.
unsafe impl Send for CellRef {}
// SAFETY: as for `Send`.
unsafe impl Sync for CellRef {}

impl CellRef {
    /// A pointer to `cell` for its waiter's record.
    ///
    /// # Safety
    ///
    /// The caller is the cell's owner and keeps the cell where it is, alive, until the slot of
    /// the waiter made with this pointer is out of the line and the owner has seen that: it took
    /// the outcome, or its withdrawal under the monitor lock returned.
    pub(crate) unsafe fn new(cell: &Cell) -> CellRef {
        CellRef(NonNull::from(cell))
    }

    /// A pointer no record will follow (records built by tests of the line's order alone).
    #[cfg(all(test, not(admission_loom)))]
    pub(crate) fn dangling() -> CellRef {
        CellRef(NonNull::dangling())
    }

    /// The cell.
    ///
    /// # Safety
    ///
    /// The caller holds the monitor lock, and the slot of the waiter that holds this pointer
    /// has been in the line since that lock was taken (it may be leaving it in this critical
    /// section).
    pub(crate) unsafe fn get(&self) -> &Cell {
        // SAFETY: the owner keeps the cell alive and in place while its slot is in the line
        // (`CellRef::new`), and the caller's lock keeps the slot from leaving it meanwhile.
        unsafe { self.0.as_ref() }
    }
}
