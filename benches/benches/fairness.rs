//! Issue 39's goal rows, in arrival order (the monitor's default), in fair shares
//! (`MonitorBuilder::fair_shares`) and with priority levels (`MonitorBuilder::levels`), side by
//! side. The simulated rows run on a fake clock (`admission_benches::fairness`), so their
//! figures are exact and the same on any machine; the last rows time the uncontended admit (a
//! plain job, a job with a tenant, with a tenant under fair shares, with a tenant and a level
//! under fair shares and three levels, with or without a reserve) and a pass over a long line.
//!
//! ```text
//! cargo bench -p admission-benches --bench fairness
//! ```
//!
//! Prints each row and writes `target/side-by-side/fairness.json`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_accounts::counting_gate::CountingGate;
use admission_benches::Results;
use admission_benches::fairness::{
    backlogged, big_head, interactive_waits, jain, lower_level_share, quantile, tokens_per_minute,
};
use admission_core::{Amount, Demand, FairShares, JobContext, Level, Levels, Monitor};
use admission_testkit::monitor::poll_once;

/// Minutes each backlogged run lasts; the first minute (the full bucket's burst) is left out.
const MINUTES: u32 = 21;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let started = Instant::now();
    let mut results = Results::new("fairness");
    for (mode, fair) in [("arrival", false), ("fair", true)] {
        println!("== {mode} order");
        results = simulated(results, mode, fair);
    }
    println!("== levels");
    results = levels(results);
    results = lower_share(results);

    // The uncontended admit: a plain job and monitor, a job with a tenant, and a job with a
    // tenant on a monitor in fair shares.
    let [plain, tenant, fair, leveled, reserving] = uncontended();
    println!(
        "uncontended try_admit + release: {plain:.1} ns plain, {tenant:.1} ns with a tenant, {fair:.1} ns with a tenant under fair shares ({:.2}x), {leveled:.1} ns with a tenant and a level under fair shares and 3 levels ({:.2}x), {reserving:.1} ns when a level reserves ({:.2}x)",
        fair / plain,
        leveled / plain,
        reserving / plain
    );
    results = results
        .number("uncontended_plain_ns", plain)
        .number("uncontended_with_tenant_ns", tenant)
        .number("uncontended_fair_ns", fair)
        .number("uncontended_levels_ns", leveled)
        .number("uncontended_levels_reserving_ns", reserving);

    // The pass over 10,000 parked (one gate each, 100 tenants; 3 levels in the last two modes,
    // the jobs taking them in turn, or a third of the jobs each, one level after the other), and
    // what parking costs: in tenant round-robin, and a new tenant's job behind one tenant's
    // backlog of 10,000.
    // The lines are built first and their passes timed in turn, 21 rounds, so that a slow spell
    // of the machine falls on every mode alike.
    let modes = [
        ("arrival", false, None),
        ("fair", true, None),
        ("levels", true, Some(Assign::InTurn)),
        ("levels_in_blocks", true, Some(Assign::InBlocks)),
    ];
    let lines: Vec<LongLine> = modes
        .iter()
        .map(|&(_, fair, leveled)| long_line(fair, leveled))
        .collect();
    let mut passes = vec![Vec::new(); lines.len()];
    for _ in 0..21 {
        for (line, times) in lines.iter().zip(&mut passes) {
            let started = Instant::now();
            black_box(line.monitor.pass_now());
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    for (((mode, ..), line), times) in modes.iter().zip(&lines).zip(&mut passes) {
        assert_eq!(line.monitor.queue_size(), line.parked.len());
        let pass_us = median(times);
        println!(
            "{mode}: pass over 10,000 parked (100 tenants) {pass_us:.1} us; parking one of them {:.0} ns (round-robin), a new tenant's job behind a backlog of 10,000 {:.0} ns",
            line.park_round_robin_ns, line.park_behind_backlog_ns
        );
        results = results
            .number(&format!("{mode}_pass_10k_us"), pass_us)
            .number(
                &format!("{mode}_park_round_robin_ns"),
                line.park_round_robin_ns,
            )
            .number(
                &format!("{mode}_park_behind_backlog_ns"),
                line.park_behind_backlog_ns,
            );
    }

    let path = results.write().expect("the results file is written");
    println!(
        "fairness: done in {:.1} s, written to {}",
        started.elapsed().as_secs_f64(),
        path.display()
    );
}

/// The simulated rows, in arrival order or in fair shares (`<mode>_` before each key).
fn simulated(mut results: Results, mode: &str, fair: bool) -> Results {
    let weights = |w: &'static [u32]| fair.then_some(w);
    let key = |name: &str| format!("{mode}_{name}");

    // Two backlogged tenants of weight 1:1, one keeping ten times the other's backlog.
    let served = backlogged([100, 10], 1_000, MINUTES, weights(&[1, 1]));
    let minutes = tokens_per_minute(&served, 2, 1, u64::from(MINUTES));
    let per_minute: Vec<f64> = minutes.iter().map(|m| jain(m)).collect();
    let totals: Vec<f64> = (0..2).map(|t| minutes.iter().map(|m| m[t]).sum()).collect();
    let (mean, min) = mean_min(&per_minute);
    println!(
        "1:1, backlogs 100:10: Jain per minute mean {mean:.3}, min {min:.3}; of the {} minutes' totals {:.3} ({} : {} tokens)",
        minutes.len(),
        jain(&totals),
        totals[0],
        totals[1]
    );
    results = results
        .number(&key("one_to_one_jain_per_minute_mean"), mean)
        .number(&key("one_to_one_jain_per_minute_min"), min)
        .number(&key("one_to_one_jain_of_totals"), jain(&totals));

    // Weights 3:1, equal backlogs: the heavier tenant's share of each minute.
    let served = backlogged([50, 50], 1_000, MINUTES, weights(&[3, 1]));
    let minutes = tokens_per_minute(&served, 2, 1, u64::from(MINUTES));
    let shares: Vec<f64> = minutes.iter().map(|m| m[0] / (m[0] + m[1])).collect();
    let (mean, min) = mean_min(&shares);
    let max = shares.iter().copied().fold(f64::MIN, f64::max);
    println!(
        "3:1, backlogs 50:50: heavier tenant's share per minute mean {mean:.3}, min {min:.3}, max {max:.3}"
    );
    results = results
        .number(&key("three_to_one_share_mean"), mean)
        .number(&key("three_to_one_share_min"), min)
        .number(&key("three_to_one_share_max"), max);

    // An interactive tenant (500 tokens every 2 s; weight 100 under fair shares) with and
    // without a batch flood of 1,000 jobs.
    let job = (500, Duration::from_secs(2));
    let alone = quantile(
        &interactive_waits(0, 1_000, job, 5, 5, weights(&[1, 100]), None),
        0.99,
    );
    let flooded = quantile(
        &interactive_waits(1_000, 1_000, job, 5, 40, weights(&[1, 100]), None),
        0.99,
    );
    println!(
        "interactive p99 wait: {:.1} s alone, {:.1} s behind a flood of 1,000 batch jobs",
        alone.as_secs_f64(),
        flooded.as_secs_f64()
    );
    results = results
        .number(&key("interactive_p99_alone_s"), alone.as_secs_f64())
        .number(&key("interactive_p99_flooded_s"), flooded.as_secs_f64());

    // A head of 10x the median among 1,000 small backfillers of ten other tenants.
    let (waited, backfilled) = big_head(10_000, 1_000, 1_000, weights(&[1; 11]));
    println!(
        "big head (10,000 tokens) among 1,000 backfillers of 1,000: waited {:.1} s, {backfilled} granted before it",
        waited.as_secs_f64()
    );
    results
        .number(&key("big_head_wait_s"), waited.as_secs_f64())
        .number(&key("big_head_backfilled_before"), backfilled as f64)
}

/// The interactive rows with levels: the interactive tenant at a level of its own above the
/// batch tenant's, reserving 1,000 tokens of the model (two of its jobs), then reserving
/// nothing (strict priority alone); both tenants of weight 1 under fair shares.
fn levels(mut results: Results) -> Results {
    let job = (500, Duration::from_secs(2));
    for (name, reserve) in [("levels_reserve", 1_000), ("levels_strict", 0)] {
        let waits = |flood, minutes| {
            let waits =
                interactive_waits(flood, 1_000, job, 5, minutes, Some(&[1, 1]), Some(reserve));
            quantile(&waits, 0.99)
        };
        let (alone, flooded) = (waits(0, 5), waits(1_000, 40));
        println!(
            "{name}: interactive p99 wait {:.1} s alone, {:.1} s behind a flood of 1,000 batch jobs",
            alone.as_secs_f64(),
            flooded.as_secs_f64()
        );
        results = results
            .number(
                &format!("{name}_interactive_p99_alone_s"),
                alone.as_secs_f64(),
            )
            .number(
                &format!("{name}_interactive_p99_flooded_s"),
                flooded.as_secs_f64(),
            );
    }
    results
}

/// A lower level's share of a model beside a higher level's backlog: the interactive level keeps
/// 5 jobs of 2,000 tokens waiting, the batch level below it 5 of 500 and reserves a fifth of the
/// model's 60,000 a minute (12,000 tokens), then nothing; the batch level's share of the tokens
/// served in minutes 1 to 20 (the first, the full bucket's burst, left out).
fn lower_share(mut results: Results) -> Results {
    for (name, reserve) in [
        ("batch_reserving_a_fifth", 12_000),
        ("batch_reserving_none", 0),
    ] {
        let served = lower_level_share(reserve, (2_000, 500), 5, MINUTES);
        let minutes = tokens_per_minute(&served, 2, 1, u64::from(MINUTES));
        let shares: Vec<f64> = minutes.iter().map(|m| m[1] / (m[0] + m[1])).collect();
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        let least = shares.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{name}: the batch level's share of the model beside an interactive backlog {mean:.3} \
             (least minute {least:.3})"
        );
        results = results
            .number(&format!("{name}_share"), mean)
            .number(&format!("{name}_least_minute"), least);
    }
    results
}

/// Three levels, none reserving.
fn three_levels() -> Levels {
    ["high", "mid", "low"]
        .into_iter()
        .try_fold(Levels::new(), |levels, name| levels.level(Level::new(name)))
        .expect("valid levels")
}

/// How the jobs of a long line take the three levels.
#[derive(Clone, Copy)]
enum Assign {
    /// In turn: job `i` at level `i % 3` (the line's order is then not the order of its slots).
    InTurn,
    /// In blocks: the first third at the first level, and so on (the line's order is its slots').
    InBlocks,
}

/// A long line, to time a pass over, and what parking in it cost.
struct LongLine {
    /// The monitor whose line holds the 10,000 waiters of 100 tenants (the one permit held).
    monitor: Monitor,
    parked: Vec<admission_core::Admit>,
    _holder: admission_core::Grant,
    park_round_robin_ns: f64,
    park_behind_backlog_ns: f64,
}

/// A monitor with manual passes and one permit, held: 10,000 waiters of 100 tenants parked in
/// round-robin (timed) and kept, then on another monitor a line of 10,000 of one tenant and
/// 1,000 jobs of 1,000 new tenants parked behind it (timed). With `leveled`, three levels, the
/// jobs taking them as it says.
fn long_line(fair: bool, leveled: Option<Assign>) -> LongLine {
    const PARKED: usize = 10_000;
    let monitor = || {
        let mut builder = Monitor::builder().manual_passes();
        if fair {
            builder = builder.fair_shares(FairShares::new());
        }
        if leveled.is_some() {
            builder = builder.levels(three_levels());
        }
        builder.build()
    };
    let next_level = std::cell::Cell::new(0);
    let park = |monitor: &Monitor, gate: &Arc<CountingGate>, tenant: String| {
        let mut job = JobContext::new("job").with_tenant(tenant);
        if let Some(assign) = leveled {
            let n = next_level.replace(next_level.get() + 1);
            let level = match assign {
                Assign::InTurn => n % 3,
                Assign::InBlocks => (n * 3 / PARKED).min(2),
            };
            job = job.with_level(["high", "mid", "low"][level]);
        }
        let mut admit = monitor.admit(Demand::new().with(gate.clone(), Amount::ONE), &job, None);
        assert!(poll_once(&mut admit).is_none(), "a waiter parks");
        admit
    };
    let gate_of = |monitor: &Monitor| {
        Arc::new(CountingGate::http(1, monitor.clock().clone()).expect("a valid gate"))
    };

    let round_robin = monitor();
    let gate = gate_of(&round_robin);
    let held = Demand::new().with(gate.clone(), Amount::ONE);
    let holder_job = JobContext::new("holder");
    let holder = round_robin
        .try_admit(&held, &holder_job)
        .expect("free")
        .into_owned();
    let started = Instant::now();
    let round_robin_parked: Vec<_> = (0..PARKED)
        .map(|i| park(&round_robin, &gate, format!("tenant-{}", i % 100)))
        .collect();
    let park_round_robin_ns = started.elapsed().as_nanos() as f64 / PARKED as f64;
    round_robin.pass_now();
    assert_eq!(round_robin.queue_size(), PARKED);

    let backlog = monitor();
    let gate = gate_of(&backlog);
    let held = Demand::new().with(gate.clone(), Amount::ONE);
    let _holder = backlog.try_admit(&held, &holder_job).expect("free");
    let mut parked: Vec<_> = (0..PARKED)
        .map(|_| park(&backlog, &gate, "heavy".to_owned()))
        .collect();
    let started = Instant::now();
    parked.extend((0..1_000).map(|i| park(&backlog, &gate, format!("light-{i}"))));
    let park_behind_backlog_ns = started.elapsed().as_nanos() as f64 / 1_000.0;
    assert_eq!(backlog.queue_size(), PARKED + 1_000);
    LongLine {
        monitor: round_robin,
        parked: round_robin_parked,
        _holder: holder,
        park_round_robin_ns,
        park_behind_backlog_ns,
    }
}

fn mean_min(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (mean, min)
}

/// Median nanoseconds of `try_admit` + release on one gate: a plain job on a plain monitor, a
/// job with a tenant, a job with a tenant on a monitor in fair shares, a job with a tenant and
/// a level on a monitor in fair shares with three levels, and the same when a level reserves
/// part of another account; alternating runs of 1,000,000 each.
fn uncontended() -> [f64; 5] {
    const OPS: u32 = 1_000_000;
    let plain = Monitor::new();
    let shares = FairShares::new()
        .weight("tenant-0", 3)
        .expect("a valid weight");
    let fair = Monitor::builder().fair_shares(shares.clone()).build();
    let leveled = Monitor::builder()
        .fair_shares(shares.clone())
        .levels(three_levels())
        .build();
    let reserving_levels = three_levels()
        .level(Level::new("reserving").reserve("elsewhere", Amount::ONE))
        .expect("a valid level");
    let reserving = Monitor::builder()
        .fair_shares(shares)
        .levels(reserving_levels)
        .build();
    let demand = |monitor: &Monitor| {
        let gate = CountingGate::http(1_000, monitor.clock().clone()).expect("a valid gate");
        Demand::new().with(Arc::new(gate), Amount::ONE)
    };
    let (plain_demand, fair_demand) = (demand(&plain), demand(&fair));
    let (leveled_demand, reserving_demand) = (demand(&leveled), demand(&reserving));
    let tenant = JobContext::new("job").with_tenant("tenant-0");
    let leveled_job = tenant.clone().with_level("mid");
    let job = JobContext::new("job");
    let run = |monitor: &Monitor, demand: &Demand, job: &JobContext| {
        let started = Instant::now();
        for _ in 0..OPS {
            drop(black_box(monitor.try_admit(demand, job).expect("room")));
        }
        started.elapsed().as_nanos() as f64 / f64::from(OPS)
    };
    let mut runs = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..7 {
        runs[0].push(run(&plain, &plain_demand, &job));
        runs[1].push(run(&plain, &plain_demand, &tenant));
        runs[2].push(run(&fair, &fair_demand, &tenant));
        runs[3].push(run(&leveled, &leveled_demand, &leveled_job));
        runs[4].push(run(&reserving, &reserving_demand, &leveled_job));
    }
    runs.map(|mut r| median(&mut r))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
