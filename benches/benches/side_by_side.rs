//! Criterion benches of admission next to the crate a user would reach for instead, in one run.
//!
//! Each group holds our code and its peer, so every figure reads as a ratio of two medians taken
//! minutes apart on the same machine. "Ours" is always the production account families of
//! `admission-accounts` (`CountingGate`, `TokenBucket`), never the test-kit's reference accounts.
//!
//! - `single_limit` (issue 5, item 1): one take from a token bucket that never runs dry, on the
//!   system clock. Ours is a taking `Account::ask` on a `TokenBucket` (tokens and one request
//!   in one step, one answer); the peers are governor's `check` / `check_n` and leaky-bucket's
//!   `try_acquire`. This is the floor any rate limit costs. The elastic window's take of one
//!   request (`ours_elastic_window_take_1`) is judged against governor's `check` too.
//! - `semaphore` (item 2): admit and release one permit of a `CountingGate` through the monitor,
//!   against tokio's `Semaphore::try_acquire_many` and a drop: `admit_blocking` (an owned
//!   `Grant`, the demand cloned in) and `try_admit` (a `BorrowedGrant` of a prebuilt demand,
//!   as tokio's `try_acquire` returns a permit that borrows its semaphore). The owned grant is
//!   also set beside tokio's owned permit (`try_acquire_many_owned` on a clone of an
//!   `Arc<Semaphore>`, as our `Grant` holds a handle to its monitor).
//! - `semaphore_contended` (item 2), a part of its own rather than a criterion group: 64 tasks
//!   on a two-worker tokio runtime, each acquiring and releasing 10,000 times a gate of 8
//!   permits. Each task holds its permit across one `yield_now`, as a real job holds it across
//!   its call: without an await point inside, two workers could never hold more than two of the
//!   eight permits and nobody would ever wait. That variant (`_no_await_inside`) runs too: it
//!   measures the two acquisition paths fought over by two threads, with no waiting. Ten runs of
//!   each side, ours and tokio's alternating, each measured whole: wall time, the process's CPU
//!   time (user + system, every thread) and its context switches ([`Usage`]). The medians and
//!   minima go to `target/side-by-side/semaphore_contended.json`. A run of one side alone is
//!   comparable to the other's only when the machine did not change between them, which
//!   interleaving makes likely and two criterion groups minutes apart did not.
//! - `three_limits` (item 3): one admit over an HTTP gate, a token bucket and a database gate,
//!   against the chain written by hand today (tokio semaphore, governor `check_n`, tokio
//!   semaphore), with `admit_blocking` (demand cloned or built per call) and `try_admit` (the
//!   prebuilt demand borrowed). The quota that chain leaks when its last limit refuses is counted by the
//!   `scarce_and_wakes` harness, not timed here.
//! - `pass_over_10k_parked` (item 6): one evaluator pass (`Monitor::pass_now`) over 10,000
//!   parked waiters that all stay parked, with a "floor" that asks the same accounts the same
//!   questions with no monitor.
//!
//! `cargo xtask bench` reads the medians from `target/criterion/<group>/<bench>/new/` and
//! `target/side-by-side/`, and writes the table in BENCHMARKS.md. The contended part reads
//! criterion's command line as criterion does: a filter (a regex, or `--exact`) that matches
//! none of its names (`semaphore_contended/ours_64_tasks_capacity_8` and the like) skips it;
//! without `--bench` (`cargo test --benches`) it makes one short run of each side and writes
//! nothing; `ADMISSION_CONTENDED_RUNS=N` sets its runs per side (10).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
use admission_accounts::token_bucket::TokenBucketConfig;
use admission_accounts::{CountingGate, TokenBucket};
use admission_benches::Results;
use admission_benches::support::{self, ParkedLine, admit_release, try_admit_release};
use admission_benches::usage::Usage;
use admission_core::{AccountRef, Amount, Ask, Demand, JobContext, Monitor, SystemClock};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use criterion::{Criterion, criterion_group};
use governor::DefaultDirectRateLimiter;
use tokio::sync::Semaphore;

/// A per-minute budget no bench can spend: tokens and requests alike.
const NEVER_DRY: u64 = u64::MAX / 4;
/// Tokens asked by the "n tokens" cases (a small model call's worth is thousands; the cost of a
/// take does not depend on n on either side).
const TOKENS: u64 = 100;
/// Permits on the gates nobody competes for.
const PLENTY: u64 = 1_000_000;
/// Takes between two fresh governor limiters in the `check_n` cases (see [`governor_chunks`]).
const REFRESH: u64 = 1_000_000;
/// Contended: tasks, rounds per task, permits, runs of each side.
const TASKS: usize = 64;
const ROUNDS: usize = 10_000;
const CONTENDED_PERMITS: u64 = 8;
const CONTENDED_RUNS: usize = 10;
/// Waiters parked for the pass bench.
const PARKED: usize = 10_000;

const FREE: &str = "an uncontended demand is granted";

fn job() -> JobContext {
    JobContext::new("bench")
}

fn gate(name: &str, permits: u64) -> Arc<CountingGate> {
    // The monitors here run on the system clock, so the gates' stamps do too.
    Arc::new(CountingGate::on_system_clock(name, permits).expect("a positive capacity"))
}

/// A token bucket that never runs dry, on `monitor`'s clock.
fn bucket(monitor: &Monitor) -> Arc<TokenBucket> {
    let config = TokenBucketConfig::new(NEVER_DRY, NEVER_DRY);
    Arc::new(TokenBucket::new("model", config, monitor.clock().clone()).expect("a valid config"))
}

fn n_tokens() -> NonZeroU32 {
    NonZeroU32::new(TOKENS as u32).expect("non-zero")
}

/// Times `iters` runs of `op` against governor limiters made fresh every [`REFRESH`] runs (made
/// outside the timed part). A `check_n(100)` every ~10 ns would outrun the one-cell-a-nanosecond
/// refill and empty even a `u32::MAX` burst within a sample; a fresh limiter keeps every take a
/// success, as it is on our side.
fn governor_chunks(iters: u64, mut op: impl FnMut(&DefaultDirectRateLimiter)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(REFRESH);
        let limiter = support::governor_one_cell_per_ns();
        let started = Instant::now();
        for _ in 0..n {
            op(&limiter);
        }
        total += started.elapsed();
        left -= n;
    }
    total
}

/// A leaky-bucket limiter holding its maximum balance and refilling it every millisecond.
fn leaky() -> leaky_bucket::RateLimiter {
    leaky_bucket::RateLimiter::builder()
        .initial(usize::MAX)
        .max(usize::MAX)
        .refill(usize::MAX)
        .interval(Duration::from_millis(1))
        .build()
}

fn single_limit(c: &mut Criterion) {
    let ours = TokenBucket::on_system_clock("model", TokenBucketConfig::new(NEVER_DRY, NEVER_DRY))
        .expect("a valid config");
    let ours: AccountRef = Arc::new(ours);
    let one = Amount::pair(1, 1);
    let n = Amount::pair(TOKENS, 1);
    assert!(ours.ask(n, Ask::HEAD).is_taken());
    let peer = support::governor_one_cell_per_ns();
    let leaky = leaky();
    assert!(leaky.try_acquire(TOKENS as usize));

    let mut group = c.benchmark_group("single_limit");
    group.bench_function("ours_token_bucket_take_1", |b| {
        b.iter(|| black_box(ours.ask(black_box(one), Ask::HEAD).is_taken()))
    });
    group.bench_function("governor_check", |b| {
        b.iter(|| black_box(peer.check().is_ok()))
    });
    group.bench_function("leaky_bucket_try_acquire_1", |b| {
        b.iter(|| black_box(leaky.try_acquire(black_box(1))))
    });
    group.bench_function("ours_token_bucket_take_100", |b| {
        b.iter(|| black_box(ours.ask(black_box(n), Ask::HEAD).is_taken()))
    });
    group.bench_function("governor_check_n_100", |b| {
        b.iter_custom(|iters| {
            governor_chunks(iters, |limiter| {
                black_box(matches!(limiter.check_n(black_box(n_tokens())), Ok(Ok(()))));
            })
        })
    });
    group.bench_function("leaky_bucket_try_acquire_100", |b| {
        b.iter(|| black_box(leaky.try_acquire(black_box(TOKENS as usize))))
    });
    // The elastic window's take of one request, as the monitor makes it (through the trait
    // object, as the head). A one-millisecond window keeps the log of stamps short however many
    // iterations run (stamps older than the widest window are pruned), as in `elastic_window.rs`.
    let window: AccountRef = Arc::new(
        ElasticWindow::new(
            "model",
            ElasticWindowConfig::new(1 << 50, Duration::from_millis(1)),
            Arc::new(SystemClock::new()),
        )
        .expect("a valid config"),
    );
    group.bench_function("ours_elastic_window_take_1", |b| {
        b.iter(|| black_box(window.ask(black_box(Amount::ONE), Ask::HEAD).is_taken()))
    });
    group.finish();
}

fn semaphore(c: &mut Criterion) {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let demand = Demand::new().with(gate("gate", PLENTY), Amount::ONE);
    let peer = Semaphore::new(PLENTY as usize);
    let owned_peer = Arc::new(Semaphore::new(PLENTY as usize));
    let job = job();

    let mut group = c.benchmark_group("semaphore");
    group.bench_function("ours_admit_blocking_release", |b| {
        b.iter(|| admit_release(&monitor, demand.clone(), &job))
    });
    group.bench_function("ours_try_admit_release", |b| {
        b.iter(|| try_admit_release(&monitor, &demand, &job))
    });
    // The floor under both: the gate's own take and give, no monitor, through the trait object
    // as the monitor calls it (its last-activity stamp takes the system clock's coarse reading,
    // one atomic load, at the take and at the give); and the same on a fake clock that stands
    // still (whose coarse reading is its exact one, a lock-free load).
    let alone = &demand.entries()[0];
    group.bench_function("floor_gate_take_give", |b| {
        b.iter(|| support::take_give(&**alone.account(), Amount::ONE))
    });
    let still: AccountRef = Arc::new(
        CountingGate::new("gate", PLENTY, FakeClock::new().shared()).expect("a positive capacity"),
    );
    group.bench_function("floor_gate_take_give_frozen_clock", |b| {
        b.iter(|| support::take_give(&*still, Amount::ONE))
    });
    // The synchronization the monitor adds on an empty line (a fence and a load after the take
    // and after the give), and with it the reference counts an owned grant takes: what no
    // admit can go below without changing what a grant holds.
    let parked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    group.bench_function("floor_gate_take_give_fenced", |b| {
        b.iter(|| support::take_give_fenced(&**alone.account(), Amount::ONE, &parked))
    });
    group.bench_function("floor_owned_grant_take_give_fenced", |b| {
        b.iter(|| support::owned_take_give_fenced(&demand, &job, &parked, Amount::ONE))
    });
    group.bench_function("ours_admit_future_polled_once_release", |b| {
        b.iter(|| {
            // Pinned on the stack, as an `.await` pins it: no allocation.
            let mut admit = std::pin::pin!(monitor.admit(demand.clone(), &job, None));
            let grant = poll_once(&mut admit).expect("ready").expect(FREE);
            drop(black_box(grant));
        })
    });
    group.bench_function("tokio_try_acquire_many_release", |b| {
        b.iter(|| drop(black_box(peer.try_acquire_many(1).expect("plenty"))))
    });
    // The owned permit: a clone of the `Arc` taken in and dropped with it, as an owned `Grant`
    // takes and drops its handle to the monitor.
    group.bench_function("tokio_try_acquire_many_owned_release", |b| {
        b.iter(|| {
            let permit = owned_peer
                .clone()
                .try_acquire_many_owned(1)
                .expect("plenty");
            drop(black_box(permit));
        })
    });
    group.finish();
}

/// The three limits of a typical call on our side: HTTP gate, the model's bucket, DB gate.
struct Three {
    monitor: Monitor,
    http: AccountRef,
    tokens: AccountRef,
    db: AccountRef,
}

impl Three {
    fn new() -> Three {
        let monitor = Monitor::new();
        monitor.start().expect("a fresh monitor starts");
        let http = Arc::new(
            CountingGate::http(PLENTY, monitor.clock().clone()).expect("a positive capacity"),
        );
        Three {
            tokens: bucket(&monitor),
            http,
            db: gate("db", PLENTY),
            monitor,
        }
    }

    fn demand(&self) -> Demand {
        Demand::new()
            .with(self.http.clone(), Amount::ONE)
            .with(self.tokens.clone(), Amount::pair(TOKENS, 1))
            .with(self.db.clone(), Amount::ONE)
    }
}

fn three_limits(c: &mut Criterion) {
    let ours = Three::new();
    let prebuilt = ours.demand();
    let job = job();
    let http = Semaphore::new(PLENTY as usize);
    let db = Semaphore::new(PLENTY as usize);

    let mut group = c.benchmark_group("three_limits");
    group.bench_function("ours_cloned_demand", |b| {
        b.iter(|| admit_release(&ours.monitor, prebuilt.clone(), &job))
    });
    group.bench_function("ours_fresh_demand", |b| {
        b.iter(|| admit_release(&ours.monitor, ours.demand(), &job))
    });
    group.bench_function("ours_try_admit", |b| {
        b.iter(|| try_admit_release(&ours.monitor, &prebuilt, &job))
    });
    // The floor: the three accounts' own takes, and the gives a release makes (the bucket's
    // tokens are spent, not given back), no monitor.
    group.bench_function("floor_accounts_take_give", |b| {
        b.iter(|| {
            support::take(&*ours.http, Amount::ONE);
            support::take(&*ours.tokens, Amount::pair(TOKENS, 1));
            support::take(&*ours.db, Amount::ONE);
            ours.http.give(black_box(Amount::ONE));
            ours.db.give(black_box(Amount::ONE));
        })
    });
    group.bench_function("chain_tokio_governor_tokio", |b| {
        b.iter_custom(|iters| {
            governor_chunks(iters, |tokens| {
                let h = http.try_acquire().expect("plenty");
                let t = tokens.check_n(n_tokens());
                assert!(matches!(t, Ok(Ok(()))), "never empty");
                let d = db.try_acquire().expect("plenty");
                drop(black_box((h, d)));
            })
        })
    });
    group.finish();
}

/// `parked` waiters short on a one-permit gate. With `three`, each also names a plentiful HTTP
/// gate and a token bucket that never runs dry.
fn park_line(parked: usize, three: bool) -> ParkedLine {
    let mut accounts: Vec<(AccountRef, Amount)> = Vec::new();
    if three {
        let config = TokenBucketConfig::new(NEVER_DRY, NEVER_DRY);
        let tokens = TokenBucket::on_system_clock("model", config).expect("a valid config");
        accounts.push((gate("http", PLENTY), Amount::ONE));
        accounts.push((Arc::new(tokens), Amount::pair(TOKENS, 1)));
    }
    accounts.push((gate("scarce", 1), Amount::ONE));
    ParkedLine::new(parked, accounts)
}

fn pass_over_10k_parked(c: &mut Criterion) {
    let one = park_line(PARKED, false);
    let three = park_line(PARKED, true);
    let mut group = c.benchmark_group("pass_over_10k_parked");
    group.sample_size(30);
    for (name, line) in [("ours_one_gate", &one), ("ours_gate_bucket_gate", &three)] {
        group.bench_function(name, |b| b.iter(|| line.pass()));
        assert_eq!(line.len(), PARKED, "a pass grants nobody");
    }
    for (name, line) in [("floor_one_gate", &one), ("floor_gate_bucket_gate", &three)] {
        // The accounts' share of a pass: the same questions asked directly, 10,000 times, one
        // look per account behind a reservation.
        group.bench_function(name, |b| b.iter(|| line.ask_floor(PARKED)));
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .without_plots()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = single_limit, semaphore, three_limits, pass_over_10k_parked
}

fn main() {
    benches();
    contended::run();
    Criterion::default().configure_from_args().final_summary();
}

/// The contended semaphore: ours and tokio's interleaved, each run measured whole.
mod contended {
    use super::*;
    use regex::Regex;

    /// The part's name: its results file and the group of its benchmarks' names.
    const PART: &str = "semaphore_contended";

    /// The two shapes: the name after `ours_` / `tokio_`, and whether a permit is held across a
    /// `yield_now`.
    const SHAPES: [(&str, &str, bool); 2] = [
        ("held", "64_tasks_capacity_8", true),
        ("no_await", "64_tasks_capacity_8_no_await_inside", false),
    ];

    /// What the command line asks of the part, read as criterion reads its own.
    struct Wanted {
        /// `--bench` without `--test`: the full part, written; otherwise one short run each.
        full: bool,
        /// `--list`: print the names and run nothing.
        list: bool,
        /// A name filter: `None` for all, `--exact` for equality, else a regex.
        filter: Option<(String, bool)>,
        /// `--ignored`: criterion then runs nothing.
        ignored: bool,
    }

    /// Criterion's options that take a value: that value is not the filter.
    const TAKES_VALUE: &[&str] = &[
        "-c",
        "--color",
        "--colour",
        "-s",
        "--save-baseline",
        "-b",
        "--baseline",
        "--baseline-lenient",
        "--format",
        "--profile-time",
        "--load-baseline",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
    ];

    fn wanted() -> Wanted {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let has = |flag: &str| args.iter().any(|a| a == flag);
        let mut filter = None;
        let mut skip_value = false;
        for arg in &args {
            if skip_value {
                skip_value = false;
            } else if arg.starts_with('-') {
                skip_value = TAKES_VALUE.contains(&arg.as_str());
            } else if filter.is_none() {
                filter = Some(arg.clone());
            }
        }
        Wanted {
            full: has("--bench") && !has("--test"),
            list: has("--list"),
            filter: filter.map(|f| (f, has("--exact"))),
            ignored: has("--ignored"),
        }
    }

    /// The benchmark names of the part, as criterion would name them.
    fn names() -> Vec<String> {
        SHAPES
            .iter()
            .flat_map(|(_, name, _)| ["ours", "tokio"].map(|side| format!("{PART}/{side}_{name}")))
            .collect()
    }

    /// Whether the filter lets `name` through, as criterion's would.
    fn matches(wanted: &Wanted, name: &str) -> bool {
        if wanted.ignored {
            return false;
        }
        match &wanted.filter {
            None => true,
            Some((filter, true)) => name == filter,
            Some((filter, false)) => Regex::new(filter)
                .unwrap_or_else(|e| panic!("the filter {filter:?} is not a regex: {e}"))
                .is_match(name),
        }
    }

    pub(super) fn run() {
        let wanted = wanted();
        let chosen: Vec<String> = names()
            .into_iter()
            .filter(|name| matches(&wanted, name))
            .collect();
        if wanted.list {
            for name in &chosen {
                println!("{name}: benchmark");
            }
            return;
        }
        // The part runs whole or not at all, so that its file always holds every row's figures
        // from one run.
        if chosen.is_empty() {
            return;
        }
        let (runs, rounds) = if wanted.full {
            let runs = match std::env::var("ADMISSION_CONTENDED_RUNS") {
                Ok(n) => n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .expect("ADMISSION_CONTENDED_RUNS is a positive number"),
                Err(_) => CONTENDED_RUNS,
            };
            (runs, ROUNDS)
        } else {
            (1, 100)
        };
        let rt = support::two_workers();
        let started = Instant::now();
        let mut results = Results::new(PART)
            .number("runs", runs as f64)
            .number("tasks", TASKS as f64)
            .number("rounds", rounds as f64)
            .number("permits", CONTENDED_PERMITS as f64)
            .number("workers", 2.0);
        for (shape, name, hold) in SHAPES {
            // One run of each side first, not counted: the runtime's threads and the
            // allocator's arenas are warm for both.
            ours(&rt, rounds, hold);
            peer(&rt, rounds, hold);
            let (mut ours_runs, mut peer_runs) = (Vec::new(), Vec::new());
            for run in 1..=runs {
                let (o, p) = (ours(&rt, rounds, hold), peer(&rt, rounds, hold));
                println!(
                    "{PART}/{name} run {run}/{runs}: ours {}; tokio {}",
                    show(&o),
                    show(&p)
                );
                ours_runs.push(o);
                peer_runs.push(p);
            }
            results = record(results, &format!("ours_{shape}"), &ours_runs);
            results = record(results, &format!("tokio_{shape}"), &peer_runs);
        }
        let seconds = started.elapsed().as_secs_f64();
        if wanted.full {
            let path = results.write().expect("the results file is written");
            let (path, json) = (path.display(), results.to_json());
            println!("{PART}: done in {seconds:.1} s, written to {path}\n{json}");
        } else {
            println!("{PART}: smoke run done in {seconds:.1} s (not written; pass --bench)");
        }
    }

    /// One run of ours: a fresh monitor and gate.
    fn ours(rt: &tokio::runtime::Runtime, rounds: usize, hold: bool) -> Usage {
        support::contended_gate(rt, CONTENDED_PERMITS, TASKS, rounds, hold)
    }

    /// One run of tokio's: a fresh semaphore.
    fn peer(rt: &tokio::runtime::Runtime, rounds: usize, hold: bool) -> Usage {
        support::contended_semaphore(rt, CONTENDED_PERMITS as usize, TASKS, rounds, hold)
    }

    fn show(usage: &Usage) -> String {
        format!(
            "{:.1} ms wall, {:.1} ms CPU, {} switches ({} voluntary)",
            usage.wall.as_secs_f64() * 1e3,
            usage.cpu.as_secs_f64() * 1e3,
            usage.switches(),
            usage.voluntary_switches,
        )
    }

    /// `<prefix>_{wall_ns,cpu_ns,switches}_{median,min}`, and each run's wall and CPU
    /// milliseconds as texts.
    fn record(results: Results, prefix: &str, runs: &[Usage]) -> Results {
        let wall: Vec<f64> = runs.iter().map(|u| u.wall.as_nanos() as f64).collect();
        let cpu: Vec<f64> = runs.iter().map(|u| u.cpu.as_nanos() as f64).collect();
        let switches: Vec<f64> = runs.iter().map(|u| u.switches() as f64).collect();
        let in_ms = |values: &[f64]| {
            let ms: Vec<String> = values.iter().map(|v| format!("{:.1}", v / 1e6)).collect();
            ms.join(" ")
        };
        results
            .number(&format!("{prefix}_wall_ns_median"), median(&wall))
            .number(&format!("{prefix}_wall_ns_min"), min(&wall))
            .number(&format!("{prefix}_cpu_ns_median"), median(&cpu))
            .number(&format!("{prefix}_cpu_ns_min"), min(&cpu))
            .number(&format!("{prefix}_switches_median"), median(&switches))
            .number(&format!("{prefix}_switches_min"), min(&switches))
            .text(&format!("{prefix}_wall_ms_runs"), &in_ms(&wall))
            .text(&format!("{prefix}_cpu_ms_runs"), &in_ms(&cpu))
    }

    /// The middle value, or the mean of the two middle ones for an even count.
    fn median(values: &[f64]) -> f64 {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        }
    }

    fn min(values: &[f64]) -> f64 {
        values.iter().copied().fold(f64::NAN, f64::min)
    }
}
