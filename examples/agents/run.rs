//! One run of the fleet under one strategy: build a fresh world, start every agent, sample the
//! limits while they work, end cleanly (all jobs done, Ctrl-C, or the run's deadline), and turn
//! what was measured into a [`RunSummary`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use admission_core::{EventSink, JobContext, Monitor, Timer};
use admission_llm::model_spec::ModelCatalog;
use admission_llm::spend::Money;
use anyhow::Context as _;
use tokio::task::JoinSet;

use crate::cells::Cells;
use crate::chain::Chain;
use crate::events::Sinks;
use crate::fairness::{self, Mode};
use crate::progress::Progress;
use crate::report::{self, ModelTallyReading, ResultsReading, RunSummary};
use crate::stop::Stop;
use crate::timeline::{Probe, Probes, Timeline};
use crate::workload::JobPlan;
use crate::world::{DB, HTTP, SEARCH, Settings, World};
use crate::{chain, fleet};

/// How often the sampler reads the limits, in real time.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// How long jobs get to wind down after a stop before they are aborted.
const GRACE: Duration = Duration::from_secs(5);

/// The two ways of taking several limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// One admission of the whole demand.
    Monitor,
    /// One limit after another, holding each.
    HoldAndWait,
}

impl Strategy {
    /// The strategy's name, as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Monitor => "monitor",
            Strategy::HoldAndWait => "hold-and-wait",
        }
    }
}

/// What every run of one invocation shares.
pub struct Input<'a> {
    /// The model catalog.
    pub catalog: &'a ModelCatalog,
    /// The agents.
    pub plan: &'a [Arc<JobPlan>],
    /// The knobs.
    pub settings: Settings,
    /// Where files go.
    pub out_dir: &'a Path,
    /// Triggered by Ctrl-C.
    pub interrupt: Arc<Stop>,
    /// The most real time a run may take.
    pub run_timeout: Duration,
    /// The fleet's cells, when this process is a member of a `--fleet` run.
    pub cells: Option<Arc<Cells>>,
    /// The fleet's provider (its parent serves it), when this process is a member; a run
    /// without one serves its own.
    pub provider_url: Option<String>,
    /// With `--metrics`: the sink recording the monitor's events for the Prometheus endpoint.
    pub metrics: Option<Arc<admission_events::MetricsSink>>,
    /// With `--tenants` or `--interactive-percent`: the tenants and levels.
    pub fair: Option<&'a fairness::Config>,
}

/// What the strategy set up, for sampling and for the end of the run.
enum Setup {
    Monitor {
        monitor: Monitor,
        sinks: Sinks,
        events_path: PathBuf,
        contexts: Vec<JobContext>,
    },
    Chain(Arc<Chain>),
}

/// Runs the fleet once under `strategy`; with tenants or levels, `mode` says whether the monitor
/// keeps fair shares and levels (`None` for the chain, which has no line). The files of a
/// monitor run with fairness off are named `...-fairness-off`, so that a `--fairness both`
/// keeps both runs'.
///
/// # Errors
///
/// When the world cannot be built, the monitor cannot start, or a file cannot be written.
pub async fn run(
    strategy: Strategy,
    mode: Option<Mode>,
    input: &Input<'_>,
) -> anyhow::Result<RunSummary> {
    let suffix = match (strategy, mode) {
        (Strategy::Monitor, Some(Mode::Off)) => "-fairness-off",
        _ => "",
    };
    let stop = Arc::new(Stop::new());
    let forward = {
        let (interrupt, stop) = (input.interrupt.clone(), stop.clone());
        tokio::spawn(async move {
            interrupt.triggered().await;
            stop.trigger(&interrupt.reason().unwrap_or_else(|| "interrupted".into()));
        })
    };
    // The monitor run stores its results in a fresh SQLite database; the chain keeps a plain
    // semaphore for its database permits.
    let results_path = input.out_dir.join(format!("results{suffix}.sqlite"));
    let world = Arc::new(
        World::new(
            input.catalog,
            input.plan,
            input.settings.clone(),
            (strategy == Strategy::Monitor).then_some(results_path.as_path()),
            stop.clone(),
            input.cells.clone(),
            input.provider_url.as_deref(),
        )
        .await?,
    );
    let started = std::time::Instant::now();
    let mut jobs = JoinSet::new();

    let setup = match strategy {
        Strategy::Monitor => {
            let events_path = input.out_dir.join(format!("events{suffix}.jsonl"));
            let metrics = input.metrics.clone().map(|sink| sink as Arc<dyn EventSink>);
            let sinks = Sinks::create(&events_path, metrics)?;
            let clock: Arc<dyn Timer> = world.clock.clone();
            let mut builder = Monitor::builder().clock(clock).sink(sinks.fanout.clone());
            if let (Some(fair), Some(Mode::On)) = (input.fair, mode) {
                if let Some(shares) = &fair.shares {
                    builder = builder.fair_shares(shares.clone());
                }
                if let Some(levels) = &fair.levels {
                    builder = builder.levels(levels.clone());
                }
            }
            let monitor = builder.build();
            monitor.start().context("starting the monitor")?;
            let mut contexts = Vec::with_capacity(input.plan.len());
            for job in input.plan {
                let mut ctx = JobContext::new(job.name.clone()).with_workflow("agents");
                if let Some(fair) = input.fair {
                    ctx = fair.context(ctx, job);
                }
                contexts.push(ctx.clone());
                let (world, monitor, job) = (world.clone(), monitor.clone(), job.clone());
                if job.blocking {
                    jobs.spawn_blocking(move || fleet::run_job_blocking(world, monitor, job, ctx));
                } else {
                    jobs.spawn(fleet::run_job(world, monitor, job, ctx));
                }
            }
            Setup::Monitor {
                monitor,
                sinks,
                events_path,
                contexts,
            }
        }
        Strategy::HoldAndWait => {
            let chain = Arc::new(Chain::new(&world));
            for job in input.plan {
                jobs.spawn(chain::run_job(world.clone(), chain.clone(), job.clone()));
            }
            Setup::Chain(chain)
        }
    };

    let probes = probes(&world, &setup)?;
    let sampler = {
        let world = world.clone();
        let label = strategy.name();
        tokio::spawn(async move { sample(world, probes, label).await })
    };

    // Wait for every job, however the run ends.
    let deadline = tokio::time::sleep(input.run_timeout);
    tokio::pin!(deadline);
    let mut grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut interrupted: Option<String> = None;
    loop {
        tokio::select! {
            joined = jobs.join_next() => match joined {
                None => break,
                Some(Err(error)) if error.is_panic() => {
                    world.metrics.job_ended(
                        "",
                        &crate::stats::JobOutcome::Failed(format!("a job panicked: {error}")),
                        world.now(),
                    );
                }
                Some(_) => {}
            },
            () = stop.triggered(), if interrupted.is_none() => {
                interrupted = Some(stop.reason().unwrap_or_else(|| "stopped".into()));
                // Withdraw every waiter at once; calls in progress finish and release.
                if let Setup::Monitor { contexts, .. } = &setup {
                    for ctx in contexts {
                        ctx.cancel();
                    }
                }
                grace = Some(Box::pin(tokio::time::sleep(GRACE)));
            }
            () = &mut deadline, if interrupted.is_none() => {
                stop.trigger(&format!(
                    "the run took longer than --run-timeout ({} s real)",
                    input.run_timeout.as_secs()
                ));
            }
            () = async {
                match grace.as_mut() {
                    Some(sleep) => sleep.await,
                    None => std::future::pending().await,
                }
            } => {
                grace = None;
                if let Setup::Monitor { monitor, .. } = &setup {
                    monitor.stop();
                }
                jobs.abort_all();
            }
        }
    }
    let real_seconds = started.elapsed().as_secs_f64();
    let simulated_seconds = world.now().as_secs_f64();
    world.stop.trigger("the run is over");
    let mut timeline = sampler.await.context("the sampler task failed")?;
    forward.abort();

    let mut leaks = Vec::new();
    let mut files = Vec::new();
    let mut events = None;
    if let Setup::Monitor {
        monitor,
        sinks,
        events_path,
        ..
    } = &setup
    {
        let parked = monitor.queue_size();
        if parked > 0 {
            leaks.push(format!("{parked} waiters still parked after the run"));
        }
        monitor.stop();
        sinks
            .file
            .flush()
            .with_context(|| format!("writing {}", events_path.display()))?;
        files.push(events_path.display().to_string());
        events = Some(sinks.tally.counts());
    }
    let fair = input.fair.map(|config| {
        fairness::report(
            config,
            mode,
            &world.metrics.records(),
            &world.registry.models(),
            simulated_seconds,
        )
    });
    if let Some(report) = fair.as_ref().filter(|r| !r.tenants.is_empty()) {
        timeline.shares = Some(report.panel());
    }
    let svg = input
        .out_dir
        .join(format!("timeline-{}{suffix}.svg", strategy.name()));
    timeline.draw_svg(
        &svg,
        &format!(
            "{} agents, {} strategy{}: occupancy, line, throttle{}",
            input.plan.len(),
            strategy.name(),
            mode.map_or_else(String::new, |m| format!(", fairness {}", m.name())),
            if timeline.shares.is_some() {
                ", tenants' shares"
            } else {
                ""
            }
        ),
    )?;
    files.push(svg.display().to_string());

    let after = permits_in_use(&world, &setup);
    let results = match &world.results {
        Some(results) => {
            // Read before counting: the count checks a host connection out for a moment.
            let checked_out = results.checked_out();
            files.push(results.path().display().to_string());
            Some(ResultsReading {
                path: results.path().display().to_string(),
                rows: results.count()?,
                stored: world.metrics.results_stored.load(Ordering::Acquire),
                checked_out,
            })
        }
        None => None,
    };
    // What the provider saw (the fleet's, in a fleet member: every member's calls). A member
    // whose parent is gone has no provider left to ask, and still reports what it counted.
    let upstream = match world.upstream.stats().await {
        Ok(stats) => stats,
        Err(error) => {
            crate::say(&format!(
                "the provider's counts could not be read ({error:#}): the model table's upstream columns are empty"
            ));
            BTreeMap::new()
        }
    };
    let mut summary = summarize(
        strategy,
        &world,
        &upstream,
        input,
        &timeline,
        &after,
        events,
        leaks,
        files,
        (real_seconds, simulated_seconds),
        interrupted,
    );
    summary.results = results;
    summary.fairness = fair;
    Ok(summary)
}

/// Samples until the world's stop is triggered (the run is over, or was stopped), driving the
/// progress display; answers the timeline.
async fn sample(world: Arc<World>, probes: Probes, label: &str) -> Timeline {
    let mut timeline = probes.timeline();
    let mut progress = Progress::new(label, world.metrics.jobs_total);
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let stopped = tokio::select! {
            _ = tick.tick() => false,
            () = world.stop.triggered() => true,
        };
        let sample = probes.sample(world.now().as_secs_f64());
        let done = world.metrics.jobs_done.load(Ordering::Acquire);
        progress.update(&timeline, &sample, done);
        timeline.samples.push(sample);
        if stopped {
            break;
        }
    }
    progress.finish();
    timeline
}

/// The limits to sample under each strategy. Both read the same buckets, windows and search
/// window; the permit limits are the monitor's accounts or the chain's semaphores.
fn probes(world: &Arc<World>, setup: &Setup) -> anyhow::Result<Probes> {
    let mut accounts = Vec::new();
    let models = world.registry.models();
    match setup {
        Setup::Monitor { .. } => {
            let http = world.registry.http();
            let cap = http.capacity();
            accounts.push(Probe {
                name: HTTP.into(),
                unit: "connections",
                in_use: Box::new(move || http.in_use()),
                capacity: Box::new(move || cap),
            });
            if let Some(results) = &world.results {
                let db = results.gate().clone();
                let cap = db.capacity();
                accounts.push(Probe {
                    name: DB.into(),
                    unit: "connections",
                    in_use: Box::new(move || db.in_use()),
                    capacity: Box::new(move || cap),
                });
            }
            for model in &models {
                if let Ok(gate) = world.registry.gate(model) {
                    let cap = gate.capacity();
                    accounts.push(Probe {
                        name: gate.name().to_owned(),
                        unit: "calls in flight",
                        in_use: Box::new(move || gate.in_use()),
                        capacity: Box::new(move || cap),
                    });
                }
            }
        }
        Setup::Chain(chain) => {
            let semaphore_probe = |name: String,
                                   semaphore: Arc<tokio::sync::Semaphore>,
                                   cap: u64,
                                   unit: &'static str| Probe {
                name,
                unit,
                in_use: Box::new(move || cap.saturating_sub(semaphore.available_permits() as u64)),
                capacity: Box::new(move || cap),
            };
            accounts.push(semaphore_probe(
                HTTP.into(),
                chain.http.clone(),
                world.settings.http_connections,
                "connections",
            ));
            accounts.push(semaphore_probe(
                DB.into(),
                chain.db.clone(),
                world.settings.db_connections,
                "connections",
            ));
            for (model, semaphore) in &chain.gates {
                let cap = world
                    .registry
                    .spec(model)
                    .ok()
                    .and_then(|s| s.max_concurrent)
                    .unwrap_or(0);
                accounts.push(semaphore_probe(
                    format!("{model}:concurrency"),
                    semaphore.clone(),
                    cap,
                    "calls in flight",
                ));
            }
        }
    }
    let mut throttles: Vec<(String, crate::timeline::ReadThrottle)> = Vec::new();
    for model in &models {
        let bucket = world
            .registry
            .bucket(model)
            .with_context(|| format!("the bucket of {model}"))?;
        let (level, budget) = (bucket.clone(), bucket.clone());
        accounts.push(Probe {
            name: model.clone(),
            unit: "tokens spent",
            in_use: Box::new(move || {
                budget
                    .config()
                    .tokens_per_minute
                    .saturating_sub(level.level())
            }),
            capacity: Box::new({
                let bucket = bucket.clone();
                move || bucket.config().tokens_per_minute
            }),
        });
        throttles.push((model.clone(), Box::new(move || bucket.throttle())));
        if let Ok(Some(window)) = world.registry.window(model) {
            let cap = window.config().max_requests;
            accounts.push(Probe {
                name: window.name().to_owned(),
                unit: "calls in window",
                in_use: Box::new(move || window.in_use()),
                capacity: Box::new(move || cap),
            });
        }
    }
    let search = world.search.clone();
    let cap = search.limit();
    accounts.push(Probe {
        name: SEARCH.into(),
        unit: "calls in window",
        in_use: Box::new(move || search.snapshot().used),
        capacity: Box::new(move || cap),
    });
    let (line, holding): (crate::timeline::Read, crate::timeline::Read) = match setup {
        Setup::Monitor { monitor, .. } => {
            let monitor = monitor.clone();
            (
                Box::new(move || monitor.queue_size() as u64),
                Box::new(|| 0),
            )
        }
        Setup::Chain(chain) => {
            let (a, b) = (chain.clone(), chain.clone());
            (
                Box::new(move || a.acquiring.load(Ordering::Acquire)),
                Box::new(move || b.holding_while_waiting.load(Ordering::Acquire)),
            )
        }
    };
    Ok(Probes {
        accounts,
        line,
        holding_while_waiting: holding,
        throttles,
    })
}

/// Permits still out once every job ended, per permit limit: anything but zero is a leak.
fn permits_in_use(world: &World, setup: &Setup) -> BTreeMap<String, u64> {
    let mut after = BTreeMap::new();
    match setup {
        Setup::Monitor { .. } => {
            after.insert(HTTP.to_owned(), world.registry.http().in_use());
            if let Some(results) = &world.results {
                after.insert(DB.to_owned(), results.gate().in_use());
            }
            for model in world.registry.models() {
                if let Ok(gate) = world.registry.gate(&model) {
                    after.insert(gate.name().to_owned(), gate.in_use());
                }
            }
        }
        Setup::Chain(chain) => {
            let out = |s: &tokio::sync::Semaphore, cap: u64| {
                cap.saturating_sub(s.available_permits() as u64)
            };
            after.insert(
                HTTP.to_owned(),
                out(&chain.http, world.settings.http_connections),
            );
            after.insert(DB.to_owned(), out(&chain.db, world.settings.db_connections));
            for (model, semaphore) in &chain.gates {
                let cap = world
                    .registry
                    .spec(model)
                    .ok()
                    .and_then(|s| s.max_concurrent)
                    .unwrap_or(0);
                after.insert(format!("{model}:concurrency"), out(semaphore, cap));
            }
        }
    }
    after
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    strategy: Strategy,
    world: &World,
    upstream: &BTreeMap<String, crate::provider_sim::UpstreamStats>,
    input: &Input<'_>,
    timeline: &Timeline,
    after: &BTreeMap<String, u64>,
    events: Option<crate::events::Counts>,
    leaks: Vec<String>,
    files: Vec<String>,
    (real_seconds, simulated_seconds): (f64, f64),
    interrupted: Option<String>,
) -> RunSummary {
    let metrics = &world.metrics;
    let exact: BTreeMap<String, u64> = metrics
        .gauges
        .iter()
        .map(|g| (g.name.clone(), g.peak()))
        .collect();
    let catalog_tpm: BTreeMap<String, u64> = input
        .catalog
        .models
        .iter()
        .map(|m| (m.id.clone(), m.tokens_per_minute))
        .collect();
    let tallies: BTreeMap<String, ModelTallyReading> = metrics
        .models
        .iter()
        .map(|(model, t)| {
            let reading = ModelTallyReading {
                calls_ok: t.calls_ok.load(Ordering::Relaxed),
                rate_limited: t.rate_limited.load(Ordering::Relaxed),
                overloaded: t.overloaded.load(Ordering::Relaxed),
                circuit_refusals: t.circuit_refusals.load(Ordering::Relaxed),
                jobs_done: t.jobs_done.load(Ordering::Relaxed),
                last_job_done_s: Duration::from_nanos(t.last_job_done.load(Ordering::Relaxed))
                    .as_secs_f64(),
            };
            (model.clone(), reading)
        })
        .collect();
    // Held time runs from the connection's grant to its release, so it includes any time the
    // step held it while still waiting for another limit (the idle part).
    let total_http = metrics.http_held_ns.load(Ordering::Relaxed) as f64;
    let idle = metrics.http_idle_ns.load(Ordering::Relaxed) as f64;
    RunSummary {
        strategy: strategy.name(),
        jobs: metrics.jobs_total,
        blocking_jobs: match strategy {
            Strategy::Monitor => input.plan.iter().filter(|j| j.blocking).count() as u64,
            Strategy::HoldAndWait => 0,
        },
        seed: world.settings.seed,
        time_scale: world.settings.time_scale,
        real_seconds,
        simulated_seconds,
        interrupted,
        outcomes: metrics.outcomes(),
        grants: metrics.grants.load(Ordering::Relaxed),
        retries: metrics.retries.load(Ordering::Relaxed),
        limits: report::limit_rows(&timeline.peaks(), &exact, after),
        waits: report::wait_rows(&metrics.waits()),
        models: report::model_rows(&catalog_tpm, upstream, &tallies, &timeline.throttle_peaks()),
        events,
        http_connection_minutes: total_http / 60e9,
        http_idle_share: if total_http > 0.0 {
            idle / total_http
        } else {
            0.0
        },
        tokens_stranded: metrics.tokens_stranded.load(Ordering::Relaxed),
        longest_line: timeline.longest_line(),
        leaks,
        results: None,
        spend: report::SpendReading {
            workflows: metrics.jobs_total,
            cap_each: world.settings.budget,
            spent: Money::from_micros(metrics.spent_micros.load(Ordering::Relaxed)),
            most_spent: Money::from_micros(metrics.most_spent_micros.load(Ordering::Relaxed)),
            refused_for_money: metrics.refused_for_money.load(Ordering::Relaxed),
        },
        failures: metrics.failures(),
        files,
        fairness: None,
    }
}
