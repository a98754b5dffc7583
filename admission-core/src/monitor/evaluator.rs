//! The evaluator: the one thread that runs a pass whenever its doorbell rings or a computed
//! deadline comes due, and the doorbell itself.
//!
//! The thread starts with the first waiter that parks (or at `Monitor::start`), so no parked
//! waiter ever depends on a pass that nobody runs; a monitor that grants everything inline never
//! spawns it. What a pass does is the caller's (see `pass.rs`): this file knows the loop and the
//! bell, not the line.
//!
//! A ring sets a flag and, only if the flag was clear, signals the condition variable; the
//! evaluator clears the flag before each pass, so a ring during a pass causes one more pass and
//! none is lost. `ring_if_waiting` skips the ring when no one is parked, so an account's give on an
//! idle monitor costs an atomic load, not a thread wake-up.
//!
//! Why the skip is safe: a parker publishes `parked > 0` under the monitor lock and only then is
//! its demand asked of every account, each under the account's own lock: by the parker itself
//! (an arrival, asked as the line's tail) or by the pass its ring causes. A giver credits its
//! account under that same lock and only then reads `parked`. If the ask came before the credit,
//! the account's lock orders the parker's publication before the giver's read, so the giver sees
//! the waiter and runs or rings for a pass; otherwise the ask saw the credit. For accounts built
//! on atomics instead of a lock (whose "not now" may be a plain load) the two SeqCst fences make
//! it Dekker's pattern: the parker fences after publishing (`Shared::publish_parked`), the giver
//! before reading. The loom models `loom_fast_path_racing_a_give_never_loses_the_wake_up` and
//! `loom_an_arrival_behind_a_head_racing_a_give_never_loses_the_wake_up` check this edge (the
//! first fails, as a deadlock, if an arrival publishes after its ask), and
//! `loom_a_release_racing_a_park_on_an_atomic_account_never_loses_the_wake_up` with an account
//! on an atomic counter (it fails, as a deadlock, without the parker's fence).

use std::time::Duration;

use crate::clock::{Instant, Timer, WakeFn};
use crate::mute::{self, wake_key};
use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, Ordering, fence};

/// Runs `give_back` with `bell`'s wake-ups muted on this thread (the caller runs a pass of that
/// monitor right after): see [`crate::mute`]. The previous value is restored even if an account
/// panics.
pub(crate) fn handing_off(bell: &Doorbell, give_back: impl FnOnce()) {
    mute::muting(bell.identity(), give_back);
}

pub(crate) struct Doorbell {
    /// How many waiters are parked in the line; written only under the monitor lock.
    pub(crate) parked: AtomicUsize,
    /// The key ([`wake_key`]) of the monitor's callback that rings this bell, set once before
    /// the callback is installed anywhere: what a hand-off mutes.
    mute: AtomicUsize,
    rung: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Doorbell {
    pub(crate) fn new() -> Doorbell {
        Doorbell {
            parked: AtomicUsize::new(0),
            mute: AtomicUsize::new(0),
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

    /// Whether the doorbell was rung since the last call; clears it. For a monitor with manual
    /// passes (no evaluator clears it), a test's view of who asked for a pass.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn take_ring(&self) -> bool {
        self.rung.swap(false, Ordering::SeqCst)
    }

    /// This doorbell's identity for [`handing_off`]: its address.
    fn identity(&self) -> usize {
        self.mute.load(Ordering::Relaxed)
    }

    /// Names `kick` as the callback that rings this bell, the one a hand-off mutes.
    pub(crate) fn rung_by(&self, kick: &WakeFn) {
        self.mute.store(wake_key(kick), Ordering::Relaxed);
    }

    /// Rings only if someone is parked (see the module docs for why this loses no wake-up), and
    /// not while this thread is handing back a grant of this same monitor (it runs the pass
    /// itself).
    pub(crate) fn ring_if_waiting(&self) {
        if mute::muted() == self.identity() {
            return;
        }
        if self.someone_waiting() {
            self.ring();
        }
    }

    /// True if a waiter is parked, read after the caller's give (see the module docs).
    pub(crate) fn someone_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        self.parked.load(Ordering::SeqCst) > 0
    }

    /// Clears the flag before a pass; a ring after this causes another pass.
    pub(crate) fn answer(&self) {
        self.rung.swap(false, Ordering::AcqRel);
    }

    /// Sleeps until rung or until `deadline` on `clock` (never, for `None`).
    pub(crate) fn sleep(&self, clock: &dyn Timer, deadline: Option<Instant>) {
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

/// The evaluator's loop: answer the bell, run `pass`, sleep until rung or until the instant the
/// pass asked to be woken at. Returns when `pass` says the monitor is no longer open (`None`).
pub(crate) fn run(
    bell: &Doorbell,
    clock: &dyn Timer,
    mut pass: impl FnMut() -> Option<Option<Instant>>,
) {
    loop {
        bell.answer();
        let Some(wake) = pass() else {
            return;
        };
        bell.sleep(clock, wake);
    }
}
