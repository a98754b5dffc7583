//! The fixed window's whole state: one `AtomicU64` packing the current window's index and the
//! permits used in it, and the grid arithmetic that places a clock reading in a window.
//!
//! # The packing
//!
//! Windows are numbered from the limiter's creation: window `k` covers
//! `[origin + k * period, origin + (k + 1) * period)`. The word holds `k` in its high bits and the
//! used count in its low `used_bits`:
//!
//! ```text
//!   63                      used_bits                     0
//!  +-------------------------+----------------------------+
//!  |  window index k         |  permits used in window k  |
//!  +-------------------------+----------------------------+
//! ```
//!
//! The split depends on the period alone. The index field gets exactly enough bits to count every
//! window a 64-bit nanosecond clock can reach, `u64::MAX / period` of them, so the index never
//! wraps and a window idle for centuries is still told apart from the current one. The used count
//! gets what is left, which caps the limit at `2^used_bits - 1`: roughly one permit per
//! nanosecond of period (a 1 s window holds up to 536,870,911 permits, a 1 ms window 524,287, a
//! 1 µs window 511). A larger limit is refused at construction, never silently clamped.
//!
//! Every update is one compare-and-swap of the whole word, so the index and the count always
//! change together; a thread that loses the race spins briefly, then yields, and retries.
//!
//! # Overflow
//!
//! Instants are `u64` nanoseconds and every step here is checked or saturating: the period is
//! clamped to `u64::MAX` nanoseconds before it is converted; the elapsed time since creation is
//! divided, never multiplied, so placing a reading cannot overflow; the start of the *next*
//! window is `None` when it lies past [`Instant::MAX`]; and a reading earlier than the origin (a
//! clock that broke its promise to be monotonic) counts as the window already stored rather than
//! underflowing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use admission_core::Instant;

/// How many compare-and-swap failures are answered with a short spin before the thread yields.
const SPIN_ATTEMPTS: u32 = 6;

/// A window as one caller sees it: which window, and how much of it is used.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct View {
    /// The window's index, counted in whole periods from the limiter's creation.
    pub(super) index: u64,
    /// Permits used in that window.
    pub(super) used: u64,
}

/// The packed state and the grid it lives on.
#[derive(Debug)]
pub(super) struct Word {
    /// The limiter's creation, in nanoseconds on its clock: the start of window 0.
    origin: u64,
    /// The period in nanoseconds, at least 1 (clamped to `u64::MAX` for longer periods).
    period: u64,
    /// How many low bits of `state` hold the used count.
    used_bits: u32,
    /// `index << used_bits | used`. Only ever changed by compare-and-swap of the whole word, so a
    /// reader always sees an index together with the count that belongs to it.
    state: AtomicU64,
}

/// The period in nanoseconds, clamped to `1..=u64::MAX` before any arithmetic uses it.
pub(super) fn period_nanos(period: Duration) -> u64 {
    u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// How many low bits hold the used count for a period of `period_nanos`: whatever the index of
/// the last window a `u64` nanosecond clock can reach leaves free.
pub(super) fn used_bits(period_nanos: u64) -> u32 {
    let last_index = u64::MAX / period_nanos.max(1);
    // `last_index` is at least 1, so the index needs at least one bit and the count at most 63.
    last_index.leading_zeros()
}

/// The largest used count (and so the largest limit) the word can hold for `period_nanos`.
pub(super) fn max_used(period_nanos: u64) -> u64 {
    (1u64 << used_bits(period_nanos)) - 1
}

impl Word {
    /// Window 0, nothing used, starting at `origin`.
    pub(super) fn new(origin: Instant, period_nanos: u64) -> Word {
        let period = period_nanos.max(1);
        Word {
            origin: origin.as_nanos(),
            period,
            used_bits: used_bits(period),
            state: AtomicU64::new(0),
        }
    }

    /// The limiter's creation instant: the start of window 0.
    pub(super) fn origin(&self) -> Instant {
        Instant::from_nanos(self.origin)
    }

    fn pack(&self, view: View) -> u64 {
        (view.index << self.used_bits) | view.used
    }

    fn unpack(&self, word: u64) -> View {
        let mask = (1u64 << self.used_bits) - 1;
        View {
            // A shift by 64 cannot happen: `used_bits` is at most 63.
            index: word >> self.used_bits,
            used: word & mask,
        }
    }

    /// The window the stored word describes, moved forward to the one holding `now` if `now` is
    /// past its end. Never moves backwards: a reading older than the stored window (a thread
    /// that read the clock before another advanced the window) counts in the stored window.
    fn at(&self, word: u64, now: Instant) -> View {
        let stored = self.unpack(word);
        // A reading before the origin has elapsed nothing; it belongs to the stored window.
        let Some(elapsed) = now.as_nanos().checked_sub(self.origin) else {
            return stored;
        };
        // The stored window ends `(index + 1) * period` after the origin; a product past `u64`
        // is an end no reading can reach. Comparing with a product spares the division on the
        // path where the window has not moved.
        let still_open = stored
            .index
            .checked_add(1)
            .and_then(|next| next.checked_mul(self.period))
            .is_none_or(|end| elapsed < end);
        if still_open {
            stored
        } else {
            View {
                index: elapsed / self.period,
                used: 0,
            }
        }
    }

    /// The current window as of `now`, without changing anything.
    pub(super) fn read(&self, now: Instant) -> View {
        self.at(self.state.load(Ordering::Acquire), now)
    }

    /// Claims `n` permits of the window holding `now` when `n + reserved` fit under `limit`.
    ///
    /// `Ok` carries the window after the claim, `Err` the window as seen when it did not fit;
    /// nothing is written on `Err`. `n = 0` claims nothing and writes nothing.
    pub(super) fn take(
        &self,
        now: Instant,
        n: u64,
        reserved: u64,
        limit: u64,
    ) -> Result<View, View> {
        let mut word = self.state.load(Ordering::Acquire);
        let mut failures = 0;
        loop {
            let view = self.at(word, now);
            let free = limit.saturating_sub(view.used);
            if n.saturating_add(reserved) > free {
                return Err(view);
            }
            if n == 0 {
                return Ok(view);
            }
            let taken = View {
                index: view.index,
                used: view.used + n,
            };
            match self.state.compare_exchange_weak(
                word,
                self.pack(taken),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(taken),
                Err(seen) => {
                    word = seen;
                    back_off(&mut failures);
                }
            }
        }
    }

    /// Returns up to `n` permits to the window holding `now`, never below zero used.
    ///
    /// Returns how many were credited: zero when the stored window has already ended (the window
    /// holding `now` starts empty, so there is nothing to return to).
    pub(super) fn give(&self, now: Instant, n: u64) -> u64 {
        let mut word = self.state.load(Ordering::Acquire);
        let mut failures = 0;
        loop {
            let stored = self.unpack(word);
            let view = self.at(word, now);
            if view.index != stored.index || view.used == 0 || n == 0 {
                return 0;
            }
            let credited = n.min(view.used);
            let given = View {
                index: view.index,
                used: view.used - credited,
            };
            match self.state.compare_exchange_weak(
                word,
                self.pack(given),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return credited,
                Err(seen) => {
                    word = seen;
                    back_off(&mut failures);
                }
            }
        }
    }

    /// Where window `index` starts. Saturates at [`Instant::MAX`], which no index read from the
    /// clock reaches: `origin + index * period` is at most the reading the index came from.
    pub(super) fn start_of(&self, index: u64) -> Instant {
        let start = index
            .checked_mul(self.period)
            .and_then(|offset| offset.checked_add(self.origin));
        Instant::from_nanos(start.unwrap_or(u64::MAX))
    }

    /// Where the window after `index` starts, or `None` when that instant is past
    /// [`Instant::MAX`]: a window that never opens, which no wait can reach.
    pub(super) fn next_start(&self, index: u64) -> Option<Instant> {
        index
            .checked_add(1)
            .and_then(|next| next.checked_mul(self.period))
            .and_then(|offset| offset.checked_add(self.origin))
            .map(Instant::from_nanos)
    }
}

/// Backs off after a lost compare-and-swap: a short, growing spin for the first few failures
/// (the winner is usually done within a few cycles), then a yield to let it run under sustained
/// contention.
fn back_off(failures: &mut u32) {
    if *failures < SPIN_ATTEMPTS {
        for _ in 0..(1u32 << *failures) {
            std::hint::spin_loop();
        }
    } else {
        std::thread::yield_now();
    }
    *failures = failures.saturating_add(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn the_split_leaves_the_index_room_for_every_window_of_the_clock() {
        assert_eq!(used_bits(SECOND), 29);
        assert_eq!(max_used(SECOND), 536_870_911);
        assert_eq!(max_used(1_000_000), 524_287);
        assert_eq!(max_used(1_000), 511);
        assert_eq!(max_used(1), 0);
        assert_eq!(used_bits(u64::MAX), 63);
        for period in [1, 2, 3, 1_000, SECOND, u64::MAX / 2, u64::MAX] {
            let last = u64::MAX / period;
            let bits = used_bits(period);
            assert!(
                bits == 0 || last < (1u64 << (64 - bits)),
                "{period}: {last} needs more than {} bits",
                64 - bits
            );
        }
    }

    #[test]
    fn a_period_longer_than_the_clock_is_clamped_before_conversion() {
        assert_eq!(period_nanos(Duration::MAX), u64::MAX);
        assert_eq!(period_nanos(Duration::from_nanos(u64::MAX)), u64::MAX);
        assert_eq!(period_nanos(Duration::ZERO), 1);
    }

    #[test]
    fn a_word_round_trips_an_index_with_its_count() {
        let word = Word::new(Instant::ZERO, SECOND);
        let view = View {
            index: u64::MAX / SECOND,
            used: max_used(SECOND),
        };
        assert_eq!(word.unpack(word.pack(view)), view);
    }

    #[test]
    fn the_next_window_past_the_end_of_the_clock_is_none() {
        let word = Word::new(Instant::from_nanos(u64::MAX - 10), 100);
        assert_eq!(word.next_start(0), None);
        assert_eq!(word.start_of(0), Instant::from_nanos(u64::MAX - 10));
        let word = Word::new(Instant::ZERO, u64::MAX);
        assert_eq!(word.next_start(0), Some(Instant::MAX));
        assert_eq!(word.next_start(1), None);
    }

    #[test]
    fn a_reading_before_the_origin_stays_in_the_stored_window() {
        let word = Word::new(Instant::from_nanos(5 * SECOND), SECOND);
        assert_eq!(
            word.take(Instant::from_nanos(7 * SECOND), 1, 0, 10),
            Ok(View { index: 2, used: 1 })
        );
        assert_eq!(
            word.take(Instant::from_nanos(SECOND), 1, 0, 10),
            Ok(View { index: 2, used: 2 })
        );
    }
}
