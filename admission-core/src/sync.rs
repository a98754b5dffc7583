//! The synchronization primitives the monitor uses, switched to loom's under `--cfg admission_loom`.
//!
//! The monitor never names `parking_lot` or `std::thread` directly: it goes through this shim, so the
//! loom models in `monitor/loom_models.rs` explore the very code that ships. Accounts keep their own
//! leaf locks (they never wait while holding one), which loom does not need to see.

#[cfg(not(admission_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
    use std::time::Duration;

    /// A mutex without poisoning.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);
    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock()
        }
    }

    /// A reader-writer lock without poisoning.
    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(parking_lot::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> parking_lot::RwLockReadGuard<'_, T> {
            self.0.read()
        }
        pub(crate) fn write(&self) -> parking_lot::RwLockWriteGuard<'_, T> {
            self.0.write()
        }
    }

    /// The monitor's own lock, without poisoning: the standard library's futex mutex, which
    /// spins briefly and then sleeps in the kernel. `parking_lot`'s was measured beside it in
    /// one sitting, runs interleaved (`docs/benchmarks/2026-12-03-monitor-second-engine.md`, the
    /// fourth step): under contention
    /// the standard mutex took less time with tasks holding across an await (median 474 against
    /// 580 ms, 422 against 567 ms) and made about as many context switches; `parking_lot`'s
    /// fair unlock let a probe in sooner between a long pass's batches (0.17 against 0.67 ms at
    /// the median), a case [`MonitorLock::make_way`] covers well enough.
    ///
    /// That mutex does not hand itself over: a thread that lets go and takes it back at once
    /// usually wins against one the kernel has yet to wake. For a holder that lets go between
    /// the batches of a long walk, [`MonitorLock::make_way`] waits for the threads blocked on
    /// the lock at that moment to have had it; the lock counts them only when `try_lock` fails,
    /// so an uncontended lock pays nothing for it.
    #[derive(Debug, Default)]
    pub(crate) struct MonitorLock<T> {
        lock: std::sync::Mutex<T>,
        /// Threads blocked in `lock` now.
        blocked: AtomicUsize,
        /// Times a blocked thread got the lock, ever.
        unblocked: AtomicUsize,
        /// Every hold's length, when asked for (a test hook).
        #[cfg(any(test, feature = "test-util"))]
        times: Option<Box<HoldTimes>>,
    }

    #[cfg(any(test, feature = "test-util"))]
    use crate::monitor::HoldTimes;

    /// What [`MonitorLock::lock`] returns: the standard guard (and, as a test hook, the instant
    /// it was taken at, for the lock's hold times).
    pub(crate) struct MonitorGuard<'a, T> {
        guard: std::sync::MutexGuard<'a, T>,
        #[cfg(any(test, feature = "test-util"))]
        timing: Option<(std::time::Instant, &'a HoldTimes)>,
    }

    impl<T> std::ops::Deref for MonitorGuard<'_, T> {
        type Target = T;

        #[inline]
        fn deref(&self) -> &T {
            &self.guard
        }
    }

    impl<T> std::ops::DerefMut for MonitorGuard<'_, T> {
        #[inline]
        fn deref_mut(&mut self) -> &mut T {
            &mut self.guard
        }
    }

    #[cfg(any(test, feature = "test-util"))]
    impl<T> Drop for MonitorGuard<'_, T> {
        fn drop(&mut self) {
            if let Some((since, times)) = self.timing.take() {
                times.record(since.elapsed());
            }
        }
    }

    /// How many times [`MonitorLock::lock`] tries again, spinning, before it blocks.
    const SPIN_ROUNDS: u32 = 10;

    /// The longest [`MonitorLock::make_way`] waits for blocked threads to get the lock.
    const MAKE_WAY_AT_MOST: Duration = Duration::from_micros(200);

    impl<T> MonitorLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self {
                lock: std::sync::Mutex::new(value),
                blocked: AtomicUsize::new(0),
                unblocked: AtomicUsize::new(0),
                #[cfg(any(test, feature = "test-util"))]
                times: None,
            }
        }

        /// Times every hold from now on (a test hook).
        #[cfg(any(test, feature = "test-util"))]
        pub(crate) fn timed(mut self) -> Self {
            self.times = Some(Box::default());
            self
        }

        /// The hold times since the last call, for a lock made [`MonitorLock::timed`].
        #[cfg(any(test, feature = "test-util"))]
        pub(crate) fn take_hold_times(&self) -> Option<crate::monitor::LockHolds> {
            self.times.as_deref().map(HoldTimes::take)
        }

        pub(crate) fn lock(&self) -> MonitorGuard<'_, T> {
            let guard = match self.try_spinning() {
                Some(guard) => guard,
                None => {
                    self.blocked.fetch_add(1, Ordering::AcqRel);
                    let guard = self
                        .lock
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    self.unblocked.fetch_add(1, Ordering::AcqRel);
                    self.blocked.fetch_sub(1, Ordering::AcqRel);
                    guard
                }
            };
            MonitorGuard {
                guard,
                #[cfg(any(test, feature = "test-util"))]
                timing: self
                    .times
                    .as_deref()
                    .map(|times| (std::time::Instant::now(), times)),
            }
        }

        /// The lock if it is free now or within a few microseconds: tried at once, then after
        /// each of [`SPIN_ROUNDS`] spins, each twice the last (2 pauses, then 4, up to 64; 382
        /// in all, about 6 us on this workspace's machine). The monitor's critical sections last
        /// a microsecond or two; a thread that blocked in the kernel instead would pay a context
        /// switch to sleep and one to wake, and the standard mutex's own spin stops as soon as
        /// one thread sleeps on it. Measured on the contended bench (two workers on 8 permits
        /// held across a yield): the monitor lock's sleeps were two thirds of the run's context
        /// switches (`docs/benchmarks/2026-12-03-monitor-second-engine.md`, the eighth step).
        fn try_spinning(&self) -> Option<std::sync::MutexGuard<'_, T>> {
            for round in 0..=SPIN_ROUNDS {
                let pauses = if round == 0 { 0 } else { 1u32 << round.min(6) };
                for _ in 0..pauses {
                    std::hint::spin_loop();
                }
                match self.lock.try_lock() {
                    Ok(guard) => return Some(guard),
                    Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                        return Some(poisoned.into_inner());
                    }
                    Err(std::sync::TryLockError::WouldBlock) => {}
                }
            }
            None
        }

        /// True when some thread is blocked on the lock now (for its holder, a hint to let go).
        pub(crate) fn contended(&self) -> bool {
            self.blocked.load(Ordering::Relaxed) != 0
        }

        /// Called with the lock free, by a thread about to take it back: lets every thread
        /// blocked on it now have it first (waiting at most [`MAKE_WAY_AT_MOST`], yielding the
        /// processor meanwhile).
        pub(crate) fn make_way(&self) {
            let blocked = self.blocked.load(Ordering::Acquire);
            if blocked == 0 {
                return;
            }
            let target = self.unblocked.load(Ordering::Acquire).wrapping_add(blocked);
            let since = std::time::Instant::now();
            while self.unblocked.load(Ordering::Acquire).wrapping_sub(target) > usize::MAX / 2
                && since.elapsed() < MAKE_WAY_AT_MOST
            {
                std::thread::yield_now();
            }
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }
        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }
        pub(crate) fn wait_for<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            timeout: Duration,
        ) -> MutexGuard<'a, T> {
            self.0.wait_for(&mut guard, timeout);
            guard
        }
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }

    pub(crate) mod thread {
        pub(crate) use std::thread::{JoinHandle, Thread, ThreadId, current, park, park_timeout};

        pub(crate) fn spawn<F>(name: &str, f: F) -> std::io::Result<JoinHandle<()>>
        where
            F: FnOnce() + Send + 'static,
        {
            std::thread::Builder::new().name(name.to_owned()).spawn(f)
        }
    }
}

#[cfg(admission_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
    use std::time::Duration;

    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }

    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }
        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// Loom sees one kind of mutex.
    pub(crate) type MonitorLock<T> = Mutex<T>;
    pub(crate) type MonitorGuard<'a, T> = MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// Loom's scheduler already tries every order of the lock's takers.
        pub(crate) fn make_way(&self) {}

        /// The models time nothing.
        pub(crate) fn timed(self) -> Self {
            self
        }

        /// The models time nothing.
        pub(crate) fn take_hold_times(&self) -> Option<crate::monitor::LockHolds> {
            None
        }

        /// Under loom a holder always lets go when it may, so the models see every gap.
        pub(crate) fn contended(&self) -> bool {
            true
        }
    }

    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }
        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).unwrap_or_else(|e| e.into_inner())
        }
        /// Loom has no timed waits; the models never depend on a deadline.
        pub(crate) fn wait_for<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            _timeout: Duration,
        ) -> MutexGuard<'a, T> {
            self.wait(guard)
        }
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }

    pub(crate) mod thread {
        pub(crate) use loom::thread::{JoinHandle, Thread, ThreadId, current, park};

        /// Loom has no timed waits; the models never depend on a deadline.
        pub(crate) fn park_timeout(_timeout: std::time::Duration) {
            park();
        }

        pub(crate) fn spawn<F>(_name: &str, f: F) -> std::io::Result<JoinHandle<()>>
        where
            F: FnOnce() + Send + 'static,
        {
            Ok(loom::thread::spawn(f))
        }
    }
}

pub(crate) use imp::*;

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::MonitorLock;

    /// Real threads and real time: what is tested is who is blocked on the lock.
    #[test]
    fn the_monitor_lock_counts_the_threads_blocked_on_it_and_makes_way_for_them() {
        let lock = Arc::new(MonitorLock::new(Vec::new()));
        assert!(!lock.contended());
        let started = Instant::now();
        lock.make_way();
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "nobody to make way for"
        );

        let mut held = lock.lock();
        let blocked = {
            let lock = lock.clone();
            std::thread::spawn(move || lock.lock().push("blocked"))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lock.contended() {
            assert!(
                Instant::now() < deadline,
                "the thread never blocked on the lock"
            );
            std::thread::yield_now();
        }
        held.push("holder");
        drop(held);
        lock.make_way();
        blocked.join().unwrap();
        assert!(!lock.contended());
        assert_eq!(*lock.lock(), ["holder", "blocked"]);
    }
}
