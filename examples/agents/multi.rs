//! `--fleet N`: the agents run as N processes that share one Redis cell per model.
//!
//! The parent starts a private `redis-server` (unless `--redis` names one, or `--redis-cluster` a
//! Redis Cluster; for `--chaos kill-master` and `failover` it starts a private six-node cluster;
//! either dies with the parent however it dies, see `redis_server.rs`), creates the
//! cells, and runs N copies of this binary as fleet members (`--fleet-member I`), each with its
//! share of the agents and the seed offset by I, its own monitor, database and simulated provider
//! view, and its output in `<out>/fleet/member-I.{out,err}`. Each member ends its stdout with one
//! line, [`REPORT_PREFIX`] and its [`MemberReport`] as JSON. The parent reads them, the cells'
//! events and final state (through the cells' own clients: on a cluster, from the master serving
//! each cell's slot), and the count of script calls (on a cluster, summed over its masters), and
//! prints per-process rows and fleet totals; with `--check` it fails on a member that failed or
//! found a problem of its own, on a job that timed out or failed (under `--chaos`, unless its own
//! deadline fell between the fault and the resumption; after a lossless fault, on any), on an
//! admission that did not resume within the fault's bound (see `chaos.rs`), on a recovery after a
//! lossless fault, on any fleet-wide occupancy over a ceiling (as the leases saw
//! it at admission, as the cells' events recorded it, and as the members held leases by their own
//! clocks), on a lease lost, and on a lease still held once every member has exited.
//!
//! The parent survives what it tests. Once the members run, nothing it meets ends it before its
//! table and verdict: SIGINT and SIGTERM are forwarded to the members (through their stdin, see
//! `signals.rs`), which stop, give their leases back and report; its reads of the server after
//! the run are retried (on a new connection too) for [`READ_RETRY_FOR`]; and what it still could
//! not read or run is a problem in the verdict, not an error that hides the table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use admission_llm::model_spec::ModelCatalog;
use admission_redis::{RedisAdmission, read_events};
use admission_testkit::redis_servers::PrivateCluster;
use anyhow::{Context as _, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::FleetRates;
use crate::cells::{self, CellReading, ModelCeiling, Promise};
use crate::chaos::{self, Fault, Hold, Injector, JobEnd, Judged, Outage, Targets};
use crate::clock::ScaledClock;
use crate::provider_http::{ProviderClient, ProviderServer};
use crate::provider_sim::{Provider, UpstreamStats};
use crate::redis_server::{self, ClusterNodes, Endpoint, FleetRedis, Persistence, PrivateRedis};
use crate::report::RunSummary;
use crate::say;
use crate::signals::{self, Signals};
use crate::stats::Outcomes;

/// What starts a member's report line on its stdout.
pub const REPORT_PREFIX: &str = "fleet-member-report: ";
/// What starts the parent's line about its private redis-server (its pid, port and directory,
/// which `cargo xtask chaos` checks are gone once the parent is killed).
pub const PRIVATE_SERVER_PREFIX: &str = "private redis-server: ";
/// How much longer than `--run-timeout` the parent waits for its members before killing them.
const MEMBER_GRACE: Duration = Duration::from_secs(30);
/// How often the parent looks whether its members have exited (and whether a fault is due).
const MEMBER_POLL: Duration = Duration::from_millis(50);
/// How often while a fault is under way (a server down, an election awaited): the times it
/// marks (a server ready, a new master answering) are this close to the truth.
const FAULT_POLL: Duration = Duration::from_millis(10);
/// How long members get to stop, give their leases back and report once the parent forwarded a
/// signal, before it kills them.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// How long the parent retries its reads of the server once the members exited.
pub const READ_RETRY_FOR: Duration = Duration::from_secs(15);
/// The bound on one attempt of such a read.
const READ_ATTEMPT: Duration = Duration::from_secs(5);
/// The pause between two attempts.
const READ_PAUSE: Duration = Duration::from_millis(250);
/// After a killed member's leases reached their TTL, before the cells are read: time for the
/// server to have passed it too.
const AFTER_TTL: Duration = Duration::from_millis(500);
/// Snapshots taken at most to reap what expired (each reaps a bounded batch).
const REAP_PASSES: usize = 20;

/// What one member reports to the parent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberReport {
    /// Its index, from 0.
    pub member: u32,
    /// Its agents.
    pub jobs: u64,
    /// How they ended.
    pub outcomes: Outcomes,
    /// Calls that ran (steps done, counting a retried step once per successful call).
    pub steps_ok: u64,
    /// Local admissions granted.
    pub grants: u64,
    /// Real seconds the run took.
    pub real_seconds: f64,
    /// Simulated seconds.
    pub simulated_seconds: f64,
    /// Local admission waits (its own monitor), simulated seconds: median and 99th percentile.
    pub local_wait_p50_s: f64,
    /// See `local_wait_p50_s`.
    pub local_wait_p99_s: f64,
    /// Per model's cell.
    pub cells: Vec<CellReading>,
    /// What `--check` would find wrong with its own run, but for jobs that timed out or failed
    /// (the parent judges those from `ends`).
    pub problems: Vec<String>,
    /// The jobs that timed out or failed, each with the deadline of the lease wait that ended it.
    #[serde(default)]
    pub ends: Vec<JobEnd>,
}

impl MemberReport {
    /// The report of member `member` from its run's summary, its cells' readings and its jobs
    /// that timed out or failed.
    pub fn new(
        member: u32,
        summary: &RunSummary,
        cells: Vec<CellReading>,
        ends: Vec<JobEnd>,
    ) -> MemberReport {
        let all = summary.wait("all");
        MemberReport {
            member,
            jobs: summary.jobs,
            outcomes: summary.outcomes,
            steps_ok: summary.models.iter().map(|m| m.calls_ok).sum(),
            grants: summary.grants,
            real_seconds: summary.real_seconds,
            simulated_seconds: summary.simulated_seconds,
            local_wait_p50_s: all.map_or(0.0, |w| w.p50_s),
            local_wait_p99_s: all.map_or(0.0, |w| w.p99_s),
            cells,
            problems: summary.problems_but_failed_jobs(),
            ends,
        }
    }

    /// The line a member prints last.
    pub fn line(&self) -> anyhow::Result<String> {
        Ok(format!(
            "{REPORT_PREFIX}{}",
            serde_json::to_string(self).context("serialising the member's report")?
        ))
    }

    /// Every lease wait, simulated microseconds.
    fn waits(&self) -> Vec<u64> {
        self.cells
            .iter()
            .flat_map(|c| c.waits_us.iter().copied())
            .collect()
    }
}

/// The member report in a member's stdout: its last [`REPORT_PREFIX`] line.
///
/// # Errors
///
/// When there is no such line, or it is not a report.
pub fn parse_member_output(stdout: &str) -> Result<MemberReport, String> {
    let Some(line) = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(REPORT_PREFIX))
    else {
        return Err("no report line in its output".to_owned());
    };
    serde_json::from_str(line).map_err(|e| format!("its report line is not a report: {e}"))
}

/// The `q` quantile of `sorted` values by nearest rank (the smallest value with at least
/// `q * n` values at or below it); 0 for none.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Waits summarised, simulated seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WaitSummary {
    /// How many.
    pub count: u64,
    /// Median.
    pub p50_s: f64,
    /// 99th percentile.
    pub p99_s: f64,
    /// Longest.
    pub max_s: f64,
}

impl WaitSummary {
    /// From waits in microseconds.
    pub fn of(mut waits_us: Vec<u64>) -> WaitSummary {
        waits_us.sort_unstable();
        let secs = |us: u64| us as f64 / 1e6;
        WaitSummary {
            count: waits_us.len() as u64,
            p50_s: secs(quantile(&waits_us, 0.5)),
            p99_s: secs(quantile(&waits_us, 0.99)),
            max_s: secs(waits_us.last().copied().unwrap_or(0)),
        }
    }
}

/// One model across the fleet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelTotals {
    /// The model.
    pub model: String,
    /// Its cell's ceilings.
    pub ceiling: Option<ModelCeiling>,
    /// Leases taken by every member.
    pub leases: u64,
    /// The most tokens in flight any lease saw at its admission.
    pub peak_tokens: u64,
    /// The most requests in flight any lease saw.
    pub peak_requests: u64,
    /// Lease waits that ran out, acquisitions that failed, leases lost.
    pub timed_out: u64,
    /// See `timed_out`.
    pub failed: u64,
    /// See `timed_out`.
    pub lost: u64,
    /// Releases Redis did not confirm.
    pub release_unconfirmed: u64,
    /// The most tokens held at once by the members' own clocks (see [`chaos::peak_held`]).
    pub held_peak_tokens: u64,
    /// The most leases held at once likewise: requests in flight.
    pub held_peak_requests: u64,
    /// The lease waits.
    pub waits: WaitSummary,
}

/// Every member's readings of each model, added up.
pub fn model_totals(members: &[MemberReport]) -> Vec<ModelTotals> {
    let mut waits: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut holds: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    let mut totals: BTreeMap<String, ModelTotals> = BTreeMap::new();
    for reading in members.iter().flat_map(|m| &m.cells) {
        let t = totals
            .entry(reading.model.clone())
            .or_insert_with(|| ModelTotals {
                model: reading.model.clone(),
                ..ModelTotals::default()
            });
        t.ceiling = t.ceiling.or(reading.ceiling);
        t.leases += reading.leases;
        t.peak_tokens = t.peak_tokens.max(reading.peak_tokens);
        t.peak_requests = t.peak_requests.max(reading.peak_requests);
        t.timed_out += reading.timed_out;
        t.failed += reading.failed;
        t.lost += reading.lost;
        t.release_unconfirmed += reading.release_unconfirmed;
        waits
            .entry(reading.model.clone())
            .or_default()
            .extend(&reading.waits_us);
        holds
            .entry(reading.model.clone())
            .or_default()
            .extend(&reading.holds);
    }
    totals
        .into_values()
        .map(|mut t| {
            t.waits = WaitSummary::of(waits.remove(&t.model).unwrap_or_default());
            (t.held_peak_tokens, t.held_peak_requests) =
                chaos::peak_held(&holds.remove(&t.model).unwrap_or_default());
            t
        })
        .collect()
}

/// What the parent read from one cell once every member exited.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CellAfter {
    /// The model.
    pub model: String,
    /// The most tokens in flight in any record of the events stream.
    pub events_peak_tokens: u64,
    /// The most requests in flight in any record.
    pub events_peak_requests: u64,
    /// `admitted` records.
    pub admitted_events: u64,
    /// `queued` records (a lease that did not fit at once took a ticket in the line), per
    /// member (read from the lease id).
    pub queued: BTreeMap<u32, u64>,
    /// Records read; at the stream's bound, the oldest were trimmed and the peaks may be low.
    pub events: u64,
    /// Leases still held, and the occupancy, after the run.
    pub leases_held: u64,
    /// Tokens still in flight.
    pub tokens_held: u64,
    /// Requests still in flight.
    pub requests_held: u64,
    /// After a fault: the server time of the cell's first `admitted` record at or after the
    /// fault's floor, the killed member's own left out (see [`chaos::first_admission_after`]).
    pub first_admission_ms: Option<u64>,
    /// After a fault: the cell's `recovering` records from the fault on, each one's server time
    /// and outcome (`created`, `restarted`, `promoted`).
    pub recoveries: Vec<(u64, String)>,
}

/// The member a lease id names (`m<I>-...`, as [`Cells`](crate::cells::Cells) names leases).
pub fn member_of(lease: &str) -> Option<u32> {
    let (index, _) = lease.strip_prefix('m')?.split_once('-')?;
    index.parse().ok()
}

/// How many of `leases` each member named (ids naming none are left out).
pub fn queued_by_member<'a>(leases: impl IntoIterator<Item = &'a str>) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for member in leases.into_iter().filter_map(member_of) {
        *out.entry(member).or_insert(0) += 1;
    }
    out
}

/// A member process and where its output goes.
struct Member {
    index: u32,
    /// The process, until it exited and was reaped.
    child: Option<Child>,
    /// The pipe to its stdin: a stop line forwards a signal, and closing it stops the member.
    stdin: Option<ChildStdin>,
    status: Option<ExitStatus>,
    /// Killed by `--chaos kill-member`: no report is expected from it.
    killed_by_chaos: bool,
    out: PathBuf,
    err: PathBuf,
}

/// The agents of member `index` of `n`: an even share, the first `jobs % n` members one more.
pub fn share(jobs: u32, n: u32, index: u32) -> u32 {
    jobs / n + u32::from(index < jobs % n)
}

/// The command line of member `index` of `n`: the user's flags, its share of the agents, its
/// seed, its own output directory, and the fleet's server (or cluster) and cells.
pub fn member_args(
    args: &crate::Args,
    n: u32,
    index: u32,
    redis: &FleetRedis,
    prefix: &str,
    out_dir: &Path,
    provider_url: &str,
) -> Vec<String> {
    let (flag, place) = match redis {
        FleetRedis::Server(endpoint) => ("--redis", endpoint.to_string()),
        FleetRedis::Cluster(nodes) => ("--redis-cluster", nodes.to_string()),
    };
    let mut out = vec![
        "--fleet".to_owned(),
        n.to_string(),
        "--fleet-member".to_owned(),
        index.to_string(),
        flag.to_owned(),
        place,
        "--cell".to_owned(),
        prefix.to_owned(),
        "--jobs".to_owned(),
        share(args.jobs, n, index).to_string(),
        "--seed".to_owned(),
        args.seed.wrapping_add(u64::from(index)).to_string(),
        "--out-dir".to_owned(),
        out_dir.display().to_string(),
        "--provider-url".to_owned(),
        provider_url.to_owned(),
        "--fleet-rates".to_owned(),
        match args.fleet_rates {
            FleetRates::On | FleetRates::Both => "on",
            FleetRates::Off => "off",
        }
        .to_owned(),
    ];
    if let Some(steps) = args.steps {
        out.extend(["--steps".to_owned(), steps.to_string()]);
    }
    let promise = args.chaos.map_or(Promise::Nothing, Fault::promise);
    if promise != Promise::Nothing {
        out.extend(["--durability".to_owned(), promise.name().to_owned()]);
    }
    for (flag, value) in [
        ("--time-scale", u64::from(args.time_scale)),
        ("--blocking-percent", u64::from(args.blocking_percent)),
        ("--http", args.http),
        ("--db", args.db),
        ("--search-per-minute", args.search_per_minute),
        ("--retries", u64::from(args.retries)),
        ("--admit-timeout", args.admit_timeout),
        ("--run-timeout", args.run_timeout),
    ] {
        out.extend([flag.to_owned(), value.to_string()]);
    }
    out
}

/// The longest a lease waits, real time: the admission timeout (simulated) at the run's scale,
/// at least a second.
pub fn lease_wait(admit_timeout_s: u64, time_scale: u32) -> Duration {
    Duration::from_secs(admit_timeout_s)
        .div_f64(f64::from(time_scale.max(1)))
        .max(Duration::from_secs(1))
}

/// What one fleet run found, for the verdict and for `--fleet-rates both`'s comparison.
#[derive(Debug)]
pub struct FleetRun {
    /// False when `--check` found a problem.
    pub passed: bool,
    /// Whether the cells carried the models' rates.
    pub rates: FleetRates,
    /// What the fleet's provider saw, per model (empty when it could not be read).
    pub organisation: BTreeMap<String, UpstreamStats>,
    /// Agents that completed, of all.
    pub completed: u64,
    /// See `completed`.
    pub jobs: u64,
    /// Every lease wait of the fleet.
    pub lease_waits: WaitSummary,
}

/// `--fleet-rates both`: the fleet with the rates in its cells, then without, and the
/// organisation's numbers side by side; `Ok(false)` when `--check` failed either run.
///
/// # Errors
///
/// As for [`run_fleet`].
pub fn run_fleet_both(
    args: &crate::Args,
    n: u32,
    catalog: &ModelCatalog,
    out_dir: &Path,
) -> anyhow::Result<bool> {
    let mut runs = Vec::new();
    for rates in [FleetRates::On, FleetRates::Off] {
        let mut one = args.clone();
        one.fleet_rates = rates;
        let dir = out_dir.join(match rates {
            FleetRates::Off => "fleet-rates-off",
            _ => "fleet-rates-on",
        });
        runs.push(run_fleet(&one, n, catalog, &dir)?);
    }
    say(&side_by_side(&runs));
    Ok(runs.iter().all(|run| run.passed))
}

/// The organisation's numbers of each run, one column per run.
pub fn side_by_side(runs: &[FleetRun]) -> String {
    let mut out = String::from("== fleet rates side by side ==\n");
    let name = |run: &FleetRun| match run.rates {
        FleetRates::Off => "off",
        _ => "on",
    };
    let mut row = |label: &str, cell: &dyn Fn(&FleetRun) -> String| {
        let _ = write!(out, "{label:<40}");
        for run in runs {
            let _ = write!(out, " {:>18}", cell(run));
        }
        out.push('\n');
    };
    row("fleet rates", &|run| name(run).to_owned());
    row("agents completed", &|run| {
        format!("{} of {}", run.completed, run.jobs)
    });
    row("lease wait p50 / p99 (simulated s)", &|run| {
        format!(
            "{:.1} / {:.1}",
            run.lease_waits.p50_s, run.lease_waits.p99_s
        )
    });
    let models: Vec<&String> = runs
        .first()
        .map(|run| run.organisation.keys().collect())
        .unwrap_or_default();
    for model in models {
        let stat = |run: &FleetRun| run.organisation.get(model).cloned().unwrap_or_default();
        let limit = runs
            .first()
            .map_or(0, |run| stat(run).true_tokens_per_minute);
        row(&format!("{model}: charged tpm (limit {limit})"), &|run| {
            format!("{:.0}", OrganisationRow::of(&stat(run)).charged_per_minute)
        });
        row(&format!("{model}: of its limit"), &|run| {
            format!("{:.1}%", 100.0 * OrganisationRow::of(&stat(run)).of_limit)
        });
        row(&format!("{model}: most tokens in a minute"), &|run| {
            stat(run).max_tokens_in_a_minute.to_string()
        });
        row(&format!("{model}: answered 429 / 529"), &|run| {
            let s = stat(run);
            format!(
                "{} / {} ({:.2}%)",
                s.rate_limited,
                s.overloaded,
                100.0 * OrganisationRow::of(&s).rate_limited_share
            )
        });
    }
    out
}

/// Runs the fleet.
///
/// # Errors
///
/// When no Redis can be had, the cells cannot be created or a member cannot be started: before
/// any member runs. From then on every failure is a problem in the verdict.
pub fn run_fleet(
    args: &crate::Args,
    n: u32,
    catalog: &ModelCatalog,
    out_dir: &Path,
) -> anyhow::Result<FleetRun> {
    if args.jobs < n {
        bail!(
            "--fleet {n} needs at least {n} agents (--jobs {}): each process runs its share",
            args.jobs
        );
    }
    if args.strategy != crate::StrategyArg::Monitor {
        bail!("--fleet runs the monitor strategy only; drop --strategy");
    }
    let given = args.fleet_redis();
    match args.chaos {
        Some(fault) if fault.restarts() && given.is_some() => bail!(
            "--chaos {} kills and restarts the fleet's server: it needs the private redis-server; drop --redis or --redis-cluster",
            fault.name()
        ),
        Some(Fault::Pause) if args.redis_cluster.is_some() => {
            bail!("--chaos pause sends CLIENT PAUSE to one server: drop --redis-cluster")
        }
        Some(fault) if fault.on_cluster() && given.is_some() => bail!(
            "--chaos {} fails a master of the private Redis Cluster it starts over: drop --redis or --redis-cluster",
            fault.name()
        ),
        Some(Fault::KillMember) if n < 2 => {
            bail!("--chaos kill-member needs --fleet 2 or more: the others must go on")
        }
        _ => {}
    }
    let promise = args.chaos.map_or(Promise::Nothing, Fault::promise);
    // One worker: the signal listener and the server's clients run beside the watching loop.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    // From here on SIGINT and SIGTERM no longer end the parent: they are forwarded once the
    // members run, and before that end the run by an early return, which stops the private
    // server or cluster (a signal's default would leave them running).
    let (signal_tx, signals) = std::sync::mpsc::channel();
    let mut caught = {
        let _entered = runtime.enter();
        Signals::new()
    };
    runtime.spawn(async move {
        while let Some(signal) = caught.next().await {
            if signal_tx.send(signal).is_err() {
                break;
            }
        }
    });
    // Each stops (its processes killed) when dropped: at the end, and on every early return.
    let mut private: Option<PrivateRedis> = None;
    let mut cluster: Option<PrivateCluster> = None;
    let redis = match given {
        Some(redis) => redis,
        None => {
            let binary = redis_server::find_binary()
                .with_context(|| redis_server::INSTALL_HINT.to_owned())?;
            if let Some(fault) = args.chaos.filter(|f| f.on_cluster()) {
                let started = Instant::now();
                let private = cluster.insert(
                    PrivateCluster::start_in_own_process_group(&binary).with_context(|| {
                        format!("--chaos {} starts a private Redis Cluster", fault.name())
                    })?,
                );
                let ports = private.ports();
                let nodes = ClusterNodes(
                    private
                        .seeds()
                        .into_iter()
                        .map(|(host, port)| Endpoint { host, port })
                        .collect(),
                );
                let pids: Vec<String> = ports
                    .iter()
                    .map(|&port| {
                        private
                            .pid(port)
                            .map_or_else(|| "-".to_owned(), |p| p.to_string())
                    })
                    .collect();
                say(&format!(
                    "a private Redis Cluster (three masters, three replicas) on {nodes}, ready in {:.2} s (pids {}; stopped with this process, however it ends)",
                    started.elapsed().as_secs_f64(),
                    pids.join(", ")
                ));
                FleetRedis::Cluster(nodes)
            } else {
                // A restart must find the cells as they were: keep an append-only file for it,
                // fsynced before each reply when the cells are told so.
                let persistence = match args.chaos {
                    Some(Fault::Restart) => Persistence::EverySecond,
                    Some(Fault::RestartFsync) => Persistence::Always,
                    _ => Persistence::None,
                };
                let server = private.insert(PrivateRedis::start(&binary, persistence)?);
                say(&format!(
                    "{PRIVATE_SERVER_PREFIX}pid {}, port {}, directory {} (stopped with this process, however it ends)",
                    server.pid().unwrap_or(0),
                    server.endpoint.port,
                    server.dir().display()
                ));
                FleetRedis::Server(server.endpoint.clone())
            }
        }
    };
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    // Fresh cells for each run, so that a shared server's earlier runs do not count.
    let prefix = format!("agents-{}-{started}", std::process::id());
    let wait = lease_wait(args.admit_timeout, args.time_scale);
    let fleet_dir = out_dir.join("fleet");
    std::fs::create_dir_all(&fleet_dir)
        .with_context(|| format!("creating {}", fleet_dir.display()))?;

    // The run's cells are new (its own prefix): nothing can hold a lease of them yet, so the
    // parent creates them admitting at once; members keep the default and recover a cell that
    // is created again mid-run (a server restarted empty).
    let rates = (args.fleet_rates == FleetRates::On).then_some(args.time_scale);
    let cells = runtime.block_on(cells::connect_all(
        catalog, &redis, &prefix, wait, true, rates, promise,
    ))?;
    // One provider for the whole fleet, as an organisation has: its limits hold across every
    // member's calls. Its clock starts now; the members' run at the same scale.
    let provider_started = Instant::now();
    let provider = runtime
        .block_on(ProviderServer::start(std::sync::Arc::new(Provider::new(
            catalog,
            ScaledClock::new(args.time_scale),
            args.seed,
        ))))
        .context("serving the fleet's provider")?;
    let lease_ttl = cells
        .values()
        .next()
        .map_or(Duration::ZERO, |(cell, _)| cell.config().lease_ttl);
    // Each model's cell by a key of it (all its keys share one slot), for a `kill-master`.
    let cell_keys: Vec<(String, String)> = cells
        .iter()
        .filter_map(|(model, (cell, _))| Some((model.clone(), cell.keys().first()?.clone())))
        .collect();
    let calls_before = runtime.block_on(redis_server::script_calls(&redis))?;
    if let Ok(signal) = signals.try_recv() {
        bail!("{signal} before the members started: the run stops here");
    }
    say(&format!(
        "== fleet: {n} processes, {} agents, seed {} (+ process index), cells {prefix}-<model> on {redis} ({}) ==",
        args.jobs,
        args.seed,
        match (&private, &cluster, &redis) {
            (Some(_), _, _) => "a private redis-server",
            (_, Some(_), _) => "a private Redis Cluster",
            (_, _, FleetRedis::Server(_)) => "--redis",
            (_, _, FleetRedis::Cluster(_)) => "--redis-cluster",
        }
    ));

    let exe = std::env::current_exe().context("finding this program's path")?;
    let mut members = Vec::new();
    for index in 0..n {
        let dir = fleet_dir.join(format!("member-{index}"));
        let args = member_args(args, n, index, &redis, &prefix, &dir, provider.url());
        match start_member(&exe, args, index, &fleet_dir) {
            Ok(member) => members.push(member),
            Err(error) => {
                // Those already started stop, give their leases back, and are waited for.
                for member in &mut members {
                    if let Some(pipe) = member.stdin.take() {
                        signals::forward(pipe, "SIGTERM");
                    }
                }
                let _ = watch(&mut members, STOP_GRACE, &signals, &mut None);
                return Err(error);
            }
        }
    }
    let origin_ms = chaos::wall_ms();
    let mut injector = args.chaos.map(|fault| {
        let at = Instant::now() + Duration::from_millis(args.chaos_after_ms);
        say(&format!(
            "chaos: {} at +{:.2} s after the members started",
            fault.name(),
            Duration::from_millis(args.chaos_after_ms).as_secs_f64()
        ));
        Injector::new(
            fault,
            at,
            origin_ms,
            lease_ttl,
            Duration::from_millis(args.chaos_down_ms),
            Duration::from_millis(args.chaos_pause_ms),
        )
    });
    let watched = watch(
        &mut members,
        Duration::from_secs(args.run_timeout) + MEMBER_GRACE,
        &signals,
        &mut Some(Faults {
            injector: injector.as_mut(),
            server: private.as_mut(),
            cluster: cluster.as_mut(),
            redis: &redis,
            cells: &cell_keys,
            runtime: &runtime,
        }),
    );

    let mut problems = Vec::new();
    if watched.overran {
        problems.push(format!(
            "a member was still running {} s after --run-timeout and was killed",
            MEMBER_GRACE.as_secs()
        ));
    }
    if let Some(signal) = watched.signal {
        problems.push(format!(
            "the run was stopped by {signal}, forwarded to every member"
        ));
    }
    if watched.stuck {
        problems.push(format!(
            "a member had not stopped {} s after the forwarded signal and was killed",
            STOP_GRACE.as_secs()
        ));
    }
    let outage = injector.as_ref().and_then(|i| i.outage.clone());
    if let Some(injector) = &injector {
        if let Some(why) = &injector.failure {
            problems.push(format!("chaos: {why}"));
        } else if !injector.injected() {
            problems.push(format!(
                "chaos: the {} was never injected: the members had stopped before its time",
                injector.fault.name()
            ));
        }
    }
    let mut reports = Vec::new();
    let mut notes = Vec::new();
    for member in &members {
        if member.killed_by_chaos {
            notes.push(format!(
                "process {}: SIGKILLed by the chaos; its {} agents and what it counted are not in the table",
                member.index,
                share(args.jobs, n, member.index)
            ));
            continue;
        }
        let stdout = std::fs::read_to_string(&member.out).unwrap_or_default();
        let status = member
            .status
            .map_or_else(|| "no exit status".to_owned(), |s| s.to_string());
        match parse_member_output(&stdout) {
            Ok(report) => {
                if !member.status.is_some_and(|s| s.success()) {
                    problems.push(format!(
                        "process {}: exited with {status} (see {})",
                        member.index,
                        member.err.display()
                    ));
                }
                reports.push(report);
            }
            Err(why) => {
                let tail = tail(&std::fs::read_to_string(&member.err).unwrap_or_default(), 5);
                problems.push(format!(
                    "process {}: failed ({status}; {why}); see {}{tail}",
                    member.index,
                    member.err.display()
                ));
            }
        }
    }

    // A killed member's leases and tickets are the server's until their TTL: read the cells
    // after it, so that "nothing held" means the TTL took them back. After a master was killed,
    // a lease whose release could not reach the cluster during the election is held until its
    // TTL, which one TTL after the cluster was ok again has passed.
    let expired_ms = outage.as_ref().and_then(|o| match o.fault {
        Fault::KillMember => Some(o.start_ms),
        Fault::KillMaster => o.ok_ms,
        _ => None,
    });
    if let (Some(outage), Some(from_ms)) = (&outage, expired_ms) {
        let expired_ms = from_ms
            .saturating_add(lease_ttl.as_millis() as u64)
            .saturating_add(AFTER_TTL.as_millis() as u64);
        let left = Duration::from_millis(expired_ms.saturating_sub(chaos::wall_ms()));
        if !left.is_zero() {
            say(&format!(
                "chaos: waiting {:.1} s for the {} leases to reach their TTL",
                left.as_secs_f64(),
                if outage.fault == Fault::KillMember {
                    "killed process's"
                } else {
                    "failed-over cells'"
                }
            ));
            std::thread::sleep(left);
        }
    }
    let read_until = Instant::now() + READ_RETRY_FOR;
    let calls_after = runtime.block_on(with_retries(read_until, || {
        redis_server::script_calls(&redis)
    }));
    let mut after = Vec::new();
    for (model, (cell, _)) in &cells {
        match runtime.block_on(with_retries(read_until, || {
            read_cell(cell, model, outage.as_ref())
        })) {
            Ok(reading) => after.push(reading),
            Err(error) => problems.push(format!(
                "{model}: the cell could not be read after the run: {error:#}"
            )),
        }
    }
    let script_calls = match &calls_after {
        Ok(after) => after.since(&calls_before),
        Err(error) => Err(format!("not counted: {error:#}")),
    };
    if let Err(error) = &calls_after {
        problems.push(format!(
            "the server's script calls could not be read after the run: {error:#}"
        ));
    }
    drop(cells);
    drop(private); // the private server stops here
    drop(cluster); // and the private cluster
    let simulated = provider_started
        .elapsed()
        .mul_f64(f64::from(args.time_scale.max(1)));
    let upstream =
        ProviderClient::new(provider.url(), 1).and_then(|client| runtime.block_on(client.stats()));
    if let Err(error) = runtime.block_on(provider.shutdown()) {
        notes.push(format!(
            "the fleet's provider did not stop cleanly: {error:#}"
        ));
    }

    let totals = model_totals(&reports);
    say(&render(&reports, &totals, &after, &script_calls, n));
    match &upstream {
        Ok(stats) => {
            say(&organisation_table(stats, simulated, args.fleet_rates));
            // The fleet's rates are judged on a whole run without a fault: an outage costs rate,
            // and a run cut short by a signal stops mid-ramp.
            if args.fleet_rates != FleetRates::Off
                && args.chaos.is_none()
                && watched.signal.is_none()
            {
                problems.extend(rate_problems(stats));
            }
        }
        Err(error) => problems.push(format!("the provider's stats could not be read: {error:#}")),
    }
    for member in &members {
        say(&format!(
            "process {}'s own report: {}",
            member.index,
            member.out.display()
        ));
    }
    for note in &notes {
        say(note);
    }
    problems.extend(fleet_problems(&reports, &totals, &after));
    // After a failover, only the cells the master served went through it.
    let affected = injector.as_ref().and_then(|i| i.affected.as_ref());
    let reached: Vec<&CellAfter> = after
        .iter()
        .filter(|a| affected.is_none_or(|models| models.contains(&a.model)))
        .collect();
    let resumed_ms = chaos::resumed_at(reached.iter().map(|a| a.first_admission_ms));
    let judged = chaos::judge(
        reports
            .iter()
            .flat_map(|r| r.ends.iter().map(move |end| (r.member, end))),
        outage.as_ref(),
        resumed_ms,
    );
    if let Some(injector) = &injector {
        let verdict = ChaosVerdict {
            fault: injector.fault,
            outage: outage.as_ref(),
            judged: &judged,
            jobs: fleet_report(&reports).jobs,
            resumed_ms,
            recoveries: reached
                .iter()
                .flat_map(|a| {
                    a.recoveries
                        .iter()
                        .map(|(at, outcome)| (a.model.clone(), *at, outcome.clone()))
                })
                .collect(),
            totals: &totals,
            origin_ms,
        };
        for line in verdict.lines() {
            say(&line);
        }
        problems.extend(verdict.problems());
    }
    problems.extend(failed_job_problems(&judged, outage.as_ref(), origin_ms));

    let fleet = fleet_report(&reports);
    let mut run = FleetRun {
        passed: true,
        rates: args.fleet_rates,
        organisation: upstream.unwrap_or_default(),
        completed: fleet.outcomes.completed,
        jobs: u64::from(args.jobs),
        lease_waits: WaitSummary::of(
            reports
                .iter()
                .flat_map(|r| r.cells.iter().flat_map(|c| c.waits_us.iter().copied()))
                .collect(),
        ),
    };
    if !args.check {
        for problem in &problems {
            say(&format!("problem: {problem}"));
        }
        return Ok(run);
    }
    if problems.is_empty() {
        say(if injector.is_some() {
            "check: passed (the fault was injected, admission resumed within the fault's bound, no job failed but those whose own deadline fell between the fault and the resumption (none after a lossless fault, nor a recovery), no fleet-wide occupancy over a ceiling, no lease lost, nothing held afterwards)"
        } else {
            "check: passed (every process ran and passed its own check, no fleet-wide occupancy over a ceiling, no lease lost, nothing held afterwards)"
        });
    } else {
        for problem in &problems {
            say(&format!("check: FAILED: {problem}"));
        }
        run.passed = false;
    }
    Ok(run)
}

/// What the fleet's one provider saw, per model: the organisation's limits against what the whole
/// fleet spent, and how often it refused.
pub fn organisation_table(
    stats: &BTreeMap<String, UpstreamStats>,
    simulated: Duration,
    rates: FleetRates,
) -> String {
    let mut out = format!(
        "== the organisation at the provider ({:.1} simulated minutes; fleet rates {}) ==\n",
        simulated.as_secs_f64() / 60.0,
        match rates {
            FleetRates::Off => "off: each process keeps its own bucket of the whole rate",
            FleetRates::On | FleetRates::Both => "on: every cell carries its model's rates",
        }
    );
    let _ = writeln!(
        out,
        "{:<10} {:>10} {:>9} {:>12} {:>9} {:>14} {:>7} {:>6} {:>6} {:>7}",
        "model",
        "limit tpm",
        "busy min",
        "charged tpm",
        "of limit",
        "most in a min",
        "calls",
        "429",
        "529",
        "429 %"
    );
    for (model, s) in stats {
        let row = OrganisationRow::of(s);
        let _ = writeln!(
            out,
            "{:<10} {:>10} {:>9.1} {:>12.0} {:>8.1}% {:>14} {:>7} {:>6} {:>6} {:>6.2}%",
            model,
            s.true_tokens_per_minute,
            s.last_accepted_ms as f64 / 60e3,
            row.charged_per_minute,
            100.0 * row.of_limit,
            s.max_tokens_in_a_minute,
            s.accepted,
            s.rate_limited,
            s.overloaded,
            100.0 * row.rate_limited_share,
        );
    }
    out.push_str(
        "(busy min: until the model's last accepted call; charged tpm: tokens the provider charged per minute of that; of limit: charged against the limit over that time, a neighbour's share taken (a fleet held to the limit in every rolling minute reaches 100 % at most; the provider's bucket starts full, so one that is not may pass it); most in a min: in any rolling minute, which a bucket that starts full lets reach twice the limit; 429 %: of all the model's calls)",
    );
    out
}

/// With the models' rates in the cells, the most of its calls a model may see answered 429.
pub const GOAL_RATE_LIMITED_SHARE: f64 = 0.01;
/// With the models' rates in the cells, the least the saturated model (the one that used the
/// largest share of its limit) must use of it.
pub const GOAL_OF_LIMIT: f64 = 0.90;

/// What `--check` finds wrong with a fleet run that shared the models' rates: a model answered
/// 429 on more than [`GOAL_RATE_LIMITED_SHARE`] of its calls, the provider charged a model more
/// tokens or calls than its limit within a rolling minute, or the saturated model used less than
/// [`GOAL_OF_LIMIT`] of its limit.
pub fn rate_problems(stats: &BTreeMap<String, UpstreamStats>) -> Vec<String> {
    let mut problems = Vec::new();
    for (model, s) in stats {
        if s.max_tokens_in_a_minute > s.true_tokens_per_minute {
            problems.push(format!(
                "{model}: the provider charged {} tokens within one rolling minute (ending at simulated second {:.1}), over the organisation's limit of {}",
                s.max_tokens_in_a_minute,
                s.busiest_minute_ends_ms as f64 / 1e3,
                s.true_tokens_per_minute
            ));
        }
        if s.max_requests_in_a_minute > s.true_requests_per_minute {
            problems.push(format!(
                "{model}: the provider accepted {} calls within one rolling minute, over the organisation's limit of {}",
                s.max_requests_in_a_minute, s.true_requests_per_minute
            ));
        }
        let row = OrganisationRow::of(s);
        if row.rate_limited_share > GOAL_RATE_LIMITED_SHARE {
            problems.push(format!(
                "{model}: {} of its {} calls answered 429 ({:.2} %), over the {:.0} % a fleet sharing its rates may see",
                s.rate_limited,
                s.accepted + s.rate_limited + s.overloaded,
                100.0 * row.rate_limited_share,
                100.0 * GOAL_RATE_LIMITED_SHARE
            ));
        }
    }
    let saturated = stats
        .iter()
        .map(|(model, s)| (model, OrganisationRow::of(s).of_limit))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((model, of_limit)) = saturated.filter(|(_, share)| *share < GOAL_OF_LIMIT) {
        problems.push(format!(
            "{model}, the most saturated model, used {:.1} % of its limit, under the {:.0} % a fleet sharing its rates must reach",
            100.0 * of_limit,
            100.0 * GOAL_OF_LIMIT
        ));
    }
    problems
}

/// One model's line of the organisation's table, as `--check` judges it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OrganisationRow {
    /// Tokens charged per simulated minute while the model had work.
    pub charged_per_minute: f64,
    /// Tokens charged against what the provider could have accepted over that time.
    pub of_limit: f64,
    /// 429 answers among all the model's calls.
    pub rate_limited_share: f64,
}

impl OrganisationRow {
    /// The row of `stats`.
    pub fn of(stats: &UpstreamStats) -> OrganisationRow {
        let minutes = stats.last_accepted_ms as f64 / 60e3;
        let asked = stats.accepted + stats.rate_limited + stats.overloaded;
        OrganisationRow {
            charged_per_minute: if minutes > 0.0 {
                stats.tokens_charged as f64 / minutes
            } else {
                0.0
            },
            of_limit: stats.tokens_charged as f64
                / stats
                    .offered_tokens
                    .saturating_sub(stats.true_tokens_per_minute)
                    .max(1) as f64,
            rate_limited_share: stats.rate_limited as f64 / asked.max(1) as f64,
        }
    }
}

/// Starts member `index` with `args`, its stdin a pipe from this process and its output in
/// `fleet_dir`.
fn start_member(
    exe: &Path,
    args: Vec<String>,
    index: u32,
    fleet_dir: &Path,
) -> anyhow::Result<Member> {
    let out = fleet_dir.join(format!("member-{index}.out"));
    let err = fleet_dir.join(format!("member-{index}.err"));
    let stdout = File::create(&out).with_context(|| format!("creating {}", out.display()))?;
    let stderr = File::create(&err).with_context(|| format!("creating {}", err.display()))?;
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting fleet member {index}"))?;
    Ok(Member {
        index,
        stdin: child.stdin.take(),
        child: Some(child),
        status: None,
        killed_by_chaos: false,
        out,
        err,
    })
}

/// What the parent needs to inject a `--chaos` fault while it watches.
struct Faults<'a> {
    injector: Option<&'a mut Injector>,
    server: Option<&'a mut PrivateRedis>,
    cluster: Option<&'a mut PrivateCluster>,
    redis: &'a FleetRedis,
    /// Each model's cell by a key of it.
    cells: &'a [(String, String)],
    runtime: &'a tokio::runtime::Runtime,
}

/// How watching the members ended.
#[derive(Debug, Default)]
struct Watched {
    /// Some were still running at the limit and were killed.
    overran: bool,
    /// The signal the parent got and forwarded.
    signal: Option<&'static str>,
    /// Some had not stopped `STOP_GRACE` after the forwarded signal and were killed.
    stuck: bool,
}

/// Watches the members until every one has exited, for at most `limit` (then the ones still
/// running are killed): forwards a first signal to them (a second kills them), and moves the
/// fault on (a restarted server is started again even if every member already exited).
fn watch(
    members: &mut [Member],
    limit: Duration,
    signals: &Receiver<&'static str>,
    faults: &mut Option<Faults<'_>>,
) -> Watched {
    let deadline = Instant::now() + limit;
    let mut watched = Watched::default();
    let mut stop_by: Option<Instant> = None;
    loop {
        let running = reap(members);
        let now = Instant::now();
        while let Ok(signal) = signals.try_recv() {
            if watched.signal.is_none() {
                watched.signal = Some(signal);
                say(&format!(
                    "{signal}: forwarded to every member; waiting up to {} s for them to stop, give their leases back and report (send it again to kill them)",
                    STOP_GRACE.as_secs()
                ));
                for member in members.iter_mut() {
                    if let Some(pipe) = member.stdin.take() {
                        signals::forward(pipe, signal);
                    }
                }
                stop_by = Some(now + STOP_GRACE);
                if let Some(injector) = faults.as_mut().and_then(|f| f.injector.as_mut()) {
                    injector.disarm();
                }
            } else {
                say(&format!("{signal} again: killing every member"));
                kill_all(members);
            }
        }
        let mut restarting = false;
        if let Some(faults) = faults.as_mut()
            && let Some(injector) = faults.injector.as_mut()
        {
            let victim = members.last_mut().and_then(|m| {
                let index = m.index;
                m.child.as_mut().map(|child| (index, child))
            });
            let endpoint = match faults.redis {
                FleetRedis::Server(endpoint) => Some(endpoint),
                FleetRedis::Cluster(_) => None,
            };
            let targets = Targets {
                server: faults.server.as_deref_mut(),
                cluster: faults.cluster.as_deref_mut(),
                endpoint,
                cells: faults.cells,
                victim,
                runtime: faults.runtime,
            };
            if let Some(line) = injector.step(now, targets) {
                say(&line);
            }
            if let Some(killed) = injector.killed {
                for member in members.iter_mut().filter(|m| m.index == killed) {
                    member.killed_by_chaos = true;
                }
            }
            restarting = injector.is_down();
        }
        if !running && !restarting {
            return watched;
        }
        if running && now >= deadline {
            kill_all(members);
            watched.overran = true;
        }
        if running && stop_by.is_some_and(|by| now >= by) {
            kill_all(members);
            watched.stuck = true;
        }
        std::thread::sleep(if restarting { FAULT_POLL } else { MEMBER_POLL });
    }
}

/// Reaps the members that exited; true while some still run.
fn reap(members: &mut [Member]) -> bool {
    let mut running = false;
    for member in members.iter_mut() {
        if let Some(child) = member.child.as_mut() {
            match child.try_wait() {
                Ok(Some(status)) => {
                    member.status = Some(status);
                    member.child = None;
                }
                Ok(None) => running = true,
                Err(_) => member.child = None,
            }
        }
    }
    running
}

/// Kills (SIGKILL) and reaps every member still running.
fn kill_all(members: &mut [Member]) {
    for member in members.iter_mut() {
        if let Some(mut child) = member.child.take() {
            let _ = child.kill();
            member.status = child.wait().ok();
        }
    }
}

/// Runs `attempt` until it succeeds or `until` has passed, each attempt bounded by
/// [`READ_ATTEMPT`]; the last error, saying how long it was retried.
async fn with_retries<T, F, Fut>(until: Instant, mut attempt: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let first = Instant::now();
    let mut tries = 0u32;
    loop {
        tries += 1;
        let error = match tokio::time::timeout(READ_ATTEMPT, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => error,
            Err(_) => anyhow!("no answer in {} s", READ_ATTEMPT.as_secs()),
        };
        if Instant::now() + READ_PAUSE >= until {
            return Err(error.context(format!(
                "still failing after {tries} attempts over {:.1} s",
                first.elapsed().as_secs_f64()
            )));
        }
        tokio::time::sleep(READ_PAUSE).await;
    }
}

/// One cell read after the run, through `cell`'s connection or, if that fails, a new one (the
/// old may be the one a restart broke); after a fault (`outage`), its first admission at or
/// after the fault's floor and its recoveries from the fault on.
async fn read_cell(
    cell: &RedisAdmission,
    model: &str,
    outage: Option<&Outage>,
) -> anyhow::Result<CellAfter> {
    match read_cell_on(cell, model, outage).await {
        Ok(reading) => Ok(reading),
        Err(first) => {
            let fresh = RedisAdmission::connect(cell.config().clone())
                .await
                .with_context(|| format!("{first:#}; then connecting anew"))?;
            read_cell_on(&fresh, model, outage)
                .await
                .with_context(|| format!("{first:#}; then on a new connection"))
        }
    }
}

async fn read_cell_on(
    cell: &RedisAdmission,
    model: &str,
    outage: Option<&Outage>,
) -> anyhow::Result<CellAfter> {
    let events = read_events(cell)
        .await
        .with_context(|| format!("reading the events of {model}'s cell"))?;
    let mut snapshot = cell
        .snapshot("agents", model)
        .await
        .with_context(|| format!("reading {model}'s cell"))?;
    // Each snapshot reaps a bounded batch of expired leases: go on until none is left.
    for _ in 0..REAP_PASSES {
        if snapshot.reaped == 0 {
            break;
        }
        snapshot = cell
            .snapshot("agents", model)
            .await
            .with_context(|| format!("reading {model}'s cell"))?;
    }
    Ok(CellAfter {
        model: model.to_owned(),
        events_peak_tokens: events
            .iter()
            .map(|e| e.occupancy.service_bytes)
            .max()
            .unwrap_or(0),
        events_peak_requests: events
            .iter()
            .map(|e| e.occupancy.service_transfers)
            .max()
            .unwrap_or(0),
        admitted_events: events.iter().filter(|e| e.kind == "admitted").count() as u64,
        queued: queued_by_member(
            events
                .iter()
                .filter(|e| e.kind == "queued")
                .map(|e| e.lease.as_str()),
        ),
        events: events.len() as u64,
        leases_held: snapshot.leases,
        tokens_held: snapshot.occupancy.service_bytes,
        requests_held: snapshot.occupancy.service_transfers,
        first_admission_ms: outage.and_then(|o| {
            chaos::first_admission_after(
                events
                    .iter()
                    .filter(|e| o.killed.is_none() || member_of(&e.lease) != o.killed)
                    .map(|e| (e.kind.as_str(), e.time_ms)),
                o.floor_ms,
            )
        }),
        recoveries: outage.map_or_else(Vec::new, |o| {
            chaos::recoveries_after(
                events
                    .iter()
                    .map(|e| (e.kind.as_str(), e.time_ms, e.outcome.as_str())),
                o.start_ms,
            )
        }),
    })
}

/// What a `--chaos` run found about its fault, for the lines it prints before its verdict and
/// the problems `--check` fails on.
pub struct ChaosVerdict<'a> {
    /// The fault.
    pub fault: Fault,
    /// What it did, if it was injected and its course ended.
    pub outage: Option<&'a Outage>,
    /// The failed jobs, judged.
    pub judged: &'a Judged,
    /// The jobs of the members that reported.
    pub jobs: u64,
    /// The resumption: the server time of the first admission at or after the fault's floor on
    /// the cells it reached.
    pub resumed_ms: Option<u64>,
    /// The `recovering` records on those cells from the fault on: model, server time, outcome.
    pub recoveries: Vec<(String, u64, String)>,
    /// The fleet's totals per model, for what the members held at once.
    pub totals: &'a [ModelTotals],
    /// The members' start, from which times are given.
    pub origin_ms: u64,
}

impl ChaosVerdict<'_> {
    /// The lines (each starts `chaos: `): the fault's window, after a failover the election,
    /// the jobs failed and their share, the resumption against its bound (`chaos: resumed:`),
    /// the recoveries (`chaos: recovery:`), and what the members held at once by their own
    /// clocks.
    pub fn lines(&self) -> Vec<String> {
        let origin = self.origin_ms;
        let mut lines = Vec::new();
        let Some(o) = self.outage else {
            lines.push(format!("chaos: {}: no outage recorded", self.fault.name()));
            lines.push(self.jobs_line());
            lines.push(self.held_line());
            return lines;
        };
        lines.push(match self.resumed_ms {
            Some(resumed) => format!(
                "chaos: {}: from the fault at {} to the first admission after it at {} ({:.2} s); a failed job is excused only if its own deadline fell in between",
                self.fault.name(),
                chaos::offset(o.start_ms, origin),
                chaos::offset(resumed, origin),
                resumed.saturating_sub(o.start_ms) as f64 / 1_000.0
            ),
            None => format!(
                "chaos: {}: from the fault at {}, admission never resumed; no failed job is excused",
                self.fault.name(),
                chaos::offset(o.start_ms, origin)
            ),
        });
        if let (Some(elected_ms), Some(ok_ms)) = (o.elected_ms, o.ok_ms) {
            lines.push(format!(
                "chaos: election: {} {} ms after the fault (at {}); the cluster was ok again at {}",
                if self.fault == Fault::Failover {
                    "the replica answered as the master"
                } else {
                    "a replica took the killed master's slots over"
                },
                elected_ms.saturating_sub(o.start_ms),
                chaos::offset(elected_ms, origin),
                chaos::offset(ok_ms, origin)
            ));
        }
        lines.push(self.jobs_line());
        let cells = if self.fault.on_cluster() {
            " on the failed-over cells"
        } else {
            ""
        };
        let (earliest, latest) = o.bound_ms;
        lines.push(match self.resumed_ms {
            Some(first) => {
                let (after, within) = o.resumed(first);
                let ready = o
                    .ready_ms
                    .filter(|_| self.fault == Fault::Restart)
                    .map(|ready| {
                        format!(
                            "; {} ms after the server was ready again",
                            first.saturating_sub(ready)
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "chaos: resumed: first admission{cells} {after} ms after {}, bound {earliest} to {latest} ms: {} (at {}{ready})",
                    o.reference(),
                    if within { "ok" } else { "FAILED" },
                    chaos::offset(first, origin)
                )
            }
            None => format!(
                "chaos: resumed: no admission{cells} after {}, bound {earliest} to {latest} ms: FAILED",
                o.reference()
            ),
        });
        lines.push(if self.recoveries.is_empty() {
            "chaos: recovery: none after the fault".to_owned()
        } else {
            let each: Vec<String> = self
                .recoveries
                .iter()
                .map(|(model, at, outcome)| {
                    format!("{model} {outcome} at {}", chaos::offset(*at, origin))
                })
                .collect();
            format!(
                "chaos: recovery: {} after the fault ({}){}",
                self.recoveries.len(),
                each.join(", "),
                if self.fault.lossless() {
                    ": FAILED (a fault that loses nothing acknowledged must start none)"
                } else {
                    ""
                }
            )
        });
        lines.push(self.held_line());
        lines
    }

    /// `chaos: jobs failed: F of N (P %) ...`.
    fn jobs_line(&self) -> String {
        let j = self.judged;
        format!(
            "chaos: jobs failed: {} of {} ({:.1} %; {} timed out, {} failed); {} with their own deadline between the fault and the resumption, {} not",
            j.failed,
            self.jobs,
            100.0 * j.failed as f64 / self.jobs.max(1) as f64,
            j.timed_out,
            j.failed - j.timed_out,
            j.inside,
            j.outside.len()
        )
    }

    /// What the members held at once by their own clocks.
    fn held_line(&self) -> String {
        let held: Vec<String> = self
            .totals
            .iter()
            .map(|t| {
                let (ct, cr) = t.ceiling.map_or((0, 0), |c| (c.tokens, c.requests));
                format!(
                    "{} {} of {ct} tokens, {} of {cr} requests",
                    t.model, t.held_peak_tokens, t.held_peak_requests
                )
            })
            .collect();
        format!(
            "chaos: most held at once by the members' clocks: {}; releases Redis did not confirm: {}",
            held.join("; "),
            self.totals
                .iter()
                .map(|t| t.release_unconfirmed)
                .sum::<u64>()
        )
    }

    /// What `--check` fails on, but the failed jobs outside the window
    /// ([`failed_job_problems`]): a resumption out of its bound or none; after a lossless fault,
    /// any failed job and any recovery.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let Some(o) = self.outage else {
            return problems;
        };
        let (earliest, latest) = o.bound_ms;
        match self.resumed_ms {
            Some(first) => {
                let (after, within) = o.resumed(first);
                if !within {
                    problems.push(format!(
                        "chaos: {}: the first admission came {after} ms after {}, outside its bound of {earliest} to {latest} ms",
                        self.fault.name(),
                        o.reference()
                    ));
                }
            }
            None => problems.push(format!(
                "chaos: {}: admission never resumed after {}",
                self.fault.name(),
                o.reference()
            )),
        }
        if self.fault.lossless() {
            if self.judged.failed > 0 {
                problems.push(format!(
                    "chaos: {}: {} jobs failed through a fault that loses nothing acknowledged",
                    self.fault.name(),
                    self.judged.failed
                ));
            }
            if !self.recoveries.is_empty() {
                problems.push(format!(
                    "chaos: {}: {} cells recovered after a fault that loses nothing acknowledged",
                    self.fault.name(),
                    self.recoveries.len()
                ));
            }
        }
        problems
    }
}

/// A problem for each member whose jobs timed out or failed without their deadline between the
/// fault and the resumption (every such job, when there was no fault), naming up to three.
pub fn failed_job_problems(
    judged: &Judged,
    outage: Option<&Outage>,
    origin_ms: u64,
) -> Vec<String> {
    let mut by_member: BTreeMap<u32, Vec<&JobEnd>> = BTreeMap::new();
    for (member, end) in &judged.outside {
        by_member.entry(*member).or_default().push(end);
    }
    let place = if outage.is_some() {
        "outside the fault's window"
    } else {
        "(no outage)"
    };
    by_member
        .into_iter()
        .map(|(member, ends)| {
            let named: Vec<String> = ends
                .iter()
                .take(3)
                .map(|end| {
                    let how = match end.kind {
                        chaos::EndKind::TimedOut => "timed out",
                        chaos::EndKind::Failed => "failed",
                    };
                    let deadline = end.deadline_ms.map_or_else(
                        || "not in a lease wait".to_owned(),
                        |d| format!("lease deadline {}", chaos::offset(d, origin_ms)),
                    );
                    match &end.error {
                        Some(error) => format!("{} {how} ({deadline}: {error})", end.job),
                        None => format!("{} {how} ({deadline})", end.job),
                    }
                })
                .collect();
            format!(
                "process {member}: {} jobs timed out or failed {place}: {}{}",
                ends.len(),
                named.join("; "),
                if ends.len() > 3 { "; ..." } else { "" }
            )
        })
        .collect()
}

/// The last `lines` lines of `text`, indented on lines of their own (empty for none).
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = all.len().saturating_sub(lines);
    all[start..].iter().map(|l| format!("\n    {l}")).collect()
}

/// What `--check` finds wrong fleet-wide (the members' own problems included); empty when it
/// passes.
pub fn fleet_problems(
    reports: &[MemberReport],
    totals: &[ModelTotals],
    after: &[CellAfter],
) -> Vec<String> {
    let mut problems = Vec::new();
    for report in reports {
        problems.extend(
            report
                .problems
                .iter()
                .map(|p| format!("process {}: {p}", report.member)),
        );
        let ended_badly = report.outcomes.timed_out + report.outcomes.failed;
        if ended_badly != report.ends.len() as u64 {
            problems.push(format!(
                "process {}: {ended_badly} jobs timed out or failed, {} of them recorded how",
                report.member,
                report.ends.len()
            ));
        }
    }
    for t in totals {
        let Some(ceiling) = t.ceiling else { continue };
        let events = after.iter().find(|a| a.model == t.model);
        let tokens = t
            .peak_tokens
            .max(events.map_or(0, |a| a.events_peak_tokens));
        let requests = t
            .peak_requests
            .max(events.map_or(0, |a| a.events_peak_requests));
        if tokens > ceiling.tokens {
            problems.push(format!(
                "{}: {tokens} tokens in flight fleet-wide, ceiling {}",
                t.model, ceiling.tokens
            ));
        }
        if requests > ceiling.requests {
            problems.push(format!(
                "{}: {requests} requests in flight fleet-wide, ceiling {}",
                t.model, ceiling.requests
            ));
        }
        if t.held_peak_tokens > ceiling.tokens {
            problems.push(format!(
                "{}: {} tokens held at once by the members' clocks, ceiling {}",
                t.model, t.held_peak_tokens, ceiling.tokens
            ));
        }
        if t.held_peak_requests > ceiling.requests {
            problems.push(format!(
                "{}: {} leases held at once by the members' clocks, ceiling {}",
                t.model, t.held_peak_requests, ceiling.requests
            ));
        }
        if t.lost > 0 {
            problems.push(format!(
                "{}: {} leases lost before their release",
                t.model, t.lost
            ));
        }
    }
    for a in after {
        if a.leases_held > 0 || a.tokens_held > 0 || a.requests_held > 0 {
            problems.push(format!(
                "{}: {} leases ({} tokens, {} requests) still held in the cell after the run",
                a.model, a.leases_held, a.tokens_held, a.requests_held
            ));
        }
    }
    problems
}

/// The fleet's tables: one row per process and the fleet's, then one row per model.
pub fn render(
    reports: &[MemberReport],
    totals: &[ModelTotals],
    after: &[CellAfter],
    script_calls: &Result<u64, String>,
    n: u32,
) -> String {
    let mut out = String::new();
    let span = |s: f64| format!("{s:.2}s");
    let _ = writeln!(
        out,
        "{:<8} {:>6} {:>9} {:>6} {:>6} {:>7} {:>7} {:>9} {:>9} {:>10} {:>10} {:>7}",
        "process",
        "agents",
        "completed",
        "other",
        "steps",
        "leases",
        "queued",
        "lease p50",
        "lease p99",
        "local p50",
        "local p99",
        "real s"
    );
    let queued_of = |member: Option<u32>| -> u64 {
        after
            .iter()
            .flat_map(|a| &a.queued)
            .filter(|(m, _)| member.is_none_or(|i| i == **m))
            .map(|(_, n)| n)
            .sum()
    };
    let row = |out: &mut String, name: &str, r: &MemberReport, waits: WaitSummary, queued| {
        let o = &r.outcomes;
        let _ = writeln!(
            out,
            "{:<8} {:>6} {:>9} {:>6} {:>6} {:>7} {:>7} {:>9} {:>9} {:>10} {:>10} {:>7.1}",
            name,
            r.jobs,
            o.completed,
            o.total.saturating_sub(o.completed),
            r.steps_ok,
            waits.count,
            queued,
            span(waits.p50_s),
            span(waits.p99_s),
            span(r.local_wait_p50_s),
            span(r.local_wait_p99_s),
            r.real_seconds
        );
    };
    for r in reports {
        let waits = WaitSummary::of(r.waits());
        row(
            &mut out,
            &r.member.to_string(),
            r,
            waits,
            queued_of(Some(r.member)),
        );
    }
    let fleet = fleet_report(reports);
    let all_waits = WaitSummary::of(reports.iter().flat_map(MemberReport::waits).collect());
    row(&mut out, "fleet", &fleet, all_waits, queued_of(None));
    let _ = writeln!(
        out,
        "({} of {n} processes reported; other: jobs that did not complete; queued: leases that did not fit at once and took a ticket in the fleet's line; local: each process's own monitor, fleet row: the worst process; waits simulated)",
        reports.len()
    );

    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<8} {:>15} {:>15} {:>17} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "model",
        "tokens ceiling",
        "peak (events)",
        "requests ceiling",
        "peak",
        "leases",
        "queued",
        "lease p50",
        "lease p99",
        "lease max",
        "held"
    );
    for t in totals {
        let a = after.iter().find(|a| a.model == t.model);
        // A cell the parent could not read after the run shows `?`, not a zero.
        let read =
            |f: &dyn Fn(&CellAfter) -> u64| a.map_or_else(|| "?".to_owned(), |a| f(a).to_string());
        let (ct, cr) = t.ceiling.map_or((0, 0), |c| (c.tokens, c.requests));
        let _ = writeln!(
            out,
            "{:<8} {:>15} {:>15} {:>17} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>6}",
            t.model,
            ct,
            format!("{} ({})", t.peak_tokens, read(&|a| a.events_peak_tokens)),
            cr,
            format!(
                "{} ({})",
                t.peak_requests,
                read(&|a| a.events_peak_requests)
            ),
            t.leases,
            read(&|a| a.queued.values().sum::<u64>()),
            span(t.waits.p50_s),
            span(t.waits.p99_s),
            span(t.waits.max_s),
            read(&|a| a.leases_held)
        );
    }
    let _ = writeln!(
        out,
        "(peak: the most in flight fleet-wide that any lease saw at its admission, and in brackets in any record of the cell's events stream; held: leases still in the cell after the run)"
    );
    for a in after {
        if a.events >= cells::EVENTS_MAX_LEN {
            let _ = writeln!(
                out,
                "note: {}'s events stream reached its bound ({} records): its oldest records were trimmed",
                a.model, a.events
            );
        }
    }
    let held: Vec<String> = totals
        .iter()
        .map(|t| {
            format!(
                "{} {} tokens, {} requests",
                t.model, t.held_peak_tokens, t.held_peak_requests
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "held at once by the members' own clocks (from a grant's return to its release call): {}",
        held.join("; ")
    );
    let leases: u64 = totals.iter().map(|t| t.leases).sum();
    let admitted: u64 = after.iter().map(|a| a.admitted_events).sum();
    match script_calls {
        Ok(calls) => {
            let _ = writeln!(
                out,
                "round trips: {calls} script calls (FCALL/EVALSHA/EVAL, counted by the server or summed over the cluster's masters, connects included) for {leases} leases admitted ({admitted} admitted records): {} per admitted lease",
                per_lease(*calls, leases)
            );
        }
        Err(why) => {
            let _ = writeln!(
                out,
                "round trips: {why} ({leases} leases admitted, {admitted} admitted records)"
            );
        }
    }
    out
}

/// `calls / leases` with two decimals, or `-` for no lease.
pub fn per_lease(calls: u64, leases: u64) -> String {
    if leases == 0 {
        "-".to_owned()
    } else {
        format!("{:.2}", calls as f64 / leases as f64)
    }
}

/// The members' counts added up (the local waits: the worst member's).
pub fn fleet_report(reports: &[MemberReport]) -> MemberReport {
    let mut fleet = MemberReport::default();
    for r in reports {
        fleet.jobs += r.jobs;
        let (o, f) = (&r.outcomes, &mut fleet.outcomes);
        f.total += o.total;
        f.completed += o.completed;
        f.gave_up += o.gave_up;
        f.over_budget += o.over_budget;
        f.timed_out += o.timed_out;
        f.cancelled += o.cancelled;
        f.failed += o.failed;
        fleet.steps_ok += r.steps_ok;
        fleet.grants += r.grants;
        fleet.real_seconds = fleet.real_seconds.max(r.real_seconds);
        fleet.simulated_seconds = fleet.simulated_seconds.max(r.simulated_seconds);
        fleet.local_wait_p50_s = fleet.local_wait_p50_s.max(r.local_wait_p50_s);
        fleet.local_wait_p99_s = fleet.local_wait_p99_s.max(r.local_wait_p99_s);
    }
    fleet
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis_server::{ClusterNodes, Endpoint};

    fn reading(model: &str, leases: u64, peak: (u64, u64), waits_us: &[u64]) -> CellReading {
        CellReading {
            model: model.into(),
            ceiling: Some(ModelCeiling {
                tokens: 10_000,
                requests: 4,
            }),
            leases,
            peak_tokens: peak.0,
            peak_requests: peak.1,
            waits_us: waits_us.to_vec(),
            ..CellReading::default()
        }
    }

    fn member(index: u32, completed: u64, cells: Vec<CellReading>) -> MemberReport {
        MemberReport {
            member: index,
            jobs: 10,
            outcomes: Outcomes {
                total: 10,
                completed,
                timed_out: 10 - completed,
                ..Outcomes::default()
            },
            steps_ok: 30,
            grants: 31,
            real_seconds: 2.0 + f64::from(index),
            simulated_seconds: 600.0,
            local_wait_p50_s: 0.5,
            local_wait_p99_s: 1.0 + f64::from(index),
            cells,
            problems: Vec::new(),
            ends: Vec::new(),
        }
    }

    #[test]
    fn the_fleets_rates_are_judged_by_the_providers_counts() {
        // A minute of 100,000 tokens and 200 calls: the provider could have charged its full
        // bucket and a minute's refill (200,000); a fleet held to the limit, the refill.
        let stats = |accepted, rate_limited, charged, most| UpstreamStats {
            accepted,
            rate_limited,
            tokens_charged: charged,
            offered_tokens: 200_000,
            true_tokens_per_minute: 100_000,
            true_requests_per_minute: 200,
            max_tokens_in_a_minute: most,
            max_requests_in_a_minute: accepted,
            last_accepted_ms: 60_000,
            ..UpstreamStats::default()
        };
        let mut fleet = BTreeMap::new();
        fleet.insert("a".to_owned(), stats(99, 1, 90_000, 100_000));
        fleet.insert("b".to_owned(), stats(50, 0, 10_000, 10_000));
        // 1 % answered 429, 90 % of the limit used, the limit in the busiest minute: every goal
        // met, exactly.
        assert_eq!(rate_problems(&fleet), Vec::<String>::new());
        fleet.insert("a".to_owned(), stats(98, 2, 88_000, 100_001));
        fleet.insert("b".to_owned(), stats(201, 0, 10_000, 10_000));
        let problems = rate_problems(&fleet);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "a: the provider charged 100001 tokens within one rolling minute (ending at simulated second 0.0), over the organisation's limit of 100000"
            ),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("a: 2 of its 100 calls answered 429 (2.00 %)"),
            "{problems:?}"
        );
        assert!(
            problems[2].starts_with(
                "b: the provider accepted 201 calls within one rolling minute, over the organisation's limit of 200"
            ),
            "{problems:?}"
        );
        assert!(
            problems[3].starts_with("a, the most saturated model, used 88.0 % of its limit"),
            "{problems:?}"
        );
        let row = OrganisationRow::of(&fleet["b"]);
        assert_eq!(
            (row.charged_per_minute, row.of_limit, row.rate_limited_share),
            (10_000.0, 0.1, 0.0)
        );
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&values, 0.5), 50);
        assert_eq!(quantile(&values, 0.99), 99);
        assert_eq!(quantile(&values, 1.0), 100);
        assert_eq!(quantile(&values, 0.0), 1);
        assert_eq!(quantile(&[7], 0.99), 7);
        assert_eq!(quantile(&[], 0.5), 0);
        let w = WaitSummary::of(vec![3_000_000, 0, 500, 1_000, 2_000_000]);
        assert_eq!(w.count, 5);
        assert_eq!(w.p50_s, 0.001);
        assert_eq!(w.p99_s, 3.0);
        assert_eq!(w.max_s, 3.0);
    }

    #[test]
    fn queued_records_are_counted_per_member() {
        assert_eq!(member_of("m3-agent-007-s1-a0"), Some(3));
        assert_eq!(member_of("m12-x"), Some(12));
        assert_eq!(member_of("agent-007"), None);
        assert_eq!(member_of("mx-agent"), None);
        let queued = queued_by_member(["m0-a", "m1-b", "m0-c", "other", "m0-d"]);
        assert_eq!(queued, BTreeMap::from([(0, 3), (1, 1)]));
    }

    #[test]
    fn shares_add_up_to_the_agents() {
        assert_eq!(
            (0..4).map(|i| share(10, 4, i)).collect::<Vec<_>>(),
            [3, 3, 2, 2]
        );
        assert_eq!((0..3).map(|i| share(400, 3, i)).sum::<u32>(), 400);
        assert_eq!(share(5, 1, 0), 5);
        assert_eq!(lease_wait(1_800, 300), Duration::from_secs(6));
        assert_eq!(lease_wait(60, 300), Duration::from_secs(1));
    }

    #[test]
    fn a_member_gets_its_share_its_seed_and_the_user_flags() {
        use clap::Parser as _;
        let args = crate::Args::try_parse_from([
            "agents", "--fleet", "3", "--jobs", "10", "--seed", "7", "--steps", "2", "--http", "9",
        ])
        .unwrap();
        let endpoint = Endpoint {
            host: "127.0.0.1".into(),
            port: 6400,
        };
        let server = FleetRedis::Server(endpoint.clone());
        let line = member_args(
            &args,
            3,
            2,
            &server,
            "agents-1-2",
            Path::new("/o/m2"),
            "http://127.0.0.1:9",
        )
        .join(" ");
        assert_eq!(
            line,
            "--fleet 3 --fleet-member 2 --redis 127.0.0.1:6400 --cell agents-1-2 --jobs 3 \
             --seed 9 --out-dir /o/m2 --provider-url http://127.0.0.1:9 --fleet-rates on \
             --steps 2 --time-scale 60 --blocking-percent 10 --http 9 \
             --db 8 --search-per-minute 40 --retries 5 --admit-timeout 1800 --run-timeout 300"
        );
        // The member's own command line parses back.
        let member = crate::Args::try_parse_from(
            std::iter::once("agents".to_owned()).chain(line.split(' ').map(str::to_owned)),
        )
        .unwrap();
        assert_eq!(
            (member.fleet_member, member.jobs, member.seed),
            (Some(2), 3, 9)
        );
        assert_eq!(member.redis, Some(endpoint));
        assert_eq!(member.redis_cluster, None);
        assert_eq!(member.fleet_redis(), Some(server));
    }

    #[test]
    fn a_member_of_a_fleet_on_a_cluster_gets_every_seed_node() {
        use clap::Parser as _;
        let args = crate::Args::try_parse_from([
            "agents",
            "--fleet",
            "2",
            "--jobs",
            "10",
            "--redis-cluster",
            "127.0.0.1:7000,127.0.0.1:7001",
        ])
        .unwrap();
        let nodes: ClusterNodes = "127.0.0.1:7000,127.0.0.1:7001".parse().unwrap();
        assert_eq!(args.redis_cluster, Some(nodes.clone()));
        assert_eq!(args.redis, None);
        let cluster = FleetRedis::Cluster(nodes);
        assert_eq!(args.fleet_redis(), Some(cluster.clone()));
        let line = member_args(
            &args,
            2,
            1,
            &cluster,
            "p",
            Path::new("/o/m1"),
            "http://127.0.0.1:9",
        )
        .join(" ");
        assert!(
            line.starts_with(
                "--fleet 2 --fleet-member 1 --redis-cluster 127.0.0.1:7000,127.0.0.1:7001 --cell p "
            ),
            "{line}"
        );
        assert!(!line.contains("--redis "), "{line}");
        let member = crate::Args::try_parse_from(
            std::iter::once("agents".to_owned()).chain(line.split(' ').map(str::to_owned)),
        )
        .unwrap();
        assert_eq!(
            (member.fleet_member, member.fleet_redis()),
            (Some(1), Some(cluster))
        );
    }

    #[test]
    fn the_cluster_flags_are_checked() {
        use clap::Parser as _;
        let parse = |a: &[&str]| crate::Args::try_parse_from([&["agents"], a].concat());
        // --redis-cluster only with --fleet, never with --redis, and with well-formed nodes.
        assert!(parse(&["--redis-cluster", "127.0.0.1:7000"]).is_err());
        let both = parse(&[
            "--fleet",
            "2",
            "--redis",
            "127.0.0.1:6379",
            "--redis-cluster",
            "127.0.0.1:7000",
        ])
        .unwrap_err();
        assert_eq!(both.kind(), clap::error::ErrorKind::ArgumentConflict);
        let bad = parse(&["--fleet", "2", "--redis-cluster", "127.0.0.1:7000,"]).unwrap_err();
        assert!(bad.to_string().contains("an empty node"), "{bad}");
        // A member needs its fleet's server or cluster, and its cells.
        assert!(parse(&["--fleet", "2", "--fleet-member", "0", "--cell", "p"]).is_err());
        let member = parse(&[
            "--fleet",
            "2",
            "--fleet-member",
            "0",
            "--cell",
            "p",
            "--redis-cluster",
            "127.0.0.1:7000",
        ])
        .unwrap();
        assert_eq!(member.fleet_member, Some(0));
        // kill-master needs no server: the parent starts its own cluster.
        let args = parse(&["--fleet", "4", "--chaos", "kill-master"]).unwrap();
        assert_eq!(
            (args.chaos, args.fleet_redis()),
            (Some(Fault::KillMaster), None)
        );
    }

    #[test]
    fn the_fleet_flags_are_checked() {
        use clap::Parser as _;
        let parse = |a: &[&str]| crate::Args::try_parse_from([&["agents"], a].concat());
        assert!(parse(&["--fleet", "0"]).is_err());
        assert!(parse(&["--fleet", "17"]).is_err());
        assert_eq!(parse(&["--fleet", "16"]).unwrap().fleet, Some(16));
        // --redis only with --fleet, and a bad endpoint is refused with the reason.
        assert!(parse(&["--redis", "127.0.0.1:6379"]).is_err());
        let error = parse(&["--fleet", "2", "--redis", "nohost"]).unwrap_err();
        assert!(error.to_string().contains("is not HOST:PORT"), "{error}");
        // A member needs its fleet's server and cells.
        assert!(parse(&["--fleet", "2", "--fleet-member", "0"]).is_err());
        // A fault is the parent's: only with --fleet, never passed to a member.
        assert!(parse(&["--chaos", "pause"]).is_err());
        assert!(parse(&["--fleet", "2", "--chaos", "reboot"]).is_err());
        let args = parse(&["--fleet", "4", "--chaos", "kill-member"]).unwrap();
        assert_eq!(
            (
                args.chaos,
                args.chaos_after_ms,
                args.chaos_down_ms,
                args.chaos_pause_ms
            ),
            (Some(Fault::KillMember), 1_000, 2_000, 3_000)
        );
        assert!(parse(&["--fleet", "2", "--chaos-after-ms", "500"]).is_err());
        assert!(parse(&["--fleet", "2", "--chaos-down-ms", "300"]).is_err());
        assert!(parse(&["--fleet", "2", "--chaos-pause-ms", "300"]).is_err());
        assert!(parse(&["--fleet", "2", "--chaos", "pause", "--chaos-pause-ms", "0"]).is_err());
        let lengths = parse(&[
            "--fleet",
            "4",
            "--chaos",
            "restart",
            "--chaos-down-ms",
            "10000",
            "--chaos-pause-ms",
            "500",
        ])
        .unwrap();
        assert_eq!(
            (lengths.chaos_down_ms, lengths.chaos_pause_ms),
            (10_000, 500)
        );
        let endpoint = Endpoint {
            host: "127.0.0.1".into(),
            port: 6400,
        };
        let line = member_args(
            &args,
            4,
            1,
            &FleetRedis::Server(endpoint),
            "p",
            Path::new("/o"),
            "http://127.0.0.1:9",
        )
        .join(" ");
        assert!(!line.contains("chaos"), "{line}");
    }

    #[test]
    fn a_member_declares_what_its_faults_server_promises() {
        use clap::Parser as _;
        let server = FleetRedis::Server("127.0.0.1:6400".parse().unwrap());
        for (fault, promise) in [
            ("restart", Promise::Nothing),
            ("restart-fsync", Promise::FsyncAlways),
            ("failover", Promise::OneReplica),
            ("kill-master", Promise::Nothing),
        ] {
            let args =
                crate::Args::try_parse_from(["agents", "--fleet", "2", "--chaos", fault]).unwrap();
            let line = member_args(&args, 2, 1, &server, "p", Path::new("/o"), "http://x");
            assert_eq!(
                line.windows(2).any(|w| w[0] == "--durability"),
                promise != Promise::Nothing,
                "{fault}: {line:?}"
            );
            let member =
                crate::Args::try_parse_from(std::iter::once("agents".to_owned()).chain(line))
                    .unwrap();
            assert_eq!(member.durability, promise, "{fault}");
        }
        // Only a member is told.
        assert!(
            crate::Args::try_parse_from(["agents", "--fleet", "2", "--durability", "fsync-always"])
                .is_err()
        );
    }

    #[test]
    fn the_check_counts_leases_held_at_once_by_the_members_clocks() {
        // Each member's leases fit; together, 6,000 + 5,000 tokens were held at once.
        let mut a = reading("model-a", 2, (6_000, 1), &[0, 0]);
        a.holds = vec![[1_000, 2_000, 6_000], [3_000, 4_000, 6_000]];
        let mut b = reading("model-a", 1, (5_000, 2), &[0]);
        b.holds = vec![[1_500, 1_600, 5_000]];
        let reports = [member(0, 10, vec![a]), member(1, 10, vec![b])];
        let totals = model_totals(&reports);
        assert_eq!(
            (totals[0].held_peak_tokens, totals[0].held_peak_requests),
            (11_000, 2)
        );
        assert_eq!(
            fleet_problems(&reports, &totals, &[]),
            ["model-a: 11000 tokens held at once by the members' clocks, ceiling 10000"]
        );
    }

    #[test]
    fn every_failed_job_must_say_how_it_ended() {
        // Two jobs timed out, one was recorded.
        let mut report = member(0, 8, vec![reading("model-a", 2, (100, 1), &[0])]);
        report.ends = vec![JobEnd {
            job: "agent-001".into(),
            kind: chaos::EndKind::TimedOut,
            deadline_ms: Some(5_000),
            error: None,
        }];
        let reports = [report];
        assert_eq!(
            fleet_problems(&reports, &model_totals(&reports), &[]),
            ["process 0: 2 jobs timed out or failed, 1 of them recorded how"]
        );
    }

    #[test]
    fn failed_jobs_outside_the_faults_window_are_named_per_process() {
        let end = |job: &str, kind, deadline_ms, error: Option<&str>| JobEnd {
            job: job.into(),
            kind,
            deadline_ms,
            error: error.map(str::to_owned),
        };
        // A pause sent at +1 s, ended at +4 s; admission resumed at +4.012 s.
        let outage = Outage::pause(11_000, Duration::from_secs(3));
        let resumed = Some(14_012);
        let ends = [
            (
                0,
                end("agent-001", chaos::EndKind::TimedOut, Some(12_000), None),
            ),
            (
                0,
                end("agent-002", chaos::EndKind::TimedOut, Some(16_250), None),
            ),
            (
                2,
                end("agent-009", chaos::EndKind::Failed, None, Some("boom")),
            ),
        ];
        let judged = chaos::judge(ends.iter().map(|(m, e)| (*m, e)), Some(&outage), resumed);
        assert_eq!(
            failed_job_problems(&judged, Some(&outage), 10_000),
            [
                "process 0: 1 jobs timed out or failed outside the fault's window: agent-002 timed out (lease deadline +6.25 s)",
                "process 2: 1 jobs timed out or failed outside the fault's window: agent-009 failed (not in a lease wait: boom)",
            ]
        );
        let totals = [ModelTotals {
            model: "model-a".into(),
            ceiling: Some(ModelCeiling {
                tokens: 10_000,
                requests: 4,
            }),
            held_peak_tokens: 9_500,
            held_peak_requests: 4,
            release_unconfirmed: 1,
            ..ModelTotals::default()
        }];
        let verdict = ChaosVerdict {
            fault: Fault::Pause,
            outage: Some(&outage),
            judged: &judged,
            jobs: 400,
            resumed_ms: resumed,
            recoveries: Vec::new(),
            totals: &totals,
            origin_ms: 10_000,
        };
        assert_eq!(
            verdict.lines(),
            [
                "chaos: pause: from the fault at +1.00 s to the first admission after it at +4.01 s (3.01 s); a failed job is excused only if its own deadline fell in between",
                "chaos: jobs failed: 3 of 400 (0.8 %; 2 timed out, 1 failed); 1 with their own deadline between the fault and the resumption, 2 not",
                "chaos: resumed: first admission 12 ms after the pause ended, bound 0 to 500 ms: ok (at +4.01 s)",
                "chaos: recovery: none after the fault",
                "chaos: most held at once by the members' clocks: model-a 9500 of 10000 tokens, 4 of 4 requests; releases Redis did not confirm: 1",
            ]
        );
        assert_eq!(verdict.problems(), Vec::<String>::new());

        // A pause after which nothing was admitted fails, and excuses nothing.
        let never = ChaosVerdict {
            resumed_ms: None,
            recoveries: Vec::new(),
            ..verdict
        };
        assert_eq!(
            never.lines()[2],
            "chaos: resumed: no admission after the pause ended, bound 0 to 500 ms: FAILED"
        );
        assert_eq!(
            never.problems(),
            ["chaos: pause: admission never resumed after the pause ended"]
        );

        // A lossy restart: its bound counts from the new process, and the time from the server's
        // return is said too; a recovery is expected, and an admission too early fails.
        let restart = Outage::restart(
            Fault::Restart,
            11_000,
            13_000,
            13_050,
            Duration::from_secs(10),
        );
        let restarted = ChaosVerdict {
            fault: Fault::Restart,
            outage: Some(&restart),
            resumed_ms: Some(23_100),
            recoveries: vec![("model-a".into(), 13_120, "restarted".into())],
            ..verdict
        };
        let lines = restarted.lines();
        assert_eq!(
            lines[2..4],
            [
                "chaos: resumed: first admission 10100 ms after the new server process started, bound 10000 to 11000 ms: ok (at +13.10 s; 10050 ms after the server was ready again)",
                "chaos: recovery: 1 after the fault (model-a restarted at +3.12 s)",
            ]
        );
        assert_eq!(restarted.problems(), Vec::<String>::new());
        let cut_short = ChaosVerdict {
            resumed_ms: Some(22_000),
            ..restarted
        };
        assert_eq!(
            cut_short.problems(),
            [
                "chaos: restart: the first admission came 9000 ms after the new server process started, outside its bound of 10000 to 11000 ms"
            ]
        );

        // A planned failover: the election's line, the first admission on the failed-over
        // cells; a job failed and a recovery each fail a lossless fault.
        let failover = Outage::failover(
            Fault::Failover,
            11_000,
            11_020,
            11_070,
            Duration::from_secs(10),
        );
        let planned = ChaosVerdict {
            fault: Fault::Failover,
            outage: Some(&failover),
            resumed_ms: Some(11_060),
            recoveries: vec![("model-a".into(), 11_050, "promoted".into())],
            ..verdict
        };
        let lines = planned.lines();
        assert_eq!(
            lines[1..5],
            [
                "chaos: election: the replica answered as the master 20 ms after the fault (at +1.02 s); the cluster was ok again at +1.07 s",
                "chaos: jobs failed: 3 of 400 (0.8 %; 2 timed out, 1 failed); 1 with their own deadline between the fault and the resumption, 2 not",
                "chaos: resumed: first admission on the failed-over cells 40 ms after the new master answered, bound 0 to 1000 ms: ok (at +1.06 s)",
                "chaos: recovery: 1 after the fault (model-a promoted at +1.05 s): FAILED (a fault that loses nothing acknowledged must start none)",
            ]
        );
        assert_eq!(
            planned.problems(),
            [
                "chaos: failover: 3 jobs failed through a fault that loses nothing acknowledged",
                "chaos: failover: 1 cells recovered after a fault that loses nothing acknowledged",
            ]
        );

        // No outage recorded (the fault could not be injected): what there is, and no problem
        // of its own (the injection's failure is one).
        let none = ChaosVerdict {
            outage: None,
            recoveries: Vec::new(),
            ..verdict
        };
        assert_eq!(none.lines().len(), 3);
        assert_eq!(none.lines()[0], "chaos: pause: no outage recorded");
        assert!(none.problems().is_empty());
    }

    #[test]
    fn a_member_report_round_trips_through_its_line() {
        let report = member(1, 10, vec![reading("model-a", 2, (5_000, 2), &[0, 1_500])]);
        let stdout = format!("== monitor: ... ==\n{}\nwrote x\n", report.line().unwrap());
        assert_eq!(parse_member_output(&stdout), Ok(report));
        assert!(parse_member_output("no report\n").is_err());
        assert!(parse_member_output(&format!("{REPORT_PREFIX}{{not json")).is_err());
    }

    #[test]
    fn totals_add_leases_and_merge_waits_and_peaks() {
        let reports = [
            member(
                0,
                10,
                vec![
                    reading("model-a", 2, (6_000, 2), &[0, 4_000_000]),
                    reading("model-b", 1, (100, 1), &[0]),
                ],
            ),
            member(
                1,
                9,
                vec![reading(
                    "model-a",
                    3,
                    (9_000, 3),
                    &[1_000_000, 2_000_000, 0],
                )],
            ),
        ];
        let totals = model_totals(&reports);
        assert_eq!(totals.len(), 2);
        let a = &totals[0];
        assert_eq!(a.model, "model-a");
        assert_eq!((a.leases, a.peak_tokens, a.peak_requests), (5, 9_000, 3));
        assert_eq!(a.waits.count, 5);
        assert_eq!(a.waits.p50_s, 1.0);
        assert_eq!(a.waits.max_s, 4.0);
        assert_eq!(totals[1].leases, 1);

        let fleet = fleet_report(&reports);
        assert_eq!(fleet.jobs, 20);
        assert_eq!(fleet.outcomes.completed, 19);
        assert_eq!(fleet.outcomes.timed_out, 1);
        assert_eq!(fleet.steps_ok, 60);
        assert_eq!(fleet.real_seconds, 3.0);
        assert_eq!(fleet.local_wait_p99_s, 2.0);
        assert_eq!(per_lease(12, 6), "2.00");
        assert_eq!(per_lease(5, 0), "-");
    }

    #[test]
    fn the_check_catches_over_ceiling_lost_and_held() {
        let mut over = member(0, 10, vec![reading("model-a", 2, (10_001, 4), &[0, 0])]);
        over.problems.push("monitor: 1 jobs timed out".into());
        let reports = [over];
        let totals = model_totals(&reports);
        let after = [CellAfter {
            model: "model-a".into(),
            events_peak_requests: 5,
            leases_held: 1,
            tokens_held: 300,
            requests_held: 1,
            ..CellAfter::default()
        }];
        assert_eq!(
            fleet_problems(&reports, &totals, &after),
            [
                "process 0: monitor: 1 jobs timed out",
                "model-a: 10001 tokens in flight fleet-wide, ceiling 10000",
                "model-a: 5 requests in flight fleet-wide, ceiling 4",
                "model-a: 1 leases (300 tokens, 1 requests) still held in the cell after the run",
            ]
        );
        let clean = [member(
            0,
            10,
            vec![reading("model-a", 2, (10_000, 4), &[0])],
        )];
        let totals = model_totals(&clean);
        let after = [CellAfter {
            model: "model-a".into(),
            events_peak_tokens: 10_000,
            events_peak_requests: 4,
            ..CellAfter::default()
        }];
        assert!(fleet_problems(&clean, &totals, &after).is_empty());
    }
}
