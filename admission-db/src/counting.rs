//! [`CountingDbResourceProvider`]: a bound with no database behind it.

use std::sync::Arc;

use admission_accounts::CountingGate;
use admission_core::Clock;

use crate::{Aborter, DbError, DbHandle, DbResourceProvider, ProviderId};

/// A provider that is only its bound: its handles carry no connection and its verbs do nothing.
///
/// It depends on no database API. A host that manages its own connections uses it to keep the
/// jobs holding one at once under the bound: a job takes its permit with its demand, then checks
/// out of its own pool.
///
/// # Examples
///
/// ```
/// use admission_core::{Amount, Demand, JobContext, Monitor};
/// use admission_db::{CountingDbResourceProvider, DbPlan, DbResourceProvider};
/// use std::sync::Arc;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let monitor = Monitor::new();
/// let db = Arc::new(CountingDbResourceProvider::new("orders", 8, monitor.clock().clone())?);
/// assert_eq!(db.admission().name(), "db:orders");
///
/// let plan = DbPlan::new().with(db.clone(), false);
/// let grant = monitor.admit_blocking(plan.demand(Demand::new()), &JobContext::new("job"), None)?;
/// let job = plan.open(grant)?;
/// assert_eq!(db.admission().in_use(), 1);
/// job.commit_all()?;
/// job.close()?;
/// assert_eq!(db.admission().in_use(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct CountingDbResourceProvider {
    id: ProviderId,
    gate: Arc<CountingGate>,
}

impl CountingDbResourceProvider {
    /// A provider named `name` bounding jobs to `max_concurrent` at once; its gate stamps on
    /// `clock` (the monitor's).
    ///
    /// # Errors
    ///
    /// [`DbError::Config`] for a bound of zero.
    pub fn new(
        name: impl Into<Arc<str>>,
        max_concurrent: u64,
        clock: Arc<dyn Clock>,
    ) -> Result<CountingDbResourceProvider, DbError> {
        let id = ProviderId::new(name);
        let gate = id.gate(max_concurrent, clock)?;
        Ok(CountingDbResourceProvider { id, gate })
    }
}

impl DbResourceProvider for CountingDbResourceProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn admission(&self) -> &Arc<CountingGate> {
        &self.gate
    }

    fn acquire(&self, read_only: bool) -> Result<Box<dyn DbHandle>, DbError> {
        Ok(Box::new(CountingDbHandle {
            provider: self.id.clone(),
            read_only,
            closed: false,
        }))
    }
}

/// The counting provider's handle: no connection; every verb succeeds and does nothing, and
/// [`await_completion`](DbHandle::await_completion) has nothing to wait for.
#[derive(Debug)]
pub struct CountingDbHandle {
    provider: ProviderId,
    read_only: bool,
    /// Set by the first close (for [`DbHandle::is_closed`] only; nothing is refused after it).
    closed: bool,
}

impl DbHandle for CountingDbHandle {
    fn provider(&self) -> &ProviderId {
        &self.provider
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn begin(&mut self) -> Result<(), DbError> {
        Ok(())
    }
    fn commit(&mut self) -> Result<(), DbError> {
        Ok(())
    }
    /// A no-op: there is no database.
    fn await_completion(&mut self) -> Result<(), DbError> {
        Ok(())
    }
    fn rollback(&mut self) -> Result<(), DbError> {
        Ok(())
    }
    fn close(&mut self) -> Result<(), DbError> {
        self.closed = true;
        Ok(())
    }
    fn aborter(&self) -> Aborter {
        Aborter::noop()
    }
    fn in_transaction(&self) -> bool {
        false
    }
    fn is_closed(&self) -> bool {
        self.closed
    }
}
