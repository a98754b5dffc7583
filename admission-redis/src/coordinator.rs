//! [`RedisAdmission`]: one provider instance's connection to its cell, and every operation as one
//! call of the cell's script (one round trip each, retried through short outages).

use std::sync::Arc;
use std::time::Duration;

use crate::config::{MAX_EXACT, RedisAdmissionConfig};
use crate::connection::{check_durability, check_eviction, clients, manager};
use crate::error::{
    AcquireError, ConnectError, LeaseError, PolicyError, QuotaError, QuotaKind, Unavailable,
};
use crate::lease::{Lease, Return, give_back};
use crate::request::{LeaseRequest, hashed_id};
use crate::script::{
    Answer, Cell, Created, FencingToken, Occupancy, Op, Outcome, PolicyReply, QuotaReply,
    SnapshotReply, Throttled,
};
use crate::shared::Shared;
use crate::wake::Wakeups;

/// A provider instance: connected to one cell of one Redis server, shared by every task of the
/// process (clone it; clones share the connection).
///
/// # Fail closed
///
/// Every operation is one script call. A call that fails on the connection (reset, refused, a
/// timeout, a server restarting, loading or paused) is retried with a growing pause (10 ms,
/// doubling to 250 ms) until the caller's own deadline: an acquisition's `wait` (for
/// [`try_acquire`](RedisAdmission::try_acquire), one `connect_timeout` plus one
/// `response_timeout`), a release's lease deadline, a withdrawal's lease TTL. So a restart or a
/// pause shorter than a job's remaining time costs that job only the outage; only when its
/// deadline passes without an answer does an acquisition fail with
/// [`AcquireError::Unavailable`]. Nothing is ever admitted without the server's answer.
///
/// A server that restarted or failed over may have lost acknowledged writes (a lease granted or
/// renewed) while their holders still run: the cell then recovers, admitting nothing new until
/// one lease TTL after the loss ([`AcquireError::Recovering`] says how long; `acquire` waits it
/// out within its caller's wait), while renewals bring those leases back, so the ceilings hold.
/// A cell created on a server that has run longer than a TTL, and a restart or failover that
/// loses nothing acknowledged ([`Durability`](crate::Durability)), pause nothing. The rule and
/// its proof are in the fleet guide's "Recovery". Tenant overrides and quota windows of a cell a
/// server lost start afresh; fencing tokens still only grow (see [`FencingToken`]).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use admission_redis::{Ceilings, LeaseRequest, Outcome, RedisAdmission, RedisAdmissionConfig};
///
/// let ceilings = Ceilings {
///     service_bytes: 8 << 30,
///     service_transfers: 256,
///     tenant_bytes: 2 << 30,
///     tenant_transfers: 64,
///     backend_transfers: 128,
/// };
/// let (host, port) = ("127.0.0.1", 6379);
/// # // The server `cargo xtask test` starts (a failure without it).
/// # let (host, port) = admission_testkit::services::redis("RedisAdmission doc");
/// let config = RedisAdmissionConfig::new(host, port, "uploads-eu-1", ceilings);
/// let fleet = RedisAdmission::connect(config).await?;
/// let request = LeaseRequest::new("upload-1", "tenant-42", "disk-a", 128 << 20, "upload");
/// // On a server that started less than a lease TTL ago (10 s by default) a new cell first
/// // recovers, since the server may have restarted empty: the wait covers that.
/// let lease = fleet.acquire(&request, Duration::from_secs(15)).await?;
/// // Pass lease.token() to the store that receives the bytes (fencing).
/// lease.release(Outcome::Completed).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisAdmission {
    pub(crate) inner: Arc<Shared>,
}

/// The Lua program behind every transition, as this build sends it to Redis (for review, and for
/// comparing its cost with another script of the same size). A build with the `test-util`
/// feature includes the test clock; `production_script_source` (feature `test-util`) gives the
/// script without it.
pub fn script_source() -> &'static str {
    crate::script::source()
}

/// The script as a build without the `test-util` feature sends it: no operation of it can move
/// the cell's clock. For tests that check so against a real server (feature `test-util`).
#[cfg(feature = "test-util")]
pub fn production_script_source() -> String {
    crate::script::production_source()
}

/// What one tenant's and one backend's view of the cell holds (see [`RedisAdmission::snapshot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The policy version in force.
    pub policy_version: u64,
    /// Occupancy of the service, the tenant and the backend asked about.
    pub occupancy: Occupancy,
    /// Leases held in the cell.
    pub leases: u64,
    /// The tenant's byte ceiling in force (its override or the default).
    pub tenant_bytes_ceiling: u64,
    /// The tenant's transfer ceiling in force.
    pub tenant_transfers_ceiling: u64,
    /// The server's clock, in milliseconds since the Unix epoch.
    pub server_time_ms: u64,
    /// Expired leases this call reaped.
    pub reaped: u64,
    /// The last fencing token issued.
    pub last_token: u64,
    /// Records in the events stream.
    pub events: u64,
    /// The cell's rates now, if it has any.
    pub rates: Option<RatesNow>,
    /// While the cell recovers (see [`AcquireError::Recovering`]): how long until it admits
    /// again.
    pub recovery_left: Option<Duration>,
}

/// A cell's rates as a snapshot saw them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RatesNow {
    /// Whole tokens left of the budget (refilled up to the snapshot).
    pub tokens_left: u64,
    /// Whole requests left.
    pub requests_left: u64,
    /// The token budget in force (per minute).
    pub tokens_per_minute: u64,
    /// The request budget in force (per minute).
    pub requests_per_minute: u64,
    /// The throttle in tenths: refills run at the budget divided by `1 + throttle_tenths / 10`
    /// (0 when healthy, at most 90).
    pub throttle_tenths: u32,
}

impl RedisAdmission {
    /// Validates `config`, connects, checks the server's eviction policy, and creates the cell
    /// (or checks that the cell's stored config fingerprint is this config's).
    ///
    /// # Errors
    ///
    /// [`ConnectError::Config`] naming the field that cannot work, [`ConnectError::Unavailable`]
    /// when the server cannot be reached, [`ConnectError::Eviction`] when it may evict keys and
    /// the config says to refuse, [`ConnectError::Mismatch`] when another instance created the
    /// cell with different ceilings.
    pub async fn connect(config: RedisAdmissionConfig) -> Result<RedisAdmission, ConnectError> {
        config.validate()?;
        let unavailable = |source| Unavailable {
            operation: "connect",
            source,
        };
        let clients = clients(&config).map_err(unavailable)?;
        let conn = manager(&clients, &config).await.map_err(unavailable)?;
        check_eviction(&conn, &config).await?;
        check_durability(&conn, &config).await?;
        let cell = Arc::new(Cell::new(config, conn, clients));
        let created = cell
            .call::<Created>(&Op::Init, cell.default_deadline())
            .await?;
        if let Answer::Mismatch(stored) = created.answer {
            return Err(ConnectError::Mismatch {
                cell: cell.config.cell.clone(),
                stored,
                ours: cell.fingerprint.clone(),
            });
        }
        Ok(RedisAdmission {
            inner: Arc::new(Shared {
                cell,
                renewals: Arc::default(),
                wakeups: Wakeups::default(),
                pending: Arc::default(),
                runtime: tokio::runtime::Handle::current(),
            }),
        })
    }

    /// The config this instance runs with.
    pub fn config(&self) -> &RedisAdmissionConfig {
        &self.inner.cell.config
    }

    /// One attempt: a lease now, or [`AcquireError::Full`] naming the dimension without room.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Never`] for a request that can never fit, [`AcquireError::Full`] when it
    /// does not fit now, [`AcquireError::Unavailable`] when Redis did not answer within one
    /// `connect_timeout` plus one `response_timeout`, retries included (fail closed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future, or an `Unavailable` answer, leaves nothing held: a call that may
    /// have run on the server is withdrawn on a spawned task (retried until the lease TTL), and a
    /// lease it was granted is released as interrupted.
    pub async fn try_acquire(&self, request: &LeaseRequest) -> Result<Lease, AcquireError> {
        let result = crate::line::try_acquire(&self.inner, request).await;
        record(request, &result);
        result
    }

    /// A lease, waiting at most `wait` in the cell's one line, shared by every instance (and
    /// through a recovery, see [`AcquireError::Recovering`]).
    ///
    /// # Fairness
    ///
    /// A request that does not fit takes a ticket (atomically with its `queued` event). The first
    /// ticket is the head: its demand is set aside, so a later, smaller request goes ahead only if
    /// it fits beside it on every dimension they share and needs nothing the head is short on
    /// (EASY backfilling, as the monitor does in one process). A release, an expiry or a policy
    /// change hands capacity to the waiters in ticket order inside the same script call, and
    /// writes each grant to the notices of the waiter's instance, whose one reader tells the
    /// local waiter (other instances read nothing of it). No polling: besides that, a
    /// waiter asks again only at its deadline, at the earliest lease expiry (reaping is lazy) and
    /// to renew its ticket's liveness (every `renew_every`; a crashed waiter's ticket runs out
    /// after the lease TTL and cannot hold the head).
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](RedisAdmission::try_acquire), with [`AcquireError::TimedOut`] in
    /// place of `Full` once the wait is over (the ticket is withdrawn with a `timed_out` event; a
    /// grant that landed first is returned instead). A failure on the connection is retried
    /// until the wait is over: [`AcquireError::Unavailable`] means Redis did not answer in all
    /// that time.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point withdraws its ticket on a spawned task, releasing a
    /// grant that landed meanwhile (or that a call whose reply was never read made) as
    /// interrupted.
    pub async fn acquire(
        &self,
        request: &LeaseRequest,
        wait: Duration,
    ) -> Result<Lease, AcquireError> {
        let result = crate::line::acquire(&self.inner, request, wait).await;
        record(request, &result);
        result
    }

    /// The occupancy of the service, `tenant` and `backend`, the policy in force, and a
    /// bounded reaping pass.
    ///
    /// # Errors
    ///
    /// [`Unavailable`] when Redis fails.
    pub async fn snapshot(&self, tenant: &str, backend: &str) -> Result<Snapshot, Unavailable> {
        let cell = &self.inner.cell;
        let (tenant, backend) = (hashed_id(tenant), hashed_id(backend));
        let op = Op::Snapshot {
            tenant: &tenant,
            backend: &backend,
        };
        let called = cell
            .call::<SnapshotReply>(&op, cell.default_deadline())
            .await?;
        match called.answer {
            Answer::Reply(s) => Ok(Snapshot {
                policy_version: s.policy_version,
                occupancy: s.occupancy,
                leases: s.leases,
                tenant_bytes_ceiling: s.tenant_bytes_ceiling,
                tenant_transfers_ceiling: s.tenant_transfers_ceiling,
                server_time_ms: s.server_time_ms,
                reaped: s.reaped,
                last_token: s.last_token,
                events: s.events,
                rates: s.rates.map(|r| RatesNow {
                    tokens_left: r[0],
                    requests_left: r[1],
                    tokens_per_minute: r[2],
                    requests_per_minute: r[3],
                    throttle_tenths: u32::try_from(r[4]).unwrap_or(u32::MAX),
                }),
                recovery_left: s
                    .recovering_until_ms
                    .map(|until| Duration::from_millis(until.saturating_sub(s.server_time_ms))),
            }),
            Answer::Mismatch(stored) => Err(Unavailable::unexpected(
                "snapshot",
                format!("the cell's config fingerprint changed to {stored}"),
            )),
        }
    }

    /// When the cell admits again, if it is recovering now (see [`AcquireError::Recovering`]):
    /// for a readiness probe, which should report the instance unready until then. One call of
    /// the script, as [`snapshot`](RedisAdmission::snapshot); the instant is on the local clock,
    /// counted from when the answer came back, so it is never earlier than the server's end.
    ///
    /// # Errors
    ///
    /// [`Unavailable`] when Redis fails.
    pub async fn recovering_until(&self) -> Result<Option<std::time::Instant>, Unavailable> {
        let snapshot = self.snapshot("", "").await?;
        let received = std::time::Instant::now();
        Ok(snapshot.recovery_left.map(|left| received + left))
    }

    /// Sets `tenant`'s ceilings live, for every instance of the cell; returns the new policy
    /// version, greater than every earlier one.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] for 0 or a figure over the service's ceiling.
    pub async fn set_tenant_override(
        &self,
        tenant: &str,
        bytes: u64,
        transfers: u64,
    ) -> Result<u64, PolicyError> {
        let c = self.inner.cell.config.ceilings;
        if bytes == 0 || bytes > c.service_bytes {
            return Err(PolicyError::Invalid {
                field: "bytes",
                value: bytes,
                max: c.service_bytes,
            });
        }
        if transfers == 0 || transfers > c.service_transfers {
            return Err(PolicyError::Invalid {
                field: "transfers",
                value: transfers,
                max: c.service_transfers,
            });
        }
        self.policy(tenant, Some((bytes, transfers))).await
    }

    /// The upstream answered 429 (too many requests): the cell's rates slow down for every
    /// instance, by the local token bucket's rule (the throttle rises by 0.5, at most to 9.0;
    /// refills run at the budget divided by `1 + throttle`). Returns the throttle.
    ///
    /// # Errors
    ///
    /// [`PolicyError::NoRates`] for a cell without rates, [`PolicyError::Unavailable`] when
    /// Redis fails.
    pub async fn record_429(&self) -> Result<f64, PolicyError> {
        self.feedback(1).await
    }

    /// The upstream asked the fleet to yield with weight `increments` (1 for a 429, 0 says
    /// nothing and changes nothing): the throttle rises by 0.5 per increment. Returns the
    /// throttle.
    ///
    /// # Errors
    ///
    /// As [`record_429`](RedisAdmission::record_429).
    pub async fn record_backpressure(&self, increments: u32) -> Result<f64, PolicyError> {
        if increments == 0 {
            return self.snapshot_throttle().await;
        }
        self.feedback(increments).await
    }

    /// A call succeeded: relieves the throttle (0.2 every third success, or 0.5 per success
    /// once five minutes of server time have passed without backpressure). Returns the
    /// throttle.
    ///
    /// # Errors
    ///
    /// As [`record_429`](RedisAdmission::record_429).
    pub async fn record_success(&self) -> Result<f64, PolicyError> {
        self.feedback(0).await
    }

    async fn snapshot_throttle(&self) -> Result<f64, PolicyError> {
        if self.inner.cell.config.rates.is_none() {
            return Err(PolicyError::NoRates);
        }
        let snapshot = self.snapshot("", "").await?;
        Ok(snapshot
            .rates
            .map_or(0.0, |r| f64::from(r.throttle_tenths) / 10.0))
    }

    async fn feedback(&self, increments: u32) -> Result<f64, PolicyError> {
        let cell = &self.inner.cell;
        if cell.config.rates.is_none() {
            return Err(PolicyError::NoRates);
        }
        let op = Op::Feedback { increments };
        let called = cell.call::<Throttled>(&op, cell.default_deadline()).await?;
        match called.answer {
            Answer::Reply(Throttled(tenths)) => Ok(tenths as f64 / 10.0),
            Answer::Mismatch(stored) => Err(PolicyError::Mismatch { stored }),
        }
    }

    /// New budgets for the cell's rates, for every instance (a provider's rate-limit headers
    /// read by any member, say): the levels are first refilled at the old budgets; a budget
    /// that shrank lowers its level to the new budget; the throttle is kept. Returns the policy
    /// version: a new one, greater than every earlier one, when anything changed; the same
    /// budgets again change nothing.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Invalid`] for a budget of 0 or over 2^53, [`PolicyError::NoRates`] for a
    /// cell without rates, [`PolicyError::Unavailable`] when Redis fails.
    pub async fn update_rates(
        &self,
        tokens_per_minute: u64,
        requests_per_minute: u64,
    ) -> Result<u64, PolicyError> {
        if self.inner.cell.config.rates.is_none() {
            return Err(PolicyError::NoRates);
        }
        for (field, value) in [
            ("tokens_per_minute", tokens_per_minute),
            ("requests_per_minute", requests_per_minute),
        ] {
            if value == 0 || value > crate::config::MAX_EXACT {
                return Err(PolicyError::Invalid {
                    field,
                    value,
                    max: crate::config::MAX_EXACT,
                });
            }
        }
        self.versioned(&Op::Rates {
            tokens_per_minute,
            requests_per_minute,
        })
        .await
    }

    /// Removes `tenant`'s override: the configured defaults apply again. Returns the new policy
    /// version.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Unavailable`] when Redis fails.
    pub async fn clear_tenant_override(&self, tenant: &str) -> Result<u64, PolicyError> {
        self.policy(tenant, None).await
    }

    async fn policy(&self, tenant: &str, limits: Option<(u64, u64)>) -> Result<u64, PolicyError> {
        let tenant = hashed_id(tenant);
        self.versioned(&Op::Policy {
            tenant: &tenant,
            limits,
        })
        .await
    }

    /// A policy change (`op`): the new policy version, or why not.
    async fn versioned(&self, op: &Op<'_>) -> Result<u64, PolicyError> {
        let cell = &self.inner.cell;
        let called = cell
            .call::<PolicyReply>(op, cell.default_deadline())
            .await?;
        match called.answer {
            Answer::Reply(PolicyReply::Version(version)) => Ok(version),
            Answer::Reply(PolicyReply::Invalid { field, value, max }) => {
                Err(PolicyError::Invalid { field, value, max })
            }
            Answer::Mismatch(stored) => Err(PolicyError::Mismatch { stored }),
        }
    }

    /// Charges one request to `tenant`'s quota for the current server-time minute.
    ///
    /// # Errors
    ///
    /// [`QuotaError::Exceeded`] with the time left in the minute, [`QuotaError::Unavailable`]
    /// when Redis fails (fail closed), [`QuotaError::NotEnabled`] without quotas.
    pub async fn charge_request(&self, tenant: &str) -> Result<QuotaUse, QuotaError> {
        let limit = self.quotas()?.requests_per_minute;
        self.charge(QuotaKind::Requests, tenant, 1, limit, 60_000)
            .await
    }

    /// Charges `bytes` delivered to `tenant`'s quota for the current server-time hour, just
    /// before they leave.
    ///
    /// # Errors
    ///
    /// As for [`charge_request`](RedisAdmission::charge_request).
    pub async fn charge_delivered(&self, tenant: &str, bytes: u64) -> Result<QuotaUse, QuotaError> {
        let limit = self.quotas()?.bytes_per_hour;
        self.charge(QuotaKind::DeliveredBytes, tenant, bytes, limit, 3_600_000)
            .await
    }

    fn quotas(&self) -> Result<crate::config::Quotas, QuotaError> {
        self.inner.cell.config.quotas.ok_or(QuotaError::NotEnabled)
    }

    async fn charge(
        &self,
        kind: QuotaKind,
        tenant: &str,
        amount: u64,
        limit: u64,
        window_ms: u64,
    ) -> Result<QuotaUse, QuotaError> {
        let cell = &self.inner.cell;
        let tenant = hashed_id(tenant);
        let op = Op::Quota {
            kind: if kind == QuotaKind::Requests {
                "r"
            } else {
                "b"
            },
            tenant: &tenant,
            amount: amount.min(MAX_EXACT),
            limit,
            window_ms,
        };
        let called = cell
            .call::<QuotaReply>(&op, cell.default_deadline())
            .await?;
        match called.answer {
            Answer::Reply(QuotaReply::Charged { used, left }) => Ok(QuotaUse {
                used,
                limit,
                window_left: left,
            }),
            Answer::Reply(QuotaReply::Over { used, left }) => Err(QuotaError::Exceeded {
                kind,
                used,
                asked: amount,
                limit,
                retry_after: whole_seconds(left),
            }),
            Answer::Mismatch(stored) => Err(QuotaError::Mismatch { stored }),
        }
    }

    /// Releases lease `id` held with `token` on behalf of its holder (an operator's tool, or a
    /// holder that lost its [`Lease`] value). The holder sees the loss at its next renewal.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Lost`] when no such lease is held, [`LeaseError::Stale`] when `token` is
    /// not the one it is held with.
    pub async fn release_lease(
        &self,
        id: &str,
        token: FencingToken,
        outcome: Outcome,
    ) -> Result<(), LeaseError> {
        let cell = &self.inner.cell;
        let deadline = tokio::time::Instant::now() + cell.config.lease_ttl;
        give_back(cell, id, token, Return::plain(outcome), deadline).await
    }

    /// Moves the cell's clock forward by `by`, as a fake clock would: expiries, quota windows
    /// and tokens all read the server's time plus this skew. For tests (feature `test-util`;
    /// the script of a build without it has no such operation); there is no way back.
    ///
    /// # Errors
    ///
    /// [`Unavailable`] when Redis fails.
    #[cfg(feature = "test-util")]
    pub async fn advance_server_clock(&self, by: Duration) -> Result<(), Unavailable> {
        let cell = &self.inner.cell;
        let op = Op::Skew {
            by_ms: u64::try_from(by.as_millis()).unwrap_or(u64::MAX),
        };
        match cell
            .call::<crate::script::Skewed>(&op, cell.default_deadline())
            .await?
            .answer
        {
            Answer::Reply(_) => Ok(()),
            Answer::Mismatch(stored) => Err(Unavailable::unexpected(
                "skew",
                format!("the cell's config fingerprint changed to {stored}"),
            )),
        }
    }

    /// Runs the background renewal now for every lease this instance holds (one batched call),
    /// instead of when each falls due. For tests (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub async fn renew_all_now(&self) {
        crate::renewal::renew_all_now(&self.inner.cell, &self.inner.renewals).await;
    }

    /// Waits until every release and withdrawal this instance spawned for a dropped
    /// [`Lease`] or a dropped [`acquire`](RedisAdmission::acquire) has reached Redis (or failed;
    /// the TTL then takes what is left). Call it before a process exits after cancelling its
    /// work, so that nothing is left to the TTL that a release could have given back at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing.
    pub async fn settle(&self) {
        self.inner.pending.settled().await;
    }

    /// The events stream's key (read it with `XRANGE`/`XREAD`; records follow the
    /// `admission-event-v1` schema described in the crate docs).
    pub fn events_key(&self) -> &str {
        self.inner.cell.events_key()
    }

    /// Every key of the cell (all under its hash tag; each expires after the config's
    /// `cell_idle_expiry` without a call).
    pub fn keys(&self) -> Vec<String> {
        self.inner.cell.keys().to_vec()
    }
}

/// A quota charge that was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaUse {
    /// Used in the current window, this charge included.
    pub used: u64,
    /// The window's limit.
    pub limit: u64,
    /// Until the window ends, on the server's clock.
    pub window_left: Duration,
}

/// `left` in whole seconds, rounded up, at least one.
pub(crate) fn whole_seconds(left: Duration) -> Duration {
    let secs = left.as_millis().div_ceil(1000).max(1);
    Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX))
}

/// Counts an acquisition's outcome (feature `metrics`): `admission_redis_acquisitions_total`
/// labelled by operation, backend and outcome only (never the tenant).
fn record(request: &LeaseRequest, result: &Result<Lease, AcquireError>) {
    let outcome = match result {
        Ok(_) => "admitted",
        Err(AcquireError::Full { .. }) => "full",
        Err(AcquireError::TimedOut { .. }) => "timed_out",
        Err(AcquireError::Never { .. }) => "never",
        Err(AcquireError::Recovering { .. }) => "recovering",
        Err(AcquireError::Unavailable(_)) => "unavailable",
        Err(_) => "other",
    };
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "admission_redis_acquisitions_total",
        "operation" => request.operation.clone(),
        "backend" => request.backend.clone(),
        "outcome" => outcome,
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (request, outcome);
}
