//! [`ElasticWindowConfig`]: the eight numbers an elastic window is built from, and their checks.
//!
//! Two numbers set the nominal rate (`max_requests` per `base_window`); the other six set how far
//! the window stretches under pressure and how the circuit breaker opens, cools down and probes.
//! [`ElasticWindowConfig::new`] fills in the defaults, the `with_` methods change one field each,
//! and the window's constructor refuses a configuration that cannot work with a
//! [`ConfigError`] naming the field and the value it saw.

use std::time::Duration;

use crate::ConfigError;

/// The family name carried by configuration errors.
pub(super) const LIMITER: &str = "elastic window";

/// How an [`ElasticWindow`](super::ElasticWindow) is configured.
///
/// The fields are public so a configuration can be read back and adjusted in place; the `with_`
/// methods do the same in one expression. Nothing is checked until the window is built.
///
/// | field | default | must be |
/// |---|---|---|
/// | `max_requests` | (given) | positive |
/// | `base_window` | (given) | positive |
/// | `max_throttle` | 9.0 | finite, at least 0 |
/// | `failures_at_max_to_block` | 3 | positive |
/// | `successes_per_decrease` | 3 | positive |
/// | `initial_cooldown` | 30 s | positive |
/// | `max_cooldown` | 1 h | at least `initial_cooldown` |
/// | `probe_timeout` | `None`: as long as `max_cooldown` | positive when given |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_accounts::elastic_window::ElasticWindowConfig;
///
/// let config = ElasticWindowConfig::new(60, Duration::from_secs(60))
///     .with_max_throttle(4.0)
///     .with_initial_cooldown(Duration::from_secs(10));
/// assert_eq!(config.max_requests, 60);
/// assert_eq!(config.failures_at_max_to_block, 3);
/// assert_eq!(config.max_cooldown, Duration::from_secs(3_600));
/// assert_eq!(config.resolved_probe_timeout(), Duration::from_secs(3_600));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ElasticWindowConfig {
    /// Requests allowed per window: the nominal rate's numerator.
    pub max_requests: u64,
    /// The window when nothing pushes back: the nominal rate's denominator.
    pub base_window: Duration,
    /// The most the throttle can reach; the window then spans `base_window x (1 + max_throttle)`.
    pub max_throttle: f64,
    /// Consecutive failures, each arriving with the throttle already at its maximum, that open
    /// the circuit.
    pub failures_at_max_to_block: u32,
    /// How many successes take one step (0.2) off the throttle.
    pub successes_per_decrease: u32,
    /// How long the circuit stays blocked the first time it opens.
    pub initial_cooldown: Duration,
    /// The longest cooldown; a failed probe doubles the cooldown up to this.
    pub max_cooldown: Duration,
    /// How long a probe may go without a verdict before the circuit returns to blocked; `None`
    /// means as long as `max_cooldown`.
    pub probe_timeout: Option<Duration>,
}

impl ElasticWindowConfig {
    /// `max_requests` per `base_window`, every other field at its default.
    pub fn new(max_requests: u64, base_window: Duration) -> ElasticWindowConfig {
        ElasticWindowConfig {
            max_requests,
            base_window,
            max_throttle: 9.0,
            failures_at_max_to_block: 3,
            successes_per_decrease: 3,
            initial_cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(60 * 60),
            probe_timeout: None,
        }
    }

    /// The same configuration with `max_throttle` changed.
    pub fn with_max_throttle(mut self, max_throttle: f64) -> ElasticWindowConfig {
        self.max_throttle = max_throttle;
        self
    }

    /// The same configuration with `failures_at_max_to_block` changed.
    pub fn with_failures_at_max_to_block(mut self, failures: u32) -> ElasticWindowConfig {
        self.failures_at_max_to_block = failures;
        self
    }

    /// The same configuration with `successes_per_decrease` changed.
    pub fn with_successes_per_decrease(mut self, successes: u32) -> ElasticWindowConfig {
        self.successes_per_decrease = successes;
        self
    }

    /// The same configuration with `initial_cooldown` changed.
    pub fn with_initial_cooldown(mut self, cooldown: Duration) -> ElasticWindowConfig {
        self.initial_cooldown = cooldown;
        self
    }

    /// The same configuration with `max_cooldown` changed.
    pub fn with_max_cooldown(mut self, cooldown: Duration) -> ElasticWindowConfig {
        self.max_cooldown = cooldown;
        self
    }

    /// The same configuration with an explicit `probe_timeout`.
    pub fn with_probe_timeout(mut self, timeout: Duration) -> ElasticWindowConfig {
        self.probe_timeout = Some(timeout);
        self
    }

    /// The probe timeout in force: the one given, else `max_cooldown`.
    pub fn resolved_probe_timeout(&self) -> Duration {
        self.probe_timeout.unwrap_or(self.max_cooldown)
    }

    /// Checks every field and answers the first that cannot work: first the ones that must be
    /// positive (`max_requests`, `base_window`, `initial_cooldown`, `failures_at_max_to_block`,
    /// `successes_per_decrease`, `probe_timeout`), then `max_throttle`, then `max_cooldown`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the limiter `elastic window` naming the field and the value seen.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::ElasticWindowConfig;
    ///
    /// let refused = ElasticWindowConfig::new(0, Duration::from_secs(1)).validate().unwrap_err();
    /// assert_eq!(refused.to_string(), "invalid elastic window configuration: `max_requests` must be positive, was 0");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_requests == 0 {
            return Err(ConfigError::new(
                LIMITER,
                "max_requests",
                "must be positive, was 0",
            ));
        }
        positive("base_window", self.base_window)?;
        positive("initial_cooldown", self.initial_cooldown)?;
        if self.failures_at_max_to_block == 0 {
            return Err(ConfigError::new(
                LIMITER,
                "failures_at_max_to_block",
                "must be positive, was 0",
            ));
        }
        if self.successes_per_decrease == 0 {
            return Err(ConfigError::new(
                LIMITER,
                "successes_per_decrease",
                "must be positive, was 0",
            ));
        }
        if let Some(timeout) = self.probe_timeout {
            positive("probe_timeout", timeout)?;
        }
        if !(self.max_throttle.is_finite() && self.max_throttle >= 0.0) {
            return Err(ConfigError::new(
                LIMITER,
                "max_throttle",
                format!(
                    "must be a finite number of at least 0, was {}",
                    self.max_throttle
                ),
            ));
        }
        if self.max_cooldown < self.initial_cooldown {
            return Err(ConfigError::new(
                LIMITER,
                "max_cooldown",
                format!(
                    "must be at least the initial cooldown ({:?}), was {:?}",
                    self.initial_cooldown, self.max_cooldown
                ),
            ));
        }
        Ok(())
    }
}

/// Refuses a zero duration for `field`.
fn positive(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        Err(ConfigError::new(
            LIMITER,
            field,
            format!("must be positive, was {value:?}"),
        ))
    } else {
        Ok(())
    }
}
