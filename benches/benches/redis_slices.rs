//! A cell's request rate spent by 100 processes, one lease per call beside [`RateSlices`], on a
//! private `redis-server`, with its own harness (the parts are rates, counts and latencies, not
//! per-iteration times).
//!
//! 100 provider instances (each its own connection and notice reader, as 100 processes would
//! have) share one cell whose rates allow `L` calls per second (a 1-second "minute": `L`
//! requests and `100 L` tokens, no burst share, every call declaring and spending 100 tokens).
//! Its levels are spent empty by one lease just before the calls start (else they would take
//! 4 s to drain and the measured span would see the first second's budget). The fleet offers
//! `1.25 L` calls per second as an open loop: each process a steady arrival every
//! `100 / offered` s (an interval skipping missed ticks), at most 64 calls outstanding per
//! process (an arrival past that is dropped and counted). For an offered rate of 100, 1,000 and
//! 10,000 calls per second, 2 s of warm-up then 5 s measured, in two modes:
//!
//! - `per_call`: each call is one `RedisAdmission::acquire` of a lease of 100 tokens and 1
//!   request, released at once with `release_spent`.
//! - `slices`: each process admits its calls from a [`RateSlices`] over its instance (hold
//!   100 ms, at most 64 calls a slice), closed at the end.
//!
//! Measured per mode and rate: admitted calls per second, script calls (the server's
//! `cmdstat_fcall`) per admitted call, the largest excess over `L` of the admissions in any one
//! second (a window slid over the admit instants in 10 ms steps), Jain's fairness index over
//! the processes' admitted counts, calls dropped, and the p50/p99 admit latency (arrival to
//! admitted).
//!
//! Run with `cargo bench -p admission-benches --bench redis_slices` (needs `redis-server` on
//! PATH); a filter argument picks a rate or a mode (`-- 1000`, `-- slices`). Results are printed
//! and written to `target/side-by-side/redis_slices_<rate>.json`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use admission_benches::Results;
use admission_benches::redis_server::{RedisServer, ServerWork};
use admission_redis::{
    Ceilings, LeaseRequest, Outcome, RateSlices, Rates, RedisAdmission, RedisAdmissionConfig,
    SliceConfig,
};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

const PROCESSES: usize = 100;
/// Tokens every call declares and spends.
const TOKENS: u64 = 100;
/// Calls outstanding (arrived, not yet admitted and finished) per process before arrivals drop.
const OUTSTANDING: usize = 64;
const WARM_UP: Duration = Duration::from_secs(2);
const MEASURED: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    PerCall,
    Slices,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::PerCall => "per_call",
            Mode::Slices => "slices",
        }
    }
}

/// A cell of `limit` calls per second (requests, and 100 tokens a call) and no other binding
/// ceiling.
fn config(port: u16, cell: &str, limit: u64) -> RedisAdmissionConfig {
    let ceilings = Ceilings {
        service_bytes: 1 << 40,
        service_transfers: 100_000,
        tenant_bytes: 1 << 40,
        tenant_transfers: 100_000,
        backend_transfers: 100_000,
    };
    let mut config = RedisAdmissionConfig::new("127.0.0.1", port, cell, ceilings);
    config.rates = Some(Rates {
        minute: Duration::from_secs(1),
        ..Rates::per_minute(TOKENS * limit, limit)
    });
    config.redis_wait = WAIT;
    // Each run's cell is new on a private server: nothing to recover.
    config.recover_created_cells = false;
    config
}

/// One process's way of admitting a call.
enum Admitter {
    PerCall(RedisAdmission),
    Slices(RateSlices),
}

impl Admitter {
    /// Admits call `id`, spends its tokens and ends it: the instant it was admitted.
    async fn call(&self, id: String) -> Result<Instant, String> {
        match self {
            Admitter::PerCall(fleet) => {
                let request = LeaseRequest::new(id, "tenant", "model", TOKENS, "call");
                let lease = fleet
                    .acquire(&request, WAIT)
                    .await
                    .map_err(|e| e.to_string())?;
                let admitted = Instant::now();
                lease
                    .release_spent(Outcome::Completed, TOKENS)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(admitted)
            }
            Admitter::Slices(slices) => {
                let call = slices.admit(TOKENS).await.map_err(|e| e.to_string())?;
                let admitted = Instant::now();
                slices.finish(call, TOKENS);
                Ok(admitted)
            }
        }
    }
}

/// What one process saw.
#[derive(Default)]
struct Seen {
    /// `(arrival, admitted)` of every admitted call.
    admitted: Mutex<Vec<(Instant, Instant)>>,
    /// Arrivals within the measured span, and those of them dropped at the bound.
    arrivals: AtomicU64,
    dropped: AtomicU64,
    errors: AtomicU64,
    outstanding: AtomicUsize,
}

/// One process's open loop: an arrival every `period` from `first` until `end`, each a task of
/// its own unless `OUTSTANDING` calls are; the calls still outstanding at `end`.
async fn arrivals(
    p: usize,
    admitter: Arc<Admitter>,
    seen: Arc<Seen>,
    first: Instant,
    period: Duration,
    span: (Instant, Instant),
) -> JoinSet<()> {
    let mut interval = tokio::time::interval_at(first, period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut calls = JoinSet::new();
    let mut i = 0u64;
    loop {
        let tick = interval.tick().await;
        if tick >= span.1 {
            return calls;
        }
        while calls.try_join_next().is_some() {}
        let arrival = Instant::now();
        let measured = arrival >= span.0;
        if measured {
            seen.arrivals.fetch_add(1, Ordering::Relaxed);
        }
        if seen.outstanding.load(Ordering::Relaxed) >= OUTSTANDING {
            if measured {
                seen.dropped.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        seen.outstanding.fetch_add(1, Ordering::Relaxed);
        i += 1;
        let (admitter, seen) = (admitter.clone(), seen.clone());
        calls.spawn(async move {
            match admitter.call(format!("p{p}-{i}")).await {
                Ok(admitted) => seen.admitted.lock().push((arrival, admitted)),
                Err(error) => {
                    if seen.errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("process {p}: {error}");
                    }
                }
            }
            seen.outstanding.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// The server's `FCALL` calls so far (`INFO commandstats`).
async fn fcalls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("info");
    ServerWork::parse(&info).calls(&ServerWork::default(), "fcall")
}

/// One mode at one offered rate.
struct Run {
    offered_per_second: f64,
    admitted_per_second: f64,
    fcall_per_call: f64,
    max_excess: u64,
    jain: f64,
    dropped: u64,
    errors: u64,
    p50_ms: f64,
    p99_ms: f64,
    /// Calls per slice taken (slices mode).
    calls_per_slice: f64,
}

async fn run(port: u16, mode: Mode, offered: u64) -> Run {
    let limit = offered * 4 / 5;
    let cell = format!("{}-{offered}", mode.name());
    let mut fleet = Vec::new();
    for _ in 0..PROCESSES {
        let instance = RedisAdmission::connect(config(port, &cell, limit))
            .await
            .expect("connects");
        fleet.push(Arc::new(match mode {
            Mode::PerCall => Admitter::PerCall(instance),
            Mode::Slices => Admitter::Slices(
                RateSlices::new(
                    instance,
                    SliceConfig {
                        hold: Duration::from_millis(100),
                        max_calls: 64,
                        wait: WAIT,
                        ..SliceConfig::new("tenant", "model")
                    },
                )
                .expect("slices"),
            ),
        }));
    }
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut info = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    // The levels start full (one second's worth) and an excess of 25 % drains them only in
    // 4 s: spend them now, so the warm-up brings the line to its steady state and no window
    // counts the first second's budget.
    let drain = RedisAdmission::connect(config(port, &cell, limit))
        .await
        .expect("connects");
    drain
        .acquire(
            &LeaseRequest::new("drain", "tenant", "model", TOKENS * limit, "drain")
                .with_requests(limit),
            WAIT,
        )
        .await
        .expect("the whole budget")
        .release_spent(Outcome::Completed, TOKENS * limit)
        .await
        .expect("released");
    drop(drain);
    let seen: Vec<Arc<Seen>> = (0..PROCESSES).map(|_| Arc::default()).collect();
    let period = Duration::from_secs_f64(PROCESSES as f64 / offered as f64);
    let base = Instant::now() + Duration::from_millis(20);
    let span = (base + WARM_UP, base + WARM_UP + MEASURED);
    let mut loops = Vec::new();
    for (p, (admitter, seen)) in fleet.iter().zip(&seen).enumerate() {
        // Phases spread over one period, so the fleet's arrivals are even.
        let first = base + period.mul_f64(p as f64 / PROCESSES as f64);
        loops.push(tokio::spawn(arrivals(
            p,
            admitter.clone(),
            seen.clone(),
            first,
            period,
            span,
        )));
    }
    tokio::time::sleep_until(span.0).await;
    let fcall_before = fcalls(&mut info).await;
    tokio::time::sleep_until(span.1).await;
    let fcall_after = fcalls(&mut info).await;
    // What is still waiting at the end is dropped (an acquisition or `admit` is cancel safe).
    for handle in loops {
        let mut calls = handle.await.expect("arrivals");
        calls.shutdown().await;
    }
    let mut slices = 0;
    let mut slice_calls = 0;
    for admitter in &fleet {
        if let Admitter::Slices(s) = admitter.as_ref() {
            s.close().await;
            let stats = s.stats();
            slices += stats.slices;
            slice_calls += stats.calls;
        }
    }
    drop(fleet);

    let in_span = |at: Instant| at >= span.0 && at < span.1;
    let mut instants = Vec::new();
    let mut counts = Vec::new();
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    for s in &seen {
        let admitted = s.admitted.lock();
        let mut count = 0u64;
        for &(arrival, at) in admitted.iter().filter(|(_, at)| in_span(*at)) {
            count += 1;
            instants.push(at.duration_since(span.0));
            latency
                .record((at.duration_since(arrival).as_micros() as u64).max(1))
                .expect("record");
        }
        counts.push(count as f64);
    }
    instants.sort_unstable();
    // One-second windows slid over the measured span in 10 ms steps.
    let mut max_excess = 0;
    let mut start = Duration::ZERO;
    while start + Duration::from_secs(1) <= MEASURED {
        let from = instants.partition_point(|&t| t < start);
        let to = instants.partition_point(|&t| t < start + Duration::from_secs(1));
        max_excess = max_excess.max(((to - from) as u64).saturating_sub(limit));
        start += Duration::from_millis(10);
    }
    let sum: f64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|x| x * x).sum();
    let sum_of = |f: fn(&Seen) -> &AtomicU64| {
        seen.iter()
            .map(|s| f(s).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let measured = MEASURED.as_secs_f64();
    let admitted = instants.len() as f64;
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1e3;
    Run {
        offered_per_second: sum_of(|s| &s.arrivals) as f64 / measured,
        admitted_per_second: admitted / measured,
        fcall_per_call: (fcall_after - fcall_before) as f64 / admitted,
        max_excess,
        jain: sum * sum / (counts.len() as f64 * squares),
        dropped: sum_of(|s| &s.dropped),
        errors: sum_of(|s| &s.errors),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        calls_per_slice: slice_calls as f64 / slices as f64,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks a rate or a mode (the whole word:
    // `1000` is not `10000`).
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |what: &str| filter.as_deref().is_none_or(|f| f == what);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    runtime.block_on(async {
        let mut all = Vec::new();
        println!(
            "{:>7} {:>8} {:>6} {:>9} {:>9} {:>10} {:>14} {:>6} {:>7} {:>9} {:>9} {:>10}",
            "offered",
            "mode",
            "limit",
            "arrived/s",
            "admitted/s",
            "fcall/call",
            "max excess",
            "Jain",
            "dropped",
            "p50 ms",
            "p99 ms",
            "calls/slice"
        );
        for offered in [100u64, 1_000, 10_000] {
            let rate = offered.to_string();
            let modes: Vec<Mode> = [Mode::PerCall, Mode::Slices]
                .into_iter()
                .filter(|m| wanted(&rate) || wanted(m.name()))
                .collect();
            if modes.is_empty() {
                continue;
            }
            let limit = offered * 4 / 5;
            let mut results = Results::new(&format!("redis_slices_{offered}"))
                .number("offered_per_second", offered as f64)
                .number("limit_per_second", limit as f64);
            for mode in modes {
                let r = run(server.port, mode, offered).await;
                println!(
                    "{offered:>7} {:>8} {limit:>6} {:>9.0} {:>10.0} {:>10.3} {:>6} ({:>4.1}%) {:>6.3} {:>7} {:>9.1} {:>9.1} {:>10.1}{}",
                    mode.name(),
                    r.offered_per_second,
                    r.admitted_per_second,
                    r.fcall_per_call,
                    r.max_excess,
                    r.max_excess as f64 * 100.0 / limit as f64,
                    r.jain,
                    r.dropped,
                    r.p50_ms,
                    r.p99_ms,
                    r.calls_per_slice,
                    if r.errors > 0 {
                        format!(" ({} errors)", r.errors)
                    } else {
                        String::new()
                    }
                );
                let key = |k: &str| format!("{}_{k}", mode.name());
                results = results
                    .number(&key("arrived_per_second"), r.offered_per_second)
                    .number(&key("admitted_per_second"), r.admitted_per_second)
                    .number(&key("fcall_per_call"), r.fcall_per_call)
                    .number(&key("max_excess_calls"), r.max_excess as f64)
                    .number(
                        &key("max_excess_percent"),
                        r.max_excess as f64 * 100.0 / limit as f64,
                    )
                    .number(&key("jain"), r.jain)
                    .number(&key("dropped"), r.dropped as f64)
                    .number(&key("errors"), r.errors as f64)
                    .number(&key("p50_ms"), r.p50_ms)
                    .number(&key("p99_ms"), r.p99_ms);
                if mode == Mode::Slices {
                    results = results.number(&key("calls_per_slice"), r.calls_per_slice);
                }
            }
            all.push(results);
        }
        for results in all {
            match results.write() {
                Ok(path) => println!("wrote {}", path.display()),
                Err(error) => eprintln!("could not write results: {error}"),
            }
        }
    });
}
