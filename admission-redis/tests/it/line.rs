//! One fair line across the fleet: a big head is never overtaken by small followers, a release on
//! one instance hands the lease to a waiter on another inside the same script call, a crashed
//! waiter cannot hold the head, and many waiters of one process share one reader.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use admission_redis::{
    AcquireError, Dimension, LeaseRequest, Outcome, RedisAdmission, read_events,
};

use crate::support::{
    PrivateRedis, ceilings, cell, config, connect, redis_server_binary, server, wait_for_event,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_head_is_granted_before_a_stream_of_small_followers_across_instances() {
    let Some((host, port)) = server("fair_head") else {
        return;
    };
    let cell = cell("fair_head");
    let a = connect(config(&host, port, &cell, ceilings(10, 10, 10, 10, 10))).await;
    let b = connect(config(&host, port, &cell, ceilings(10, 10, 10, 10, 10))).await;
    let held = a
        .try_acquire(&LeaseRequest::new("held", "t", "d", 6, "upload"))
        .await
        .expect("fits");
    // The head, on instance B, needs all ten bytes.
    let head = {
        let b = b.clone();
        tokio::spawn(async move {
            b.acquire(
                &LeaseRequest::new("big", "t", "d", 10, "upload"),
                Duration::from_secs(5),
            )
            .await
        })
    };
    wait_for_event(&a, &host, port, "queued", "big").await;
    // A stream of small followers on instance A: each would fit the 4 free bytes, none may take
    // them while the head waits (6 held + 10 set aside for the head + 1 > 10).
    for i in 0..50 {
        let refused = a
            .try_acquire(&LeaseRequest::new(
                format!("small{i}"),
                "t",
                "d",
                1,
                "upload",
            ))
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                AcquireError::Full {
                    dimension: Dimension::ServiceBytes,
                    held: 16,
                    asked: 1,
                    ceiling: 10
                }
            ),
            "{refused}"
        );
    }
    // Waiting followers queue behind the head.
    let follower = {
        let a = a.clone();
        tokio::spawn(async move {
            a.acquire(
                &LeaseRequest::new("follower", "t", "d", 1, "upload"),
                Duration::from_secs(5),
            )
            .await
        })
    };
    wait_for_event(&a, &host, port, "queued", "follower").await;
    held.release(Outcome::Completed).await.expect("released");
    let big = head
        .await
        .expect("task")
        .expect("the head is granted first");
    assert_eq!(big.occupancy().service_bytes, 10);
    big.release(Outcome::Completed).await.expect("released");
    let small = follower.await.expect("task").expect("then the follower");
    small.release(Outcome::Completed).await.expect("released");
    let order: Vec<String> = read_events(&a)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == "admitted")
        .map(|e| format!("{}:{}", e.lease, e.outcome))
        .collect();
    assert_eq!(
        order,
        vec!["held:admitted", "big:handoff", "follower:handoff"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_beside_the_head_goes_when_it_does_not_touch_what_the_head_needs() {
    let Some((host, port)) = server("backfill") else {
        return;
    };
    let cell = cell("backfill");
    // Backends hold one transfer each; the head waits on backend d1.
    let a = connect(config(&host, port, &cell, ceilings(100, 10, 100, 10, 1))).await;
    let held = a
        .try_acquire(&LeaseRequest::new("held", "t", "d1", 10, "upload"))
        .await
        .expect("fits");
    let head = {
        let a = a.clone();
        tokio::spawn(async move {
            a.acquire(
                &LeaseRequest::new("head", "t", "d1", 10, "upload"),
                Duration::from_secs(5),
            )
            .await
        })
    };
    wait_for_event(&a, &host, port, "queued", "head").await;
    // A follower on another backend fits beside the head's reservation (30 of 100 bytes, 3 of
    // 10 transfers): it goes at once.
    let other = a
        .try_acquire(&LeaseRequest::new("other", "t", "d2", 10, "upload"))
        .await
        .expect("backfilled");
    // One on the head's backend may not take the backend the head is short on.
    let same = a
        .try_acquire(&LeaseRequest::new("same", "t", "d1", 1, "upload"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            same,
            AcquireError::Full {
                dimension: Dimension::BackendTransfers,
                ..
            }
        ),
        "{same}"
    );
    held.release(Outcome::Completed).await.expect("released");
    let head = head.await.expect("task").expect("granted");
    for lease in [head, other] {
        lease.release(Outcome::Completed).await.expect("released");
    }
}

/// The waiter half of the crash test: runs only in the child process the test starts.
#[tokio::test]
#[ignore = "the child process of a_crashed_waiter_is_reaped_and_cannot_block_the_line"]
async fn waiter_process() {
    let Ok(spec) = std::env::var("ADMISSION_REDIS_WAITER") else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let (host, port, cell) = (parts[0], parts[1].parse().expect("port"), parts[2]);
    let fleet = connect(config(host, port, cell, ceilings(10, 1, 10, 1, 1))).await;
    println!("WAITING");
    let _ = fleet
        .acquire(
            &LeaseRequest::new("crashed-waiter", "t", "d", 1, "upload"),
            Duration::from_secs(30),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_is_reaped_and_cannot_block_the_line() {
    let Some((host, port)) = server("crashed_waiter") else {
        return;
    };
    let cell = cell("crashed_waiter");
    let mut cfg = config(&host, port, &cell, ceilings(10, 1, 10, 1, 1));
    cfg.redis_wait = Duration::from_secs(30);
    let fleet = connect(cfg).await;
    let held = fleet
        .try_acquire(&LeaseRequest::new("held", "t", "d", 1, "upload"))
        .await
        .expect("fits");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "line::waiter_process",
            "--ignored",
            "--nocapture",
        ])
        .env("ADMISSION_REDIS_WAITER", format!("{host} {port} {cell}"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("starts the waiter");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    while !lines
        .next()
        .expect("the waiter reports")
        .expect("a line")
        .starts_with("WAITING")
    {}
    wait_for_event(&fleet, &host, port, "queued", "crashed-waiter").await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped by the OS");
    // Two seconds later on the cell's clock (the holder renewing), a live waiter, in this
    // process, stands behind the dead one.
    held.renew_now().await.expect("renewed");
    fleet
        .advance_server_clock(Duration::from_millis(2_000))
        .await
        .expect("skew");
    held.renew_now().await.expect("renewed");
    let behind = {
        let fleet = fleet.clone();
        tokio::spawn(async move {
            fleet
                .acquire(
                    &LeaseRequest::new("behind", "t", "d", 1, "upload"),
                    Duration::from_secs(20),
                )
                .await
        })
    };
    wait_for_event(&fleet, &host, port, "queued", "behind").await;
    // 1.5 s more: the dead waiter's ticket (3 s of liveness, never renewed) has run out, the
    // live one's has not. The holder's release reaps the dead ticket and hands off past it.
    fleet
        .advance_server_clock(Duration::from_millis(1_500))
        .await
        .expect("skew");
    held.release(Outcome::Completed).await.expect("released");
    let lease = behind
        .await
        .expect("task")
        .expect("the live waiter is granted");
    let events = read_events(&fleet).await.expect("events");
    let abandoned: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "timed_out")
        .map(|e| (e.lease.as_str(), e.outcome.as_str()))
        .collect();
    assert_eq!(abandoned, vec![("crashed-waiter", "abandoned")]);
    let last = events
        .iter()
        .rfind(|e| e.kind == "admitted")
        .expect("an admission");
    assert_eq!(
        (last.lease.as_str(), last.outcome.as_str()),
        ("behind", "handoff")
    );
    lease.release(Outcome::Completed).await.expect("released");
}

/// Many waiting jobs in one process share the provider's connection and one reader: the
/// server sees the same number of clients with 1 waiter as with 40.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_waiters_share_one_reader_and_every_one_is_granted_in_ticket_order() {
    let Some(binary) = redis_server_binary("shared_reader") else {
        return;
    };
    let redis = PrivateRedis::start(&binary, &[]);
    let port = redis.port;
    let fleet = connect(config(
        "127.0.0.1",
        port,
        &cell("shared_reader"),
        ceilings(100, 1, 100, 1, 1),
    ))
    .await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let clients = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("connected_clients")
    };
    let held = fleet
        .try_acquire(&LeaseRequest::new("held", "t", "d", 1, "upload"))
        .await
        .expect("fits");
    let mut waiters = Vec::new();
    for i in 0..40 {
        let waiting = fleet.clone();
        waiters.push(tokio::spawn(async move {
            let lease = waiting
                .acquire(
                    &LeaseRequest::new(format!("w{i:02}"), "t", "d", 1, "upload"),
                    Duration::from_secs(10),
                )
                .await
                .expect("granted");
            lease.release(Outcome::Completed).await.expect("released");
        }));
        if i == 0 {
            wait_for_event(&fleet, "127.0.0.1", port, "queued", "w00").await;
            let info: String = redis::cmd("INFO")
                .arg("clients")
                .query_async(&mut conn)
                .await
                .expect("info");
            // This test's connection, the provider's, and its one reader.
            assert_eq!(clients(info), 3);
        }
    }
    wait_for_event(&fleet, "127.0.0.1", port, "queued", "w39").await;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut conn)
        .await
        .expect("info");
    assert_eq!(clients(info), 3, "one reader for 40 waiters");
    held.release(Outcome::Completed).await.expect("released");
    for waiter in waiters {
        waiter.await.expect("task");
    }
    let granted: Vec<String> = read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == "admitted" && e.outcome == "handoff")
        .map(|e| e.lease)
        .collect();
    let queued: Vec<String> = read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == "queued")
        .map(|e| e.lease)
        .collect();
    assert_eq!(granted.len(), 40);
    assert_eq!(granted, queued, "granted in ticket order");
}

/// Round trips per admitted job under contention, counted by the server: a waiter's admission
/// costs its one acquire (the hand-off grants it inside someone else's release) and its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_job_costs_two_round_trips_on_average() {
    let Some(binary) = redis_server_binary("round_trips_line") else {
        return;
    };
    let redis = PrivateRedis::start(&binary, &[]);
    let port = redis.port;
    let mut cfg = config(
        "127.0.0.1",
        port,
        &cell("round_trips_line"),
        ceilings(100, 2, 100, 2, 2),
    );
    cfg.redis_wait = Duration::from_secs(20);
    let a = connect(cfg.clone()).await;
    let b = connect(cfg).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("resetstat");
    const JOBS: u64 = 64;
    let mut tasks = Vec::new();
    for i in 0..JOBS {
        let fleet: RedisAdmission = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let lease = fleet
                .acquire(
                    &LeaseRequest::new(format!("j{i}"), "t", "d", 1, "upload"),
                    Duration::from_secs(20),
                )
                .await
                .expect("granted");
            tokio::task::yield_now().await;
            lease.release(Outcome::Completed).await.expect("released");
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("info");
    let evalsha: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("evalsha calls");
    let per_job = evalsha as f64 / JOBS as f64;
    println!("round trips per admitted job: {per_job:.2} ({evalsha} script calls for {JOBS} jobs)");
    // One acquire and one release each, plus at most one more ask per job on average (a ticket's
    // liveness renewal or an expiry deadline); the goal is 3.
    assert!(evalsha >= 2 * JOBS, "{evalsha}");
    assert!(per_job <= 3.0, "{per_job}");
}
