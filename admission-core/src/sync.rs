//! The synchronization the monitor builds: its lock and the one word read without it.
//!
//! The state machine and the shell never name `parking_lot`, `std::sync` or `std::thread`
//! directly: they go through the primitives of `shim.rs` (re-exported here), which are loom's
//! under `--cfg admission_loom`, so the loom models in `monitor/loom_models.rs` explore the very
//! code that ships, every lock, atomic and thread of it. Accounts keep their own leaf locks
//! (they never wait while holding one), which loom does not need to see.
//!
//! # The monitor lock
//!
//! [`MonitorLock`] is `parking_lot`'s mutex, or the standard library's with `--cfg
//! admission_monitor_lock="std"`: `cargo xtask lock-bench` builds the contended bench both ways
//! and runs them interleaved, printing wall time, CPU time and context switches. Neither spins in
//! our code: a thread that finds the lock taken blocks in the lock's own way. The lock counts the
//! threads blocked on it ([`MonitorLock::contended`]) so that a long pass can tell whether
//! pausing between its batches helps anyone, and a pause lets go fairly
//! ([`MonitorGuard::unlocked_fair`]): `parking_lot` hands the lock to a blocked thread directly;
//! the standard mutex has no such hand-over, so there a pause is a plain unlock and lock.
//!
//! # The published count of parked waiters
//!
//! [`Published`] is the one word of the state machine that other threads read without the lock:
//! how many waiters are parked. A job that finds it zero may take its whole demand without the
//! lock (an empty line has no head to respect), and a giver that finds it zero need not wake
//! anyone. Why that loses no wake-up: a parker publishes its count (under the monitor lock) before
//! any account is asked for it, and a giver credits its account and only then reads the count. If
//! the ask came before the credit, the account's own lock orders the publication before the
//! giver's read, so the giver sees the waiter and runs or rings for a pass; otherwise the ask saw
//! the credit. For accounts built on atomics rather than a lock (whose "not now" may be a plain
//! load) the two sequentially consistent fences make it Dekker's pattern: the parker fences after
//! publishing ([`Published::publish`]), the giver before reading
//! ([`Published::someone_waiting`]). The loom models
//! `loom_fast_path_racing_a_give_never_loses_the_wake_up` and
//! `loom_a_release_racing_a_park_on_an_atomic_account_never_loses_the_wake_up` check it.

#[cfg(any(test, feature = "test-util"))]
mod holds;

#[cfg(all(any(test, feature = "test-util"), not(admission_loom)))]
pub(crate) use holds::HoldTimes;
#[cfg(any(test, feature = "test-util"))]
pub use holds::LockHolds;

/// The count of parked waiters, written under the monitor lock and read without it (see the
/// module's documentation).
#[derive(Debug, Default)]
pub(crate) struct Published(AtomicUsize);

impl Published {
    /// Publishes that `parked` waiters are parked: a store, then a fence (the parker's half of
    /// Dekker's pattern: an account may answer the parker's ask with a plain atomic load, and a
    /// sequentially consistent store followed by a weaker load of another word does not order
    /// the two). Under the monitor lock, the only place the count is written.
    pub(crate) fn publish(&self, parked: usize) {
        self.0.store(parked, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// The count as last published, for its writer (under the monitor lock: exact).
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// True when nobody is parked, as the lock-free fast path looks before it takes.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.load(Ordering::SeqCst) == 0
    }

    /// True if a waiter is parked, read after the caller's give (the giver's half: a fence, then
    /// the load).
    pub(crate) fn someone_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        self.0.load(Ordering::SeqCst) > 0
    }
}

#[cfg(not(admission_loom))]
mod imp {
    #[cfg(any(test, feature = "test-util"))]
    use super::HoldTimes;
    use crate::shim::*;

    #[cfg(not(admission_monitor_lock = "std"))]
    type Inner<T> = parking_lot::Mutex<T>;
    #[cfg(not(admission_monitor_lock = "std"))]
    type InnerGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
    #[cfg(admission_monitor_lock = "std")]
    type Inner<T> = std::sync::Mutex<T>;
    #[cfg(admission_monitor_lock = "std")]
    type InnerGuard<'a, T> = std::sync::MutexGuard<'a, T>;

    /// The monitor's lock, without poisoning (see the module's documentation for which mutex).
    #[derive(Debug, Default)]
    pub(crate) struct MonitorLock<T> {
        lock: Inner<T>,
        /// Threads blocked in `lock` now: counted only when a first try fails, so an
        /// uncontended lock pays nothing for it.
        blocked: AtomicUsize,
        /// Every hold's length, when asked for (a test hook).
        #[cfg(any(test, feature = "test-util"))]
        times: Option<Box<HoldTimes>>,
    }

    /// What [`MonitorLock::lock`] returns. The guard is always there but while
    /// [`MonitorGuard::unlocked_fair`] runs its function.
    pub(crate) struct MonitorGuard<'a, T> {
        guard: Option<InnerGuard<'a, T>>,
        lock: &'a MonitorLock<T>,
        #[cfg(any(test, feature = "test-util"))]
        since: Option<std::time::Instant>,
    }

    impl<T> std::ops::Deref for MonitorGuard<'_, T> {
        type Target = T;

        #[inline]
        fn deref(&self) -> &T {
            self.guard.as_deref().expect("held")
        }
    }

    impl<T> std::ops::DerefMut for MonitorGuard<'_, T> {
        #[inline]
        fn deref_mut(&mut self) -> &mut T {
            self.guard.as_deref_mut().expect("held")
        }
    }

    impl<T> Drop for MonitorGuard<'_, T> {
        fn drop(&mut self) {
            self.record_hold();
        }
    }

    impl<'a, T> MonitorGuard<'a, T> {
        /// Lets go of the lock while `f` runs, fairly where the lock can (a thread blocked on it
        /// gets it first), and takes it again.
        pub(crate) fn unlocked_fair<R>(&mut self, f: impl FnOnce() -> R) -> R {
            self.record_hold();
            let guard = self.guard.take().expect("held");
            #[cfg(not(admission_monitor_lock = "std"))]
            parking_lot::MutexGuard::unlock_fair(guard);
            #[cfg(admission_monitor_lock = "std")]
            drop(guard);
            let result = f();
            let again = self.lock.lock();
            *self = again;
            result
        }

        #[cfg(any(test, feature = "test-util"))]
        fn record_hold(&mut self) {
            if let (Some(since), Some(times)) = (self.since.take(), self.lock.times.as_deref()) {
                times.record(since.elapsed());
            }
        }

        #[cfg(not(any(test, feature = "test-util")))]
        #[inline]
        fn record_hold(&mut self) {}
    }

    impl<T> MonitorLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self {
                lock: Inner::new(value),
                blocked: AtomicUsize::new(0),
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
        pub(crate) fn take_hold_times(&self) -> Option<super::LockHolds> {
            self.times.as_deref().map(HoldTimes::take)
        }

        pub(crate) fn lock(&self) -> MonitorGuard<'_, T> {
            let guard = match self.try_inner() {
                Some(guard) => guard,
                None => {
                    self.blocked.fetch_add(1, Ordering::Relaxed);
                    let guard = self.inner_lock();
                    self.blocked.fetch_sub(1, Ordering::Relaxed);
                    guard
                }
            };
            MonitorGuard {
                guard: Some(guard),
                lock: self,
                #[cfg(any(test, feature = "test-util"))]
                since: self.times.as_ref().map(|_| std::time::Instant::now()),
            }
        }

        #[cfg(not(admission_monitor_lock = "std"))]
        #[inline]
        fn try_inner(&self) -> Option<InnerGuard<'_, T>> {
            self.lock.try_lock()
        }

        #[cfg(not(admission_monitor_lock = "std"))]
        fn inner_lock(&self) -> InnerGuard<'_, T> {
            self.lock.lock()
        }

        #[cfg(admission_monitor_lock = "std")]
        #[inline]
        fn try_inner(&self) -> Option<InnerGuard<'_, T>> {
            match self.lock.try_lock() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }

        #[cfg(admission_monitor_lock = "std")]
        fn inner_lock(&self) -> InnerGuard<'_, T> {
            self.lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// True when some thread is blocked on the lock now (for its holder, a hint to let go).
        pub(crate) fn contended(&self) -> bool {
            self.blocked.load(Ordering::Relaxed) != 0
        }
    }
}

#[cfg(admission_loom)]
mod imp {
    use crate::shim::*;

    /// Loom sees one kind of mutex.
    #[derive(Debug)]
    pub(crate) struct MonitorLock<T>(Mutex<T>);

    pub(crate) struct MonitorGuard<'a, T> {
        guard: Option<MutexGuard<'a, T>>,
        lock: &'a MonitorLock<T>,
    }

    impl<T> std::ops::Deref for MonitorGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            self.guard.as_deref().expect("held")
        }
    }

    impl<T> std::ops::DerefMut for MonitorGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.guard.as_deref_mut().expect("held")
        }
    }

    impl<T> MonitorGuard<'_, T> {
        /// Loom's scheduler tries every order of the lock's takers: a plain unlock and lock.
        pub(crate) fn unlocked_fair<R>(&mut self, f: impl FnOnce() -> R) -> R {
            drop(self.guard.take());
            let result = f();
            self.guard = Some(self.lock.0.lock());
            result
        }
    }

    impl<T> MonitorLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MonitorGuard<'_, T> {
            MonitorGuard {
                guard: Some(self.0.lock()),
                lock: self,
            }
        }

        /// The models time nothing.
        pub(crate) fn timed(self) -> Self {
            self
        }

        /// The models time nothing.
        pub(crate) fn take_hold_times(&self) -> Option<super::LockHolds> {
            None
        }

        /// Under loom a holder always lets go when it may, so the models see every gap.
        pub(crate) fn contended(&self) -> bool {
            true
        }
    }
}

pub(crate) use crate::shim::*;
pub(crate) use imp::*;

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::MonitorLock;

    /// Real threads: what is tested is who is blocked on the lock, and that a pause lets go of
    /// it (the blocked thread finishes while the holder's function runs).
    #[test]
    fn the_monitor_lock_counts_the_threads_blocked_on_it_and_a_pause_lets_them_in() {
        let lock = Arc::new(MonitorLock::new(Vec::new()));
        assert!(!lock.contended());
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
        held.unlocked_fair(|| blocked.join().unwrap());
        held.push("holder again");
        drop(held);
        assert!(!lock.contended());
        assert_eq!(*lock.lock(), ["holder", "blocked", "holder again"]);
    }
}
