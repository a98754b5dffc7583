//! [`MemoryProbe`]: where the memory gate gets its reading of used memory against a limit.
//!
//! A Rust process has no managed heap to ask, so the gate is handed a probe: a container's cgroup
//! counters, the process's resident set against a configured limit, or a reading set by hand. A
//! probe only reads; the gate decides what a reading means, and reads at most once per instant of
//! the monitor's clock.

use std::fmt;

/// One reading: bytes in use and the bytes the process may use.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct MemoryReading {
    /// Bytes in use.
    pub used: u64,
    /// The most the process may use, in bytes.
    pub limit: u64,
}

impl MemoryReading {
    /// A reading of `used` out of `limit` bytes.
    pub const fn new(used: u64, limit: u64) -> MemoryReading {
        MemoryReading { used, limit }
    }

    /// `used / limit`, never NaN: a zero limit reads as full (1.0) when anything is used and as
    /// empty (0.0) otherwise. May exceed 1.0 when usage is above the limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_accounts::memory_gate::MemoryReading;
    ///
    /// assert_eq!(MemoryReading::new(3, 4).ratio(), 0.75);
    /// assert_eq!(MemoryReading::new(1, 0).ratio(), 1.0);
    /// assert_eq!(MemoryReading::new(0, 0).ratio(), 0.0);
    /// ```
    pub fn ratio(&self) -> f64 {
        match (self.used, self.limit) {
            (0, 0) => 0.0,
            (_, 0) => 1.0,
            (used, limit) => used as f64 / limit as f64,
        }
    }

    /// The reading in percentage points of the limit (`ratio() * 100`), computed so that a whole
    /// number of percent of a whole limit comes out exact.
    pub fn percent(&self) -> f64 {
        match (self.used, self.limit) {
            (0, 0) => 0.0,
            (_, 0) => 100.0,
            (used, limit) => used as f64 * 100.0 / limit as f64,
        }
    }
}

/// Why a probe could not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// A source (a file, a counter) could not be read.
    #[error("memory probe `{probe}` could not read {source_name}: {reason}")]
    Unreadable {
        /// The probe's name.
        probe: String,
        /// What it tried to read (a path, a counter's name).
        source_name: String,
        /// The underlying failure, in words.
        reason: String,
    },
    /// The source was read but says nothing usable (no limit set, an unparsable value).
    #[error("memory probe `{probe}`: {source_name} {reason}")]
    Unusable {
        /// The probe's name.
        probe: String,
        /// What it read.
        source_name: String,
        /// What is wrong with what it found.
        reason: String,
    },
}

impl ProbeError {
    /// `source_name` could not be read by `probe` because of `reason`.
    pub fn unreadable(
        probe: impl Into<String>,
        source_name: impl Into<String>,
        reason: impl fmt::Display,
    ) -> ProbeError {
        ProbeError::Unreadable {
            probe: probe.into(),
            source_name: source_name.into(),
            reason: reason.to_string(),
        }
    }

    /// `source_name` was read by `probe` but is unusable because of `reason`.
    pub fn unusable(
        probe: impl Into<String>,
        source_name: impl Into<String>,
        reason: impl fmt::Display,
    ) -> ProbeError {
        ProbeError::Unusable {
            probe: probe.into(),
            source_name: source_name.into(),
            reason: reason.to_string(),
        }
    }
}

/// A source of [`MemoryReading`]s.
///
/// A probe must return promptly and never block on anything but its own read; the memory gate
/// calls it under the monitor lock, at most once per instant of the monitor's clock.
pub trait MemoryProbe: Send + Sync + 'static {
    /// Reads memory in use and its limit now.
    ///
    /// # Errors
    ///
    /// A [`ProbeError`] naming what could not be read or used.
    fn read(&self) -> Result<MemoryReading, ProbeError>;

    /// The probe's name, for logs and errors.
    fn name(&self) -> &str;

    /// How long a gate may reuse one reading before it reads again, unless told otherwise.
    ///
    /// Zero (the default) reads at every new instant, right for a probe that costs nothing. A
    /// probe that reads a file or asks the kernel should answer a few milliseconds, so that
    /// admissions on a system clock (every one a new instant) do not each pay for a read.
    fn default_max_age(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl fmt::Debug for dyn MemoryProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryProbe")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_percentages_of_a_whole_limit_are_exact() {
        let gb = 1_000_000_000u64;
        assert_eq!(MemoryReading::new(80 * gb, 100 * gb).percent(), 80.0);
        assert_eq!(MemoryReading::new(93 * gb, 100 * gb).percent(), 93.0);
        assert_eq!(MemoryReading::new(5, 0).percent(), 100.0);
        assert_eq!(MemoryReading::new(0, 0).percent(), 0.0);
        assert_eq!(MemoryReading::new(u64::MAX, 1).ratio(), u64::MAX as f64);
    }

    #[test]
    fn a_probe_error_names_the_probe_and_its_source() {
        let e = ProbeError::unusable("cgroup-v2", "/sys/fs/cgroup/memory.max", "is `max`");
        assert_eq!(
            e.to_string(),
            "memory probe `cgroup-v2`: /sys/fs/cgroup/memory.max is `max`"
        );
    }
}
