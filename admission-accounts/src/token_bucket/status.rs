//! [`TokenBucketStatus`]: the record of a clocked token bucket with a request budget.

use admission_core::{AccountStatus, Category};
use serde::Serialize;

use crate::status::throttle_indicator;

/// A token bucket's tokens and request slots at one instant.
///
/// A call costs tokens and one request; the bucket refills both with time. `throttle` is the
/// adaptive slow-down the bucket applies after rate-limit signals, zero when nominal.
///
/// # Examples
///
/// ```
/// use admission_core::AccountStatus;
/// use admission_accounts::token_bucket::TokenBucketStatus;
///
/// let status = TokenBucketStatus {
///     name: "gpt".into(),
///     capacity: 90_000,
///     level: 1_200,
///     requests_per_minute: 60,
///     requests_available: 4,
///     throttle: 0.5,
/// };
/// assert!(status.has_capacity(1_200));
/// assert!(!status.has_capacity(1_201));
/// assert_eq!(status.indicator().as_deref(), Some("throttle:1.5x"));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenBucketStatus {
    /// The account's name.
    pub name: String,
    /// The token budget: the most tokens the bucket holds.
    pub capacity: u64,
    /// Tokens available now.
    pub level: u64,
    /// The request budget per minute.
    pub requests_per_minute: u64,
    /// Request slots available now.
    pub requests_available: u64,
    /// The adaptive throttle; zero when nominal, `t` stretches refills by `1 + t`.
    pub throttle: f64,
}

impl TokenBucketStatus {
    /// True when a call of `tokens` tokens fits now: at least one request slot is free and at
    /// least `tokens` tokens are available.
    pub fn has_capacity(&self, tokens: u64) -> bool {
        self.requests_available >= 1 && self.level >= tokens
    }
}

impl AccountStatus for TokenBucketStatus {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        crate::TokenBucket::CATEGORY
    }

    /// `throttle:<1 + throttle>x` (one decimal) while throttled, else `None`.
    fn indicator(&self) -> Option<String> {
        throttle_indicator(self.throttle)
    }

    fn summary(&self) -> String {
        format!(
            "{} [{}]: {} of {} tokens, {} of {} requests/min available, throttle {:.1}",
            self.name,
            crate::TokenBucket::CATEGORY,
            self.level,
            self.capacity,
            self.requests_available,
            self.requests_per_minute,
            self.throttle,
        )
    }
}
