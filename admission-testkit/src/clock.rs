//! [`FakeClock`]: time that moves only when a test says so.
//!
//! Clones share one time; [`FakeClock::advance`] moves every holder at once and wakes whatever
//! subscribed through [`Timer::subscribe`] (a monitor parked on a deadline), so no test ever
//! sleeps on real time to wait for a refill or a timeout.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use admission_core::{Clock, Instant, Timer, WakeFn};
use parking_lot::Mutex;

type Subscriber = Weak<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct Inner {
    now: AtomicU64,
    subscribers: Mutex<Vec<Subscriber>>,
}

/// A manually driven [`Clock`] shared by its clones.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::{Clock, Instant};
/// use admission_testkit::FakeClock;
///
/// let clock = FakeClock::new();
/// let same = clock.clone();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(same.now(), Instant::from_nanos(2_000_000_000));
/// ```
#[derive(Clone, Default)]
pub struct FakeClock {
    inner: Arc<Inner>,
}

impl FakeClock {
    /// A clock reading [`Instant::ZERO`].
    pub fn new() -> FakeClock {
        FakeClock::default()
    }

    /// The clock as a shared handle, which a monitor takes as its [`Timer`] and an account as
    /// its [`Clock`] (`Arc<FakeClock>` coerces to either).
    pub fn shared(&self) -> Arc<FakeClock> {
        Arc::new(self.clone())
    }

    /// Moves time forward by `by` (saturating) and wakes every subscriber.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .inner
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(nanos))
            });
        self.wake_all();
    }

    /// Sets the time to `to` if it is later than now (a clock never goes back), waking subscribers.
    pub fn advance_to(&self, to: Instant) {
        self.inner.now.fetch_max(to.as_nanos(), Ordering::SeqCst);
        self.wake_all();
    }

    /// How many live subscribers the clock holds.
    pub fn subscribers(&self) -> usize {
        let mut subs = self.inner.subscribers.lock();
        subs.retain(|s| s.strong_count() > 0);
        subs.len()
    }

    fn wake_all(&self) {
        let live: Vec<WakeFn> = {
            let mut subs = self.inner.subscribers.lock();
            subs.retain(|s| s.strong_count() > 0);
            subs.iter().filter_map(Weak::upgrade).collect()
        };
        for wake in live {
            wake();
        }
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.inner.now.load(Ordering::SeqCst))
    }
}

impl Timer for FakeClock {
    /// Real time never moves a fake clock: a deadline still ahead is reached only by `advance`.
    fn real_wait(&self, deadline: Instant) -> Option<Duration> {
        (deadline <= self.now()).then_some(Duration::ZERO)
    }

    fn subscribe(&self, wake: &WakeFn) {
        self.inner.subscribers.lock().push(Arc::downgrade(wake));
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeClock")
            .field("now", &self.now())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn advance_moves_every_clone_and_wakes_live_subscribers_only() {
        let clock = FakeClock::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let wake: WakeFn = Arc::new(move || {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        clock.subscribe(&wake);
        clock.clone().advance(Duration::from_millis(1_500));
        assert_eq!(clock.now(), Instant::from_nanos(1_500_000_000));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        drop(wake);
        clock.advance(Duration::from_millis(1));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(clock.subscribers(), 0);
    }

    #[test]
    fn real_wait_is_none_until_the_deadline_is_reached() {
        let clock = FakeClock::new();
        let deadline = Instant::from_nanos(10);
        assert_eq!(clock.real_wait(deadline), None);
        clock.advance(Duration::from_nanos(10));
        assert_eq!(clock.real_wait(deadline), Some(Duration::ZERO));
        clock.advance_to(Instant::from_nanos(5));
        assert_eq!(clock.now(), Instant::from_nanos(10));
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), Instant::MAX);
    }
}
