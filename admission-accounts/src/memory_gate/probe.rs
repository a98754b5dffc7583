//! The real memory probes: a container's cgroup v2 counters, and the process's resident set
//! against a limit the caller configures.
//!
//! Both read small text files under `/proc` and `/sys` (Linux only; elsewhere they answer with a
//! [`ProbeError`] naming the file). An allocator's own figure (jemalloc's `stats.allocated`) is
//! not offered: it would need a dependency this crate does not take.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::reading::{MemoryProbe, MemoryReading, ProbeError};

/// Where the process's cgroup is named.
/// How long a gate reuses a reading of the real probes here by default: long enough that
/// admissions do not each read a file, far shorter than the latch's re-check (2 s) and the
/// drain's spacing (from 50 ms), so the gate still sees memory move in time.
pub(crate) const READING_AGE: Duration = Duration::from_millis(5);

const PROC_CGROUP: &str = "/proc/self/cgroup";
/// Where the cgroup v2 hierarchy is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Where the process's own status (with its resident set) is.
const PROC_STATUS: &str = "/proc/self/status";

fn read_text(probe: &str, path: &Path) -> Result<String, ProbeError> {
    fs::read_to_string(path)
        .map_err(|e| ProbeError::unreadable(probe, path.display().to_string(), e))
}

fn parse_bytes(probe: &str, path: &Path, text: &str) -> Result<u64, ProbeError> {
    let text = text.trim();
    text.parse::<u64>().map_err(|_| {
        ProbeError::unusable(
            probe,
            path.display().to_string(),
            format!("holds `{text}`, not a number of bytes"),
        )
    })
}

/// Used memory and the limit of the cgroup (v2) this process runs in: `memory.current` against
/// `memory.max`, the numbers a container's out-of-memory killer goes by.
///
/// # Examples
///
/// ```no_run
/// use admission_accounts::memory_gate::CgroupV2Probe;
/// use admission_accounts::memory_gate::MemoryProbe;
///
/// match CgroupV2Probe::detect() {
///     Ok(probe) => println!("{:?}", probe.read()),
///     Err(why) => println!("no cgroup v2 reading here: {why}"),
/// }
/// ```
#[derive(Clone, Debug)]
pub struct CgroupV2Probe {
    dir: PathBuf,
}

impl CgroupV2Probe {
    /// The name this probe reports.
    pub const NAME: &'static str = "cgroup-v2";

    /// The probe for this process's own cgroup, found through `/proc/self/cgroup` under
    /// `/sys/fs/cgroup`.
    ///
    /// # Errors
    ///
    /// When the process is not in a cgroup v2 hierarchy (no `0::` line), or its cgroup has no
    /// memory controller (no `memory.current`). A cgroup without a limit is found here but every
    /// read says so.
    pub fn detect() -> Result<CgroupV2Probe, ProbeError> {
        let path = Path::new(PROC_CGROUP);
        let text = read_text(Self::NAME, path)?;
        let relative = text
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .ok_or_else(|| {
                ProbeError::unusable(
                    Self::NAME,
                    PROC_CGROUP,
                    "names no cgroup v2 (no `0::` line): the machine uses cgroup v1 or none",
                )
            })?;
        let dir = Path::new(CGROUP_ROOT).join(relative.trim().trim_start_matches('/'));
        let probe = CgroupV2Probe::at(dir);
        if !probe.dir.join("memory.current").exists() {
            return Err(ProbeError::unusable(
                Self::NAME,
                probe.dir.join("memory.current").display().to_string(),
                "does not exist: no memory controller (or /sys/fs/cgroup is not cgroup v2)",
            ));
        }
        Ok(probe)
    }

    /// The probe for the cgroup directory `dir` (holding `memory.current` and `memory.max`).
    pub fn at(dir: impl Into<PathBuf>) -> CgroupV2Probe {
        CgroupV2Probe { dir: dir.into() }
    }

    /// The cgroup directory read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl MemoryProbe for CgroupV2Probe {
    fn read(&self) -> Result<MemoryReading, ProbeError> {
        let current = self.dir.join("memory.current");
        let used = parse_bytes(Self::NAME, &current, &read_text(Self::NAME, &current)?)?;
        let max = self.dir.join("memory.max");
        let text = read_text(Self::NAME, &max)?;
        if text.trim() == "max" {
            return Err(ProbeError::unusable(
                Self::NAME,
                max.display().to_string(),
                "is `max`: the container has no memory limit to read usage against",
            ));
        }
        let limit = parse_bytes(Self::NAME, &max, &text)?;
        Ok(MemoryReading::new(used, limit))
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    /// Reading the file costs a system call and a parse (about 14 us here): a gate reuses a
    /// reading for 5 ms.
    fn default_max_age(&self) -> Duration {
        READING_AGE
    }
}

/// This process's resident set (`VmRSS` in `/proc/self/status`, reported in kB, so no page size
/// is needed) against a limit the caller chooses.
///
/// # Examples
///
/// ```
/// use admission_accounts::memory_gate::ResidentSetProbe;
/// use admission_accounts::memory_gate::MemoryProbe;
///
/// let probe = ResidentSetProbe::new(8 << 30);
/// if let Ok(reading) = probe.read() {
///     assert!(reading.used > 0);
///     assert_eq!(reading.limit, 8 << 30);
/// }
/// ```
#[derive(Clone, Debug)]
pub struct ResidentSetProbe {
    path: PathBuf,
    limit: u64,
}

impl ResidentSetProbe {
    /// The name this probe reports.
    pub const NAME: &'static str = "resident-set";

    /// Reads this process's resident set against `limit` bytes.
    pub fn new(limit: u64) -> ResidentSetProbe {
        ResidentSetProbe::at(PROC_STATUS, limit)
    }

    /// Reads the `VmRSS` line of the status file at `path` (the same format as
    /// `/proc/self/status`) against `limit` bytes.
    pub fn at(path: impl Into<PathBuf>, limit: u64) -> ResidentSetProbe {
        ResidentSetProbe {
            path: path.into(),
            limit,
        }
    }

    /// The configured limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

impl MemoryProbe for ResidentSetProbe {
    fn read(&self) -> Result<MemoryReading, ProbeError> {
        let text = read_text(Self::NAME, &self.path)?;
        let unusable = |reason: String| {
            ProbeError::unusable(Self::NAME, self.path.display().to_string(), reason)
        };
        let line = text
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .ok_or_else(|| unusable("has no `VmRSS:` line".to_owned()))?;
        let mut words = line.split_whitespace();
        let (number, unit) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let kb: u64 = number
            .parse()
            .map_err(|_| unusable(format!("has `VmRSS:{line}`, not a number of kB")))?;
        if unit != "kB" {
            return Err(unusable(format!("reports VmRSS in `{unit}`, not kB")));
        }
        Ok(MemoryReading::new(kb.saturating_mul(1024), self.limit))
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    /// Reading the file costs a system call and a parse (about 14 us here): a gate reuses a
    /// reading for 5 ms.
    fn default_max_age(&self) -> Duration {
        READING_AGE
    }
}
