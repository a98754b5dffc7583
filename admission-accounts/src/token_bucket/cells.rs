//! [`Cells`]: the bucket's state in atomic words behind a one-word lock released by a plain store.
//!
//! # Why a lock, and why this one
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
//! would one compare-and-swap be cheaper than this lock: a loop on a 128-bit word is a load and
//! a `cmpxchg16b`, one atomic read-modify-write, as the swap below is.
//!
//! So the state stays whole and is guarded by a lock, but the cheapest one that is correct here:
//! taking it is one atomic swap, and releasing it is a plain store with release ordering, where
//! a `parking_lot` mutex pays a second compare-and-swap to release. The state itself lives in
//! relaxed atomic words read and written only while the lock is held (the lock's acquire and
//! release order them), so no `unsafe` is needed. A thread that finds the lock held spins
//! briefly (the holder is done within tens of nanoseconds: nothing blocks inside, not even a
//! clock read), then yields until it is free. Nothing waits on the lock for long, so there is no
//! parking and no queue.
//!
//! # Two guards
//!
//! [`Cells::hold`] takes the lock and reads nothing: a take then reads the budgets, the throttle's
//! tenths and the levels, and stores the levels back (six words), the least that moves. Every
//! rarer operation (a budget or throttle change, a status read) takes [`Cells::lock`], which
//! copies the whole [`State`] out and writes it all back as the guard drops, just before the
//! lock is released.
//!
//! Each word is as wide as what it holds, so nothing is lost: a level's units (up to
//! `u64::MAX x 6e10`) take two words, a carry (below 100), the throttle's tenths (at most 90) and
//! its successes (below 3) a byte each, an instant or a budget a whole word.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use admission_core::Instant;

use super::level::Level;
use super::throttle::Throttle;
use super::{Levels, State, TokenBucketConfig};

/// How many failed attempts at the lock are answered with a short spin before the thread yields.
const SPIN_ATTEMPTS: u32 = 6;

/// Bit of the `throttle` word set when the throttle knows its last backpressure.
const HAS_LAST: u64 = 1 << 16;

/// The state's words and their lock.
#[derive(Debug)]
pub(super) struct Cells {
    /// Held while true. Taken by a swap with acquire ordering, released by a store with release
    /// ordering: every other word is read and written only between the two.
    locked: AtomicBool,
    /// `Levels::settled_at`, in nanoseconds.
    settled_at: AtomicU64,
    /// The tokens level's units: high half, low half.
    tokens: [AtomicU64; 2],
    /// The requests level's units: high half, low half.
    requests: [AtomicU64; 2],
    /// The tokens level's carry (bits 0-7) and the requests level's (bits 8-15).
    carries: AtomicU64,
    /// The throttle: tenths (bits 0-7), successes (bits 8-15), [`HAS_LAST`].
    throttle: AtomicU64,
    /// The throttle's last backpressure, in nanoseconds; meaningful under [`HAS_LAST`].
    last_backpressure: AtomicU64,
    /// The budgets.
    tokens_per_minute: AtomicU64,
    requests_per_minute: AtomicU64,
}

impl Cells {
    /// Words holding `state`, unlocked.
    pub(super) fn new(state: &State) -> Cells {
        let cells = Cells {
            locked: AtomicBool::new(false),
            settled_at: AtomicU64::new(0),
            tokens: [AtomicU64::new(0), AtomicU64::new(0)],
            requests: [AtomicU64::new(0), AtomicU64::new(0)],
            carries: AtomicU64::new(0),
            throttle: AtomicU64::new(0),
            last_backpressure: AtomicU64::new(0),
            tokens_per_minute: AtomicU64::new(0),
            requests_per_minute: AtomicU64::new(0),
        };
        Hold { cells: &cells }.set_state(state);
        cells
    }

    /// The words, locked until the guard drops: the hot path reads and writes only what it needs.
    #[inline]
    pub(super) fn hold(&self) -> Hold<'_> {
        if self.locked.swap(true, Ordering::Acquire) {
            self.lock_contended();
        }
        Hold { cells: self }
    }

    /// The whole state, locked until the guard drops, and written back as it drops.
    pub(super) fn lock(&self) -> Locked<'_> {
        let hold = self.hold();
        let state = hold.state();
        Locked { hold, state }
    }

    /// As [`Cells::lock`], or `None` when another thread holds the lock; never waits.
    pub(super) fn try_lock(&self) -> Option<Locked<'_>> {
        if self.locked.swap(true, Ordering::Acquire) {
            return None;
        }
        let hold = Hold { cells: self };
        let state = hold.state();
        Some(Locked { hold, state })
    }

    /// The slow path of [`Cells::hold`]: spins, then yields, until the lock is free and taken.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut failures = 0u32;
        loop {
            if failures < SPIN_ATTEMPTS {
                for _ in 0..(1u32 << failures) {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::yield_now();
            }
            failures = failures.saturating_add(1);
            // Test, then test-and-set: waiting threads only read the word until it is free.
            if !self.locked.load(Ordering::Relaxed) && !self.locked.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }
}

/// The lock, held: the words may be read and written through it. Releases the lock as it drops.
pub(super) struct Hold<'a> {
    cells: &'a Cells,
}

impl Hold<'_> {
    /// The budgets.
    #[inline]
    pub(super) fn config(&self) -> TokenBucketConfig {
        TokenBucketConfig::new(
            self.cells.tokens_per_minute.load(Ordering::Relaxed),
            self.cells.requests_per_minute.load(Ordering::Relaxed),
        )
    }

    /// The throttle in tenths.
    #[inline]
    pub(super) fn tenths(&self) -> u32 {
        u32::from(byte(self.cells.throttle.load(Ordering::Relaxed), 0))
    }

    /// The levels as last stored.
    #[inline]
    pub(super) fn levels(&self) -> Levels {
        let cells = self.cells;
        let carries = cells.carries.load(Ordering::Relaxed);
        Levels {
            tokens: Level::from_parts(join(&cells.tokens), byte(carries, 0)),
            requests: Level::from_parts(join(&cells.requests), byte(carries, 8)),
            settled_at: Instant::from_nanos(cells.settled_at.load(Ordering::Relaxed)),
        }
    }

    /// Stores `levels`.
    #[inline]
    pub(super) fn set_levels(&self, levels: &Levels) {
        let cells = self.cells;
        let (tokens, tokens_carry) = levels.tokens.parts();
        let (requests, requests_carry) = levels.requests.parts();
        split(&cells.tokens, tokens);
        split(&cells.requests, requests);
        cells.carries.store(
            u64::from(tokens_carry) | u64::from(requests_carry) << 8,
            Ordering::Relaxed,
        );
        cells
            .settled_at
            .store(levels.settled_at.as_nanos(), Ordering::Relaxed);
    }

    /// The whole state as last stored.
    fn state(&self) -> State {
        let cells = self.cells;
        let throttle = cells.throttle.load(Ordering::Relaxed);
        let last_backpressure = (throttle & HAS_LAST != 0)
            .then(|| Instant::from_nanos(cells.last_backpressure.load(Ordering::Relaxed)));
        State {
            config: self.config(),
            levels: self.levels(),
            throttle: Throttle::from_parts(byte(throttle, 0), byte(throttle, 8), last_backpressure),
        }
    }

    /// Stores the whole `state`.
    fn set_state(&self, state: &State) {
        let cells = self.cells;
        self.set_levels(&state.levels);
        let (tenths, successes, last_backpressure) = state.throttle.parts();
        let mut throttle = u64::from(tenths) | u64::from(successes) << 8;
        if let Some(at) = last_backpressure {
            throttle |= HAS_LAST;
            cells
                .last_backpressure
                .store(at.as_nanos(), Ordering::Relaxed);
        }
        cells.throttle.store(throttle, Ordering::Relaxed);
        cells
            .tokens_per_minute
            .store(state.config.tokens_per_minute, Ordering::Relaxed);
        cells
            .requests_per_minute
            .store(state.config.requests_per_minute, Ordering::Relaxed);
    }
}

impl Drop for Hold<'_> {
    #[inline]
    fn drop(&mut self) {
        self.cells.locked.store(false, Ordering::Release);
    }
}

/// The whole state while the lock is held: a copy to read and change, written back as the guard
/// drops, just before the lock is released.
pub(super) struct Locked<'a> {
    /// Dropped after [`Locked::drop`] has written the state back.
    hold: Hold<'a>,
    state: State,
}

impl Deref for Locked<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        &self.state
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.hold.set_state(&self.state);
    }
}

/// The byte of `word` at bit `shift`.
#[inline]
fn byte(word: u64, shift: u32) -> u8 {
    // Keeps exactly the eight bits named.
    (word >> shift) as u8
}

/// A `u128` from its high and low halves.
#[inline]
fn join(halves: &[AtomicU64; 2]) -> u128 {
    u128::from(halves[0].load(Ordering::Relaxed)) << 64
        | u128::from(halves[1].load(Ordering::Relaxed))
}

/// Stores `value` as its high and low halves.
#[inline]
fn split(halves: &[AtomicU64; 2], value: u128) {
    // Both casts keep exactly the half they name.
    halves[0].store((value >> 64) as u64, Ordering::Relaxed);
    halves[1].store(value as u64, Ordering::Relaxed);
}
