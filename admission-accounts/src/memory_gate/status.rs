//! [`MemoryStatus`]: the record of the memory pressure gate.

use std::fmt;
use std::time::Duration;

use admission_core::{AccountStatus, Category};
use serde::Serialize;

use crate::status::duration_ms;

/// Which regime the memory gate is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MemoryZone {
    /// Nothing is waiting on memory.
    Green,
    /// Jobs wait on memory and are let through one at a time.
    Draining,
    /// The high-water latch is set: nobody is admitted until usage falls back below the low mark.
    Critical,
}

impl MemoryZone {
    /// The zone's wire name (`GREEN`, `DRAINING`, `CRITICAL`).
    pub fn as_str(&self) -> &'static str {
        match self {
            MemoryZone::Green => "GREEN",
            MemoryZone::Draining => "DRAINING",
            MemoryZone::Critical => "CRITICAL",
        }
    }
}

impl fmt::Display for MemoryZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The memory gate's zone and readings at one instant.
///
/// The spacing serializes as milliseconds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::AccountStatus;
/// use admission_accounts::memory_gate::{MemoryStatus, MemoryZone};
///
/// let status = MemoryStatus {
///     name: "memory".into(),
///     zone: MemoryZone::Draining,
///     used_bytes: 850,
///     limit_bytes: 1_000,
///     floor_percent: 80.0,
///     penalty: 1.0,
///     spacing: Duration::from_nanos(1_111_111_111),
///     line: 3,
/// };
/// assert_eq!(status.used_percent(), 85.0);
/// assert_eq!(status.indicator().as_deref(), Some("pace:1111ms"));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryStatus {
    /// The account's name.
    pub name: String,
    /// The regime the gate is in.
    pub zone: MemoryZone,
    /// Memory in use at the last reading.
    pub used_bytes: u64,
    /// The memory the process may use.
    pub limit_bytes: u64,
    /// The usage, in percent of the limit, above which arrivals are spaced out.
    pub floor_percent: f64,
    /// The extra spacing charged for growth above the floor, as a factor.
    pub penalty: f64,
    /// The gap the gate puts between two releases from memory's line at this reading: the
    /// curve at the usage times the penalty, capped at an hour.
    #[serde(serialize_with = "duration_ms::serialize")]
    pub spacing: Duration,
    /// How many jobs wait on memory.
    pub line: usize,
}

impl MemoryStatus {
    /// Usage in percent of the limit; zero when the limit is zero.
    pub fn used_percent(&self) -> f64 {
        if self.limit_bytes == 0 {
            0.0
        } else {
            self.used_bytes as f64 * 100.0 / self.limit_bytes as f64
        }
    }
}

impl AccountStatus for MemoryStatus {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        crate::MemoryGate::CATEGORY
    }

    /// `None` in the green zone, else `pace:<n>ms`, `n` the spacing in whole milliseconds
    /// (rounded down): the pace at which memory's line drains. While latched nothing passes
    /// and the zone says so; the pace is still the one the reading gives.
    fn indicator(&self) -> Option<String> {
        match self.zone {
            MemoryZone::Green => None,
            MemoryZone::Draining | MemoryZone::Critical => {
                Some(format!("pace:{}ms", self.spacing.as_millis()))
            }
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} [{}]: {}, {} of {} bytes used ({:.1}%), floor {:.1}%, penalty {:.2}, spacing {:?}, \
             {} waiting",
            self.name,
            crate::MemoryGate::CATEGORY,
            self.zone,
            self.used_bytes,
            self.limit_bytes,
            self.used_percent(),
            self.floor_percent,
            self.penalty,
            self.spacing,
            self.line,
        )
    }
}
