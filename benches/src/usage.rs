//! What a piece of work cost the whole process: its wall time, the CPU time of every thread
//! (user + system) and the context switches they made, read from `getrusage(RUSAGE_SELF)` before
//! and after it.
//!
//! A wall time alone hides how the work was done: two workers that spin for a lock and two that
//! park on it can take the same time, while one of them burns twice the CPU or switches a hundred
//! times as often. `RUSAGE_SELF` sums over the threads of the process, including threads that
//! ended meanwhile, so the tokio workers and the monitor's evaluator are all counted; so is any
//! other thread the bench process runs at the same time, which the benches avoid.

use std::iter::Sum;
use std::ops::Add;
use std::time::{Duration, Instant};

/// The cost of one piece of work to the process (see the module's docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Elapsed real time.
    pub wall: Duration,
    /// User plus system CPU time of all the process's threads.
    pub cpu: Duration,
    /// Context switches made because a thread blocked (`ru_nvcsw`).
    pub voluntary_switches: u64,
    /// Context switches forced on a runnable thread by the scheduler (`ru_nivcsw`).
    pub involuntary_switches: u64,
}

impl Usage {
    /// Runs `work` and answers what it returned with what it cost.
    ///
    /// # Panics
    ///
    /// When `getrusage` fails, which it does only for an invalid argument.
    pub fn measure<T>(work: impl FnOnce() -> T) -> (T, Usage) {
        let before = Reading::now();
        let out = work();
        let after = Reading::now();
        (out, after.since(&before))
    }

    /// Every context switch, voluntary or not.
    pub fn switches(&self) -> u64 {
        self.voluntary_switches + self.involuntary_switches
    }
}

impl Add for Usage {
    type Output = Usage;

    fn add(self, other: Usage) -> Usage {
        Usage {
            wall: self.wall + other.wall,
            cpu: self.cpu + other.cpu,
            voluntary_switches: self.voluntary_switches + other.voluntary_switches,
            involuntary_switches: self.involuntary_switches + other.involuntary_switches,
        }
    }
}

impl Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::default(), Add::add)
    }
}

/// The clock and the process's counters at one instant.
struct Reading {
    at: Instant,
    cpu: Duration,
    voluntary: u64,
    involuntary: u64,
}

impl Reading {
    fn now() -> Reading {
        let usage = rusage_self();
        // Read the clock last, so that the work's wall time holds the second call's cost and
        // not the first's.
        Reading {
            cpu: timeval(usage.ru_utime) + timeval(usage.ru_stime),
            voluntary: u64::try_from(usage.ru_nvcsw).unwrap_or(0),
            involuntary: u64::try_from(usage.ru_nivcsw).unwrap_or(0),
            at: Instant::now(),
        }
    }

    fn since(&self, before: &Reading) -> Usage {
        Usage {
            wall: self.at.duration_since(before.at),
            cpu: self.cpu.saturating_sub(before.cpu),
            voluntary_switches: self.voluntary.saturating_sub(before.voluntary),
            involuntary_switches: self.involuntary.saturating_sub(before.involuntary),
        }
    }
}

fn timeval(tv: libc::timeval) -> Duration {
    let secs = u64::try_from(tv.tv_sec).unwrap_or(0);
    let micros = u32::try_from(tv.tv_usec).unwrap_or(0);
    Duration::new(secs, 0) + Duration::from_micros(u64::from(micros))
}

/// `getrusage(RUSAGE_SELF)`: the counters of the whole process.
#[allow(unsafe_code)]
fn rusage_self() -> libc::rusage {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: the pointer is to a `rusage` on this frame, valid for writes of its whole size,
    // and the call writes nothing else.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) failed");
    // SAFETY: zeroed first, then filled by the kernel; every field is an integer or a struct of
    // integers, for which any bits are a valid value.
    unsafe { usage.assume_init() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usages_add_field_by_field() {
        let one = Usage {
            wall: Duration::from_millis(3),
            cpu: Duration::from_millis(5),
            voluntary_switches: 2,
            involuntary_switches: 1,
        };
        let total: Usage = [one, one].into_iter().sum();
        assert_eq!(
            total,
            Usage {
                wall: Duration::from_millis(6),
                cpu: Duration::from_millis(10),
                voluntary_switches: 4,
                involuntary_switches: 2,
            }
        );
        assert_eq!(total.switches(), 6);
    }

    #[test]
    fn a_measure_hands_back_what_the_work_returned() {
        let (value, _) = Usage::measure(|| 7);
        assert_eq!(value, 7);
    }
}
