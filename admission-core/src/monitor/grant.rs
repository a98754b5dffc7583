//! [`Grant`]: the RAII value a job holds while it uses what admission gave it.
//!
//! It lives beside the monitor as tokio's permit lives beside its semaphore, and knows the monitor
//! only as the [`Owner`] it gives back to: the engine files make grants, the grant never reaches
//! into them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::context::JobContext;
use crate::demand::{Demand, Entry};
use crate::machine::Waits;

/// What a grant gives back to: the monitor that made it.
pub(crate) trait Owner: Send + Sync + 'static {
    /// Gives back `entries` (everything for a rollback, else what replenishes on release) and
    /// lets the line know. Called once per grant.
    fn settle(&self, entries: &[Entry], ctx: &JobContext, rolled_back: bool);

    /// The gate's name, as a grant reports a wait on it.
    fn gate_name(&self) -> &str;

    /// This owner as a shared handle, for a borrowed grant turned into an owned one.
    fn to_shared(&self) -> Arc<dyn Owner>;
}

/// Everything one job was granted, returned when the grant is released, rolled back or dropped.
///
/// A grant is settled once: the first of [`release`](Grant::release),
/// [`rollback`](Grant::rollback) or the drop does the work and the rest do nothing. Like tokio's
/// `SemaphorePermit`, dropping a grant is releasing it.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_accounts::CountingGate;
/// use admission_core::{Amount, Demand, JobContext, Monitor};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let monitor = Monitor::new();
/// let http = Arc::new(CountingGate::http(2, monitor.clock().clone())?);
/// let demand = Demand::new().with(http.clone(), Amount::ONE);
/// let mut grant = monitor.admit_blocking(demand, &JobContext::new("job"), None)?;
/// assert_eq!(http.available(), 1);
/// grant.release();
/// grant.release(); // settled once: a no-op
/// assert_eq!(http.available(), 2);
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a grant releases it at once"]
pub struct Grant {
    /// The demand granted, moved in whole.
    demand: Demand,
    owner: Arc<dyn Owner>,
    ctx: JobContext,
    /// When the job asked and was granted, and which accounts held it meanwhile; read only when
    /// asked for, outside the monitor lock.
    waits: Waits,
    settled: bool,
}

/// Gives `entries` back through `owner` unless `settled` says it was done: what either kind of
/// grant does on its first release, rollback or drop.
fn settle_once(
    settled: &mut bool,
    owner: &dyn Owner,
    entries: &[Entry],
    ctx: &JobContext,
    everything: bool,
) {
    if !std::mem::replace(settled, true) {
        owner.settle(entries, ctx, everything);
    }
}

impl Grant {
    pub(crate) fn new(
        demand: Demand,
        owner: Arc<dyn Owner>,
        ctx: JobContext,
        waits: Waits,
    ) -> Grant {
        Grant {
            demand,
            owner,
            ctx,
            waits,
            settled: false,
        }
    }

    /// A grant made at once (on arrival), owned by `owner`: no wait, no holds.
    pub(crate) fn immediate(
        owner: &Arc<impl Owner + 'static>,
        demand: Demand,
        ctx: &JobContext,
    ) -> Grant {
        Grant::new(demand, owner.clone(), ctx.clone(), Waits::none())
    }

    /// Returns what the job held: the amounts on [`Replenishment::Release`](crate::Replenishment::Release) accounts. Metered
    /// ([`Replenishment::Time`](crate::Replenishment::Time)) debits stay spent: the call they paid for happened.
    pub fn release(&mut self) {
        self.settle(false);
    }

    /// Returns everything, metered debits included: the work the grant paid for did not happen.
    pub fn rollback(&mut self) {
        self.settle(true);
    }

    fn settle(&mut self, everything: bool) {
        let entries = self.demand.entries();
        settle_once(
            &mut self.settled,
            &*self.owner,
            entries,
            &self.ctx,
            everything,
        );
    }

    /// True once released or rolled back.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// From asking to granted, on the monitor's clock; zero for an immediate grant.
    pub fn wall_wait(&self) -> Duration {
        self.waits.wall_wait()
    }

    /// How long each account (or the gate) that held the job kept it, keyed by name.
    ///
    /// Empty for an immediate grant. The accounts overlap in time, so the values do not add up
    /// to [`wall_wait`](Grant::wall_wait).
    pub fn wait_times(&self) -> BTreeMap<String, Duration> {
        let Waits {
            holds, granted_at, ..
        } = &self.waits;
        holds
            .iter()
            .map(|hold| {
                let name = match hold.entry() {
                    Some(i) => self.demand.entries()[i].account().name(),
                    None => self.owner.gate_name(),
                };
                let until = hold.until().unwrap_or(*granted_at);
                (
                    name.to_owned(),
                    until.saturating_duration_since(hold.since()),
                )
            })
            .collect()
    }

    /// What was granted, in the demand's order.
    pub fn entries(&self) -> &[Entry] {
        self.demand.entries()
    }

    /// True for an orchestrator's grant (nothing on any account).
    pub fn is_empty(&self) -> bool {
        self.demand.is_empty()
    }

    /// The job the grant belongs to.
    pub fn context(&self) -> &JobContext {
        &self.ctx
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.settle(false);
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("job", &self.ctx.id())
            .field("entries", &self.entries())
            .field("wall_wait", &self.wall_wait())
            .field("settled", &self.settled)
            .finish()
    }
}

/// A grant that borrows its monitor, its demand and its job: what
/// [`Monitor::try_admit`](crate::Monitor::try_admit) returns, as tokio's `try_acquire` returns a
/// `SemaphorePermit` that borrows its semaphore.
///
/// It behaves as a [`Grant`] (settled once, by [`release`](BorrowedGrant::release),
/// [`rollback`](BorrowedGrant::rollback) or the drop), but making and settling it copies
/// nothing and counts no reference: no allocation, no atomic operation besides the accounts' own.
/// [`into_owned`](BorrowedGrant::into_owned) turns it into a [`Grant`] for a grant that must
/// outlive the borrow (moved into a spawned task).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_accounts::CountingGate;
/// use admission_core::{Amount, Demand, JobContext, Monitor};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let monitor = Monitor::new();
/// let db = Arc::new(CountingGate::on_system_clock("db", 1)?);
/// let demand = Demand::new().with(db.clone(), Amount::ONE);
/// let job = JobContext::new("job");
/// let grant = monitor.try_admit(&demand, &job)?;
/// assert!(monitor.try_admit(&demand, &job).is_err(), "the one permit is out");
/// drop(grant);
/// assert_eq!(db.available(), 1);
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a grant releases it at once"]
pub struct BorrowedGrant<'a> {
    owner: &'a dyn Owner,
    demand: &'a Demand,
    ctx: &'a JobContext,
    settled: bool,
}

impl<'a> BorrowedGrant<'a> {
    pub(crate) fn new(owner: &'a dyn Owner, demand: &'a Demand, ctx: &'a JobContext) -> Self {
        BorrowedGrant {
            owner,
            demand,
            ctx,
            settled: false,
        }
    }

    /// Returns what the job held, as [`Grant::release`] does.
    pub fn release(&mut self) {
        self.settle(false);
    }

    /// Returns everything, metered debits included, as [`Grant::rollback`] does.
    pub fn rollback(&mut self) {
        self.settle(true);
    }

    fn settle(&mut self, everything: bool) {
        let entries = self.demand.entries();
        settle_once(&mut self.settled, self.owner, entries, self.ctx, everything);
    }

    /// True once released or rolled back.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// What was granted, in the demand's order.
    pub fn entries(&self) -> &[Entry] {
        self.demand.entries()
    }

    /// The job the grant belongs to.
    pub fn context(&self) -> &JobContext {
        self.ctx
    }

    /// The same grant, owning what it borrowed (the demand and the job are cloned: a reference
    /// count each). A grant already settled gives a settled one, which gives nothing back.
    pub fn into_owned(mut self) -> Grant {
        let mut owned = Grant::new(
            self.demand.clone(),
            self.owner.to_shared(),
            self.ctx.clone(),
            Waits::none(),
        );
        owned.settled = std::mem::replace(&mut self.settled, true);
        owned
    }
}

impl Drop for BorrowedGrant<'_> {
    fn drop(&mut self) {
        self.settle(false);
    }
}

impl fmt::Debug for BorrowedGrant<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowedGrant")
            .field("job", &self.ctx.id())
            .field("entries", &self.entries())
            .field("settled", &self.settled)
            .finish()
    }
}
