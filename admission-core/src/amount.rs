//! [`Amount`]: what a demand asks of one account, in up to four dimensions.
//!
//! Most accounts count one thing (permits, requests, bytes). Some count two at once: a model's
//! token bucket charges the tokens of a call and one request. An amount is therefore a small fixed
//! vector of unsigned counts whose meaning per dimension belongs to the account; amounts merge by
//! adding dimension by dimension, saturating at `u64::MAX`.

use std::fmt;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

/// A quantity asked of one account: up to [`Amount::DIMENSIONS`] unsigned counts.
///
/// Dimension 0 is the *primary* quantity (permits, tokens, requests); the others are whatever the
/// account documents (the token bucket reads dimension 1 as requests).
///
/// # Examples
///
/// ```
/// use admission_core::Amount;
///
/// let call = Amount::pair(1_200, 1); // 1,200 tokens and one request
/// let more = call + Amount::pair(300, 1);
/// assert_eq!(more, Amount::pair(1_500, 2));
/// assert_eq!(more.primary(), 1_500);
/// assert_eq!(Amount::units(3).get(1), 0);
/// ```
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Amount([u64; Amount::DIMENSIONS]);

impl Amount {
    /// How many dimensions an amount has.
    pub const DIMENSIONS: usize = 4;
    /// Nothing in any dimension.
    pub const ZERO: Amount = Amount([0; Amount::DIMENSIONS]);
    /// One unit of the primary dimension.
    pub const ONE: Amount = Amount::units(1);

    /// `n` units of the primary dimension.
    pub const fn units(n: u64) -> Amount {
        Amount([n, 0, 0, 0])
    }

    /// `primary` units of dimension 0 and `secondary` of dimension 1.
    pub const fn pair(primary: u64, secondary: u64) -> Amount {
        Amount([primary, secondary, 0, 0])
    }

    /// An amount from all four dimensions.
    pub const fn from_dimensions(dims: [u64; Amount::DIMENSIONS]) -> Amount {
        Amount(dims)
    }

    /// The count in `dimension`; zero for a dimension past the last.
    pub const fn get(&self, dimension: usize) -> u64 {
        if dimension < Amount::DIMENSIONS {
            self.0[dimension]
        } else {
            0
        }
    }

    /// The primary dimension, `get(0)`.
    pub const fn primary(&self) -> u64 {
        self.0[0]
    }

    /// All dimensions.
    pub const fn dimensions(&self) -> [u64; Amount::DIMENSIONS] {
        self.0
    }

    /// True when every dimension is zero.
    pub const fn is_zero(&self) -> bool {
        let [a, b, c, d] = self.0;
        a == 0 && b == 0 && c == 0 && d == 0
    }

    /// Dimension-wise sum, clamped at `u64::MAX`.
    pub const fn saturating_add(self, other: Amount) -> Amount {
        let [a, b, c, d] = self.0;
        let [e, f, g, h] = other.0;
        Amount([
            a.saturating_add(e),
            b.saturating_add(f),
            c.saturating_add(g),
            d.saturating_add(h),
        ])
    }

    /// Dimension-wise difference, clamped at zero.
    pub const fn saturating_sub(self, other: Amount) -> Amount {
        let [a, b, c, d] = self.0;
        let [e, f, g, h] = other.0;
        Amount([
            a.saturating_sub(e),
            b.saturating_sub(f),
            c.saturating_sub(g),
            d.saturating_sub(h),
        ])
    }
}

impl Add for Amount {
    type Output = Amount;
    /// Merges two amounts (saturating).
    fn add(self, other: Amount) -> Amount {
        self.saturating_add(other)
    }
}

impl AddAssign for Amount {
    fn add_assign(&mut self, other: Amount) {
        *self = self.saturating_add(other);
    }
}

impl From<u64> for Amount {
    fn from(n: u64) -> Amount {
        Amount::units(n)
    }
}

impl fmt::Debug for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = self.0.iter().rposition(|&d| d != 0).map_or(1, |i| i + 1);
        let mut t = f.debug_tuple("Amount");
        for d in &self.0[..used] {
            t.field(d);
        }
        t.finish()
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = self.0.iter().rposition(|&d| d != 0).map_or(1, |i| i + 1);
        for (i, d) in self.0[..used].iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_merge_by_addition_in_every_dimension() {
        let a = Amount::from_dimensions([1, 2, 3, 4]);
        let b = Amount::from_dimensions([10, 20, 30, 40]);
        assert_eq!(a + b, Amount::from_dimensions([11, 22, 33, 44]));
        let mut c = a;
        c += Amount::units(u64::MAX);
        assert_eq!(c.primary(), u64::MAX);
        assert_eq!(c.get(1), 2);
        assert_eq!(a.get(99), 0);
    }

    #[test]
    fn amounts_print_only_the_dimensions_in_use() {
        assert_eq!(format!("{:?}", Amount::units(5)), "Amount(5)");
        assert_eq!(format!("{:?}", Amount::pair(100, 1)), "Amount(100, 1)");
        assert_eq!(format!("{:?}", Amount::ZERO), "Amount(0)");
        assert_eq!(Amount::pair(100, 1).to_string(), "100+1");
        assert!(Amount::ZERO.is_zero());
        assert!(!Amount::ONE.is_zero());
    }
}
