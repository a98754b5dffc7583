//! [`Lease`]: a fleet admission held by this process, renewed in the background, released on
//! every exit, and able to tell its holder when it is lost.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::LeaseError;
use crate::renewal::{Entry, LossReason};
use crate::request::LeaseRequest;
use crate::script::{Answer, Cell, FencingToken, Held, Occupancy, Op, Outcome, Renewed};
use crate::shared::Shared;

/// How a lease goes back: its outcome, and what the call made under it tells the cell's rates
/// (see [`Op::Release`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Return {
    pub(crate) outcome: Outcome,
    pub(crate) unused: u64,
    pub(crate) unused_requests: u64,
    pub(crate) feedback: Option<u32>,
    pub(crate) left: Option<u64>,
}

impl Return {
    /// A release that tells the rates nothing.
    pub(crate) fn plain(outcome: Outcome) -> Return {
        Return {
            outcome,
            unused: 0,
            unused_requests: 0,
            feedback: None,
            left: None,
        }
    }
}

/// What a call made under a lease reported, for the cell's rates
/// ([`Lease::release_reported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallReport {
    /// Tokens of the lease's footprint the call spent (what the upstream charged); the rest goes
    /// back to the rates. A call refused by the upstream spent none.
    pub spent: u64,
    /// What the upstream said of its load.
    pub upstream: Upstream,
    /// The tokens the upstream said it had left (its `x-ratelimit-remaining-tokens`), if it
    /// said: a cell whose token level is above it comes down to it, so that spending outside
    /// the fleet (another service on the same organisation) is seen by every member at once.
    /// It can only lower the level.
    pub tokens_left: Option<u64>,
}

/// What an upstream's answer says of its load, for the rates' throttle (the local token
/// bucket's `record_success` / `record_backpressure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// Nothing: a plain error, or an answer that was not about load.
    Silent,
    /// A success: relieves the throttle.
    Success,
    /// Backpressure of this weight (a 429 is 1): raises the throttle by 0.5 per step.
    Backpressure(u32),
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
    shared: Arc<Shared>,
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
    /// Starts holding a lease whose local deadline is `deadline` (the send time of the call that
    /// granted it plus what the server said was left, never more): the renewal task renews it
    /// first `renew_every` after the lease began (`deadline - lease_ttl`), so a fresh lease is
    /// renewed well before the server would expire it.
    pub(crate) fn start(
        shared: Arc<Shared>,
        request: &LeaseRequest,
        token: FencingToken,
        policy_version: u64,
        occupancy: Occupancy,
        deadline: Instant,
    ) -> Lease {
        let config = &shared.cell.config;
        let entry = Arc::new(Entry::new(request, token, deadline));
        shared.renewals.schedule(
            &shared.cell,
            &shared.runtime,
            entry.clone(),
            first_renewal(
                deadline,
                config.lease_ttl,
                config.renew_every,
                Instant::now(),
            ),
        );
        Lease {
            id: request.id.clone(),
            token,
            policy_version,
            occupancy,
            loss: entry.loss.subscribe(),
            entry,
            runtime: tokio::runtime::Handle::current(),
            released: false,
            shared,
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
        let cell = &self.shared.cell;
        let result = renew_one(cell, &self.entry, self.entry.deadline()).await;
        match &result {
            Ok(sent) => self.entry.renewed(*sent, cell.config.lease_ttl),
            Err(LeaseError::Lost { .. }) => self.entry.lose(LossReason::Lost),
            Err(LeaseError::Stale { current, .. }) => {
                self.entry.lose(LossReason::Stale { current: *current });
            }
            Err(_) => {}
        }
        result.map(|_| ())
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
    pub async fn release(self, outcome: Outcome) -> Result<(), LeaseError> {
        self.give_back(Return::plain(outcome)).await
    }

    /// Releases the lease now, recording `outcome`, and gives the tokens of its footprint it did
    /// not spend back to the cell's rates ([`Rates`](crate::Rates)): a call declared its most
    /// tokens and its answer says how many it used, as the local token bucket's refund does. The
    /// refund is at most the footprint; on a cell without rates it is ignored.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Lease::release) (a release on the drop path refunds nothing).
    ///
    /// # Errors
    ///
    /// As [`release`](Lease::release).
    pub async fn release_spent(self, outcome: Outcome, spent: u64) -> Result<(), LeaseError> {
        let unused = self.entry.footprint().saturating_sub(spent);
        self.give_back(Return {
            unused,
            ..Return::plain(outcome)
        })
        .await
    }

    /// Releases the lease now with what the call made under it reported: the tokens it spent
    /// (the rest of the footprint goes back to the cell's rates, as with
    /// [`release_spent`](Lease::release_spent)) and what the upstream said of its load, for the
    /// rates' throttle, in the same call: a 429 slows the whole fleet at once, a success relieves
    /// it, with no call of its own ([`RedisAdmission::record_429`](crate::RedisAdmission::record_429)
    /// and [`record_success`](crate::RedisAdmission::record_success) are the same signals
    /// without a lease). On a cell without rates only the release happens.
    ///
    /// # Errors
    ///
    /// As [`release`](Lease::release).
    pub async fn release_reported(
        self,
        outcome: Outcome,
        report: CallReport,
    ) -> Result<(), LeaseError> {
        let unused = self.entry.footprint().saturating_sub(report.spent);
        let feedback = match report.upstream {
            Upstream::Silent => None,
            Upstream::Success => Some(0),
            Upstream::Backpressure(0) => None,
            Upstream::Backpressure(increments) => Some(increments),
        };
        self.give_back(Return {
            outcome,
            unused,
            unused_requests: 0,
            feedback,
            left: report.tokens_left,
        })
        .await
    }

    /// Releases a slice of the cell's rates ([`RateSlices`](crate::RateSlices)) that spent
    /// `tokens` of its footprint and `requests` of its requests: the rest of each goes back to
    /// the rates (at most what the lease took).
    ///
    /// # Errors
    ///
    /// As [`release`](Lease::release).
    pub async fn release_slice(
        self,
        outcome: Outcome,
        tokens: u64,
        requests: u64,
    ) -> Result<(), LeaseError> {
        let unused = self.entry.footprint().saturating_sub(tokens);
        let unused_requests = self.entry.requests().saturating_sub(requests);
        self.give_back(Return {
            unused,
            unused_requests,
            ..Return::plain(outcome)
        })
        .await
    }

    async fn give_back(mut self, back: Return) -> Result<(), LeaseError> {
        self.entry.done.store(true, Ordering::Release);
        let result = give_back(
            &self.shared.cell,
            &self.id,
            self.token,
            back,
            self.entry.deadline(),
        )
        .await;
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
        let cell = self.shared.cell.clone();
        let entry = self.entry.clone();
        self.shared.pending.spawn(&self.runtime, async move {
            let deadline = entry.deadline();
            let released =
                give_back(
                &cell,
                &entry.id,
                entry.token,
                Return::plain(Outcome::Interrupted),
                deadline,
            );
            if let Err(error) = released.await {
                tracing::debug!(%error, lease = %entry.id, operation = %entry.operation, "admission-redis: release on drop failed; the TTL takes the lease back");
            }
        });
    }
}

/// Gives lease `id` held with `token` back, recording `outcome` (and `unused` tokens to the
/// cell's rates), retrying a failure on the
/// connection until `deadline` (the lease's local deadline: past it the server's TTL takes the
/// lease back anyway). A release that finds the lease gone after an earlier attempt failed on
/// the connection was released by that attempt: it is not reported lost.
pub(crate) async fn give_back(
    cell: &Cell,
    id: &str,
    token: FencingToken,
    back: Return,
    deadline: Instant,
) -> Result<(), LeaseError> {
    let op = Op::Release {
        id,
        token,
        outcome: back.outcome,
        unused: back.unused,
        unused_requests: back.unused_requests,
        feedback: back.feedback,
        left: back.left,
    };
    let called = cell.call::<Held>(&op, deadline).await?;
    match called.answer {
        Answer::Reply(Held::Ok) => Ok(()),
        Answer::Reply(Held::Lost) if called.retried => Ok(()),
        Answer::Reply(Held::Lost) => Err(LeaseError::Lost {
            lease: id.to_string(),
        }),
        Answer::Reply(Held::Stale(current)) => Err(LeaseError::Stale {
            lease: id.to_string(),
            token: token.0,
            current,
        }),
        Answer::Mismatch(stored) => Err(LeaseError::Mismatch { stored }),
    }
}

/// Renews one lease now, retrying a failure on the connection until `deadline`; `Ok` with when
/// the renewal that answered was sent.
async fn renew_one(cell: &Cell, entry: &Entry, deadline: Instant) -> Result<Instant, LeaseError> {
    let (id, token) = (entry.id.as_str(), entry.token);
    let leases = [entry.renewing()];
    // Past the lease's own deadline its holder counts it lost: a renewal held up until then
    // must not extend it.
    let called = cell
        .call::<Renewed>(
            &Op::Renew {
                leases: &leases,
                until: entry.deadline(),
            },
            deadline,
        )
        .await?;
    match called.answer {
        Answer::Reply(Renewed(held, _)) => match held.first() {
            Some(Held::Ok) => Ok(called.sent),
            Some(Held::Stale(current)) => Err(LeaseError::Stale {
                lease: id.to_string(),
                token: token.0,
                current: *current,
            }),
            _ => Err(LeaseError::Lost {
                lease: id.to_string(),
            }),
        },
        Answer::Mismatch(stored) => Err(LeaseError::Mismatch { stored }),
    }
}

/// When a lease with local deadline `deadline` is first renewed: `renew_every` after it began
/// (`deadline - ttl`), but not before `now` and never after its deadline.
pub(crate) fn first_renewal(
    deadline: Instant,
    ttl: Duration,
    renew_every: Duration,
    now: Instant,
) -> Instant {
    let lead = ttl.saturating_sub(renew_every);
    deadline
        .checked_sub(lead)
        .unwrap_or(now)
        .max(now)
        .min(deadline)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::first_renewal;

    #[test]
    fn a_fresh_lease_is_renewed_renew_every_after_it_began_not_after_its_deadline() {
        let now = Instant::now();
        let (ttl, every) = (Duration::from_secs(3), Duration::from_secs(1));
        // Granted now with the whole TTL left: renewed in one second, two before the deadline.
        assert_eq!(first_renewal(now + ttl, ttl, every, now), now + every);
        // Granted with 2.5 s left (the grant reached the server half a second before it
        // answered): renewed half a second from now.
        let deadline = now + Duration::from_millis(2_500);
        assert_eq!(
            first_renewal(deadline, ttl, every, now),
            now + Duration::from_millis(500)
        );
        // Granted with less left than `ttl - renew_every`: renewed at once.
        let deadline = now + Duration::from_millis(1_500);
        assert_eq!(first_renewal(deadline, ttl, every, now), now);
    }
}
