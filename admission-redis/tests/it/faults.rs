//! Real faults against a private server: killed and restarted, paused (`CLIENT PAUSE`), stopped
//! mid-call (SIGSTOP). A call that fails on the connection is retried until its caller's own
//! deadline: a job with time left rides through a short outage, a job whose deadline falls
//! inside a long one fails closed with `Unavailable`, and nothing is admitted without the
//! server's answer or left held after a failed call.
//!
//! The pauses here are the faults themselves (an outage of a given length), never a wait for a
//! refill or a deadline.

use std::time::{Duration, Instant};

use admission_redis::{AcquireError, LeaseRequest, Outcome, read_events};

use crate::support::{PrivateRedis, ceilings, cell, config, connect, redis_server_binary};

fn request(id: &str) -> LeaseRequest {
    LeaseRequest::new(id, "tenant", "disk", 1024, "upload")
}

/// A command to the private server on a connection of its own.
async fn command(port: u16, args: &[&str]) -> redis::Value {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(&mut conn).await.expect(args[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_a_restart_on_an_idle_connection_is_retried_not_failed() {
    let binary = redis_server_binary("idle_restart");
    let mut redis = PrivateRedis::start(&binary, &[]);
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("idle_restart"),
        ceilings(1 << 20, 8, 1 << 20, 8, 8),
    );
    let fleet = connect(cfg).await;
    let first = fleet.try_acquire(&request("before")).await.expect("fits");
    first.release(Outcome::Completed).await.expect("released");

    // Killed and back 0.3 s later, empty, while this instance's connection sat idle: the old
    // connection is dead, and the manager learns it only from a failed command.
    redis.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.start_again(&binary);

    let lease = fleet
        .try_acquire(&request("after"))
        .await
        .expect("the broken pipe is retried on a new connection, and the cell created again");
    assert_eq!(lease.occupancy().service_transfers, 1);
    let waited = fleet
        .acquire(&request("waited"), Duration::from_secs(2))
        .await
        .expect("an acquisition with time left is admitted");
    assert_eq!(waited.occupancy().service_transfers, 2);
    lease.release(Outcome::Completed).await.expect("released");
    waited.release(Outcome::Completed).await.expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_rides_through_an_outage_shorter_than_its_wait_and_fails_closed_after_a_longer_one()
 {
    let binary = redis_server_binary("outage");
    let mut redis = PrivateRedis::start(&binary, &[]);
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("outage"),
        ceilings(1 << 20, 8, 1 << 20, 8, 8),
    );
    let fleet = connect(cfg).await;

    // Down for two seconds; a job with five seconds to wait is admitted once it is back.
    redis.stop();
    let started = Instant::now();
    let job = {
        let fleet = fleet.clone();
        tokio::spawn(async move {
            fleet
                .acquire(&request("patient"), Duration::from_secs(5))
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.start_again(&binary);
    let lease = job
        .await
        .expect("task")
        .expect("admitted once the server is back, inside its wait");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "admitted after {took:?}, before the server was back"
    );
    assert!(
        took < Duration::from_secs(5),
        "admitted after {took:?}, past its wait"
    );
    lease.release(Outcome::Completed).await.expect("released");

    // Down for longer than a job's wait: it fails closed, with `Unavailable`, once its own wait
    // is over (not at the first refused connection).
    redis.stop();
    let started = Instant::now();
    let error = fleet
        .acquire(&request("short"), Duration::from_millis(1_500))
        .await
        .expect_err("nothing is admitted without the server's answer");
    let took = started.elapsed();
    assert!(
        matches!(error, AcquireError::Unavailable(_)),
        "expected Unavailable, got {error:?}"
    );
    assert!(
        took >= Duration::from_millis(1_400),
        "gave up after {took:?}, before its wait of 1.5 s was over"
    );
    assert!(
        took < Duration::from_millis(1_500) + Duration::from_secs(1),
        "gave up after {took:?}: more than a response time past its wait"
    );
    redis.start_again(&binary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_shorter_than_the_ttl_loses_no_lease_and_a_release_that_timed_out_is_not_a_loss() {
    let binary = redis_server_binary("pause");
    let redis = PrivateRedis::start(&binary, &[]);
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("pause"),
        ceilings(1 << 20, 8, 1 << 20, 8, 8),
    );
    let fleet = connect(cfg).await;
    let held = fleet.try_acquire(&request("held")).await.expect("fits");
    let released = fleet.try_acquire(&request("released")).await.expect("fits");

    // Every client paused for 1.5 s: renewals, the release below and a new acquisition all
    // queue on the server, time out on the client (700 ms), and are retried.
    let _: redis::Value = command(redis.port, &["CLIENT", "PAUSE", "1500", "ALL"]).await;
    let started = Instant::now();
    released
        .release(Outcome::Completed)
        .await
        .expect("a release whose first attempts timed out on the client is not a lost lease");
    let during = fleet
        .acquire(&request("during"), Duration::from_secs(3))
        .await
        .expect("admitted once the pause ends");
    assert!(started.elapsed() >= Duration::from_millis(1_400));
    assert_eq!(held.loss(), None, "the held lease survived the pause");
    held.renew_now().await.expect("still held on the server");

    let completed = crate::support::leases_of(&fleet, "completed").await;
    assert_eq!(completed, ["released"], "released exactly once");
    held.release(Outcome::Completed).await.expect("released");
    during.release(Outcome::Completed).await.expect("released");
    let snapshot = fleet.snapshot("tenant", "disk").await.expect("snapshot");
    assert_eq!(
        (snapshot.leases, snapshot.occupancy.service_transfers),
        (0, 0)
    );
}

/// The server stops (SIGSTOP) with a try's call on its way, for longer than the try's guard
/// keeps trying to withdraw it (one TTL, 3 s): before every acquisition carried the latest
/// server time at which it may take effect, the server ran the call when it resumed and granted
/// a lease nobody held, for a whole TTL. Now the call is refused there, and nothing is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_that_failed_while_the_server_was_stopped_leaves_nothing_held_once_it_resumes() {
    let binary = redis_server_binary("stopped_try");
    let redis = PrivateRedis::start(&binary, &[]);
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("stopped_try"),
        ceilings(1 << 20, 8, 1 << 20, 8, 8),
    );
    let fleet = connect(cfg).await;

    redis.signal("STOP");
    let error = fleet
        .try_acquire(&request("orphan"))
        .await
        .expect_err("the server does not answer while stopped");
    assert!(
        matches!(error, AcquireError::Unavailable(_)),
        "expected Unavailable, got {error:?}"
    );
    // The guard's withdrawal gives up one TTL (3 s) after it starts; the server stays stopped
    // past that (the stop is the fault under test, not a wait for time to pass).
    let withdrawing = Instant::now();
    fleet.settle().await;
    assert!(withdrawing.elapsed() >= Duration::from_millis(2_900));
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.signal("CONT");
    let snapshot = fleet.snapshot("tenant", "disk").await.expect("snapshot");
    assert_eq!(
        (snapshot.leases, snapshot.occupancy.service_transfers),
        (0, 0),
        "a call that reached the server after its caller gave up took nothing"
    );
    let kinds: Vec<(String, String)> = read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .map(|e| (e.kind, e.lease))
        .collect();
    assert_eq!(
        kinds,
        [],
        "nothing was admitted, so nothing had to be given back"
    );
    // The server answers as before.
    let lease = fleet
        .try_acquire(&request("after"))
        .await
        .expect("admitted");
    lease.release(Outcome::Completed).await.expect("released");
}

/// The same for a wait in the line: a request that waits behind a full cell, its caller gone
/// when the server stops and its ticket's liveness not yet run out, is never granted by a
/// release that the server runs after it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_caller_gave_up_during_a_stop_is_never_granted_after_it() {
    let binary = redis_server_binary("stopped_wait");
    let redis = PrivateRedis::start(&binary, &[]);
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("stopped_wait"),
        ceilings(1 << 20, 1, 1 << 20, 1, 1),
    );
    let holder = connect(cfg.clone()).await;
    let waiter = connect(cfg).await;
    let held = holder.try_acquire(&request("held")).await.expect("held");
    // The waiter asks for 1.2 s; its ticket lives a TTL (3 s) past its last call.
    let asking = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .acquire(&request("late"), Duration::from_millis(1_200))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.signal("STOP");
    // The release goes out while the server is stopped; the waiter's deadline passes, and its
    // withdrawal waits in the socket behind the release.
    let releasing = tokio::spawn(async move { held.release(Outcome::Completed).await });
    let asked = asking.await.expect("task");
    assert!(
        matches!(asked, Err(AcquireError::Unavailable(_))),
        "expected Unavailable, got {asked:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.signal("CONT");
    releasing.await.expect("task").expect("released");
    waiter.settle().await;
    let events = read_events(&waiter).await.expect("events");
    let late: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e.lease == "late")
        .map(|e| (e.kind.as_str(), e.outcome.as_str()))
        .collect();
    // Queued, then out of the line unserved: by the hand-off, which found its caller gone, or by
    // the withdrawal, whichever the server ran first.
    assert_eq!(late.len(), 2, "{late:?}");
    assert_eq!(late[0], ("queued", "queued"));
    assert!(
        late[1] == ("timed_out", "late") || late[1] == ("timed_out", "timed_out"),
        "{late:?}"
    );
    let snapshot = waiter.snapshot("tenant", "disk").await.expect("snapshot");
    assert_eq!(
        (snapshot.leases, snapshot.occupancy.service_transfers),
        (0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_granted_after_a_long_outage_counts_its_deadline_from_the_attempt_that_got_it() {
    let binary = redis_server_binary("late_grant");
    let redis = PrivateRedis::start(&binary, &[]);
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("late_grant"),
        ceilings(1 << 20, 8, 1 << 20, 8, 8),
    );
    let fleet = connect(cfg).await;
    // Stopped for longer than the 3 s TTL while an acquisition with 12 s to wait retries: its
    // first attempt was sent 4 s before any attempt was answered.
    redis.signal("STOP");
    let job = {
        let fleet = fleet.clone();
        tokio::spawn(async move {
            fleet
                .acquire(&request("late"), Duration::from_secs(12))
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    redis.signal("CONT");
    let lease = job
        .await
        .expect("task")
        .expect("admitted once the server is back");
    // The lease's local deadline counts from the attempt that was answered, not from the first
    // one: a deadline counted from the first would have passed before the grant came back, and
    // the lease would be reported lost at once while the server keeps it for a whole TTL.
    let lost = tokio::time::timeout(Duration::from_millis(2_500), lease.lost()).await;
    assert!(lost.is_err(), "lost right after its grant: {:?}", lost.ok());
    lease.renew_now().await.expect("held, and renewed");
    lease
        .release(Outcome::Completed)
        .await
        .expect("released by its holder");
}
