//! [`Stop`]: the one switch that ends a run early (Ctrl-C, or the run's own deadline), usable
//! from async tasks and blocking threads alike, so that no wait in the example is unbounded.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// A latch: once triggered it stays triggered, and wakes everyone waiting on it.
#[derive(Debug)]
pub struct Stop {
    /// The reason, set once; `None` while running. The condition variable waits on it.
    reason: Mutex<Option<String>>,
    blocking: Condvar,
    tasks: watch::Sender<bool>,
}

impl Default for Stop {
    fn default() -> Self {
        Stop::new()
    }
}

impl Stop {
    /// A switch not yet triggered.
    pub fn new() -> Stop {
        Stop {
            reason: Mutex::new(None),
            blocking: Condvar::new(),
            tasks: watch::Sender::new(false),
        }
    }

    /// Triggers the switch with `reason`; later triggers keep the first reason.
    pub fn trigger(&self, reason: &str) {
        let mut current = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if current.is_none() {
            *current = Some(reason.to_owned());
        }
        drop(current);
        self.blocking.notify_all();
        self.tasks.send_replace(true);
    }

    /// Why the switch was triggered, if it was.
    pub fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// True once triggered.
    pub fn is_triggered(&self) -> bool {
        *self.tasks.borrow()
    }

    /// Resolves once the switch is triggered.
    pub async fn triggered(&self) {
        let mut rx = self.tasks.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|stopped| *stopped).await;
    }

    /// Sleeps `real` time, or less if the switch is triggered. True when it was.
    pub async fn sleep(&self, real: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(real) => self.is_triggered(),
            () = self.triggered() => true,
        }
    }

    /// [`Stop::sleep`] for a blocking thread.
    pub fn sleep_blocking(&self, real: Duration) -> bool {
        let guard = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        let (guard, _) = self
            .blocking
            .wait_timeout_while(guard, real, |reason| reason.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        guard.is_some()
    }
}
