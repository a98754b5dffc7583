//! Renewing every lease of a provider instance from one task, in batches: the leases due at one
//! moment are renewed by one script call, so a process holding hundreds of leases makes a few
//! round trips per renewal interval, not hundreds, and an acquisition spawns nothing.
//!
//! Each lease is an [`Entry`] in a map ordered by when it is next due. The task sleeps until the
//! earliest, renews everything due, and puts each entry back at its next time: `sent +
//! renew_every` after a success, a short retry after a transient failure, never past the
//! conservative local deadline (send time of the last success + TTL), at which the lease is
//! reported lost as [`LossReason::Unrenewed`]. A Redis answer that the lease is gone or stale is
//! reported at once.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::request::{LeaseRequest, hashed_id};
use crate::script::{Cell, FencingToken, Held, Op, Renewed, Renewing};

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

/// Most leases renewed by one script call.
const BATCH: usize = 256;

/// One held lease, as the renewal task sees it.
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) token: FencingToken,
    pub(crate) operation: String,
    /// The tenant's and the backend's digests and the footprint: with the id, the token and the
    /// operation, the lease's record, which a renewal sends so that a recovering cell can bring
    /// the lease back.
    tenant: String,
    backend: String,
    footprint: u64,
    /// What the lease spent of the cell's requests per minute.
    requests: u64,
    pub(crate) loss: watch::Sender<Option<LossReason>>,
    /// Set when the holder released or dropped the lease: the task forgets it.
    pub(crate) done: AtomicBool,
    timing: Mutex<Timing>,
}

struct Timing {
    /// Past this instant the lease may have expired on the server.
    deadline: Instant,
    last_error: Option<String>,
}

impl Entry {
    pub(crate) fn new(request: &LeaseRequest, token: FencingToken, deadline: Instant) -> Entry {
        Entry {
            id: request.id.clone(),
            token,
            operation: request.operation.clone(),
            tenant: hashed_id(&request.tenant),
            backend: hashed_id(&request.backend),
            footprint: request.footprint,
            requests: request.requests,
            loss: watch::channel(None).0,
            done: AtomicBool::new(false),
            timing: Mutex::new(Timing {
                deadline,
                last_error: None,
            }),
        }
    }

    /// The lease as a renewal sends it.
    pub(crate) fn renewing(&self) -> Renewing<'_> {
        Renewing {
            id: &self.id,
            token: self.token,
            tenant: &self.tenant,
            backend: &self.backend,
            footprint: self.footprint,
            operation: &self.operation,
        }
    }

    /// The lease's footprint.
    pub(crate) fn footprint(&self) -> u64 {
        self.footprint
    }

    /// What the lease spent of the cell's requests per minute.
    pub(crate) fn requests(&self) -> u64 {
        self.requests
    }

    /// Past this instant the lease may have expired on the server.
    pub(crate) fn deadline(&self) -> Instant {
        self.timing.lock().deadline
    }

    /// A renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let mut timing = self.timing.lock();
        timing.deadline = timing.deadline.max(sent + ttl);
        timing.last_error = None;
    }

    /// Reports the loss once (a `warn` line, the metric, the holder's future); nothing for a
    /// lease its holder already gave up.
    pub(crate) fn lose(&self, reason: LossReason) {
        if self.done.load(Ordering::Acquire) || self.loss.borrow().is_some() {
            return;
        }
        tracing::warn!(lease = %self.id, operation = %self.operation, reason = %reason, "admission-redis: lease lost");
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "admission_redis_leases_lost_total",
            "operation" => self.operation.clone(),
            "outcome" => reason.label(),
        )
        .increment(1);
        self.loss.send_replace(Some(reason));
    }
}

/// The renewal schedule of one provider instance.
#[derive(Default)]
pub(crate) struct Renewals {
    state: Mutex<State>,
    wake: Notify,
    closed: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Entries by when they are next due (ties broken by insertion order).
    due: BTreeMap<(Instant, u64), Arc<Entry>>,
    seq: u64,
    task: Option<JoinHandle<()>>,
    /// When the task wakes next by itself (`None`: only when notified). A new entry due no
    /// earlier needs no notification: the common case, since every lease is due `renew_every`
    /// after it was taken, later than every lease before it.
    wakes_at: Option<Instant>,
}

impl Renewals {
    /// Schedules `entry` for `next`, starting the task on `runtime` if it is not running.
    pub(crate) fn schedule(
        self: &Arc<Self>,
        cell: &Arc<Cell>,
        runtime: &tokio::runtime::Handle,
        entry: Arc<Entry>,
        next: Instant,
    ) {
        let mut state = self.state.lock();
        state.seq += 1;
        let seq = state.seq;
        state.due.insert((next, seq), entry);
        if state.task.as_ref().is_none_or(JoinHandle::is_finished) {
            state.task = Some(runtime.spawn(run(self.clone(), Arc::downgrade(cell))));
        } else if state.wakes_at.is_none_or(|at| next < at) {
            state.wakes_at = Some(next);
            self.wake.notify_one();
        }
    }

    /// Ends the task (the provider's last clone and its last lease are gone).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// The earliest due time among live entries, dropping released ones at the front; the
    /// task sleeps until then (or until notified, when `None`).
    fn next_due(&self) -> Option<Instant> {
        let mut state = self.state.lock();
        let mut next = None;
        while let Some(entry) = state.due.first_entry() {
            if entry.get().done.load(Ordering::Acquire) {
                entry.remove();
            } else {
                next = Some(entry.key().0);
                break;
            }
        }
        state.wakes_at = next;
        next
    }

    /// Takes up to [`BATCH`] live entries due by `now`.
    fn take_due(&self, now: Instant) -> Vec<Arc<Entry>> {
        let mut state = self.state.lock();
        let mut taken = Vec::new();
        while taken.len() < BATCH {
            match state.due.first_entry() {
                Some(entry) if entry.key().0 <= now => {
                    let entry = entry.remove();
                    if !entry.done.load(Ordering::Acquire) {
                        taken.push(entry);
                    }
                }
                _ => break,
            }
        }
        taken
    }

    fn put_back(&self, entry: Arc<Entry>, next: Instant) {
        let mut state = self.state.lock();
        state.seq += 1;
        let seq = state.seq;
        state.due.insert((next, seq), entry);
    }
}

/// Renews every scheduled lease now, as the task does when they fall due (test-util).
#[cfg(feature = "test-util")]
pub(crate) async fn renew_all_now(cell: &Cell, renewals: &Renewals) {
    let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let batch = renewals.take_due(far);
    renew(cell, renewals, batch).await;
}

async fn run(renewals: Arc<Renewals>, cell: Weak<Cell>) {
    loop {
        let notified = renewals.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if renewals.closed.load(Ordering::Acquire) {
            return;
        }
        match renewals.next_due() {
            None => notified.await,
            Some(at) if at > Instant::now() => {
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            Some(_) => {
                let Some(cell) = cell.upgrade() else { return };
                let batch = renewals.take_due(Instant::now());
                renew(&cell, &renewals, batch).await;
            }
        }
    }
}

/// Renews one batch and reschedules or reports each entry. The call retries a failure on the
/// connection until the earliest deadline of the batch; if that passes without an answer, each
/// entry is tried again shortly (or reported lost at its own deadline).
async fn renew(cell: &Cell, renewals: &Renewals, batch: Vec<Arc<Entry>>) {
    let ttl = cell.config.lease_ttl;
    let every = cell.config.renew_every;
    let retry = (every / 4).max(Duration::from_millis(50));
    let now = Instant::now();
    let mut live = Vec::with_capacity(batch.len());
    let mut earliest: Option<Instant> = None;
    for entry in batch {
        let timing = entry.timing.lock();
        if now >= timing.deadline {
            let last_error = timing
                .last_error
                .clone()
                .unwrap_or_else(|| "no renewal in time".into());
            drop(timing);
            entry.lose(LossReason::Unrenewed { last_error });
        } else {
            earliest = Some(earliest.map_or(timing.deadline, |e| e.min(timing.deadline)));
            drop(timing);
            live.push(entry);
        }
    }
    let Some(deadline) = earliest else {
        return;
    };
    let leases: Vec<Renewing<'_>> = live.iter().map(|e| e.renewing()).collect();
    // Past the earliest deadline of the batch that lease's holder counts it lost: a renewal held
    // up until then (a stalled server) must not extend it, and the others are asked again.
    let op = Op::Renew {
        leases: &leases,
        until: deadline,
    };
    let error = match cell.call::<Renewed>(&op, deadline).await {
        Ok(called) => match called.answer {
            // Counted from the attempt that answered (see `Called::sent`).
            crate::script::Answer::Reply(Renewed(answers, _)) if answers.len() == live.len() => {
                for (entry, answer) in live.into_iter().zip(answers) {
                    match answer {
                        Held::Ok => {
                            entry.renewed(called.sent, ttl);
                            renewals.put_back(entry, called.sent + every);
                        }
                        Held::Stale(current) => entry.lose(LossReason::Stale { current }),
                        Held::Lost => entry.lose(LossReason::Lost),
                    }
                }
                return;
            }
            crate::script::Answer::Reply(Renewed(answers, _)) => format!(
                "the renewal answered for {} of {} leases",
                answers.len(),
                live.len()
            ),
            crate::script::Answer::Mismatch(stored) => {
                format!("the cell's config fingerprint changed to {stored}")
            }
        },
        Err(error) => error.to_string(),
    };
    tracing::debug!(%error, leases = live.len(), "admission-redis: renewal failed; retrying");
    let now = Instant::now();
    for entry in live {
        let next = {
            let mut timing = entry.timing.lock();
            timing.last_error = Some(error.clone());
            (now + retry).min(timing.deadline)
        };
        renewals.put_back(entry, next);
    }
}
