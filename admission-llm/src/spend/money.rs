//! [`Money`]: an amount in integer micro-units, with saturating arithmetic and a fixed-point display.
//!
//! Prices and caps are sums of many small charges; floating point would make the cap's answer
//! depend on the order the charges arrived in. An integer count of micro-units adds exactly and
//! compares exactly, and a millionth of a unit is finer than any provider bills.

use std::fmt;
use std::iter::Sum;
use std::ops::Add;

use serde::{Deserialize, Serialize};

/// Micro-units in one unit.
const MICROS_PER_UNIT: u64 = 1_000_000;

/// Tokens in the "per million tokens" of a price list.
const TOKENS_PER_PRICE: u128 = 1_000_000;

/// An amount of money in integer micro-units (1 unit = 1,000,000 micros).
///
/// The unit is whatever currency the workflow's prices are written in; the ledger never converts.
/// Every operation saturates at `u64::MAX` micros (about 18 trillion units) or at zero, so no
/// arithmetic here panics. Serialized as a plain integer of micros.
///
/// Displays as units, a dot and six digits of micros: `1.234567`.
///
/// # Examples
///
/// ```
/// use admission_llm::spend::Money;
///
/// let input = Money::per_million(12_000, 3_000_000); // 12k tokens at 3 units per million
/// let output = Money::per_million(800, 15_000_000);
/// assert_eq!(input + output, Money::from_micros(48_000));
/// assert_eq!((input + output).to_string(), "0.048000");
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Money(u64);

impl Money {
    /// Nothing.
    pub const ZERO: Money = Money(0);

    /// `micros` micro-units.
    pub const fn from_micros(micros: u64) -> Money {
        Money(micros)
    }

    /// `units` whole units, saturating at `u64::MAX` micros.
    pub const fn from_units(units: u64) -> Money {
        Money(units.saturating_mul(MICROS_PER_UNIT))
    }

    /// The amount in micro-units.
    pub const fn micros(self) -> u64 {
        self.0
    }

    /// `self + other`, saturating at `u64::MAX` micros.
    #[must_use]
    pub const fn saturating_add(self, other: Money) -> Money {
        Money(self.0.saturating_add(other.0))
    }

    /// `self - other`, saturating at zero.
    #[must_use]
    pub const fn saturating_sub(self, other: Money) -> Money {
        Money(self.0.saturating_sub(other.0))
    }

    /// The price of `tokens` at `micros_per_million` micro-units per million tokens.
    ///
    /// Rounded up to a whole micro-unit, so a priced reservation never comes out below the
    /// invoice because of rounding; one token at 3 micros per million costs 1 micro. The
    /// product is taken in 128 bits and the result saturates at `u64::MAX` micros.
    pub fn per_million(tokens: u64, micros_per_million: u64) -> Money {
        let product = u128::from(tokens) * u128::from(micros_per_million);
        let micros = product.div_ceil(TOKENS_PER_PRICE);
        Money(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

impl Add for Money {
    type Output = Money;

    /// Saturating, like [`Money::saturating_add`].
    fn add(self, other: Money) -> Money {
        self.saturating_add(other)
    }
}

impl Sum for Money {
    fn sum<I: Iterator<Item = Money>>(iter: I) -> Money {
        iter.fold(Money::ZERO, Money::saturating_add)
    }
}

impl<'a> Sum<&'a Money> for Money {
    fn sum<I: Iterator<Item = &'a Money>>(iter: I) -> Money {
        iter.copied().sum()
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:06}",
            self.0 / MICROS_PER_UNIT,
            self.0 % MICROS_PER_UNIT
        )
    }
}
