//! [`Lease`]: a fleet admission held by this process, renewed in the background, released on
//! every exit, and able to tell its holder when it is lost.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use std::sync::atomic::Ordering;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::coordinator::{Inner, LeaseRequest, int};
use crate::error::LeaseError;
use crate::renewal::Entry;

/// A fencing token: issued with each lease, greater than every token the cell issued before.
///
/// # The guarantee, and its limits
///
/// A lease is a promise on a timer: a holder paused past its TTL (a long GC pause, a frozen VM,
/// a partition) may still believe it holds a lease that was reaped and handed to someone else.
/// Renewal cannot prevent that; only the resource being written can, by remembering the greatest
/// token it has accepted and refusing writes that carry a smaller one (Kleppmann, "How to do
/// distributed locking", 2016). Pass [`Lease::token`] with every write to the downstream store,
/// and have the store compare-and-set its highest token seen.
///
/// The script issues `max(last + 1, server time in microseconds)`. The counter survives as
/// long as Redis keeps the key; when Redis restarts empty or fails over to a replica that lost
/// the last writes, the server's clock carries the order instead. Tokens therefore never go back
/// unless **both** the counter is lost **and** either the new server's clock is behind the old
/// one's or the cell issued leases faster than one per microsecond for long enough to run the
/// counter ahead of the clock. Keep server clocks synchronised (NTP) and do not move them back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What the five dimensions hold (after a transition, or at a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Occupancy {
    /// Bytes held in the cell.
    pub service_bytes: u64,
    /// Leases held in the cell.
    pub service_transfers: u64,
    /// Bytes held by the tenant.
    pub tenant_bytes: u64,
    /// Leases held by the tenant.
    pub tenant_transfers: u64,
    /// Leases held on the backend.
    pub backend_transfers: u64,
}

impl Occupancy {
    pub(crate) fn from_fields(fields: &[String]) -> Occupancy {
        Occupancy {
            service_bytes: int(fields, 0),
            service_transfers: int(fields, 1),
            tenant_bytes: int(fields, 2),
            tenant_transfers: int(fields, 3),
            backend_transfers: int(fields, 4),
        }
    }
}

/// How a transfer ended, recorded in the release event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It finished.
    Completed,
    /// It failed.
    Failed,
    /// It was cancelled or dropped.
    Interrupted,
}

impl Outcome {
    /// The event kind and outcome label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
            Outcome::Interrupted => "interrupted",
        }
    }
}

/// Why a held lease was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Redis no longer has the lease: reaped after its TTL, or released by someone else.
    Lost,
    /// A newer lease holds the id (`current` is its token).
    Stale {
        /// The token that holds the id now.
        current: u64,
    },
    /// No renewal succeeded before the conservative local deadline (the last successful send
    /// plus the TTL): the lease must be presumed expired.
    Unrenewed {
        /// The last error met.
        last_error: String,
    },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Lost => f.write_str("lost: expired or released elsewhere"),
            LossReason::Stale { current } => {
                write!(f, "stale: the id is held with token {current}")
            }
            LossReason::Unrenewed { last_error } => {
                write!(f, "not renewed within its TTL (last error: {last_error})")
            }
        }
    }
}

impl LossReason {
    /// A bounded label: `lost`, `stale` or `unrenewed`.
    pub fn label(&self) -> &'static str {
        match self {
            LossReason::Lost => "lost",
            LossReason::Stale { .. } => "stale",
            LossReason::Unrenewed { .. } => "unrenewed",
        }
    }
}

/// A fleet lease held by this process.
///
/// It renews itself every `renew_every` on the runtime it was acquired on. Release it with
/// [`release`](Lease::release) saying how the transfer ended; dropping it releases it as
/// [`Outcome::Interrupted`] on a spawned task ([`RedisAdmission::settle`] waits for those; if
/// that runtime is gone, or Redis is down, the lease's TTL takes it back on the server's clock).
///
/// [`RedisAdmission::settle`]: crate::RedisAdmission::settle
///
/// # Loss
///
/// A lease is lost when Redis says it is gone or stale, or when no renewal has succeeded by the
/// local deadline (send time of the last success + TTL). Loss is reported once: a `warn` log,
/// the `admission_redis_leases_lost_total` counter (feature `metrics`), and
/// [`lost`](Lease::lost), a future the holder can `select!` on to stop its work.
#[must_use = "a lease is released when dropped"]
pub struct Lease {
    inner: Arc<Inner>,
    id: String,
    token: FencingToken,
    policy_version: u64,
    occupancy: Occupancy,
    entry: Arc<Entry>,
    loss: watch::Receiver<Option<LossReason>>,
    runtime: tokio::runtime::Handle,
    released: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("token", &self.token)
            .field("policy_version", &self.policy_version)
            .field("occupancy", &self.occupancy)
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(crate) fn start(
        inner: Arc<Inner>,
        request: &LeaseRequest,
        token: FencingToken,
        policy_version: u64,
        occupancy: Occupancy,
        sent: Instant,
    ) -> Lease {
        let config = &inner.config;
        let entry = Arc::new(Entry::new(
            request.id.clone(),
            token,
            request.operation.clone(),
            sent + config.lease_ttl,
        ));
        inner
            .renewals
            .schedule(&inner, entry.clone(), sent + config.renew_every);
        Lease {
            id: request.id.clone(),
            token,
            policy_version,
            occupancy,
            loss: entry.loss.subscribe(),
            entry,
            runtime: tokio::runtime::Handle::current(),
            released: false,
            inner,
        }
    }

    /// The lease id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The fencing token: pass it with every write downstream (see [`FencingToken`]).
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The policy version the admission was decided under.
    pub fn policy_version(&self) -> u64 {
        self.policy_version
    }

    /// The occupancy right after this admission.
    pub fn occupancy(&self) -> Occupancy {
        self.occupancy
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<LossReason> {
        self.loss.borrow().clone()
    }

    /// Resolves when the lease is lost (never, while it is held and renewed).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let mut loss = self.loss.clone();
        async move {
            let reason = match loss.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone(),
                Err(_) => None,
            };
            match reason {
                Some(reason) => reason,
                // The renewer ended without a loss: the lease was released; wait forever.
                None => std::future::pending().await,
            }
        }
    }

    /// Renews the lease now, besides the background renewals (before a long step, say).
    ///
    /// # Errors
    ///
    /// [`LeaseError::Lost`] or [`LeaseError::Stale`] (the lease is then reported lost, as by a
    /// background renewal), [`LeaseError::Unavailable`] when Redis fails.
    pub async fn renew_now(&self) -> Result<(), LeaseError> {
        let sent = Instant::now();
        let result = self.inner.renew(&self.id, self.token).await;
        match &result {
            Ok(()) => self.entry.renewed(sent, self.inner.config.lease_ttl),
            Err(LeaseError::Lost { .. }) => self.entry.lose(LossReason::Lost),
            Err(LeaseError::Stale { current, .. }) => {
                self.entry.lose(LossReason::Stale { current: *current });
            }
            Err(_) => {}
        }
        result
    }

    /// Releases the lease now, recording `outcome`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before Redis answered releases the lease as
    /// [`Outcome::Interrupted`] on a spawned task, as dropping the lease does.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Lost`] or [`LeaseError::Stale`] when the lease was no longer this holder's
    /// (nothing was given back twice), [`LeaseError::Unavailable`] when Redis failed (the TTL
    /// then takes the lease back).
    pub async fn release(mut self, outcome: Outcome) -> Result<(), LeaseError> {
        self.entry.done.store(true, Ordering::Release);
        let result = self.inner.release(&self.id, self.token, outcome).await;
        // Only now: a release future dropped before Redis answered leaves the lease to the
        // drop's own release (a second one is refused as lost, never applied twice).
        self.released = true;
        result
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.entry.done.store(true, Ordering::Release);
        let inner = self.inner.clone();
        let entry = self.entry.clone();
        let pending = self.inner.pending.clone();
        pending.spawn(&self.runtime, async move {
            if let Err(error) = inner.release(&entry.id, entry.token, Outcome::Interrupted).await {
                tracing::debug!(%error, lease = %entry.id, operation = %entry.operation, "admission-redis: release on drop failed; the TTL takes the lease back");
            }
        });
    }
}
