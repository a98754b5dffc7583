//! [`RateSlices`]: a share of a cell's rates held by one process for a short while, spent call by
//! call without a script call, the rest given back (capacity leases in the manner of Google's
//! Doorman).
//!
//! With one lease per call, every call costs a script call, and the server's script thread bounds
//! the fleet's call rate (a few thousand a second). A slice is a lease that spends several calls'
//! tokens and requests of the cell's rates at once: the process admits calls from it locally
//! until it is spent or its hold time is over, then gives back in one release what it did not
//! spend. The cell's rates are debited when the slice is granted, so the fleet never spends more
//! than the cell grants; what a slice adds is a shift in time: a call may be made up to `hold`
//! after the grant reached the process, itself a round trip after the debit, so one second of
//! the fleet's calls may hold up to `hold` worth of rate more than one second of the cell's
//! grants (measured in `docs/benchmarks/2026-12-02-admission-redis-rates.md`: at most 5.2 % of the limit at 1,000 calls a second, with
//! slices of 64 calls held 100 ms).
//!
//! Which to use: a lease per call is exact (one second of calls is one second of grants) and
//! costs two script calls a call (acquire and release); it is the default, and enough while the
//! fleet's calls stay well under what the server's script thread serves (some thousands a
//! second on one core). Slices are for fleets past that: at 10,000 calls a second offered to a
//! limit of 8,000 they admitted the limit with 0.044 script calls a call, where a lease per call
//! admitted 6,000 a second with the server's core saturated.
//!
//! The size of the next slice follows the process's demand: twice the last when it was spent
//! before its time (up to `max_calls`), what was spent when its time ran out first, one call when
//! nothing was. Slices are granted in the cell's one line, so processes asking alike get alike.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::coordinator::RedisAdmission;
use crate::error::{AcquireError, ConfigError, Dimension, NeverReason};
use crate::lease::Lease;
use crate::request::LeaseRequest;
use crate::script::Outcome;

/// How a process takes slices of a cell's rates ([`RateSlices::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceConfig {
    /// How long a slice is held, from its grant's arrival, before what is left of it goes back
    /// to the cell: the most a call may lag the grant of its share (the grant itself lags the
    /// debit by its way back from the server). At most a third of the cell's lease TTL.
    pub hold: Duration,
    /// The most calls one slice covers (1 to 4,096).
    pub max_calls: u64,
    /// How long taking a slice may wait in the cell's line (bounded by the config's
    /// `redis_wait`).
    pub wait: Duration,
    /// The tenant of the slices' leases.
    pub tenant: String,
    /// The backend of the slices' leases.
    pub backend: String,
    /// The operation label of the slices' leases.
    pub operation: String,
}

impl SliceConfig {
    /// Slices held up to 100 ms, of at most 64 calls, waiting up to 10 s, as `tenant` on
    /// `backend`, labelled `slice`.
    pub fn new(tenant: impl Into<String>, backend: impl Into<String>) -> SliceConfig {
        SliceConfig {
            hold: Duration::from_millis(100),
            max_calls: 64,
            wait: Duration::from_secs(10),
            tenant: tenant.into(),
            backend: backend.into(),
            operation: "slice".to_owned(),
        }
    }
}

/// Counts of what a [`RateSlices`] has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceStats {
    /// Slices taken (one acquisition each).
    pub slices: u64,
    /// Slices given back (one release each).
    pub returned: u64,
    /// Calls admitted from slices.
    pub calls: u64,
    /// Requests given back unspent.
    pub requests_returned: u64,
    /// Tokens given back unspent.
    pub tokens_returned: u64,
}

/// One process's slices of a cell's rates: [`admit`](RateSlices::admit) a call's tokens and one
/// request from the slice held, taking a new one from the cell when it is spent or its time is
/// over.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (host, port) = admission_testkit::services::redis("RateSlices doc");
/// # let ceilings = admission_redis::Ceilings { service_bytes: 1 << 20, service_transfers: 64, tenant_bytes: 1 << 20, tenant_transfers: 64, backend_transfers: 64 };
/// # let mut config = admission_redis::RedisAdmissionConfig::new(host, port, "model-a-slices-doc", ceilings);
/// # config.rates = Some(admission_redis::Rates::per_minute(100_000, 600));
/// # let fleet = admission_redis::RedisAdmission::connect(config).await?;
/// use admission_redis::{RateSlices, SliceConfig};
///
/// let slices = RateSlices::new(fleet, SliceConfig::new("org", "model-a"))?;
/// let call = slices.admit(1_200).await?; // 1,200 tokens declared, one request
/// // ... make the call; it used 700 tokens ...
/// slices.finish(call, 700); // the 500 unused go back to the slice
/// slices.close().await; // what is left of the slice goes back to the cell
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping an `admit` future loses nothing: a slice it was taking is released as a dropped
/// acquisition is, and a slice it had taken stays for the next call. Dropping the `RateSlices`
/// drops the slice it holds (released as interrupted, its rest not given back): call
/// [`close`](RateSlices::close) first to give the rest back.
pub struct RateSlices {
    inner: Arc<Inner>,
}

struct Inner {
    fleet: RedisAdmission,
    config: SliceConfig,
    state: Mutex<State>,
    /// Held while a slice is given back and the next taken: one at a time per process.
    taking: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    slice: Option<Held>,
    /// Calls the next slice covers.
    next_calls: u64,
    /// The mean tokens a call declares (moving average), for the next slice's tokens.
    mean_tokens: f64,
    generation: u64,
    stats: SliceStats,
    /// The most a slice may hold: `(tokens, requests)`, from the cell's rates and byte ceilings,
    /// lowered when the cell's levels turn out to hold less (a budget the headers lowered).
    most: (u64, u64),
}

struct Held {
    lease: Lease,
    generation: u64,
    tokens: u64,
    requests: u64,
    tokens_left: u64,
    requests_left: u64,
    until: Instant,
}

impl Held {
    fn fits(&self, tokens: u64, now: Instant) -> bool {
        now < self.until && self.requests_left >= 1 && self.tokens_left >= tokens
    }
}

/// A call admitted from a slice: give it to [`RateSlices::finish`] with what it spent.
#[derive(Debug)]
#[must_use = "finish a call to give its unused tokens back to the slice"]
pub struct SliceCall {
    tokens: u64,
    generation: u64,
}

impl SliceCall {
    /// The tokens the call was admitted for.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}

impl RateSlices {
    /// Slices of `fleet`'s rates.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when the cell has no rates (`rates`), `hold` is zero or over a third of
    /// the lease TTL (`hold`), or `max_calls` is not within 1 to 4,096 (`max_calls`).
    pub fn new(fleet: RedisAdmission, config: SliceConfig) -> Result<RateSlices, ConfigError> {
        let cell = fleet.config();
        let Some(rates) = cell.rates else {
            return Err(ConfigError::new(
                "rates",
                "slices are of a cell's rates: the cell has none",
            ));
        };
        if config.hold.is_zero() || config.hold > cell.lease_ttl / 3 {
            return Err(ConfigError::new(
                "hold",
                format!(
                    "is {:?}: must be positive and at most a third of the lease TTL ({:?})",
                    config.hold, cell.lease_ttl
                ),
            ));
        }
        if !(1..=4096).contains(&config.max_calls) {
            return Err(ConfigError::new(
                "max_calls",
                format!("is {}: must be within 1..=4096", config.max_calls),
            ));
        }
        let (tokens, requests) = rates.capacity();
        let bytes = cell.ceilings.service_bytes.min(cell.ceilings.tenant_bytes);
        let most = ((tokens.floor() as u64).min(bytes), requests.floor() as u64);
        Ok(RateSlices {
            inner: Arc::new(Inner {
                fleet,
                config,
                state: Mutex::new(State {
                    next_calls: 1,
                    most,
                    ..State::default()
                }),
                taking: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Admits one call of `tokens` declared tokens and one request: from the slice held when it
    /// has room and time left, else from a new slice, taken after the old one's rest is given
    /// back.
    ///
    /// # Errors
    ///
    /// As [`RedisAdmission::acquire`] for the new slice: [`AcquireError::Never`] when `tokens`
    /// exceed what a level of the rates holds (or the byte ceilings), `TimedOut` when the wait
    /// is over, `Unavailable` when Redis failed.
    pub async fn admit(&self, tokens: u64) -> Result<SliceCall, AcquireError> {
        let inner = &self.inner;
        if tokens == 0 {
            return Err(AcquireError::Never {
                reason: NeverReason::EmptyFootprint,
            });
        }
        if let Some(call) = inner.take_from_held(tokens) {
            return Ok(call);
        }
        let _taking = inner.taking.lock().await;
        // Another call may have taken a slice while this one waited its turn.
        if let Some(call) = inner.take_from_held(tokens) {
            return Ok(call);
        }
        let old = inner.state.lock().slice.take();
        if let Some(old) = old {
            inner.give_back(old, Instant::now()).await;
        }
        {
            let mut state = inner.state.lock();
            state.mean_tokens = if state.mean_tokens == 0.0 {
                tokens as f64
            } else {
                state.mean_tokens * 0.9 + tokens as f64 * 0.1
            };
        }
        let mut shrinks = 0;
        let (lease, request, calls) = loop {
            let (request, calls) = inner.next_request(tokens);
            match inner.fleet.acquire(&request, inner.config.wait).await {
                Ok(lease) => break (lease, request, calls),
                // The cell's levels hold less than when the slices began (a budget the headers
                // lowered): the slices shrink to what they hold now, and this one asks again.
                Err(AcquireError::Never {
                    reason:
                        NeverReason::OverCeiling {
                            dimension:
                                dimension @ (Dimension::TokensPerMinute | Dimension::RequestsPerMinute),
                            ceiling,
                            ..
                        },
                }) if shrinks < 2 && (calls > 1 || request.footprint > tokens) => {
                    let mut state = inner.state.lock();
                    if dimension == Dimension::TokensPerMinute {
                        state.most.0 = ceiling;
                    } else {
                        state.most.1 = ceiling;
                    }
                    shrinks += 1;
                }
                Err(error) => return Err(error),
            }
        };
        let until = Instant::now() + inner.config.hold;
        let mut held = Held {
            lease,
            generation: 0,
            tokens: request.footprint,
            requests: calls,
            tokens_left: request.footprint - tokens,
            requests_left: calls - 1,
            until,
        };
        let generation = {
            let mut state = inner.state.lock();
            state.stats.slices += 1;
            state.stats.calls += 1;
            held.generation = state.generation;
            state.slice = Some(held);
            state.generation
        };
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(expire(weak, generation, until));
        Ok(SliceCall { tokens, generation })
    }

    /// Ends `call`, which spent `spent` of its tokens: while the slice that admitted it is still
    /// held, the rest goes back to it (a slice given back meanwhile gave back what it had).
    pub fn finish(&self, call: SliceCall, spent: u64) {
        let mut state = self.inner.state.lock();
        if let Some(held) = state.slice.as_mut()
            && held.generation == call.generation
        {
            held.tokens_left =
                (held.tokens_left + call.tokens.saturating_sub(spent)).min(held.tokens);
        }
    }

    /// Gives the slice held, if any, back to the cell now (what it did not spend goes back to
    /// the rates), after a slice being given back at its expiry.
    pub async fn close(&self) {
        let _taking = self.inner.taking.lock().await;
        let old = self.inner.state.lock().slice.take();
        if let Some(old) = old {
            self.inner.give_back(old, Instant::now()).await;
        }
    }

    /// What this process's slices have done so far.
    pub fn stats(&self) -> SliceStats {
        self.inner.state.lock().stats
    }
}

impl Inner {
    /// The next slice's request for a call of `tokens`: its size from the demand, within what
    /// a slice may hold.
    fn next_request(&self, tokens: u64) -> (LeaseRequest, u64) {
        let mut state = self.state.lock();
        let calls = state
            .next_calls
            .clamp(1, self.config.max_calls)
            .min(state.most.1.max(1));
        let wanted = ((state.mean_tokens.max(tokens as f64)) * calls as f64).ceil() as u64;
        let slice_tokens = wanted.min(state.most.0).max(tokens);
        state.generation += 1;
        let request = LeaseRequest::new(
            format!(
                "slice-{}-{}",
                self.fleet.inner.wakeups.instance(),
                state.generation
            ),
            &self.config.tenant,
            &self.config.backend,
            slice_tokens,
            &self.config.operation,
        )
        .with_requests(calls);
        (request, calls)
    }

    fn take_from_held(&self, tokens: u64) -> Option<SliceCall> {
        let mut state = self.state.lock();
        let held = state.slice.as_mut()?;
        if !held.fits(tokens, Instant::now()) {
            return None;
        }
        held.tokens_left -= tokens;
        held.requests_left -= 1;
        let generation = held.generation;
        state.stats.calls += 1;
        Some(SliceCall { tokens, generation })
    }

    /// Gives `old` back with what it did not spend, and sizes the next slice by how it went.
    async fn give_back(&self, old: Held, now: Instant) {
        let spent_requests = old.requests - old.requests_left;
        let spent_tokens = old.tokens - old.tokens_left;
        {
            let mut state = self.state.lock();
            state.next_calls = if now < old.until {
                // Spent before its time: the demand is higher.
                (old.requests * 2).min(self.config.max_calls)
            } else {
                spent_requests.max(1)
            };
            state.stats.returned += 1;
            state.stats.requests_returned += old.requests_left;
            state.stats.tokens_returned += old.tokens_left;
        }
        if let Err(error) = old
            .lease
            .release_slice(Outcome::Completed, spent_tokens, spent_requests)
            .await
        {
            tracing::debug!(%error, "admission-redis: a slice's rest was not given back; the lease TTL ends it");
        }
    }
}

/// Gives slice `generation` back at `until` if it is still held then (in turn with the calls
/// taking slices, so a [`RateSlices::close`] after it finds it given back).
async fn expire(inner: Weak<Inner>, generation: u64, until: Instant) {
    tokio::time::sleep_until(until).await;
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let _taking = inner.taking.lock().await;
    let old = {
        let mut state = inner.state.lock();
        match &state.slice {
            Some(held) if held.generation == generation => state.slice.take(),
            _ => None,
        }
    };
    if let Some(old) = old {
        inner.give_back(old, Instant::now()).await;
    }
}
