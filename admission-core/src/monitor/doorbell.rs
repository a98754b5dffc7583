//! The evaluator's doorbell: how events and deadlines wake the one evaluator thread.
//!
//! A ring sets a flag and, only if the flag was clear, signals the condition variable; the
//! evaluator clears the flag before each pass, so a ring during a pass causes one more pass and
//! none is lost. `ring_if_waiting` skips the ring when no one is parked, so an account's give on an
//! idle monitor costs an atomic load, not a thread wake-up.
//!
//! Why the skip is safe: a parker publishes `parked > 0` (SeqCst) and only then rings, and the pass
//! it causes re-reads every account. A giver credits its account, then issues a SeqCst fence, then
//! reads `parked`. Either the giver sees the parker (and rings), or the fence orders the credit
//! before the parker's publication, and the pass after it sees the credit: Dekker's pattern.

use std::time::Duration;

use crate::clock::{Clock, Instant};
use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, Ordering, fence};

pub(crate) struct Doorbell {
    /// How many waiters are parked in the line; written only under the monitor lock.
    pub(crate) parked: AtomicUsize,
    rung: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Doorbell {
    pub(crate) fn new() -> Doorbell {
        Doorbell {
            parked: AtomicUsize::new(0),
            rung: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Wakes the evaluator for one more pass.
    pub(crate) fn ring(&self) {
        if !self.rung.swap(true, Ordering::SeqCst) {
            drop(self.lock.lock());
            self.cv.notify_one();
        }
    }

    /// Rings only if someone is parked (see the module docs for why this loses no wake-up).
    pub(crate) fn ring_if_waiting(&self) {
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            self.ring();
        }
    }

    /// Clears the flag before a pass; a ring after this causes another pass.
    pub(crate) fn answer(&self) {
        self.rung.swap(false, Ordering::AcqRel);
    }

    /// Sleeps until rung or until `deadline` on `clock` (never, for `None`).
    pub(crate) fn sleep(&self, clock: &dyn Clock, deadline: Option<Instant>) {
        let guard = self.lock.lock();
        if self.rung.load(Ordering::SeqCst) {
            return;
        }
        match deadline.map(|d| clock.real_wait(d)) {
            None | Some(None) => drop(self.cv.wait(guard)),
            Some(Some(wait)) if wait == Duration::ZERO => {}
            Some(Some(wait)) => drop(self.cv.wait_for(guard, wait)),
        }
    }
}
