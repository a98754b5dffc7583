//! The client side of the cell's one line: an acquisition's attempts, its wait for the hand-off,
//! and the guard that undoes whatever an acquisition that ends without a lease left in Redis.
//!
//! Every acquisition carries a nonce chosen before its first call: the script lets only that
//! acquisition ask again as its waiter, claim a grant made to it, or withdraw it. So a call whose
//! reply was lost (a reset, a timeout, a server paused or restarting) is simply made again, and
//! finds its own ticket or lease; nothing is ever granted twice.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{AcquireError, NeverReason};
use crate::lease::{Lease, Return, give_back};
use crate::request::{LeaseRequest, hashed_id};
use crate::script::{
    AcquireReply, Answer, FencingToken, Full, Granted, Op, Outcome, WithdrawReply,
};
use crate::shared::Shared;
use crate::wake::Woken;

/// The outcome of one acquisition attempt.
enum Attempt {
    Admitted(Lease),
    Full {
        refusal: Full,
        /// When the refusing call was sent: the anchor from which a later grant's server time
        /// is read as a local instant.
        sent: Instant,
        /// When its reply came back.
        received: Instant,
    },
}

/// A value no other acquisition of the same lease id will choose: which call asks again as a
/// waiter, claims a grant, or withdraws.
fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:x}.{:x}.{:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// The lease a grant describes, sent at `sent`: its local deadline is the send time plus what the
/// server said was left, never more.
fn lease_of(
    shared: &Arc<Shared>,
    request: &LeaseRequest,
    granted: Granted,
    sent: Instant,
) -> Lease {
    Lease::start(
        shared.clone(),
        request,
        granted.token,
        granted.policy_version,
        granted.occupancy,
        sent + granted.left(),
    )
}

/// [`RedisAdmission::try_acquire`](crate::RedisAdmission::try_acquire): one attempt, with the
/// retries of one call (until a connection attempt and a response time have passed).
pub(crate) async fn try_acquire(
    shared: &Arc<Shared>,
    request: &LeaseRequest,
) -> Result<Lease, AcquireError> {
    let deadline = shared.cell.default_deadline();
    // Armed before the call: however the try ends without a lease (an error, a dropped future),
    // the guard gives back whatever the call may have taken.
    let mut guard = Withdraw::new(shared, request);
    let result = match attempt(shared, request, false, &guard.nonce, deadline).await {
        Ok(Attempt::Admitted(lease)) => {
            guard.disarm();
            Ok(lease)
        }
        Ok(Attempt::Full { refusal, .. }) => {
            // Refused without joining the line: nothing was left behind.
            guard.disarm();
            Err(refusal.error(request, None))
        }
        // Never, a mismatch: the script refused before changing anything.
        Err(error @ (AcquireError::Never { .. } | AcquireError::Mismatch { .. })) => {
            guard.disarm();
            Err(error)
        }
        // Unavailable: the call may have run on the server; the guard's withdrawal (retried
        // until the lease's TTL) finds out and gives back what it took.
        Err(error) => Err(error),
    };
    drop(guard);
    result
}

/// [`RedisAdmission::acquire`](crate::RedisAdmission::acquire): the attempts and the wait.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    request: &LeaseRequest,
    wait: Duration,
) -> Result<Lease, AcquireError> {
    let config = &shared.cell.config;
    let start = Instant::now();
    let deadline = start + wait;
    let waits = !wait.is_zero();
    // Armed before the first call, with the acquisition's nonce: dropped at any await, or ended
    // by an error, the guard withdraws the ticket or gives back a lease the acquisition was
    // granted.
    let mut guard = Withdraw::new(shared, request);
    // Registered before the first attempt: a notice of a grant that the reader sees before this
    // task looks is kept for it.
    let mut slot = waits.then(|| shared.wakeups.register(&guard.nonce));
    loop {
        let (refusal, sent) = match attempt(shared, request, waits, &guard.nonce, deadline).await {
            Ok(Attempt::Admitted(lease)) => {
                guard.disarm();
                return Ok(lease);
            }
            Ok(Attempt::Full {
                refusal,
                sent,
                received,
            }) => ((refusal, received), sent),
            Err(error @ (AcquireError::Never { .. } | AcquireError::Mismatch { .. })) => {
                // A refusal for good changes nothing, but an earlier attempt of this
                // acquisition may have queued a ticket: the guard withdraws it.
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        let (refusal, received) = refusal;
        let timed_out = |now: Instant| refusal.error(request, Some(now - start));
        let now = Instant::now();
        let Some(receiver) = slot.as_mut().filter(|_| now < deadline) else {
            // Out of time: leave the line, unless the acquisition was granted meanwhile.
            return match guard.withdraw_now().await? {
                Some(lease) => Ok(lease),
                None => Err(timed_out(now)),
            };
        };
        // Wait for the hand-off's grant; ask again at the earliest lease expiry (reaping is
        // lazy), when the ticket's liveness needs renewing, or when the reader failed.
        // A server instant on the local clock: just after the server's clock passes it.
        let just_after =
            |at_ms: u64| received + Duration::from_millis(at_ms.saturating_sub(refusal.now_ms) + 1);
        let earliest_expiry = refusal.earliest_expiry_ms.map(just_after);
        // The first in line short of rate alone asks again when the rates serve it.
        let ready = refusal.ready_ms.map(just_after);
        let mut until = earliest_expiry
            .map_or(deadline, |at| at.min(deadline))
            .min(now + config.renew_every);
        if let Some(ready) = ready {
            until = until.min(ready);
        }
        let granted = loop {
            match shared
                .wakeups
                .wait_grant(&shared.cell, receiver, until)
                .await
            {
                Woken::Granted(granted) => break Some(granted),
                // Told, as the new head, when the rates serve it: wait on until then.
                Woken::ReadyAt(at) => until = until.min(at),
                Woken::AskAgain => break None,
            }
        };
        if let Some(granted) = granted {
            if config.durability.replicas > 0 {
                // The notice was read from the master, perhaps before the grant reached the
                // replicas: the acquisition claims it with a call of its own, which counts only
                // once they have it (and with it every earlier write of the cell).
                if let Attempt::Admitted(lease) =
                    attempt(shared, request, true, &guard.nonce, deadline).await?
                {
                    guard.disarm();
                    return Ok(lease);
                }
                continue;
            }
            guard.disarm();
            // The grant happened at the server's `time_ms`; this waiter's refusal was sent at
            // `sent` when the server said `now_ms`, so the lease began no earlier than
            // `sent + (time_ms - now_ms)`: its deadline counts from there.
            let began =
                sent + Duration::from_millis(granted.time_ms.saturating_sub(refusal.now_ms));
            // Its expiry counts from there too: one TTL, or less when the hand-off bounded the
            // grant by this waiter's liveness.
            let lives = granted.expiry_ms.map_or(config.lease_ttl, |expiry| {
                Duration::from_millis(expiry.saturating_sub(granted.time_ms)).min(config.lease_ttl)
            });
            return Ok(Lease::start(
                shared.clone(),
                request,
                FencingToken(granted.token),
                granted.policy_version,
                granted.occupancy,
                began + lives,
            ));
        }
        if Instant::now() >= deadline {
            // Straight to the withdrawal: asking once more would only run past the deadline.
            return match guard.withdraw_now().await? {
                Some(lease) => Ok(lease),
                None => Err(timed_out(Instant::now())),
            };
        }
    }
}

/// One attempt of acquisition `nonce`: the request checked, then one call (retried on the
/// connection until `deadline`).
async fn attempt(
    shared: &Arc<Shared>,
    request: &LeaseRequest,
    queued: bool,
    nonce: &str,
    deadline: Instant,
) -> Result<Attempt, AcquireError> {
    let cell = &shared.cell;
    request
        .check(cell.config.ceilings.service_bytes)
        .map_err(|reason| AcquireError::Never { reason })?;
    let rank = cell
        .config
        .rank_of(request.level.as_deref())
        .map_err(|known| AcquireError::Never {
            reason: NeverReason::UnknownLevel {
                level: request.level.clone().unwrap_or_default(),
                known,
            },
        })?;
    let (tenant, backend) = (hashed_id(&request.tenant), hashed_id(&request.backend));
    let op = Op::Acquire {
        rank,
        id: &request.id,
        tenant: &tenant,
        backend: &backend,
        footprint: request.footprint,
        requests: request.requests,
        operation: &request.operation,
        queued,
        nonce,
        instance: shared.wakeups.instance(),
        // The caller stops waiting at `deadline`: a call that reaches the server later, held up
        // in a stalled server or network, must take nothing.
        until: deadline,
    };
    let called = cell.call::<AcquireReply>(&op, deadline).await?;
    let (sent, received) = (called.sent, Instant::now());
    match called.answer {
        Answer::Reply(AcquireReply::Granted(granted)) => {
            Ok(Attempt::Admitted(lease_of(shared, request, granted, sent)))
        }
        Answer::Reply(AcquireReply::Full(refusal)) => Ok(Attempt::Full {
            refusal,
            sent,
            received,
        }),
        Answer::Reply(AcquireReply::Never(reason)) => Err(AcquireError::Never { reason }),
        Answer::Mismatch(stored) => Err(AcquireError::Mismatch {
            stored,
            ours: cell.fingerprint.clone(),
        }),
    }
}

/// An acquisition in progress, by its nonce: when it ends without handing a lease to its caller,
/// whatever it left in Redis is withdrawn (its ticket, with a `timed_out` event) or given back
/// (a lease granted to it whose reply it never read, released as interrupted). Dropped while
/// armed, it does that on a spawned task, counted by
/// [`RedisAdmission::settle`](crate::RedisAdmission::settle), retrying a failure on the connection
/// until the lease TTL would have taken everything back anyway.
struct Withdraw<'a> {
    shared: &'a Arc<Shared>,
    request: &'a LeaseRequest,
    nonce: String,
    armed: bool,
}

impl<'a> Withdraw<'a> {
    fn new(shared: &'a Arc<Shared>, request: &'a LeaseRequest) -> Withdraw<'a> {
        Withdraw {
            shared,
            request,
            nonce: nonce(),
            armed: true,
        }
    }

    /// The caller has its lease (or nothing was left behind): nothing to undo.
    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Withdraws now; `Some` lease when the acquisition was granted first. Stays armed until
    /// Redis answered, so a drop or a failure here still leaves the withdrawal to the drop.
    async fn withdraw_now(&mut self) -> Result<Option<Lease>, AcquireError> {
        let cell = &self.shared.cell;
        let op = Op::Withdraw {
            id: &self.request.id,
            nonce: &self.nonce,
        };
        let called = cell
            .call::<WithdrawReply>(&op, cell.default_deadline())
            .await?;
        let sent = called.sent;
        self.armed = false;
        match called.answer {
            Answer::Reply(WithdrawReply::Granted(granted)) => {
                Ok(Some(lease_of(self.shared, self.request, granted, sent)))
            }
            Answer::Reply(WithdrawReply::Withdrawn | WithdrawReply::Gone) => Ok(None),
            Answer::Mismatch(stored) => Err(AcquireError::Mismatch {
                stored,
                ours: cell.fingerprint.clone(),
            }),
        }
    }
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let cell = self.shared.cell.clone();
        let id = self.request.id.clone();
        let nonce = std::mem::take(&mut self.nonce);
        self.shared.pending.spawn(&self.shared.runtime, async move {
            // A ticket's liveness and a lease's TTL take back what is left after this long.
            let deadline = Instant::now() + cell.config.lease_ttl;
            let op = Op::Withdraw {
                id: &id,
                nonce: &nonce,
            };
            match cell.call::<WithdrawReply>(&op, deadline).await {
                Ok(called) => {
                    if let Answer::Reply(WithdrawReply::Granted(granted)) = called.answer {
                        let given =
                            give_back(
                                &cell,
                                &id,
                                granted.token,
                                Return::plain(Outcome::Interrupted),
                                deadline,
                            );
                        if let Err(error) = given.await {
                            tracing::debug!(%error, lease = %id, "admission-redis: giving back a withdrawn grant failed; the TTL takes it back");
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, lease = %id, "admission-redis: withdraw failed; the ticket's liveness and the TTL take back what is left");
                }
            }
        });
    }
}
