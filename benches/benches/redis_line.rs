//! The fleet line of `admission-redis` measured on private `redis-server`s (issue 14), with its
//! own harness (the parts are latencies and counts, not per-iteration times):
//!
//! 1. `wake`: a release on instance A to the waiter on instance B holding its lease, p50/p99
//!    over 200 hand-offs, beside the same release observed by a waiter polling `try_acquire`
//!    every 50 ms (the reference adapter's interval), 100 samples.
//! 2. `round_trips`: script calls (the server's `cmdstat_fcall`) per admitted lease, 2
//!    instances x 32 tasks x 16 leases on a ceiling of 8 transfers.
//! 3. `fairness`: a head needing the whole 10-byte ceiling while ten 1-byte holders leave one
//!    every 2 ms: its wait alone, with 8 tasks streaming 1-byte requests through the line beside
//!    it, and, for contrast, a head polling every 50 ms with the same stream (no ticket, so no
//!    reservation): median of 5 runs, capped at 2 s.
//! 4. `hundred_processes`: 100 provider instances (each its own connection and reader, as 100
//!    processes would have) x 4 tasks x 10 leases on one cell of 16 transfers: leases per
//!    second, script calls per lease, the highest occupancy any lease reported.
//! 5. `sharded`: 12 cells whose hash tags land on 3 shards by the Redis Cluster slot rule
//!    (CRC16 mod 16384, the slot ranges `redis-cli --cluster create` gives 3 masters), each shard
//!    a server of its own, against all 12 cells on one server: leases per second and script
//!    calls per shard.
//! 6. `instances`: the server's work per admitted lease (commands, their microseconds and the
//!    server's CPU, from `INFO commandstats` and `INFO cpu`) for 1, 4, 16 and 64 instances on one
//!    cell of 16 transfers, 3 s each: 4 tasks on each instance, then 64 tasks spread over them.
//!
//! Run with `cargo bench -p admission-benches --bench redis_line` (needs `redis-server` on PATH).
//! Results are printed and written to `target/side-by-side/redis_line_*.json`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use admission_benches::Results;
use admission_benches::redis_server::{RedisServer, ServerWork};
use admission_redis::{Ceilings, LeaseRequest, Outcome, RedisAdmission, RedisAdmissionConfig};
use hdrhistogram::Histogram;

fn config(port: u16, cell: &str, bytes: u64, transfers: u64) -> RedisAdmissionConfig {
    let ceilings = Ceilings {
        service_bytes: bytes,
        service_transfers: transfers,
        tenant_bytes: bytes,
        tenant_transfers: transfers,
        backend_transfers: transfers,
    };
    let mut config = RedisAdmissionConfig::new("127.0.0.1", port, cell, ceilings);
    config.redis_wait = Duration::from_secs(20);
    // Each bench's cell is new on a private server: nothing to recover.
    config.recover_created_cells = false;
    config
}

async fn connect(port: u16, cell: &str, bytes: u64, transfers: u64) -> RedisAdmission {
    RedisAdmission::connect(config(port, cell, bytes, transfers))
        .await
        .expect("connects")
}

fn request(id: String, bytes: u64) -> LeaseRequest {
    LeaseRequest::new(id, "tenant", "disk", bytes, "upload")
}

async fn fcall_calls(port: u16) -> u64 {
    let work = server_work(port).await;
    work.commands.get("fcall").map_or(0, |c| c.0)
}

fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64
}

/// Part 1: release on A, lease on B.
async fn wake(port: u16) -> Results {
    let a = connect(port, "wake", 100, 1).await;
    let b = connect(port, "wake", 100, 1).await;
    let mut line = Histogram::<u64>::new(3).expect("histogram");
    let mut polling = Histogram::<u64>::new(3).expect("histogram");
    for (round, samples) in [(0, 200), (1, 100)] {
        for i in 0..samples {
            let held = a
                .try_acquire(&request(format!("h{round}-{i}"), 1))
                .await
                .expect("fits");
            let b2 = b.clone();
            let id = format!("w{round}-{i}");
            let (tx, rx) = tokio::sync::oneshot::channel();
            let waiter = tokio::spawn(async move {
                let lease = if round == 0 {
                    b2.acquire(&request(id, 1), Duration::from_secs(5))
                        .await
                        .expect("handed off")
                } else {
                    loop {
                        match b2.try_acquire(&request(id.clone(), 1)).await {
                            Ok(lease) => break lease,
                            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                };
                let _ = tx.send(Instant::now());
                lease.release(Outcome::Completed).await.expect("released");
            });
            // Let the waiter queue (or start polling), then release and time the hand-over.
            tokio::time::sleep(Duration::from_millis(3 + (i % 7) as u64)).await;
            let start = Instant::now();
            held.release(Outcome::Completed).await.expect("released");
            let got = rx.await.expect("the waiter reports");
            let us = got.saturating_duration_since(start).as_micros() as u64;
            if round == 0 {
                line.record(us.max(1))
            } else {
                polling.record(us.max(1))
            }
            .expect("record");
            waiter.await.expect("waiter");
        }
    }
    println!(
        "wake: line p50 {:.0} us p99 {:.0} us; polling at 50 ms p50 {:.0} us p99 {:.0} us",
        micros(&line, 0.5),
        micros(&line, 0.99),
        micros(&polling, 0.5),
        micros(&polling, 0.99)
    );
    Results::new("redis_line_wake")
        .number("line_p50_us", micros(&line, 0.5))
        .number("line_p99_us", micros(&line, 0.99))
        .number("polling_p50_us", micros(&polling, 0.5))
        .number("polling_p99_us", micros(&polling, 0.99))
}

/// Part 2: script calls per admitted lease under contention.
async fn round_trips(port: u16) -> Results {
    let a = connect(port, "round-trips", 1 << 30, 8).await;
    let b = connect(port, "round-trips", 1 << 30, 8).await;
    let before = fcall_calls(port).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..64u64 {
        let fleet = if task % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            for i in 0..16 {
                let lease = fleet
                    .acquire(&request(format!("t{task}-{i}"), 1), Duration::from_secs(20))
                    .await
                    .expect("a lease");
                tokio::task::yield_now().await;
                lease.release(Outcome::Completed).await.expect("released");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = start.elapsed();
    let calls = fcall_calls(port).await - before;
    let leases = 64.0 * 16.0;
    let per = calls as f64 / leases;
    println!(
        "round trips: {calls} script calls for {leases} leases = {per:.2} per admitted job ({:.0} leases/s)",
        leases / elapsed.as_secs_f64()
    );
    Results::new("redis_line_round_trips")
        .number("script_calls_per_lease", per)
        .number("leases_per_second", leases / elapsed.as_secs_f64())
}

/// Part 3: the head's wait, alone, with followers in the line, and polling with followers.
async fn fairness(port: u16) -> Results {
    let mut medians = Vec::new();
    for (scenario, followers, head_polls) in [
        ("alone", false, false),
        ("with_followers", true, false),
        ("polling_head_with_followers", true, true),
    ] {
        let mut waits = Vec::new();
        for run in 0..5 {
            let cell = format!("fair-{scenario}-{run}");
            let a = connect(port, &cell, 10, 100).await;
            let b = connect(port, &cell, 10, 100).await;
            let mut holders = Vec::new();
            for i in 0..10 {
                holders.push(
                    a.try_acquire(&request(format!("hold{i}"), 1))
                        .await
                        .expect("fits"),
                );
            }
            let stop = Arc::new(AtomicBool::new(false));
            let mut stream = Vec::new();
            if followers {
                for f in 0..8 {
                    let (b, stop) = (b.clone(), stop.clone());
                    stream.push(tokio::spawn(async move {
                        let mut i = 0;
                        while !stop.load(Ordering::Relaxed) {
                            i += 1;
                            let id = format!("f{f}-{i}");
                            if let Ok(lease) =
                                b.acquire(&request(id, 1), Duration::from_millis(500)).await
                            {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                let _ = lease.release(Outcome::Completed).await;
                            }
                        }
                    }));
                }
            }
            let releaser = tokio::spawn(async move {
                for lease in holders {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    lease.release(Outcome::Completed).await.expect("released");
                }
            });
            let start = Instant::now();
            let head = if head_polls {
                let mut got = None;
                while start.elapsed() < Duration::from_secs(2) {
                    match a.try_acquire(&request("head".into(), 10)).await {
                        Ok(lease) => {
                            got = Some(lease);
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                got
            } else {
                a.acquire(&request("head".into(), 10), Duration::from_secs(2))
                    .await
                    .ok()
            };
            let waited = start.elapsed().min(Duration::from_secs(2));
            stop.store(true, Ordering::Relaxed);
            if let Some(head) = head {
                head.release(Outcome::Completed).await.expect("released");
            }
            releaser.await.expect("releaser");
            for task in stream {
                task.await.expect("follower");
            }
            waits.push(waited.as_secs_f64() * 1e3);
        }
        waits.sort_by(f64::total_cmp);
        let median = waits[waits.len() / 2];
        println!("fairness: head's wait {scenario}: median {median:.1} ms (runs: {waits:.1?})");
        medians.push((scenario, median));
    }
    medians
        .into_iter()
        .fold(Results::new("redis_line_fairness"), |r, (k, v)| {
            r.number(&format!("{k}_ms"), v)
        })
}

/// Part 4: 100 instances on one cell.
async fn hundred(port: u16) -> Results {
    let mut fleet = Vec::new();
    for _ in 0..100 {
        fleet.push(connect(port, "hundred", 1 << 30, 16).await);
    }
    let peak = Arc::new(AtomicU64::new(0));
    let before = fcall_calls(port).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (p, instance) in fleet.iter().enumerate() {
        for t in 0..4 {
            let (instance, peak) = (instance.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..10 {
                    let lease = instance
                        .acquire(
                            &request(format!("p{p}-t{t}-{i}"), 1),
                            Duration::from_secs(20),
                        )
                        .await
                        .expect("a lease");
                    peak.fetch_max(lease.occupancy().service_transfers, Ordering::Relaxed);
                    lease.release(Outcome::Completed).await.expect("released");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let calls = fcall_calls(port).await - before;
    let leases = 100.0 * 4.0 * 10.0;
    let peak = peak.load(Ordering::Relaxed);
    println!(
        "100 processes: {leases} leases in {elapsed:.2} s = {:.0}/s, {:.2} script calls per lease, peak {peak} of 16 transfers",
        leases / elapsed,
        calls as f64 / leases
    );
    assert!(peak <= 16, "over the ceiling");
    Results::new("redis_line_hundred")
        .number("leases_per_second", leases / elapsed)
        .number("script_calls_per_lease", calls as f64 / leases)
        .number("peak_transfers", peak as f64)
}

/// What the server did so far (`INFO commandstats` and `INFO cpu`).
async fn server_work(port: u16) -> ServerWork {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .expect("info");
    ServerWork::parse(&info)
}

/// Part 6: the server's work per admitted lease as the fleet grows: 1, 4, 16 and 64 instances
/// (each its own connections and reader, as as many processes would have) acquiring and
/// releasing on one cell of 16 transfers for 3 s; `per_instance` tasks on each (4: the line forms
/// only past 4 instances), or 64 tasks spread over them (`per_instance` 0: a line at every size,
/// so only the number of instances changes).
async fn instances(port: u16, per_instance: usize) -> Results {
    let series = if per_instance == 0 {
        "64 tasks"
    } else {
        "4 tasks each"
    };
    let mut results = Results::new(if per_instance == 0 {
        "redis_line_instances_64_tasks"
    } else {
        "redis_line_instances"
    });
    for n in [1usize, 4, 16, 64] {
        let cell = format!("instances-{n}-{per_instance}");
        let tasks_each = if per_instance == 0 {
            64 / n
        } else {
            per_instance
        };
        let mut fleet = Vec::new();
        for _ in 0..n {
            fleet.push(connect(port, &cell, 1 << 30, 16).await);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let leases = Arc::new(AtomicU64::new(0));
        let peak = Arc::new(AtomicU64::new(0));
        let before = server_work(port).await;
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (p, instance) in fleet.iter().enumerate() {
            for t in 0..tasks_each {
                let (instance, stop, leases, peak) =
                    (instance.clone(), stop.clone(), leases.clone(), peak.clone());
                tasks.push(tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let lease = instance
                            .acquire(
                                &request(format!("p{p}-t{t}-{i}"), 1),
                                Duration::from_secs(20),
                            )
                            .await
                            .expect("a lease");
                        peak.fetch_max(lease.occupancy().service_transfers, Ordering::Relaxed);
                        lease.release(Outcome::Completed).await.expect("released");
                        leases.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.expect("task");
        }
        let elapsed = start.elapsed().as_secs_f64();
        let after = server_work(port).await;
        drop(fleet);
        let leases = leases.load(Ordering::Relaxed) as f64;
        let (commands, usec) = after.total(&before);
        let per = |x: f64| x / leases;
        let fcall = per(after.calls(&before, "fcall") as f64);
        let xread = per(after.calls(&before, "xread") as f64);
        let cpu_us = per((after.cpu_s - before.cpu_s) * 1e6);
        let peak = peak.load(Ordering::Relaxed);
        println!(
            "instances ({series}) {n:>2}: {:.0} leases/s; per lease: {:.2} commands ({fcall:.2} FCALL, {xread:.2} XREAD), {:.0} us in commands, {cpu_us:.0} us server CPU; peak {peak} of 16",
            leases / elapsed,
            per(commands as f64),
            per(usec as f64),
        );
        assert!(peak <= 16, "over the ceiling");
        results = results
            .number(&format!("n{n}_leases_per_second"), leases / elapsed)
            .number(&format!("n{n}_commands_per_lease"), per(commands as f64))
            .number(&format!("n{n}_fcall_per_lease"), fcall)
            .number(&format!("n{n}_xread_per_lease"), xread)
            .number(&format!("n{n}_command_us_per_lease"), per(usec as f64))
            .number(&format!("n{n}_cpu_us_per_lease"), cpu_us);
    }
    results
}

/// CRC16/XMODEM, the Redis Cluster key-slot hash.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Part 5: cells sharded by hash tag.
async fn sharded(shards: &[RedisServer]) -> Results {
    let cells: Vec<String> = (0..12).map(|i| format!("cell-{i}")).collect();
    // The three masters' slot ranges of `redis-cli --cluster create`.
    let shard_of = |cell: &str| match crc16(cell.as_bytes()) % 16384 {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    };
    let mut results = Results::new("redis_line_sharded");
    for (layout, spread) in [("one_shard", false), ("three_shards", true)] {
        let ports: Vec<u16> = cells
            .iter()
            .map(|c| shards[if spread { shard_of(c) } else { 0 }].port)
            .collect();
        let mut before = Vec::new();
        for s in shards {
            before.push(fcall_calls(s.port).await);
        }
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (cell, port) in cells.iter().zip(&ports) {
            let name = format!("{layout}-{cell}");
            let a = connect(*port, &name, 1 << 30, 4).await;
            let b = connect(*port, &name, 1 << 30, 4).await;
            for t in 0..8 {
                let fleet = if t % 2 == 0 { a.clone() } else { b.clone() };
                tasks.push(tokio::spawn(async move {
                    for i in 0..10 {
                        let lease = fleet
                            .acquire(&request(format!("t{t}-{i}"), 1), Duration::from_secs(20))
                            .await
                            .expect("a lease");
                        lease.release(Outcome::Completed).await.expect("released");
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("task");
        }
        let elapsed = start.elapsed().as_secs_f64();
        let leases = 12.0 * 8.0 * 10.0;
        let mut per_shard = Vec::new();
        for (s, b) in shards.iter().zip(&before) {
            per_shard.push(fcall_calls(s.port).await - b);
        }
        println!(
            "sharded ({layout}): {leases} leases on 12 cells in {elapsed:.2} s = {:.0}/s; script calls per shard {per_shard:?}; cells per shard {:?}",
            leases / elapsed,
            (0..3)
                .map(|s| cells
                    .iter()
                    .filter(|c| (if spread { shard_of(c) } else { 0 }) == s)
                    .count())
                .collect::<Vec<_>>()
        );
        results = results.number(&format!("{layout}_leases_per_second"), leases / elapsed);
    }
    results
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks one part.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |part: &str| filter.as_deref().is_none_or(|f| part.contains(f));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    let shards = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    runtime.block_on(async {
        let mut all = Vec::new();
        if wanted("wake") {
            all.push(wake(server.port).await);
        }
        if wanted("round_trips") {
            all.push(round_trips(server.port).await);
        }
        if wanted("fairness") {
            all.push(fairness(server.port).await);
        }
        if wanted("hundred") {
            all.push(hundred(server.port).await);
        }
        if wanted("sharded") {
            all.push(sharded(&shards).await);
        }
        if wanted("instances") {
            all.push(instances(server.port, 4).await);
            all.push(instances(server.port, 0).await);
        }
        for results in all {
            match results.write() {
                Ok(path) => println!("wrote {}", path.display()),
                Err(error) => eprintln!("could not write results: {error}"),
            }
        }
    });
}
