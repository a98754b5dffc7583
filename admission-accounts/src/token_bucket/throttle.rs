//! [`Throttle`]: the token bucket's adaptive slow-down, counted in exact tenths.
//!
//! Every step of the rule is a multiple of a tenth (0.5 up per backpressure increment, 0.2 or 0.5
//! down per relief, 9.0 at most), so the throttle is kept as an integer count of tenths and never
//! drifts the way repeated `f64` additions would; [`Throttle::value`] converts for readers.
//! The throttle climbs in steps on every rate-limit signal and comes down in smaller steps on
//! successes, so the bucket backs off fast and recovers slowly; once the upstream has sent no
//! signal for a while, recovery speeds up.

use std::time::Duration;

use admission_core::Instant;

/// Tenths added per backpressure increment (0.5).
pub(crate) const STEP_TENTHS: u32 = 5;
/// The most the throttle reaches, in tenths (9.0: refills at a tenth of the configured rate).
pub(crate) const MAX_TENTHS: u32 = 90;
/// Tenths taken off every [`SUCCESSES_PER_RELIEF`]th success (0.2).
pub(crate) const RELIEF_TENTHS: u32 = 2;
/// Tenths taken off by every success once the upstream has been quiet (0.5).
pub(crate) const QUIET_RELIEF_TENTHS: u32 = 5;
/// How many successes make one ordinary relief.
pub(crate) const SUCCESSES_PER_RELIEF: u32 = 3;
/// How long without backpressure before every success relieves.
pub(crate) const QUIET_PERIOD: Duration = Duration::from_secs(5 * 60);

/// The throttle and what decides its next step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Throttle {
    /// The throttle in tenths, `0..=MAX_TENTHS`.
    tenths: u32,
    /// Successes since the last relief or backpressure; below `SUCCESSES_PER_RELIEF`.
    successes: u32,
    /// The last backpressure signal; `Some` whenever `tenths > 0`.
    last_backpressure: Option<Instant>,
}

impl Throttle {
    /// The throttle in tenths.
    pub(crate) fn tenths(&self) -> u32 {
        self.tenths
    }

    /// The throttle as a number (`1.5` is fifteen tenths).
    pub(crate) fn value(&self) -> f64 {
        f64::from(self.tenths) / 10.0
    }

    /// `throttle:<1 + throttle>x` with one decimal, `None` at zero.
    pub(crate) fn indicator(&self) -> Option<String> {
        let factor = 10 + self.tenths;
        (self.tenths > 0).then(|| format!("throttle:{}.{}x", factor / 10, factor % 10))
    }

    /// `increments` backpressure steps at `now`; true when the throttle rose.
    ///
    /// Zero increments are no signal at all: nothing changes, not even the quiet timer.
    pub(crate) fn tighten(&mut self, increments: u32, now: Instant) -> bool {
        if increments == 0 {
            return false;
        }
        let before = self.tenths;
        self.tenths = self
            .tenths
            .saturating_add(increments.saturating_mul(STEP_TENTHS))
            .min(MAX_TENTHS);
        self.successes = 0;
        // Racing readers of the clock may arrive slightly out of order; keep the latest.
        self.last_backpressure = Some(self.last_backpressure.map_or(now, |at| at.max(now)));
        self.tenths != before
    }

    /// One success at `now`; true when the throttle fell.
    pub(crate) fn relieve(&mut self, now: Instant) -> bool {
        if self.tenths == 0 {
            return false;
        }
        let quiet = self
            .last_backpressure
            .is_none_or(|at| now.saturating_duration_since(at) >= QUIET_PERIOD);
        let off = if quiet {
            QUIET_RELIEF_TENTHS
        } else {
            self.successes += 1;
            if self.successes < SUCCESSES_PER_RELIEF {
                return false;
            }
            RELIEF_TENTHS
        };
        self.successes = 0;
        self.tenths = self.tenths.saturating_sub(off);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenths_never_drift() {
        let mut throttle = Throttle::default();
        let now = Instant::ZERO;
        assert!(throttle.tighten(3, now));
        for _ in 0..6 {
            throttle.relieve(now);
        }
        assert_eq!(throttle.tenths(), 11);
        assert_eq!(throttle.indicator().as_deref(), Some("throttle:2.1x"));
        assert!(!throttle.tighten(0, now));
        assert!(throttle.tighten(u32::MAX, now));
        assert_eq!(throttle.tenths(), MAX_TENTHS);
        assert_eq!(throttle.value(), 9.0);
    }
}
