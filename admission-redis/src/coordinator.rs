//! [`RedisAdmission`]: one provider instance's connection to its cell, and every operation as one
//! call of the cell's script (one round trip each).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, RedisConnectionInfo};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::config::{EvictionCheck, MAX_EXACT, RedisAdmissionConfig, hex};
use crate::error::{
    AcquireError, ConnectError, Dimension, LeaseError, NeverReason, PolicyError, QuotaError,
    QuotaKind, Unavailable,
};
use crate::lease::{FencingToken, Lease, Occupancy, Outcome};
use crate::renewal::Renewals;
use crate::wake::{StreamId, Wakeups};

/// The one Lua program of every transition (see `lease.lua`).
const SCRIPT: &str = include_str!("lease.lua");

/// A provider instance: connected to one cell of one Redis server, shared by every task of the
/// process (clone it; clones share the connection).
///
/// # Fail closed
///
/// Every operation is one script call with the config's response timeout, and the connection
/// manager makes a bounded number of reconnection attempts: while Redis is unreachable, a new
/// acquisition fails with [`AcquireError::Unavailable`] within about `response_timeout` (plus
/// `connect_timeout` per attempt), never waits for Redis to come back, and never admits.
///
/// A server that comes back *empty* (no persistence) has forgotten what was held: the next call
/// creates the cell again from its caller's config, and until the earlier holders' next renewals
/// report their leases lost (within `renew_every`), the fleet can hold more than its ceilings;
/// tenant overrides and quota windows start afresh. Fencing tokens still only grow (see
/// [`FencingToken`]), which is what protects a store through that window.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
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
/// let fleet = RedisAdmission::connect(RedisAdmissionConfig::new("127.0.0.1", 6379, "uploads", ceilings)).await?;
/// let request = LeaseRequest::new("upload-7f3a", "tenant-42", "disk-a", 128 << 20, "upload");
/// let lease = fleet.acquire(&request, Duration::from_secs(2)).await?;
/// // Pass lease.token() to the store that receives the bytes (fencing).
/// lease.release(Outcome::Completed).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisAdmission {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: RedisAdmissionConfig,
    pub(crate) fingerprint: String,
    keys: [String; 7],
    pub(crate) conn: ConnectionManager,
    pub(crate) client: Client,
    script: redis::Script,
    pub(crate) wakeups: Wakeups,
    pub(crate) renewals: Arc<Renewals>,
    pub(crate) pending: Arc<Pending>,
    pub(crate) events_key: String,
    /// The runtime `connect` ran on: renewals and the spawned give-backs run there.
    pub(crate) runtime: tokio::runtime::Handle,
}

/// The releases and withdrawals spawned for dropped leases and waits, counted so that
/// [`RedisAdmission::settle`] can wait for them.
#[derive(Default)]
pub(crate) struct Pending {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Counts one spawned task down when it ends, or when a runtime shutting down drops it.
struct Counted(Arc<Pending>);

impl Drop for Counted {
    fn drop(&mut self) {
        if self
            .0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

impl Pending {
    pub(crate) fn spawn(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let counted = Counted(self.clone());
        runtime.spawn(async move {
            let _counted = counted;
            task.await;
        });
    }

    async fn settled(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.count.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.renewals.close();
    }
}

/// The Lua program behind every transition, as sent to Redis (for review, and for comparing its
/// cost with another script of the same size).
pub fn script_source() -> &'static str {
    SCRIPT
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
}

/// One request for a fleet lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The lease id, unique while held: 1 to 128 of `[A-Za-z0-9_.:-]`.
    pub id: String,
    /// The tenant (hashed with SHA-256 before it reaches Redis).
    pub tenant: String,
    /// The physical backend (hashed likewise).
    pub backend: String,
    /// Bytes the transfer may hold in memory at once.
    pub footprint: u64,
    /// A bounded operation label, 1 to 32 of `[a-z0-9_]` (`upload`, `download`, ...).
    pub operation: String,
}

impl LeaseRequest {
    /// A request.
    pub fn new(
        id: impl Into<String>,
        tenant: impl Into<String>,
        backend: impl Into<String>,
        footprint: u64,
        operation: impl Into<String>,
    ) -> LeaseRequest {
        LeaseRequest {
            id: id.into(),
            tenant: tenant.into(),
            backend: backend.into(),
            footprint,
            operation: operation.into(),
        }
    }

    fn check(&self) -> Result<(), NeverReason> {
        let id_ok = (1..=128).contains(&self.id.len())
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
        if !id_ok {
            return Err(NeverReason::BadId(self.id.clone()));
        }
        let op_ok = (1..=32).contains(&self.operation.len())
            && self
                .operation
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !op_ok {
            return Err(NeverReason::BadOperation(self.operation.clone()));
        }
        if self.footprint == 0 {
            return Err(NeverReason::EmptyFootprint);
        }
        Ok(())
    }
}

/// The SHA-256 hex digest under which a tenant or backend id appears in keys and events.
pub fn hashed_id(id: &str) -> String {
    hex(&Sha256::digest(id.as_bytes()))
}

/// The outcome of one acquisition attempt.
pub(crate) enum Attempt {
    Admitted(Lease),
    Full {
        dimension: Dimension,
        held: u64,
        ceiling: u64,
        last_event: StreamId,
        /// When the earliest lease expires, as a local instant (reaping is lazy: whoever asks
        /// then reaps it).
        earliest_expiry: Option<Instant>,
        /// When the refusing call was sent, and the server's clock in it: the anchor from which
        /// a later grant's server time is read as a local instant.
        sent: Instant,
        server_ms: u64,
    },
}

/// The lease an `OK` reply (acquire, a claim, a withdrawal that found a grant) describes:
/// token, policy version, occupancy, expiry and server time. Its local deadline is the send time
/// plus what the server said was left, never more.
fn lease_from_reply(
    inner: &Arc<Inner>,
    request: &LeaseRequest,
    reply: &[String],
    sent: Instant,
) -> Lease {
    let left = int(reply, 8).saturating_sub(int(reply, 9));
    Lease::start(
        inner.clone(),
        request,
        FencingToken(int(reply, 1)),
        int(reply, 2),
        Occupancy::from_fields(&reply[3..8]),
        sent + Duration::from_millis(left),
    )
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
        let client = build_client(&config).map_err(unavailable("connect"))?;
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(config.reconnect_retries)
            .set_max_delay(config.connect_timeout);
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config)
            .await
            .map_err(unavailable("connect"))?;
        let fingerprint = config.fingerprint();
        let tag = format!("{}:{{{}}}", config.key_prefix, config.cell);
        let keys =
            ["cfg", "occ", "exp", "events", "quota", "line", "live"].map(|k| format!("{tag}:{k}"));
        let events_key = keys[3].clone();
        let inner = Arc::new(Inner {
            config,
            fingerprint,
            keys,
            conn,
            client,
            script: redis::Script::new(SCRIPT),
            wakeups: Wakeups::default(),
            renewals: Arc::default(),
            pending: Arc::default(),
            events_key,
            runtime: tokio::runtime::Handle::current(),
        });
        let admission = RedisAdmission { inner };
        admission.check_eviction().await?;
        match admission
            .inner
            .init()
            .await
            .map_err(unavailable("connect"))?
        {
            Ok(()) => Ok(admission),
            Err(stored) => Err(ConnectError::Mismatch {
                cell: admission.inner.config.cell.clone(),
                stored,
                ours: admission.inner.fingerprint.clone(),
            }),
        }
    }

    async fn check_eviction(&self) -> Result<(), ConnectError> {
        let mut conn = self.inner.conn.clone();
        let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(pair) => {
                let policy = pair.get(1).cloned().unwrap_or_default();
                if policy == "noeviction" {
                    return Ok(());
                }
                match self.inner.config.eviction_check {
                    EvictionCheck::Refuse => Err(ConnectError::Eviction { policy }),
                    EvictionCheck::Warn => {
                        tracing::warn!(
                            policy = %policy,
                            "admission-redis: the server may evict keys; a lost lease record would hand its capacity out twice"
                        );
                        Ok(())
                    }
                }
            }
            // Managed services often disable CONFIG: say so, and go on.
            Err(error) => {
                tracing::warn!(%error, "admission-redis: could not read maxmemory-policy; make sure it is noeviction");
                Ok(())
            }
        }
    }

    /// The config this instance runs with.
    pub fn config(&self) -> &RedisAdmissionConfig {
        &self.inner.config
    }

    /// One attempt: a lease now, or [`AcquireError::Full`] naming the dimension without room.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Never`] for a request that can never fit, [`AcquireError::Full`] when it
    /// does not fit now, [`AcquireError::Unavailable`] when Redis fails (fail closed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the script ran leaves the lease to its TTL; prefer a timeout
    /// in [`acquire`](RedisAdmission::acquire).
    pub async fn try_acquire(&self, request: &LeaseRequest) -> Result<Lease, AcquireError> {
        // Armed before the call: dropped while the script runs, the guard gives back whatever
        // the call took.
        let mut guard = Withdraw::new(&self.inner, request);
        let result = match self.attempt(request, false, &guard.nonce).await {
            Ok(Attempt::Admitted(lease)) => Ok(lease),
            Ok(Attempt::Full {
                dimension,
                held,
                ceiling,
                ..
            }) => Err(AcquireError::Full {
                dimension,
                held,
                asked: asked_on(dimension, request),
                ceiling,
            }),
            Err(error) => Err(error),
        };
        guard.disarm();
        record(request, &result);
        result
    }

    /// A lease, waiting at most `wait` (and never longer than the config's `redis_wait`) in the
    /// cell's one line, shared by every instance.
    ///
    /// # Fairness
    ///
    /// A request that does not fit takes a ticket (atomically with its `queued` event). The first
    /// ticket is the head: its demand is set aside, so a later, smaller request goes ahead only if
    /// it fits beside it on every dimension they share and needs nothing the head is short on
    /// (EASY backfilling, as the monitor does in one process). A release, an expiry or a policy
    /// change hands capacity to the waiters in ticket order inside the same script call; the
    /// process's one events reader tells the local waiter its grant. No polling: besides that, a
    /// waiter asks again only at its deadline, at the earliest lease expiry (reaping is lazy) and
    /// to renew its ticket's liveness (every `renew_every`; a crashed waiter's ticket runs out
    /// after the lease TTL and cannot hold the head).
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](RedisAdmission::try_acquire), with [`AcquireError::TimedOut`] in
    /// place of `Full` once the wait is over (the ticket is withdrawn with a `timed_out` event; a
    /// grant that landed first is returned instead).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits withdraws its ticket on a spawned task, releasing a
    /// grant that landed meanwhile as interrupted. Dropping it while the script runs leaves a
    /// granted lease to its TTL.
    pub async fn acquire(
        &self,
        request: &LeaseRequest,
        wait: Duration,
    ) -> Result<Lease, AcquireError> {
        let result = self.acquire_inner(request, wait).await;
        record(request, &result);
        result
    }

    async fn acquire_inner(
        &self,
        request: &LeaseRequest,
        wait: Duration,
    ) -> Result<Lease, AcquireError> {
        let inner = &self.inner;
        let start = Instant::now();
        let deadline = start + wait.min(inner.config.redis_wait);
        let waits = !wait.is_zero() && !inner.config.redis_wait.is_zero();
        // Registered before the first attempt: a grant from the line that the reader sees
        // before this task looks is kept for it.
        let mut slot = waits.then(|| inner.wakeups.register(&request.id));
        // Armed before the first call, with the acquisition's nonce: dropped at any await, the
        // guard withdraws the ticket or gives back a lease the acquisition was granted.
        let mut guard = Withdraw::new(inner, request);
        loop {
            let attempt = self.attempt(request, waits, &guard.nonce).await?;
            let refusal = match attempt {
                Attempt::Admitted(lease) => {
                    guard.disarm();
                    return Ok(lease);
                }
                Attempt::Full { .. } => attempt,
            };
            let Attempt::Full {
                dimension,
                held,
                ceiling,
                last_event,
                earliest_expiry,
                sent,
                server_ms,
            } = refusal
            else {
                unreachable!("matched above")
            };
            let timed_out = |now: Instant| AcquireError::TimedOut {
                waited: now - start,
                dimension,
                held,
                asked: asked_on(dimension, request),
                ceiling,
            };
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
            let until = earliest_expiry
                .map_or(deadline, |at| at.min(deadline))
                .min(now + inner.config.renew_every);
            let granted = inner
                .wakeups
                .wait_grant(inner, receiver, last_event, until)
                .await;
            if let Some(granted) = granted {
                guard.disarm();
                // The grant happened at the server's `time_ms`; this waiter's refusal was sent
                // at `sent` when the server said `server_ms`, so the lease began no earlier than
                // `sent + (time_ms - server_ms)`: its deadline counts from there.
                let began = sent + Duration::from_millis(granted.time_ms.saturating_sub(server_ms));
                return Ok(Lease::start(
                    inner.clone(),
                    request,
                    FencingToken(granted.token),
                    granted.policy_version,
                    granted.occupancy,
                    began + inner.config.lease_ttl,
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

    pub(crate) async fn attempt(
        &self,
        request: &LeaseRequest,
        queued: bool,
        nonce: &str,
    ) -> Result<Attempt, AcquireError> {
        request
            .check()
            .map_err(|reason| AcquireError::Never { reason })?;
        if request.footprint > MAX_EXACT {
            return Err(AcquireError::Never {
                reason: NeverReason::OverCeiling {
                    dimension: Dimension::ServiceBytes,
                    asked: request.footprint,
                    ceiling: self.inner.config.ceilings.service_bytes,
                },
            });
        }
        let inner = &self.inner;
        let tenant = hashed_id(&request.tenant);
        let backend = hashed_id(&request.backend);
        let sent = Instant::now();
        let reply = inner
            .call(&[
                "acquire",
                &request.id,
                &tenant,
                &backend,
                &request.footprint.to_string(),
                &request.operation,
                &inner.config.lease_ttl.as_millis().to_string(),
                &inner.config.reap_batch.to_string(),
                if queued { "1" } else { "0" },
                nonce,
            ])
            .await
            .map_err(unavailable("acquire"))?;
        let received = Instant::now();
        match reply.first().map(String::as_str) {
            Some("OK") => Ok(Attempt::Admitted(lease_from_reply(
                &self.inner,
                request,
                &reply,
                sent,
            ))),
            Some("FULL") => {
                let dimension = Dimension::parse(&reply[1]).unwrap_or(Dimension::ServiceBytes);
                let expiry_ms = reply
                    .get(5)
                    .and_then(|s| s.parse::<i64>().ok())
                    .unwrap_or(-1);
                let now_ms = reply
                    .get(6)
                    .and_then(|s| s.parse::<i64>().ok())
                    .unwrap_or(0);
                let earliest_expiry = (expiry_ms >= 0).then(|| {
                    // Wake just after the server's clock passes the expiry.
                    let left = u64::try_from(expiry_ms - now_ms).unwrap_or(0) + 1;
                    received + Duration::from_millis(left)
                });
                Ok(Attempt::Full {
                    dimension,
                    held: int(&reply, 2),
                    ceiling: int(&reply, 3),
                    last_event: StreamId::parse(&reply[4]),
                    earliest_expiry,
                    sent,
                    server_ms: u64::try_from(now_ms).unwrap_or(0),
                })
            }
            Some("NEVER") => Err(AcquireError::Never {
                reason: never(&reply),
            }),
            Some("MISMATCH") => Err(AcquireError::Mismatch {
                stored: reply.get(1).cloned().unwrap_or_default(),
                ours: inner.fingerprint.clone(),
            }),
            _ => Err(unexpected("acquire", &reply)),
        }
    }

    /// The occupancy of the service, `tenant` and `backend`, the policy in force, and a
    /// bounded reaping pass.
    ///
    /// # Errors
    ///
    /// [`Unavailable`] when Redis fails.
    pub async fn snapshot(&self, tenant: &str, backend: &str) -> Result<Snapshot, Unavailable> {
        let inner = &self.inner;
        let reply = inner
            .call(&[
                "snapshot",
                &hashed_id(tenant),
                &hashed_id(backend),
                &inner.config.reap_batch.to_string(),
            ])
            .await
            .map_err(unavailable("snapshot"))?;
        if reply.first().map(String::as_str) != Some("OK") {
            return Err(unexpected_unavailable("snapshot", &reply));
        }
        Ok(Snapshot {
            policy_version: int(&reply, 1),
            occupancy: Occupancy::from_fields(&reply[2..7]),
            leases: int(&reply, 7),
            tenant_bytes_ceiling: int(&reply, 8),
            tenant_transfers_ceiling: int(&reply, 9),
            server_time_ms: int(&reply, 10),
            reaped: int(&reply, 11),
            last_token: int(&reply, 12),
            events: int(&reply, 13),
        })
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
        let c = self.inner.config.ceilings;
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
        self.policy(tenant, &bytes.to_string(), &transfers.to_string())
            .await
    }

    /// Removes `tenant`'s override: the configured defaults apply again. Returns the new policy
    /// version.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Unavailable`] when Redis fails.
    pub async fn clear_tenant_override(&self, tenant: &str) -> Result<u64, PolicyError> {
        self.policy(tenant, "", "").await
    }

    async fn policy(&self, tenant: &str, bytes: &str, transfers: &str) -> Result<u64, PolicyError> {
        let inner = &self.inner;
        let reply = inner
            .call(&[
                "policy",
                &hashed_id(tenant),
                bytes,
                transfers,
                &inner.config.reap_batch.to_string(),
            ])
            .await
            .map_err(unavailable("policy"))?;
        match reply.first().map(String::as_str) {
            Some("OK") => Ok(int(&reply, 1)),
            Some("INVALID") => Err(PolicyError::Invalid {
                field: if reply[1] == "bytes" {
                    "bytes"
                } else {
                    "transfers"
                },
                value: int(&reply, 2),
                max: int(&reply, 3),
            }),
            Some("MISMATCH") => Err(PolicyError::Mismatch {
                stored: reply[1].clone(),
            }),
            _ => Err(PolicyError::Unavailable(unexpected_unavailable(
                "policy", &reply,
            ))),
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
        self.inner.config.quotas.ok_or(QuotaError::NotEnabled)
    }

    async fn charge(
        &self,
        kind: QuotaKind,
        tenant: &str,
        amount: u64,
        limit: u64,
        window_ms: u64,
    ) -> Result<QuotaUse, QuotaError> {
        let code = if kind == QuotaKind::Requests {
            "r"
        } else {
            "b"
        };
        let reply = self
            .inner
            .call(&[
                "quota",
                code,
                &hashed_id(tenant),
                &amount.min(MAX_EXACT).to_string(),
                &limit.to_string(),
                &window_ms.to_string(),
            ])
            .await
            .map_err(unavailable("quota"))?;
        let left = Duration::from_millis(int(&reply, 3));
        match reply.first().map(String::as_str) {
            Some("OK") => Ok(QuotaUse {
                used: int(&reply, 1),
                limit,
                window_left: left,
            }),
            Some("OVER") => Err(QuotaError::Exceeded {
                kind,
                used: int(&reply, 1),
                asked: amount,
                limit,
                retry_after: whole_seconds(left),
            }),
            Some("MISMATCH") => Err(QuotaError::Mismatch {
                stored: reply[1].clone(),
            }),
            _ => Err(QuotaError::Unavailable(unexpected_unavailable(
                "quota", &reply,
            ))),
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
        self.inner.release(id, token, outcome).await
    }

    /// Moves the cell's clock forward by `by`, as a fake clock would: expiries, quota windows
    /// and tokens all read the server's time plus this skew. For tests (feature `test-util`);
    /// there is no way back.
    ///
    /// # Errors
    ///
    /// [`Unavailable`] when Redis fails.
    #[cfg(feature = "test-util")]
    pub async fn advance_server_clock(&self, by: Duration) -> Result<(), Unavailable> {
        let reply = self
            .inner
            .call(&["skew", &by.as_millis().to_string()])
            .await
            .map_err(unavailable("skew"))?;
        match reply.first().map(String::as_str) {
            Some("OK") => Ok(()),
            _ => Err(unexpected_unavailable("skew", &reply)),
        }
    }

    /// Runs the background renewal now for every lease this instance holds (one batched call),
    /// instead of when each falls due. For tests (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub async fn renew_all_now(&self) {
        crate::renewal::renew_all_now(&self.inner).await;
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
        &self.inner.events_key
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

impl Inner {
    /// Runs the script; a cell that is gone (a server restarted empty) is created again from
    /// this instance's config and the call repeated once.
    pub(crate) async fn call(&self, args: &[&str]) -> redis::RedisResult<Vec<String>> {
        let reply = self.invoke(args).await?;
        if reply.first().map(String::as_str) == Some("NOCONFIG") {
            if let Err(stored) = self.init().await? {
                return Ok(vec!["MISMATCH".into(), stored]);
            }
            return self.invoke(args).await;
        }
        Ok(reply)
    }

    async fn invoke(&self, args: &[&str]) -> redis::RedisResult<Vec<String>> {
        let mut invocation = self.script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        invocation.arg(args[0]).arg(&self.fingerprint);
        for arg in &args[1..] {
            invocation.arg(*arg);
        }
        let mut conn = self.conn.clone();
        invocation.invoke_async(&mut conn).await
    }

    /// Creates the cell, or returns the fingerprint of a different config stored there.
    async fn init(&self) -> redis::RedisResult<Result<(), String>> {
        let c = self.config.ceilings;
        let reply = self
            .invoke(&[
                "init",
                &c.service_bytes.to_string(),
                &c.service_transfers.to_string(),
                &c.tenant_bytes.to_string(),
                &c.tenant_transfers.to_string(),
                &c.backend_transfers.to_string(),
                &self.config.events_max_len.to_string(),
                &self.config.lease_ttl.as_millis().to_string(),
            ])
            .await?;
        Ok(match reply.first().map(String::as_str) {
            Some("MISMATCH") => Err(reply.get(1).cloned().unwrap_or_default()),
            _ => Ok(()),
        })
    }

    /// Renews every `(id, token)` in one script call; one answer per lease, in order.
    pub(crate) async fn renew_many(
        &self,
        leases: &[(&str, FencingToken)],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        let ttl = self.config.lease_ttl.as_millis().to_string();
        let reap = self.config.reap_batch.to_string();
        let tokens: Vec<String> = leases
            .iter()
            .map(|(_, token)| token.0.to_string())
            .collect();
        let mut args: Vec<&str> = vec!["renew", &ttl, &reap];
        for ((id, _), token) in leases.iter().zip(&tokens) {
            args.push(id);
            args.push(token);
        }
        let reply = self.call(&args).await.map_err(unavailable("renew"))?;
        match reply.first().map(String::as_str) {
            Some("OK") if reply.len() == 3 + leases.len() => {}
            Some("MISMATCH") => {
                return Err(LeaseError::Mismatch {
                    stored: reply[1].clone(),
                });
            }
            _ => {
                return Err(LeaseError::Unavailable(unexpected_unavailable(
                    "renew", &reply,
                )));
            }
        }
        Ok(leases
            .iter()
            .zip(&reply[3..])
            .map(|((id, token), word)| match word.as_str() {
                "OK" => Ok(()),
                "LOST" => Err(LeaseError::Lost {
                    lease: id.to_string(),
                }),
                stale => Err(LeaseError::Stale {
                    lease: id.to_string(),
                    token: token.0,
                    current: stale.trim_start_matches("STALE:").parse().unwrap_or(0),
                }),
            })
            .collect())
    }

    pub(crate) async fn renew(&self, id: &str, token: FencingToken) -> Result<(), LeaseError> {
        let mut answers = self.renew_many(&[(id, token)]).await?;
        answers.pop().unwrap_or(Ok(()))
    }

    pub(crate) async fn release(
        &self,
        id: &str,
        token: FencingToken,
        outcome: Outcome,
    ) -> Result<(), LeaseError> {
        let reply = self
            .call(&[
                "release",
                id,
                &token.0.to_string(),
                outcome.as_str(),
                &self.config.reap_batch.to_string(),
            ])
            .await
            .map_err(unavailable("release"))?;
        lease_reply(id, token, &reply).map(|_| ())
    }

    /// Takes the acquisition `nonce` of lease `id` out of the line with a `timed_out` event; or,
    /// when it was granted meanwhile, returns that grant's reply (the lease is then the
    /// caller's).
    pub(crate) async fn withdraw(
        &self,
        id: &str,
        nonce: &str,
    ) -> Result<Option<Vec<String>>, Unavailable> {
        let reply = self
            .call(&["withdraw", id, nonce, &self.config.reap_batch.to_string()])
            .await
            .map_err(unavailable("withdraw"))?;
        Ok(match reply.first().map(String::as_str) {
            Some("OK") => Some(reply),
            _ => None,
        })
    }
}

fn lease_reply(id: &str, token: FencingToken, reply: &[String]) -> Result<(), LeaseError> {
    match reply.first().map(String::as_str) {
        Some("OK") => Ok(()),
        Some("LOST") => Err(LeaseError::Lost {
            lease: id.to_string(),
        }),
        Some("STALE") => Err(LeaseError::Stale {
            lease: id.to_string(),
            token: token.0,
            current: int(reply, 1),
        }),
        Some("MISMATCH") => Err(LeaseError::Mismatch {
            stored: reply[1].clone(),
        }),
        _ => Err(LeaseError::Unavailable(unexpected_unavailable(
            "lease", reply,
        ))),
    }
}

/// Counts an acquisition's outcome (feature `metrics`): `admission_redis_acquisitions_total`
/// labelled by operation, backend and outcome only (never the tenant).
fn record(request: &LeaseRequest, result: &Result<Lease, AcquireError>) {
    let outcome = match result {
        Ok(_) => "admitted",
        Err(AcquireError::Full { .. }) => "full",
        Err(AcquireError::TimedOut { .. }) => "timed_out",
        Err(AcquireError::Never { .. }) => "never",
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

/// What `request` adds to `dimension`.
fn asked_on(dimension: Dimension, request: &LeaseRequest) -> u64 {
    match dimension {
        Dimension::ServiceBytes | Dimension::TenantBytes => request.footprint,
        _ => 1,
    }
}

fn never(reply: &[String]) -> NeverReason {
    match reply.get(1).map(String::as_str) {
        Some("lease_id") => NeverReason::DuplicateId(reply[2].clone()),
        Some("footprint") => NeverReason::EmptyFootprint,
        Some(name) => NeverReason::OverCeiling {
            dimension: Dimension::parse(name).unwrap_or(Dimension::ServiceBytes),
            asked: int(reply, 2),
            ceiling: int(reply, 3),
        },
        None => NeverReason::EmptyFootprint,
    }
}

pub(crate) fn int(reply: &[String], at: usize) -> u64 {
    reply
        .get(at)
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
}

pub(crate) fn unavailable(operation: &'static str) -> impl Fn(redis::RedisError) -> Unavailable {
    move |source| Unavailable { operation, source }
}

fn unexpected_unavailable(operation: &'static str, reply: &[String]) -> Unavailable {
    Unavailable {
        operation,
        source: redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected script reply",
            format!("{reply:?}"),
        )),
    }
}

fn unexpected(operation: &'static str, reply: &[String]) -> AcquireError {
    AcquireError::Unavailable(unexpected_unavailable(operation, reply))
}

/// Builds the client from parts: the password goes into `RedisConnectionInfo` (whose `Debug`
/// redacts it), never into a URL string.
fn build_client(config: &RedisAdmissionConfig) -> redis::RedisResult<Client> {
    let mut redis_info = RedisConnectionInfo::default().set_db(config.db);
    if let Some(user) = &config.username {
        redis_info = redis_info.set_username(user);
    }
    if let Some(password) = &config.password {
        redis_info = redis_info.set_password(password.expose());
    }
    match &config.tls {
        None => {
            let info = into_info(ConnectionAddr::Tcp(config.host.clone(), config.port))?
                .set_redis_settings(redis_info);
            Client::open(info)
        }
        Some(tls) => tls_client(config, tls, redis_info),
    }
}

fn into_info(addr: ConnectionAddr) -> redis::RedisResult<ConnectionInfo> {
    redis::IntoConnectionInfo::into_connection_info(addr)
}

#[cfg(feature = "tls")]
fn tls_client(
    config: &RedisAdmissionConfig,
    tls: &crate::config::Tls,
    redis_info: RedisConnectionInfo,
) -> redis::RedisResult<Client> {
    let addr = ConnectionAddr::TcpTls {
        host: config.host.clone(),
        port: config.port,
        insecure: !tls.verify,
        tls_params: None,
    };
    let info = into_info(addr)?.set_redis_settings(redis_info);
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: tls.root_cert_pem.clone(),
    };
    Client::build_with_tls(info, certs)
}

#[cfg(not(feature = "tls"))]
fn tls_client(
    _config: &RedisAdmissionConfig,
    _tls: &crate::config::Tls,
    _redis_info: RedisConnectionInfo,
) -> redis::RedisResult<Client> {
    Err(redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "TLS is configured but admission-redis was built without its `tls` feature",
    )))
}

/// A connection of its own for blocking reads: no response timeout (`XREAD BLOCK`).
pub(crate) async fn blocking_connection(
    inner: &Inner,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(inner.config.connect_timeout))
        .set_response_timeout(None);
    inner
        .client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// An acquisition in progress, by its nonce: when it ends without handing a lease to its caller,
/// whatever it left in Redis is withdrawn (its ticket, with a `timed_out` event) or given back
/// (a lease granted to it whose reply it never read, released as interrupted). Dropped while
/// armed, it does that on a spawned task, counted by [`RedisAdmission::settle`].
struct Withdraw<'a> {
    inner: &'a Arc<Inner>,
    request: &'a LeaseRequest,
    nonce: String,
    armed: bool,
}

impl<'a> Withdraw<'a> {
    fn new(inner: &'a Arc<Inner>, request: &'a LeaseRequest) -> Withdraw<'a> {
        Withdraw {
            inner,
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
        let sent = Instant::now();
        let reply = self.inner.withdraw(&self.request.id, &self.nonce).await?;
        self.armed = false;
        Ok(reply.map(|reply| lease_from_reply(self.inner, self.request, &reply, sent)))
    }
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let inner = self.inner.clone();
        let id = self.request.id.clone();
        let nonce = std::mem::take(&mut self.nonce);
        let pending = self.inner.pending.clone();
        pending.spawn(&self.inner.runtime, async move {
            match inner.withdraw(&id, &nonce).await {
                Ok(Some(reply)) => {
                    let token = FencingToken(int(&reply, 1));
                    let _ = inner.release(&id, token, Outcome::Interrupted).await;
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(%error, lease = %id, "admission-redis: withdraw failed; the ticket's liveness and the TTL take back what is left");
                }
            }
        });
    }
}
