//! [`JobContext`]: who is asking, and the switch that withdraws them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};

use serde::Serialize;
use smallvec::SmallVec;

use crate::shim::{AtomicBool, Mutex, Ordering};

static NEXT_JOB_ID: AtomicU64 = AtomicU64::new(1);

/// What every event says about the job: its identity, copied cheaply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobSnapshot {
    /// A process-unique id.
    pub id: u64,
    /// A human name ("summarize chapter 3").
    pub name: Arc<str>,
    /// The workflow the job belongs to, if any.
    pub workflow: Option<Arc<str>>,
    /// The tenant the job runs for, if any.
    pub tenant: Option<Arc<str>>,
    /// The priority level the job asks to be served at, if any (a monitor's default level
    /// otherwise: see [`Levels`](crate::Levels)). Left out of the serialized form when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<Arc<str>>,
}

/// What cancelling a job runs, once.
pub(crate) enum Listener {
    /// A callback (the [`Cancelled`] future's waker slot).
    Call(Box<dyn FnOnce() + Send>),
    /// A waiter to take out of a line: the line held weakly, the waiter named by the two words
    /// the line chose. Registered without allocating, so that parking allocates nothing for it.
    Leave(Weak<dyn LeaveOnCancel>, WaiterKey),
}

impl Listener {
    fn run(self) {
        match self {
            Listener::Call(call) => call(),
            Listener::Leave(line, waiter) => {
                if let Some(line) = line.upgrade() {
                    line.leave_on_cancel(waiter);
                }
            }
        }
    }
}

/// A line a job's waiters stand in (a monitor's), told when the job is cancelled.
pub(crate) trait LeaveOnCancel: Send + Sync {
    /// The job of the waiter the line named `waiter` was cancelled: take it out of the line (if
    /// it is still there).
    fn leave_on_cancel(&self, waiter: WaiterKey);
}

/// How a [`LeaveOnCancel`] line names one of its waiters: two words of its own choosing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaiterKey(pub(crate) u64, pub(crate) u64);

struct Inner {
    snapshot: JobSnapshot,
    /// The job's switch, in the same allocation (every admission reads it, so it costs no
    /// second pointer to follow)...
    own: Switch,
    /// ...unless this context is a labelled copy (`with_workflow`, `with_tenant`): then the
    /// switch is the job's first context's, so a clone taken before the job was labelled
    /// cancels the labelled one too.
    labelled_from: Option<Arc<Inner>>,
}

impl Inner {
    fn switch(&self) -> &Switch {
        match &self.labelled_from {
            Some(first) => &first.own,
            None => &self.own,
        }
    }
}

/// A job's cancellation switch.
struct Switch {
    cancelled: AtomicBool,
    /// Callbacks run once by `cancel()`; each admission in progress registers one.
    listeners: Mutex<Listeners>,
}

impl Switch {
    fn new() -> Switch {
        Switch {
            cancelled: AtomicBool::new(false),
            listeners: Mutex::new(Listeners::default()),
        }
    }
}

#[derive(Default)]
struct Listeners {
    next_key: u64,
    /// Room for one listener in place: most jobs wait in one line at a time, so registering
    /// their waiter's listener allocates nothing (the room was made with the context).
    entries: SmallVec<[(u64, Listener); 1]>,
}

/// A job's identity and cancellation switch, shared by clones.
///
/// Cancelling withdraws every admission the job is waiting in, at once, with
/// [`AdmitError::Cancelled`](crate::AdmitError::Cancelled); later admissions with the same context
/// are refused the same way. A cancelled head stops reserving for itself.
///
/// # Examples
///
/// ```
/// use admission_core::JobContext;
///
/// let ctx = JobContext::new("summarize").with_workflow("nightly").with_tenant("acme");
/// assert_eq!(&*ctx.snapshot().name, "summarize");
/// assert!(!ctx.is_cancelled());
/// ctx.clone().cancel();
/// assert!(ctx.is_cancelled());
/// ```
#[derive(Clone)]
pub struct JobContext {
    inner: Arc<Inner>,
}

impl JobContext {
    /// A context with a fresh id and the given name.
    pub fn new(name: impl Into<Arc<str>>) -> JobContext {
        JobContext::from_snapshot(JobSnapshot {
            id: NEXT_JOB_ID.fetch_add(1, StdOrdering::Relaxed),
            name: name.into(),
            workflow: None,
            tenant: None,
            level: None,
        })
    }

    fn from_snapshot(snapshot: JobSnapshot) -> JobContext {
        JobContext {
            inner: Arc::new(Inner {
                snapshot,
                own: Switch::new(),
                labelled_from: None,
            }),
        }
    }

    /// The same job, labelled: a new snapshot on the same cancellation switch.
    fn relabel(self, label: impl FnOnce(&mut JobSnapshot)) -> JobContext {
        let mut snapshot = self.inner.snapshot.clone();
        label(&mut snapshot);
        JobContext {
            inner: Arc::new(Inner {
                snapshot,
                // Unused: the first context's switch is this one's.
                own: Switch::new(),
                labelled_from: Some(match &self.inner.labelled_from {
                    Some(first) => first.clone(),
                    None => self.inner.clone(),
                }),
            }),
        }
    }

    /// The same job in a workflow. It keeps the job's cancellation switch: cancelling any
    /// clone, taken before or after, cancels them all.
    pub fn with_workflow(self, workflow: impl Into<Arc<str>>) -> JobContext {
        self.relabel(|s| s.workflow = Some(workflow.into()))
    }

    /// The same job for a tenant, on the job's cancellation switch (as
    /// [`with_workflow`](JobContext::with_workflow)).
    pub fn with_tenant(self, tenant: impl Into<Arc<str>>) -> JobContext {
        self.relabel(|s| s.tenant = Some(tenant.into()))
    }

    /// The same job at priority level `level` (one of the monitor's [`Levels`](crate::Levels)),
    /// on the job's cancellation switch (as [`with_workflow`](JobContext::with_workflow)).
    pub fn with_level(self, level: impl Into<Arc<str>>) -> JobContext {
        self.relabel(|s| s.level = Some(level.into()))
    }

    /// The job's identity.
    pub fn snapshot(&self) -> &JobSnapshot {
        &self.inner.snapshot
    }

    /// The job's id.
    pub fn id(&self) -> u64 {
        self.inner.snapshot.id
    }

    /// True once [`cancel`](JobContext::cancel) has been called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.switch().cancelled.load(Ordering::Acquire)
    }

    /// Cancels the job: every admission it waits in leaves at once. Idempotent.
    pub fn cancel(&self) {
        self.inner.switch().cancelled.store(true, Ordering::Release);
        let listeners = std::mem::take(&mut self.inner.switch().listeners.lock().entries);
        for (_, listener) in listeners {
            listener.run();
        }
    }

    /// A future that completes once the job is cancelled (at once if it already is), for work
    /// outside a monitor that the job's cancellation should end too (a fleet lease's wait, a
    /// call in flight): `select!` on it. It is woken through its `Waker`, so it runs under any
    /// executor.
    ///
    /// # Cancel safety
    ///
    /// Dropping it forgets its listener; nothing else changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::JobContext;
    ///
    /// # futures::executor::block_on(async {
    /// let job = JobContext::new("upload");
    /// let cancelled = job.cancelled();
    /// job.clone().cancel();
    /// cancelled.await; // completes: the job was cancelled
    /// # });
    /// ```
    pub fn cancelled(&self) -> Cancelled {
        Cancelled {
            ctx: self.clone(),
            listener: None,
        }
    }

    /// Registers `listener` to run on cancellation. `None` if already cancelled (nothing kept).
    pub(crate) fn on_cancel(&self, listener: Listener) -> Option<u64> {
        let mut listeners = self.inner.switch().listeners.lock();
        if self.is_cancelled() {
            return None;
        }
        let key = listeners.next_key;
        listeners.next_key += 1;
        listeners.entries.push((key, listener));
        Some(key)
    }

    /// Forgets a listener that is no longer needed.
    /// The listener is dropped after the context's lock is released.
    pub(crate) fn forget(&self, key: u64) {
        let forgotten = {
            let mut listeners = self.inner.switch().listeners.lock();
            let at = listeners.entries.iter().position(|(k, _)| *k == key);
            at.map(|at| listeners.entries.remove(at))
        };
        drop(forgotten);
    }
}

/// The future of [`JobContext::cancelled`].
#[must_use = "futures do nothing unless polled"]
pub struct Cancelled {
    ctx: JobContext,
    /// The listener registered on the context, and the waker it wakes.
    listener: Option<(u64, Arc<Mutex<Option<Waker>>>)>,
}

impl Future for Cancelled {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.ctx.is_cancelled() {
            return Poll::Ready(());
        }
        let waker = cx.waker().clone();
        match &self.listener {
            Some((_, slot)) => {
                let replaced = slot.lock().replace(waker);
                drop(replaced);
            }
            None => {
                let slot = Arc::new(Mutex::new(Some(waker)));
                let wakes = slot.clone();
                let listener = self.ctx.on_cancel(Listener::Call(Box::new(move || {
                    let waker = wakes.lock().take();
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                })));
                match listener {
                    // Cancelled since the look above.
                    None => return Poll::Ready(()),
                    Some(key) => self.listener = Some((key, slot)),
                }
            }
        }
        // A cancellation between the look and the registration took the listeners before ours
        // was there: look again.
        if self.ctx.is_cancelled() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Cancelled {
    fn drop(&mut self) {
        if let Some((key, _)) = self.listener.take() {
            self.ctx.forget(key);
        }
    }
}

impl fmt::Debug for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancelled")
            .field("job", &self.ctx.id())
            .field("cancelled", &self.ctx.is_cancelled())
            .finish()
    }
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("snapshot", &self.inner.snapshot)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
