//! [`World`]: everything one run shares — the scaled clock, the provider layer's [`Registry`]
//! built from the catalog, the results database (under the monitor), the search API's fixed
//! window, the simulated provider over HTTP and the counters — and the steps both strategies
//! take the same way: building a step's demand, making the call, and feeding the answer back to
//! the registry.
//!
//! The provider is a real HTTP server on loopback (`provider_http.rs`): this run's own, or, in a
//! fleet member, the one the fleet's parent serves to every member, so that one organisation's
//! limits are enforced across all its processes. Calls go through a real HTTP client whose
//! connections are at most the `http` gate's, and the answer's real headers are read with
//! `RateLimitInfo::from_headers`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use admission_accounts::FixedWindow;
use admission_core::{Amount, Clock, Demand};
use admission_llm::model_spec::ModelCatalog;
use admission_llm::provider::Registry;
use admission_llm::rate_limit_info::RateLimitInfo;
use admission_llm::spend::{CostLedger, Money, SpendGate};
use admission_llm::{CallError, CallReservation};
use admission_redis::{CallReport, Upstream};
use anyhow::Context as _;

use crate::cells::{Cells, StepReport};
use crate::clock::ScaledClock;
use crate::provider_http::{HttpAnswer, ProviderClient, ProviderServer};
use crate::provider_sim::{Provider, Request, Status};
use crate::results::{Results, Row};
use crate::rng;
use crate::stats::{Gauge, JobOutcome, Metrics};
use crate::stop::Stop;
use crate::workload::{JobPlan, StepPlan};

/// The name of the database gate: the results provider's `db:<name>`.
pub const DB: &str = "db:results";
/// The name of the search API's fixed window.
pub const SEARCH: &str = "search-api";
/// The name of the provider layer's HTTP gate.
pub const HTTP: &str = "http";

/// The knobs of a run that the command line sets.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Simulated seconds per real second.
    pub time_scale: u32,
    /// HTTP connections to the provider.
    pub http_connections: u64,
    /// Database connections.
    pub db_connections: u64,
    /// Search API calls per simulated minute.
    pub search_per_minute: u64,
    /// How long one admission may wait, in simulated time.
    pub admit_timeout: Duration,
    /// Retries of one step after a 429, a 529 or an open circuit.
    pub retries: u32,
    /// The seed of the workload and of the provider's draws.
    pub seed: u64,
    /// Each workflow's (agent's) spend cap: every step is priced against it before it may wait.
    pub budget: Money,
}

/// What a job does after a call's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// The call ran; on to the next step.
    Done,
    /// Try the step again after this much simulated time, holding nothing.
    Retry(Duration),
}

/// Everything one run shares.
pub struct World {
    /// The command line's knobs.
    pub settings: Settings,
    /// The run's simulated time.
    pub clock: Arc<ScaledClock>,
    /// The provider layer: buckets, model gates, windows, the HTTP gate.
    pub registry: Registry,
    /// The simulated upstream, over HTTP.
    pub upstream: ProviderClient,
    /// This run's own provider server, served while the world lives (none in a fleet member:
    /// the parent's serves the fleet).
    _server: Option<ProviderServer>,
    /// The runtime the HTTP client lives on, for agents on blocking threads.
    runtime: tokio::runtime::Handle,
    /// The results database, whose provider's gate is the database part of a demand (monitor
    /// runs; the hold-and-wait chain keeps a plain semaphore instead).
    pub results: Option<Arc<Results>>,
    /// The search API's fixed window (an account too).
    pub search: Arc<FixedWindow>,
    /// The counters.
    pub metrics: Metrics,
    /// Ends the run early.
    pub stop: Arc<Stop>,
    /// The fleet's cells, one per model, when this process is a member of a `--fleet` run: each
    /// step takes a lease from its model's cell before its local demand.
    pub cells: Option<Arc<Cells>>,
}

impl World {
    /// A fresh world: new clock (simulated time zero now), new limiters, and the provider at
    /// `provider_url`, or a new one served by this run when there is none.
    ///
    /// # Errors
    ///
    /// When the catalog or a setting is refused by the limiters, the results database at
    /// `results_path` cannot be created, or the provider cannot be served or reached.
    pub async fn new(
        catalog: &ModelCatalog,
        plan: &[Arc<JobPlan>],
        settings: Settings,
        results_path: Option<&Path>,
        stop: Arc<Stop>,
        cells: Option<Arc<Cells>>,
        provider_url: Option<&str>,
    ) -> anyhow::Result<World> {
        let clock = ScaledClock::new(settings.time_scale);
        let shared: Arc<dyn Clock> = clock.clone();
        let registry = Registry::new(shared.clone())
            .with_http_connections(settings.http_connections)
            .context("building the HTTP gate")?;
        registry
            .register_catalog(catalog)
            .context("registering the model catalog")?;
        for job in plan {
            registry
                .spec(job.model)
                .context("the workload names a model the catalog lacks")?;
        }
        let results = match results_path {
            Some(path) => Some(Arc::new(
                Results::create(path, settings.db_connections, shared.clone())
                    .context("creating the results database")?,
            )),
            None => None,
        };
        let search = Arc::new(
            FixedWindow::of(SEARCH, settings.search_per_minute, Duration::from_secs(60))
                .context("building the search API's window")?
                .with_clock(shared),
        );
        let mut gauges = vec![Gauge::new(HTTP), Gauge::new(DB)];
        for spec in &catalog.models {
            if spec.max_concurrent.is_some() {
                gauges.push(Gauge::new(format!("{}:concurrency", spec.id)));
            }
        }
        let metrics = Metrics::new(
            plan.len() as u64,
            catalog.models.iter().map(|m| m.id.as_str()),
            gauges,
        );
        let server = match provider_url {
            Some(_) => None,
            None => Some(
                ProviderServer::start(Arc::new(Provider::new(
                    catalog,
                    clock.clone(),
                    settings.seed,
                )))
                .await
                .context("serving the provider")?,
            ),
        };
        let url = provider_url
            .or(server.as_ref().map(ProviderServer::url))
            .context("a provider URL")?;
        let idle = usize::try_from(settings.http_connections).unwrap_or(usize::MAX);
        let upstream = ProviderClient::new(url, idle)?;
        Ok(World {
            upstream,
            _server: server,
            runtime: tokio::runtime::Handle::current(),
            settings,
            clock,
            registry,
            results,
            search,
            metrics,
            stop,
            cells,
        })
    }

    /// Simulated time since the run began.
    pub fn now(&self) -> Duration {
        self.clock.elapsed()
    }

    /// A fresh spend cap for `job`'s workflow: [`Settings::budget`], nothing spent.
    pub fn budget(&self, job: &JobPlan) -> Arc<CostLedger> {
        CostLedger::new(job.name.clone(), self.settings.budget)
    }

    /// Records what `budget`'s workflow spent, once its job has ended.
    pub fn job_spent(&self, budget: &CostLedger) {
        self.metrics.record_spend(budget.spent().micros());
    }

    /// Prices one step against its workflow's cap ([`Registry::demand_within`]): the step's
    /// reservation, and the model call's demand (HTTP connection, tokens and a request, the model
    /// gate and window where the catalog has them). A step the cap refuses ends its job with
    /// [`JobOutcome::OverBudget`] at once, before it waits for anything.
    ///
    /// # Errors
    ///
    /// [`JobOutcome::OverBudget`] (counted in `refused_for_money`), or [`JobOutcome::Failed`]
    /// when the model is not registered.
    pub fn price_step(
        &self,
        job: &JobPlan,
        step: &StepPlan,
        budget: &dyn SpendGate,
    ) -> Result<(Demand, CallReservation), JobOutcome> {
        match self.registry.demand_within(
            job.model,
            step.input_tokens,
            step.max_output_tokens,
            budget,
        ) {
            Ok(priced) => Ok((priced.call.demand, priced.reservation)),
            Err(CallError::OverBudget(refused)) => {
                self.metrics
                    .refused_for_money
                    .fetch_add(1, Ordering::Relaxed);
                Err(JobOutcome::OverBudget(refused.to_string()))
            }
            Err(error) => Err(JobOutcome::Failed(format!(
                "building the demand of {}: {error}",
                job.name
            ))),
        }
    }

    /// One step's whole demand, priced against `budget` ([`price_step`](World::price_step)),
    /// plus a permit on the results provider's gate and a search call when the step needs them.
    ///
    /// # Errors
    ///
    /// As [`price_step`](World::price_step), and [`JobOutcome::Failed`] when a step needs the
    /// database in a world without one.
    pub fn step_demand(
        &self,
        job: &JobPlan,
        step: &StepPlan,
        budget: &dyn SpendGate,
    ) -> Result<(Demand, CallReservation), JobOutcome> {
        let (mut demand, reservation) = self.price_step(job, step, budget)?;
        if step.uses_db {
            let Some(results) = self.results.as_ref() else {
                return Err(JobOutcome::Failed(
                    "a step needs the database, and this run has none".into(),
                ));
            };
            demand.add(results.gate().clone(), Amount::ONE);
        }
        if step.uses_search {
            demand.add(self.search.clone(), Amount::ONE);
        }
        Ok((demand, reservation))
    }

    /// Sends one step's call to the provider over HTTP; returns once the provider has answered,
    /// after the call's latency (the server holds the answer that long).
    ///
    /// # Errors
    ///
    /// When the provider cannot be reached or does not serve the model (a bug in the example).
    pub async fn call(
        &self,
        job: &JobPlan,
        step_index: usize,
        attempt: u32,
        step: &StepPlan,
    ) -> anyhow::Result<HttpAnswer> {
        let request = Request {
            model: job.model,
            input_tokens: step.input_tokens,
            max_output_tokens: step.max_output_tokens,
            output_tokens: step.output_tokens,
            key: rng::hash(job.index as u64, &[step_index as u64, u64::from(attempt)]),
        };
        self.upstream.call(&request).await
    }

    /// [`call`](World::call) for an agent on a blocking thread.
    ///
    /// # Errors
    ///
    /// As for [`call`](World::call).
    pub fn call_blocking(
        &self,
        job: &JobPlan,
        step_index: usize,
        attempt: u32,
        step: &StepPlan,
    ) -> anyhow::Result<HttpAnswer> {
        self.runtime
            .block_on(self.call(job, step_index, attempt, step))
    }

    /// Feeds an answer back to the provider layer and says what the job does next.
    ///
    /// - 200: `on_success` (relieves the throttle) and `observe` (the headers' ceilings become
    ///   the bucket's budgets);
    /// - 429: `on_rate_limit_error` with the headers (one throttle step, the ceilings applied),
    ///   then retry after the `retry-after`;
    /// - 529: `on_overload` (three throttle steps, a failure on the model's window), then retry
    ///   after an exponential backoff.
    pub fn feedback(&self, model: &str, response: &HttpAnswer, attempt: u32) -> Next {
        let tally = self.metrics.model(model);
        match response.status {
            Status::Ok => {
                self.registry.on_success(model);
                self.registry.observe(&response.rate_limit);
                if let Some(t) = tally {
                    t.calls_ok.fetch_add(1, Ordering::Relaxed);
                }
                Next::Done
            }
            Status::RateLimited => {
                // A 429's headers: what the provider says, read as a limit that was hit.
                let info = &response.rate_limit;
                self.registry.on_rate_limit_error(model, info);
                if let Some(t) = tally {
                    t.rate_limited.fetch_add(1, Ordering::Relaxed);
                }
                Next::Retry(info.retry_after.unwrap_or(Duration::from_secs(1)))
            }
            Status::Overloaded => {
                self.registry.on_overload(model, "529 overloaded");
                if let Some(t) = tally {
                    t.overloaded.fetch_add(1, Ordering::Relaxed);
                }
                Next::Retry(backoff(attempt))
            }
        }
    }

    /// The wait after an open circuit refused a step: what the refusal says is left of the
    /// cooldown, kept between 1 s and 1 min (simulated).
    pub fn circuit_backoff(&self, retry_after: Duration) -> Duration {
        retry_after.clamp(Duration::from_secs(1), Duration::from_secs(60))
    }
}

/// What a call's answer tells the fleet's cell of its model when the step's lease is released:
/// the tokens the provider charged (the rest of the lease's footprint goes back to the cell's
/// rate), its load signal for the cell's rate (a 429 one backpressure step, a success a relief,
/// a 529 nothing: an overloaded model is not a spent rate), the tokens it says
/// it has left (which bring a fuller cell down: the neighbour spends the same quota), and the
/// budgets its headers report.
pub fn step_report(answer: &HttpAnswer) -> StepReport {
    let info = &answer.rate_limit;
    let limits = (refilled_tokens_per_minute(info), info.requests_per_minute());
    StepReport {
        call: call_report(answer),
        limits: (limits.0 > 0 && limits.1 > 0).then_some(limits),
    }
}

/// The tokens per minute the provider's headers say it really refills: its limit, or less when
/// its reset says it refills slower (`(limit - remaining) / reset`: another service on the same
/// organisation spending part of it), in whole percent of the limit so that the cell's budget
/// changes only when the provider's does. Zero when the headers do not say.
pub fn refilled_tokens_per_minute(info: &RateLimitInfo) -> u64 {
    let limit = info.tokens_per_minute();
    let (Some(remaining), Some(reset)) = (info.token_remaining, info.token_reset) else {
        return limit;
    };
    if limit == 0 || remaining >= limit || reset.is_zero() {
        return limit;
    }
    let per_minute = (limit - remaining) as f64 * 60.0 / reset.as_secs_f64();
    let percent = (100.0 * per_minute / limit as f64)
        .round()
        .clamp(1.0, 100.0);
    (limit as f64 * percent / 100.0) as u64
}

fn call_report(answer: &HttpAnswer) -> CallReport {
    let upstream = match answer.status {
        Status::Ok => Upstream::Success,
        Status::RateLimited => Upstream::Backpressure(1),
        // An overloaded model says nothing of the organisation's rate: each process's own bucket
        // and the model's window still react to it (`feedback`), the fleet's rate does not.
        Status::Overloaded => Upstream::Silent,
    };
    CallReport {
        spent: answer.charged_tokens,
        upstream,
        tokens_left: answer.rate_limit.token_remaining,
    }
}

/// Settles a step's reservation with what the answer says was billed: the prompt and the output
/// of a call that ran, nothing for a 429 or a 529 (the provider bills neither). The rest of the
/// reservation goes back to the workflow's cap.
pub fn settle(reservation: CallReservation, step: &StepPlan, answer: &HttpAnswer) {
    let (input, output) = match answer.status {
        Status::Ok => (step.input_tokens, step.output_tokens),
        Status::RateLimited | Status::Overloaded => (0, 0),
    };
    let _ = reservation.settle(input, output);
}

/// What a step stores once its call answered: `ok` with the tokens used, or the refusal with none.
pub fn result_row(
    job: &JobPlan,
    index: usize,
    attempt: u32,
    step: &StepPlan,
    response: &HttpAnswer,
    at: Duration,
) -> Row {
    let (outcome, tokens) = match response.status {
        Status::Ok => ("ok", step.input_tokens + step.output_tokens),
        Status::RateLimited => ("rate-limited", 0),
        Status::Overloaded => ("overloaded", 0),
    };
    Row {
        agent: job.name.clone(),
        step: index,
        attempt,
        model: job.model,
        tokens,
        outcome,
        at,
    }
}

/// 1, 2, 4, 8, 16 simulated seconds, then 16 again.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1 << attempt.min(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refill_the_headers_tell_is_the_limit_or_less() {
        let info = |remaining: &str, reset: &str| {
            RateLimitInfo::from_pairs(
                "m",
                [
                    ("x-ratelimit-limit-tokens", "100000"),
                    ("x-ratelimit-remaining-tokens", remaining),
                    ("x-ratelimit-reset-tokens", reset),
                ],
                std::time::SystemTime::now(),
            )
        };
        // 60,000 short, full again in 36 s: 100,000 a minute, the whole limit.
        assert_eq!(refilled_tokens_per_minute(&info("40000", "36s")), 100_000);
        // The same 60,000 in 65.45 s: 55,000 a minute (a neighbour takes 45 %).
        assert_eq!(
            refilled_tokens_per_minute(&info("40000", "1m5.45s")),
            55_000
        );
        // Full: nothing to read from the reset.
        assert_eq!(refilled_tokens_per_minute(&info("100000", "0s")), 100_000);
    }
}
