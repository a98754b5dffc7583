//! [`FakeProbe`]: a memory probe that reads whatever the test set, like a 100 GB heap on demand.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use admission_core::{MemoryProbe, MemoryReading, ProbeError};

#[derive(Debug, Default)]
struct Inner {
    used: AtomicU64,
    limit: AtomicU64,
    failing: AtomicBool,
    reads: AtomicUsize,
}

/// A [`MemoryProbe`] whose reading a test sets; clones share one reading.
///
/// # Examples
///
/// ```
/// use admission_core::{MemoryProbe, MemoryReading};
/// use admission_testkit::FakeProbe;
///
/// let probe = FakeProbe::new();
/// probe.clone().set_percent(85);
/// assert_eq!(probe.read().unwrap(), MemoryReading::new(85 * FakeProbe::GB, 100 * FakeProbe::GB));
/// probe.fail(true);
/// assert!(probe.read().is_err());
/// assert_eq!(probe.reads(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct FakeProbe {
    inner: Arc<Inner>,
}

impl Default for FakeProbe {
    fn default() -> FakeProbe {
        FakeProbe::new()
    }
}

impl FakeProbe {
    /// One gigabyte (10^9 bytes).
    pub const GB: u64 = 1_000_000_000;
    /// The limit [`FakeProbe::set_percent`] reads against: 100 GB.
    pub const DEFAULT_LIMIT: u64 = 100 * FakeProbe::GB;

    /// A probe reading 0 bytes used of [`FakeProbe::DEFAULT_LIMIT`].
    pub fn new() -> FakeProbe {
        let probe = FakeProbe {
            inner: Arc::new(Inner::default()),
        };
        probe.set(0, FakeProbe::DEFAULT_LIMIT);
        probe
    }

    /// Reads `used` of `limit` bytes from now on.
    pub fn set(&self, used: u64, limit: u64) {
        self.inner.used.store(used, Ordering::SeqCst);
        self.inner.limit.store(limit, Ordering::SeqCst);
    }

    /// Reads `percent` whole percent of [`FakeProbe::DEFAULT_LIMIT`] from now on.
    pub fn set_percent(&self, percent: u64) {
        self.set(
            percent.saturating_mul(FakeProbe::GB),
            FakeProbe::DEFAULT_LIMIT,
        );
    }

    /// Makes every read fail (`true`) or succeed again (`false`).
    pub fn fail(&self, failing: bool) {
        self.inner.failing.store(failing, Ordering::SeqCst);
    }

    /// How many times the probe was read, failures included.
    pub fn reads(&self) -> usize {
        self.inner.reads.load(Ordering::SeqCst)
    }
}

impl MemoryProbe for FakeProbe {
    fn read(&self) -> Result<MemoryReading, ProbeError> {
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        if self.inner.failing.load(Ordering::Relaxed) {
            return Err(ProbeError::unreadable(
                "fake",
                "the fake reading",
                "the test made the probe fail",
            ));
        }
        Ok(MemoryReading::new(
            self.inner.used.load(Ordering::Relaxed),
            self.inner.limit.load(Ordering::Relaxed),
        ))
    }

    fn name(&self) -> &str {
        "fake"
    }
}
