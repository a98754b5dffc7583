//! How long a monitor's lock is held (a test hook, feature `test-util`): for benches that
//! measure critical sections, not for production.

#[cfg(not(admission_loom))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Power-of-two buckets of nanoseconds: bucket `i` counts holds shorter than `2^i` ns (and at
/// least `2^(i-1)`).
const BUCKETS: usize = 48;

/// The hold times of one monitor's lock, recorded as its guards are dropped.
#[cfg(not(admission_loom))]
#[derive(Debug)]
pub(crate) struct HoldTimes {
    count: AtomicU64,
    total_ns: AtomicU64,
    longest_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

#[cfg(not(admission_loom))]
impl Default for HoldTimes {
    fn default() -> HoldTimes {
        HoldTimes {
            count: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            longest_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

#[cfg(not(admission_loom))]
impl HoldTimes {
    pub(crate) fn record(&self, held: Duration) {
        let ns = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        self.longest_ns.fetch_max(ns, Ordering::Relaxed);
        let bucket = (u64::BITS - ns.leading_zeros()) as usize;
        self.buckets[bucket.min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The holds recorded so far, starting the count afresh (a hold that ends meanwhile is in
    /// this reading or the next one, possibly split between them).
    pub(crate) fn take(&self) -> LockHolds {
        LockHolds {
            count: self.count.swap(0, Ordering::Relaxed),
            total: Duration::from_nanos(self.total_ns.swap(0, Ordering::Relaxed)),
            longest: Duration::from_nanos(self.longest_ns.swap(0, Ordering::Relaxed)),
            buckets: std::array::from_fn(|i| self.buckets[i].swap(0, Ordering::Relaxed)),
        }
    }
}

/// How long a monitor's lock was held, over every hold since the monitor was built with
/// [`MonitorBuilder::time_lock_holds`](crate::MonitorBuilder::time_lock_holds) or since the last
/// [`Monitor::take_lock_holds`](crate::Monitor::take_lock_holds) (a test hook, feature
/// `test-util`).
///
/// A hold is timed from the moment its taker has the lock to the moment it lets go, with two
/// readings of the standard library's monotonic clock (tens of nanoseconds each, counted in).
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "test-util")] {
/// use admission_core::Monitor;
///
/// let monitor = Monitor::builder().time_lock_holds().build();
/// monitor.stop();
/// let holds = monitor.take_lock_holds().expect("timed");
/// assert!(holds.count >= 1);
/// assert!(holds.at_most(1.0) >= holds.longest);
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolds {
    /// How many times the lock was held.
    pub count: u64,
    /// All holds together.
    pub total: Duration,
    /// The longest single hold.
    pub longest: Duration,
    buckets: [u64; BUCKETS],
}

impl LockHolds {
    /// A bound that the shortest `fraction` of the holds stay under: the upper end of the
    /// power-of-two bucket the `fraction`-quantile falls in, so within a factor of two of it
    /// (`fraction` is clamped to 0..=1; `Duration::ZERO` when nothing was held).
    pub fn at_most(&self, fraction: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let fraction = if fraction.is_nan() {
            1.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        // The rank of the quantile's hold, 1-based: at least the first hold.
        let rank = ((self.count as f64 * fraction).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Duration::from_nanos(1u64 << bucket);
            }
        }
        self.longest
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    #[test]
    fn holds_are_counted_summed_and_bucketed_by_powers_of_two() {
        let times = HoldTimes::default();
        for ns in [100, 100, 100, 3_000, 1_000_000] {
            times.record(Duration::from_nanos(ns));
        }
        let holds = times.take();
        assert_eq!(holds.count, 5);
        assert_eq!(holds.total, Duration::from_nanos(1_003_300));
        assert_eq!(holds.longest, Duration::from_micros(1_000));
        // 100 ns is in [64, 128); 3,000 in [2,048, 4,096); 1,000,000 in [524,288, 1,048,576).
        assert_eq!(holds.at_most(0.6), Duration::from_nanos(128));
        assert_eq!(holds.at_most(0.8), Duration::from_nanos(4_096));
        assert_eq!(holds.at_most(1.0), Duration::from_nanos(1_048_576));
        assert_eq!(holds.at_most(f64::NAN), Duration::from_nanos(1_048_576));
        assert_eq!(times.take().count, 0, "taking starts afresh");
        assert_eq!(times.take().at_most(0.5), Duration::ZERO);
    }
}
