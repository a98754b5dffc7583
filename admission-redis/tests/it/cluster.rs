//! The fleet on a real Redis Cluster: six `redis-server` nodes on loopback, three masters and
//! three replicas. The shared cluster `cargo xtask ci` starts (`ADMISSION_REDIS_CLUSTER`: its
//! nodes, comma separated) carries the tests that change nothing in it; the failover test kills
//! a master, so it starts a cluster of its own (`admission_testkit::redis_servers::PrivateCluster`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use admission_redis::{
    AcquireError, Ceilings, Durability, LeaseRequest, Outcome, RedisAdmission,
    RedisAdmissionConfig, read_events,
};
use admission_testkit::redis_servers::{PrivateCluster, cluster_ok, keyslot, master_of, query};
use parking_lot::Mutex;

use crate::support::{ceilings, cell, redis_server_binary};

/// The nodes of the cluster `cargo xtask ci` started.
fn shared_cluster(test: &str) -> Vec<(String, u16)> {
    admission_testkit::services::redis_cluster(test)
}

/// The tests' usual config (`support::config`), on the cluster of `nodes`.
fn cluster_config(nodes: &[(String, u16)], cell: &str, ceilings: Ceilings) -> RedisAdmissionConfig {
    let (host, port) = &nodes[0];
    let mut config = crate::support::config(host, *port, cell, ceilings);
    config.cluster_nodes = nodes.to_vec();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_spread_over_the_three_masters_and_each_keeps_its_keys_on_one() {
    let nodes = shared_cluster("cluster_spread");
    let port = nodes[0].1;
    let mut masters = BTreeMap::<u16, usize>::new();
    // Cell names are fresh each run, so which master a cell lands on is chance: twelve cells
    // miss one of three masters about once in forty runs. So cells are made until every
    // master holds one (at least twelve, at most 64: a master still missed by then about once
    // in 10^10 runs), each checked as it is made.
    for i in 0..64 {
        if i >= 12 && masters.len() == 3 {
            break;
        }
        let name = cell(&format!("cluster_spread_{i}"));
        let fleet =
            RedisAdmission::connect(cluster_config(&nodes, &name, ceilings(100, 4, 100, 4, 4)))
                .await
                .expect("connects to the cluster");
        let lease = fleet
            .try_acquire(&LeaseRequest::new("job", "t", "d", 10, "upload"))
            .await
            .expect("fits");
        assert_eq!(lease.occupancy().service_transfers, 1);
        lease.release(Outcome::Completed).await.expect("released");
        // Every key of the cell is in one slot, so on one master.
        let keys = fleet.keys();
        let slots: BTreeSet<u16> = keys
            .iter()
            .map(|key| keyslot(port, key).expect("a slot"))
            .collect();
        assert_eq!(slots.len(), 1, "{keys:?}");
        let master = master_of(port, &keys[0]).expect("a master");
        // The cell's records are on that master: its events stream holds both transitions.
        let length: Option<u64> = query(master, redis::cmd("XLEN").arg(&keys[3]));
        assert_eq!(length, Some(2), "events of {name} on {master}");
        *masters.entry(master).or_default() += 1;
    }
    assert_eq!(masters.len(), 3, "cells by master: {masters:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_cluster_is_woken_by_the_reader_on_its_cells_node() {
    let nodes = shared_cluster("cluster_wake");
    let config = cluster_config(&nodes, &cell("cluster_wake"), ceilings(100, 1, 100, 1, 1));
    let a = RedisAdmission::connect(config.clone())
        .await
        .expect("connects");
    let b = RedisAdmission::connect(config).await.expect("connects");
    let held = a
        .try_acquire(&LeaseRequest::new("first", "t", "d", 1, "upload"))
        .await
        .expect("fits");
    let waiter = tokio::spawn(async move {
        b.acquire(
            &LeaseRequest::new("second", "t", "d", 1, "upload"),
            Duration::from_secs(20),
        )
        .await
    });
    // The waiter's ticket is in the line before the release (a blocking read on the master
    // that serves the cell).
    let master = master_of(nodes[0].1, &a.keys()[0]).expect("a master");
    crate::support::wait_for_event(&a, "127.0.0.1", master, "queued", "second").await;
    held.release(Outcome::Completed).await.expect("released");
    let lease = waiter
        .await
        .expect("task")
        .expect("granted by the hand-off");
    assert_eq!(lease.id(), "second");
    let events = read_events(&a).await.expect("events");
    let handoff = events
        .iter()
        .find(|e| e.kind == "admitted" && e.lease == "second")
        .expect("admitted");
    assert_eq!(handoff.outcome, "handoff");
    lease.release(Outcome::Completed).await.expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_closed_then_resumes_with_no_ceiling_exceeded() {
    const CEILING: usize = 8;
    let binary = redis_server_binary("cluster_failover");
    // A cluster of this test's own: it kills a master. A replica takes over about 2 s later
    // (`--cluster-node-timeout 1000`).
    let mut cluster = PrivateCluster::start(&binary).expect("starts a private cluster");
    let nodes = cluster.seeds();
    let name = cell("cluster_failover");
    let config = cluster_config(
        &nodes,
        &name,
        ceilings(
            1 << 20,
            CEILING as u64,
            1 << 20,
            CEILING as u64,
            CEILING as u64,
        ),
    );
    let instances = [
        RedisAdmission::connect(config.clone())
            .await
            .expect("connects"),
        RedisAdmission::connect(config.clone())
            .await
            .expect("connects"),
    ];
    let key = instances[0].keys()[0].clone();
    let master = master_of(nodes[0].1, &key).expect("a master");

    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // (when granted, token), in the order the jobs saw their grants.
    let grants = Arc::new(Mutex::new(Vec::<(Instant, u64)>::new()));
    let mut jobs = Vec::new();
    for task in 0..32 {
        let fleet = instances[task % 2].clone();
        let (running, most, unavailable, lost, stop, grants) = (
            running.clone(),
            most.clone(),
            unavailable.clone(),
            lost.clone(),
            stop.clone(),
            grants.clone(),
        );
        jobs.push(tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::SeqCst) {
                round += 1;
                let request = LeaseRequest::new(format!("job-{task}-{round}"), "t", "d", 1, "run");
                let lease = match fleet.acquire(&request, Duration::from_secs(2)).await {
                    Ok(lease) => lease,
                    // Failed closed during the election (the cluster down, the master gone).
                    Err(AcquireError::Unavailable(_)) => {
                        unavailable.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    // Full, or the new master's recovery.
                    Err(_) => continue,
                };
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                grants.lock().push((Instant::now(), lease.token().0));
                let was_lost = tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => false,
                    _ = lease.lost() => true,
                };
                running.fetch_sub(1, Ordering::SeqCst);
                if was_lost {
                    lost.fetch_add(1, Ordering::SeqCst);
                } else {
                    let _ = lease.release(Outcome::Completed).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = Instant::now();
    assert!(cluster.kill(master), "the master on {master} runs");
    // The replica takes over (about 2 s), the cell recovers (one TTL, 3 s), and jobs run again.
    let survivor = nodes.iter().map(|n| n.1).find(|p| *p != master).unwrap();
    tokio::task::spawn_blocking({
        let started = Instant::now();
        let key = key.clone();
        move || {
            while master_of(survivor, &key).is_none_or(|now| now == master) || !cluster_ok(survivor)
            {
                assert!(started.elapsed() < Duration::from_secs(30), "no failover");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    })
    .await
    .expect("failover");
    let elected_after = killed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::SeqCst);
    for job in jobs {
        job.await.expect("job");
    }

    // Never more running than the ceiling, by an outside count.
    assert!(
        most.load(Ordering::SeqCst) <= CEILING,
        "{}",
        most.load(Ordering::SeqCst)
    );
    let grants = grants.lock().clone();
    let before: Vec<u64> = grants
        .iter()
        .filter(|(at, _)| *at < killed_at)
        .map(|g| g.1)
        .collect();
    let after: Vec<u64> = grants
        .iter()
        .filter(|(at, _)| *at > killed_at)
        .map(|g| g.1)
        .collect();
    assert!(
        !before.is_empty() && !after.is_empty(),
        "{} before, {} after",
        before.len(),
        after.len()
    );
    // Tokens never go back: every grant after the failover has a greater token than every
    // grant before it, and no token was issued twice.
    let highest_before = before.iter().max().copied().unwrap();
    assert!(after.iter().all(|t| *t > highest_before));
    let distinct: BTreeSet<u64> = grants.iter().map(|g| g.1).collect();
    assert_eq!(distinct.len(), grants.len());
    // Nothing is left held on the new master.
    let fleet = RedisAdmission::connect(config).await.expect("connects");
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 0);
    // The promoted replica may have missed the old master's last writes (no promise of replicas
    // here): the cell recovered on it (one TTL, 3 s, from its first call after the promotion)
    // before it admitted anything.
    let events = read_events(&fleet).await.expect("events");
    let at = events
        .iter()
        .rposition(|e| e.kind == "recovering")
        .expect("the cell recovered on the new master");
    assert_eq!(events[at].outcome, "promoted");
    let admitted: Vec<u64> = events[at..]
        .iter()
        .filter(|e| e.kind == "admitted")
        .map(|e| e.time_ms)
        .collect();
    assert!(!admitted.is_empty());
    assert!(admitted.iter().all(|t| *t >= events[at].time_ms + 3_000));
    let first_after = grants
        .iter()
        .filter(|(at, _)| *at > killed_at)
        .map(|(at, _)| *at - killed_at)
        .min()
        .unwrap();
    eprintln!(
        "cluster_failover: new master after {elected_after:?}; first grant {first_after:?} after the kill; {} acquisitions unavailable; {} lost; most running {} of {CEILING}; {} grants before, {} after",
        unavailable.load(Ordering::SeqCst),
        lost.load(Ordering::SeqCst),
        most.load(Ordering::SeqCst),
        before.len(),
        after.len()
    );
}

/// A planned move of the cell's slot: a manual failover to the master's replica (`CLUSTER
/// FAILOVER`, no `FORCE`), or a migration to another master (`CLUSTER SETSLOT` and `MIGRATE`, as
/// `redis-cli --cluster reshard` does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    Failover,
    Migrate,
}

/// What the jobs saw through a planned move.
struct Moved {
    events: Vec<admission_redis::FleetEvent>,
    /// Events since the move.
    since: Vec<admission_redis::FleetEvent>,
    most: usize,
    failed: usize,
    first_grant_after: Option<Duration>,
    grants_before: Vec<u64>,
    grants_after: Vec<u64>,
}

/// Sixteen jobs on two instances of one cell of eight transfers on a private cluster, each
/// asking with a wait of 5 s and holding its lease 200 ms; 1.5 s in, the cell's slot moves as
/// `how` says; the jobs run 3 s more.
async fn through_a_planned_move(test: &str, how: Move, durability: Durability) -> Moved {
    const CEILING: usize = 8;
    let binary = redis_server_binary(test);
    let cluster = PrivateCluster::start(&binary).expect("starts a private cluster");
    let nodes = cluster.seeds();
    let mut config = cluster_config(
        &nodes,
        &cell(test),
        ceilings(
            1 << 20,
            CEILING as u64,
            1 << 20,
            CEILING as u64,
            CEILING as u64,
        ),
    );
    config.durability = durability;
    config.recover_created_cells = true;
    // Every node has run longer than a TTL: a new cell lost nothing, and a move's target is no
    // young process that may have restarted empty.
    for (_, port) in &nodes {
        loop {
            let info: String = query(*port, redis::cmd("INFO").arg("server")).expect("INFO");
            let up: u64 = admission_testkit::redis_servers::info_field(&info, "uptime_in_seconds")
                .and_then(|u| u.parse().ok())
                .expect("uptime");
            if Duration::from_secs(up) > config.lease_ttl {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let instances = [
        RedisAdmission::connect(config.clone())
            .await
            .expect("connects"),
        RedisAdmission::connect(config.clone())
            .await
            .expect("connects"),
    ];
    let key = instances[0].keys()[0].clone();
    let seed = nodes[0].1;
    let master = master_of(seed, &key).expect("a master");
    let slot = keyslot(seed, &key).expect("a slot");

    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(Mutex::new(Vec::<(Instant, u64)>::new()));
    let mut jobs = Vec::new();
    for task in 0..16 {
        let fleet = instances[task % 2].clone();
        let (running, most, failed, stop, grants) = (
            running.clone(),
            most.clone(),
            failed.clone(),
            stop.clone(),
            grants.clone(),
        );
        jobs.push(tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::SeqCst) {
                round += 1;
                let request = LeaseRequest::new(format!("job-{task}-{round}"), "t", "d", 1, "run");
                let lease = match fleet.acquire(&request, Duration::from_secs(5)).await {
                    Ok(lease) => lease,
                    Err(error) => {
                        eprintln!("{task}: {error}");
                        failed.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                };
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                grants.lock().push((Instant::now(), lease.token().0));
                tokio::time::sleep(Duration::from_millis(200)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                let _ = lease.release(Outcome::Completed).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let text: String = query(master, redis::cmd("CLUSTER").arg("NODES")).expect("nodes");
    let id_of = |port: u16| {
        text.lines()
            .find(|line| {
                line.split_whitespace()
                    .nth(1)
                    .is_some_and(|a| a.contains(&format!(":{port}@")))
            })
            .and_then(|line| line.split_whitespace().next())
            .expect("a node id")
            .to_owned()
    };
    let master_id = id_of(master);
    let moved_from = std::time::SystemTime::now();
    let moved_at = match how {
        Move::Failover => {
            let replica: u16 = text
                .lines()
                .map(|line| line.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.len() > 3 && f[2].contains("slave") && f[3] == master_id)
                .and_then(|f| f[1].split(['@', ':']).nth(1)?.parse().ok())
                .expect("the master's replica");
            let ok: String =
                query(replica, redis::cmd("CLUSTER").arg("FAILOVER")).expect("FAILOVER");
            assert_eq!(ok, "OK");
            let started = Instant::now();
            while master_of(replica, &key) != Some(replica) {
                assert!(started.elapsed() < Duration::from_secs(10), "no failover");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Instant::now()
        }
        Move::Migrate => {
            let nodes_now = admission_testkit::redis_servers::parse_nodes(&text);
            let target = nodes_now
                .iter()
                .find(|n| n.master && n.port != master && !n.slots.is_empty())
                .expect("another master")
                .port;
            let target_id = id_of(target);
            let setslot = |port: u16, state: &str, id: &str| {
                let ok: String = query(
                    port,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg(state)
                        .arg(id),
                )
                .unwrap_or_else(|| panic!("SETSLOT {state} on {port}"));
                assert_eq!(ok, "OK");
            };
            setslot(target, "IMPORTING", &master_id);
            setslot(master, "MIGRATING", &target_id);
            loop {
                let keys: Vec<String> = query(
                    master,
                    redis::cmd("CLUSTER")
                        .arg("GETKEYSINSLOT")
                        .arg(slot)
                        .arg(1000),
                )
                .expect("keys");
                if keys.is_empty() {
                    break;
                }
                let mut migrate = redis::cmd("MIGRATE");
                migrate
                    .arg("127.0.0.1")
                    .arg(target)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS");
                for key in &keys {
                    migrate.arg(key);
                }
                let _: String = query(master, &migrate).expect("MIGRATE");
            }
            setslot(target, "NODE", &target_id);
            setslot(master, "NODE", &target_id);
            for node in nodes_now
                .iter()
                .filter(|n| n.port != target && n.port != master)
            {
                let _: Option<String> = query(
                    node.port,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg("NODE")
                        .arg(&target_id),
                );
            }
            Instant::now()
        }
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    for job in jobs {
        job.await.expect("job");
    }
    let grants = grants.lock().clone();
    let fleet = RedisAdmission::connect(config).await.expect("connects");
    let events = read_events(&fleet).await.expect("events");
    let from_ms = moved_from
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let since = events
        .iter()
        .filter(|e| e.time_ms >= from_ms)
        .cloned()
        .collect();
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 0);
    Moved {
        events,
        since,
        most: most.load(Ordering::SeqCst),
        failed: failed.load(Ordering::SeqCst),
        first_grant_after: grants
            .iter()
            .filter(|(at, _)| *at > moved_at)
            .map(|(at, _)| *at - moved_at)
            .min(),
        grants_before: grants
            .iter()
            .filter(|(at, _)| *at < moved_at)
            .map(|g| g.1)
            .collect(),
        grants_after: grants
            .iter()
            .filter(|(at, _)| *at > moved_at)
            .map(|g| g.1)
            .collect(),
    }
}

/// The ceiling held, every job was served, no recovery began, and admission went on within a
/// second of the move; tokens kept growing.
fn check_planned(moved: &Moved, what: &str) {
    assert!(moved.most <= 8, "{} ran at once", moved.most);
    assert_eq!(moved.failed, 0, "acquisitions failed through the {what}");
    assert!(
        moved.events.iter().all(|e| e.kind != "recovering"),
        "the {what} started a recovery: {:?}",
        moved
            .since
            .iter()
            .map(|e| (&e.kind, &e.outcome))
            .collect::<Vec<_>>()
    );
    let first = moved.first_grant_after.expect("admitted after the move");
    assert!(
        first <= Duration::from_secs(1),
        "first grant {first:?} after the {what}"
    );
    assert!(!moved.grants_before.is_empty() && moved.grants_after.len() > 8);
    let highest = moved.grants_before.iter().max().copied().unwrap();
    assert!(moved.grants_after.iter().all(|t| *t > highest));
    eprintln!(
        "{what}: first grant {first:?} after the move; {} grants before, {} after; most running {} of 8",
        moved.grants_before.len(),
        moved.grants_after.len(),
        moved.most
    );
}

/// A manual failover (`CLUSTER FAILOVER`, no `FORCE`) with every call acknowledged by the
/// master's replica (`durability.replicas = 1`, a `WAIT 1` with each): the promoted replica has
/// every acknowledged write, so the cell does not recover and the jobs never stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_with_writes_held_for_the_replica_pauses_nothing() {
    let durability = Durability {
        replicas: 1,
        ..Durability::default()
    };
    let moved = through_a_planned_move("planned_failover", Move::Failover, durability).await;
    check_planned(&moved, "planned failover");
}

/// A slot migration to another master (`MIGRATE` moves every key of the cell at once, the
/// source deleting them only once the target has them) loses nothing: the target, a process
/// older than a TTL that was never promoted, starts no recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_slot_migration_pauses_nothing() {
    let moved =
        through_a_planned_move("planned_migration", Move::Migrate, Durability::default()).await;
    check_planned(&moved, "slot migration");
}
