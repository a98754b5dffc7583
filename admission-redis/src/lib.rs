//! Fleet-wide admission on Redis: leases that keep a service's ceilings across every process of
//! the fleet, on an engine operators already run.
//!
//! A process admits a job locally first (its own [`Monitor`](admission_core::Monitor) and byte
//! budget), then asks its *cell* in Redis for a [`Lease`]: one call of one Lua program checks and
//! reserves five dimensions at once (service bytes, service transfers, tenant bytes, tenant
//! transfers, backend transfers), decides expiry on the server's clock, reaps a bounded number of
//! expired leases, and appends an event to a bounded stream. A lease carries a [`FencingToken`]
//! that never goes backwards, renews itself in the background, is released on every exit, and
//! tells its holder when it is lost. A request that does not fit waits in the cell's one line,
//! shared by every process: the head's demand is set aside, and a release anywhere hands the
//! capacity to the waiters in the line's order (arrival, or fair shares and levels: below)
//! inside the same script call (see
//! [`RedisAdmission::acquire`]). Admission fails closed: while Redis is unreachable nothing new is
//! admitted. A call that fails on the connection (a restart, a pause, a reset) is retried until
//! its caller's own deadline, so an outage shorter than a job's wait costs it only the wait.
//! A server that restarted or failed over may have lost acknowledged writes of leases that still
//! run: the cell then recovers until one lease TTL after the loss, admitting nothing new while
//! renewals bring those leases back, so the ceilings hold across it
//! ([`AcquireError::Recovering`]); a new cell on a server up longer than a TTL, and a restart or
//! failover that loses nothing acknowledged ([`Durability`]), pause nothing
//! (`docs/guides/running-a-fleet.md`, "Recovery"). Every acquisition carries the latest server
//! time at which it may take effect, so a call held up in a stalled server takes nothing.
//!
//! # Fair shares and priority levels
//!
//! By default the line serves in arrival order. With [`RedisAdmissionConfig::fair_shares`] the
//! tenants waiting on a cell share it by their weights, whichever instance they wait on: the
//! script places each waiter by start-time fair queuing, its cost the lease's footprint (bytes,
//! or a model's tokens) over its tenant's weight. With [`RedisAdmissionConfig::levels`] a
//! waiter of a higher level ([`LeaseRequest::with_level`]) goes before every waiter of a lower
//! one. Both live in the cell's config and fingerprint (tenants as digests), so every instance
//! of a cell agrees on them; the hand-off, the head's reservation and a never-fitting request's
//! refusal are unchanged, and a tenant that was idle banks no credit. A level may reserve part
//! of the service bytes or transfers (left aside by the others while it has a waiter) or of the
//! rates (always left aside); an exempt level leaves nothing aside. A level gets its reserve of
//! a rate even while a higher level's head waits for that rate: its waiters may *dip* into it
//! beside that head, up to the reserve, and the others' grants there earn it back (see
//! [`RedisAdmissionConfig::levels`]). A cell counts no accounts by name: its cost is the
//! footprint ([`admission_core::FairShares::scarce`] is refused by
//! [`RedisAdmissionConfig::validate`]).
//! See `docs/guides/fair-shares-and-priorities.md`, "Across the fleet".
//!
//! ```
//! use admission_core::{FairShares, Level, Levels};
//! use admission_redis::{Ceilings, LeaseRequest, RedisAdmissionConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ceilings = Ceilings {
//!     service_bytes: 1 << 30,
//!     service_transfers: 64,
//!     tenant_bytes: 256 << 20,
//!     tenant_transfers: 16,
//!     backend_transfers: 32,
//! };
//! let mut config = RedisAdmissionConfig::new("127.0.0.1", 6379, "uploads-eu-1", ceilings);
//! config.fair_shares = Some(FairShares::new().weight("acme", 3)?);
//! config.levels = Some(Levels::new().level(Level::new("interactive"))?.level(Level::new("batch"))?);
//! config.validate()?;
//! // An interactive upload of acme's; a request naming no level waits at `batch`, the last.
//! let request = LeaseRequest::new("upload-7", "acme", "disk-a", 8 << 20, "upload")
//!     .with_level("interactive");
//! # drop(request);
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! Every key of a cell is `<prefix>:{<cell>}:<name>`, so the cell id is the Redis Cluster hash
//! tag and a whole transition stays in one slot: `cfg` (ceilings, config fingerprint, policy
//! version, tenant overrides, the number waiting, the server process that wrote it last and the
//! end of its recovery), `occ` (occupancy counters, lease and waiter
//! records, the last fencing token, the ticket and event counters; while a fair line is busy,
//! what each level reserving a rate has dipped there), `exp` (lease expiries, a
//! sorted set on server time), `events` (the stream), `quota` (per-tenant traffic windows),
//! `line` (waiters by ticket; in a fair line, by level, start tag and ticket), `live` (waiters'
//! liveness expiries), `fair` (in a fair line, the finish tags of tenants ahead of their
//! share). The program is a Redis
//! function library (`FUNCTION LOAD`, called with `FCALL`; loaded again by the client where it
//! is missing) named after a digest of its text. An acquisition reads and writes each hash once:
//! seven Redis calls inside one function call. Every key expires after the config's `cell_idle_expiry` without a
//! call, so a crashed fleet leaves nothing behind. Tenant and backend ids appear only as
//! SHA-256 hex digests ([`hashed_id`]); raw tenant ids never reach Redis, events or metric labels.
//!
//! # Events (`admission-event-v1`)
//!
//! Each transition appends one record to the stream (`XADD MAXLEN ~`: about the config's
//! `events_max_len` records are kept, trimmed a node at a time) with fields `v` (`admission-event-v1`), `seq` (numbers the records, so a
//! reader sees a gap trimming made), `kind` (`admitted`, `queued`, `timed_out`, `completed`,
//! `interrupted`, `failed`, `expired`, `policy_changed`, `recovering` (outcome `created`,
//! `restarted` or `promoted`), `rejoined` (a lease a renewal brought back during a recovery)), `time_ms` (server time), `lease`,
//! `token`, `tenant` and `backend` (digests), `footprint`, `operation`, `outcome` (for an
//! admission: `admitted` at the asker's own call, `handoff` when another's transition granted a
//! waiter; `abandoned` for a waiter whose liveness ran out, `late` for one whose caller's deadline
//! passed), `policy`, and `occupancy`, the five counters after the transition separated by
//! spaces (service bytes, service transfers, tenant bytes, tenant transfers, backend transfers);
//! in a cell with fair shares or levels, a waiter's and a lease's records (`queued`, `admitted`,
//! `timed_out`) also carry `level`, its rank (0 the highest). [`read_events`] parses them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// The layout, lowest first (each file imports only files above it): `config`, `error`,
// `request` (what is asked), `connection` (clients and connections), `script` (the one module
// that knows the script's KEYS, ARGV and replies, and retries through outages), `pending`,
// `renewal`, `wake` (the reader of the instance's notices), `shared` (what an instance, its
// leases and its tasks share), `lease`, `line` (an acquisition and its wait), `coordinator` (the
// public provider), `events`, `local`.
mod config;
mod connection;
mod coordinator;
mod error;
mod events;
mod lease;
mod line;
mod local;
mod pending;
mod renewal;
mod request;
mod script;
mod shared;
mod slice;
mod wake;

pub use config::{
    Burst, Ceilings, Durability, EvictionCheck, Quotas, Rates, RedisAdmissionConfig, Secret,
    TenantMode, Tls,
};
#[cfg(feature = "test-util")]
pub use coordinator::production_script_source;
pub use coordinator::{QuotaUse, RatesNow, RedisAdmission, Snapshot, script_source};
pub use error::{
    AcquireError, ConfigError, ConnectError, Dimension, LeaseError, NeverReason, PolicyError,
    QuotaError, QuotaKind, Unavailable,
};
pub use events::{FleetEvent, read_events};
pub use lease::{CallReport, Lease, Upstream};
pub use local::{FleetAdmission, FleetGrant};
pub use renewal::LossReason;
pub use request::{LeaseRequest, hashed_id};
pub use script::{FencingToken, Occupancy, Outcome};
pub use slice::{RateSlices, SliceCall, SliceConfig, SliceStats};
