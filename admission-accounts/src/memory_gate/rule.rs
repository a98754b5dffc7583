//! The memory gate's rule as plain values and pure functions: the latch, the spacing curve, the
//! floor and the growth penalty. Nothing here reads a clock or a probe; `memory_gate.rs` feeds it.

use std::time::Duration;

/// The reading, in percent of the limit, at or above which the latch sets.
pub(crate) const LATCH_SET_PERCENT: f64 = 95.0;
/// The latch clears only on a reading below this percentage.
pub(crate) const LATCH_CLEAR_PERCENT: f64 = 90.0;
/// How often a latched gate, or one spacing a line, asks again while anything waits: a fall in
/// memory announces nothing, so time is the only wake-up it gets.
pub(crate) const RECHECK: Duration = Duration::from_secs(2);
/// The shortest spacing between two releases from memory's line.
pub(crate) const MIN_SPACING: Duration = Duration::from_millis(50);
/// The longest spacing the curve gives (from [`CURVE_TOP_PERCENT`] up).
pub(crate) const MAX_CURVE: Duration = Duration::from_secs(30);
/// Where the curve starts rising above [`MIN_SPACING`].
pub(crate) const CURVE_BOTTOM_PERCENT: f64 = 80.0;
/// Where the curve reaches [`MAX_CURVE`].
pub(crate) const CURVE_TOP_PERCENT: f64 = 95.0;
/// The growth penalty never goes above this factor.
pub(crate) const MAX_PENALTY: f64 = 72_000.0;
/// The wait between releases (curve times penalty) never exceeds this.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(3_600);

/// The spacing the curve gives at `percent` of the limit, before the penalty:
/// `max(50 ms, 30 s * n^3)` with `n` the reading's place between 80 % and 95 %, clamped to
/// `0..=1`. About 1.1 s at 85 %, 8.9 s at 90 %.
pub(crate) fn curve(percent: f64) -> Duration {
    let span = CURVE_TOP_PERCENT - CURVE_BOTTOM_PERCENT;
    let n = ((percent - CURVE_BOTTOM_PERCENT) / span).clamp(0.0, 1.0);
    let n = if n.is_nan() { 1.0 } else { n };
    let secs = MAX_CURVE.as_secs_f64() * n * n * n;
    Duration::from_secs_f64(secs).max(MIN_SPACING)
}

/// The wait between two releases: `curve * penalty`, capped at [`MAX_WAIT`].
pub(crate) fn wait(curve: Duration, penalty: f64) -> Duration {
    let secs = curve.as_secs_f64() * penalty.max(1.0);
    if !secs.is_finite() || secs >= MAX_WAIT.as_secs_f64() {
        MAX_WAIT
    } else {
        Duration::from_secs_f64(secs)
    }
}

/// The next penalty after a release that moved the floor by `change` percentage points:
/// `clamp(penalty * 2^change, 1, 72_000)`.
pub(crate) fn next_penalty(penalty: f64, change: f64) -> f64 {
    let next = penalty * change.exp2();
    if next.is_nan() {
        1.0
    } else {
        next.clamp(1.0, MAX_PENALTY)
    }
}

/// The high-water latch: sets at 95 %, clears only below 90 %.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Latch {
    set: bool,
}

/// A change of the latch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum LatchChange {
    /// The reading reached the high mark.
    Set,
    /// The reading fell below the low mark.
    Cleared,
}

impl Latch {
    /// True while set.
    pub(crate) fn is_set(&self) -> bool {
        self.set
    }

    /// Moves the latch for a reading of `percent`; says when it changed.
    pub(crate) fn update(&mut self, percent: f64) -> Option<LatchChange> {
        if !self.set && percent >= LATCH_SET_PERCENT {
            self.set = true;
            Some(LatchChange::Set)
        } else if self.set && percent < LATCH_CLEAR_PERCENT {
            self.set = false;
            Some(LatchChange::Cleared)
        } else {
            None
        }
    }
}

/// The floor (the reading after the most recent fall) and the growth penalty it drives.
///
/// Used memory falls only when something is freed in bulk, so the reading after a fall is the
/// best estimate of what is really live; a rising reading is garbage or growth and never moves
/// the floor. At each release the penalty is multiplied by two to the power of the floor's change,
/// in percentage points, since the release before the previous one, so a climb that keeps going
/// compounds and a floor that holds leaves the penalty where it is.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) struct Growth {
    /// The last reading seen, to tell a fall.
    last: Option<f64>,
    /// The floor; the first reading until anything falls.
    floor: Option<f64>,
    /// The floor at the previous release.
    at_last_release: Option<f64>,
    /// The floor at the release before that.
    at_release_before_last: Option<f64>,
    penalty: f64,
}

impl Default for Growth {
    fn default() -> Growth {
        Growth {
            last: None,
            floor: None,
            at_last_release: None,
            at_release_before_last: None,
            penalty: 1.0,
        }
    }
}

impl Growth {
    /// Takes in a reading of `percent`: a reading lower than the one before becomes the floor.
    pub(crate) fn observe(&mut self, percent: f64) {
        match (self.last, self.floor) {
            (_, None) => self.floor = Some(percent),
            (Some(last), Some(_)) if percent < last => self.floor = Some(percent),
            _ => {}
        }
        self.last = Some(percent);
    }

    /// A release: moves the penalty by the floor's change since the release before last (no
    /// change until two releases have been seen) and returns the new penalty.
    pub(crate) fn release(&mut self) -> f64 {
        let Some(floor) = self.floor else {
            return self.penalty;
        };
        let change = self.at_release_before_last.map_or(0.0, |then| floor - then);
        self.penalty = next_penalty(self.penalty, change);
        self.at_release_before_last = self.at_last_release;
        self.at_last_release = Some(floor);
        self.penalty
    }

    /// The floor in percent (zero before any reading).
    pub(crate) fn floor(&self) -> f64 {
        self.floor.unwrap_or(0.0)
    }

    /// The penalty factor, from 1 to 72,000.
    pub(crate) fn penalty(&self) -> f64 {
        self.penalty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_is_flat_below_eighty_and_tops_out_at_ninety_five() {
        assert_eq!(curve(0.0), MIN_SPACING);
        assert_eq!(curve(80.0), MIN_SPACING);
        assert_eq!(curve(95.0), MAX_CURVE);
        assert_eq!(curve(120.0), MAX_CURVE);
        assert_eq!(curve(f64::NAN), MAX_CURVE);
    }

    #[test]
    fn wait_is_capped_at_an_hour_and_never_below_the_curve() {
        assert_eq!(wait(MAX_CURVE, MAX_PENALTY), MAX_WAIT);
        assert_eq!(wait(MIN_SPACING, 0.5), MIN_SPACING);
        assert_eq!(wait(MIN_SPACING, f64::INFINITY), MAX_WAIT);
    }

    #[test]
    fn a_nan_change_resets_the_penalty() {
        assert_eq!(next_penalty(64.0, f64::NAN), 1.0);
    }
}

#[cfg(test)]
mod worked_values {
    //! The rule's arithmetic, value by value (the statement of record's worked values).

    use std::time::Duration;

    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_latch_sets_at_95_and_clears_only_below_90() {
        let mut latch = Latch::default();
        assert_eq!(latch.update(94.9), None);
        assert_eq!(latch.update(95.0), Some(LatchChange::Set));
        assert_eq!(latch.update(93.0), None, "93 % keeps it set");
        assert_eq!(latch.update(90.0), None, "90 % is not below 90 %");
        assert!(latch.is_set());
        assert_eq!(latch.update(89.9), Some(LatchChange::Cleared));
        assert_eq!(latch.update(94.0), None);
        assert!(!latch.is_set());
    }

    #[test]
    fn the_curve_runs_from_50_ms_at_80_percent_to_30_s_at_95_percent() {
        assert_eq!(curve(50.0), MIN_SPACING);
        assert_eq!(curve(80.0), ms(50));
        assert_eq!(curve(81.0), ms(50), "30 s x (1/15)^3 is under 50 ms");
        assert_eq!(curve(85.0), Duration::from_nanos(1_111_111_111));
        assert_eq!(curve(90.0), Duration::from_nanos(8_888_888_889));
        assert_eq!(curve(95.0), Duration::from_secs(30));
        assert_eq!(curve(99.0), MAX_CURVE);
    }

    #[test]
    fn the_wait_is_curve_times_penalty_capped_at_one_hour() {
        assert_eq!(wait(Duration::from_secs(1), 64.0), Duration::from_secs(64));
        assert_eq!(wait(ms(50), 4_096.0), Duration::from_nanos(204_800_000_000));
        assert_eq!(wait(Duration::from_secs(30), 4_096.0), MAX_WAIT);
        assert_eq!(MAX_WAIT, Duration::from_secs(3_600));
    }

    /// Sets the floor to `floor` (a fall onto it from one point above) and releases once.
    fn release_at_floor(growth: &mut Growth, floor: f64) -> f64 {
        growth.observe(floor + 1.0);
        growth.observe(floor);
        assert_eq!(growth.floor(), floor);
        growth.release()
    }

    #[test]
    fn rising_readings_never_move_the_floor_and_a_fall_sets_it() {
        let mut growth = Growth::default();
        growth.observe(80.0);
        growth.observe(85.0);
        growth.observe(91.0);
        assert_eq!(growth.floor(), 80.0);
        growth.observe(84.0);
        assert_eq!(growth.floor(), 84.0);
        growth.observe(86.0);
        assert_eq!(growth.floor(), 84.0);
    }

    #[test]
    fn floors_80_83_86_give_64_and_on_to_89_gives_4096() {
        let mut growth = Growth::default();
        assert_eq!(release_at_floor(&mut growth, 80.0), 1.0);
        assert_eq!(release_at_floor(&mut growth, 83.0), 1.0);
        assert_eq!(release_at_floor(&mut growth, 86.0), 64.0);
        assert_eq!(release_at_floor(&mut growth, 89.0), 4_096.0);
    }

    #[test]
    fn a_floor_from_80_to_92_in_one_release_gives_4096_at_once() {
        let mut growth = Growth::default();
        assert_eq!(release_at_floor(&mut growth, 80.0), 1.0);
        assert_eq!(release_at_floor(&mut growth, 80.0), 1.0);
        assert_eq!(release_at_floor(&mut growth, 92.0), 4_096.0);
    }

    #[test]
    fn a_floor_that_holds_keeps_the_penalty_and_a_17_point_fall_resets_it_from_any_state() {
        let mut growth = Growth::default();
        for floor in [70.0, 70.0, 80.0, 90.0, 95.0] {
            release_at_floor(&mut growth, floor);
        }
        assert_eq!(growth.penalty(), MAX_PENALTY, "20 + 15 points saturate");
        assert_eq!(release_at_floor(&mut growth, 95.0), MAX_PENALTY);
        assert_eq!(release_at_floor(&mut growth, 78.0), 1.0, "17 points down");
        assert_eq!(next_penalty(MAX_PENALTY, -17.0), 1.0);
        assert_eq!(next_penalty(64.0, -17.0), 1.0);
        assert_eq!(next_penalty(64.0, 0.0), 64.0);
        assert_eq!(next_penalty(1.0, 20.0), MAX_PENALTY);
    }

    #[test]
    fn the_latch_is_rechecked_every_two_seconds() {
        assert_eq!(RECHECK, Duration::from_secs(2));
    }
}
