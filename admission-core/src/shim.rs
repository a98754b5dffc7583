//! The primitives every level of the crate synchronizes with: `parking_lot`'s and the standard
//! library's, or loom's under `--cfg admission_loom`, so that the loom models explore the very
//! code that ships (a job's cancellation switch, the monitor lock, the doorbell, the evaluator's
//! thread). Plain re-exports and thin wrappers with no rule of their own: what the monitor builds
//! from them lives in `sync.rs`.

#[cfg(not(admission_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
    use std::time::Duration;

    // `parking_lot`'s locks as they are: no poisoning, `try_lock` answers an `Option`; loom's
    // below are wrapped to the same shape.
    pub(crate) use parking_lot::{Mutex, MutexGuard, RwLock};

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
