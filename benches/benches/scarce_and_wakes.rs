//! The side-by-side measurements that are not a per-iteration time, in a harness of their own.
//!
//! Each part runs ours and the peer in the same process, one after the other or interleaved, and
//! writes its figures to `target/side-by-side/<part>.json` (read by `cargo xtask bench`). An
//! argument that is not a flag runs only the parts whose name contains it
//! (`cargo bench -p admission-benches --bench scarce_and_wakes -- goodput`). Run without
//! `--bench` (as `cargo test --all-targets` does), every part runs briefly and writes nothing.
//!
//! - `leak` (issue 5, item 3): what the hand-written chain (tokio semaphore, governor `check_n`,
//!   tokio semaphore) spends from its rate limiter on attempts that its last limit then refuses,
//!   against one admit of the same three limits. Both rate limits run on a frozen clock, so a
//!   leaked token cannot be hidden by a refill: the count is exact, not timed.
//! - `goodput` (item 4): an HTTP pool of 16 shared by jobs on model A (short of tokens) and model
//!   B (plentiful), 32 jobs each, each job a loop of "acquire, call (a 20 ms sleep), release".
//!   B's completed calls per second under the monitor against the hold-and-wait chain, which
//!   takes an HTTP permit first and then waits for its model's tokens while holding it. Both
//!   sides use our `TokenBucket` for the token limits, so only the way of acquiring differs; the
//!   chain asks the bucket and, told "not now", sleeps in tokio until the instant the answer
//!   names (what governor's `until_n_ready` does with its own limiter), asking again when another
//!   job got there first.
//! - `wake` (item 5): from a release to the parked async waiter running, p50/p99, a task awaiting
//!   `Monitor::admit` against a task awaiting tokio's `Semaphore::acquire`. Two shapes: `settled`
//!   (released 50 us after the waiter parked, when its core has gone idle) and `hot` (released as
//!   soon as it is parked).
//! - `deadline` (item 5): a waiter whose token becomes available at a computed instant T; how
//!   late after T it actually runs (overshoot p50/p99). Ours: a task awaiting `Monitor::admit` on
//!   an empty `TokenBucket`, woken by the evaluator thread's deadline. Peer: a task awaiting
//!   governor's `until_ready` on an empty limiter of the same rate, woken by its timer.
//!
//! Percentiles come from `hdrhistogram`. Everything runs on the system clock and real time except
//! the leak count.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use admission_accounts::token_bucket::TokenBucketConfig;
use admission_accounts::{CountingGate, TokenBucket};
use admission_benches::Results;
use admission_benches::support::{self, HandOff, MonitorTask, Parked, SemaphoreTask, runtime};
use admission_core::{
    Account, AccountRef, Amount, Answer, Ask, Clock, Demand, JobContext, Monitor,
};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use governor::clock::{Clock as _, FakeRelativeClock, Reference as _};
use governor::{Quota, RateLimiter};
use hdrhistogram::Histogram;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type Part = (&'static str, fn() -> Results);

/// How long and how many: the full run under `cargo bench`, a quick smoke run otherwise.
struct Plan {
    /// `cargo bench` passes `--bench`; without it (`cargo test --benches`, `--all-targets`) every
    /// part runs briefly, to prove it works, and writes nothing.
    full: bool,
    window: Duration,
    wake_samples: usize,
    wake_block: usize,
    deadline_samples: usize,
}

fn plan() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        if std::env::args().any(|arg| arg == "--bench") {
            Plan {
                full: true,
                window: WINDOW,
                wake_samples: WAKE_SAMPLES,
                wake_block: WAKE_BLOCK,
                deadline_samples: DEADLINE_SAMPLES,
            }
        } else {
            Plan {
                full: false,
                window: Duration::from_millis(200),
                wake_samples: 20,
                wake_block: 10,
                deadline_samples: 20,
            }
        }
    })
}

fn main() {
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    let parts: [Part; 4] = [
        ("leak", leak),
        ("goodput", goodput),
        ("wake", wake),
        ("deadline", deadline),
    ];
    for (name, run) in parts {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let started = Instant::now();
        let results = run();
        let seconds = started.elapsed().as_secs_f64();
        if plan().full {
            let path = results.write().expect("the results file is written");
            let (path, json) = (path.display(), results.to_json());
            println!("{name}: done in {seconds:.1} s, written to {path}\n{json}");
        } else {
            println!("{name}: smoke run done in {seconds:.1} s (not written; pass --bench)");
        }
    }
}

fn job(name: &str) -> JobContext {
    JobContext::new(name.to_owned())
}

fn gate(name: &str, permits: u64, clock: &Arc<dyn Clock>) -> Arc<CountingGate> {
    Arc::new(CountingGate::new(name, permits, clock.clone()).expect("a positive capacity"))
}

fn bucket(name: &str, config: TokenBucketConfig, clock: &Arc<dyn Clock>) -> Arc<TokenBucket> {
    Arc::new(TokenBucket::new(name, config, clock.clone()).expect("a valid config"))
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

fn micros(nanos: u64) -> f64 {
    nanos as f64 / 1_000.0
}

// ------------------------------------------------------------------------------------------------
// leak

/// Attempts made while the database limit has nothing free.
const LEAK_ATTEMPTS: u64 = 1_000;
/// Tokens each attempt asks of the model's limit.
const LEAK_TOKENS: u32 = 100;
/// The model's budget on both sides (per minute; the clocks are frozen, so it is all there is).
const LEAK_BUDGET: u32 = 1_000_000;

fn leak() -> Results {
    let n = NonZeroU32::new(LEAK_TOKENS).expect("non-zero");
    let budget = NonZeroU32::new(LEAK_BUDGET).expect("non-zero");

    // The chain, as written today: HTTP semaphore, then the model's governor limiter, then the
    // DB semaphore, whose only permit someone else holds.
    let tokens =
        RateLimiter::direct_with_clock(Quota::per_minute(budget), FakeRelativeClock::default());
    let http = Semaphore::new(16);
    let db = Semaphore::new(1);
    let db_held = db.try_acquire().expect("free");
    let (mut chain_granted, mut chain_refused, mut chain_leaked) = (0u64, 0u64, 0u64);
    for _ in 0..LEAK_ATTEMPTS {
        let Ok(h) = http.try_acquire() else {
            chain_refused += 1;
            continue;
        };
        if !matches!(tokens.check_n(n), Ok(Ok(()))) {
            chain_refused += 1;
            continue;
        }
        match db.try_acquire() {
            Ok(d) => {
                chain_granted += 1;
                drop((h, d));
            }
            Err(_) => {
                // The HTTP permit comes back with `h`; the cells governor gave are spent.
                chain_refused += 1;
                chain_leaked += u64::from(LEAK_TOKENS);
            }
        }
    }
    drop(db_held);
    // The limiter itself agrees: exactly the budget less the leak is left.
    let left = u64::from(LEAK_BUDGET) - chain_leaked;
    if let Some(left) = NonZeroU32::new(u32::try_from(left).expect("below the budget")) {
        assert!(matches!(tokens.check_n(left), Ok(Ok(()))));
    }
    assert!(tokens.check().is_err(), "nothing more than counted is left");

    // Ours: the same three limits in one demand, each attempt an admit polled once and dropped
    // (a "try"), on a frozen clock so the bucket cannot refill what it might have lost.
    let fake = FakeClock::new();
    let clock: Arc<dyn Clock> = fake.shared();
    let monitor = Monitor::builder().clock(fake.shared()).build();
    monitor.start().expect("a fresh monitor starts");
    let http = Arc::new(CountingGate::http(16, clock.clone()).expect("a positive capacity"));
    let model = bucket(
        "model",
        TokenBucketConfig::new(u64::from(LEAK_BUDGET), u64::from(LEAK_BUDGET)),
        &clock,
    );
    let db = gate("db", 1, &clock);
    let ctx = job("leak");
    let db_held = monitor
        .admit_blocking(Demand::new().with(db.clone(), Amount::ONE), &ctx, None)
        .expect("free");
    let demand = Demand::new()
        .with(http.clone(), Amount::ONE)
        .with(model.clone(), Amount::pair(u64::from(LEAK_TOKENS), 1))
        .with(db.clone(), Amount::ONE);
    let (tokens_before, requests_before) = (model.level(), model.requests_available());
    let (mut ours_granted, mut ours_refused) = (0u64, 0u64);
    for _ in 0..LEAK_ATTEMPTS {
        let mut admit = std::pin::pin!(monitor.admit(demand.clone(), &ctx, None));
        match poll_once(&mut admit) {
            None => ours_refused += 1, // parked holding nothing; dropping it withdraws it
            Some(Ok(grant)) => {
                ours_granted += 1;
                drop(grant);
            }
            Some(Err(error)) => panic!("an admit that can fit is never refused: {error}"),
        }
    }
    assert_eq!(monitor.queue_size(), 0, "every attempt withdrew");
    let ours_leaked = tokens_before - model.level();
    let ours_requests_leaked = requests_before - model.requests_available();
    assert_eq!(http.available(), 16);
    drop(db_held);
    monitor.stop();

    Results::new("leak")
        .number("attempts", LEAK_ATTEMPTS as f64)
        .number("tokens_per_attempt", f64::from(LEAK_TOKENS))
        .number("chain_granted", chain_granted as f64)
        .number("chain_refused", chain_refused as f64)
        .number("chain_tokens_leaked", chain_leaked as f64)
        .number("ours_granted", ours_granted as f64)
        .number("ours_refused", ours_refused as f64)
        .number("ours_tokens_leaked", ours_leaked as f64)
        .number("ours_requests_leaked", ours_requests_leaked as f64)
}

// ------------------------------------------------------------------------------------------------
// goodput

const HTTP_POOL: u64 = 16;
const JOBS_PER_MODEL: usize = 32;
/// A simulated call: the time between acquiring and releasing, as a tokio sleep.
const CALL: Duration = Duration::from_millis(20);
/// Tokens one call asks of its model (plus one request).
const CALL_TOKENS: u64 = 1_000;
/// Model A's budget in calls per second: far below what 32 jobs ask.
const A_CALLS_PER_SECOND: u64 = 5;
/// How long each side runs (in the full run).
const WINDOW: Duration = Duration::from_secs(3);
/// How often the chain's held-while-waiting gauge is sampled.
const GAUGE_EVERY: Duration = Duration::from_millis(5);

fn model_a_config() -> TokenBucketConfig {
    TokenBucketConfig::new(A_CALLS_PER_SECOND * 60 * CALL_TOKENS, 1_000_000_000)
}

fn model_b_config() -> TokenBucketConfig {
    TokenBucketConfig::new(1_000_000_000_000, 1_000_000_000)
}

/// Takes every whole token `bucket` holds, so that model A starts short instead of with a
/// minute's burst.
fn drain(bucket: &TokenBucket) {
    let whole = bucket.level();
    if whole > 0 {
        assert!(bucket.ask(Amount::pair(whole, 0), Ask::HEAD).is_taken());
    }
}

/// What one side achieved in the plan's window.
struct Goodput {
    a_calls: u64,
    b_calls: u64,
    /// The mean number of HTTP permits held by jobs waiting for tokens.
    held_waiting: f64,
}

/// Runs the jobs for the plan's window and reads the counters at its end. `held` is the gauge of
/// permits held while waiting (always zero for the monitor).
fn run_jobs(
    rt: &tokio::runtime::Runtime,
    spawn_job: impl Fn(bool) -> tokio::task::JoinHandle<()>,
    done: [&AtomicU64; 2],
    held: &AtomicI64,
) -> Goodput {
    rt.block_on(async {
        let started = tokio::time::Instant::now();
        let tasks: Vec<_> = (0..2 * JOBS_PER_MODEL)
            .map(|i| spawn_job(i % 2 == 0))
            .collect();
        let (mut sum, mut samples) = (0i64, 0i64);
        while started.elapsed() < plan().window {
            tokio::time::sleep(GAUGE_EVERY).await;
            sum += held.load(Ordering::Relaxed);
            samples += 1;
        }
        let result = Goodput {
            a_calls: done[0].load(Ordering::Relaxed),
            b_calls: done[1].load(Ordering::Relaxed),
            held_waiting: sum as f64 / samples.max(1) as f64,
        };
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        result
    })
}

fn goodput_monitor() -> Goodput {
    let rt = runtime(2);
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let clock: Arc<dyn Clock> = monitor.clock().clone();
    let http: AccountRef =
        Arc::new(CountingGate::http(HTTP_POOL, clock.clone()).expect("a positive capacity"));
    let a = bucket("model-a", model_a_config(), &clock);
    let b = bucket("model-b", model_b_config(), &clock);
    drain(&a);
    let call = Amount::pair(CALL_TOKENS, 1);
    let demands = [
        Demand::new().with(http.clone(), Amount::ONE).with(a, call),
        Demand::new().with(http, Amount::ONE).with(b, call),
    ];
    let done = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let held = AtomicI64::new(0);
    let result = run_jobs(
        &rt,
        |on_a| {
            let model = usize::from(!on_a);
            let (monitor, demand, done) =
                (monitor.clone(), demands[model].clone(), done[model].clone());
            rt.spawn(async move {
                let ctx = job("goodput");
                loop {
                    let grant = monitor
                        .admit(demand.clone(), &ctx, None)
                        .await
                        .expect("granted");
                    tokio::time::sleep(CALL).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    drop(grant);
                }
            })
        },
        [&done[0], &done[1]],
        &held,
    );
    drop(rt);
    monitor.stop();
    result
}

fn goodput_chain() -> Goodput {
    let rt = runtime(2);
    let clock: Arc<dyn Clock> = Arc::new(admission_core::SystemClock::new());
    let http = Arc::new(Semaphore::new(HTTP_POOL as usize));
    let a = bucket("model-a", model_a_config(), &clock);
    let b = bucket("model-b", model_b_config(), &clock);
    drain(&a);
    let models = [a, b];
    let done = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let held = Arc::new(AtomicI64::new(0));
    let result = run_jobs(
        &rt,
        |on_a| {
            let model = usize::from(!on_a);
            let (http, bucket, done, held, clock) = (
                http.clone(),
                models[model].clone(),
                done[model].clone(),
                held.clone(),
                clock.clone(),
            );
            rt.spawn(async move {
                let call = Amount::pair(CALL_TOKENS, 1);
                loop {
                    let permit = http.clone().acquire_owned().await.expect("not closed");
                    held.fetch_add(1, Ordering::Relaxed);
                    // Hold the connection and wait for the tokens: sleep until the bucket says
                    // they will be there, ask again (another job may have taken them first).
                    loop {
                        let at = match bucket.ask(call, Ask::HEAD) {
                            Answer::Taken => break,
                            Answer::NotNow(Some(at)) => at,
                            other => panic!("a call fits the budget; the bucket said {other:?}"),
                        };
                        tokio::time::sleep(at.saturating_duration_since(clock.now())).await;
                    }
                    held.fetch_sub(1, Ordering::Relaxed);
                    tokio::time::sleep(CALL).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    drop::<OwnedSemaphorePermit>(permit);
                }
            })
        },
        [&done[0], &done[1]],
        &held,
    );
    drop(rt);
    result
}

fn goodput() -> Results {
    let ours = goodput_monitor();
    let chain = goodput_chain();
    let window = plan().window.as_secs_f64();
    let per_second = |calls: u64| calls as f64 / window;
    Results::new("goodput")
        .number("window_s", window)
        .number("http_pool", HTTP_POOL as f64)
        .number("jobs_per_model", JOBS_PER_MODEL as f64)
        .number("call_ms", CALL.as_secs_f64() * 1_000.0)
        .number("a_budget_calls_per_s", A_CALLS_PER_SECOND as f64)
        .number("ours_a_calls_per_s", per_second(ours.a_calls))
        .number("ours_b_calls_per_s", per_second(ours.b_calls))
        .number("chain_a_calls_per_s", per_second(chain.a_calls))
        .number("chain_b_calls_per_s", per_second(chain.b_calls))
        .number("ours_permits_held_waiting", ours.held_waiting)
        .number("chain_permits_held_waiting", chain.held_waiting)
        .text(
            "chain_token_wait",
            "tokio::time::sleep until the instant of the bucket's not-now answer, then ask again",
        )
}

// ------------------------------------------------------------------------------------------------
// wake

/// Hand-offs measured per side and shape (in the full run).
const WAKE_SAMPLES: usize = 2_000;
/// Hand-offs of one side in a row before switching to the other.
const WAKE_BLOCK: usize = 100;
/// How long the `settled` shape waits after the waiter parked before it releases.
const SETTLE: Duration = Duration::from_micros(50);

/// One hand-off on `side`, in nanoseconds; `settled` ones wait [`SETTLE`] after the waiter
/// parked.
fn hand_off(side: &mut impl HandOff, settled: bool) -> u64 {
    let settle = if settled { SETTLE } else { Duration::ZERO };
    let took = support::hand_off(side, settle);
    u64::try_from(took.as_nanos()).unwrap_or(u64::MAX)
}

fn wake() -> Results {
    let Plan {
        wake_samples,
        wake_block,
        ..
    } = *plan();
    let mut results = Results::new("wake").number("samples", wake_samples as f64);
    for (shape, settled) in [("settled", true), ("hot", false)] {
        let one: AccountRef =
            Arc::new(CountingGate::on_system_clock("one", 1).expect("one permit"));
        let mut ours = MonitorTask::new(one, Parked::InLine);
        let mut peer = SemaphoreTask::new();
        let (mut ours_h, mut peer_h) = (histogram(), histogram());
        // Warm both up, then alternate blocks so drift on the machine hits both sides alike.
        for _ in 0..wake_block {
            hand_off(&mut ours, settled);
            hand_off(&mut peer, settled);
        }
        for _ in 0..wake_samples / wake_block {
            for _ in 0..wake_block {
                ours_h.saturating_record(hand_off(&mut ours, settled));
            }
            for _ in 0..wake_block {
                peer_h.saturating_record(hand_off(&mut peer, settled));
            }
        }
        ours.stop();
        for (side, h) in [("ours", &ours_h), ("tokio", &peer_h)] {
            results = results
                .number(
                    &format!("{side}_{shape}_p50_us"),
                    micros(h.value_at_quantile(0.5)),
                )
                .number(
                    &format!("{side}_{shape}_p99_us"),
                    micros(h.value_at_quantile(0.99)),
                )
                .number(&format!("{side}_{shape}_max_us"), micros(h.max()));
        }
    }
    results
}

// ------------------------------------------------------------------------------------------------
// deadline

/// Deadlines measured per side (in the full run).
const DEADLINE_SAMPLES: usize = 2_000;
/// One token (one governor cell) every this long on both sides.
const PERIOD: Duration = Duration::from_millis(2);

/// Ours: how late after its computed instant a task waiting for one token runs.
struct OursDeadline {
    monitor: Monitor,
    bucket: Arc<TokenBucket>,
    demand: Demand,
}

impl OursDeadline {
    fn new() -> OursDeadline {
        let monitor = Monitor::new();
        monitor.start().expect("a fresh monitor starts");
        let per_minute = u64::try_from(Duration::from_secs(60).as_nanos() / PERIOD.as_nanos())
            .expect("a small rate");
        let bucket = bucket(
            "model",
            TokenBucketConfig::new(per_minute, u64::MAX / 4),
            &(monitor.clock().clone() as Arc<dyn Clock>),
        );
        let demand = Demand::new().with(bucket.clone(), Amount::pair(1, 1));
        OursDeadline {
            monitor,
            bucket,
            demand,
        }
    }

    /// Empties the bucket, computes the instant the next token lands, has a task wait for it,
    /// and returns how late after that instant the task ran, in nanoseconds.
    fn sample(&self, rt: &tokio::runtime::Runtime) -> u64 {
        drain(&self.bucket);
        let due = match self.bucket.ask(Amount::pair(1, 1), Ask::HEAD.look()) {
            Answer::NotNow(Some(at)) => at,
            // A token landed since the drain: it is due now.
            Answer::Taken => self.monitor.clock().now(),
            other => panic!("a token fits the budget; the bucket said {other:?}"),
        };
        let (tx, rx) = mpsc::channel();
        let (monitor, demand) = (self.monitor.clone(), self.demand.clone());
        rt.spawn(async move {
            let grant = monitor
                .admit(demand, &job("deadline"), None)
                .await
                .expect("granted");
            let ran = monitor.clock().now();
            drop(grant);
            let _ = tx.send(ran);
        });
        let ran = rx.recv().expect("the task reports");
        let late = ran.saturating_duration_since(due);
        u64::try_from(late.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The peer: a governor limiter of one cell per [`PERIOD`], burst 1, on its default clock.
struct GovernorDeadline {
    limiter: Arc<governor::DefaultDirectRateLimiter>,
}

impl GovernorDeadline {
    fn new() -> GovernorDeadline {
        let quota = Quota::with_period(PERIOD).expect("a non-zero period");
        GovernorDeadline {
            limiter: Arc::new(RateLimiter::direct(quota)),
        }
    }

    fn sample(&self, rt: &tokio::runtime::Runtime) -> u64 {
        let due = loop {
            match self.limiter.check() {
                Ok(()) => continue,
                Err(not_until) => break not_until.earliest_possible(),
            }
        };
        let (tx, rx) = mpsc::channel();
        let limiter = self.limiter.clone();
        rt.spawn(async move {
            limiter.until_ready().await;
            let _ = tx.send(limiter.clock().now());
        });
        let ran = rx.recv().expect("the task reports");
        u64::from(ran.duration_since(due))
    }
}

fn deadline() -> Results {
    let rt = runtime(1);
    let ours = OursDeadline::new();
    let peer = GovernorDeadline::new();
    let (mut ours_h, mut peer_h) = (histogram(), histogram());
    for _ in 0..20 {
        ours.sample(&rt);
        peer.sample(&rt);
    }
    let samples = plan().deadline_samples;
    for _ in 0..samples {
        ours_h.saturating_record(ours.sample(&rt).max(1));
        peer_h.saturating_record(peer.sample(&rt).max(1));
    }
    ours.monitor.stop();
    let mut results = Results::new("deadline")
        .number("samples", samples as f64)
        .number("period_ms", PERIOD.as_secs_f64() * 1_000.0);
    for (side, h) in [("ours", &ours_h), ("governor", &peer_h)] {
        results = results
            .number(&format!("{side}_p50_us"), micros(h.value_at_quantile(0.5)))
            .number(&format!("{side}_p99_us"), micros(h.value_at_quantile(0.99)))
            .number(&format!("{side}_max_us"), micros(h.max()));
    }
    results
}
