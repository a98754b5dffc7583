//! [`FleetAdmission`]: the process's own byte budget first, then the fleet lease, both before
//! the job touches its payload.

use std::time::Duration;

use admission_core::{AccountRef, AdmitError, Amount, Demand, Grant, JobContext, Monitor};
use tokio::time::Instant;

use crate::coordinator::RedisAdmission;
use crate::error::{AcquireError, ConfigError, LeaseError};
use crate::lease::Lease;
use crate::request::LeaseRequest;
use crate::script::Outcome;

/// Local admission, then the cluster lease.
///
/// The order is the one that keeps a slow or unreachable Redis from exposing the process: a job
/// first takes `footprint` bytes from each local byte-budget account through the process's
/// [`Monitor`] (so the process never holds more than it can afford, whatever the fleet says),
/// then waits for the fleet lease **holding only that byte budget**. Never put HTTP, database or
/// model permits in the budget: a job waiting on Redis would hold them hostage. Take those in
/// the job's own admission after [`admit`](FleetAdmission::admit) returns.
///
/// The wait for the lease is bounded by what is left of the config's `local_timeout` and by its
/// `redis_wait`; on a timeout, a Redis failure, a refusal or a dropped future, the local budget
/// goes back at once. A [`JobContext`] cancelled while either wait is on ends it with
/// [`AcquireError::Local`]`(`[`AdmitError::Cancelled`]`)`: the wait for the lease is withdrawn
/// from the cell's line as a dropped future is.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (host, port) = admission_testkit::services::redis("FleetAdmission doc");
/// # let ceilings = admission_redis::Ceilings { service_bytes: 8 << 30, service_transfers: 256, tenant_bytes: 2 << 30, tenant_transfers: 64, backend_transfers: 128 };
/// # let fleet = admission_redis::RedisAdmission::connect(admission_redis::RedisAdmissionConfig::new(host, port, "uploads-local-doc", ceilings)).await?;
/// # let monitor = admission_core::Monitor::new();
/// use std::sync::Arc;
/// use admission_accounts::CountingGate;
/// use admission_core::JobContext;
/// use admission_redis::{FleetAdmission, LeaseRequest, Outcome};
///
/// let bytes = Arc::new(CountingGate::new("memory:uploads", 512 << 20, monitor.clock().clone())?);
/// let admission = FleetAdmission::new(monitor, vec![bytes], fleet)?;
/// let request = LeaseRequest::new("upload-1", "tenant-42", "disk-a", 64 << 20, "upload");
/// let grant = admission.admit(&JobContext::new("upload-1"), &request).await?;
/// // ... read the payload, write it with grant.lease().token() ...
/// grant.release(Outcome::Completed).await?;
/// # Ok(()) }
/// ```
pub struct FleetAdmission {
    monitor: Monitor,
    budget: Vec<AccountRef>,
    fleet: RedisAdmission,
}

impl FleetAdmission {
    /// Local byte-budget accounts (debited the lease's footprint each) in front of `fleet`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] on field `budget` when no account is given.
    pub fn new(
        monitor: Monitor,
        budget: Vec<AccountRef>,
        fleet: RedisAdmission,
    ) -> Result<FleetAdmission, ConfigError> {
        if budget.is_empty() {
            return Err(ConfigError::new(
                "budget",
                "is empty: the process's own byte budget must be taken before the fleet lease",
            ));
        }
        Ok(FleetAdmission {
            monitor,
            budget,
            fleet,
        })
    }

    /// The fleet provider.
    pub fn fleet(&self) -> &RedisAdmission {
        &self.fleet
    }

    /// Takes the local byte budget, then the lease.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Local`] when the local admission fails (the lease is then never asked
    /// for) or the job is cancelled while it waits for either, or any error of
    /// [`RedisAdmission::acquire`] (the local budget is then given back).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives the local budget back and withdraws the wait for the lease.
    pub async fn admit(
        &self,
        ctx: &JobContext,
        request: &LeaseRequest,
    ) -> Result<FleetGrant, AcquireError> {
        let start = Instant::now();
        let local_timeout = self.fleet.config().local_timeout;
        let mut demand = Demand::new();
        for account in &self.budget {
            demand.add(account.clone(), Amount::units(request.footprint));
        }
        let local = self.monitor.admit(demand, ctx, Some(local_timeout)).await?;
        let left = local_timeout.saturating_sub(start.elapsed());
        let acquire = self
            .fleet
            .acquire(request, left.min(self.fleet.config().redis_wait));
        // The job's cancellation ends the wait for the lease too: the acquisition is dropped
        // (its ticket withdrawn, a grant that landed released) and the local budget goes back.
        let lease = tokio::select! {
            biased;
            () = ctx.cancelled() => {
                return Err(AcquireError::Local(AdmitError::Cancelled {
                    job: ctx.id(),
                    waited: start.elapsed(),
                }));
            }
            lease = acquire => lease?,
        };
        Ok(FleetGrant {
            lease: Some(lease),
            local: Some(local),
        })
    }
}

/// A job's local byte budget and its fleet lease.
#[derive(Debug)]
#[must_use = "the budget and the lease are given back when dropped"]
pub struct FleetGrant {
    lease: Option<Lease>,
    local: Option<Grant>,
}

impl FleetGrant {
    /// The fleet lease.
    pub fn lease(&self) -> &Lease {
        self.lease
            .as_ref()
            .expect("a fleet grant holds its lease until released")
    }

    /// The local grant (the byte budget).
    pub fn local(&self) -> &Grant {
        self.local
            .as_ref()
            .expect("a fleet grant holds its local grant until released")
    }

    /// Releases the lease (recording `outcome`), then the local budget, which stays
    /// authoritative for the bytes the job held until then.
    ///
    /// # Errors
    ///
    /// The lease's release error; the local budget is given back either way.
    pub async fn release(mut self, outcome: Outcome) -> Result<(), LeaseError> {
        let result = match self.lease.take() {
            Some(lease) => lease.release(outcome).await,
            None => Ok(()),
        };
        drop(self.local.take());
        result
    }

    /// How long the local admission waited, by account.
    pub fn local_wait(&self) -> Duration {
        self.local()
            .wait_times()
            .values()
            .copied()
            .max()
            .unwrap_or_default()
    }
}
