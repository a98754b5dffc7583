//! The simulated upstream: an LLM provider that enforces its *own* limits and says so in HTTP
//! terms.
//!
//! Each model has true budgets that differ from the fleet's catalog (80 % of what
//! `models.toml` says, as when an organisation's tier is lower than the docs a team copied), a
//! true concurrency cap where the catalog declares one, and, on model-a, a neighbour: another
//! service on the same organisation key that eats 45 % of model-a's token rate between simulated
//! minutes 4 and 8. The provider charges a call's prompt plus its declared `max_tokens` when the
//! call arrives, as real providers do, and answers:
//!
//! - **200** with `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers, after a
//!   latency that grows with the output tokens;
//! - **429** when the call's tokens or request do not fit, with the same headers and a
//!   `retry-after` in whole (simulated) seconds;
//! - **529 overloaded** now and then (1.5 % of calls, drawn from the seed and the call's
//!   coordinates, so a replay draws the same), and whenever a model's true concurrency would be
//!   exceeded (which a correct client never causes: the example counts those separately).
//!
//! Nothing here sleeps: a [`Response`] carries its latency and the caller waits it out holding
//! its grant, so async and blocking agents share one provider. Time is the run's
//! [`ScaledClock`](crate::clock::ScaledClock) (any [`Clock`] reading zero at the run's start: the
//! tests drive one by hand); budgets are per simulated minute. The provider also counts, per
//! model, the most tokens and requests it charged within any rolling simulated minute, so a run
//! can check the organisation's limit as the provider saw it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use admission_core::{Clock, Instant, Timer};
use admission_llm::model_spec::ModelCatalog;
use anyhow::{Context as _, anyhow};
use serde::{Deserialize, Serialize};

use crate::rng;

/// The share of the catalog's budgets the provider really grants.
pub const TRUE_SHARE: f64 = 0.8;
/// The share of calls answered 529 whatever the load.
pub const OVERLOAD_RATE: f64 = 0.015;
/// Simulated output speed: a token every 8 ms (125 tokens a second).
const PER_OUTPUT_TOKEN: Duration = Duration::from_millis(8);
/// Time to first token.
const BASE_LATENCY: Duration = Duration::from_millis(300);
/// How long a 429 takes to come back.
const REJECT_LATENCY: Duration = Duration::from_millis(50);
/// How long an overloaded server takes to say so.
const OVERLOAD_LATENCY: Duration = Duration::from_millis(800);
/// The span of the rolling window the provider counts its charges over: a simulated minute.
const MINUTE: Duration = Duration::from_secs(60);

/// Another consumer of the same quota, active for a span of simulated time.
#[derive(Clone, Copy, Debug)]
pub struct Neighbour {
    /// When it starts, in simulated time since the run began.
    pub from: Duration,
    /// When it stops.
    pub until: Duration,
    /// The share of the model's token rate it takes while active.
    pub share: f64,
}

/// What the provider really enforces on one model.
#[derive(Clone, Copy, Debug)]
pub struct TrueLimits {
    /// Tokens per simulated minute (bucket size and refill rate).
    pub tokens_per_minute: u64,
    /// Requests per simulated minute.
    pub requests_per_minute: u64,
    /// Calls in flight at once, when capped.
    pub max_concurrent: Option<u64>,
    /// Another service sharing the token quota, if any.
    pub neighbour: Option<Neighbour>,
}

/// A call as the provider sees it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The catalog id of the model.
    pub model: &'a str,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Declared `max_tokens`.
    pub max_output_tokens: u64,
    /// Tokens the model will produce if the call is accepted.
    pub output_tokens: u64,
    /// A word identifying the call (job, step, attempt) for the provider's deterministic draws.
    pub key: u64,
}

/// The HTTP status of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// 200: the call ran.
    Ok,
    /// 429: a rate limit was hit; retry after the `retry-after`.
    RateLimited,
    /// 529: the model is overloaded; back off and retry.
    Overloaded,
}

/// One answer: a status, headers, and how long it takes to arrive.
#[derive(Debug)]
pub struct Response {
    /// What happened.
    pub status: Status,
    /// Rate-limit headers, as `(name, value)` pairs.
    pub headers: Vec<(&'static str, String)>,
    /// Simulated time from sending to the last byte; the caller waits it out holding its grant.
    pub latency: Duration,
    /// Keeps the call counted as in flight until the response is dropped.
    _in_flight: Option<InFlight>,
}

/// Per-model counters, read by the report.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    tokens_charged: AtomicU64,
    output_tokens: AtomicU64,
    rate_limited: AtomicU64,
    overloaded: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
    over_concurrency: AtomicU64,
}

/// What the provider saw of one model, for the report (and, as JSON, for the HTTP server's
/// `GET /v1/stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamStats {
    /// Calls answered 200.
    pub accepted: u64,
    /// Tokens charged for accepted calls (prompt + declared most output).
    pub tokens_charged: u64,
    /// Tokens actually generated.
    pub output_tokens: u64,
    /// 429 answers.
    pub rate_limited: u64,
    /// 529 answers.
    pub overloaded: u64,
    /// The most calls in flight at once.
    pub peak_in_flight: u64,
    /// Calls that arrived above the true concurrency cap (refused with 529); a client that
    /// honours its model gate causes none.
    pub over_concurrency: u64,
    /// The most tokens charged for accepted calls within any rolling simulated minute (any
    /// span of 60 s, charges counted at their arrival). The provider's bucket is full at the
    /// start and refills continuously, so this may reach up to twice the true limit.
    pub max_tokens_in_a_minute: u64,
    /// The most calls accepted within any rolling simulated minute.
    pub max_requests_in_a_minute: u64,
    /// When the minute of `max_tokens_in_a_minute` ended, simulated milliseconds since the
    /// provider started.
    #[serde(default)]
    pub busiest_minute_ends_ms: u64,
    /// The true tokens per minute.
    pub true_tokens_per_minute: u64,
    /// The true requests per minute.
    pub true_requests_per_minute: u64,
    /// The true concurrency cap, if any.
    pub true_max_concurrent: Option<u64>,
    /// When the last call was accepted, simulated milliseconds since the provider started.
    #[serde(default)]
    pub last_accepted_ms: u64,
    /// The most tokens the provider could have accepted from its start to its last accepted
    /// call: its full bucket plus its refill over that span, the neighbour's share taken.
    /// Tokens charged against it say how much of what the organisation was allowed it used
    /// while it had work.
    #[serde(default)]
    pub offered_tokens: u64,
}

/// Levels of the provider's own buckets (fractional tokens: this is a simulation, not a limiter).
#[derive(Debug)]
struct Levels {
    tokens: f64,
    requests: f64,
    /// Simulated seconds at which the levels were last brought up to date.
    at: f64,
    /// The accepted calls of the last simulated minute and their largest sums.
    minute: RollingMinute,
    /// Simulated seconds of the last accepted call.
    last_accepted: f64,
}

/// The accepted calls of the last simulated minute, as `(arrival, tokens charged)`, with the
/// largest token sum and call count any minute has held. Memory is bounded by the calls one
/// minute can accept (at most twice the true requests per minute).
#[derive(Debug, Default)]
struct RollingMinute {
    calls: VecDeque<(Instant, u64)>,
    /// The tokens of `calls`.
    tokens: u64,
    max_tokens: u64,
    max_requests: u64,
    /// Simulated seconds at the end of the minute that held `max_tokens`.
    max_tokens_at: f64,
}

impl RollingMinute {
    /// Counts a call accepted at `at` (never before the last one) for `tokens`. A minute's sums
    /// only grow at an arrival, so checking each arrival's minute `(at - 60 s, at]` sees every
    /// rolling minute's largest.
    fn charge(&mut self, at: Instant, t: f64, tokens: u64) {
        while let Some(&(then, charged)) = self.calls.front()
            && at.saturating_duration_since(then) >= MINUTE
        {
            self.calls.pop_front();
            self.tokens -= charged;
        }
        self.calls.push_back((at, tokens));
        self.tokens += tokens;
        if self.tokens > self.max_tokens {
            self.max_tokens = self.tokens;
            self.max_tokens_at = t;
        }
        self.max_requests = self.max_requests.max(self.calls.len() as u64);
    }

    /// The most tokens and the most calls any rolling minute has held, and when (simulated
    /// seconds) the minute of the most tokens ended.
    fn maxima(&self) -> (u64, u64, f64) {
        (self.max_tokens, self.max_requests, self.max_tokens_at)
    }
}

#[derive(Debug)]
struct Upstream {
    limits: TrueLimits,
    levels: Mutex<Levels>,
    counters: Counters,
}

impl Upstream {
    /// Token refill per simulated second at simulated second `t` (the neighbour's share taken).
    fn token_rate(&self, t: f64) -> f64 {
        let full = self.limits.tokens_per_minute as f64 / 60.0;
        match self.limits.neighbour {
            Some(n) if t >= n.from.as_secs_f64() && t < n.until.as_secs_f64() => {
                full * (1.0 - n.share)
            }
            _ => full,
        }
    }

    fn request_rate(&self) -> f64 {
        self.limits.requests_per_minute as f64 / 60.0
    }

    /// The full bucket plus the token refill from simulated second 0 to `t`.
    fn offered(&self, t: f64) -> f64 {
        let full = self.limits.tokens_per_minute as f64 / 60.0;
        let taken = self.limits.neighbour.map_or(0.0, |n| {
            let overlap = (t.min(n.until.as_secs_f64()) - n.from.as_secs_f64()).max(0.0);
            overlap * full * n.share
        });
        self.limits.tokens_per_minute as f64 + full * t - taken
    }
}

/// Decrements a model's in-flight count when a response is dropped.
#[derive(Debug)]
struct InFlight(Arc<Upstream>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.counters.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The simulated provider.
#[derive(Debug)]
pub struct Provider {
    /// Simulated time, zero at the run's start.
    clock: Arc<dyn Timer>,
    seed: u64,
    upstreams: BTreeMap<String, Arc<Upstream>>,
}

impl Provider {
    /// A provider serving every model of `catalog` at [`TRUE_SHARE`] of its budgets, with
    /// model-a's neighbour, on `clock` (the run's scaled clock; it must read zero at the run's
    /// start, as the neighbour's span is counted from there).
    pub fn new(catalog: &ModelCatalog, clock: Arc<dyn Timer>, seed: u64) -> Provider {
        let upstreams = catalog
            .models
            .iter()
            .map(|spec| {
                let limits = TrueLimits {
                    tokens_per_minute: (spec.tokens_per_minute as f64 * TRUE_SHARE) as u64,
                    requests_per_minute: (spec.effective_requests_per_minute() as f64 * TRUE_SHARE)
                        .max(1.0) as u64,
                    max_concurrent: spec.max_concurrent,
                    neighbour: (spec.id == "model-a").then_some(Neighbour {
                        from: Duration::from_secs(4 * 60),
                        until: Duration::from_secs(8 * 60),
                        share: 0.45,
                    }),
                };
                let upstream = Upstream {
                    levels: Mutex::new(Levels {
                        tokens: limits.tokens_per_minute as f64,
                        requests: limits.requests_per_minute as f64,
                        at: 0.0,
                        minute: RollingMinute::default(),
                        last_accepted: 0.0,
                    }),
                    limits,
                    counters: Counters::default(),
                };
                (spec.id.clone(), Arc::new(upstream))
            })
            .collect();
        Provider {
            clock,
            seed,
            upstreams,
        }
    }

    /// The provider's clock: simulated time, zero at the run's start.
    pub fn clock(&self) -> &Arc<dyn Timer> {
        &self.clock
    }

    /// Whether the provider serves `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.upstreams.contains_key(model)
    }

    /// Answers one call, charging it if it is accepted.
    ///
    /// # Errors
    ///
    /// When `model` is not served (a 404 in real life; here a bug in the example).
    pub fn call(&self, request: &Request<'_>) -> anyhow::Result<Response> {
        let upstream = self
            .upstreams
            .get(request.model)
            .with_context(|| format!("the provider serves no model `{}`", request.model))?;
        let counters = &upstream.counters;
        let now = self.clock.now();
        let t = Duration::from_nanos(now.as_nanos()).as_secs_f64();

        if rng::unit(rng::hash(self.seed, &[request.key, 529])) < OVERLOAD_RATE {
            counters.overloaded.fetch_add(1, Ordering::Relaxed);
            return Ok(self.answer(Status::Overloaded, Vec::new(), OVERLOAD_LATENCY, None));
        }
        if let Some(cap) = upstream.limits.max_concurrent
            && counters.in_flight.load(Ordering::Acquire) >= cap
        {
            counters.over_concurrency.fetch_add(1, Ordering::Relaxed);
            counters.overloaded.fetch_add(1, Ordering::Relaxed);
            return Ok(self.answer(Status::Overloaded, Vec::new(), OVERLOAD_LATENCY, None));
        }

        let need = request
            .input_tokens
            .saturating_add(request.max_output_tokens) as f64;
        let mut levels = upstream
            .levels
            .lock()
            .map_err(|_| anyhow!("the provider's state was poisoned by a panic"))?;
        let limits = upstream.limits;
        // Refill at the rate in force now (the neighbour switches within a step at most).
        let dt = (t - levels.at).max(0.0);
        levels.tokens =
            (levels.tokens + dt * upstream.token_rate(t)).min(limits.tokens_per_minute as f64);
        levels.requests =
            (levels.requests + dt * upstream.request_rate()).min(limits.requests_per_minute as f64);
        levels.at = t;

        let fits = levels.tokens >= need && levels.requests >= 1.0;
        if fits {
            levels.tokens -= need;
            levels.requests -= 1.0;
            levels.minute.charge(now, t, need as u64);
            levels.last_accepted = t;
        }
        let token_rate = upstream.token_rate(t);
        let request_rate = upstream.request_rate();
        let mut headers = vec![
            (
                "x-ratelimit-limit-requests",
                limits.requests_per_minute.to_string(),
            ),
            (
                "x-ratelimit-remaining-requests",
                (levels.requests.max(0.0) as u64).to_string(),
            ),
            (
                "x-ratelimit-reset-requests",
                go_duration(secs(
                    (limits.requests_per_minute as f64 - levels.requests) / request_rate,
                )),
            ),
            (
                "x-ratelimit-limit-tokens",
                limits.tokens_per_minute.to_string(),
            ),
            (
                "x-ratelimit-remaining-tokens",
                (levels.tokens.max(0.0) as u64).to_string(),
            ),
            (
                "x-ratelimit-reset-tokens",
                go_duration(secs(
                    (limits.tokens_per_minute as f64 - levels.tokens) / token_rate,
                )),
            ),
        ];
        if !fits {
            let wait = ((need - levels.tokens) / token_rate)
                .max((1.0 - levels.requests) / request_rate)
                .ceil()
                .max(1.0);
            drop(levels);
            headers.push(("retry-after", format!("{wait:.0}")));
            counters.rate_limited.fetch_add(1, Ordering::Relaxed);
            return Ok(self.answer(Status::RateLimited, headers, REJECT_LATENCY, None));
        }
        drop(levels);

        counters.accepted.fetch_add(1, Ordering::Relaxed);
        counters
            .tokens_charged
            .fetch_add(need as u64, Ordering::Relaxed);
        counters
            .output_tokens
            .fetch_add(request.output_tokens, Ordering::Relaxed);
        let now_in_flight = counters.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        counters
            .peak_in_flight
            .fetch_max(now_in_flight, Ordering::AcqRel);
        let jitter = Duration::from_millis(rng::hash(self.seed, &[request.key, 200]) % 200);
        let latency = BASE_LATENCY
            + PER_OUTPUT_TOKEN * u32::try_from(request.output_tokens).unwrap_or(u32::MAX)
            + jitter;
        Ok(self.answer(
            Status::Ok,
            headers,
            latency,
            Some(InFlight(upstream.clone())),
        ))
    }

    fn answer(
        &self,
        status: Status,
        headers: Vec<(&'static str, String)>,
        latency: Duration,
        in_flight: Option<InFlight>,
    ) -> Response {
        Response {
            status,
            headers,
            latency,
            _in_flight: in_flight,
        }
    }

    /// What the provider saw, per model.
    pub fn stats(&self) -> BTreeMap<String, UpstreamStats> {
        self.upstreams
            .iter()
            .map(|(id, u)| {
                let c = &u.counters;
                let (max_tokens, max_requests, busiest, last) = {
                    let levels = u.levels.lock().unwrap_or_else(PoisonError::into_inner);
                    let (tokens, requests, at) = levels.minute.maxima();
                    (tokens, requests, at, levels.last_accepted)
                };
                let stats = UpstreamStats {
                    accepted: c.accepted.load(Ordering::Relaxed),
                    tokens_charged: c.tokens_charged.load(Ordering::Relaxed),
                    output_tokens: c.output_tokens.load(Ordering::Relaxed),
                    rate_limited: c.rate_limited.load(Ordering::Relaxed),
                    overloaded: c.overloaded.load(Ordering::Relaxed),
                    peak_in_flight: c.peak_in_flight.load(Ordering::Relaxed),
                    over_concurrency: c.over_concurrency.load(Ordering::Relaxed),
                    max_tokens_in_a_minute: max_tokens,
                    max_requests_in_a_minute: max_requests,
                    busiest_minute_ends_ms: (busiest * 1e3) as u64,
                    true_tokens_per_minute: u.limits.tokens_per_minute,
                    true_requests_per_minute: u.limits.requests_per_minute,
                    true_max_concurrent: u.limits.max_concurrent,
                    last_accepted_ms: (last * 1e3) as u64,
                    offered_tokens: u.offered(last) as u64,
                };
                (id.clone(), stats)
            })
            .collect()
    }
}

fn secs(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(Duration::ZERO)
}

/// A duration the way Go prints one and OpenAI sends resets: `20ms`, `6s`, `1m7.25s`.
pub fn go_duration(d: Duration) -> String {
    let millis = d.as_millis();
    if millis < 1_000 {
        return format!("{millis}ms");
    }
    let minutes = millis / 60_000;
    let rest = millis % 60_000;
    let seconds = if rest.is_multiple_of(1_000) {
        format!("{}", rest / 1_000)
    } else {
        format!("{}.{:03}", rest / 1_000, rest % 1_000)
            .trim_end_matches('0')
            .to_owned()
    };
    if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn reset_values_are_go_durations_the_provider_layer_reads_back() {
        use admission_llm::rate_limit_info::RateLimitInfo;
        for (d, text) in [
            (Duration::from_millis(20), "20ms"),
            (Duration::from_secs(6), "6s"),
            (Duration::from_millis(67_250), "1m7.25s"),
            (Duration::from_secs(360), "6m0s"),
        ] {
            assert_eq!(go_duration(d), text);
            let headers = [("x-ratelimit-reset-tokens", text)];
            let info = RateLimitInfo::from_pairs("m", headers, SystemTime::now());
            assert_eq!(info.token_reset, Some(d));
        }
    }
}
