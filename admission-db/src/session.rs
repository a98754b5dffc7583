//! [`JobDb`]: one job's handles, opened under its grant and closed before the grant settles.

use std::any::Any;
use std::sync::Arc;

use admission_core::{Amount, Demand, Grant};
use parking_lot::Mutex;

use crate::{Aborter, DbError, DbErrors, DbHandle, DbResourceProvider};

/// Which handles a job will hold: one per entry, in declaration order.
///
/// [`demand`](DbPlan::demand) adds one permit per entry to the job's whole demand;
/// [`open`](DbPlan::open) materializes the handles under the grant.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use admission_core::{Demand, JobContext, Monitor};
/// use admission_db::{CountingDbResourceProvider, DbPlan, DbResourceProvider};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let monitor = Monitor::new();
/// let orders = Arc::new(CountingDbResourceProvider::new("orders", 4, monitor.clock().clone())?);
/// let audit = Arc::new(CountingDbResourceProvider::new("audit", 1, monitor.clock().clone())?);
///
/// // One handle on each, the audit one read-only; their permits join the job's whole demand.
/// let plan = DbPlan::new().with(orders.clone(), false).with(audit.clone(), true);
/// let demand = plan.demand(Demand::new());
/// let ctx = JobContext::new("settle invoices");
/// let grant = monitor.admit_blocking(demand, &ctx, Some(Duration::from_secs(30)))?;
/// let job = plan.open(grant)?;
/// let on_timeout = job.force_closer(); // for a watchdog thread
/// job.begin_all()?;
/// // ... the job's statements ...
/// job.commit_all()?;                     // orders first, then audit
/// job.close()?;                          // connections back, then the permits
/// on_timeout.force_close()?;             // too late: a no-op
/// assert_eq!((orders.admission().in_use(), audit.admission().in_use()), (0, 0));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct DbPlan {
    uses: Vec<(Arc<dyn DbResourceProvider>, bool)>,
}

impl DbPlan {
    /// No handles yet.
    pub fn new() -> DbPlan {
        DbPlan::default()
    }

    /// One more handle of `provider`, read-only if asked.
    pub fn with(mut self, provider: Arc<dyn DbResourceProvider>, read_only: bool) -> DbPlan {
        self.uses.push((provider, read_only));
        self
    }

    /// `demand` plus one permit on each entry's gate.
    pub fn demand(&self, mut demand: Demand) -> Demand {
        for (provider, _) in &self.uses {
            demand.add(provider.admission().clone(), Amount::ONE);
        }
        demand
    }

    /// The permits `grant` holds on `provider`'s gate.
    fn held(grant: &Grant, provider: &dyn DbResourceProvider) -> u64 {
        let gate = Arc::as_ptr(provider.admission()) as *const ();
        grant
            .entries()
            .iter()
            .filter(|e| Arc::as_ptr(e.account()) as *const () == gate)
            .map(|e| e.amount().primary())
            .sum()
    }

    /// Acquires every handle, in declaration order, under `grant`.
    ///
    /// # Errors
    ///
    /// When the grant lacks a permit for a handle, when an acquire fails, or when a provider
    /// hands out another provider's handle: the handles taken so far are closed in reverse, the
    /// grant is rolled back, and the errors come back (the cause first). The job must not run.
    pub fn open(&self, mut grant: Grant) -> Result<JobDb, DbErrors> {
        let mut errors = Vec::new();
        for (i, (provider, _)) in self.uses.iter().enumerate() {
            let first = self.uses[..i].iter().all(|(p, _)| p.id() != provider.id());
            if !first {
                continue;
            }
            let wanted = self
                .uses
                .iter()
                .filter(|(p, _)| p.id() == provider.id())
                .count() as u64;
            let held = DbPlan::held(&grant, provider.as_ref());
            if held < wanted {
                errors.push(DbError::NoPermit {
                    provider: provider.name().to_owned(),
                    gate: provider.admission().name().to_owned(),
                    held,
                    wanted,
                });
            }
        }
        let mut slots = Vec::with_capacity(self.uses.len());
        if errors.is_empty() {
            for (provider, read_only) in &self.uses {
                match provider.acquire(*read_only) {
                    Ok(handle) if handle.provider() == provider.id() => slots.push(Slot {
                        handle,
                        committed: false,
                    }),
                    Ok(mut handle) => {
                        errors.push(DbError::ForeignHandle {
                            provider: provider.name().to_owned(),
                            owner: handle.provider().name().to_owned(),
                        });
                        let _ = handle.close();
                        break;
                    }
                    Err(e) => {
                        errors.push(e);
                        break;
                    }
                }
            }
        }
        if !errors.is_empty() {
            close_reverse(&mut slots, &mut errors);
            drop(slots);
            grant.rollback();
            return Err(DbErrors::from_vec(errors).expect("not empty"));
        }
        let aborters = slots.iter().map(|s| s.handle.aborter()).collect();
        Ok(JobDb {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    slots,
                    grant: Some(grant),
                }),
                aborters,
            }),
        })
    }
}

/// One handle of the job, and whether `commit_all` committed it.
struct Slot {
    handle: Box<dyn DbHandle>,
    committed: bool,
}

/// What a job and its force-closers share.
struct Shared {
    /// The handles and the grant; the grant is `None` once settled, after every handle closed.
    inner: Mutex<Inner>,
    /// Each handle's aborter, reachable without the lock (a running statement holds it).
    aborters: Vec<Aborter>,
}

struct Inner {
    slots: Vec<Slot>,
    grant: Option<Grant>,
}

/// Closes `slots` in reverse, collecting failures.
fn close_reverse(slots: &mut [Slot], errors: &mut Vec<DbError>) {
    for slot in slots.iter_mut().rev() {
        if let Err(e) = slot.handle.close() {
            errors.push(e);
        }
    }
}

impl Inner {
    /// Closes every handle in reverse, then settles the grant: connections go back before
    /// permits. A second call finds everything closed and the grant settled.
    fn close(&mut self) -> Result<(), DbErrors> {
        let mut errors = Vec::new();
        close_reverse(&mut self.slots, &mut errors);
        if let Some(mut grant) = self.grant.take() {
            grant.release();
        }
        DbErrors::result(errors)
    }
}

/// A job's handles, in declaration order, and the grant they were opened under.
///
/// Closing (or dropping) it closes every handle in reverse and only then releases the grant, so
/// connections are back in their pools before the permits are back on the gates.
///
/// # Cancel safety
///
/// A [`ForceClose`] taken from it aborts every handle without waiting, then closes and releases
/// as [`close`](JobDb::close) does; it and a close racing it settle the grant once.
///
/// # Panics
///
/// Never by itself; a provider's panic inside a verb propagates.
pub struct JobDb {
    shared: Arc<Shared>,
}

impl JobDb {
    /// How many handles the job holds.
    pub fn len(&self) -> usize {
        self.shared.aborters.len()
    }

    /// True when the job holds no handle.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on handle `index` (declaration order) as the type its provider makes, holding
    /// the job's lock meanwhile (a [`ForceClose`] aborts without it, then waits for `f`).
    ///
    /// # Errors
    ///
    /// [`DbError::WrongHandle`] for an index out of range or another type; `f` is not run.
    pub fn with_handle<H: DbHandle, R>(
        &self,
        index: usize,
        f: impl FnOnce(&mut H) -> R,
    ) -> Result<R, DbError> {
        let mut inner = self.shared.inner.lock();
        let Some(slot) = inner.slots.get_mut(index) else {
            return Err(DbError::WrongHandle {
                provider: String::new(),
                index,
                asked: std::any::type_name::<H>(),
            });
        };
        let provider = slot.handle.provider().name().to_owned();
        let handle: &mut dyn Any = slot.handle.as_mut();
        match handle.downcast_mut::<H>() {
            Some(handle) => Ok(f(handle)),
            None => Err(DbError::WrongHandle {
                provider,
                index,
                asked: std::any::type_name::<H>(),
            }),
        }
    }

    /// Runs `f` on handle `index`, whatever its type, holding the job's lock meanwhile.
    ///
    /// # Panics
    ///
    /// When `index` is out of range.
    pub fn with<R>(&self, index: usize, f: impl FnOnce(&mut dyn DbHandle) -> R) -> R {
        let mut inner = self.shared.inner.lock();
        f(inner.slots[index].handle.as_mut())
    }

    /// Begins a transaction on every handle, in declaration order.
    ///
    /// # Errors
    ///
    /// Every handle's failure; on one, those already begun are rolled back in reverse.
    pub fn begin_all(&self) -> Result<(), DbErrors> {
        let mut inner = self.shared.inner.lock();
        let mut errors = Vec::new();
        for i in 0..inner.slots.len() {
            inner.slots[i].committed = false;
            if let Err(e) = inner.slots[i].handle.begin() {
                errors.push(e);
                for slot in inner.slots[..i].iter_mut().rev() {
                    if let Err(e) = slot.handle.rollback() {
                        errors.push(e);
                    }
                }
                break;
            }
        }
        DbErrors::result(errors)
    }

    /// Commits every handle's open transaction in declaration order (a handle outside one is
    /// passed over). On a failure, the failed handle and every later one are rolled back in
    /// reverse; those committed before stay committed.
    ///
    /// # Errors
    ///
    /// The commit's failure, then any rollback's.
    pub fn commit_all(&self) -> Result<(), DbErrors> {
        let mut inner = self.shared.inner.lock();
        let mut errors = Vec::new();
        for i in 0..inner.slots.len() {
            let slot = &mut inner.slots[i];
            if !slot.handle.in_transaction() {
                continue;
            }
            match slot.handle.commit() {
                Ok(()) => slot.committed = true,
                Err(e) => {
                    errors.push(e);
                    for rest in inner.slots[i..].iter_mut().rev() {
                        if let Err(e) = rest.handle.rollback() {
                            errors.push(e);
                        }
                    }
                    break;
                }
            }
        }
        DbErrors::result(errors)
    }

    /// Rolls back every handle in reverse, passing over those `commit_all` committed.
    ///
    /// # Errors
    ///
    /// Every rollback's failure; each handle is still tried.
    pub fn rollback_all(&self) -> Result<(), DbErrors> {
        let mut inner = self.shared.inner.lock();
        let mut errors = Vec::new();
        for slot in inner.slots.iter_mut().rev() {
            if slot.committed && !slot.handle.in_transaction() {
                continue;
            }
            if let Err(e) = slot.handle.rollback() {
                errors.push(e);
            }
        }
        DbErrors::result(errors)
    }

    /// A closer another thread may use on a timeout.
    pub fn force_closer(&self) -> ForceClose {
        ForceClose {
            shared: self.shared.clone(),
        }
    }

    /// Closes every handle in reverse (rolling back what is open), then releases the grant.
    ///
    /// # Errors
    ///
    /// Every close's failure; the grant is released all the same.
    pub fn close(self) -> Result<(), DbErrors> {
        self.shared.inner.lock().close()
    }
}

impl Drop for JobDb {
    fn drop(&mut self) {
        if let Err(errors) = self.shared.inner.lock().close() {
            tracing::warn!(%errors, "closing a dropped job's database handles failed");
        }
    }
}

impl std::fmt::Debug for JobDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobDb")
            .field("handles", &self.len())
            .finish()
    }
}

/// Aborts, closes and releases a job's handles from another thread ([`JobDb::force_closer`]).
#[derive(Clone)]
pub struct ForceClose {
    shared: Arc<Shared>,
}

impl ForceClose {
    /// Aborts every handle (without waiting for the job), then closes them in reverse and
    /// releases the grant once the job's current verb returns. Racing a close, or called twice,
    /// the grant settles once.
    ///
    /// # Errors
    ///
    /// Every close's failure.
    pub fn force_close(&self) -> Result<(), DbErrors> {
        for aborter in &self.shared.aborters {
            aborter.abort();
        }
        self.shared.inner.lock().close()
    }
}

impl std::fmt::Debug for ForceClose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForceClose")
    }
}
