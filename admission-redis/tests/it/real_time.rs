//! The background tasks in real time, against the real server: no fake clock, no renewal by
//! hand. A fake clock proves the arithmetic of renewal and expiry; only real time proves that the
//! renewal task runs when it must, on a machine that is busy with other work.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission_redis::{LeaseRequest, Outcome, read_events};

use crate::support::{ceilings, cell, config, connect, server};

/// Two threads that spin until told to stop: the machine is busy while the leases are held.
struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Busy {
    fn start(threads: usize) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut spins = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        spins = std::hint::black_box(spins.wrapping_add(1));
                    }
                    spins
                })
            })
            .collect();
        Busy { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_left_to_background_renewal_outlive_several_ttls_on_a_busy_machine() {
    let (host, port) = server("background_renewal");
    let cell = cell("background_renewal");
    // TTL 3 s, renewed every second, by the background task only.
    let fleet = connect(config(
        &host,
        port,
        &cell,
        ceilings(1 << 30, 8, 1 << 30, 8, 8),
    ))
    .await;
    let _busy = Busy::start(2);
    let mut leases = Vec::new();
    for i in 0..3 {
        let request = LeaseRequest::new(format!("held-{i}"), "tenant", "disk", 1024, "upload");
        leases.push(fleet.try_acquire(&request).await.expect("fits"));
    }
    // Held for ten seconds of real time: more than three TTLs. Without a renewal in time the
    // server reaps each lease at its third second, and the holder learns of it at the next
    // renewal attempt.
    let held_for = Duration::from_secs(10);
    let lost = tokio::time::timeout(
        held_for,
        futures::future::select_all(leases.iter().map(|l| Box::pin(l.lost()))),
    )
    .await;
    if let Ok((reason, i, _)) = lost {
        panic!("lease held-{i} was lost while its holder kept it: {reason}");
    }
    for lease in &leases {
        assert_eq!(lease.loss(), None, "{} lost", lease.id());
    }
    let snapshot = fleet.snapshot("tenant", "disk").await.expect("snapshot");
    assert_eq!(snapshot.leases, 3, "the server still holds all three");
    assert_eq!(snapshot.occupancy.service_transfers, 3);
    for lease in leases {
        lease
            .release(Outcome::Completed)
            .await
            .expect("released by its holder, never reaped");
    }
    let kinds: Vec<String> = read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "expired").count(),
        0,
        "no lease expired on the server: {kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| *k == "completed").count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_elsewhere_is_reported_lost_by_the_background_renewal() {
    let (host, port) = server("lost_in_real_time");
    let cell = cell("lost_in_real_time");
    let holder = connect(config(
        &host,
        port,
        &cell,
        ceilings(1 << 30, 8, 1 << 30, 8, 8),
    ))
    .await;
    let operator = connect(config(
        &host,
        port,
        &cell,
        ceilings(1 << 30, 8, 1 << 30, 8, 8),
    ))
    .await;
    let _busy = Busy::start(2);
    let request = LeaseRequest::new("taken-away", "tenant", "disk", 1024, "upload");
    let lease = holder.try_acquire(&request).await.expect("fits");
    operator
        .release_lease("taken-away", lease.token(), Outcome::Failed)
        .await
        .expect("released by the operator");
    // Nobody renews by hand: the holder's background renewal (every second) learns it.
    let started = std::time::Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("the loss is reported by the background renewal");
    assert_eq!(reason, admission_redis::LossReason::Lost);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "reported after {:?}, more than a TTL: the renewal did not run on schedule",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_for_a_ttl_reports_its_lease_unrenewed_and_the_server_reaps_it() {
    let binary = crate::support::redis_server_binary("cut_off");
    let redis = crate::support::PrivateRedis::start(&binary, &[]);
    let fleet = connect(config(
        "127.0.0.1",
        redis.port,
        &cell("cut_off"),
        ceilings(1 << 30, 8, 1 << 30, 8, 8),
    ))
    .await;
    let lease = fleet
        .try_acquire(&LeaseRequest::new(
            "cut-off", "tenant", "disk", 1024, "upload",
        ))
        .await
        .expect("fits");
    // The server stops answering (SIGSTOP) for longer than the 3 s TTL: no renewal gets
    // through, and past the local deadline (the last successful send plus the TTL) the holder
    // must presume its lease expired.
    redis.signal("STOP");
    let reason = tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("the loss is reported once the local deadline passes");
    assert!(
        matches!(reason, admission_redis::LossReason::Unrenewed { .. }),
        "expected Unrenewed, got {reason}"
    );
    redis.signal("CONT");
    // The server, on its own clock, reaps the lease at the next call.
    let snapshot = fleet.snapshot("tenant", "disk").await.expect("snapshot");
    assert_eq!(
        (snapshot.leases, snapshot.occupancy.service_transfers),
        (0, 0)
    );
    let expired = crate::support::leases_of(&fleet, "expired").await;
    assert_eq!(expired, ["cut-off"]);
}
