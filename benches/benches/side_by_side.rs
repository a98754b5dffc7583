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
//!   as tokio's `try_acquire` returns a permit that borrows its semaphore).
//! - `semaphore_contended` (item 2): 64 tasks on a two-worker tokio runtime, each acquiring and
//!   releasing 10,000 times a gate of 8 permits; the whole run's wall time. Each task holds its
//!   permit across one `yield_now`, as a real job holds it across its call: without an await
//!   point inside, two workers could never hold more than two of the eight permits and nobody
//!   would ever wait. That variant (`_no_await_inside`) runs too: it measures the two
//!   acquisition paths fought over by two threads, with no waiting.
//! - `three_limits` (item 3): one admit over an HTTP gate, a token bucket and a database gate,
//!   against the chain written by hand today (tokio semaphore, governor `check_n`, tokio
//!   semaphore), with `admit_blocking` (demand cloned or built per call) and `try_admit` (the
//!   prebuilt demand borrowed). The quota that chain leaks when its last limit refuses is counted by the
//!   `scarce_and_wakes` harness, not timed here.
//! - `pass_over_10k_parked` (item 6): one evaluator pass (`Monitor::pass_now`) over 10,000
//!   parked waiters that all stay parked, with a "floor" that asks the same accounts the same
//!   questions with no monitor.
//!
//! `cargo xtask bench` reads the medians from `target/criterion/<group>/<bench>/new/` and writes
//! the table in BENCHMARKS.md.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
use admission_accounts::token_bucket::TokenBucketConfig;
use admission_accounts::{CountingGate, TokenBucket};
use admission_benches::support::{self, ParkedLine, admit_release, try_admit_release};
use admission_core::{AccountRef, Amount, Ask, Demand, JobContext, Monitor, SystemClock};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
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
/// Contended: tasks, rounds per task, permits.
const TASKS: usize = 64;
const ROUNDS: usize = 10_000;
const CONTENDED_PERMITS: u64 = 8;
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
    group.finish();
}

fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("a runtime")
}

/// One contended run through the monitor: [`TASKS`] tasks x [`ROUNDS`] admits on a fresh gate of
/// [`CONTENDED_PERMITS`], each grant held across one `yield_now` when `hold` says so. Only the
/// run is timed, not the monitor's start.
fn contended_ours(rt: &tokio::runtime::Runtime, hold: bool) -> Duration {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let demand = Demand::new().with(gate("gate", CONTENDED_PERMITS), Amount::ONE);
    let elapsed = support::contended_admits(rt, &monitor, &demand, TASKS, ROUNDS, hold);
    monitor.stop();
    elapsed
}

/// The same run on tokio's semaphore.
fn contended_tokio(rt: &tokio::runtime::Runtime, hold: bool) -> Duration {
    support::contended_semaphore(rt, CONTENDED_PERMITS as usize, TASKS, ROUNDS, hold)
}

fn semaphore_contended(c: &mut Criterion) {
    let rt = two_workers();
    let mut group = c.benchmark_group("semaphore_contended");
    // One run is 640,000 hand-offs; ten runs of each side, each timed whole.
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    for (shape, hold) in [("", true), ("_no_await_inside", false)] {
        group.bench_function(format!("ours_64_tasks_capacity_8{shape}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| contended_ours(&rt, hold)).sum())
        });
        group.bench_function(format!("tokio_64_tasks_capacity_8{shape}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| contended_tokio(&rt, hold)).sum())
        });
    }
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
    targets = single_limit, semaphore, semaphore_contended, three_limits, pass_over_10k_parked
}
criterion_main!(benches);
