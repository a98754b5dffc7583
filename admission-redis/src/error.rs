//! Typed errors: every refusal names the dimension and the numbers, every failure says which
//! operation met it. None of them carries the password (the connection is built from parts).

use std::fmt;
use std::time::Duration;

/// One of the five dimensions an acquisition checks, in the order it checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dimension {
    /// Bytes held by every lease of the cell.
    ServiceBytes,
    /// Leases held in the cell.
    ServiceTransfers,
    /// Bytes held by the tenant's leases.
    TenantBytes,
    /// Leases held by the tenant.
    TenantTransfers,
    /// Leases held on the backend.
    BackendTransfers,
    /// Tokens spent of the cell's per-minute token budget (a cell with
    /// [`Rates`](crate::Rates)): held is what is spent, the ceiling the budget.
    TokensPerMinute,
    /// Requests spent of the cell's per-minute request budget.
    RequestsPerMinute,
}

impl Dimension {
    /// The dimension's wire and log name (`service_bytes`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::ServiceBytes => "service_bytes",
            Dimension::ServiceTransfers => "service_transfers",
            Dimension::TenantBytes => "tenant_bytes",
            Dimension::TenantTransfers => "tenant_transfers",
            Dimension::BackendTransfers => "backend_transfers",
            Dimension::TokensPerMinute => "tokens_per_minute",
            Dimension::RequestsPerMinute => "requests_per_minute",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Dimension> {
        Some(match name {
            "service_bytes" => Dimension::ServiceBytes,
            "service_transfers" => Dimension::ServiceTransfers,
            "tenant_bytes" => Dimension::TenantBytes,
            "tenant_transfers" => Dimension::TenantTransfers,
            "backend_transfers" => Dimension::BackendTransfers,
            "tokens_per_minute" => Dimension::TokensPerMinute,
            "requests_per_minute" => Dimension::RequestsPerMinute,
            _ => return None,
        })
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A config that cannot work, refused at construction.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("admission-redis config: `{field}` {reason}")]
pub struct ConfigError {
    field: &'static str,
    reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            field,
            reason: reason.into(),
        }
    }

    /// The field at fault (`lease_ttl`, `ceilings.tenant_bytes`, ...).
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why it cannot work.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// Redis could not be reached or answered with an error: the operation did not happen (or, for a
/// release, may not have; the TTL then takes the lease back).
#[derive(Debug, thiserror::Error)]
#[error("admission-redis: {operation} failed on the coordinator: {source}")]
pub struct Unavailable {
    /// The operation (`acquire`, `renew`, `release`, ...).
    pub operation: &'static str,
    /// What the client said.
    #[source]
    pub source: redis::RedisError,
}

impl Unavailable {
    /// An answer that is not one the operation expects.
    pub(crate) fn unexpected(operation: &'static str, detail: String) -> Unavailable {
        Unavailable {
            operation,
            source: redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected script reply",
                detail,
            )),
        }
    }
}

/// Why [`RedisAdmission::connect`](crate::RedisAdmission::connect) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The config cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server could not be reached or refused the connection.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The server may evict keys (`maxmemory-policy` is not `noeviction`).
    #[error(
        "admission-redis: the server's maxmemory-policy is {policy:?}, not \"noeviction\": an evicted lease record would hand its capacity out twice"
    )]
    Eviction {
        /// The policy the server reported.
        policy: String,
    },
    /// Another instance created this cell with different ceilings, quotas or stream bound.
    #[error(
        "admission-redis: cell {cell:?} runs with config fingerprint {stored}, this instance has {ours}: two instances of one cell must enforce the same ceilings"
    )]
    Mismatch {
        /// The cell.
        cell: String,
        /// The fingerprint stored in Redis.
        stored: String,
        /// This instance's.
        ours: String,
    },
}

/// Why an acquisition did not produce a lease.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The request can never be admitted as the cell is configured; waiting would not help.
    #[error("admission-redis: lease refused for good: {reason}")]
    Never {
        /// Why, with the numbers.
        reason: NeverReason,
    },
    /// No room now (from `try_acquire`), on `dimension`.
    #[error(
        "admission-redis: no room on {dimension}: {held} held + {asked} asked > ceiling {ceiling}{}",
        retry_in.map_or(String::new(), |d| format!("; the rates have room in {d:?}"))
    )]
    Full {
        /// The first dimension without room.
        dimension: Dimension,
        /// What the dimension held at the time.
        held: u64,
        /// What this request adds to it.
        asked: u64,
        /// Its ceiling.
        ceiling: u64,
        /// With [`Rates`](crate::Rates), when they are short: how long until they have room for
        /// this request (on the server's clock; a release of another lease does not shorten it,
        /// a refund or a raised budget may).
        retry_in: Option<Duration>,
    },
    /// Waited `waited` without room; the last refusal's numbers.
    #[error(
        "admission-redis: timed out after {waited:?} waiting for {dimension}: {held} held + {asked} asked > ceiling {ceiling}"
    )]
    TimedOut {
        /// How long it waited.
        waited: Duration,
        /// The dimension without room at the last attempt.
        dimension: Dimension,
        /// What it held.
        held: u64,
        /// What this request adds to it.
        asked: u64,
        /// Its ceiling.
        ceiling: u64,
    },
    /// The cell is recovering (the server may have lost acknowledged writes: it restarted or
    /// failed over, or the cell was created on a server that started less than a lease TTL ago):
    /// it admits nothing new for `left` more while holders of leases from before renew them
    /// back. From `try_acquire`, or from `acquire` when its wait ended before the recovery did.
    /// [`RedisAdmission::recovering_until`](crate::RedisAdmission::recovering_until) gives the end
    /// to a readiness probe.
    #[error(
        "admission-redis: the cell admits nothing new for {left:?} more (admission resumes then): it is recovering the leases a restart or a failover may have lost"
    )]
    Recovering {
        /// Until the recovery ends, as the server counted it when it refused.
        left: Duration,
    },
    /// The coordinator failed: admission fails closed.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// Another instance re-created the cell with a different config.
    #[error(
        "admission-redis: the cell's config fingerprint is now {stored}, this instance has {ours}"
    )]
    Mismatch {
        /// The fingerprint stored in Redis.
        stored: String,
        /// This instance's.
        ours: String,
    },
    /// The local part of a fleet admission failed (see [`FleetAdmission`](crate::FleetAdmission)).
    #[error("admission-redis: local admission failed: {0}")]
    Local(#[from] admission_core::AdmitError),
}

impl AcquireError {
    /// Whether trying again cannot help (a request that never fits, a config mismatch).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            AcquireError::Never { .. } | AcquireError::Mismatch { .. }
        )
    }
}

/// Why a request can never be admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NeverReason {
    /// The footprint is 0 bytes.
    #[error("footprint is 0 bytes")]
    EmptyFootprint,
    /// The request spends no requests of the rates, or more than 2^53.
    #[error("a lease spends 1 to 2^53 requests of the rates")]
    NoRequests,
    /// The footprint (or, on `RequestsPerMinute`, the requests) is over a ceiling: a byte
    /// ceiling (the tenant's including its override), or the most a rate's level holds.
    #[error("{}", over_ceiling(*.dimension, *.asked, *.ceiling))]
    OverCeiling {
        /// `ServiceBytes`, `TenantBytes`, `TokensPerMinute` or `RequestsPerMinute`.
        dimension: Dimension,
        /// The footprint (the requests on `RequestsPerMinute`).
        asked: u64,
        /// The ceiling.
        ceiling: u64,
    },
    /// A lease with this id is already held.
    #[error("lease id {0:?} is already held")]
    DuplicateId(String),
    /// The lease id is not 1 to 128 of `[A-Za-z0-9_.:-]`.
    #[error("lease id {0:?} is not 1 to 128 of [A-Za-z0-9_.:-]")]
    BadId(String),
    /// The operation label is not 1 to 32 of `[a-z0-9_]`.
    #[error("operation {0:?} is not 1 to 32 of [a-z0-9_]")]
    BadOperation(String),
    /// The request names a priority level the cell's config does not declare (or the cell
    /// has no levels).
    #[error("no priority level is named {level:?} in this cell (declared: {known})")]
    UnknownLevel {
        /// The level named.
        level: String,
        /// The levels declared, comma-separated (`none` without levels).
        known: String,
    },
}

/// Why a renewal or a release did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease is gone: reaped after its TTL, or released by someone else.
    #[error("admission-redis: lease {lease:?} is lost (expired or released elsewhere)")]
    Lost {
        /// The lease id.
        lease: String,
    },
    /// A newer lease holds this id: this holder's token is stale.
    #[error(
        "admission-redis: lease {lease:?} token {token} is stale; the id is now held with token {current}"
    )]
    Stale {
        /// The lease id.
        lease: String,
        /// This holder's token.
        token: u64,
        /// The token that holds it now.
        current: u64,
    },
    /// The coordinator failed.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The cell's config changed under this instance.
    #[error("admission-redis: the cell's config fingerprint changed to {stored}")]
    Mismatch {
        /// The fingerprint stored in Redis.
        stored: String,
    },
}

/// Why a quota charge was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// Over the quota for this window.
    #[error(
        "admission-redis: {kind} quota exceeded: {used} used + {asked} asked > {limit} this window; retry after {retry_after:?}"
    )]
    Exceeded {
        /// Which quota.
        kind: QuotaKind,
        /// Used in the current window.
        used: u64,
        /// This charge.
        asked: u64,
        /// The window's limit.
        limit: u64,
        /// Until the window ends: whole seconds, rounded up, at least 1 s.
        retry_after: Duration,
    },
    /// Quotas are not enabled in the config.
    #[error("admission-redis: traffic quotas are not enabled")]
    NotEnabled,
    /// The coordinator failed: the charge fails closed.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The cell's config changed under this instance.
    #[error("admission-redis: the cell's config fingerprint changed to {stored}")]
    Mismatch {
        /// The fingerprint stored in Redis.
        stored: String,
    },
}

impl QuotaError {
    /// When to try again, for [`QuotaError::Exceeded`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            QuotaError::Exceeded { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Which traffic quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// Requests per server-time minute.
    Requests,
    /// Delivered bytes per server-time hour.
    DeliveredBytes,
}

impl fmt::Display for QuotaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuotaKind::Requests => "requests-per-minute",
            QuotaKind::DeliveredBytes => "delivered-bytes-per-hour",
        })
    }
}

/// Why a policy change was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// An override over the service's ceiling, or 0; or a rate budget of 0 or over 2^53.
    #[error("admission-redis: `{field}` = {value} is not within 1..={max}")]
    Invalid {
        /// `bytes` or `transfers` (a tenant override), `tokens_per_minute` or
        /// `requests_per_minute` (the rates).
        field: &'static str,
        /// The value asked.
        value: u64,
        /// The service's ceiling.
        max: u64,
    },
    /// The cell has no rates to change (its config has none).
    #[error("admission-redis: the cell has no rates (its config's `rates` is None)")]
    NoRates,
    /// The coordinator failed.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The cell's config changed under this instance.
    #[error("admission-redis: the cell's config fingerprint changed to {stored}")]
    Mismatch {
        /// The fingerprint stored in Redis.
        stored: String,
    },
}

/// An over-ceiling refusal in words: what was asked on `dimension`, and its ceiling.
fn over_ceiling(dimension: Dimension, asked: u64, ceiling: u64) -> String {
    let what = match dimension {
        Dimension::RequestsPerMinute => format!("{asked} requests are"),
        Dimension::TokensPerMinute => format!("footprint {asked} tokens is"),
        _ => format!("footprint {asked} bytes is"),
    };
    format!("{what} over the {dimension} ceiling of {ceiling}")
}
