//! An agent fleet on one admission monitor: the README's first command.
//!
//! ```text
//! cargo run --release --example agents                                  # 400 agents, ~15 s
//! cargo run --release --example agents -- --strategy hold-and-wait      # both designs, side by side
//! cargo run --release --example agents -- --time-scale 300 --check    # CI's short run
//! cargo run --release --example agents -- --fleet 4                    # 4 processes, one Redis
//! cargo run --release --example agents -- --fleet 4 --chaos restart    # ... through a fault
//! cargo run --release --example agents -- --fleet 4 --chaos kill-master  # ... on a Redis Cluster
//! cargo run --release --example agents -- --fleet 4 --chaos failover   # ... a planned failover
//! cargo run --release --example agents -- --metrics 127.0.0.1:9000     # Prometheus at /metrics
//! cargo run --release --example agents -- --tenants acme:1:300,globex:1:100 \
//!     --interactive-percent 10 --fairness both            # fair shares and levels, on and off
//! ```
//!
//! Hundreds of LLM agents run in one process. Each step of an agent asks for everything the step
//! needs as one demand — an HTTP connection, the model's tokens and one request (charged prompt +
//! declared `max_tokens`, as providers count), the model's concurrency slot and sliding window
//! where the catalog declares them, and sometimes a database connection and a call of an external
//! search API's fixed window — built by the provider layer's `Registry::demand_for` from
//! `models.toml`. The monitor grants it whole, or the step waits in one FIFO line holding nothing.
//!
//! The database is real: a fresh SQLite file (WAL) behind an r2d2 pool, reached through
//! `admission_db`'s `R2d2SqliteProvider`, whose gate `db:results` is the database part of a
//! demand. A step that holds it checks a connection out after its grant, stores its result in
//! the `results` table in one committed transaction and gives the connection back before the
//! permit (`results.rs`); the summary reads the row count back.
//!
//! The upstream is simulated (`provider_sim.rs`) and stricter than the catalog: the first
//! responses' rate-limit headers correct the local buckets (`Registry::observe`), 429s and 529s
//! raise each bucket's adaptive throttle (`on_rate_limit_error`, `on_overload`) and successes
//! relax it (`on_success`), so the fleet converges on what the provider really allows, including
//! when a neighbour starts sharing the quota.
//!
//! Time is simulated: one [`clock::ScaledClock`] drives the monitor, every limiter and the
//! provider, with `--time-scale` simulated seconds per real second (60 by default: a simulated
//! minute, the unit every budget is written in, takes one real second). Waits, spans and
//! tokens-per-minute in the summary are simulated.
//!
//! `--strategy hold-and-wait` runs the same seed twice, once on the monitor and once as the
//! chain of single-limit waits services write today (`chain.rs`), and prints both summaries and
//! a side-by-side table (the chain takes its database permits from a plain semaphore and stores
//! nothing). Files land in `target/agents/`: `events.jsonl` (every monitor event),
//! `results.sqlite` (the monitor run's results), `timeline-<strategy>.svg` and `summary.json`.
//!
//! Every wait has a deadline (`--admit-timeout`, `--run-timeout`); Ctrl-C (or SIGTERM) cancels
//! every job through its `JobContext`, stops the monitor and still prints the summary.
//!
//! `--fleet N` runs the agents as N processes of this program sharing one Redis cell per model
//! (`multi.rs` the parent, `cells.rs` a member's leases, `redis_server.rs` the private server,
//! `admission_testkit::redis_servers` a private Redis Cluster; `--redis-cluster` puts the cells on a
//! cluster):
//! each step takes its model's fleet lease first and then its local demand, and the parent
//! prints per-process rows and fleet totals and checks the fleet's ceilings. The parent forwards
//! SIGINT and SIGTERM to its members, and a member whose parent is gone stops (`signals.rs`).
//! `--chaos restart|restart-fsync|pause|kill-member|kill-master|failover` has the parent inject
//! one fault mid-run and judge the fleet's availability through it (when admission resumed
//! against the rule's bound, the share of jobs failed, each failed job against the window from
//! the fault to the resumption) and its ceilings (`chaos.rs`; `kill-master` SIGKILLs a master of
//! a private six-node Redis Cluster, `failover` moves one with `CLUSTER FAILOVER`): `cargo xtask
//! chaos` runs all six. The private servers and clusters the parent starts die with it, however
//! it dies (`admission_testkit::redis_servers::PrivateServer`).
//!
//! `--metrics ADDR` serves the monitor's events as Prometheus series at `http://ADDR/metrics`
//! while the run lasts (`metrics.rs`: `admission_events::MetricsSink` behind the run's fanout).
//!
//! `--tenants NAME:WEIGHT:AGENTS,...` gives the agents tenants of different sizes (in place of
//! `--jobs`), and `--interactive-percent P` runs P agents in a hundred at an `interactive`
//! priority level above `batch`. Under `--fairness on` (the default once either is given) the
//! monitor shares its line between the tenants by weight (`FairShares`) and keeps the levels
//! (`Levels`, the interactive level reserving a few steps' tokens of each model); `--fairness
//! off` is the same plan and contexts in arrival order, and `--fairness both` runs the seed each
//! way and prints them side by side. The summary gives each tenant's share of each model's
//! tokens against its weight's share while backlogged, and each level's waits; the timeline a
//! panel of the tenants' shares per simulated minute; `--check`, under fairness on, fails a
//! tenant's share of model-a's tokens off its weight's by more than 0.05, or an interactive p99
//! wait above a simulated minute (`fairness.rs`). Without these flags nothing changes.

mod cells;
mod chain;
mod chaos;
mod clock;
mod events;
mod fairness;
mod fleet;
mod metrics;
mod multi;
mod progress;
mod provider_http;
mod provider_sim;
mod redis_server;
mod report;
mod results;
mod rng;
mod run;
mod signals;
mod stats;
mod stop;
mod timeline;
mod workload;
mod world;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use admission_llm::model_spec::ModelCatalog;
use admission_llm::spend::Money;
use anyhow::Context as _;
use clap::{Parser, ValueEnum, value_parser};

use crate::cells::{Cells, Promise};
use crate::chaos::Fault;
use crate::fairness::{FairnessArg, Mode, TenantList};
use crate::multi::MemberReport;
use crate::redis_server::{ClusterNodes, Endpoint, FleetRedis};
use crate::report::RunSummary;
use crate::run::{Input, Strategy};
use crate::stop::Stop;
use crate::workload::WorkloadConfig;
use crate::world::Settings;

/// The fleet's model catalog.
pub const CATALOG: &str = include_str!("models.toml");
/// How long an interrupted fleet member waits for its cancelled jobs' releases and withdrawals
/// to reach Redis before it reports.
const SETTLE_WITHIN: Duration = Duration::from_secs(2);

/// Which way the agents take their limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StrategyArg {
    /// One admission of each step's whole demand.
    Monitor,
    /// The monitor run, then the same workload taking limits one by one while holding each;
    /// prints both summaries side by side.
    HoldAndWait,
    /// The same as hold-and-wait: both runs, compared.
    Both,
}

/// Hundreds of LLM agents sharing HTTP connections, model token budgets, a database and a search
/// API through one admission monitor, against a simulated provider with its own limits.
#[derive(Clone, Debug, Parser)]
#[command(name = "agents", version)]
#[command(group(clap::ArgGroup::new("server").args(["redis", "redis_cluster"])))]
#[command(group(clap::ArgGroup::new("fair_input").args(["tenants", "interactive_percent"]).multiple(true)))]
struct Args {
    /// Agents to run.
    #[arg(long, default_value_t = 400, value_parser = value_parser!(u32).range(1..=100_000))]
    jobs: u32,

    /// Steps per agent (default: 2 to 5, drawn per agent).
    #[arg(long, value_parser = value_parser!(u32).range(1..=50))]
    steps: Option<u32>,

    /// Simulated seconds per real second: 60 makes a simulated minute last one real second.
    #[arg(long, default_value_t = 60, value_parser = value_parser!(u32).range(1..=10_000))]
    time_scale: u32,

    /// How agents take their limits.
    #[arg(long, value_enum, default_value_t = StrategyArg::Monitor)]
    strategy: StrategyArg,

    /// Seed of the workload and of the provider's draws.
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Agents in a hundred that run on blocking threads with `admit_blocking`.
    #[arg(long, default_value_t = 10, value_parser = value_parser!(u8).range(0..=100))]
    blocking_percent: u8,

    /// HTTP connections to the provider.
    #[arg(long, default_value_t = 32, value_parser = value_parser!(u64).range(1..=100_000))]
    http: u64,

    /// Steps holding a results-database connection at once (the provider's bound; its pool has
    /// two more, the host's).
    #[arg(long, default_value_t = 8, value_parser = value_parser!(u64).range(1..=100_000))]
    db: u64,

    /// Search API calls allowed per simulated minute (a fixed window).
    #[arg(long, default_value_t = 40, value_parser = value_parser!(u64).range(1..=1_000_000))]
    search_per_minute: u64,

    /// Retries of a step after a 429, a 529 or an open circuit.
    #[arg(long, default_value_t = 5, value_parser = value_parser!(u32).range(0..=50))]
    retries: u32,

    /// Each agent's (workflow's) spend cap, in micro-units of the catalog's prices: every step is
    /// priced (prompt + declared most output) against it before it may wait, and a step it
    /// refuses ends its agent over budget, an expected outcome `--check` accepts. The default,
    /// 1 unit, is more than any agent of the workload spends (the most, seed 42: 0.105); 60000
    /// (0.06 units) stops the longest model-a agents.
    #[arg(long, default_value_t = 1_000_000)]
    budget_micros: u64,

    /// How long one admission may wait, in simulated seconds.
    #[arg(long, default_value_t = 1_800, value_parser = value_parser!(u64).range(1..=604_800))]
    admit_timeout: u64,

    /// The most real seconds one run may take before its jobs are cancelled.
    #[arg(long, default_value_t = 300, value_parser = value_parser!(u64).range(1..=86_400))]
    run_timeout: u64,

    /// Where the events file, the timelines and summary.json go [default: <target>/agents].
    #[arg(long)]
    out_dir: Option<PathBuf>,

    /// Exit non-zero unless nothing went over capacity, every job ended with no cancellation or
    /// failure (and, under the monitor, no timeout), nothing was still held or parked
    /// afterwards, and the results database holds one row per stored result.
    #[arg(long)]
    check: bool,

    /// Also write the summary as JSON to this path.
    #[arg(long)]
    json_summary: Option<PathBuf>,

    /// Run the agents as N processes sharing one Redis cell per model (each process runs 1/N of
    /// the agents, seed + its index), and print per-process rows and fleet totals.
    #[arg(long, value_name = "N", value_parser = value_parser!(u32).range(1..=16))]
    fleet: Option<u32>,

    /// With --fleet: the Redis server (HOST:PORT) of the fleet's cells [default: a private
    /// redis-server started from PATH, stopped at the end and when this process dies however
    /// it dies; with --chaos kill-master or failover, a private six-node Redis Cluster].
    #[arg(long, value_name = "HOST:PORT", requires = "fleet")]
    redis: Option<Endpoint>,

    /// With --fleet: put the fleet's cells on the Redis Cluster these seed nodes belong to (one
    /// is enough); each cell lives on the master that serves its slot.
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]", requires = "fleet")]
    redis_cluster: Option<ClusterNodes>,

    /// With --fleet: inject one fault mid-run and judge the fleet's availability through it.
    /// restart: SIGKILL the private redis-server and start it again on its port --chaos-down-ms
    /// later (it keeps an append-only file fsynced every second; the cells recover for one lease
    /// TTL); restart-fsync: the same with a file fsynced before each reply, which the cells are
    /// told (no recovery); pause: CLIENT PAUSE for --chaos-pause-ms; kill-member: SIGKILL the
    /// last member; kill-master: start a private six-node Redis Cluster and SIGKILL the master
    /// serving the first model's cell (a replica takes over, the cells recover for one lease
    /// TTL); failover: on such a cluster, CLUSTER FAILOVER to that master's replica, every call
    /// held until one replica has it (no recovery). The run prints when admission resumed
    /// against the fault's bound, the jobs that failed and how many had their own deadline
    /// between the fault and the resumption; --check fails it on a resumption out of its bound
    /// or none, any other failed job, a failed job or a recovery after a lossless fault
    /// (restart-fsync, failover), any ceiling exceeded, any lease left held.
    #[arg(long, value_enum, value_name = "FAULT", requires = "fleet")]
    chaos: Option<Fault>,

    /// With --chaos: when the fault is injected, in real milliseconds after the members started.
    #[arg(long, value_name = "MS", default_value_t = 1_000, requires = "chaos",
          value_parser = value_parser!(u64).range(0..=3_600_000))]
    chaos_after_ms: u64,

    /// With --chaos restart or restart-fsync: how long the server stays down, in real
    /// milliseconds, before it is started again.
    #[arg(long, value_name = "MS", default_value_t = chaos::DEFAULT_DOWN_MS, requires = "chaos",
          value_parser = value_parser!(u64).range(0..=3_600_000))]
    chaos_down_ms: u64,

    /// With --chaos pause: how long the CLIENT PAUSE lasts, in real milliseconds.
    #[arg(long, value_name = "MS", default_value_t = chaos::DEFAULT_PAUSE_MS, requires = "chaos",
          value_parser = value_parser!(u64).range(1..=3_600_000))]
    chaos_pause_ms: u64,

    /// Serve the monitor's metrics (admitted, rejected, released, waits, waiters, holds) in
    /// Prometheus's text format at http://ADDR/metrics while the run lasts (ADDR: IP:PORT).
    #[arg(long, value_name = "ADDR", conflicts_with = "fleet")]
    metrics: Option<SocketAddr>,

    /// With --metrics: after the run, keep the endpoint up until one more scrape has been
    /// served, at most this many seconds (0: stop at once), so the run's last values are read.
    #[arg(long, value_name = "SECS", default_value_t = 15, requires = "metrics",
          value_parser = value_parser!(u64).range(0..=3600))]
    metrics_linger: u64,

    /// Tenants sharing the agents, each NAME:WEIGHT:AGENTS (comma-separated, e.g.
    /// acme:1:300,globex:1:100): the tenant runs AGENTS agents (together in place of --jobs:
    /// the first AGENTS of the plan are the first tenant's) and, under --fairness on, is served
    /// by WEIGHT in fair shares of the monitor's line. The summary gives each tenant's share of
    /// each model's tokens against its weight's share while backlogged.
    #[arg(long, value_name = "NAME:WEIGHT:AGENTS[,...]", conflicts_with_all = ["jobs", "fleet"])]
    tenants: Option<TenantList>,

    /// Agents in a hundred (spread evenly through the plan) whose every step runs at the
    /// `interactive` priority level, above `batch` (the rest): under --fairness on an
    /// interactive step stands before every batch waiter, and the level reserves a few steps'
    /// worth of what they ask (three of the largest steps' tokens of each model's bucket, two
    /// calls of each window, a model slot, two HTTP connections and a database connection),
    /// which batch steps leave aside.
    #[arg(long, value_name = "P", conflicts_with = "fleet",
          value_parser = value_parser!(u8).range(0..=100))]
    interactive_percent: Option<u8>,

    /// With --tenants or --interactive-percent: on, the monitor keeps fair shares between the
    /// tenants and the priority levels; off, the same plan and contexts in arrival order; both,
    /// the seed run each way, printed side by side (not with --strategy hold-and-wait).
    /// --check judges the run with fairness on.
    #[arg(long, value_enum, value_name = "ON|OFF|BOTH", default_value_t = FairnessArg::On,
          requires = "fair_input")]
    fairness: FairnessArg,

    /// Internal: run as member I of a --fleet run (the parent passes it; the member stops when
    /// its stdin says so or closes).
    #[arg(long, hide = true, value_name = "I", requires_all = ["fleet", "server", "cell"],
          conflicts_with = "chaos")]
    fleet_member: Option<u32>,

    /// Internal: the prefix of the fleet's cell names (the parent passes it).
    #[arg(long, hide = true, value_name = "PREFIX", requires = "fleet_member")]
    cell: Option<String>,

    /// With --fleet: whether each model's cell also carries the model's tokens and requests per
    /// minute, shared by every process (`on`), or each process keeps only its own bucket of the
    /// model's whole rate (`off`, as before: N processes may spend N times the organisation's
    /// limit); `both` runs the fleet once each way and prints the organisation's numbers side by
    /// side.
    #[arg(long, value_enum, value_name = "ON|OFF|BOTH", default_value_t = FleetRates::On, requires = "fleet")]
    fleet_rates: FleetRates,

    /// Internal: the fleet's provider, served by the parent (its URL).
    #[arg(long, hide = true, value_name = "URL", requires = "fleet_member")]
    provider_url: Option<String>,

    /// Internal: what the fleet's server promises of an acknowledged write, declared in every
    /// cell's config (the parent passes it for --chaos restart-fsync and failover).
    #[arg(long, hide = true, value_enum, value_name = "PROMISE", default_value_t = Promise::Nothing,
          requires = "fleet_member")]
    durability: Promise,
}

/// Whether a fleet shares the models' rates in their cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FleetRates {
    /// Each cell carries its model's tokens and requests per minute.
    On,
    /// Each process keeps its own bucket of the whole rate.
    Off,
    /// The fleet once each way, compared.
    Both,
}

impl Args {
    /// The Redis the fleet's cells live on, when the command line names one (`--redis`,
    /// `--redis-cluster`: at most one of them).
    fn fleet_redis(&self) -> Option<FleetRedis> {
        match (&self.redis, &self.redis_cluster) {
            (Some(endpoint), _) => Some(FleetRedis::Server(endpoint.clone())),
            (None, Some(nodes)) => Some(FleetRedis::Cluster(nodes.clone())),
            (None, None) => None,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run_all(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs the strategies asked for; `Ok(false)` when `--check` found a problem.
fn run_all(args: &Args) -> anyhow::Result<bool> {
    let catalog =
        ModelCatalog::from_toml(CATALOG).context("reading examples/agents/models.toml")?;
    let tenants = args.tenants.clone().map(|t| t.0).unwrap_or_default();
    let fair = fairness::Config::new(
        tenants.clone(),
        args.interactive_percent.unwrap_or(0),
        &fairness::reserves(&catalog),
    )?;
    let jobs = if tenants.is_empty() {
        args.jobs as usize
    } else {
        tenants.iter().map(|t| t.agents as usize).sum()
    };
    let plan: Vec<_> = workload::plan(&WorkloadConfig {
        jobs,
        steps: args.steps,
        blocking_percent: args.blocking_percent,
        seed: args.seed,
        tenant_agents: tenants.iter().map(|t| t.agents).collect(),
        interactive_percent: args.interactive_percent.unwrap_or(0),
    })
    .into_iter()
    .map(Arc::new)
    .collect();
    let out_dir = args.out_dir.clone().unwrap_or_else(default_out_dir);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let member = match (args.fleet, args.fleet_member) {
        (Some(n), None) if args.fleet_rates == FleetRates::Both => {
            return multi::run_fleet_both(args, n, &catalog, &out_dir);
        }
        (Some(n), None) => {
            return multi::run_fleet(args, n, &catalog, &out_dir).map(|run| run.passed);
        }
        (Some(n), Some(index)) if index >= n => {
            anyhow::bail!("--fleet-member {index} is not below --fleet {n}")
        }
        (_, member) => member,
    };
    let runs = runs(args, fair.is_some())?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let summaries = runtime.block_on(async {
        let interrupt = Arc::new(Stop::new());
        let listener = tokio::spawn(signals::listen(interrupt.clone()));
        if member.is_some() {
            signals::watch_parent(interrupt.clone());
        }
        let cells = match (member, args.fleet_redis(), &args.cell) {
            (Some(index), Some(redis), Some(prefix)) => {
                let wait = multi::lease_wait(args.admit_timeout, args.time_scale);
                let rates = (args.fleet_rates == FleetRates::On).then_some(args.time_scale);
                Some(Arc::new(
                    Cells::connect(
                        index,
                        &catalog,
                        &redis,
                        prefix,
                        wait,
                        rates,
                        args.durability,
                    )
                    .await?,
                ))
            }
            _ => None,
        };
        // Bound before any agent starts, so a bad ADDR ends the run before it begins.
        let serving = args
            .metrics
            .map(|addr| metrics::serve(addr, args.time_scale, fair.as_ref()))
            .transpose()?;
        if let Some(serving) = &serving {
            say(&format!(
                "serving metrics at http://{}/metrics",
                serving.addr()
            ));
        }
        let input = Input {
            catalog: &catalog,
            plan: &plan,
            settings: Settings {
                time_scale: args.time_scale,
                http_connections: args.http,
                db_connections: args.db,
                search_per_minute: args.search_per_minute,
                admit_timeout: Duration::from_secs(args.admit_timeout),
                retries: args.retries,
                seed: args.seed,
                budget: Money::from_micros(args.budget_micros),
            },
            out_dir: &out_dir,
            interrupt: interrupt.clone(),
            run_timeout: Duration::from_secs(args.run_timeout),
            cells: cells.clone(),
            provider_url: args.provider_url.clone(),
            metrics: serving.as_ref().map(|serving| serving.sink.clone()),
            fair: fair.as_ref(),
        };
        let mut summaries = Vec::new();
        for &(strategy, mode) in &runs {
            if interrupt.is_triggered() {
                break;
            }
            let summary = run::run(strategy, mode, &input).await?;
            say(&summary.render());
            summaries.push(summary);
        }
        if let Some(serving) = &serving
            && args.metrics_linger > 0
            && !interrupt.is_triggered()
        {
            say(&format!(
                "metrics: waiting up to {} s for a last scrape of http://{}/metrics",
                args.metrics_linger,
                serving.addr()
            ));
            if !serving
                .linger(Duration::from_secs(args.metrics_linger))
                .await
            {
                say("metrics: no scrape came; stopping the endpoint");
            }
        }
        listener.abort();
        // A member's last line: its report, for the parent.
        if let (Some(index), Some(cells), [summary]) = (member, &cells, summaries.as_slice()) {
            if summary.interrupted.is_some() {
                // Lease waits and leases dropped by cancelled jobs are withdrawn and released on
                // spawned tasks: let them reach Redis before the runtime goes, for a while (a
                // member whose parent died may have lost the server with it: the TTL takes
                // back what did not reach it).
                if tokio::time::timeout(SETTLE_WITHIN, cells.settle())
                    .await
                    .is_err()
                {
                    eprintln!(
                        "the releases and withdrawals of cancelled jobs had not reached Redis {} s after the run: their TTL takes them back",
                        SETTLE_WITHIN.as_secs()
                    );
                }
            }
            say(&MemberReport::new(index, summary, cells.readings(), cells.ends()).line()?);
        }
        anyhow::Ok(summaries)
    })?;
    // Blocking agents that ignored a cancellation must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));

    if let [monitor, chain] = summaries.as_slice() {
        say(&report::side_by_side(monitor, chain));
    }
    let json = serde_json::to_string_pretty(&summaries).context("serialising the summary")?;
    let summary_path = out_dir.join("summary.json");
    for path in std::iter::once(&summary_path).chain(args.json_summary.as_ref()) {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
        say(&format!("wrote {}", path.display()));
    }

    if !args.check {
        return Ok(true);
    }
    let problems: Vec<String> = summaries.iter().flat_map(RunSummary::problems).collect();
    if summaries.len() != runs.len() {
        say("check: FAILED: the run was interrupted before every strategy ran");
        return Ok(false);
    }
    if problems.is_empty() {
        say(
            "check: passed (nothing over capacity, every job finished, nothing held afterwards, every result stored)",
        );
        for summary in &summaries {
            if let Some(report) = summary
                .fairness
                .as_ref()
                .filter(|f| f.fairness == Mode::On.name())
            {
                say(&format!(
                    "check: {}: {}",
                    summary.label(),
                    fairness::judged(report, &fairness::GOALS)
                ));
            }
        }
        Ok(true)
    } else {
        for problem in &problems {
            say(&format!("check: FAILED: {problem}"));
        }
        Ok(false)
    }
}

/// The runs asked for, in order: each strategy's, and with tenants or levels (`fair`) the
/// monitor's with fairness on, off or both (the chain's has no fairness to switch).
///
/// # Errors
///
/// `--fairness both` with a second strategy: one comparison at a time.
fn runs(args: &Args, fair: bool) -> anyhow::Result<Vec<(Strategy, Option<Mode>)>> {
    let chain = matches!(args.strategy, StrategyArg::HoldAndWait | StrategyArg::Both);
    if !fair {
        let mut runs = vec![(Strategy::Monitor, None)];
        if chain {
            runs.push((Strategy::HoldAndWait, None));
        }
        return Ok(runs);
    }
    Ok(match (args.fairness, chain) {
        (FairnessArg::Both, true) => anyhow::bail!(
            "--fairness both compares two monitor runs: run it without --strategy hold-and-wait"
        ),
        (FairnessArg::Both, false) => vec![
            (Strategy::Monitor, Some(Mode::On)),
            (Strategy::Monitor, Some(Mode::Off)),
        ],
        (arg, chain) => {
            let mode = if arg == FairnessArg::On {
                Mode::On
            } else {
                Mode::Off
            };
            let mut runs = vec![(Strategy::Monitor, Some(mode))];
            if chain {
                runs.push((Strategy::HoldAndWait, None));
            }
            runs
        }
    })
}

/// Prints a line to stdout; a closed stdout (`| head`) loses the text instead of panicking.
pub fn say(text: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

/// `$CARGO_TARGET_DIR/agents`, or `target/agents` at the workspace root.
fn default_out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // This package is `examples/agents` under the workspace root.
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            manifest
                .ancestors()
                .nth(2)
                .unwrap_or(manifest)
                .join("target")
        });
    target.join("agents")
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use clap::error::ErrorKind;

    use super::{Args, runs};
    use crate::fairness::Mode;
    use crate::run::Strategy;

    #[test]
    fn metrics_takes_a_socket_address() {
        let args = Args::try_parse_from(["agents", "--metrics", "127.0.0.1:9000"]).unwrap();
        assert_eq!(args.metrics, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(Args::try_parse_from(["agents"]).unwrap().metrics, None);
    }

    #[test]
    fn a_bad_metrics_address_is_a_usage_error() {
        for bad in ["localhost", "127.0.0.1", "127.0.0.1:99999", ":9000", ""] {
            let error = Args::try_parse_from(["agents", "--metrics", bad]).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::ValueValidation, "{bad:?}: {error}");
        }
        let error = Args::try_parse_from(["agents", "--fleet", "2", "--metrics", "127.0.0.1:9000"])
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
    }

    /// The fairness flags: off by default (no tenants, no levels), --fairness only beside
    /// --tenants or --interactive-percent, --tenants in place of --jobs, none with --fleet.
    #[test]
    fn the_fairness_flags_are_off_unless_asked_for() {
        let plain = Args::try_parse_from(["agents"]).unwrap();
        assert_eq!(
            (plain.tenants.clone(), plain.interactive_percent),
            (None, None)
        );
        assert_eq!(
            runs(&plain, false).unwrap(),
            vec![(Strategy::Monitor, None)]
        );

        let both = Args::try_parse_from([
            "agents",
            "--tenants",
            "acme:3:300,globex:1:100",
            "--interactive-percent",
            "10",
            "--fairness",
            "both",
        ])
        .unwrap();
        assert_eq!(both.tenants.as_ref().map(|t| t.0.len()), Some(2));
        assert_eq!(
            runs(&both, true).unwrap(),
            vec![
                (Strategy::Monitor, Some(Mode::On)),
                (Strategy::Monitor, Some(Mode::Off))
            ]
        );
        let on = Args::try_parse_from(["agents", "--interactive-percent", "5"]).unwrap();
        assert_eq!(
            runs(&on, true).unwrap(),
            vec![(Strategy::Monitor, Some(Mode::On))]
        );
        let chain = Args::try_parse_from([
            "agents",
            "--tenants",
            "acme:1:10",
            "--fairness",
            "both",
            "--strategy",
            "hold-and-wait",
        ])
        .unwrap();
        assert!(runs(&chain, true).is_err());

        for (bad, kind) in [
            (
                vec!["--fairness", "off"],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                vec!["--tenants", "acme:1:10", "--jobs", "5"],
                ErrorKind::ArgumentConflict,
            ),
            (
                vec!["--tenants", "acme:1:10", "--fleet", "2"],
                ErrorKind::ArgumentConflict,
            ),
            (
                vec!["--interactive-percent", "101"],
                ErrorKind::ValueValidation,
            ),
            (vec!["--tenants", "acme:0:10"], ErrorKind::ValueValidation),
        ] {
            let error = Args::try_parse_from(std::iter::once("agents").chain(bad.iter().copied()))
                .unwrap_err();
            assert_eq!(error.kind(), kind, "{bad:?}: {error}");
        }
    }
}
