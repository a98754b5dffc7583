//! The cell's script client: the one module that knows the positions of the script's KEYS and
//! ARGV and the shape of its replies (`lease.lua`). An operation goes out as an [`Op`] and comes
//! back decoded once, here, into a typed reply ([`FromRedisValue`]); nothing else indexes a reply
//! by number.
//!
//! # Riding through outages
//!
//! [`Cell::call`] retries a call that failed on the connection (reset, refused, timed out, a
//! server restarting or loading its data, a cluster electing a new master) with a growing pause,
//! until the caller's deadline; only then does it fail, and nothing is ever decided without the
//! server's answer. Every operation is safe to repeat: an acquisition carries its nonce, so one
//! whose reply was lost finds its own lease or ticket again and is never granted twice; a
//! renewal and a withdrawal are idempotent; a release repeated after its first attempt failed on
//! the connection may find the lease gone, which the caller reads as released (see
//! [`Called::retried`]). A cell that is gone (a server restarted empty, or every key expired after
//! the cell's idle time) is created again from the caller's config and the call repeated.

use std::fmt;
use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};
use sha2::Digest;
use tokio::time::Instant;

use crate::config::RedisAdmissionConfig;
use crate::connection::{Clients, Conn};
use crate::error::{Dimension, NeverReason, Unavailable};

/// The library as written: the test-util parts included, its name a placeholder.
const SOURCE: &str = include_str!("lease.lua");

/// A function library as this build loads it: named after a digest of its text, so two builds
/// that send different code never replace each other's library on a shared server.
pub(crate) struct Library {
    /// The library's name, which is also its one function's name.
    pub(crate) name: String,
    /// The text sent with `FUNCTION LOAD`.
    pub(crate) code: String,
}

impl Library {
    fn named(source: &str) -> Library {
        let digest = crate::config::hex(&sha2::Sha256::digest(source.as_bytes()));
        let name = format!("admission_{}", &digest[..16]);
        Library {
            code: source.replace("__LIBRARY__", &name),
            name,
        }
    }
}

/// The library this build runs. Without the `test-util` feature the lines between the
/// `-- test-util begin` and `-- test-util end` markers are left out, so nothing in a production
/// build can move the cell's clock.
pub(crate) fn library() -> &'static Library {
    static LIBRARY: std::sync::LazyLock<Library> = std::sync::LazyLock::new(|| {
        #[cfg(feature = "test-util")]
        {
            Library::named(SOURCE)
        }
        #[cfg(not(feature = "test-util"))]
        {
            Library::named(&production(SOURCE))
        }
    });
    &LIBRARY
}

/// The library's text as this build loads it.
pub(crate) fn source() -> &'static str {
    &library().code
}

/// The library without its test-util parts: what a build without the feature loads.
#[cfg(feature = "test-util")]
pub(crate) fn production_source() -> String {
    Library::named(&production(SOURCE)).code
}

fn production(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut skipping = false;
    for line in source.lines() {
        match line.trim() {
            "-- test-util begin" => skipping = true,
            "-- test-util end" => skipping = false,
            _ if !skipping => {
                out.push_str(line);
                out.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// A fencing token: issued with each lease, greater than every token the cell issued before.
///
/// # The guarantee, and its limits
///
/// A lease is a promise on a timer: a holder paused past its TTL (a long GC pause, a frozen VM,
/// a partition) may still believe it holds a lease that was reaped and handed to someone else.
/// Renewal cannot prevent that; only the resource being written can, by remembering the greatest
/// token it has accepted and refusing writes that carry a smaller one (Kleppmann, "How to do
/// distributed locking", 2016). Pass [`Lease::token`](crate::Lease::token) with every write to the downstream store,
/// and have the store compare-and-set its highest token seen.
///
/// The script issues `max(last + 1, server time in microseconds)`. The counter survives as
/// long as Redis keeps the key; when Redis restarts empty or fails over to a replica that lost
/// the last writes, the server's clock carries the order instead, and the cell's recovery (no
/// grant until one lease TTL after the loss) puts every new token at least a TTL of
/// microseconds past the old ones. Tokens therefore never go back unless **both** the counter is
/// lost **and** the new server's clock is behind the old one's by more than a TTL (or the cell
/// issued leases faster than one per microsecond for long enough to run the counter a TTL ahead
/// of the clock). Keep server clocks synchronised (NTP) and do not move them back.
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
    /// The five counters from `fields`, in the script's order (a missing or unreadable one
    /// reads 0).
    pub(crate) fn from_fields<S: AsRef<str>>(fields: &[S]) -> Occupancy {
        let at = |i: usize| {
            fields
                .get(i)
                .and_then(|s| s.as_ref().parse().ok())
                .unwrap_or(0)
        };
        Occupancy {
            service_bytes: at(0),
            service_transfers: at(1),
            tenant_bytes: at(2),
            tenant_transfers: at(3),
            backend_transfers: at(4),
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

/// A stream record id (`ms-seq`), ordered as Redis orders them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct StreamId(pub(crate) u64, pub(crate) u64);

impl StreamId {
    pub(crate) fn parse(text: &str) -> StreamId {
        let mut parts = text.splitn(2, '-');
        let ms = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let seq = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        StreamId(ms, seq)
    }

    pub(crate) fn render(self) -> String {
        format!("{}-{}", self.0, self.1)
    }
}

/// A held lease as a renewal sends it: what the cell needs to bring it back while it recovers
/// (the lease's record, with `tenant` and `backend` as digests).
pub(crate) struct Renewing<'a> {
    pub(crate) id: &'a str,
    pub(crate) token: FencingToken,
    pub(crate) tenant: &'a str,
    pub(crate) backend: &'a str,
    pub(crate) footprint: u64,
    pub(crate) operation: &'a str,
}

/// One operation of the script, with its arguments (the TTL, the reap bound and the idle time
/// come from the cell's config).
pub(crate) enum Op<'a> {
    /// Creates the cell from the config, or reports the fingerprint stored there.
    Init,
    /// An acquisition's attempt: `tenant` and `backend` are digests; `queued` joins the line
    /// when it does not fit.
    Acquire {
        id: &'a str,
        tenant: &'a str,
        backend: &'a str,
        footprint: u64,
        /// What the lease spends of the requests per minute.
        requests: u64,
        operation: &'a str,
        queued: bool,
        nonce: &'a str,
        /// The asking provider's instance, where the hand-off's notice of a grant goes.
        instance: &'a str,
        /// When the acquisition's caller stops waiting: the call is refused on the server if it
        /// reaches it later (see [`Cell::server_ms_at`]).
        until: Instant,
        /// Its level in a fair line (0 the highest).
        rank: usize,
    },
    /// An acquisition gives up: out of the line, or its grant handed over.
    Withdraw { id: &'a str, nonce: &'a str },
    /// Renews every `(id, token)` in one call, unless it reaches the server after `until`, the
    /// earliest local deadline of the leases.
    Renew {
        leases: &'a [Renewing<'a>],
        until: Instant,
    },
    /// Gives a lease back, `unused` tokens of its footprint and `unused_requests` of its requests
    /// to the cell's rates, and what the
    /// call under it said of the upstream's load to their throttle (`Some(0)`: a success).
    Release {
        id: &'a str,
        token: FencingToken,
        outcome: Outcome,
        unused: u64,
        unused_requests: u64,
        feedback: Option<u32>,
        left: Option<u64>,
    },
    /// Backpressure for the rates' throttle: `increments` steps (a 429 is one), or a success (0).
    Feedback { increments: u32 },
    /// New budgets for the cell's rates.
    Rates {
        tokens_per_minute: u64,
        requests_per_minute: u64,
    },
    /// Occupancy as `tenant` and `backend` (digests) see it.
    Snapshot { tenant: &'a str, backend: &'a str },
    /// Sets (`Some`) or clears (`None`) a tenant's override: `(bytes, transfers)`.
    Policy {
        tenant: &'a str,
        limits: Option<(u64, u64)>,
    },
    /// Charges `amount` to a tenant's quota window (`kind`: `r` requests, `b` bytes).
    Quota {
        kind: &'static str,
        tenant: &'a str,
        amount: u64,
        limit: u64,
        window_ms: u64,
    },
    /// Moves the cell's clock forward (test-util).
    #[cfg(feature = "test-util")]
    Skew { by_ms: u64 },
}

impl Op<'_> {
    /// The operation's name, as the script and the errors call it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Init => "init",
            Op::Acquire { .. } => "acquire",
            Op::Withdraw { .. } => "withdraw",
            Op::Renew { .. } => "renew",
            Op::Release { .. } => "release",
            Op::Feedback { .. } => "feedback",
            Op::Rates { .. } => "rates",
            Op::Snapshot { .. } => "snapshot",
            Op::Policy { .. } => "policy",
            Op::Quota { .. } => "quota",
            #[cfg(feature = "test-util")]
            Op::Skew { .. } => "skew",
        }
    }

    /// When the operation's caller stops waiting for it, if it must not take effect after that.
    fn until(&self) -> Option<Instant> {
        match self {
            Op::Acquire { until, .. } | Op::Renew { until, .. } => Some(*until),
            _ => None,
        }
    }

    /// ARGV from the third on (the first two are the operation and the fingerprint); `latest` is
    /// [`until`](Op::until) on the server's clock.
    fn args(&self, config: &RedisAdmissionConfig, latest: u64) -> Vec<String> {
        let ttl = config.lease_ttl.as_millis().to_string();
        let reap = config.reap_batch.to_string();
        match self {
            Op::Init => {
                let c = config.ceilings;
                let mut args = vec![
                    c.service_bytes.to_string(),
                    c.service_transfers.to_string(),
                    c.tenant_bytes.to_string(),
                    c.tenant_transfers.to_string(),
                    c.backend_transfers.to_string(),
                    config.events_max_len.to_string(),
                    ttl,
                    config.cell_idle_expiry.as_millis().to_string(),
                    if config.recover_created_cells {
                        "1"
                    } else {
                        "0"
                    }
                    .to_string(),
                    config.rates.map_or(0, |r| r.tokens_per_minute).to_string(),
                    config
                        .rates
                        .map_or(0, |r| r.requests_per_minute)
                        .to_string(),
                    config
                        .rates
                        .map_or(60_000, |r| r.minute.as_millis())
                        .to_string(),
                    config
                        .rates
                        .and_then(|r| r.burst)
                        .map_or(0, |b| b.tokens)
                        .to_string(),
                    config
                        .rates
                        .and_then(|r| r.burst)
                        .map_or(0, |b| b.requests)
                        .to_string(),
                    config.durability.flags().to_string(),
                ];
                // The fair line: the default weight ('0': arrival order within each level),
                // then each named tenant's digest and weight.
                if config.fair_shares.is_some() || config.levels.is_some() {
                    let shares = config.fair_shares.as_ref();
                    args.push(shares.map_or(0, |s| s.weight_of(None)).to_string());
                    args.push(config.level_reserves());
                    for (tenant, weight) in shares.into_iter().flat_map(|s| s.iter()) {
                        args.push(crate::request::hashed_id(tenant));
                        args.push(weight.to_string());
                    }
                }
                args
            }
            Op::Acquire {
                id,
                tenant,
                backend,
                footprint,
                requests,
                operation,
                queued,
                nonce,
                instance,
                until: _,
                rank,
            } => vec![
                id.to_string(),
                tenant.to_string(),
                backend.to_string(),
                footprint.to_string(),
                operation.to_string(),
                ttl,
                reap,
                if *queued { "1" } else { "0" }.to_string(),
                nonce.to_string(),
                instance.to_string(),
                requests.to_string(),
                latest.to_string(),
                rank.to_string(),
            ],
            Op::Withdraw { id, nonce } => vec![id.to_string(), nonce.to_string(), reap],
            Op::Renew { leases, until: _ } => {
                let mut args = vec![ttl, reap, latest.to_string()];
                for lease in leases.iter() {
                    args.push(lease.id.to_string());
                    args.push(lease.token.0.to_string());
                    args.push(lease.tenant.to_string());
                    args.push(lease.backend.to_string());
                    args.push(lease.footprint.to_string());
                    args.push(lease.operation.to_string());
                }
                args
            }
            Op::Release {
                id,
                token,
                outcome,
                unused,
                unused_requests,
                feedback,
                left,
            } => vec![
                id.to_string(),
                token.0.to_string(),
                outcome.as_str().to_string(),
                reap,
                unused.to_string(),
                feedback.map_or(String::new(), |f| f.to_string()),
                left.map_or(String::new(), |l| l.to_string()),
                unused_requests.to_string(),
            ],
            Op::Feedback { increments } => vec![increments.to_string(), reap],
            Op::Rates {
                tokens_per_minute,
                requests_per_minute,
            } => vec![
                tokens_per_minute.to_string(),
                requests_per_minute.to_string(),
                reap,
            ],
            Op::Snapshot { tenant, backend } => {
                vec![tenant.to_string(), backend.to_string(), reap]
            }
            Op::Policy { tenant, limits } => {
                let (bytes, transfers) = match limits {
                    Some((b, t)) => (b.to_string(), t.to_string()),
                    None => (String::new(), String::new()),
                };
                vec![tenant.to_string(), bytes, transfers, reap]
            }
            Op::Quota {
                kind,
                tenant,
                amount,
                limit,
                window_ms,
            } => vec![
                kind.to_string(),
                tenant.to_string(),
                amount.to_string(),
                limit.to_string(),
                window_ms.to_string(),
            ],
            #[cfg(feature = "test-util")]
            Op::Skew { by_ms } => vec![by_ms.to_string()],
        }
    }
}

/// A lease as a grant describes it (an acquisition, a claim, a withdrawal that found a grant).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    pub(crate) token: FencingToken,
    pub(crate) policy_version: u64,
    pub(crate) occupancy: Occupancy,
    /// When the lease expires, server milliseconds.
    pub(crate) expiry_ms: u64,
    /// The server's clock in the reply.
    pub(crate) now_ms: u64,
}

impl Granted {
    /// What the server said was left of the lease.
    pub(crate) fn left(&self) -> Duration {
        Duration::from_millis(self.expiry_ms.saturating_sub(self.now_ms))
    }

    /// `OK token version o1..o5 expiry now`.
    fn decode(w: &Words) -> Option<Granted> {
        Some(Granted {
            token: FencingToken(w.int(1)?),
            policy_version: w.int(2)?,
            occupancy: Occupancy::from_fields(w.get(3..8)?),
            expiry_ms: w.int(8)?,
            now_ms: w.int(9)?,
        })
    }
}

/// A refusal for now: the first dimension without room, and when to look again.
#[derive(Clone, Debug)]
pub(crate) struct Full {
    /// `None` while the cell recovers (see `lease.lua`): it admits nothing new until
    /// `earliest_expiry_ms`, the recovery's end.
    pub(crate) dimension: Option<Dimension>,
    pub(crate) held: u64,
    pub(crate) ceiling: u64,
    /// When the earliest lease expires, server milliseconds (`None`: none is held).
    pub(crate) earliest_expiry_ms: Option<u64>,
    pub(crate) now_ms: u64,
    /// When the cell's rates will have room for this request, server milliseconds: given to the
    /// first in line (or a newcomer with nobody waiting), or to a waiter of a lower level that
    /// dips into its reserve beside the head, when the rates are short, else `None`.
    pub(crate) ready_ms: Option<u64>,
}

impl Full {
    /// The refusal as an error: no room on a dimension (`Full`, or `TimedOut` after `waited`),
    /// or a recovering cell.
    pub(crate) fn error(
        &self,
        request: &crate::request::LeaseRequest,
        waited: Option<Duration>,
    ) -> crate::error::AcquireError {
        use crate::error::AcquireError;
        let Some(dimension) = self.dimension else {
            let end = self.earliest_expiry_ms.unwrap_or(self.now_ms);
            return AcquireError::Recovering {
                left: Duration::from_millis(end.saturating_sub(self.now_ms)),
            };
        };
        let (held, asked, ceiling) = (self.held, request.asked_on(dimension), self.ceiling);
        match waited {
            None => AcquireError::Full {
                dimension,
                held,
                asked,
                ceiling,
                retry_in: self
                    .ready_ms
                    .map(|at| Duration::from_millis(at.saturating_sub(self.now_ms))),
            },
            Some(waited) => AcquireError::TimedOut {
                waited,
                dimension,
                held,
                asked,
                ceiling,
            },
        }
    }
}

/// What an acquisition's attempt got.
pub(crate) enum AcquireReply {
    Granted(Granted),
    Full(Full),
    Never(NeverReason),
}

/// What a withdrawal found.
pub(crate) enum WithdrawReply {
    /// The ticket left the line.
    Withdrawn,
    /// The acquisition had been granted: the lease is the caller's.
    Granted(Granted),
    /// Nothing of the acquisition's was there.
    Gone,
}

/// What Redis says of one held lease (a release, or one lease of a renewal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// Renewed, or released.
    Ok,
    /// Not held: expired (and reaped) or released before.
    Lost,
    /// Held by a newer lease with this token.
    Stale(u64),
}

impl Held {
    fn decode(word: &str, current: Option<&str>) -> Option<Held> {
        Some(match word {
            "OK" => Held::Ok,
            "LOST" => Held::Lost,
            "STALE" => Held::Stale(current?.parse().ok()?),
            stale => Held::Stale(stale.strip_prefix("STALE:")?.parse().ok()?),
        })
    }
}

/// A renewal's answer: one per lease, in order, and the server's clock.
pub(crate) struct Renewed(pub(crate) Vec<Held>, pub(crate) u64);

/// A snapshot's numbers (see [`Snapshot`](crate::Snapshot)).
pub(crate) struct SnapshotReply {
    pub(crate) policy_version: u64,
    pub(crate) occupancy: Occupancy,
    pub(crate) leases: u64,
    pub(crate) tenant_bytes_ceiling: u64,
    pub(crate) tenant_transfers_ceiling: u64,
    pub(crate) server_time_ms: u64,
    pub(crate) reaped: u64,
    pub(crate) last_token: u64,
    pub(crate) events: u64,
    /// With rates: tokens and requests left, the budgets, the throttle in tenths.
    pub(crate) rates: Option<[u64; 5]>,
    /// While the cell recovers: when the recovery ends, server ms.
    pub(crate) recovering_until_ms: Option<u64>,
}

/// A policy change's answer.
pub(crate) enum PolicyReply {
    /// The new policy version.
    Version(u64),
    /// A figure out of range.
    Invalid {
        field: &'static str,
        value: u64,
        max: u64,
    },
}

/// A quota charge's answer.
pub(crate) enum QuotaReply {
    Charged { used: u64, left: Duration },
    Over { used: u64, left: Duration },
}

/// A feedback's answer: the throttle in tenths.
pub(crate) struct Throttled(pub(crate) u64);

impl Decode for Throttled {
    fn decode(w: &Words) -> Option<Self> {
        (w.word(0)? == "OK").then_some(Throttled(w.int(1)?))
    }
}

/// The init's answer: the cell exists (created now, or already there with this fingerprint), and
/// the server's clock.
pub(crate) struct Created {
    pub(crate) now_ms: u64,
}

/// The skew's answer (test-util): the cell's clock after it.
#[cfg(feature = "test-util")]
pub(crate) struct Skewed(u64);

/// A script reply as a list of words, for decoding.
pub(crate) struct Words(Vec<String>);

impl Words {
    fn word(&self, at: usize) -> Option<&str> {
        self.0.get(at).map(String::as_str)
    }

    fn int(&self, at: usize) -> Option<u64> {
        self.word(at)?.parse().ok()
    }

    fn get(&self, at: std::ops::Range<usize>) -> Option<&[String]> {
        self.0.get(at)
    }
}

/// A reply type the script answers an operation with.
pub(crate) trait Decode: Sized {
    /// The reply, from its words (the status word first); `None` when they do not have its
    /// shape.
    fn decode(words: &Words) -> Option<Self>;

    /// The server's clock as the reply gives it (ms), for [`Cell::server_ms_at`].
    fn server_ms(&self) -> Option<u64> {
        None
    }
}

impl Decode for AcquireReply {
    fn server_ms(&self) -> Option<u64> {
        match self {
            AcquireReply::Granted(g) => Some(g.now_ms),
            AcquireReply::Full(f) => Some(f.now_ms),
            AcquireReply::Never(_) => None,
        }
    }

    fn decode(w: &Words) -> Option<Self> {
        Some(match w.word(0)? {
            "OK" => AcquireReply::Granted(Granted::decode(w)?),
            "FULL" => {
                let expiry: i64 = w.word(4)?.parse().ok()?;
                AcquireReply::Full(Full {
                    dimension: match w.word(1)? {
                        "recovering" => None,
                        name => Some(Dimension::parse(name)?),
                    },
                    held: w.int(2)?,
                    ceiling: w.int(3)?,
                    earliest_expiry_ms: u64::try_from(expiry).ok(),
                    now_ms: w.int(5)?,
                    ready_ms: w
                        .word(7)
                        .and_then(|r| r.parse::<i64>().ok())
                        .and_then(|r| u64::try_from(r).ok()),
                })
            }
            "NEVER" => AcquireReply::Never(match w.word(1)? {
                "lease_id" => NeverReason::DuplicateId(w.word(2)?.to_owned()),
                "footprint" => NeverReason::EmptyFootprint,
                "requests" => NeverReason::NoRequests,
                name => NeverReason::OverCeiling {
                    dimension: Dimension::parse(name)?,
                    asked: w.int(2)?,
                    ceiling: w.int(3)?,
                },
            }),
            _ => return None,
        })
    }
}

impl Decode for WithdrawReply {
    fn server_ms(&self) -> Option<u64> {
        match self {
            WithdrawReply::Granted(g) => Some(g.now_ms),
            _ => None,
        }
    }

    fn decode(w: &Words) -> Option<Self> {
        Some(match w.word(0)? {
            "WITHDRAWN" => WithdrawReply::Withdrawn,
            "OK" => WithdrawReply::Granted(Granted::decode(w)?),
            "GONE" => WithdrawReply::Gone,
            _ => return None,
        })
    }
}

impl Decode for Held {
    fn decode(w: &Words) -> Option<Self> {
        Held::decode(w.word(0)?, w.word(1))
    }
}

impl Decode for Renewed {
    fn decode(w: &Words) -> Option<Self> {
        if w.word(0)? != "OK" {
            return None;
        }
        let now_ms = w.int(1)?;
        let held =
            w.0.get(3..)?
                .iter()
                .map(|word| Held::decode(word, None))
                .collect::<Option<Vec<_>>>()?;
        Some(Renewed(held, now_ms))
    }

    fn server_ms(&self) -> Option<u64> {
        Some(self.1)
    }
}

impl Decode for SnapshotReply {
    fn decode(w: &Words) -> Option<Self> {
        if w.word(0)? != "OK" {
            return None;
        }
        Some(SnapshotReply {
            policy_version: w.int(1)?,
            occupancy: Occupancy::from_fields(w.get(2..7)?),
            leases: w.int(7)?,
            tenant_bytes_ceiling: w.int(8)?,
            tenant_transfers_ceiling: w.int(9)?,
            server_time_ms: w.int(10)?,
            reaped: w.int(11)?,
            last_token: w.int(12)?,
            events: w.int(13)?,
            rates: (14..19)
                .map(|at| w.word(at)?.parse::<f64>().ok())
                .collect::<Option<Vec<f64>>>()
                .filter(|r| r.iter().all(|x| *x >= 0.0))
                .map(|r| [0, 1, 2, 3, 4].map(|i| r[i] as u64)),
            recovering_until_ms: w.int(19).filter(|&until| until > w.int(10).unwrap_or(0)),
        })
    }

    fn server_ms(&self) -> Option<u64> {
        Some(self.server_time_ms)
    }
}

impl Decode for PolicyReply {
    fn decode(w: &Words) -> Option<Self> {
        Some(match w.word(0)? {
            "OK" => PolicyReply::Version(w.int(1)?),
            "INVALID" => PolicyReply::Invalid {
                field: match w.word(1)? {
                    "bytes" => "bytes",
                    "transfers" => "transfers",
                    "tokens_per_minute" => "tokens_per_minute",
                    "requests_per_minute" => "requests_per_minute",
                    _ => "rates",
                },
                value: w.int(2).unwrap_or(0),
                max: w.int(3)?,
            },
            _ => return None,
        })
    }
}

impl Decode for QuotaReply {
    fn decode(w: &Words) -> Option<Self> {
        let used = w.int(1)?;
        let left = Duration::from_millis(w.int(3)?);
        Some(match w.word(0)? {
            "OK" => QuotaReply::Charged { used, left },
            "OVER" => QuotaReply::Over { used, left },
            _ => return None,
        })
    }
}

impl Decode for Created {
    fn decode(w: &Words) -> Option<Self> {
        (w.word(0)? == "OK").then_some(Created { now_ms: w.int(2)? })
    }

    fn server_ms(&self) -> Option<u64> {
        Some(self.now_ms)
    }
}

#[cfg(feature = "test-util")]
impl Decode for Skewed {
    fn decode(w: &Words) -> Option<Self> {
        (w.word(0)? == "OK").then_some(Skewed(w.int(1)?))
    }

    fn server_ms(&self) -> Option<u64> {
        Some(self.0)
    }
}

/// Every reply, as the script can answer any operation: the operation's own reply, or the cell
/// missing (`NOCONFIG`), or created with another config (`MISMATCH`).
enum Raw<T> {
    Reply(T),
    NoConfig,
    Mismatch(String),
    /// The call reached the server after the latest time its caller gave (server ms): nothing
    /// was changed.
    Late {
        now_ms: u64,
        latest: u64,
    },
}

impl<T: Decode> FromRedisValue for Raw<T> {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let words = Words(Vec::<String>::from_redis_value(value)?);
        match words.word(0) {
            Some("NOCONFIG") => return Ok(Raw::NoConfig),
            Some("MISMATCH") => {
                return Ok(Raw::Mismatch(words.word(1).unwrap_or_default().to_owned()));
            }
            Some("LATE") => {
                if let (Some(now_ms), Some(latest)) = (words.int(1), words.int(2)) {
                    return Ok(Raw::Late { now_ms, latest });
                }
            }
            _ => {}
        }
        T::decode(&words)
            .map(Raw::Reply)
            .ok_or_else(|| ParsingError::from(format!("unexpected script reply {:?}", words.0)))
    }
}

/// The script's answer to one call.
pub(crate) enum Answer<T> {
    /// The operation's reply.
    Reply(T),
    /// The cell was created with another config (its fingerprint).
    Mismatch(String),
}

/// A call that got an answer.
pub(crate) struct Called<T> {
    pub(crate) answer: Answer<T>,
    /// True when an earlier attempt of this call failed on the connection: it may have run on
    /// the server all the same (a release that then finds its lease gone was released by it).
    pub(crate) retried: bool,
    /// When the attempt that answered was sent: what the server did for it happened after this
    /// instant, so a deadline counted from here is never later than the server's (an earlier
    /// attempt's send time would be, after a long outage, long before the grant).
    pub(crate) sent: Instant,
}

/// The cell's script client: the connection, the script, the cell's keys and the config they
/// were created with. Shared by every task of a provider instance, its leases and its readers.
pub(crate) struct Cell {
    pub(crate) config: RedisAdmissionConfig,
    pub(crate) fingerprint: String,
    /// The eight keys, in the script's KEYS order.
    keys: [String; 8],
    /// Cloned for each call (a handle; the clones share one connection).
    conn: parking_lot::RwLock<Conn>,
    /// When a cluster connection was last replaced (see `replace_stalled`).
    replaced: parking_lot::Mutex<Option<Instant>>,
    pub(crate) clients: Clients,
    /// The server's clock as the last reply that carried it gave it (ms), and the instant that
    /// reply was received: see [`Cell::server_ms_at`].
    clock: parking_lot::Mutex<Option<(u64, Instant)>>,
}

/// The first pause before a retry, and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_PAUSE: Duration = Duration::from_millis(250);

impl Cell {
    pub(crate) fn new(config: RedisAdmissionConfig, conn: Conn, clients: Clients) -> Cell {
        let tag = format!("{}:{{{}}}", config.key_prefix, config.cell);
        let keys = [
            "cfg", "occ", "exp", "events", "quota", "line", "live", "fair",
        ]
        .map(|k| format!("{tag}:{k}"));
        Cell {
            fingerprint: config.fingerprint(),
            config,
            keys,
            conn: parking_lot::RwLock::new(conn),
            replaced: parking_lot::Mutex::new(None),
            clients,
            clock: parking_lot::Mutex::new(None),
        }
    }

    /// The server's time (ms) no later than its clock will read at local instant `at`, from the
    /// last reply that gave it (0, which the script reads as no bound, before any reply): that
    /// reply's server time `t` was read before it was received at `r`, so at `at` the server
    /// reads at least `t + (at - r)`. An acquisition sends its deadline through this as the
    /// latest time it may take effect, so a call held up in a stalled server is refused there
    /// rather than granted to a caller that stopped waiting. It errs early by at most one round
    /// trip, never late (between clocks that run at the same rate).
    pub(crate) fn server_ms_at(&self, at: Instant) -> u64 {
        let Some((server_ms, received)) = *self.clock.lock() else {
            return 0;
        };
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        if at >= received {
            server_ms.saturating_add(ms(at - received))
        } else {
            // Never 0 (no bound) for an instant already past.
            server_ms.saturating_sub(ms(received - at)).max(1)
        }
    }

    /// The events stream's key.
    pub(crate) fn events_key(&self) -> &str {
        &self.keys[3]
    }

    /// The stream of the hand-off's notices to provider `instance` (see `wake`): the events
    /// key with its last part replaced, as the script builds it.
    pub(crate) fn notices_key(&self, instance: &str) -> String {
        let events = self.events_key();
        let tag = events.strip_suffix(":events").unwrap_or(events);
        format!("{tag}:to:{instance}")
    }

    /// Every key of the cell, in the script's KEYS order.
    pub(crate) fn keys(&self) -> &[String; 8] {
        &self.keys
    }

    /// A deadline for a call whose caller has none of its own (a snapshot, a policy change, a
    /// quota charge, the cell's creation): one connection attempt and one response.
    pub(crate) fn default_deadline(&self) -> Instant {
        Instant::now() + self.config.connect_timeout + self.config.response_timeout
    }

    /// Runs `op`, retrying a failure on the connection until `deadline` (at least one attempt
    /// is made whatever the deadline); a cell that is gone is created again and the call
    /// repeated.
    ///
    /// # Errors
    ///
    /// [`Unavailable`] with the last failure once the deadline has passed, or at once for a
    /// failure that retrying cannot mend (a script error, an unexpected reply, a refused
    /// password).
    pub(crate) async fn call<T: Decode>(
        &self,
        op: &Op<'_>,
        deadline: Instant,
    ) -> Result<Called<T>, Unavailable> {
        let (answer, retried, sent) = self
            .retrying(op.name(), deadline, || self.attempt::<T>(op, deadline))
            .await?;
        Ok(Called {
            answer,
            retried,
            sent,
        })
    }

    /// Every record of the events stream still kept, oldest first, read in pages of 500 (each a
    /// call of its own, retried as a call is, so a long stream never needs one long reply).
    pub(crate) async fn read_stream(
        &self,
        deadline: Instant,
    ) -> Result<Vec<redis::streams::StreamId>, Unavailable> {
        const PAGE: usize = 500;
        let mut records = Vec::new();
        let mut from = "-".to_string();
        loop {
            let read = || async {
                let mut command = redis::cmd("XRANGE");
                command
                    .arg(self.events_key())
                    .arg(&from)
                    .arg("+")
                    .arg("COUNT")
                    .arg(PAGE);
                let conn = self.conn.read().clone();
                let page: redis::streams::StreamRangeReply = conn.query(&command).await?;
                Ok(page)
            };
            let page = self.retrying("read_events", deadline, read).await?.0;
            let full = page.ids.len() == PAGE;
            if let Some(last) = page.ids.last() {
                // Exclusive from the last record read on.
                from = format!("({}", last.id);
            }
            records.extend(page.ids);
            if !full {
                return Ok(records);
            }
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or `deadline` passes (at least once, and
    /// once more at the deadline itself), pausing between attempts; the flag is true when some
    /// attempt failed on the connection.
    async fn retrying<T, F, Fut>(
        &self,
        operation: &'static str,
        deadline: Instant,
        mut attempt: F,
    ) -> Result<(T, bool, Instant), Unavailable>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let mut pause = FIRST_PAUSE;
        let mut retried = false;
        loop {
            let sent = Instant::now();
            let error = match attempt().await {
                Ok(value) => return Ok((value, retried, sent)),
                Err(error) => error,
            };
            let now = Instant::now();
            if !is_transient(&error) || now >= deadline {
                return Err(Unavailable {
                    operation,
                    source: error,
                });
            }
            tracing::debug!(%error, operation, "admission-redis: call failed on the connection; retrying");
            retried = true;
            // The last attempt is made at the deadline itself.
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// One attempt: the call, and the cell's creation and the call again if it is gone.
    async fn attempt<T: Decode>(
        &self,
        op: &Op<'_>,
        deadline: Instant,
    ) -> redis::RedisResult<Answer<T>> {
        match self.invoke::<T>(op, deadline).await? {
            Raw::Reply(reply) => Ok(Answer::Reply(reply)),
            Raw::Mismatch(stored) => Ok(Answer::Mismatch(stored)),
            Raw::Late { now_ms, latest } => Err(late(op, now_ms, latest)),
            Raw::NoConfig => {
                match self.invoke::<Created>(&Op::Init, deadline).await? {
                    Raw::Mismatch(stored) => return Ok(Answer::Mismatch(stored)),
                    Raw::Late { now_ms, latest } => return Err(late(op, now_ms, latest)),
                    Raw::Reply(_) | Raw::NoConfig => {}
                }
                match self.invoke::<T>(op, deadline).await? {
                    Raw::Reply(reply) => Ok(Answer::Reply(reply)),
                    Raw::Mismatch(stored) => Ok(Answer::Mismatch(stored)),
                    Raw::Late { now_ms, latest } => Err(late(op, now_ms, latest)),
                    Raw::NoConfig => Err(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "the cell is gone again right after its creation",
                    ))),
                }
            }
        }
    }

    /// One call of the library's function (`FCALL`), bounded by the connection's response
    /// timeout and by `deadline` (a call cut short by the deadline may still run on the server:
    /// every operation is safe to repeat, and an acquisition's guard withdraws what it may have
    /// left). A server without the library (a new server, one that restarted empty) gets it
    /// (`FUNCTION LOAD REPLACE`) and the call is made again. With a promise of replicas
    /// ([`Durability::replicas`](crate::Durability::replicas)) the call goes out with a `WAIT`
    /// behind it on the same connection, and counts as answered only once that many replicas
    /// have its writes.
    async fn invoke<T: Decode>(
        &self,
        op: &Op<'_>,
        deadline: Instant,
    ) -> redis::RedisResult<Raw<T>> {
        let library = library();
        let mut call = redis::cmd("FCALL");
        call.arg(&library.name)
            .arg(self.keys.len())
            .arg(&self.keys[..]);
        let latest = op.until().map_or(0, |until| self.server_ms_at(until));
        call.arg(op.name())
            .arg(&self.fingerprint)
            .arg(op.args(&self.config, latest));
        let raw: Raw<T> = match self.acknowledged(&call, deadline).await {
            Err(error) if is_missing_function(&error) => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&library.code);
                self.bounded::<String>(&load, deadline).await?;
                self.acknowledged(&call, deadline).await
            }
            result => result,
        }?;
        let server_ms = match &raw {
            Raw::Reply(reply) => reply.server_ms(),
            Raw::Late { now_ms, .. } => Some(*now_ms),
            Raw::NoConfig | Raw::Mismatch(_) => None,
        };
        if let Some(server_ms) = server_ms {
            *self.clock.lock() = Some((server_ms, Instant::now()));
        }
        Ok(raw)
    }

    /// `call`, and with a promise of replicas the `WAIT` behind it: fewer replicas than promised
    /// within half the response timeout is a failure on the connection (retried by the caller
    /// until its deadline; the call is safe to repeat).
    async fn acknowledged<T: FromRedisValue>(
        &self,
        call: &redis::Cmd,
        deadline: Instant,
    ) -> redis::RedisResult<T> {
        let replicas = self.config.durability.replicas;
        if replicas == 0 {
            return self.bounded(call, deadline).await;
        }
        let wait_ms = (self.config.response_timeout / 2).as_millis().max(1);
        let mut pipe = redis::pipe();
        pipe.add_command(call.clone())
            .cmd("WAIT")
            .arg(replicas)
            .arg(u64::try_from(wait_ms).unwrap_or(u64::MAX));
        let (reply, acked): (T, u64) = self.bounded_pipe(&pipe, deadline).await?;
        if acked < u64::from(replicas) {
            return Err(redis::RedisError::from(std::io::Error::other(format!(
                "the call's writes reached {acked} of the {replicas} replicas promised \
                 (durability.replicas) within {wait_ms} ms"
            ))));
        }
        Ok(reply)
    }

    /// One command, bounded by the connection's response timeout and by `deadline` (at least one
    /// full response time, however little is left).
    async fn bounded<T: FromRedisValue>(
        &self,
        command: &redis::Cmd,
        deadline: Instant,
    ) -> redis::RedisResult<T> {
        let conn = self.conn.read().clone();
        self.bounding(deadline, conn.query(command)).await
    }

    /// A pipeline, bounded as [`bounded`](Cell::bounded) bounds a command.
    async fn bounded_pipe<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        deadline: Instant,
    ) -> redis::RedisResult<T> {
        let conn = self.conn.read().clone();
        self.bounding(deadline, conn.query_pipe(pipe)).await
    }

    async fn bounding<T>(
        &self,
        deadline: Instant,
        query: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        let bound = deadline
            .saturating_duration_since(Instant::now())
            .max(self.config.response_timeout);
        let result = match tokio::time::timeout(bound, query).await {
            Ok(result) => result,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no reply within {bound:?}"),
            ))),
        };
        if result.as_ref().is_err_and(redis::RedisError::is_timeout) {
            self.replace_stalled().await;
        }
        result
    }

    /// After a call that got no reply on a cluster connection: a new one, built afresh from the
    /// cluster client (its own view of the slots and its own node connections), at most once per
    /// connect timeout. Through a failover, a loaded process's cluster connection was seen to
    /// stay without answers from the promoted master for seconds after the others had them;
    /// calls retried on a new connection are answered. One server's connection manager
    /// reconnects on its own and is kept.
    async fn replace_stalled(&self) {
        let Clients::Cluster(client) = &self.clients else {
            return;
        };
        {
            let mut replaced = self.replaced.lock();
            if replaced.is_some_and(|at| at.elapsed() < self.config.connect_timeout) {
                return;
            }
            *replaced = Some(Instant::now());
        }
        let fresh =
            tokio::time::timeout(self.config.connect_timeout, client.get_async_connection());
        match fresh.await {
            Ok(Ok(conn)) => {
                tracing::debug!(
                    "admission-redis: a call got no reply; the cluster connection was replaced"
                );
                *self.conn.write() = Conn::Cluster(conn);
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "admission-redis: replacing the cluster connection failed; the next timeout tries again");
            }
            Err(_) => {
                tracing::debug!(
                    "admission-redis: replacing the cluster connection timed out; the next timeout tries again"
                );
            }
        }
    }
}

/// The error of a call that reached the server after the latest time its caller gave (nothing
/// was changed). Received while the caller still waits, it was not late: the server's clock
/// moved ahead of the reading the bound came from (the reply's own reading is kept now), and the
/// call is tried again as after a failure on the connection. Received after, it was late:
/// retrying cannot help.
fn late(op: &Op<'_>, now_ms: u64, latest: u64) -> redis::RedisError {
    let detail = format!(
        "the server read {now_ms} ms, past the call's bound of {latest} ms ({} ms late)",
        now_ms.saturating_sub(latest)
    );
    if op.until().is_some_and(|until| Instant::now() < until) {
        return redis::RedisError::from(std::io::Error::other(format!(
            "the server's clock ran ahead of the last reading: {detail}"
        )));
    }
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "the call reached the server after its caller stopped waiting; nothing was changed",
        detail,
    ))
}

/// True when the server does not have the library's function (it never had it, or it restarted
/// empty, or someone flushed its functions).
fn is_missing_function(error: &redis::RedisError) -> bool {
    error.to_string().contains("Function not found")
}

/// True for a failure that a retry can mend: the connection (reset, refused, closed, timed out),
/// or a server that is loading, paused behind a failover, or electing a master. A script error,
/// an unexpected reply or a refused password is not.
pub(crate) fn is_transient(error: &redis::RedisError) -> bool {
    use redis::RetryMethod;
    if error.kind() == redis::ErrorKind::AuthenticationFailed {
        return false;
    }
    !matches!(error.retry_method(), RetryMethod::NoRetry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_production_script_has_no_test_util_line() {
        let production = production(SOURCE);
        assert!(SOURCE.contains("if op == 'skew' then"));
        // The field may be read; nothing writes it, and its value is never used.
        assert!(
            !production.contains("HINCRBY', cfg, 'skew_ms'"),
            "{production}"
        );
        assert!(!production.contains("skew = tonumber"));
        assert!(!production.contains("if op == 'skew'"));
        assert!(!production.contains("test-util begin"));
        assert!(production.contains("local skew = 0"));
        // Everything else is kept, line for line.
        let kept = SOURCE.lines().count()
            - SOURCE
                .split("-- test-util begin")
                .skip(1)
                .map(|part| {
                    // The lines from the begin marker's end to the end marker's indentation.
                    part.split("-- test-util end")
                        .next()
                        .unwrap()
                        .trim_end_matches(' ')
                        .lines()
                        .count()
                        + 1
                })
                .sum::<usize>();
        assert_eq!(production.lines().count(), kept);
    }

    #[test]
    fn replies_decode_into_their_types_and_anything_else_is_an_error() {
        let words = |w: &[&str]| {
            Value::Array(
                w.iter()
                    .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                    .collect(),
            )
        };
        let granted: Raw<AcquireReply> = FromRedisValue::from_redis_value(words(&[
            "OK", "17", "3", "100", "1", "100", "1", "1", "5000", "2000",
        ]))
        .unwrap();
        match granted {
            Raw::Reply(AcquireReply::Granted(g)) => {
                assert_eq!((g.token, g.policy_version), (FencingToken(17), 3));
                assert_eq!(g.occupancy.service_bytes, 100);
                assert_eq!(g.left(), Duration::from_secs(3));
            }
            _ => panic!("expected a grant"),
        }
        let full: Raw<AcquireReply> = FromRedisValue::from_redis_value(words(&[
            "FULL",
            "tenant_transfers",
            "4",
            "4",
            "-1",
            "2000",
            "",
        ]))
        .unwrap();
        match full {
            Raw::Reply(AcquireReply::Full(f)) => {
                assert_eq!(f.dimension, Some(Dimension::TenantTransfers));
                assert_eq!((f.held, f.ceiling, f.now_ms), (4, 4, 2000));
                assert_eq!(f.earliest_expiry_ms, None);
            }
            _ => panic!("expected a refusal"),
        }
        let renewed: Raw<Renewed> = FromRedisValue::from_redis_value(words(&[
            "OK", "2000", "5000", "OK", "LOST", "STALE:99",
        ]))
        .unwrap();
        match renewed {
            Raw::Reply(Renewed(held, now_ms)) => {
                assert_eq!(held, [Held::Ok, Held::Lost, Held::Stale(99)]);
                assert_eq!(now_ms, 2000);
            }
            _ => panic!("expected renewals"),
        }
        assert!(matches!(
            Raw::<Held>::from_redis_value(words(&["NOCONFIG"])).unwrap(),
            Raw::NoConfig
        ));
        assert!(matches!(
            Raw::<Held>::from_redis_value(words(&["MISMATCH", "abc"])).unwrap(),
            Raw::Mismatch(stored) if stored == "abc"
        ));
        assert!(Raw::<Held>::from_redis_value(words(&["WHAT"])).is_err());
        assert!(Raw::<AcquireReply>::from_redis_value(words(&["OK", "x"])).is_err());
    }

    fn words(w: &[&str]) -> Value {
        Value::Array(
            w.iter()
                .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                .collect(),
        )
    }

    /// A short reply is an error of the call, never a panic of the task that decodes it (the
    /// renewal task renews every lease of the instance).
    #[test]
    fn a_short_reply_is_an_error_not_a_panic() {
        assert!(Raw::<Renewed>::from_redis_value(words(&["OK"])).is_err());
        assert!(Raw::<Renewed>::from_redis_value(words(&["OK", "2000"])).is_err());
        match Raw::<Renewed>::from_redis_value(words(&["OK", "2000", "5000"])).unwrap() {
            Raw::Reply(Renewed(held, 2000)) => assert!(held.is_empty()),
            _ => panic!("expected an empty renewal"),
        }
        assert!(Raw::<Created>::from_redis_value(words(&["OK", "7"])).is_err());
        assert!(Raw::<SnapshotReply>::from_redis_value(words(&["OK", "1", "2"])).is_err());
        assert!(Raw::<AcquireReply>::from_redis_value(words(&["FULL"])).is_err());
        assert!(Raw::<QuotaReply>::from_redis_value(words(&[])).is_err());
    }

    #[test]
    fn a_late_call_is_a_refusal_that_no_retry_mends() {
        match Raw::<AcquireReply>::from_redis_value(words(&["LATE", "9000", "7500"])).unwrap() {
            Raw::Late { now_ms, latest } => assert_eq!((now_ms, latest), (9000, 7500)),
            _ => panic!("expected LATE"),
        }
        // After the caller's deadline: final.
        let leases = [];
        let past = Op::Renew {
            leases: &leases,
            until: Instant::now() - Duration::from_millis(1),
        };
        let error = late(&past, 9000, 7500);
        assert!(!is_transient(&error));
        assert!(error.to_string().contains("1500 ms late"), "{error}");
        // Before it: the bound came from a reading the server's clock has run ahead of; tried
        // again.
        let ahead = Op::Renew {
            leases: &leases,
            until: Instant::now() + Duration::from_secs(60),
        };
        assert!(is_transient(&late(&ahead, 9000, 7500)));
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// Whatever words a reply holds, every decoder answers a value or an error.
        #[test]
        fn no_reply_panics_a_decoder(
            reply in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(vec![
                        "OK", "FULL", "NEVER", "LOST", "STALE", "STALE:7", "OVER", "INVALID",
                        "NOCONFIG", "MISMATCH", "LATE", "WITHDRAWN", "GONE", "recovering",
                        "tenant_bytes", "lease_id", "-1", "0", "18446744073709551616", "",
                    ]).prop_map(String::from),
                    "[0-9]{1,20}",
                    ".{0,8}",
                ],
                0..24,
            )
        ) {
            let words = || {
                Value::Array(reply.iter().map(|s| Value::BulkString(s.clone().into_bytes())).collect())
            };
            let _ = Raw::<AcquireReply>::from_redis_value(words());
            let _ = Raw::<WithdrawReply>::from_redis_value(words());
            let _ = Raw::<Held>::from_redis_value(words());
            let _ = Raw::<Renewed>::from_redis_value(words());
            let _ = Raw::<SnapshotReply>::from_redis_value(words());
            let _ = Raw::<PolicyReply>::from_redis_value(words());
            let _ = Raw::<QuotaReply>::from_redis_value(words());
            let _ = Raw::<Throttled>::from_redis_value(words());
            let _ = Raw::<Created>::from_redis_value(words());
        }
    }

    #[test]
    fn connection_failures_are_retried_and_script_errors_are_not() {
        let io = |kind| redis::RedisError::from(std::io::Error::new(kind, "x"));
        assert!(is_transient(&io(std::io::ErrorKind::BrokenPipe)));
        assert!(is_transient(&io(std::io::ErrorKind::ConnectionRefused)));
        assert!(is_transient(&io(std::io::ErrorKind::ConnectionReset)));
        assert!(is_transient(&io(std::io::ErrorKind::TimedOut)));
        let script = redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "x"));
        assert!(!is_transient(&script));
        let auth = redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "x"));
        assert!(!is_transient(&auth));
    }
}
