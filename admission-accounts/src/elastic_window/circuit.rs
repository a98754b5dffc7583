//! The circuit breaker: healthy, blocked while a cooldown runs, then one probe that decides.
//!
//! The state machine of Nygard's circuit breaker (closed, open, half-open), named as the status
//! records name it: `Healthy` lets requests through; `Blocked` refuses everyone until its
//! cooldown ends, and then offers exactly one probe to the head of the line; `Probing` refuses
//! everyone until the probe's verdict (a success closes, a failure re-opens with the cooldown
//! doubled), its refund, or its timeout. Plain data, touched only under the window's lock.

use std::time::Duration;

use super::status::CircuitState;
use admission_core::Instant;

/// Where the breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Requests flow.
    Healthy,
    /// Everyone is refused until `until`; from then on the head of the line may claim the probe.
    Blocked {
        /// The end of the cooldown.
        until: Instant,
    },
    /// One probe is out; everyone else is refused.
    Probing {
        /// The end of the cooldown that preceded the probe, restored if the probe comes to
        /// nothing.
        until: Instant,
        /// When a probe without a verdict is given up.
        expires: Instant,
    },
}

/// What the breaker says to one caller at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// Healthy: only the window decides.
    Open,
    /// The cooldown is over and this caller is the head of the line: it may take the probe.
    Probe,
    /// The cooldown is over, but this caller is not the head of the line: the probe is the
    /// head's to take, not this caller's.
    HeadsProbe,
    /// Blocked with this much cooldown left.
    Cooling(Duration),
    /// The probe is out: everyone is refused until its verdict, refund or expiry.
    ProbeOut,
}

/// The breaker's state and history.
#[derive(Debug)]
pub(super) struct Circuit {
    /// Where it stands.
    phase: Phase,
    /// The cooldown the circuit blocked with last, or the initial cooldown while healthy; within
    /// `[initial, max]` of the configuration.
    cooldown: Duration,
    /// Consecutive failures that arrived with the throttle at its cap, while healthy.
    failures_at_max: u32,
    /// How many times the circuit has opened (from healthy or from a failed probe).
    openings: u64,
}

impl Circuit {
    /// A healthy breaker whose first cooldown will be `initial`.
    pub(super) fn new(initial: Duration) -> Circuit {
        Circuit {
            phase: Phase::Healthy,
            cooldown: initial,
            failures_at_max: 0,
            openings: 0,
        }
    }

    /// Gives up a probe that has had no verdict by its expiry: back to blocked, the cooldown that
    /// preceded it kept (already over, so the next head may probe again). Answers whether it did.
    pub(super) fn expire_probe(&mut self, now: Instant) -> bool {
        match self.phase {
            Phase::Probing { until, expires } if expires <= now => {
                self.phase = Phase::Blocked { until };
                true
            }
            _ => false,
        }
    }

    /// The state as the status records name it.
    pub(super) fn state(&self) -> CircuitState {
        match self.phase {
            Phase::Healthy => CircuitState::Healthy,
            Phase::Blocked { .. } => CircuitState::Blocked,
            Phase::Probing { .. } => CircuitState::Probing,
        }
    }

    /// Time left in the cooldown; zero unless blocked.
    pub(super) fn cooldown_remaining(&self, now: Instant) -> Duration {
        match self.phase {
            Phase::Blocked { until } => until.saturating_duration_since(now),
            Phase::Healthy | Phase::Probing { .. } => Duration::ZERO,
        }
    }

    /// The cooldown length in force (see the field).
    pub(super) fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// How many times the circuit has opened.
    pub(super) fn openings(&self) -> u64 {
        self.openings
    }

    /// What the breaker says at `now` to a caller that is (`head`) or is not the head of the line.
    pub(super) fn pass(&self, now: Instant, head: bool) -> Pass {
        match self.phase {
            Phase::Healthy => Pass::Open,
            Phase::Blocked { until } if now < until => {
                Pass::Cooling(until.saturating_duration_since(now))
            }
            Phase::Blocked { .. } if head => Pass::Probe,
            Phase::Blocked { .. } => Pass::HeadsProbe,
            Phase::Probing { .. } => Pass::ProbeOut,
        }
    }

    /// The head takes the probe at `now`; it expires after `timeout`. Only from blocked.
    pub(super) fn claim_probe(&mut self, now: Instant, timeout: Duration) {
        if let Phase::Blocked { until } = self.phase {
            self.phase = Phase::Probing {
                until,
                expires: now.saturating_add(timeout),
            };
        }
    }

    /// A failure at `now`, `at_max` telling whether the throttle already stood at its cap.
    ///
    /// Healthy: counts toward `threshold` consecutive failures at the cap, opening the circuit
    /// for `initial` when reached. Probing: the probe failed; the circuit re-opens with the
    /// cooldown doubled, clamped to `[initial, max]`. Blocked: nothing changes. Answers whether
    /// the circuit opened.
    pub(super) fn fail(
        &mut self,
        now: Instant,
        at_max: bool,
        threshold: u32,
        initial: Duration,
        max: Duration,
    ) -> bool {
        match self.phase {
            Phase::Healthy => {
                if !at_max {
                    self.failures_at_max = 0;
                    return false;
                }
                self.failures_at_max = self.failures_at_max.saturating_add(1);
                if self.failures_at_max < threshold {
                    return false;
                }
                self.cooldown = initial;
            }
            Phase::Probing { .. } => {
                self.cooldown = self.cooldown.saturating_mul(2).clamp(initial, max);
            }
            Phase::Blocked { .. } => return false,
        }
        self.failures_at_max = 0;
        self.openings = self.openings.saturating_add(1);
        self.phase = Phase::Blocked {
            until: now.saturating_add(self.cooldown),
        };
        true
    }

    /// A success: the failure streak ends; a probe's success closes the circuit, and the next
    /// opening starts again from `initial`. Answers whether the circuit closed.
    pub(super) fn succeed(&mut self, initial: Duration) -> bool {
        self.failures_at_max = 0;
        if let Phase::Probing { .. } = self.phase {
            self.phase = Phase::Healthy;
            self.cooldown = initial;
            true
        } else {
            false
        }
    }

    /// A refund while probing: the probe never had a verdict, so the circuit goes back to
    /// blocked with the cooldown it had (already over). Answers whether it did.
    pub(super) fn refund(&mut self) -> bool {
        if let Phase::Probing { until, .. } = self.phase {
            self.phase = Phase::Blocked { until };
            true
        } else {
            false
        }
    }
}
