//! [`FixedWindowStatus`]: the record of a fixed-window rate limiter.

use std::time::Duration;

use admission_core::{AccountStatus, Category, Instant};
use serde::Serialize;

use crate::status::{duration_ms, since_origin};

/// A fixed window's count at one instant.
///
/// The limiter allows `limit` units per `period`; the window began at `window_start` and every
/// count resets when it ends.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::{AccountStatus, Instant};
/// use admission_accounts::fixed_window::FixedWindowStatus;
///
/// let status = FixedWindowStatus {
///     name: "sms".into(),
///     limit: 100,
///     period: Duration::from_secs(60),
///     used: 40,
///     window_start: Instant::from_nanos(120_000_000_000),
/// };
/// assert_eq!(status.remaining(), 60);
/// assert_eq!(status.window_end(), Instant::from_nanos(180_000_000_000));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FixedWindowStatus {
    /// The account's name.
    pub name: String,
    /// Units allowed per window.
    pub limit: u64,
    /// The window's length.
    #[serde(serialize_with = "duration_ms::serialize")]
    pub period: Duration,
    /// Units counted in the current window.
    pub used: u64,
    /// When the current window began, on the monitor's clock.
    pub window_start: Instant,
}

impl FixedWindowStatus {
    /// Units still allowed in the current window (zero, never an underflow, when over).
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// When the current window ends and the count resets (saturating).
    pub fn window_end(&self) -> Instant {
        self.window_start.saturating_add(self.period)
    }
}

impl AccountStatus for FixedWindowStatus {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        crate::FixedWindow::CATEGORY
    }

    fn summary(&self) -> String {
        format!(
            "{} [{}]: {} of {} used in the {:?} window from {:?}, {} remaining",
            self.name,
            crate::FixedWindow::CATEGORY,
            self.used,
            self.limit,
            self.period,
            since_origin(self.window_start),
            self.remaining(),
        )
    }
}
