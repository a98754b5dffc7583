//! [`Level`]: one dimension of a token bucket in fixed point, refilled from elapsed time exactly.
//!
//! A level counts in *units*: one unit is what a rate of one per minute produces in one
//! nanosecond, so a whole token (or request) is [`UNITS_PER_WHOLE`] units, the nanoseconds in a
//! minute. At a rate of `r` per minute, `e` nanoseconds produce `e * r` units: integer arithmetic
//! with nothing rounded. A throttle of `t` tenths stretches that by `10 / (10 + t)`; the division's
//! remainder is kept in `carry` and added to the next refill, so refilling in many small steps
//! lands on exactly the level one big step would, and a deadline computed now is exactly the
//! instant the level gets there.
//!
//! Everything saturates: an elapsed time or a rate near `u64::MAX` overflows nothing, it just
//! fills the level to its cap.

use super::throttle::MAX_TENTHS;

/// Units in one whole token or request: the nanoseconds in a minute.
pub(crate) const UNITS_PER_WHOLE: u128 = 60_000_000_000;

/// The refill multiplier without throttle, in tenths: `10 / (10 + throttle tenths)`.
const TENTHS: u128 = 10;

/// One dimension's level and the fraction of a unit its last refill left over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Level {
    /// Units available; never above the cap passed to the last operation.
    units: u128,
    /// The refill remainder, in `1 / (10 + throttle)` of a unit; below that divisor (at most
    /// 100, the throttle being at most [`MAX_TENTHS`]), and zero whenever the level is at its cap.
    carry: u8,
}

impl Level {
    /// A level holding `whole` tokens (or requests).
    pub(crate) fn full(whole: u64) -> Level {
        Level {
            units: to_units(whole),
            carry: 0,
        }
    }

    /// Whole tokens (or requests) available, rounded down.
    pub(crate) fn whole(&self) -> u64 {
        u64::try_from(self.units / UNITS_PER_WHOLE).unwrap_or(u64::MAX)
    }

    /// True when `whole` tokens (or requests) are available.
    pub(crate) fn holds(&self, whole: u64) -> bool {
        to_units(whole) <= self.units
    }

    /// Adds what `per_minute` produces in `elapsed_nanos` under a throttle of `throttle_tenths`
    /// (at most [`MAX_TENTHS`]), capped at `cap` whole tokens.
    pub(crate) fn refill(
        &mut self,
        elapsed_nanos: u64,
        per_minute: u64,
        throttle_tenths: u32,
        cap: u64,
    ) {
        debug_assert!(throttle_tenths <= MAX_TENTHS, "the carry fits a byte");
        let cap = to_units(cap);
        if self.units >= cap {
            self.fill_to(cap);
            return;
        }
        if elapsed_nanos == 0 {
            return;
        }
        let produced = u128::from(elapsed_nanos).saturating_mul(u128::from(per_minute));
        let added = if throttle_tenths == 0 && self.carry == 0 {
            // Unthrottled and no fraction pending: the common case, and exact without a division.
            produced
        } else {
            let divisor = divisor(throttle_tenths);
            let numerator = produced
                .saturating_mul(TENTHS)
                .saturating_add(u128::from(self.carry));
            let (added, carry) = div_rem(numerator, divisor);
            // The remainder is below the divisor, at most 100.
            self.carry = carry as u8;
            added
        };
        self.units = self.units.saturating_add(added);
        if self.units >= cap {
            self.fill_to(cap);
        }
    }

    /// Takes `whole` tokens (or requests); the caller has checked [`Level::holds`].
    pub(crate) fn take(&mut self, whole: u64) {
        self.units = self.units.saturating_sub(to_units(whole));
    }

    /// Credits `whole` tokens (or requests) back, never above `cap`.
    pub(crate) fn give(&mut self, whole: u64, cap: u64) {
        let cap = to_units(cap);
        self.units = self.units.saturating_add(to_units(whole));
        if self.units >= cap {
            self.fill_to(cap);
        }
    }

    /// Lowers the level to `cap` if it is above it.
    pub(crate) fn clamp(&mut self, cap: u64) {
        let cap = to_units(cap);
        if self.units >= cap {
            self.fill_to(cap);
        }
    }

    /// Drops the pending fraction: called when the throttle changes, because the carry counts
    /// in the old throttle's divisor. It is less than one unit (a sixty-billionth of a token).
    pub(crate) fn forget_fraction(&mut self) {
        self.carry = 0;
    }

    /// Nanoseconds until `whole` tokens (or requests) are available at `per_minute` under a
    /// throttle of `throttle_tenths`: zero if they are now, `u64::MAX` if never (a zero rate or
    /// a wait past the end of the clock).
    pub(crate) fn nanos_until(&self, whole: u64, per_minute: u64, throttle_tenths: u32) -> u64 {
        let want = to_units(whole);
        if want <= self.units {
            return 0;
        }
        if per_minute == 0 {
            return u64::MAX;
        }
        // After `e` ns the refill adds floor((e * r * 10 + carry) / d) units; the smallest `e`
        // for which that reaches the deficit is ceil((deficit * d - carry) / (r * 10)).
        let deficit = want - self.units;
        let divisor = divisor(throttle_tenths);
        let needed = deficit
            .saturating_mul(divisor)
            .saturating_sub(u128::from(self.carry));
        let per_nano = u128::from(per_minute).saturating_mul(TENTHS);
        let (quotient, remainder) = div_rem(needed, per_nano);
        let wait = quotient + u128::from(remainder != 0);
        u64::try_from(wait).unwrap_or(u64::MAX)
    }

    fn fill_to(&mut self, cap: u128) {
        self.units = cap;
        self.carry = 0;
    }
}

/// `whole` tokens in units (never overflows: `u64::MAX * 6e10 < u128::MAX`).
fn to_units(whole: u64) -> u128 {
    u128::from(whole) * UNITS_PER_WHOLE
}

/// The throttle's divisor: `10 + tenths`.
fn divisor(throttle_tenths: u32) -> u128 {
    TENTHS + u128::from(throttle_tenths)
}

/// `n / d` and `n % d` (`d > 0`), in 64-bit arithmetic when both fit, which is most of the time
/// and several times faster than a 128-bit division.
fn div_rem(n: u128, d: u128) -> (u128, u128) {
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) => (u128::from(n / d), u128::from(n % d)),
        _ => (n / d, n % d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn empty() -> Level {
        Level { units: 0, carry: 0 }
    }

    #[test]
    fn a_second_at_six_thousand_a_minute_refills_exactly_one_hundred() {
        let mut level = empty();
        level.refill(SECOND, 6_000, 0, 6_000);
        assert_eq!(level.whole(), 100);
        assert_eq!(level, Level::full(100));
    }

    #[test]
    fn small_throttled_steps_land_where_one_big_step_does() {
        let mut stepped = empty();
        for _ in 0..3_000 {
            stepped.refill(SECOND / 1_000 + 7, 6_000, 7, 6_000);
        }
        let mut once = empty();
        once.refill(3_000 * (SECOND / 1_000 + 7), 6_000, 7, 6_000);
        assert_eq!(stepped, once);
    }

    #[test]
    fn the_deadline_is_the_first_nanosecond_the_level_is_reached() {
        for throttle in [0, 3, 5, 10, 17, 90] {
            let mut level = empty();
            level.refill(12_345, 7, throttle, 1_000);
            let wait = level.nanos_until(1, 7, throttle);
            let mut early = level;
            early.refill(wait - 1, 7, throttle, 1_000);
            assert!(!early.holds(1), "throttle {throttle}: one ns early");
            let mut on_time = level;
            on_time.refill(wait, 7, throttle, 1_000);
            assert!(on_time.holds(1), "throttle {throttle}: on time");
        }
    }

    #[test]
    fn extreme_rates_and_times_saturate_to_the_cap() {
        let mut level = empty();
        level.refill(u64::MAX, u64::MAX, 90, u64::MAX);
        assert_eq!(level.whole(), u64::MAX);
        let mut level = empty();
        assert_eq!(level.nanos_until(u64::MAX, 1, 90), u64::MAX);
        assert_eq!(level.nanos_until(1, 0, 0), u64::MAX);
        level.give(u64::MAX, 5);
        assert_eq!(level.whole(), 5);
        level.take(u64::MAX);
        assert_eq!(level.whole(), 0);
    }
}
