//! What the families' status records share: each family keeps its own record type beside it
//! (`counting_gate/status.rs`, ...), and these helpers.
//!
//! An account builds its record when asked (`Account::status`) and hands it out as a
//! `Box<dyn AccountStatus>`; the record holds copies of the numbers, so reading it never touches
//! the account again. Each record names its numbers in [`summary`](admission_core::AccountStatus::summary)
//! and says in [`indicator`](admission_core::AccountStatus::indicator) whether anything is off
//! nominal.
//!
//! Serialized, instants are nanoseconds on the monitor's clock (as [`Instant`](admission_core::Instant)
//! itself serializes) and durations are milliseconds as a float.

/// `serde(serialize_with)` helper: a [`Duration`](std::time::Duration) as milliseconds (`f64`).
pub(crate) mod duration_ms {
    use std::time::Duration;

    /// Serializes `d` as its length in milliseconds, fractions kept.
    pub(crate) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1_000.0)
    }
}

/// The indicator for a throttle: `None` at zero (or below), else `throttle:<1 + throttle>x` with
/// one decimal, the factor by which the limit's window or spacing is stretched.
pub(crate) fn throttle_indicator(throttle: f64) -> Option<String> {
    (throttle > 0.0).then(|| format!("throttle:{:.1}x", 1.0 + throttle))
}

/// An instant on the monitor's clock written for a reader, as time since the clock's origin.
pub(crate) fn since_origin(at: admission_core::Instant) -> std::time::Duration {
    std::time::Duration::from_nanos(at.as_nanos())
}
