//! [`ManualProbe`]: a memory probe whose reading is set by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::reading::{MemoryProbe, MemoryReading, ProbeError};

#[derive(Debug, Default)]
struct Inner {
    used: AtomicU64,
    limit: AtomicU64,
    failing: AtomicBool,
    reads: AtomicUsize,
}

/// A [`MemoryProbe`] whose reading is set by hand; clones share one reading.
///
/// Feed it from a figure the process already keeps (a buffer pool's own accounting, an
/// allocator's statistics, an external agent's report), or drive a memory gate through its zones
/// in a test. It counts its reads, so a test can see how often the gate asked.
///
/// # Examples
///
/// ```
/// use admission_accounts::memory_gate::{ManualProbe, MemoryProbe, MemoryReading};
///
/// let probe = ManualProbe::new();
/// probe.clone().set_percent(85);
/// assert_eq!(probe.read().unwrap(), MemoryReading::new(85 * ManualProbe::GB, 100 * ManualProbe::GB));
/// probe.set_unreadable(true);
/// assert!(probe.read().is_err());
/// assert_eq!(probe.reads(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct ManualProbe {
    inner: Arc<Inner>,
}

impl Default for ManualProbe {
    fn default() -> ManualProbe {
        ManualProbe::new()
    }
}

impl ManualProbe {
    /// One gigabyte (10^9 bytes).
    pub const GB: u64 = 1_000_000_000;
    /// The limit [`ManualProbe::set_percent`] reads against: 100 GB.
    pub const DEFAULT_LIMIT: u64 = 100 * ManualProbe::GB;

    /// A probe reading 0 bytes used of [`ManualProbe::DEFAULT_LIMIT`].
    pub fn new() -> ManualProbe {
        let probe = ManualProbe {
            inner: Arc::new(Inner::default()),
        };
        probe.set(0, ManualProbe::DEFAULT_LIMIT);
        probe
    }

    /// Reads `used` of `limit` bytes from now on.
    pub fn set(&self, used: u64, limit: u64) {
        self.inner.used.store(used, Ordering::SeqCst);
        self.inner.limit.store(limit, Ordering::SeqCst);
    }

    /// Reads `percent` whole percent of [`ManualProbe::DEFAULT_LIMIT`] from now on.
    pub fn set_percent(&self, percent: u64) {
        self.set(
            percent.saturating_mul(ManualProbe::GB),
            ManualProbe::DEFAULT_LIMIT,
        );
    }

    /// Makes every read fail (`true`) or succeed again (`false`).
    pub fn set_unreadable(&self, failing: bool) {
        self.inner.failing.store(failing, Ordering::SeqCst);
    }

    /// How many times the probe was read, failures included.
    pub fn reads(&self) -> usize {
        self.inner.reads.load(Ordering::SeqCst)
    }
}

impl MemoryProbe for ManualProbe {
    fn read(&self) -> Result<MemoryReading, ProbeError> {
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        if self.inner.failing.load(Ordering::Relaxed) {
            return Err(ProbeError::unreadable(
                "manual",
                "the manual reading",
                "the reading was marked unreadable",
            ));
        }
        Ok(MemoryReading::new(
            self.inner.used.load(Ordering::Relaxed),
            self.inner.limit.load(Ordering::Relaxed),
        ))
    }

    fn name(&self) -> &str {
        "manual"
    }
}
