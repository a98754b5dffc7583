//! The adaptive throttle: how far pressure from the upstream stretches the window.
//!
//! The throttle is kept in thousandths, so that its steps (up 1.0, down 0.2 or 0.5) add and
//! subtract exactly: three pressures and fifteen relaxations land on zero, not on a rounding
//! residue that would keep the window stretched forever. Plain data, touched only under the
//! window's lock.

use std::time::Duration;

use admission_core::Instant;

/// Thousandths in one unit of throttle.
pub(super) const MILLI: u64 = 1_000;
/// What one pressure signal adds, in thousandths (1.0).
const STEP_UP: u64 = MILLI;
/// What a full round of successes takes off, in thousandths (0.2).
const STEP_DOWN: u64 = 200;
/// What one success takes off once the pressure is long past, in thousandths (0.5).
const FAST_STEP_DOWN: u64 = 500;

/// How long after the last pressure signal every success takes the larger step off.
pub(super) const FAST_RECOVERY_AFTER: Duration = Duration::from_secs(5 * 60);

/// The throttle and what decides its next step.
#[derive(Debug)]
pub(super) struct Throttle {
    /// The throttle in thousandths; never above `max`.
    milli: u64,
    /// The cap, in thousandths; fixed at construction.
    max: u64,
    /// Successes since the last step down or the last pressure; below the round size.
    successes: u32,
    /// When the last pressure signal arrived; `None` before the first.
    last_pressure: Option<Instant>,
}

impl Throttle {
    /// A throttle at zero whose cap is `max` (a finite, non-negative number).
    pub(super) fn new(max: f64) -> Throttle {
        // Rounded down, so the throttle never passes the configured cap. A float-to-integer
        // `as` saturates (and maps NaN to 0), so this cannot wrap.
        let max = (max * MILLI as f64).floor() as u64;
        Throttle {
            milli: 0,
            max,
            successes: 0,
            last_pressure: None,
        }
    }

    /// The throttle in thousandths.
    pub(super) fn milli(&self) -> u64 {
        self.milli
    }

    /// The cap in thousandths.
    pub(super) fn max_milli(&self) -> u64 {
        self.max
    }

    /// True when the throttle stands at its cap.
    pub(super) fn at_max(&self) -> bool {
        self.milli >= self.max
    }

    /// One pressure signal at `now`: one step up, capped; the round of successes starts over.
    pub(super) fn press(&mut self, now: Instant) {
        self.milli = self.milli.saturating_add(STEP_UP).min(self.max);
        self.successes = 0;
        self.last_pressure = Some(now);
    }

    /// One success at `now`. Answers whether the throttle went down.
    ///
    /// At zero nothing changes. Long after the last pressure ([`FAST_RECOVERY_AFTER`]) every
    /// success takes the larger step off; otherwise every `per_round`-th success takes the
    /// smaller step off. Never below zero.
    pub(super) fn relax(&mut self, now: Instant, per_round: u32) -> bool {
        if self.milli == 0 {
            return false;
        }
        let quiet = self
            .last_pressure
            .is_none_or(|at| now.saturating_duration_since(at) >= FAST_RECOVERY_AFTER);
        let step = if quiet {
            FAST_STEP_DOWN
        } else {
            self.successes = self.successes.saturating_add(1);
            if self.successes < per_round {
                return false;
            }
            STEP_DOWN
        };
        self.successes = 0;
        self.milli = self.milli.saturating_sub(step);
        true
    }

    /// `base` nanoseconds stretched by `1 + throttle`, saturating at `u64::MAX`.
    pub(super) fn stretch(base: u64, milli: u64) -> u64 {
        let factor = u128::from(MILLI).saturating_add(u128::from(milli));
        let nanos = u128::from(base).saturating_mul(factor) / u128::from(MILLI);
        u64::try_from(nanos).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_and_subtract_exactly() {
        let mut t = Throttle::new(9.0);
        let now = Instant::ZERO;
        t.press(now);
        t.press(now);
        assert_eq!(t.milli(), 2_000);
        for _ in 0..30 {
            t.relax(now, 3);
        }
        assert_eq!(t.milli(), 0);
        assert!(!t.relax(now, 3));
    }

    #[test]
    fn stretch_saturates() {
        assert_eq!(Throttle::stretch(10, 1_500), 25);
        assert_eq!(Throttle::stretch(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(Throttle::new(f64::MAX).max_milli(), u64::MAX);
    }
}
