//! A cell that may have lost leases recovers before it admits anything new, and only then: the
//! rule in the fleet guide's "Recovery". Created on a server that started less than a TTL ago,
//! or that served the cell within a TTL before it vanished; found last written by another server
//! process that may have lost acknowledged writes (a restart from a file written once a second,
//! an empty restart). For the rest of one TTL counted from the loss (the new process's start,
//! the cell's last call) it admits nothing, and renewals bring back the leases it lost; an
//! outside count of the jobs running under a lease never exceeds a ceiling across it. A new cell
//! on a server that has run longer than a TTL, and a restart from a file synced on every write,
//! pause nothing.
//!
//! These run in real time against private servers (a restart is the fault itself; a server's age
//! is what a rule reads), with the cell's test clock only to end a recovery early.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use admission_redis::{
    AcquireError, Durability, FleetEvent, LeaseRequest, Outcome, RedisAdmission,
    RedisAdmissionConfig, read_events,
};
use parking_lot::Mutex;

use crate::support::{PrivateRedis, ceilings, cell, config, connect, redis_server_binary, server};

/// A field of `INFO` on the server at `port`.
async fn info(port: u16, section: &str, field: &str) -> String {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .expect("INFO");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .to_owned()
}

/// The calls of the library's function the server at `port` has run.
async fn fcalls(port: u16) -> u64 {
    let stats = info(port, "commandstats", "cmdstat_fcall").await;
    stats
        .split(',')
        .find_map(|part| part.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .expect("calls=")
}

/// The second (server clock) the process at `port` started in: its start is within it.
async fn started_second(port: u16) -> u64 {
    let usec: u64 = info(port, "server", "server_time_usec")
        .await
        .parse()
        .expect("usec");
    let up: u64 = info(port, "server", "uptime_in_seconds")
        .await
        .parse()
        .expect("uptime");
    usec / 1_000_000 - up
}

/// Waits until the server at `port` has run longer than `age` (its age is the fact under test:
/// a server that started less than a TTL ago may have restarted empty).
async fn older_than(port: u16, age: Duration) {
    loop {
        let up: u64 = info(port, "server", "uptime_in_seconds")
            .await
            .parse()
            .expect("uptime");
        if Duration::from_secs(up) > age {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The config a new deployment writes: `RedisAdmissionConfig::new` as it comes.
fn defaults(port: u16, cell: &str) -> RedisAdmissionConfig {
    RedisAdmissionConfig::new("127.0.0.1", port, cell, ceilings(100, 10, 100, 10, 10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cell_on_a_server_up_longer_than_a_ttl_admits_at_once_with_the_defaults() {
    let binary = redis_server_binary("new_cell_old_server");
    let redis = PrivateRedis::start(&binary, &[]);
    let cfg = defaults(redis.port, &cell("new_cell_old_server"));
    assert!(cfg.recover_created_cells, "the default");
    older_than(redis.port, cfg.lease_ttl).await;
    let fleet = connect(cfg).await;
    let before = fcalls(redis.port).await;
    let lease = fleet
        .try_acquire(&LeaseRequest::new("first", "t", "d", 1, "upload"))
        .await
        .expect("a new cell on a server up longer than a TTL lost nothing");
    // One round trip: one call of the library.
    assert_eq!(fcalls(redis.port).await - before, 1);
    assert_eq!(lease.occupancy().service_transfers, 1);
    assert_eq!(fleet.recovering_until().await.expect("snapshot"), None);
    lease.release(Outcome::Completed).await.expect("released");
    let kinds: Vec<String> = read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["admitted", "completed"], "no recovery");
}

/// The README's first fleet lease, on a server that has just started (it may have restarted
/// empty, so a created cell recovers): `acquire` waits the recovery out within the caller's own
/// wait (15 s), not the config's `redis_wait` (5 s), and a readiness probe sees when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_lease_with_the_defaults_waits_out_a_young_servers_recovery() {
    let binary = redis_server_binary("first_lease_young_server");
    let spawned = Instant::now();
    let redis = PrivateRedis::start(&binary, &[]);
    let cfg = defaults(redis.port, &cell("first_lease_young_server"));
    let ttl = cfg.lease_ttl;
    assert_eq!(cfg.redis_wait, Duration::from_secs(5));
    let fleet = connect(cfg).await;
    let ready_at = fleet
        .recovering_until()
        .await
        .expect("snapshot")
        .expect("a cell created on a young server recovers");
    // Until one TTL after the process started, rounded up to its next whole second.
    assert!(
        ready_at >= spawned + ttl - Duration::from_millis(50)
            && ready_at <= spawned + ttl + Duration::from_millis(1_100),
        "ready {:?} after the spawn",
        ready_at - spawned
    );
    let asked = Instant::now();
    let lease = fleet
        .acquire(
            &LeaseRequest::new("upload-7f3a", "tenant-42", "disk-a", 1, "upload"),
            Duration::from_secs(15),
        )
        .await
        .expect("granted once the recovery ends, within the caller's wait");
    let granted = Instant::now();
    assert!(
        granted >= ready_at - Duration::from_millis(50),
        "granted early"
    );
    assert!(
        granted - ready_at < Duration::from_millis(500),
        "granted {:?} after the recovery ended",
        granted - ready_at
    );
    assert!(
        granted - asked > Duration::from_secs(5),
        "waited past redis_wait"
    );
    assert_eq!(fleet.recovering_until().await.expect("snapshot"), None);
    lease.release(Outcome::Completed).await.expect("released");
    eprintln!(
        "first lease, defaults, young server: granted {:?} after the server started",
        granted - spawned
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_created_on_a_young_server_admits_nothing_until_a_ttl_after_its_start() {
    let binary = redis_server_binary("created_recovers");
    let redis = PrivateRedis::start(&binary, &[]);
    let mut cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("created_recovers"),
        ceilings(100, 10, 100, 10, 10),
    );
    cfg.recover_created_cells = true;
    let fleet = connect(cfg.clone()).await;
    let request = LeaseRequest::new("first", "t", "d", 1, "upload");
    let Err(AcquireError::Recovering { left }) = fleet.try_acquire(&request).await else {
        panic!("a recovering cell admitted");
    };
    // TTL 3 s from the process's start (rounded up to the next second), which was a moment ago.
    assert!(
        left > Duration::from_millis(1_500) && left <= Duration::from_secs(4),
        "{left:?}"
    );
    let events = read_events(&fleet).await.expect("events");
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.outcome.as_str()))
        .collect();
    assert_eq!(kinds, [("recovering", "created")]);
    // The recovery ends one TTL after the second the process started in, or one TTL after the
    // library's first call if that came first; never later.
    let start_ms = started_second(redis.port).await * 1000;
    let end_ms = events[0].time_ms + u64::try_from(left.as_millis()).unwrap();
    assert!(
        end_ms >= start_ms + 3_000 && end_ms <= start_ms + 4_000 + 50,
        "ends {} ms after the start second",
        end_ms - start_ms
    );
    // Twenty milliseconds short of the end: still nothing.
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
    // Created with `recover_created_cells = false`, a cell never recovers.
    let mut never = cfg;
    never.cell = cell("created_never_recovers");
    never.recover_created_cells = false;
    let fleet = connect(never).await;
    let lease = fleet.try_acquire(&request).await.expect("admitted at once");
    lease.release(Outcome::Completed).await.expect("released");
}

/// A cell whose keys vanish while this server serves it (deleted, flushed, evicted) may have
/// had leases that still run: created again, it recovers until its last call here plus a TTL,
/// and its holders renew their leases back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_that_vanished_while_served_recovers_until_its_last_call_plus_a_ttl() {
    let binary = redis_server_binary("vanished_recovers");
    let redis = PrivateRedis::start(&binary, &[]);
    let mut cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("vanished_recovers"),
        ceilings(100, 10, 100, 10, 10),
    );
    cfg.recover_created_cells = true;
    older_than(redis.port, cfg.lease_ttl).await;
    let fleet = connect(cfg).await;
    let held = fleet
        .try_acquire(&LeaseRequest::new("held", "t", "d", 1, "upload"))
        .await
        .expect("a new cell on a server older than a TTL admits at once");
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let last_call = Instant::now();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let request = LeaseRequest::new("next", "t", "d", 1, "upload");
    let Err(AcquireError::Recovering { left }) = fleet.try_acquire(&request).await else {
        panic!("a cell created again after it vanished admitted at once");
    };
    assert!(
        left <= Duration::from_secs(3)
            && left + last_call.elapsed() >= Duration::from_millis(2_900),
        "{left:?}"
    );
    // The holder's renewal brings its lease back.
    held.renew_now().await.expect("renewed back");
    let events = read_events(&fleet).await.expect("events");
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.outcome.as_str()))
        .collect();
    assert_eq!(kinds, [("recovering", "created"), ("rejoined", "rejoined")]);
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 1);
    held.release(Outcome::Completed).await.expect("released");
}

/// What the jobs of a run saw: the most running at once by an outside count, the tokens
/// granted (in order) with when, the leases lost, and the jobs run.
#[derive(Default)]
struct Seen {
    running: AtomicUsize,
    most: AtomicUsize,
    tokens: Mutex<Vec<(Instant, u64)>>,
    lost: AtomicUsize,
    jobs: AtomicUsize,
    stop: AtomicBool,
    last_token_before_restart: AtomicU64,
}

/// A restart under load, as [`restart_while_holders_run`] made it.
struct Restarted {
    seen: Arc<Seen>,
    _redis: PrivateRedis,
    fleet: RedisAdmission,
    /// When the server was started again (local clock), and the second (server clock) its new
    /// process started in.
    returned: Instant,
    started_second: u64,
    /// When a probe of another tenant, asking every 20 ms from the kill on while the jobs' tenant
    /// holds all it may, was first admitted after the restart: when admission resumed.
    resumed: Instant,
}

/// Eight jobs of one tenant on two provider instances of one cell of six transfers (four for
/// the tenant, one more that its head of line sets aside), each holding its lease for 2.5 s of work (so that renewals run during it), until
/// told to stop; the server is killed once four run and started again 0.3 s later with `extra`
/// arguments (an append-only file, or none: empty), and the instances declare `durability`. A
/// probe of another tenant asks for the last transfer from the kill on. Returns what the jobs
/// saw; the outside count is of the jobs, against their tenant's ceiling.
async fn restart_while_holders_run(
    test: &str,
    extra: &[&str],
    durability: Durability,
) -> Restarted {
    let binary = redis_server_binary(test);
    let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    let mut redis = PrivateRedis::start(&binary, &extra);
    let mut cfg = config(
        "127.0.0.1",
        redis.port,
        &cell(test),
        ceilings(1 << 20, 6, 1 << 20, 4, 6),
    );
    cfg.recover_created_cells = true;
    cfg.durability = durability;
    // The cell is created on a server older than a TTL: it admits at once.
    older_than(redis.port, cfg.lease_ttl).await;
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
                seen.tokens.lock().push((Instant::now(), lease.token().0));
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
    let started = Instant::now();
    while seen.running.load(Ordering::SeqCst) < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "four never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Past the AOF's once-a-second write, so that the cell itself survives an AOF restart.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let before = seen.tokens.lock().iter().map(|t| t.1).max().unwrap_or(0);
    seen.last_token_before_restart
        .store(before, Ordering::SeqCst);
    redis.signal("KILL");
    redis.stop();
    let probe = {
        let fleet = instances[0].clone();
        tokio::spawn(async move {
            let request = LeaseRequest::new("probe", "probe", "d", 1, "run");
            loop {
                if let Ok(lease) = fleet.try_acquire(&request).await {
                    let at = Instant::now();
                    lease.release(Outcome::Completed).await.expect("released");
                    return at;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.start_again(&binary);
    let returned = Instant::now();
    let started_second = started_second(redis.port).await;
    // Through a recovery (3 s) and two rounds of jobs after it.
    tokio::time::sleep(Duration::from_secs(7)).await;
    seen.stop.store(true, Ordering::SeqCst);
    for job in jobs {
        job.await.expect("job");
    }
    let resumed = probe.await.expect("probe");
    let fleet = connect(cfg).await;
    Restarted {
        seen,
        _redis: redis,
        fleet,
        returned,
        started_second,
        resumed,
    }
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

/// The ceilings held, no holder lost its lease, and nothing was admitted after the restart until
/// one TTL (3 s) after the new process started; admission resumed then, with greater tokens.
fn check(run: &Restarted, events: &[FleetEvent], reason: &str) {
    let seen = &run.seen;
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
    // Nothing new was admitted until one TTL after the new process started (its start lies in
    // `started_second`)...
    let start_ms = run.started_second * 1000;
    let admitted: Vec<&FleetEvent> = events.iter().filter(|e| e.kind == "admitted").collect();
    assert!(!admitted.is_empty(), "nothing admitted after the recovery");
    for event in &admitted {
        assert!(
            event.time_ms >= start_ms + 3_000,
            "admitted {} ms after the start second",
            event.time_ms - start_ms
        );
    }
    // ...and then at once: at most one TTL after the start rounded up to its next second (the
    // resolution of the server's uptime), where the probe asked all along.
    let first = admitted[0].time_ms - start_ms;
    assert!(
        first <= 4_000 + 100,
        "first admission {first} ms after the start second"
    );
    let resumed = run.resumed - run.returned;
    assert!(
        resumed >= Duration::from_millis(2_900) && resumed <= Duration::from_millis(4_200),
        "the probe was admitted {resumed:?} after the server was started again"
    );
    // Every lease granted after it carries a greater token than any granted before.
    let before = seen.last_token_before_restart.load(Ordering::SeqCst);
    assert!(admitted.iter().all(|e| e.token > before));
    assert!(seen.jobs.load(Ordering::SeqCst) > 4);
    // The measure BENCHMARKS.md records.
    eprintln!(
        "recovery ({reason}): most running at once {} of 4; first admission {first} ms after the \
         start second, {:?} after the server was started again; {} leases rejoined",
        seen.most.load(Ordering::SeqCst),
        run.resumed - run.returned,
        events.iter().filter(|e| e.kind == "rejoined").count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_empty_while_holders_run_admits_nothing_new_until_they_renewed_back() {
    let run = restart_while_holders_run("restart_empty_recovers", &[], Durability::default()).await;
    let events = since_recovery(&run.fleet).await;
    check(&run, &events, "created");
    // The holders at the restart brought their leases back.
    assert!(events.iter().any(|e| e.kind == "rejoined"));
    assert_eq!(
        run.fleet.snapshot("t", "d").await.expect("snapshot").leases,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_from_its_aof_recovers_whatever_the_aof_lost() {
    let run = restart_while_holders_run(
        "restart_aof_recovers",
        &["--appendonly", "yes", "--appendfsync", "everysec"],
        Durability::default(),
    )
    .await;
    let events = since_recovery(&run.fleet).await;
    check(&run, &events, "restarted");
    assert_eq!(
        run.fleet.snapshot("t", "d").await.expect("snapshot").leases,
        0
    );
}

/// A server that syncs every write to its append-only file before it answers, and says so in
/// the config, loses nothing acknowledged in a restart: the cell does not recover, jobs waiting
/// through the outage are admitted as soon as the server is back, the leases held across it run
/// on, and the ceilings hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_an_aof_synced_on_every_write_pauses_nothing() {
    let durability = Durability {
        fsync_always: true,
        ..Durability::default()
    };
    let run = restart_while_holders_run(
        "restart_fsync_lossless",
        &["--appendonly", "yes", "--appendfsync", "always"],
        durability,
    )
    .await;
    let seen = &run.seen;
    let events = read_events(&run.fleet).await.expect("events");
    assert!(
        events.iter().all(|e| e.kind != "recovering"),
        "a lossless restart started a recovery"
    );
    assert!(
        events.iter().all(|e| e.kind != "rejoined"),
        "nothing was lost"
    );
    assert!(seen.most.load(Ordering::SeqCst) <= 4);
    assert_eq!(seen.lost.load(Ordering::SeqCst), 0);
    let first_grant = run.resumed - run.returned;
    assert!(
        first_grant <= Duration::from_millis(500),
        "first admission {first_grant:?} after the server returned"
    );
    // Tokens still only grow: the counter survived.
    let before = seen.last_token_before_restart.load(Ordering::SeqCst);
    let tokens = seen.tokens.lock().clone();
    assert!(
        tokens
            .iter()
            .filter(|(at, _)| *at > run.returned)
            .all(|(_, token)| *token > before)
    );
    assert_eq!(
        run.fleet.snapshot("t", "d").await.expect("snapshot").leases,
        0
    );
    eprintln!("lossless restart: first admission {first_grant:?} after the server returned");
}

#[tokio::test]
async fn a_declared_fsync_that_the_server_contradicts_is_refused_at_connect() {
    let (host, port) = server("fsync_contradicted");
    let mut cfg = config(
        &host,
        port,
        &cell("fsync_contradicted"),
        ceilings(100, 10, 100, 10, 10),
    );
    cfg.durability.fsync_always = true;
    match RedisAdmission::connect(cfg).await {
        Err(admission_redis::ConnectError::Config(error)) => {
            assert_eq!(error.field(), "durability.fsync_always");
            assert!(error.to_string().contains("appendfsync"), "{error}");
        }
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("a server without appendfsync always accepted fsync_always"),
    }
}

/// A restart that lost data pauses new grants until one TTL after the new process started, not
/// after the first call that reaches it: a cell first asked 2 s after the server came back has
/// about a second of its recovery left, not a whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_first_called_late_recovers_from_the_process_start_not_the_first_call() {
    let binary = redis_server_binary("restart_called_late");
    let extra: Vec<String> = ["--appendonly", "yes", "--appendfsync", "everysec"]
        .map(String::from)
        .to_vec();
    let mut redis = PrivateRedis::start(&binary, &extra);
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("restart_called_late"),
        ceilings(100, 10, 100, 10, 10),
    );
    let fleet = connect(cfg).await;
    let request = LeaseRequest::new("job", "t", "d", 1, "upload");
    let lease = fleet.try_acquire(&request).await.expect("admitted");
    lease.release(Outcome::Completed).await.expect("released");
    // Past the AOF's once-a-second write, so that the cell comes back from the file.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    redis.signal("KILL");
    redis.stop();
    redis.start_again(&binary);
    let returned = Instant::now();
    let start_ms = started_second(redis.port).await * 1000;
    // Nobody calls for 2 s (the quiet is the case under test).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let Err(AcquireError::Recovering { left }) = fleet.try_acquire(&request).await else {
        panic!("a restart from a file written once a second started no recovery");
    };
    let ends = returned.elapsed() + left;
    assert!(
        ends >= Duration::from_millis(2_900) && ends <= Duration::from_millis(4_100),
        "the recovery ends {ends:?} after the server returned (a whole TTL from the first call \
         would be {:?})",
        returned.elapsed() + Duration::from_secs(3)
    );
    let events = read_events(&fleet).await.expect("events");
    let recovering = events
        .iter()
        .rfind(|e| e.kind == "recovering")
        .expect("a recovering event");
    assert_eq!(recovering.outcome, "restarted");
    let end_ms = recovering.time_ms + u64::try_from(left.as_millis()).unwrap();
    assert!(
        end_ms >= start_ms + 3_000 && end_ms <= start_ms + 4_000 + 50,
        "ends {} ms after the start second",
        end_ms - start_ms
    );
}
