//! Simulated time: a [`ScaledClock`] that runs `scale` times faster than the wall clock.
//!
//! Providers budget tokens per *minute*; a demo cannot wait twenty real minutes. Instead of
//! inflating every budget, the example gives the monitor, every account and the simulated
//! provider one clock on which a simulated minute passes in `60 / scale` real seconds. Everything
//! that reads time through [`admission_core::Clock`] (token refills, window turns, admit
//! timeouts, event stamps, `Grant::wall_wait`) is therefore in simulated time, and the only
//! real-time waits left are the ones this module converts: the monitor's evaluator asks
//! [`Timer::real_wait`] how long to sleep, and the jobs' own sleeps (a call's latency, a
//! retry-after) go through [`ScaledClock::sleep`].
//!
//! The scaled clock only follows real time, so it keeps the trait's default `subscribe` (nothing
//! ever makes it jump).

use std::sync::Arc;
use std::time::Duration;

use admission_core::{Clock, Instant, SystemClock, Timer};

/// A monotonic clock reading `scale` x the real time elapsed since it was made.
///
/// Instants start at zero when the clock is built, so a run's simulated time is simply
/// `clock.now()`. Arithmetic saturates (a scale of 10,000 still lasts weeks before the 64-bit
/// nanosecond range ends).
#[derive(Debug)]
pub struct ScaledClock {
    system: SystemClock,
    /// The system clock's reading when this clock was made: simulated zero.
    origin: Instant,
    /// Simulated nanoseconds per real nanosecond; at least 1.
    scale: u64,
}

impl ScaledClock {
    /// A clock running `scale` times faster than real time (`scale` 0 is read as 1), starting at
    /// zero now.
    pub fn new(scale: u32) -> Arc<ScaledClock> {
        let system = SystemClock::new();
        Arc::new(ScaledClock {
            origin: system.now(),
            system,
            scale: u64::from(scale.max(1)),
        })
    }

    /// Simulated time since the clock was made.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now().as_nanos())
    }

    /// The real time a simulated duration takes, rounded up to the nanosecond (so a sleep never
    /// ends before the simulated instant it waits for).
    pub fn to_real(&self, simulated: Duration) -> Duration {
        let nanos = simulated.as_nanos().div_ceil(u128::from(self.scale));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Sleeps the calling task for `simulated` time.
    pub async fn sleep(&self, simulated: Duration) {
        tokio::time::sleep(self.to_real(simulated)).await;
    }

    /// Sleeps the calling task until the clock reads `deadline` (at once if it already does).
    pub async fn sleep_until(&self, deadline: Instant) {
        if let Some(wait) = self.real_wait(deadline) {
            tokio::time::sleep(wait).await;
        }
    }
}

impl Clock for ScaledClock {
    fn now(&self) -> Instant {
        let real = self
            .system
            .now()
            .saturating_duration_since(self.origin)
            .as_nanos();
        let scaled = real.saturating_mul(u128::from(self.scale));
        Instant::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
    }
}

impl Timer for ScaledClock {
    /// The simulated distance to `deadline`, divided by the scale.
    fn real_wait(&self, deadline: Instant) -> Option<Duration> {
        Some(self.to_real(deadline.saturating_duration_since(self.now())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_time_is_simulated_time_divided_by_the_scale_rounded_up() {
        let clock = ScaledClock::new(60);
        assert_eq!(
            clock.to_real(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        assert_eq!(
            clock.to_real(Duration::from_nanos(61)),
            Duration::from_nanos(2)
        );
        assert_eq!(clock.real_wait(Instant::ZERO), Some(Duration::ZERO));
    }
}
