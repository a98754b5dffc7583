//! [`ElasticWindowStatus`]: the record of a sliding-log rate window with a circuit breaker.

use std::fmt;
use std::time::Duration;

use admission_core::{AccountStatus, Category};
use serde::Serialize;

use crate::status::{duration_ms, throttle_indicator};

/// The state of an elastic window's circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    /// Closed: requests flow, limited only by the window.
    Healthy,
    /// Open: everyone is refused until the cooldown runs out.
    Blocked,
    /// Half open: one probe request decides whether the circuit closes or opens again.
    Probing,
}

impl CircuitState {
    /// The state's wire name (`healthy`, `blocked`, `probing`).
    pub fn as_str(&self) -> &'static str {
        match self {
            CircuitState::Healthy => "healthy",
            CircuitState::Blocked => "blocked",
            CircuitState::Probing => "probing",
        }
    }
}

impl fmt::Display for CircuitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An elastic window's requests, throttle and circuit at one instant.
///
/// The window admits `max_requests` requests per `effective_window`, which is `base_window`
/// stretched by `1 + throttle`. Durations serialize as milliseconds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::AccountStatus;
/// use admission_accounts::elastic_window::{CircuitState, ElasticWindowStatus};
///
/// let mut status = ElasticWindowStatus {
///     name: "search".into(),
///     max_requests: 10,
///     base_window: Duration::from_secs(1),
///     effective_window: Duration::from_secs(2),
///     in_use: 4,
///     throttle: 1.0,
///     circuit: CircuitState::Healthy,
///     cooldown_remaining: Duration::ZERO,
/// };
/// assert_eq!(status.indicator().as_deref(), Some("throttle:2.0x"));
/// status.circuit = CircuitState::Blocked;
/// assert_eq!(status.indicator().as_deref(), Some("blocked"));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ElasticWindowStatus {
    /// The account's name.
    pub name: String,
    /// Requests allowed per window.
    pub max_requests: u64,
    /// The window when not throttled.
    #[serde(serialize_with = "duration_ms::serialize")]
    pub base_window: Duration,
    /// The window now: the base window times `1 + throttle`.
    #[serde(serialize_with = "duration_ms::serialize")]
    pub effective_window: Duration,
    /// Requests counted in the current window.
    pub in_use: u64,
    /// The adaptive throttle; zero when nominal.
    pub throttle: f64,
    /// The circuit breaker's state.
    pub circuit: CircuitState,
    /// Time left before a blocked circuit lets a probe through; zero unless blocked.
    #[serde(serialize_with = "duration_ms::serialize")]
    pub cooldown_remaining: Duration,
}

impl AccountStatus for ElasticWindowStatus {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        crate::ElasticWindow::CATEGORY
    }

    /// `blocked` or `probing` while the circuit is not healthy, else `throttle:<1 + throttle>x`
    /// (one decimal) while throttled, else `None`.
    fn indicator(&self) -> Option<String> {
        match self.circuit {
            CircuitState::Blocked | CircuitState::Probing => Some(self.circuit.as_str().to_owned()),
            CircuitState::Healthy => throttle_indicator(self.throttle),
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} [{}]: {} of {} requests in a {:?} window (base {:?}), throttle {:.1}, circuit {}, cooldown {:?}",
            self.name,
            crate::ElasticWindow::CATEGORY,
            self.in_use,
            self.max_requests,
            self.effective_window,
            self.base_window,
            self.throttle,
            self.circuit,
            self.cooldown_remaining,
        )
    }
}
