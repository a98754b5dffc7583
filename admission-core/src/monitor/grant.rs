//! [`Grant`]: the RAII value a job holds while it uses what admission gave it.
//!
//! It lives beside the monitor as tokio's permit lives beside its semaphore, and knows the monitor
//! only as the [`Owner`] it gives back to: the engine files make grants, the grant never reaches
//! into them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::clock::Instant;
use crate::context::JobContext;
use crate::demand::{Demand, Entry};

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

/// One account's hold on a waiter, kept for [`Grant::wait_times`]: 24 bytes. The one hold most
/// waiters get sits in the waiter's record ([`Holds`]), so parking allocates nothing for it; a
/// grant copies it into room its pass made before taking the lock.
pub(crate) struct Hold {
    /// The held entry's index in the waiter's demand (a demand has one entry per account, so
    /// the index names the account), or [`Hold::GATE`] for the gate. Names are looked up only
    /// when a grant reports its waits, so holding costs no copy.
    entry: u32,
    /// When the account first refused the waiter.
    since: Instant,
    /// When it last stopped refusing ([`Instant::MAX`] while it still refuses).
    until: Instant,
}

impl Hold {
    /// The index under which the gate appears among a waiter's holds.
    const GATE: u32 = u32::MAX;

    /// A hold by the demand's entry `entry` (`None`: the gate) since `since`, still holding.
    /// (An index past `u32::MAX - 1`, in a demand of four billion accounts, shares the last.)
    pub(crate) fn new(entry: Option<usize>, since: Instant) -> Hold {
        Hold {
            entry: entry.map_or(Hold::GATE, |i| {
                u32::try_from(i).map_or(Hold::GATE - 1, |i| i.min(Hold::GATE - 1))
            }),
            since,
            until: Instant::MAX,
        }
    }

    /// When the account last stopped refusing; `None` while it still refuses.
    pub(crate) fn until(&self) -> Option<Instant> {
        (self.until != Instant::MAX).then_some(self.until)
    }

    /// The account refuses again (or still): the hold is open.
    pub(crate) fn reopen(&mut self) {
        self.until = Instant::MAX;
    }

    /// The account stopped refusing at `at`, unless it had already (the first end counts).
    /// An end at [`Instant::MAX`] itself (a clock at its very end) keeps the hold open.
    pub(crate) fn end(&mut self, at: Instant) {
        if self.until == Instant::MAX {
            self.until = at;
        }
    }

    /// The held entry's index in the waiter's demand; `None` for the gate.
    pub(crate) fn entry(&self) -> Option<usize> {
        (self.entry != Hold::GATE).then_some(self.entry as usize)
    }
}

/// A waiter's holds: room for one in place (most waiters are held by one account at a time).
pub(crate) type Holds = SmallVec<[Hold; 1]>;

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

/// The holds a waiter collected in the line, moved into its grant unread, and the two instants
/// its wait ran between.
pub(crate) struct Waits {
    /// The record's [`Holds`], moved as they are: the one hold most waiters have stays in place,
    /// so granting a waiter allocates nothing.
    pub(crate) holds: Holds,
    /// When the job asked (parked).
    pub(crate) asked_at: Instant,
    /// The instant of the grant: where a hold still open at the end ends.
    pub(crate) granted_at: Instant,
}

impl Waits {
    /// An immediate grant's: nothing held it, and it waited for nothing.
    pub(crate) fn none() -> Waits {
        Waits {
            holds: Holds::new(),
            asked_at: Instant::ZERO,
            granted_at: Instant::ZERO,
        }
    }

    /// From asking to granted.
    pub(crate) fn wall_wait(&self) -> Duration {
        self.granted_at.saturating_duration_since(self.asked_at)
    }
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
                (name.to_owned(), until.saturating_duration_since(hold.since))
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
