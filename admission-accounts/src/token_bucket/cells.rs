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
//! # Why a lock that never blocks
//!
//! A waiter never sleeps: it yields in a loop until the lock is free. That is a busy wait, which
//! the workspace allows only where a bench in the repository shows it winning in CPU time (the
//! process's user + system time), not only in wall time, in the same run (issue 38). The bench is
//! `benches/benches/bucket_lock.rs`, run by `benches/scripts/bucket_lock.sh`: it builds this
//! bucket a second time with `RUSTFLAGS='--cfg admission_bucket_lock="parking_lot"'`, which puts
//! the state behind parking_lot's `Mutex` (spins a few times, then blocks) and changes nothing
//! else, and runs the two builds in turn, on one thread and on 4 and 16 threads sharing one
//! bucket (2 and 8 threads a core on the 2-CPU machine it was run on, so holders are preempted
//! mid-take). In the run of 4 rounds that chose this lock (on a shared machine, load average
//! 2.5), the spin lock's medians against parking_lot's were, in wall time and in CPU time: one
//! thread 0.76x and 0.75x (26.6 against 35.5 ns of CPU an ask), 4 threads 0.83x and 0.98x, 16
//! threads 0.78x and 0.74x, at the cost of more context switches (its yields). The 4-thread CPU
//! margin is small: a run in which the spin lock does not win both in every shape is the cue to
//! switch to parking_lot (flip the `cfg`s below).
//!
//! # Two guards
//!
//! [`Cells::hold`] is the take's: it reads the budgets, the throttle's tenths and the levels, and
//! writes back only the levels. Every rarer operation (a budget or throttle change, a status
//! read) takes [`Cells::lock`], the whole [`State`].
//!
//! [`Yield`]: spin::relax::Yield

#[cfg(admission_bucket_lock = "parking_lot")]
use parking_lot::{Mutex as Lock, MutexGuard as Guard};
#[cfg(not(admission_bucket_lock = "parking_lot"))]
use spin::mutex::{SpinMutex as Lock, SpinMutexGuard as Guard};

use super::{Levels, State, TokenBucketConfig};

/// The lock around the state: `spin`'s `SpinMutex`, yielding in a loop while the lock is taken;
/// in a build for the lock bench only (`--cfg admission_bucket_lock="parking_lot"`),
/// parking_lot's `Mutex`.
#[cfg(not(admission_bucket_lock = "parking_lot"))]
type StateLock = Lock<State, spin::relax::Yield>;
#[cfg(admission_bucket_lock = "parking_lot")]
type StateLock = Lock<State>;

/// The state and its lock.
#[derive(Debug)]
pub(super) struct Cells(StateLock);

impl Cells {
    pub(super) fn new(state: &State) -> Cells {
        Cells(Lock::new(*state))
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
pub(super) struct Hold<'a>(Guard<'a, State>);

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
pub(super) type Locked<'a> = Guard<'a, State>;
