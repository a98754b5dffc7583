//! The fixed window's whole state: one 128-bit atomic word holding the current window's start
//! and the permits used in it, and the arithmetic that moves a window forward to a clock reading.
//!
//! # The packing
//!
//! ```text
//!   127                           64 63                             0
//!  +-------------------------------+--------------------------------+
//!  |  window start (u64 ns)        |  permits used in that window   |
//!  +-------------------------------+--------------------------------+
//! ```
//!
//! Each half is as wide as what it holds, so nothing is lost for any configuration: a window
//! start is an [`Instant`], a `u64` of nanoseconds, and lies between the limiter's creation and
//! the latest reading, so it is any instant the clock can show; the count never exceeds the
//! limit, a `u64`. Every limit of at least 1 with every period of at least 1 ns fits, over the
//! clock's whole range.
//!
//! Every update is one compare-and-swap of all 128 bits, so the start and the count always change
//! together. A thread whose compare-and-swap fails decides again at once on the word it found: the
//! word changed because another thread's update went in (or, on a target built on an exclusive
//! pair, the weak form failed spuriously), so some thread always makes progress and the loop is
//! lock-free. There is nothing to wait for, so it neither spins nor yields. The atomic is
//! [`portable_atomic::AtomicU128`]: `cmpxchg16b` on x86-64 (detected at run time unless enabled
//! at compile time), `casp` or an exclusive pair on AArch64; only on a target with no 128-bit
//! compare-and-swap does it fall back to a lock of its own.
//!
//! # Moving forward
//!
//! A reading `now` at or past the stored window's end moves the window forward by the whole
//! periods elapsed: the new start is `start + elapsed - elapsed % period`, at most `now`, so it
//! cannot overflow and needs no multiplication. A reading inside the stored window, or before
//! its start (a thread that read the clock before another moved the window, or a clock that broke
//! its promise to be monotonic), counts in the stored window: the window never moves backwards.
//! A window whose end lies past [`Instant::MAX`] never ends, and its successor is `None`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use admission_core::Instant;
use portable_atomic::AtomicU128;

/// A window as one caller sees it: where it starts, and how much of it is used.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct View {
    /// Where the window starts on the limiter's clock.
    pub(super) start: Instant,
    /// Permits used in that window.
    pub(super) used: u64,
}

impl View {
    fn pack(self) -> u128 {
        (u128::from(self.start.as_nanos()) << 64) | u128::from(self.used)
    }

    fn unpack(word: u128) -> View {
        View {
            // Both casts keep exactly the half they name: the high and the low 64 bits.
            start: Instant::from_nanos((word >> 64) as u64),
            used: word as u64,
        }
    }
}

/// The packed state and the period it moves by.
#[derive(Debug)]
pub(super) struct Word {
    /// The period in nanoseconds, at least 1 (clamped to `u64::MAX` for longer periods).
    period: u64,
    /// A packed [`View`] of the stored window. Only ever changed by compare-and-swap of the whole
    /// word, so a reader always sees a start together with the count that belongs to it.
    state: AtomicU128,
}

/// The period in nanoseconds, clamped to `1..=u64::MAX` before any arithmetic uses it.
pub(super) fn period_nanos(period: Duration) -> u64 {
    u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1)
}

impl Word {
    /// The window `current`, of `period_nanos` (at least 1).
    pub(super) fn new(current: View, period_nanos: u64) -> Word {
        Word {
            period: period_nanos.max(1),
            state: AtomicU128::new(current.pack()),
        }
    }

    /// The window the stored word describes, moved forward to the one holding `now` if `now` is
    /// at or past its end.
    fn at(&self, word: u128, now: Instant) -> View {
        let stored = View::unpack(word);
        match now.as_nanos().checked_sub(stored.start.as_nanos()) {
            // A reading before the stored start belongs to the stored window.
            None => stored,
            // Still inside; also every reading of a window whose end is past the clock's range.
            Some(elapsed) if elapsed < self.period => stored,
            // `start + elapsed` is `now`, so the sum cannot overflow.
            Some(elapsed) => View {
                start: Instant::from_nanos(
                    stored.start.as_nanos() + (elapsed - elapsed % self.period),
                ),
                used: 0,
            },
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
        loop {
            let view = self.at(word, now);
            let free = limit.saturating_sub(view.used);
            if n.saturating_add(reserved) > free {
                return Err(view);
            }
            if n == 0 {
                return Ok(view);
            }
            // `n <= free`, so the count stays at most `limit`.
            let taken = View {
                start: view.start,
                used: view.used + n,
            };
            match self.state.compare_exchange_weak(
                word,
                taken.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(taken),
                // Another thread's update went in: decide again on the word it wrote.
                Err(seen) => word = seen,
            }
        }
    }

    /// Returns up to `n` permits to the window holding `now`, never below zero used.
    ///
    /// Returns how many were credited: zero when the stored window has already ended (the window
    /// holding `now` starts empty, so there is nothing to return to).
    pub(super) fn give(&self, now: Instant, n: u64) -> u64 {
        let mut word = self.state.load(Ordering::Acquire);
        loop {
            let view = self.at(word, now);
            if view.start != View::unpack(word).start || view.used == 0 || n == 0 {
                return 0;
            }
            let credited = n.min(view.used);
            let given = View {
                start: view.start,
                used: view.used - credited,
            };
            match self.state.compare_exchange_weak(
                word,
                given.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return credited,
                // Another thread's update went in: decide again on the word it wrote.
                Err(seen) => word = seen,
            }
        }
    }

    /// Where the window after `view` starts, or `None` when that instant is past
    /// [`Instant::MAX`]: a window that never opens, which no wait can reach.
    pub(super) fn next_start(&self, view: View) -> Option<Instant> {
        view.start
            .as_nanos()
            .checked_add(self.period)
            .map(Instant::from_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn at(nanos: u64) -> Instant {
        Instant::from_nanos(nanos)
    }

    fn fresh(start: Instant) -> View {
        View { start, used: 0 }
    }

    #[test]
    fn a_word_round_trips_every_start_with_every_count() {
        for start in [0, 1, SECOND, u64::MAX - 1, u64::MAX] {
            for used in [0, 1, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
                let view = View {
                    start: at(start),
                    used,
                };
                assert_eq!(View::unpack(view.pack()), view);
            }
        }
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn the_word_is_lock_free_on_this_machine() {
        assert!(AtomicU128::is_lock_free());
    }

    #[test]
    fn a_period_longer_than_the_clock_is_clamped_before_conversion() {
        assert_eq!(period_nanos(Duration::MAX), u64::MAX);
        assert_eq!(period_nanos(Duration::from_nanos(u64::MAX)), u64::MAX);
        assert_eq!(period_nanos(Duration::ZERO), 1);
    }

    #[test]
    fn a_reading_moves_the_window_by_whole_periods_from_its_start() {
        let word = Word::new(fresh(at(7)), 1_000);
        assert_eq!(
            word.read(at(1_006)),
            View {
                start: at(7),
                used: 0
            }
        );
        assert_eq!(word.read(at(1_007)).start, at(1_007));
        assert_eq!(
            word.read(at(u64::MAX)).start,
            at((u64::MAX - 7) / 1_000 * 1_000 + 7)
        );
        let nanosecond = Word::new(fresh(at(0)), 1);
        assert_eq!(nanosecond.read(at(u64::MAX)).start, at(u64::MAX));
    }

    #[test]
    fn the_next_window_past_the_end_of_the_clock_is_none() {
        let word = Word::new(fresh(at(u64::MAX - 10)), 100);
        assert_eq!(word.next_start(word.read(at(u64::MAX))), None);
        assert_eq!(word.read(at(u64::MAX)).start, at(u64::MAX - 10));
        let word = Word::new(fresh(Instant::ZERO), u64::MAX);
        assert_eq!(word.next_start(word.read(at(5))), Some(Instant::MAX));
        let last = word.read(Instant::MAX);
        assert_eq!((last.start, word.next_start(last)), (Instant::MAX, None));
    }

    #[test]
    fn a_reading_before_the_stored_start_stays_in_the_stored_window() {
        let word = Word::new(fresh(at(5 * SECOND)), SECOND);
        assert_eq!(
            word.take(at(7 * SECOND), 1, 0, 10),
            Ok(View {
                start: at(7 * SECOND),
                used: 1
            })
        );
        assert_eq!(
            word.take(at(SECOND), 1, 0, 10),
            Ok(View {
                start: at(7 * SECOND),
                used: 2
            })
        );
    }

    #[test]
    fn a_count_of_u64_max_is_taken_and_given_back_exactly() {
        let word = Word::new(fresh(at(u64::MAX - 1)), 1);
        let now = at(u64::MAX - 1);
        assert_eq!(
            word.take(now, u64::MAX, 0, u64::MAX).map(|v| v.used),
            Ok(u64::MAX)
        );
        assert_eq!(
            word.take(now, 1, 0, u64::MAX).map_err(|v| v.used),
            Err(u64::MAX)
        );
        assert_eq!(word.give(now, 1), 1);
        assert_eq!(word.read(now).used, u64::MAX - 1);
        assert_eq!(word.give(at(u64::MAX), 5), 0, "the window has turned");
        assert_eq!(word.read(at(u64::MAX)).used, 0);
    }
}
