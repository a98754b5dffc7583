//! Local admission first, then the fleet lease: only the byte budget is held while waiting for
//! the cluster, and it goes back on a timeout, a failure, a cancellation or a drop. Plus the
//! round trips per operation and the lease-loss metric.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::{AccountRef, JobContext, Monitor};
use admission_redis::{AcquireError, FleetAdmission, LeaseRequest, Outcome};

use crate::support::{
    PrivateRedis, ceilings, cell, config, connect, redis_server_binary, server, wait_for_event,
};

fn budget(monitor: &Monitor, bytes: u64) -> Arc<CountingGate> {
    Arc::new(CountingGate::new("memory:uploads", bytes, monitor.clock().clone()).expect("gate"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_budget_is_taken_first_and_held_alone_while_the_fleet_is_full() {
    let (host, port) = server("local_first");
    let cell = cell("local_first");
    let fleet = connect(config(&host, port, &cell, ceilings(1_000, 1, 1_000, 1, 1))).await;
    let monitor = Monitor::new();
    let bytes = budget(&monitor, 500);
    let admission = FleetAdmission::new(monitor, vec![bytes.clone() as AccountRef], fleet.clone())
        .expect("admission");

    let first = admission
        .admit(
            &JobContext::new("first"),
            &LeaseRequest::new("first", "t", "d", 300, "upload"),
        )
        .await
        .expect("admitted");
    assert_eq!(
        (bytes.in_use(), first.lease().occupancy().service_bytes),
        (300, 300)
    );

    // The fleet is full (1 transfer): the second job holds its 100 local bytes, and only them,
    // while it waits; a release on the fleet lets it through.
    let second = {
        let admission = Arc::new(admission);
        let waiting = admission.clone();
        let task = tokio::spawn(async move {
            waiting
                .admit(
                    &JobContext::new("second"),
                    &LeaseRequest::new("second", "t", "d", 100, "upload"),
                )
                .await
        });
        wait_for_event(&fleet, &host, port, "queued", "second").await;
        assert_eq!(
            bytes.in_use(),
            400,
            "the waiter holds its byte budget while it waits"
        );
        first.release(Outcome::Completed).await.expect("released");
        let second = task
            .await
            .expect("task")
            .expect("admitted after the release");
        assert_eq!(bytes.in_use(), 100);
        second
    };
    second.release(Outcome::Completed).await.expect("released");
    assert_eq!(bytes.in_use(), 0);
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_while_it_waits_for_the_lease_ends_the_wait_and_holds_nothing() {
    let (host, port) = server("ctx_watched");
    let cell = cell("ctx_watched");
    let fleet = connect(config(&host, port, &cell, ceilings(1_000, 1, 1_000, 1, 1))).await;
    let monitor = Monitor::new();
    let bytes = budget(&monitor, 500);
    let admission = Arc::new(
        FleetAdmission::new(monitor, vec![bytes.clone() as AccountRef], fleet.clone())
            .expect("admission"),
    );
    let held = fleet
        .try_acquire(&LeaseRequest::new("holder", "t", "d", 1, "upload"))
        .await
        .expect("fits");

    // The job waits for the fleet (full) with its 250 local bytes; its context is cancelled
    // from elsewhere, as a caller cancels a job, without touching its future.
    let job = JobContext::new("watched");
    let waiting = admission.clone();
    let ctx = job.clone();
    let task = tokio::spawn(async move {
        waiting
            .admit(&ctx, &LeaseRequest::new("watched", "t", "d", 250, "upload"))
            .await
    });
    wait_for_event(&fleet, &host, port, "queued", "watched").await;
    assert_eq!(bytes.in_use(), 250);
    job.cancel();
    match task.await.expect("task") {
        Err(AcquireError::Local(admission_core::AdmitError::Cancelled { job: id, .. })) => {
            assert_eq!(id, job.id());
        }
        other => panic!("expected the cancellation, got {other:?}"),
    }
    assert_eq!(bytes.in_use(), 0, "the local budget went back");
    // Its ticket left the line: the holder's release admits nobody.
    wait_for_event(&fleet, &host, port, "timed_out", "watched").await;
    held.release(Outcome::Completed).await.expect("released");
    fleet.settle().await;
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!(
        (snapshot.leases, snapshot.occupancy.service_transfers),
        (0, 0)
    );
}

#[tokio::test]
async fn the_local_budget_goes_back_on_timeout_and_on_cancellation() {
    let (host, port) = server("local_back");
    let cell = cell("local_back");
    let mut cfg = config(&host, port, &cell, ceilings(1_000, 1, 1_000, 1, 1));
    cfg.redis_wait = Duration::from_millis(100);
    let fleet = connect(cfg).await;
    let monitor = Monitor::new();
    let bytes = budget(&monitor, 500);
    let admission = Arc::new(
        FleetAdmission::new(monitor, vec![bytes.clone() as AccountRef], fleet.clone())
            .expect("admission"),
    );
    let held = fleet
        .try_acquire(&LeaseRequest::new("holder", "t", "d", 1, "upload"))
        .await
        .expect("fits");

    // Timeout: the Redis wait (100 ms) runs out; the 200 local bytes go back.
    let timed_out = admission
        .admit(
            &JobContext::new("late"),
            &LeaseRequest::new("late", "t", "d", 200, "upload"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(timed_out, AcquireError::TimedOut { .. }),
        "{timed_out}"
    );
    assert_eq!(bytes.in_use(), 0);

    // Cancellation: the job's future is dropped while it waits for the fleet.
    let waiting = admission.clone();
    let task = tokio::spawn(async move {
        waiting
            .admit(
                &JobContext::new("cancelled"),
                &LeaseRequest::new("cancelled", "t", "d", 250, "upload"),
            )
            .await
    });
    wait_for_event(&fleet, &host, port, "queued", "cancelled").await;
    assert_eq!(bytes.in_use(), 250);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(bytes.in_use(), 0);
    wait_for_event(&fleet, &host, port, "timed_out", "cancelled").await;

    // A local refusal never reaches the fleet: 600 bytes can never fit the 500-byte budget.
    let refused = admission
        .admit(
            &JobContext::new("huge"),
            &LeaseRequest::new("huge", "t", "d", 600, "upload"),
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, AcquireError::Local(_)), "{refused}");
    let kinds: Vec<String> = admission_redis::read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.lease == "huge")
        .map(|e| e.kind)
        .collect();
    assert!(kinds.is_empty(), "{kinds:?}");
    held.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn the_local_budget_goes_back_when_redis_fails() {
    let binary = redis_server_binary("local_failure");
    let mut redis = PrivateRedis::start(&binary, &[]);
    let mut cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("local_failure"),
        ceilings(1_000, 2, 1_000, 2, 2),
    );
    cfg.reconnect_retries = 0;
    let fleet = connect(cfg).await;
    let monitor = Monitor::new();
    let bytes = budget(&monitor, 500);
    let admission =
        FleetAdmission::new(monitor, vec![bytes.clone() as AccountRef], fleet).expect("admission");
    redis.stop();
    let failed = admission
        .admit(
            &JobContext::new("j"),
            &LeaseRequest::new("j", "t", "d", 200, "upload"),
        )
        .await
        .unwrap_err();
    assert!(matches!(failed, AcquireError::Unavailable(_)), "{failed}");
    assert_eq!(bytes.in_use(), 0);
}

#[test]
fn an_empty_budget_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let binary = redis_server_binary("empty_budget");
    let redis = PrivateRedis::start(&binary, &[]);
    runtime.block_on(async {
        let fleet = connect(config(
            "127.0.0.1",
            redis.port,
            &cell("empty_budget"),
            ceilings(10, 1, 10, 1, 1),
        ))
        .await;
        let error = FleetAdmission::new(Monitor::new(), Vec::new(), fleet)
            .err()
            .expect("refused");
        assert_eq!(error.field(), "budget");
    });
}

/// Acquire and release are one script call (one round trip) each: counted by the server.
#[tokio::test]
async fn acquire_and_release_are_one_round_trip_each() {
    let binary = redis_server_binary("round_trips");
    let redis = PrivateRedis::start(&binary, &[]);
    let fleet = connect(config(
        "127.0.0.1",
        redis.port,
        &cell("round_trips"),
        ceilings(100, 4, 100, 4, 4),
    ))
    .await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port)).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    // Warm up (the first call loads the script), then count from zero.
    let lease = fleet
        .try_acquire(&LeaseRequest::new("warm", "t", "d", 1, "upload"))
        .await
        .expect("fits");
    lease.release(Outcome::Completed).await.expect("released");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("resetstat");
    for i in 0..10 {
        let lease = fleet
            .try_acquire(&LeaseRequest::new(format!("l{i}"), "t", "d", 1, "upload"))
            .await
            .expect("fits");
        lease.release(Outcome::Completed).await.expect("released");
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("info");
    let calls = |command: &str| -> u64 {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(calls("fcall"), 20, "{stats}");
    // commandstats also counts the commands the script runs inside; none of those a client
    // could send as a round trip of its own shows up.
    for extra in [
        "eval",
        "evalsha",
        "function|load",
        "script",
        "multi",
        "exec",
        "ping",
        "xread",
        "xrange",
    ] {
        assert_eq!(calls(extra), 0, "{extra} ran: {stats}");
    }
}
