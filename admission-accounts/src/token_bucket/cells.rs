//! [`Cells`]: the bucket's state behind its one lock, with a narrow guard for the take.
//!
//! # Why a lock
//!
//! A take must settle, check and debit two exact levels at once. Exact, a level is a count of
//! sixty-billionths of a token (up to `budget x 6e10`, about 100 bits for the largest budgets) plus
//! a remainder, and the two levels move together with the instant they were settled at: for the
//! budgets a bucket accepts (up to `u64::MAX` a minute) that is well over 128 bits, more than one
//! compare-and-swap can move. A theoretical arrival time in whole nanoseconds would fit, but a
//! token of a budget that does not divide a minute's nanoseconds (90,000 a minute is 666,666.67 ns
//! a token) is not a whole number of nanoseconds, so every take would round and the levels would
//! drift from the exact ones. A word that holds the exact state only for small enough budgets
//! would need a second, locked, path for the rest, and the fastest rates would take it. Nor
//! would one compare-and-swap be much cheaper than an uncontended lock: a loop on a 128-bit word
//! is a load and a `cmpxchg16b`.
//!
//! So the state stays whole behind a lock held only for arithmetic: the clock is read before it is
//! taken, and nothing inside allocates, formats, blocks or calls out, so it is held for tens of
//! nanoseconds. That makes it the one place in the workspace where a spin lock is the right lock
//! (`spin`'s `SpinMutex`): taking it is one compare-and-swap and releasing it a plain store,
//! where a parking mutex (`parking_lot`, the standard library's) pays a second atomic
//! read-modify-write on release to learn whether anyone sleeps; measured on the `single_limit`
//! bench, that second operation is the difference between 1.0-1.3x governor's `check_n` and
//! 1.7-1.9x. A thread that finds it taken yields its time slice at once ([`Yield`]) rather than
//! spinning: on a machine with fewer cores than threads, a holder preempted mid-take gets the
//! core back instead of watching others spin.
//!
//! # Two guards
//!
//! [`Cells::hold`] is the take's: it reads the budgets, the throttle's tenths and the levels, and
//! writes back only the levels. Every rarer operation (a budget or throttle change, a status
//! read) takes [`Cells::lock`], the whole [`State`].

use spin::mutex::{SpinMutex, SpinMutexGuard};
use spin::relax::Yield;

use super::{Levels, State, TokenBucketConfig};

/// The state and its lock.
#[derive(Debug)]
pub(super) struct Cells(SpinMutex<State, Yield>);

impl Cells {
    pub(super) fn new(state: &State) -> Cells {
        Cells(SpinMutex::new(*state))
    }

    /// The take's guard.
    #[inline]
    pub(super) fn hold(&self) -> Hold<'_> {
        Hold(self.0.lock())
    }

    /// The whole state, for every rarer operation.
    pub(super) fn lock(&self) -> Locked<'_> {
        self.0.lock()
    }

    /// [`Cells::lock`] if the lock is free now.
    pub(super) fn try_lock(&self) -> Option<Locked<'_>> {
        self.0.try_lock()
    }
}

/// The take's guard: the budgets, the throttle's tenths and the levels.
pub(super) struct Hold<'a>(SpinMutexGuard<'a, State>);

impl Hold<'_> {
    #[inline]
    pub(super) fn config(&self) -> TokenBucketConfig {
        self.0.config
    }

    #[inline]
    pub(super) fn tenths(&self) -> u32 {
        self.0.throttle.tenths()
    }

    #[inline]
    pub(super) fn levels(&self) -> Levels {
        self.0.levels
    }

    #[inline]
    pub(super) fn set_levels(&mut self, levels: &Levels) {
        self.0.levels = *levels;
    }
}

/// The whole state, locked.
pub(super) type Locked<'a> = SpinMutexGuard<'a, State>;
