//! The give-backs a provider instance spawned (releases of dropped leases, withdrawals of dropped
//! waits), counted so that [`RedisAdmission::settle`](crate::RedisAdmission::settle) can wait for
//! them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The spawned give-backs still running.
#[derive(Default)]
pub(crate) struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

/// Counts one spawned task down when it ends, or when a runtime shutting down drops it.
struct Counted(Arc<Pending>);

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Pending {
    /// Runs `task` on `runtime`, counted until it ends.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.count.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(self.clone());
        runtime.spawn(async move {
            let _counted = counted;
            task.await;
        });
    }

    /// Returns once no counted task runs.
    pub(crate) async fn settled(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}
