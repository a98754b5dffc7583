//! A cell that may have lost leases recovers before it admits anything new: created afresh
//! (when the config asks, as it does by default), or found last written by another server
//! process (a restart from the server's own data, a replica promoted). For one lease TTL it
//! admits nothing, and renewals bring back the leases it lost; an outside count of the jobs
//! running under a lease never exceeds a ceiling across the restart.
//!
//! The first test runs on the cell's test clock; the others in real time against a private
//! server that is SIGKILLed mid-run and started again (the restart is the fault itself).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use admission_redis::{
    AcquireError, FleetEvent, LeaseRequest, Outcome, RedisAdmission, read_events,
};
use parking_lot::Mutex;

use crate::support::{PrivateRedis, ceilings, cell, config, connect, redis_server_binary, server};

#[tokio::test]
async fn a_cell_created_afresh_admits_nothing_for_one_ttl_then_admits() {
    let Some((host, port)) = server("created_recovers") else {
        return;
    };
    let mut cfg = config(
        &host,
        port,
        &cell("created_recovers"),
        ceilings(100, 10, 100, 10, 10),
    );
    cfg.recover_created_cells = true;
    let fleet = connect(cfg).await;
    let request = LeaseRequest::new("first", "t", "d", 1, "upload");
    // TTL 3 s: created by `connect` a moment ago, the cell admits nothing for 3 s.
    let Err(AcquireError::Recovering { left }) = fleet.try_acquire(&request).await else {
        panic!("a recovering cell admitted");
    };
    assert!(
        left > Duration::from_millis(2_500) && left <= Duration::from_secs(3),
        "{left:?}"
    );
    let events = read_events(&fleet).await.expect("events");
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.outcome.as_str()))
        .collect();
    assert_eq!(kinds, [("recovering", "created")]);
    // One millisecond short of the end: still nothing.
    fleet
        .advance_server_clock(left - Duration::from_millis(20))
        .await
        .expect("skew");
    assert!(matches!(
        fleet.try_acquire(&request).await,
        Err(AcquireError::Recovering { .. })
    ));
    fleet
        .advance_server_clock(Duration::from_millis(20))
        .await
        .expect("skew");
    let lease = fleet.try_acquire(&request).await.expect("recovered");
    assert_eq!(lease.occupancy().service_transfers, 1);
    lease.release(Outcome::Completed).await.expect("released");
}

/// What the jobs of a run saw: the most running at once by an outside count, the tokens
/// granted (in order), the leases lost, and the jobs run.
#[derive(Default)]
struct Seen {
    running: AtomicUsize,
    most: AtomicUsize,
    tokens: Mutex<Vec<u64>>,
    lost: AtomicUsize,
    jobs: AtomicUsize,
    stop: AtomicBool,
    last_token_before_restart: AtomicU64,
}

/// Eight jobs on two provider instances of one cell of four transfers, each holding its lease
/// for 2.5 s of work (so that renewals run during it), until told to stop; the server is killed
/// once four run and started again 0.3 s later (`aof`: from its append-only file, written every
/// second; otherwise empty). Returns what the jobs saw, the server's port and the cell.
async fn restart_while_holders_run(
    test: &str,
    aof: bool,
) -> Option<(Arc<Seen>, PrivateRedis, RedisAdmission)> {
    let binary = redis_server_binary(test)?;
    let extra: Vec<String> = if aof {
        ["--appendonly", "yes", "--appendfsync", "everysec"]
            .map(String::from)
            .to_vec()
    } else {
        Vec::new()
    };
    let mut redis = PrivateRedis::start(&binary, &extra);
    let mut cfg = config(
        "127.0.0.1",
        redis.port,
        &cell(test),
        ceilings(1 << 20, 4, 1 << 20, 4, 4),
    );
    cfg.recover_created_cells = true;
    let instances = [connect(cfg.clone()).await, connect(cfg.clone()).await];
    let seen = Arc::new(Seen::default());
    let mut jobs = Vec::new();
    for task in 0..8 {
        let fleet = instances[task % 2].clone();
        let seen = seen.clone();
        jobs.push(tokio::spawn(async move {
            let mut round = 0;
            while !seen.stop.load(Ordering::SeqCst) {
                round += 1;
                let request = LeaseRequest::new(format!("job-{task}-{round}"), "t", "d", 1, "run");
                let lease = match fleet.acquire(&request, Duration::from_secs(8)).await {
                    Ok(lease) => lease,
                    // Recovering, timed out, or the server away: ask again.
                    Err(_) => continue,
                };
                let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most.fetch_max(now, Ordering::SeqCst);
                seen.tokens.lock().push(lease.token().0);
                seen.jobs.fetch_add(1, Ordering::SeqCst);
                let lost = tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(2_500)) => false,
                    _ = lease.lost() => true,
                };
                // The work has stopped: the outside count drops before the lease goes back.
                seen.running.fetch_sub(1, Ordering::SeqCst);
                if lost {
                    seen.lost.fetch_add(1, Ordering::SeqCst);
                } else {
                    let _ = lease.release(Outcome::Completed).await;
                }
            }
        }));
    }
    // The cell's own creation recovers first (3 s); then four jobs run.
    let started = std::time::Instant::now();
    while seen.running.load(Ordering::SeqCst) < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "four never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Past the AOF's once-a-second write, so that the cell itself survives an AOF restart.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let before = seen.tokens.lock().iter().copied().max().unwrap_or(0);
    seen.last_token_before_restart
        .store(before, Ordering::SeqCst);
    redis.signal("KILL");
    redis.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.start_again(&binary);
    // Through the recovery (3 s) and two rounds of jobs after it.
    tokio::time::sleep(Duration::from_secs(7)).await;
    seen.stop.store(true, Ordering::SeqCst);
    for job in jobs {
        job.await.expect("job");
    }
    let fleet = connect(cfg).await;
    Some((seen, redis, fleet))
}

/// The cell's events from the last `recovering` record on.
async fn since_recovery(fleet: &RedisAdmission) -> Vec<FleetEvent> {
    let events = read_events(fleet).await.expect("events");
    let at = events
        .iter()
        .rposition(|e| e.kind == "recovering")
        .expect("a recovering record");
    events[at..].to_vec()
}

fn check(seen: &Seen, events: &[FleetEvent], reason: &str) {
    for e in events {
        eprintln!(
            "{} {} {} {} {}",
            e.time_ms, e.kind, e.outcome, e.lease, e.token
        );
    }
    // The rule: never more running than the ceiling, by an outside count.
    assert!(
        seen.most.load(Ordering::SeqCst) <= 4,
        "{} ran at once",
        seen.most.load(Ordering::SeqCst)
    );
    // Holders renewed their leases back (TTL 3 s, renewals every 1 s, 0.3 s away): none lost.
    assert_eq!(seen.lost.load(Ordering::SeqCst), 0);
    let recovering = &events[0];
    assert_eq!(recovering.outcome, reason);
    // Nothing new was admitted for one TTL (3 s) of server time after the recovery began...
    let admitted: Vec<&FleetEvent> = events.iter().filter(|e| e.kind == "admitted").collect();
    assert!(!admitted.is_empty(), "nothing admitted after the recovery");
    for event in &admitted {
        assert!(
            event.time_ms >= recovering.time_ms + 3_000,
            "admitted {} ms into the recovery",
            event.time_ms - recovering.time_ms
        );
    }
    // ...and every lease granted after it carries a greater token than any granted before.
    let before = seen.last_token_before_restart.load(Ordering::SeqCst);
    assert!(admitted.iter().all(|e| e.token > before));
    assert!(seen.jobs.load(Ordering::SeqCst) > 4);
    // The measure BENCHMARKS.md records.
    eprintln!(
        "recovery ({reason}): most running at once {} of 4; first admission {} ms after the \
         recovery began; {} leases rejoined",
        seen.most.load(Ordering::SeqCst),
        admitted[0].time_ms - recovering.time_ms,
        events.iter().filter(|e| e.kind == "rejoined").count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_empty_while_holders_run_admits_nothing_new_until_they_renewed_back() {
    let Some((seen, _redis, fleet)) =
        restart_while_holders_run("restart_empty_recovers", false).await
    else {
        return;
    };
    let events = since_recovery(&fleet).await;
    check(&seen, &events, "created");
    // The holders at the restart brought their leases back.
    assert!(events.iter().any(|e| e.kind == "rejoined"));
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_from_its_aof_recovers_whatever_the_aof_lost() {
    let Some((seen, _redis, fleet)) = restart_while_holders_run("restart_aof_recovers", true).await
    else {
        return;
    };
    let events = since_recovery(&fleet).await;
    check(&seen, &events, "restarted");
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 0);
}
