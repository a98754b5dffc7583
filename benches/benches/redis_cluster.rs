//! Fleet leases of `admission-redis` on a private Redis Cluster (six `redis-server` nodes on
//! loopback: three masters, each with a replica) beside a private single server, with its own
//! harness (the parts are percentiles and rates, printed):
//!
//! 1. `acquire`: `try_acquire` on a cell of the cluster against the same on a cell of the single
//!    server, one call of each in turn (10,000 pairs, the order alternating; each release after
//!    is not timed), on one current-thread tokio runtime: p50 and p90 of each and the ratio of
//!    the p50s. The cluster client routes each call by the cell's slot to its master.
//! 2. `spread`: leases per second of 3 cells, each with a ceiling of 16 transfers and 2 provider
//!    instances x 16 tasks, 3,072 leases in all: run A names the cells so that their hash tags'
//!    slots fall on the three different masters, run B so that all three fall on one master
//!    (the three in turn over the B runs). The runs alternate A/B, eight of each; each prints
//!    leases per second, the script calls (`INFO commandstats`, `cmdstat_fcall`) each master
//!    served, and the CPU time each node, this process and the rest of the machine used while
//!    it ran (`/proc/PID/stat`, `/proc/stat`); then the medians and the median of the eight A/B
//!    ratios of neighbouring runs. Connecting and creating the cells is not timed.
//!
//! What a 2-core machine can show here: every node and the client share the machine's cores,
//! so spreading cells over three masters adds no CPU. It can show that the cluster routes each
//! cell to one master (the script calls per master), what the cluster client's routing costs
//! per call (part 1), and whether one master's single thread was the bottleneck of run B (if
//! it was, A is faster only by the idle CPU it finds). It cannot show the scaling that three
//! masters on machines (or cores) of their own give: that needs free cores per master.
//!
//! Run with `cargo bench -p admission-benches --bench redis_cluster` (needs `redis-server` and
//! `redis-cli` on PATH). Results are printed and written to
//! `target/side-by-side/redis_cluster_*.json`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use admission_benches::Results;
use admission_benches::redis_server::{RedisServer, ServerWork};
use admission_redis::{Ceilings, LeaseRequest, Outcome, RedisAdmission, RedisAdmissionConfig};
use admission_testkit::redis_servers::{self, ClusterNode, PrivateCluster};
use hdrhistogram::Histogram;

/// Pairs of `try_acquire` timed in part 1.
const PAIRS: usize = 10_000;
/// Part 2: cells, provider instances per cell, tasks per instance, leases per task.
const CELLS: usize = 3;
const INSTANCES: usize = 2;
const TASKS: usize = 16;
const PER_TASK: usize = 32;
/// Part 2: transfers each cell admits at once.
const TRANSFERS: u64 = 16;
/// Part 2: runs of each layout, alternating A and B.
const ROUNDS: usize = 8;

fn ceilings(transfers: u64) -> Ceilings {
    Ceilings {
        service_bytes: 1 << 40,
        service_transfers: transfers,
        tenant_bytes: 1 << 40,
        tenant_transfers: transfers,
        backend_transfers: transfers,
    }
}

/// A config for a new cell on the cluster.
fn cluster_config(seeds: &[(String, u16)], cell: &str, transfers: u64) -> RedisAdmissionConfig {
    let mut config =
        RedisAdmissionConfig::cluster(seeds.iter().cloned(), cell, ceilings(transfers));
    config.redis_wait = Duration::from_secs(20);
    // Each bench's cell name is new: nothing to recover.
    config.recover_created_cells = false;
    config
}

/// The private cluster (`admission_testkit::redis_servers`): six nodes of the `redis-server` on PATH,
/// three masters with a replica each, killed when dropped (also on a panic).
fn start_cluster() -> PrivateCluster {
    let binary = redis_servers::redis_server_on_path()
        .expect("redis-server on PATH (apt-get install redis-server)");
    PrivateCluster::start(&binary).expect("a private Redis Cluster (redis-cli on PATH too)")
}

/// The masters from `CLUSTER NODES`, by their first slot.
fn masters(cluster: &PrivateCluster) -> Vec<ClusterNode> {
    let nodes = cluster.view().expect("CLUSTER NODES");
    let mut masters: Vec<ClusterNode> = redis_servers::serving_masters(&nodes)
        .into_iter()
        .cloned()
        .collect();
    masters.sort_by_key(|m| m.slots.first().copied());
    assert_eq!(masters.len(), 3, "three masters: {masters:?}");
    masters
}

/// A plain (not cluster) connection to one node, for `INFO` and `CLUSTER KEYSLOT`.
fn node(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection())
        .expect("a connection to a node")
}

fn fcall_calls(conn: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    ServerWork::parse(&stats).calls(&ServerWork::default(), "fcall")
}

/// The key the cell's configuration lives under (`<key_prefix>:{<cell>}:cfg`, prefix
/// `admission`); checked against `RedisAdmission::keys()` once connected.
fn cfg_key(cell: &str) -> String {
    format!("admission:{{{cell}}}:cfg")
}

/// The index in `masters` of the master serving `key` (`CLUSTER KEYSLOT` on `conn`).
fn master_of(conn: &mut redis::Connection, masters: &[ClusterNode], key: &str) -> usize {
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(conn)
        .expect("CLUSTER KEYSLOT");
    masters
        .iter()
        .position(|m| m.serves(slot))
        .expect("a master serves every slot")
}

/// CPU time (user + system, all threads) of process `pid` in seconds, from `/proc/PID/stat`
/// (clock ticks of 1/100 s); 0 when unreadable.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// Seconds the whole machine's CPUs were busy (not idle or waiting for I/O) since boot, from
/// `/proc/stat` (clock ticks of 1/100 s); 0 when unreadable.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let busy: u64 = ticks
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    busy as f64 / 100.0
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Part 1: `try_acquire` on the cluster against the single server, in turn.
fn acquire(cluster: &PrivateCluster, masters: &[ClusterNode], single: &RedisServer) -> Results {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut single_config =
        RedisAdmissionConfig::new("127.0.0.1", single.port, "p50-single", ceilings(1_000));
    single_config.recover_created_cells = false;
    let (on_single, on_cluster) = runtime.block_on(async {
        (
            RedisAdmission::connect(single_config)
                .await
                .expect("connects to the single server"),
            RedisAdmission::connect(cluster_config(&cluster.seeds(), "p50-cluster", 1_000))
                .await
                .expect("connects to the cluster"),
        )
    });
    let key = cfg_key("p50-cluster");
    assert!(on_cluster.keys().contains(&key), "{:?}", on_cluster.keys());
    let master = masters[master_of(&mut node(cluster.ports()[0]), masters, &key)].port;
    let request = LeaseRequest::new("p50", "tenant", "disk", 1 << 20, "upload");
    let new_histogram =
        || Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let (mut single_h, mut cluster_h) = (new_histogram(), new_histogram());
    runtime.block_on(async {
        let one = |fleet: &RedisAdmission| {
            let fleet = fleet.clone();
            let request = request.clone();
            async move {
                let start = Instant::now();
                let lease = fleet.try_acquire(&request).await.expect("fits");
                let took = start.elapsed().as_nanos().max(1) as u64;
                lease.release(Outcome::Completed).await.expect("released");
                took
            }
        };
        // Warm both up (connections, the function library, the slot map) untimed.
        for _ in 0..200 {
            one(&on_single).await;
            one(&on_cluster).await;
        }
        for i in 0..PAIRS {
            if i % 2 == 0 {
                single_h.saturating_record(one(&on_single).await);
                cluster_h.saturating_record(one(&on_cluster).await);
            } else {
                cluster_h.saturating_record(one(&on_cluster).await);
                single_h.saturating_record(one(&on_single).await);
            }
        }
    });
    let ratio = micros(&cluster_h, 0.5) / micros(&single_h, 0.5);
    println!(
        "acquire ({PAIRS} interleaved pairs, one current-thread runtime): \
         single server p50 {:.1} us p90 {:.1} us; cluster (cell on master :{master}) \
         p50 {:.1} us p90 {:.1} us; p50 ratio cluster/single {ratio:.2}",
        micros(&single_h, 0.5),
        micros(&single_h, 0.9),
        micros(&cluster_h, 0.5),
        micros(&cluster_h, 0.9),
    );
    runtime.block_on(async move {
        drop(on_single);
        drop(on_cluster);
    });
    Results::new("redis_cluster_acquire")
        .number("single_p50_us", micros(&single_h, 0.5))
        .number("single_p90_us", micros(&single_h, 0.9))
        .number("cluster_p50_us", micros(&cluster_h, 0.5))
        .number("cluster_p90_us", micros(&cluster_h, 0.9))
        .number("p50_ratio", ratio)
}

/// Three new cell names for run `run`: on three different masters (`on_one = None`) or all on
/// master `on_one`.
fn cell_names(
    conn: &mut redis::Connection,
    masters: &[ClusterNode],
    run: &str,
    on_one: Option<usize>,
) -> Vec<(String, usize)> {
    let mut chosen: Vec<(String, usize)> = Vec::new();
    for k in 0.. {
        if chosen.len() == CELLS {
            break;
        }
        let name = format!("{run}-{k}");
        let m = master_of(conn, masters, &cfg_key(&name));
        let wanted = match on_one {
            Some(one) => m == one,
            None => chosen.iter().all(|(_, other)| *other != m),
        };
        if wanted {
            chosen.push((name, m));
        }
    }
    chosen
}

/// Connects part 2's provider instances to `cells` and warms each (the first call creates the
/// cell), untimed.
async fn connect_cells(seeds: &[(String, u16)], cells: &[(String, usize)]) -> Vec<RedisAdmission> {
    let mut fleets = Vec::new();
    for (name, _) in cells {
        for _ in 0..INSTANCES {
            let fleet = RedisAdmission::connect(cluster_config(seeds, name, TRANSFERS))
                .await
                .expect("connects to the cluster");
            assert!(fleet.keys().contains(&cfg_key(name)), "{:?}", fleet.keys());
            let lease = fleet
                .try_acquire(&LeaseRequest::new("warm", "tenant", "disk", 1, "upload"))
                .await
                .expect("fits");
            lease.release(Outcome::Completed).await.expect("released");
            fleets.push(fleet);
        }
    }
    fleets
}

/// One timed run of part 2: every instance's tasks take their leases; returns the seconds it
/// took and the peak occupancy a lease reported.
async fn spread_run(fleets: &[RedisAdmission]) -> (f64, u64) {
    let peak = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (f, fleet) in fleets.iter().enumerate() {
        for t in 0..TASKS {
            let (fleet, peak) = (fleet.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..PER_TASK {
                    let request =
                        LeaseRequest::new(format!("f{f}-t{t}-{i}"), "tenant", "disk", 1, "upload");
                    let lease = fleet
                        .acquire(&request, Duration::from_secs(20))
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
    (start.elapsed().as_secs_f64(), peak.load(Ordering::Relaxed))
}

/// Part 2: cells spread over the three masters (A) against all on one (B), alternating.
fn spread(cluster: &PrivateCluster, masters: &[ClusterNode]) -> Results {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let seeds = cluster.seeds();
    let mut keyslot = node(cluster.ports()[0]);
    let mut conns: Vec<redis::Connection> = masters.iter().map(|m| node(m.port)).collect();
    let leases = CELLS * INSTANCES * TASKS * PER_TASK;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "spread: {CELLS} cells x {INSTANCES} instances x {TASKS} tasks x {PER_TASK} leases = \
         {leases} leases a run, {TRANSFERS} transfers a cell, a 2-worker runtime; \
         masters {:?}",
        masters.iter().map(|m| m.port).collect::<Vec<_>>()
    );
    let pids: Vec<(u16, String)> = cluster
        .ports()
        .into_iter()
        .map(|p| (p, cluster.pid(p).expect("a running node").to_string()))
        .collect();
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut calls: [Vec<u64>; 2] = [vec![0; 3], vec![0; 3]];
    // Per layout: seconds timed, CPU seconds the whole machine was busy, CPU seconds of the
    // busiest master in each run, and CPU seconds of processes not this bench's.
    let mut busy: [(f64, f64, f64, f64); 2] = [(0.0, 0.0, 0.0, 0.0); 2];
    for round in 0..ROUNDS {
        for (layout, label) in [(0, "A"), (1, "B")] {
            let on_one = (layout == 1).then_some(round % 3);
            let run = format!("spread-{label}{round}");
            let cells = cell_names(&mut keyslot, masters, &run, on_one);
            let fleets = runtime.block_on(connect_cells(&seeds, &cells));
            let before: Vec<u64> = conns.iter_mut().map(fcall_calls).collect();
            let cpu_before: Vec<f64> = pids.iter().map(|(_, pid)| cpu_seconds(pid)).collect();
            let client_before = cpu_seconds("self");
            let machine_before = machine_busy_seconds();
            let (elapsed, peak) = runtime.block_on(spread_run(&fleets));
            let machine = machine_busy_seconds() - machine_before;
            let client_cpu = cpu_seconds("self") - client_before;
            let cpu: Vec<f64> = pids
                .iter()
                .zip(&cpu_before)
                .map(|((_, pid), b)| cpu_seconds(pid) - b)
                .collect();
            let per_master: Vec<u64> = conns
                .iter_mut()
                .zip(&before)
                .map(|(c, b)| fcall_calls(c) - b)
                .collect();
            runtime.block_on(async move { drop(fleets) });
            let rate = leases as f64 / elapsed;
            let others = (machine - client_cpu - cpu.iter().sum::<f64>()).max(0.0);
            assert!(peak <= TRANSFERS, "over the ceiling: {peak}");
            for (total, n) in calls[layout].iter_mut().zip(&per_master) {
                *total += n;
            }
            rates[layout].push(rate);
            let busiest_master = pids
                .iter()
                .zip(&cpu)
                .filter(|((p, _), _)| masters.iter().any(|m| m.port == *p))
                .map(|(_, c)| *c)
                .fold(0.0, f64::max);
            busy[layout].0 += elapsed;
            busy[layout].1 += machine;
            busy[layout].2 += busiest_master;
            busy[layout].3 += others;
            let node_cpu = pids
                .iter()
                .zip(&cpu)
                .map(|((p, _), c)| {
                    let role = if masters.iter().any(|m| m.port == *p) {
                        "m"
                    } else {
                        "r"
                    };
                    format!("{p}{role} {c:.2}")
                })
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "spread run {label}{round}: cells on masters {:?}: {rate:.0} leases/s; \
                 fcall per master {per_master:?} ({:.2} per lease); peak {peak} of {TRANSFERS}; \
                 CPU s over {elapsed:.2} s: client {client_cpu:.2}, nodes [{node_cpu}], \
                 other processes {others:.2}; the machine busy {:.0}% of {cores} cores",
                cells
                    .iter()
                    .map(|(_, m)| masters[*m].port)
                    .collect::<Vec<_>>(),
                per_master.iter().sum::<u64>() as f64 / leases as f64,
                100.0 * machine / (cores as f64 * elapsed),
            );
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let (a, b) = (median(&rates[0]), median(&rates[1]));
    let paired: Vec<f64> = rates[0].iter().zip(&rates[1]).map(|(a, b)| a / b).collect();
    println!(
        "spread: A (three masters) median {a:.0} leases/s {:.0?}; B (one master) median \
         {b:.0} leases/s {:.0?}; A/B of the medians {:.2}, median of the run-by-run A/B {:.2} \
         {paired:.2?}; fcall per master over all A runs {:?}, over all B runs {:?}",
        rates[0],
        rates[1],
        a / b,
        median(&paired),
        calls[0],
        calls[1]
    );
    let share = |cpu: f64, secs: f64| 100.0 * cpu / (cores as f64 * secs);
    println!(
        "spread: while timed, the machine was busy {:.0}% of its {cores} cores in A and {:.0}% \
         in B, of which processes not this bench's {:.0}% and {:.0}%; B's one master used {:.0}% \
         of a core (its one thread's limit is 100%). All nodes \
         and the client share these cores, so spreading adds no CPU: A can gain only the CPU \
         that B's one busy master leaves idle, and cannot show what three masters with cores \
         (or machines) of their own would give.",
        share(busy[0].1, busy[0].0),
        share(busy[1].1, busy[1].0),
        share(busy[0].3, busy[0].0),
        share(busy[1].3, busy[1].0),
        100.0 * busy[1].2 / busy[1].0,
    );
    Results::new("redis_cluster_spread")
        .number("three_masters_leases_per_second", a)
        .number("one_master_leases_per_second", b)
        .number("ratio", a / b)
        .number("paired_ratio_median", median(&paired))
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks one part.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |part: &str| filter.as_deref().is_none_or(|f| part.contains(f));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "redis_cluster: {cores} cores, load average {} at the start. Six cluster nodes (three \
         masters, three replicas applying their masters' writes), one single server and this \
         client all share these {cores} cores: spreading cells over three masters adds no CPU \
         here. What it can show: each cell's calls go to its one master, what routing costs a \
         call, and whether one master's thread was B's bottleneck; not the scaling of masters \
         with cores of their own.",
        load_average()
    );
    let started = Instant::now();
    let cluster = start_cluster();
    let single = RedisServer::start();
    let masters = masters(&cluster);
    println!(
        "cluster ready in {:.1} s: nodes {:?}, masters {:?}; single server :{}",
        started.elapsed().as_secs_f64(),
        cluster.ports(),
        masters
            .iter()
            .map(|m| (m.port, &m.slots))
            .collect::<Vec<_>>(),
        single.port
    );
    let mut all = Vec::new();
    if wanted("acquire") {
        all.push(acquire(&cluster, &masters, &single));
    }
    if wanted("spread") {
        all.push(spread(&cluster, &masters));
    }
    drop(single);
    drop(cluster);
    println!(
        "redis_cluster: done in {:.1} s, load average {} at the end",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    for results in all {
        match results.write() {
            Ok(path) => println!("wrote {}", path.display()),
            Err(error) => eprintln!("could not write results: {error}"),
        }
    }
}
