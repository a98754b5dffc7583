//! A fleet member's side of `--fleet N`: one Redis cell per model (`<prefix>-<model>`), whose
//! ceilings bound the model across every process of the fleet, and the lease each agent step
//! takes from it.
//!
//! A step's lease is taken *first*, before the step asks its own process's monitor for the local
//! demand (HTTP connection, the model's tokens and request, the database permit), and released
//! after the local grant is given back: a step never holds a local permit while it waits in the
//! fleet's line. The lease's footprint is the step's token charge (prompt + declared most output,
//! what the bucket charges) and it counts as one transfer, so the cell's service bytes are the
//! model's fleet-wide tokens in flight and its service transfers the model's fleet-wide requests
//! in flight.
//!
//! Lease waits are real time on the Redis server; they are recorded in simulated time (times the
//! scale, read on the run's clock) like every other wait of the example.
//!
//! For the parent's verdict a member also records, by the wall clock every process of the
//! machine shares, each lease it held (from the grant's return to the release call: Redis held it
//! at least that long) and, for each job that timed out or failed, the deadline of the lease wait
//! that ended it (see `chaos.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission_llm::model_spec::{ModelCatalog, ModelSpec};
use admission_redis::{
    AcquireError, Burst, CallReport, Ceilings, Durability, Lease, LeaseError, LeaseRequest,
    LossReason, Outcome, Rates, RedisAdmission, RedisAdmissionConfig,
};
use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::chaos::{self, EndKind, Hold, JobEnd};
use crate::clock::ScaledClock;
use crate::redis_server::FleetRedis;
use crate::stats::JobOutcome;
use crate::stop::Stop;
use crate::workload::{JobPlan, StepPlan};

/// The tenant every lease names: the whole fleet is one tenant, whose ceilings are the service's.
const TENANT: &str = "agents";
/// The operation label of a step's lease.
const OPERATION: &str = "llm_call";
/// Records kept in each cell's events stream: enough for a run's every transition, so that the
/// peak read back from the stream is complete.
pub const EVENTS_MAX_LEN: u64 = 200_000;
/// A cell's fleet-wide tokens in flight: this many simulated seconds of the model's token budget.
/// Long enough that what is in flight does not bind before the rate does (a call runs several
/// simulated seconds): the rate is the organisation's limit, shared by the cell's rates with
/// `--fleet-rates on` and not at all with `off`, and the two runs differ only in that.
const TOKENS_IN_FLIGHT_SECONDS: u64 = 30;
/// Without a catalog concurrency cap, the fleet-wide requests in flight: this many seconds of
/// the model's request budget.
const REQUESTS_IN_FLIGHT_SECONDS: u64 = 3;
/// Once the member stops, how long a step waits for Redis to confirm its lease's release before
/// it leaves the release to a spawned task.
pub const RELEASE_AFTER_STOP: Duration = Duration::from_secs(1);

/// One model's fleet-wide ceilings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCeiling {
    /// Tokens (prompt + declared most output) of the calls in flight fleet-wide.
    pub tokens: u64,
    /// Calls in flight fleet-wide.
    pub requests: u64,
}

/// The fleet's ceilings of `spec`, from the catalog: its declared concurrency cap (the provider's
/// cap is per organisation, so fleet-wide), else [`REQUESTS_IN_FLIGHT_SECONDS`] of its request
/// budget; [`TOKENS_IN_FLIGHT_SECONDS`] of its token budget. Both at least 1; the tokens at
/// least one step's largest charge.
pub fn model_ceiling(spec: &ModelSpec) -> ModelCeiling {
    let requests = spec
        .max_concurrent
        .unwrap_or_else(|| spec.effective_requests_per_minute() * REQUESTS_IN_FLIGHT_SECONDS / 60);
    let tokens = spec.tokens_per_minute * TOKENS_IN_FLIGHT_SECONDS / 60;
    ModelCeiling {
        tokens: tokens.max(crate::workload::LARGEST_STEP_TOKENS),
        requests: requests.max(1),
    }
}

/// What the fleet's server promises of a write it acknowledged, as every cell declares it
/// (`RedisAdmissionConfig::durability`, part of a cell's fingerprint: the parent and every member
/// declare the same). The parent picks it for its fault: a server that promises nothing makes a
/// cell recover (admit nothing new for one lease TTL) after a restart or a failover; one that
/// promises what the fault cannot break makes it admit straight on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Promise {
    /// Nothing (the default).
    #[default]
    Nothing,
    /// The server runs `--appendonly yes --appendfsync always`: a restart loses nothing
    /// acknowledged (`Durability::fsync_always`).
    FsyncAlways,
    /// Every call counts once one replica has its writes (`Durability::replicas = 1`, a `WAIT 1`
    /// with each): a failover to that replica loses nothing acknowledged.
    OneReplica,
}

impl Promise {
    /// The cells' `durability` for it.
    pub fn durability(self) -> Durability {
        match self {
            Promise::Nothing => Durability::default(),
            Promise::FsyncAlways => Durability {
                fsync_always: true,
                ..Durability::default()
            },
            Promise::OneReplica => Durability {
                replicas: 1,
                ..Durability::default()
            },
        }
    }

    /// The name the command line spells.
    pub fn name(self) -> &'static str {
        match self {
            Promise::Nothing => "nothing",
            Promise::FsyncAlways => "fsync-always",
            Promise::OneReplica => "one-replica",
        }
    }
}

/// The cell of `model` in a fleet run whose cells are named from `prefix`.
pub fn cell_name(prefix: &str, model: &str) -> String {
    format!("{prefix}-{model}")
}

/// The config every process of the fleet uses for a model's cell on `redis` (they must agree:
/// the cell keeps the first one's fingerprint): on a cluster, its seed nodes, the cell's name
/// (with the key prefix, its keys' hash tag) choosing the master that serves it. `wait` is the
/// longest a lease may wait, in real time; `promise`, what the server promises of an
/// acknowledged write.
pub fn cell_config(
    redis: &FleetRedis,
    cell: &str,
    ceiling: ModelCeiling,
    wait: Duration,
    rates: Option<Rates>,
    promise: Promise,
) -> RedisAdmissionConfig {
    let ceilings = Ceilings {
        service_bytes: ceiling.tokens,
        service_transfers: ceiling.requests,
        tenant_bytes: ceiling.tokens,
        tenant_transfers: ceiling.requests,
        backend_transfers: ceiling.requests,
    };
    let mut config = match redis {
        FleetRedis::Server(endpoint) => {
            RedisAdmissionConfig::new(endpoint.host.as_str(), endpoint.port, cell, ceilings)
        }
        FleetRedis::Cluster(nodes) => RedisAdmissionConfig::cluster(
            nodes.0.iter().map(|n| (n.host.as_str(), n.port)),
            cell,
            ceilings,
        ),
    };
    config.events_max_len = EVENTS_MAX_LEN;
    config.rates = rates;
    config.redis_wait = wait;
    config.local_timeout = wait;
    config.durability = promise.durability();
    config
}

/// A model's rates as its cell carries them with `--fleet-rates on`: the catalog's tokens and
/// requests per minute (the provider's headers correct them for the whole fleet once the first
/// answers arrive), per minute of the run's **simulated** time: the cell refills on the Redis
/// server's real clock, on which a simulated minute lasts `60 s / scale`. Held over every
/// rolling minute ([`FLEET_BURST`]): no span of 60 s simulated spends more than the budget.
pub fn model_rates(spec: &ModelSpec, scale: u32) -> Rates {
    simulated_rates(
        (spec.tokens_per_minute, spec.effective_requests_per_minute()),
        scale,
    )
    .within_every_minute(FLEET_BURST)
}

/// The most a cell's rate levels hold at once: the largest step's tokens (5,048) with a margin
/// (a head waiting for its instant asks a little late, in which the level must not fill up and
/// waste refill: 152 tokens are 1.5 ms of model-a's refill at a time scale of 60), and a few
/// requests. The rest of each budget is refilled per minute: the burst is what holding the
/// limit over every rolling minute costs (5.2 % of model-a's 100,000 tokens).
pub const FLEET_BURST: Burst = Burst {
    tokens: 5_200,
    requests: 4,
};

/// The share of a model's limits a cell's budgets keep back, percent: a call reaches the provider
/// after its grant by the time its process's own admission takes (the HTTP gate, the process's
/// bucket of the model), up to about a simulated second, so one minute of grants can reach the
/// provider as a minute and a second of calls.
pub const LAG_MARGIN_PERCENT: u64 = 2;

/// `(tokens, requests)` per simulated minute at `scale`, less [`LAG_MARGIN_PERCENT`].
fn simulated_rates((tokens, requests): (u64, u64), scale: u32) -> Rates {
    let kept = |limit: u64| (limit - limit * LAG_MARGIN_PERCENT / 100).max(1);
    Rates {
        minute: Duration::from_secs(60) / scale.max(1),
        ..Rates::per_minute(kept(tokens), kept(requests))
    }
}

/// The cells of every model in `catalog`, connected (each created by whoever comes first).
/// `new_cells`: the names were never used before (a run's own prefix), so a cell created now
/// admits at once; otherwise a cell this call creates recovers first (the default: it may have
/// been lost with leases still running, as when the server restarted empty). `rates`: each cell
/// also carries its model's rates ([`model_rates`]) at the run's time scale. `promise`: what
/// the server promises of an acknowledged write ([`Promise`]).
///
/// # Errors
///
/// When a cell's config is refused or the server cannot be reached.
pub async fn connect_all(
    catalog: &ModelCatalog,
    redis: &FleetRedis,
    prefix: &str,
    wait: Duration,
    new_cells: bool,
    rates: Option<u32>,
    promise: Promise,
) -> anyhow::Result<BTreeMap<String, (RedisAdmission, ModelCeiling)>> {
    let mut cells = BTreeMap::new();
    for spec in &catalog.models {
        let ceiling = model_ceiling(spec);
        let cell = cell_name(prefix, &spec.id);
        let rates = rates.map(|scale| model_rates(spec, scale));
        let mut config = cell_config(redis, &cell, ceiling, wait, rates, promise);
        config.recover_created_cells = !new_cells;
        let admission = RedisAdmission::connect(config)
            .await
            .with_context(|| format!("connecting to the cell {cell} on {redis}"))?;
        cells.insert(spec.id.clone(), (admission, ceiling));
    }
    Ok(cells)
}

/// One model's leases, as a member counts them.
#[derive(Debug, Default)]
struct Tally {
    leases: AtomicU64,
    peak_tokens: AtomicU64,
    peak_requests: AtomicU64,
    timed_out: AtomicU64,
    failed: AtomicU64,
    lost: AtomicU64,
    release_unconfirmed: AtomicU64,
    /// Simulated microseconds each lease waited.
    waits_us: Mutex<Vec<u64>>,
    /// Each lease held, by the wall clock (shared with the leases, which add themselves).
    holds: Arc<Mutex<Vec<Hold>>>,
}

/// A member's cells and what it counted on them.
pub struct Cells {
    member: u32,
    cells: BTreeMap<String, (RedisAdmission, ModelCeiling)>,
    tallies: BTreeMap<String, Tally>,
    /// The longest a lease waits, real time.
    wait: Duration,
    /// With the models' rates in the cells: the run's time scale (the cells' budgets are per
    /// real minute).
    rates: Option<u32>,
    /// Per model, the budgets last applied to its cell from the provider's headers.
    applied: Mutex<BTreeMap<String, (u64, u64)>>,
    /// The runtime the leases live on, for agents on blocking threads.
    runtime: tokio::runtime::Handle,
    /// Per job, the wall-clock deadline (ms) of its last lease wait that failed: a failed wait
    /// ends its job, so this is the deadline of the wait that ended it.
    failed_waits: Mutex<HashMap<String, u64>>,
    /// The jobs that timed out or failed.
    ends: Mutex<Vec<JobEnd>>,
}

/// What a step's call tells its model's cell: what to release the lease with, and the budgets the
/// provider's headers reported (tokens and requests per minute), if they did.
#[derive(Clone, Copy, Debug)]
pub struct StepReport {
    pub call: CallReport,
    pub limits: Option<(u64, u64)>,
}

/// A step's lease; give it back with [`Cells::release`].
pub struct StepLease {
    model: &'static str,
    lease: Lease,
    held: HeldSince,
}

impl StepLease {
    /// Completes when the fleet lease is lost (Redis says it is gone, or no renewal got through
    /// before its local deadline): the step must stop then, since its capacity may already be
    /// someone else's.
    pub fn lost(&self) -> impl std::future::Future<Output = LossReason> + Send + 'static {
        self.lease.lost()
    }

    /// The loss, if the lease is already lost.
    pub fn loss(&self) -> Option<LossReason> {
        self.lease.loss()
    }
}

/// A lease's hold by the wall clock, recorded when it ends: at the release call, or when the
/// lease is dropped unreleased (a job aborted at the end of a stopped run).
struct HeldSince {
    since_us: u64,
    tokens: u64,
    holds: Arc<Mutex<Vec<Hold>>>,
}

impl Drop for HeldSince {
    fn drop(&mut self) {
        if let Ok(mut holds) = self.holds.lock() {
            holds.push([self.since_us, chaos::wall_us(), self.tokens]);
        }
    }
}

/// What a member reports of one model's cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellReading {
    /// The model.
    pub model: String,
    /// The cell's ceilings.
    pub ceiling: Option<ModelCeiling>,
    /// Leases taken.
    pub leases: u64,
    /// The most tokens in flight fleet-wide that a lease of this member saw at its admission.
    pub peak_tokens: u64,
    /// The most requests in flight fleet-wide that a lease of this member saw.
    pub peak_requests: u64,
    /// Lease waits that ran out.
    pub timed_out: u64,
    /// Lease acquisitions that failed otherwise (Redis unavailable, refused for good).
    pub failed: u64,
    /// Leases lost before their release (reaped, or given to another holder).
    pub lost: u64,
    /// Releases that Redis did not confirm (it could not be reached): the lease's TTL takes it
    /// back; the parent's reading of the cell after the run says whether it did.
    #[serde(default)]
    pub release_unconfirmed: u64,
    /// Each lease's wait, simulated microseconds.
    pub waits_us: Vec<u64>,
    /// Each lease held: `[acquired, released, tokens]`, wall-clock microseconds.
    #[serde(default)]
    pub holds: Vec<Hold>,
}

impl Cells {
    /// Connects member `member` to the cells named from `prefix` on `redis`. Runs inside the
    /// runtime its leases will live on.
    ///
    /// # Errors
    ///
    /// As for [`connect_all`].
    pub async fn connect(
        member: u32,
        catalog: &ModelCatalog,
        redis: &FleetRedis,
        prefix: &str,
        wait: Duration,
        rates: Option<u32>,
        promise: Promise,
    ) -> anyhow::Result<Cells> {
        // The parent created the run's cells; one created again now was lost mid-run.
        let cells = connect_all(catalog, redis, prefix, wait, false, rates, promise).await?;
        let tallies = cells
            .keys()
            .map(|m| (m.clone(), Tally::default()))
            .collect();
        Ok(Cells {
            member,
            cells,
            tallies,
            wait,
            rates,
            applied: Mutex::new(BTreeMap::new()),
            runtime: tokio::runtime::Handle::current(),
            failed_waits: Mutex::new(HashMap::new()),
            ends: Mutex::new(Vec::new()),
        })
    }

    /// The lease of one attempt of a step, waiting in the fleet's line for at most the wait
    /// given at connect, or until `stop` is triggered (the wait's ticket is then withdrawn);
    /// `None` for a model without a cell.
    ///
    /// # Errors
    ///
    /// The job's outcome when no lease came: timed out, cancelled, or failed with the reason.
    pub async fn acquire(
        &self,
        stop: &Stop,
        clock: &ScaledClock,
        job: &JobPlan,
        step_index: usize,
        attempt: u32,
        step: &StepPlan,
    ) -> Result<Option<StepLease>, JobOutcome> {
        let (Some((cell, _)), Some(tally)) =
            (self.cells.get(job.model), self.tallies.get(job.model))
        else {
            return Ok(None);
        };
        let request = LeaseRequest::new(
            format!("m{}-{}-s{step_index}-a{attempt}", self.member, job.name),
            TENANT,
            job.model,
            step.input_tokens + step.max_output_tokens,
            OPERATION,
        );
        let asked_at = clock.elapsed();
        let deadline_ms = chaos::wall_ms()
            .saturating_add(u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX));
        let acquired = tokio::select! {
            acquired = cell.acquire(&request, self.wait) => acquired,
            // Dropping the wait withdraws its ticket (on a spawned task).
            () = stop.triggered() => return Err(JobOutcome::Cancelled),
        };
        match acquired {
            Ok(lease) => {
                let waited = clock.elapsed().saturating_sub(asked_at);
                let occupancy = lease.occupancy();
                tally.leases.fetch_add(1, Ordering::Relaxed);
                tally
                    .peak_tokens
                    .fetch_max(occupancy.service_bytes, Ordering::Relaxed);
                tally
                    .peak_requests
                    .fetch_max(occupancy.service_transfers, Ordering::Relaxed);
                if let Ok(mut waits) = tally.waits_us.lock() {
                    waits.push(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
                }
                Ok(Some(StepLease {
                    model: job.model,
                    lease,
                    held: HeldSince {
                        since_us: chaos::wall_us(),
                        tokens: request.footprint,
                        holds: tally.holds.clone(),
                    },
                }))
            }
            Err(error) => {
                if let Ok(mut failed) = self.failed_waits.lock() {
                    failed.insert(job.name.clone(), deadline_ms);
                }
                // A wait that ran out, on a full cell or on one still recovering.
                if let AcquireError::TimedOut { .. } | AcquireError::Recovering { .. } = error {
                    tally.timed_out.fetch_add(1, Ordering::Relaxed);
                    Err(JobOutcome::TimedOut)
                } else {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                    Err(JobOutcome::Failed(format!("the fleet lease: {error}")))
                }
            }
        }
    }

    /// [`acquire`](Cells::acquire) for an agent on a blocking thread.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Cells::acquire).
    pub fn acquire_blocking(
        &self,
        stop: &Stop,
        clock: &ScaledClock,
        job: &JobPlan,
        step_index: usize,
        attempt: u32,
        step: &StepPlan,
    ) -> Result<Option<StepLease>, JobOutcome> {
        self.runtime
            .block_on(self.acquire(stop, clock, job, step_index, attempt, step))
    }

    /// Gives a step's lease back: `Some` when the attempt went on (`completed`), with what its
    /// call, if it made one, reported (the tokens the provider charged, the rest going back to a
    /// cell's rate, and the provider's load signal for the cell's throttle); `None` when the
    /// attempt ended its job (`failed`). With rates, budgets the provider's headers report that
    /// differ from the ones last applied become the cell's, for every member.
    ///
    /// Once `stop` is triggered, a release Redis has not confirmed within
    /// [`RELEASE_AFTER_STOP`] goes on on a spawned task ([`Cells::settle`] waits for it) and the
    /// step ends: a member whose parent died, the fleet's private server with it, stops without
    /// retrying a release until the lease's deadline (the TTL takes the lease back).
    pub async fn release(&self, stop: &Stop, lease: StepLease, report: Option<Option<StepReport>>) {
        let StepLease { model, lease, held } = lease;
        drop(held); // the work under the lease is over
        if let Some(Some(StepReport {
            limits: Some(limits),
            ..
        })) = report
        {
            self.apply_limits(model, limits).await;
        }
        let release = async {
            match report {
                Some(Some(report)) => {
                    lease
                        .release_reported(Outcome::Completed, report.call)
                        .await
                }
                // No call was made: nothing was spent upstream.
                Some(None) => lease.release_spent(Outcome::Completed, 0).await,
                None => lease.release(Outcome::Failed).await,
            }
        };
        // Dropping the release before Redis answered releases the lease on a spawned task.
        let released = tokio::select! {
            released = release => Some(released),
            () = async {
                stop.triggered().await;
                tokio::time::sleep(RELEASE_AFTER_STOP).await;
            } => None,
        };
        let Some(tally) = self.tallies.get(model) else {
            return;
        };
        match released {
            Some(Ok(())) => {}
            // Not confirmed: Redis could not be reached (the TTL takes the lease back), or did
            // not answer before the member stopped waiting.
            None | Some(Err(LeaseError::Unavailable(_))) => {
                tally.release_unconfirmed.fetch_add(1, Ordering::Relaxed);
            }
            // Lost or stale: the lease was not ours to the end.
            Some(Err(_)) => {
                tally.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// [`release`](Cells::release) for an agent on a blocking thread.
    pub fn release_blocking(
        &self,
        stop: &Stop,
        lease: StepLease,
        report: Option<Option<StepReport>>,
    ) {
        self.runtime.block_on(self.release(stop, lease, report));
    }

    /// Makes `(tokens, requests)` per minute the budgets of `model`'s cell unless they are the
    /// ones this member applied last (the cell ignores the same budgets again anyway: this
    /// only saves the call).
    async fn apply_limits(&self, model: &str, limits: (u64, u64)) {
        let Some(scale) = self.rates.filter(|_| limits.0 > 0 && limits.1 > 0) else {
            return;
        };
        let Some((cell, _)) = self.cells.get(model) else {
            return;
        };
        {
            let Ok(mut applied) = self.applied.lock() else {
                return;
            };
            if applied.get(model) == Some(&limits) {
                return;
            }
            applied.insert(model.to_owned(), limits);
        }
        let real = simulated_rates(limits, scale);
        let updated = cell
            .update_rates(real.tokens_per_minute, real.requests_per_minute)
            .await;
        if let Err(error) = updated {
            tracing::debug!(%error, model, "the provider's limits were not applied to the cell");
        }
    }

    /// Waits until the releases and withdrawals spawned for dropped leases and lease waits
    /// (cancelled jobs) have reached Redis.
    pub async fn settle(&self) {
        for (admission, _) in self.cells.values() {
            admission.settle().await;
        }
    }

    /// Records how job `job` ended, if it timed out or failed, with the deadline of the lease
    /// wait that ended it (none if something else ended it).
    pub fn job_ended(&self, job: &str, outcome: &JobOutcome) {
        let (kind, error) = match outcome {
            JobOutcome::TimedOut => (EndKind::TimedOut, None),
            JobOutcome::Failed(message) => (EndKind::Failed, Some(message.clone())),
            _ => return,
        };
        let deadline_ms = self
            .failed_waits
            .lock()
            .ok()
            .and_then(|mut failed| failed.remove(job));
        if let Ok(mut ends) = self.ends.lock() {
            ends.push(JobEnd {
                job: job.to_owned(),
                kind,
                deadline_ms,
                error,
            });
        }
    }

    /// The jobs that timed out or failed so far.
    pub fn ends(&self) -> Vec<JobEnd> {
        self.ends.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// What this member counted, per model.
    pub fn readings(&self) -> Vec<CellReading> {
        self.tallies
            .iter()
            .map(|(model, t)| CellReading {
                model: model.clone(),
                ceiling: self.cells.get(model).map(|(_, c)| *c),
                leases: t.leases.load(Ordering::Acquire),
                peak_tokens: t.peak_tokens.load(Ordering::Acquire),
                peak_requests: t.peak_requests.load(Ordering::Acquire),
                timed_out: t.timed_out.load(Ordering::Acquire),
                failed: t.failed.load(Ordering::Acquire),
                lost: t.lost.load(Ordering::Acquire),
                release_unconfirmed: t.release_unconfirmed.load(Ordering::Acquire),
                waits_us: t.waits_us.lock().map(|w| w.clone()).unwrap_or_default(),
                holds: t.holds.lock().map(|h| h.clone()).unwrap_or_default(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_come_from_the_catalog() {
        let catalog = ModelCatalog::from_toml(crate::CATALOG).unwrap();
        let ceiling = |id: &str| model_ceiling(catalog.models.iter().find(|m| m.id == id).unwrap());
        // model-a: 125,000 tpm * 30 s / 60 s; 150 rpm * 3 s / 60 s.
        assert_eq!(
            ceiling("model-a"),
            ModelCeiling {
                tokens: 62_500,
                requests: 7
            }
        );
        assert_eq!(
            ceiling("model-b"),
            ModelCeiling {
                tokens: 500_000,
                requests: 60
            }
        );
        // model-c declares its concurrency cap: it is the fleet's.
        assert_eq!(
            ceiling("model-c"),
            ModelCeiling {
                tokens: 150_000,
                requests: 4
            }
        );
        assert_eq!(cell_name("agents-7", "model-a"), "agents-7-model-a");
        let server = FleetRedis::Server("127.0.0.1:6379".parse().unwrap());
        let config = cell_config(
            &server,
            "agents-7-model-a",
            ceiling("model-a"),
            Duration::from_secs(6),
            None,
            Promise::Nothing,
        );
        assert!(config.validate().is_ok());
        assert_eq!(config.durability, Durability::default());
        assert_eq!(config.ceilings.service_bytes, 62_500);
        assert_eq!(config.ceilings.backend_transfers, 7);
        assert!(config.cluster_nodes.is_empty());
        assert_eq!((config.host.as_str(), config.port), ("127.0.0.1", 6379));
    }

    #[test]
    fn a_cells_rates_are_the_catalogs_per_real_minute() {
        let catalog = ModelCatalog::from_toml(crate::CATALOG).unwrap();
        let spec = catalog.models.iter().find(|m| m.id == "model-a").unwrap();
        // model-a: 125,000 tokens and 150 requests a simulated minute less 2 %, held over every
        // rolling minute; a simulated minute lasts 0.2 s of
        // the server's clock at a scale of 300.
        assert_eq!(
            model_rates(spec, 300),
            Rates {
                tokens_per_minute: 122_500,
                requests_per_minute: 147,
                burst: Some(FLEET_BURST),
                minute: Duration::from_millis(200),
            }
        );
        assert_eq!(model_rates(spec, 1).minute, Duration::from_secs(60));
        let server = FleetRedis::Server("127.0.0.1:6379".parse().unwrap());
        let ceiling = model_ceiling(spec);
        let config = cell_config(
            &server,
            "c",
            ceiling,
            Duration::from_secs(6),
            Some(model_rates(spec, 60)),
            Promise::Nothing,
        );
        assert!(config.validate().is_ok());
        assert_eq!(config.rates.map(|r| r.minute), Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_cell_on_a_cluster_gets_every_seed_node_and_the_same_settings() {
        let cluster = FleetRedis::Cluster(
            "127.0.0.1:7001,127.0.0.1:7002,10.0.0.3:7000"
                .parse()
                .unwrap(),
        );
        let ceiling = ModelCeiling {
            tokens: 10_416,
            requests: 7,
        };
        let wait = Duration::from_secs(12);
        let config = cell_config(
            &cluster,
            "agents-7-model-a",
            ceiling,
            wait,
            None,
            Promise::OneReplica,
        );
        assert_eq!(config.durability.replicas, 1);
        assert!(config.validate().is_ok());
        assert_eq!(
            config.cluster_nodes,
            [
                ("127.0.0.1".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7002),
                ("10.0.0.3".to_owned(), 7000)
            ]
        );
        assert_eq!((config.host.as_str(), config.port), ("127.0.0.1", 7001));
        // The cell's name is its hash tag, as on one server.
        assert_eq!(config.cell, "agents-7-model-a");
        let single = cell_config(
            &FleetRedis::Server("127.0.0.1:7001".parse().unwrap()),
            "agents-7-model-a",
            ceiling,
            wait,
            None,
            Promise::OneReplica,
        );
        assert_eq!(
            (
                config.events_max_len,
                config.redis_wait,
                config.local_timeout,
                config.key_prefix.as_str()
            ),
            (
                single.events_max_len,
                single.redis_wait,
                single.local_timeout,
                single.key_prefix.as_str()
            )
        );
    }
}
