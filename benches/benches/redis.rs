//! Criterion benches of a fleet lease (`admission-redis`) on a private `redis-server` this bench
//! starts on a free loopback port (issue 13):
//!
//! - `redis_acquire/lease_acquire`: `try_acquire` of a lease that fits (one function call; the
//!   release after each is not timed), against `redis_acquire/fcall_same_size`: one `FCALL` of
//!   a function library padded to the same byte length as the lease library, with the same
//!   eight keys and ten arguments, reading `TIME` and returning ten strings, on a connection
//!   built the same way. Acquire is one round trip; the ratio is what the lease function's work
//!   adds to it. After criterion's rows, `redis_acquire/interleaved` times the two in turn, and
//!   `redis_acquire/rated_interleaved` a lease on a cell with rates against one without.
//! - `redis_release/lease_release`: `release` of a held lease (the acquire before it untimed).
//! - `redis_throughput/two_instances_x32`: 1,024 leases acquired and released by 2 provider
//!   instances x 32 tasks, with a ceiling of 16 transfers so that tasks wait for each other;
//!   criterion's throughput is leases per second.
//!
//! Both sides run on one current-thread tokio runtime (the client's one core; the server has
//! the other), so neither pays a hand-over between threads per request.
//!
//! Run with `cargo bench -p admission-benches --bench redis` (needs `redis-server` on PATH).

use std::time::{Duration, Instant};

use admission_benches::redis_server::RedisServer;
use admission_redis::{Ceilings, LeaseRequest, Outcome, RedisAdmission, RedisAdmissionConfig};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// 64 hex digits, as a hashed tenant or backend id is.
const TENANT: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const BACKEND: &str = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";

fn config(port: u16, cell: &str, transfers: u64) -> RedisAdmissionConfig {
    let ceilings = Ceilings {
        service_bytes: 1 << 40,
        service_transfers: transfers,
        tenant_bytes: 1 << 40,
        tenant_transfers: transfers,
        backend_transfers: transfers,
    };
    let mut config = RedisAdmissionConfig::new("127.0.0.1", port, cell, ceilings);
    // Each bench's cell is new on a private server: nothing to recover.
    config.recover_created_cells = false;
    config
}

/// The peer function library's name (and its one function's).
const PEER: &str = "bench_peer";

/// A function library of the lease library's byte length whose one function reads the
/// server's clock and returns ten strings, as an admitted acquire does.
fn same_size_library() -> String {
    let body = format!(
        "#!lua name={PEER}\n\
         redis.register_function('{PEER}', function(keys, args)\n\
         local t = redis.call('TIME')\n\
         return {{'OK', t[1], t[2], args[2], args[3], args[4], args[5], args[6], args[7], args[8]}}\n\
         end)\n"
    );
    let target = admission_redis::script_source().len();
    let mut code = body;
    while code.len() < target {
        let line =
            "-- padding to the lease library's length so both cost the same to load and keep\n";
        code.push_str(&line[..line.len().min(target - code.len())]);
    }
    assert_eq!(code.len(), target);
    code
}

/// One call of the peer function: the lease function's eight keys and ten arguments.
async fn peer_call(manager: &redis::aio::ConnectionManager) {
    let mut call = redis::cmd("FCALL");
    call.arg(PEER).arg(8);
    for k in [
        "cfg", "occ", "exp", "events", "quota", "line", "live", "fair",
    ] {
        call.arg(format!("peer:{{bench}}:{k}"));
    }
    call.arg("acquire")
        .arg("fingerprint-0000")
        .arg("bench-lease");
    call.arg(TENANT).arg(BACKEND).arg(1 << 20);
    call.arg("upload").arg(10_000).arg(64).arg(0);
    let mut conn = manager.clone();
    let reply: Vec<String> = call.query_async(&mut conn).await.expect("fcall");
    assert_eq!(reply.len(), 10);
}

/// The two rows of `redis_acquire` again, one call of each in turn (20,000 pairs), so that a
/// machine whose speed drifts between criterion's two runs slows both sides alike: prints the
/// p50 and p90 of each and the ratio of the p50s (what BENCHMARKS.md's goal is stated in).
fn interleaved(
    runtime: &tokio::runtime::Runtime,
    fleet: &RedisAdmission,
    request: &LeaseRequest,
    manager: &redis::aio::ConnectionManager,
) {
    const PAIRS: usize = 20_000;
    let mut acquire =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let mut peer =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    runtime.block_on(async {
        for _ in 0..PAIRS {
            let start = Instant::now();
            let lease = fleet.try_acquire(request).await.expect("fits");
            acquire.saturating_record(start.elapsed().as_nanos().max(1) as u64);
            lease.release(Outcome::Completed).await.expect("released");
            let start = Instant::now();
            peer_call(manager).await;
            peer.saturating_record(start.elapsed().as_nanos().max(1) as u64);
        }
    });
    let us = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "redis_acquire/interleaved ({PAIRS} pairs): try_acquire p50 {:.1} us p90 {:.1} us; \
         one FCALL of the same size p50 {:.1} us p90 {:.1} us; p50 ratio {:.2}",
        us(&acquire, 0.5),
        us(&acquire, 0.9),
        us(&peer, 0.5),
        us(&peer, 0.9),
        us(&acquire, 0.5) / us(&peer, 0.5),
    );
}

/// A lease on a cell with rates (budgets far above what the run spends, so every acquire is
/// granted) against one on a cell without, in turn (20,000 pairs): what charging the rates in
/// the same call costs (issue 24's goal: p50 within 1.2x).
fn rated_interleaved(runtime: &tokio::runtime::Runtime, port: u16) {
    const PAIRS: usize = 20_000;
    let (plain, rated) = runtime.block_on(async {
        let plain = RedisAdmission::connect(config(port, "bench-unrated", 1_000))
            .await
            .expect("connects");
        let mut rated_config = config(port, "bench-rated", 1_000);
        rated_config.rates = Some(admission_redis::Rates::per_minute(1 << 50, 1 << 50));
        let rated = RedisAdmission::connect(rated_config)
            .await
            .expect("connects");
        (plain, rated)
    });
    let request = LeaseRequest::new("bench-lease", "tenant", "disk", 1 << 20, "upload");
    let histogram = || {
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
    };
    let (mut without, mut with) = (histogram(), histogram());
    runtime.block_on(async {
        for _ in 0..PAIRS {
            for (fleet, h) in [(&plain, &mut without), (&rated, &mut with)] {
                let start = Instant::now();
                let lease = fleet.try_acquire(&request).await.expect("fits");
                h.saturating_record(start.elapsed().as_nanos().max(1) as u64);
                lease.release(Outcome::Completed).await.expect("released");
            }
        }
    });
    let us = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "redis_acquire/rated_interleaved ({PAIRS} pairs): with rates p50 {:.1} us p90 {:.1} us; \
         without p50 {:.1} us p90 {:.1} us; p50 ratio {:.2}",
        us(&with, 0.5),
        us(&with, 0.9),
        us(&without, 0.5),
        us(&without, 0.9),
        us(&with, 0.5) / us(&without, 0.5),
    );
}

fn benches(c: &mut Criterion) {
    let server = RedisServer::start();
    // One thread for the client side, so that neither side pays a hand-over between the
    // thread that awaits and the thread that drives the socket; the server has the other core.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fleet = runtime
        .block_on(RedisAdmission::connect(config(server.port, "bench", 1_000)))
        .expect("connects");
    let request = LeaseRequest::new("bench-lease", "tenant", "disk", 1 << 20, "upload");

    let mut group = c.benchmark_group("redis_acquire");
    group.bench_function("lease_acquire", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let lease = fleet.try_acquire(&request).await.expect("fits");
                    timed += start.elapsed();
                    lease.release(Outcome::Completed).await.expect("released");
                }
                timed
            })
        })
    });
    let manager = runtime.block_on(async {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).expect("client");
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(1)));
        let mut manager = redis::aio::ConnectionManager::new_with_config(client, config)
            .await
            .expect("manager");
        let loaded: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(same_size_library())
            .query_async(&mut manager)
            .await
            .expect("loads the peer library");
        assert_eq!(loaded, PEER);
        manager
    });
    group.bench_function("fcall_same_size", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    peer_call(&manager).await;
                }
                start.elapsed()
            })
        })
    });
    group.finish();
    interleaved(&runtime, &fleet, &request, &manager);
    rated_interleaved(&runtime, server.port);

    let mut group = c.benchmark_group("redis_release");
    group.bench_function("lease_release", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let lease = fleet.try_acquire(&request).await.expect("fits");
                    let start = Instant::now();
                    lease.release(Outcome::Completed).await.expect("released");
                    timed += start.elapsed();
                }
                timed
            })
        })
    });
    group.finish();

    const TASKS: u64 = 32;
    const PER_TASK: u64 = 16;
    let a = runtime
        .block_on(RedisAdmission::connect(config(
            server.port,
            "throughput",
            16,
        )))
        .expect("connects");
    let b2 = runtime
        .block_on(RedisAdmission::connect(config(
            server.port,
            "throughput",
            16,
        )))
        .expect("connects");
    let mut group = c.benchmark_group("redis_throughput");
    group.throughput(Throughput::Elements(2 * TASKS * PER_TASK));
    group.sample_size(20);
    group.bench_function("two_instances_x32", |bench| {
        bench.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for round in 0..iters {
                    let mut tasks = Vec::new();
                    for task in 0..2 * TASKS {
                        let fleet = if task % 2 == 0 { a.clone() } else { b2.clone() };
                        tasks.push(tokio::spawn(async move {
                            for i in 0..PER_TASK {
                                let id = format!("r{round}-t{task}-{i}");
                                let request = LeaseRequest::new(id, "tenant", "disk", 1, "upload");
                                let lease = fleet
                                    .acquire(&request, Duration::from_secs(5))
                                    .await
                                    .expect("a lease");
                                lease.release(Outcome::Completed).await.expect("released");
                            }
                        }));
                    }
                    for task in tasks {
                        task.await.expect("task");
                    }
                }
                start.elapsed()
            })
        })
    });
    group.finish();
    drop(server);
}

criterion_group!(redis_benches, benches);
criterion_main!(redis_benches);
