//! Leases on the shared server: atomicity across instances, the five dimensions, never-fit
//! refusals, tenant overrides, quotas, renewal, loss, fencing and the stream's bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use admission_redis::{
    AcquireError, ConnectError, Dimension, LeaseError, LeaseRequest, LossReason, NeverReason,
    Outcome, PolicyError, QuotaError, QuotaKind, Quotas, hashed_id, read_events,
};

use crate::support::{ceilings, cell, config, connect, full, kinds, lease, server, wait_for_event};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_never_hold_more_than_the_ceiling_and_end_at_zero() {
    let (host, port) = server("two_instances");
    const K: u64 = 5;
    let cell = cell("two_instances");
    let a = connect(config(
        &host,
        port,
        &cell,
        ceilings(1 << 30, K, 1 << 30, K, K),
    ))
    .await;
    let b = connect(config(
        &host,
        port,
        &cell,
        ceilings(1 << 30, K, 1 << 30, K, K),
    ))
    .await;
    let held = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let seen_over = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // 2 instances x 32 tasks, 500 acquisitions in all (8 tasks do 7, the rest 8).
    for task in 0..64u64 {
        let admission = if task % 2 == 0 { a.clone() } else { b.clone() };
        let (held, peak, seen_over) = (held.clone(), peak.clone(), seen_over.clone());
        let rounds = if task < 12 { 7 } else { 8 };
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let request = LeaseRequest::new(
                    format!("t{task}-r{round}"),
                    "tenant",
                    "disk",
                    1024,
                    "upload",
                );
                let lease = admission
                    .acquire(&request, Duration::from_secs(5))
                    .await
                    .expect("a lease");
                let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                if lease.occupancy().service_transfers > K {
                    seen_over.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                held.fetch_sub(1, Ordering::SeqCst);
                lease.release(Outcome::Completed).await.expect("released");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert!(
        peak.load(Ordering::SeqCst) <= K,
        "peak {} over {K}",
        peak.load(Ordering::SeqCst)
    );
    assert_eq!(seen_over.load(Ordering::SeqCst), 0);
    let snapshot = a.snapshot("tenant", "disk").await.expect("snapshot");
    assert_eq!(snapshot.occupancy, Default::default());
    assert_eq!(snapshot.leases, 0);
    let events = read_events(&a).await.expect("events");
    assert_eq!(events.iter().filter(|e| e.kind == "admitted").count(), 500);
    assert_eq!(events.iter().filter(|e| e.kind == "completed").count(), 500);
    assert!(events.iter().all(|e| e.occupancy.service_transfers <= K));
}

#[tokio::test]
async fn each_dimension_refuses_with_its_numbers() {
    let (host, port) = server("dimensions");
    let cell = cell("dimensions");
    // service 1000 bytes / 4 transfers; tenant 600 / 2; backend 3.
    let fleet = connect(config(&host, port, &cell, ceilings(1000, 4, 600, 2, 3))).await;
    let l1 = lease(&fleet, "a1", "acme", "d1", 500).await;
    assert_eq!(
        (l1.occupancy().service_bytes, l1.occupancy().tenant_bytes),
        (500, 500)
    );
    use Dimension::*;
    assert_eq!(
        full(&fleet, "a2", "acme", "d1", 200).await,
        (TenantBytes, 500, 200, 600)
    );
    let l2 = lease(&fleet, "a3", "acme", "d1", 50).await;
    assert_eq!(
        full(&fleet, "a4", "acme", "d2", 1).await,
        (TenantTransfers, 2, 1, 2)
    );
    let l3 = lease(&fleet, "b1", "bolt", "d1", 300).await;
    assert_eq!(
        full(&fleet, "b2", "bolt", "d1", 200).await,
        (ServiceBytes, 850, 200, 1000)
    );
    assert_eq!(
        full(&fleet, "b3", "bolt", "d1", 10).await,
        (BackendTransfers, 3, 1, 3)
    );
    let refused = fleet
        .try_acquire(&LeaseRequest::new("b3", "bolt", "d1", 10, "upload"))
        .await;
    assert_eq!(
        refused.unwrap_err().to_string(),
        "admission-redis: no room on backend_transfers: 3 held + 1 asked > ceiling 3"
    );
    let l4 = lease(&fleet, "c1", "corp", "d2", 10).await;
    assert_eq!(
        full(&fleet, "c2", "corp", "d3", 10).await,
        (ServiceTransfers, 4, 1, 4)
    );
    for lease in [l1, l2, l3, l4] {
        lease.release(Outcome::Completed).await.expect("released");
    }
    let snapshot = fleet.snapshot("acme", "d1").await.expect("snapshot");
    assert_eq!(snapshot.occupancy, Default::default());
}

#[tokio::test]
async fn a_request_that_can_never_fit_is_refused_at_once() {
    let (host, port) = server("never");
    let cell = cell("never");
    let mut cfg = config(&host, port, &cell, ceilings(1000, 4, 600, 2, 3));
    cfg.redis_wait = Duration::from_secs(20);
    let fleet = connect(cfg).await;
    let wait = Duration::from_secs(20);
    let start = tokio::time::Instant::now();
    let refuse = |r: Result<admission_redis::Lease, AcquireError>| match r {
        Err(AcquireError::Never { reason }) => reason,
        other => panic!("expected a refusal for good, got {other:?}"),
    };
    let zero = refuse(
        fleet
            .acquire(&LeaseRequest::new("z", "t", "d", 0, "upload"), wait)
            .await,
    );
    assert_eq!(zero, NeverReason::EmptyFootprint);
    let over = refuse(
        fleet
            .acquire(&LeaseRequest::new("o", "t", "d", 1001, "upload"), wait)
            .await,
    );
    assert_eq!(
        over,
        NeverReason::OverCeiling {
            dimension: Dimension::ServiceBytes,
            asked: 1001,
            ceiling: 1000
        }
    );
    let tenant = refuse(
        fleet
            .acquire(&LeaseRequest::new("p", "t", "d", 601, "upload"), wait)
            .await,
    );
    assert_eq!(
        tenant,
        NeverReason::OverCeiling {
            dimension: Dimension::TenantBytes,
            asked: 601,
            ceiling: 600
        }
    );
    // An override counts: lowered to 100 bytes, 101 can never fit.
    fleet
        .set_tenant_override("t", 100, 1)
        .await
        .expect("override");
    let lowered = refuse(
        fleet
            .acquire(&LeaseRequest::new("q", "t", "d", 101, "upload"), wait)
            .await,
    );
    assert_eq!(
        lowered,
        NeverReason::OverCeiling {
            dimension: Dimension::TenantBytes,
            asked: 101,
            ceiling: 100
        }
    );
    let held = fleet
        .try_acquire(&LeaseRequest::new("dup", "u", "d", 1, "upload"))
        .await
        .expect("fits");
    let dup = refuse(
        fleet
            .acquire(&LeaseRequest::new("dup", "u", "d", 1, "upload"), wait)
            .await,
    );
    assert_eq!(dup, NeverReason::DuplicateId("dup".into()));
    let bad = refuse(
        fleet
            .acquire(&LeaseRequest::new("has space", "u", "d", 1, "upload"), wait)
            .await,
    );
    assert_eq!(bad, NeverReason::BadId("has space".into()));
    let op = refuse(
        fleet
            .acquire(&LeaseRequest::new("x", "u", "d", 1, "Upload!"), wait)
            .await,
    );
    assert_eq!(op, NeverReason::BadOperation("Upload!".into()));
    // None of them waited (each would otherwise have waited 20 s).
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "refusals took {:?}",
        start.elapsed()
    );
    held.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn tenants_are_independent_under_a_shared_service_ceiling() {
    let (host, port) = server("tenants");
    let cell = cell("tenants");
    let fleet = connect(config(
        &host,
        port,
        &cell,
        ceilings(10_000, 6, 10_000, 2, 6),
    ))
    .await;
    let mut held = Vec::new();
    for i in 0..2 {
        held.push(lease(&fleet, &format!("a{i}"), "acme", "d", 10).await);
    }
    let acme_full = full(&fleet, "a2", "acme", "d", 10).await;
    assert_eq!(acme_full, (Dimension::TenantTransfers, 2, 1, 2));
    // Acme being full takes nothing from bolt: bolt gets its own two.
    for i in 0..2 {
        let lease = lease(&fleet, &format!("b{i}"), "bolt", "d", 10).await;
        assert_eq!(lease.occupancy().tenant_transfers, i + 1);
        assert_eq!(lease.occupancy().service_transfers, 3 + i);
        held.push(lease);
    }
    let snapshot = fleet.snapshot("acme", "d").await.expect("snapshot");
    assert_eq!(
        (
            snapshot.occupancy.tenant_transfers,
            snapshot.occupancy.service_transfers
        ),
        (2, 4)
    );
    for lease in held {
        lease.release(Outcome::Completed).await.expect("released");
    }
}

#[tokio::test]
async fn a_live_override_applies_to_every_instance_and_clearing_restores_the_default() {
    let (host, port) = server("override");
    let cell = cell("override");
    let a = connect(config(
        &host,
        port,
        &cell,
        ceilings(10_000, 10, 1_000, 2, 10),
    ))
    .await;
    let b = connect(config(
        &host,
        port,
        &cell,
        ceilings(10_000, 10, 1_000, 2, 10),
    ))
    .await;
    let v0 = a
        .snapshot("acme", "d")
        .await
        .expect("snapshot")
        .policy_version;
    let v1 = a
        .set_tenant_override("acme", 5_000, 5)
        .await
        .expect("override");
    assert!(v1 > v0, "{v1} > {v0}");
    let seen = b.snapshot("acme", "d").await.expect("snapshot");
    assert_eq!(
        (
            seen.policy_version,
            seen.tenant_bytes_ceiling,
            seen.tenant_transfers_ceiling
        ),
        (v1, 5_000, 5)
    );
    let lease = b
        .try_acquire(&LeaseRequest::new("big", "acme", "d", 4_000, "upload"))
        .await
        .expect("fits under the override");
    assert_eq!(lease.policy_version(), v1);
    // Other tenants keep the default.
    let other = b.snapshot("bolt", "d").await.expect("snapshot");
    assert_eq!(
        (other.tenant_bytes_ceiling, other.tenant_transfers_ceiling),
        (1_000, 2)
    );
    let v2 = b.clear_tenant_override("acme").await.expect("cleared");
    assert!(v2 > v1);
    let restored = a.snapshot("acme", "d").await.expect("snapshot");
    assert_eq!(
        (
            restored.policy_version,
            restored.tenant_bytes_ceiling,
            restored.tenant_transfers_ceiling
        ),
        (v2, 1_000, 2)
    );
    let refused = a
        .try_acquire(&LeaseRequest::new("big2", "acme", "d", 4_000, "upload"))
        .await
        .unwrap_err();
    assert!(matches!(
        refused,
        AcquireError::Never {
            reason: NeverReason::OverCeiling {
                dimension: Dimension::TenantBytes,
                asked: 4_000,
                ceiling: 1_000
            }
        }
    ));
    // Over the service's ceiling is refused before it reaches Redis, naming the field.
    let invalid = a.set_tenant_override("acme", 10_001, 1).await.unwrap_err();
    assert!(matches!(
        invalid,
        PolicyError::Invalid {
            field: "bytes",
            value: 10_001,
            max: 10_000
        }
    ));
    let events = read_events(&a).await.expect("events");
    let changes: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "policy_changed")
        .map(|e| (e.outcome.as_str(), e.policy_version))
        .collect();
    assert_eq!(changes, vec![("set", v1), ("cleared", v2)]);
    lease.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn quotas_are_exact_across_instances_and_name_the_window_end() {
    let (host, port) = server("quotas");
    let cell = cell("quotas");
    let mut cfg = config(&host, port, &cell, ceilings(1000, 10, 1000, 10, 10));
    cfg.quotas = Some(Quotas {
        requests_per_minute: 7,
        bytes_per_hour: 1_000,
    });
    let a = connect(cfg.clone()).await;
    let b = connect(cfg).await;
    // Line the cell's clock up with the start of a minute, so the window cannot roll mid-test.
    let now = a.snapshot("x", "y").await.expect("snapshot").server_time_ms;
    a.advance_server_clock(Duration::from_millis(60_000 - now % 60_000))
        .await
        .expect("skew");
    let mut charges = Vec::new();
    for i in 0..7 {
        let fleet = if i % 2 == 0 { &a } else { &b };
        charges.push(
            fleet
                .charge_request("acme")
                .await
                .expect("within quota")
                .used,
        );
    }
    assert_eq!(charges, vec![1, 2, 3, 4, 5, 6, 7]);
    let over = b.charge_request("acme").await.unwrap_err();
    let QuotaError::Exceeded {
        kind,
        used,
        asked,
        limit,
        retry_after,
    } = over
    else {
        panic!("{over:?}")
    };
    assert_eq!((kind, used, asked, limit), (QuotaKind::Requests, 7, 1, 7));
    // The window ends in 60 s less the few milliseconds this test took: rounded up, 60 s.
    assert_eq!(retry_after, Duration::from_secs(60));
    // Another tenant has its own count.
    assert_eq!(a.charge_request("bolt").await.expect("bolt").used, 1);
    // The next minute on the server's clock starts afresh.
    a.advance_server_clock(Duration::from_secs(60))
        .await
        .expect("skew");
    assert_eq!(b.charge_request("acme").await.expect("new window").used, 1);
    // Bytes per hour: 600 + 400 fit, 1 more does not.
    assert_eq!(
        a.charge_delivered("acme", 600).await.expect("fits").used,
        600
    );
    assert_eq!(
        b.charge_delivered("acme", 400).await.expect("fits").used,
        1_000
    );
    let over = a.charge_delivered("acme", 1).await.unwrap_err();
    assert!(matches!(
        over,
        QuotaError::Exceeded {
            kind: QuotaKind::DeliveredBytes,
            used: 1_000,
            asked: 1,
            limit: 1_000,
            ..
        }
    ));
    let left = over.retry_after().expect("retry after");
    assert!(
        left >= Duration::from_secs(1) && left <= Duration::from_secs(3_600),
        "{left:?}"
    );
    assert_eq!(left.subsec_nanos(), 0, "whole seconds");
}

#[tokio::test]
async fn quotas_not_enabled_are_refused_typed() {
    let (host, port) = server("quotas_off");
    let fleet = connect(config(
        &host,
        port,
        &cell("quotas_off"),
        ceilings(10, 1, 10, 1, 1),
    ))
    .await;
    assert!(matches!(
        fleet.charge_request("acme").await,
        Err(QuotaError::NotEnabled)
    ));
}

#[tokio::test]
async fn a_renewed_lease_outlives_its_first_ttl_and_an_unrenewed_one_is_reaped_on_server_time() {
    let (host, port) = server("renewal");
    let cell = cell("renewal");
    let fleet = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
    let lease = fleet
        .try_acquire(&LeaseRequest::new("keep", "t", "d", 10, "upload"))
        .await
        .expect("fits");
    // TTL 3 s. Two server seconds, renew, two more: four seconds past admission, still held.
    fleet
        .advance_server_clock(Duration::from_secs(2))
        .await
        .expect("skew");
    lease.renew_now().await.expect("renewed");
    fleet
        .advance_server_clock(Duration::from_secs(2))
        .await
        .expect("skew");
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!(
        (
            snapshot.leases,
            snapshot.reaped,
            snapshot.occupancy.service_bytes
        ),
        (1, 0, 10)
    );
    lease.renew_now().await.expect("renewed past the first TTL");
    // Now four server seconds with no renewal: past the TTL, the next call reaps it.
    fleet
        .advance_server_clock(Duration::from_secs(4))
        .await
        .expect("skew");
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!(
        (
            snapshot.leases,
            snapshot.reaped,
            snapshot.occupancy.service_bytes
        ),
        (1 - 1, 1, 0)
    );
    let expired = wait_for_event(&fleet, &host, port, "expired", "keep").await;
    assert_eq!(
        (
            expired.token,
            expired.footprint,
            expired.occupancy.service_bytes
        ),
        (lease.token().0, 10, 0)
    );
    // The holder learns it at its next renewal, and `lost` resolves.
    assert!(matches!(
        lease.renew_now().await,
        Err(LeaseError::Lost { .. })
    ));
    assert_eq!(lease.lost().await, LossReason::Lost);
    assert_eq!(lease.loss(), Some(LossReason::Lost));
}

#[tokio::test]
async fn the_background_renewal_renews_every_lease_in_one_call_and_reports_the_lost_one() {
    let (host, port) = server("batch_renewal");
    let cell = cell("batch_renewal");
    let fleet = connect(config(&host, port, &cell, ceilings(100, 4, 100, 4, 4))).await;
    let mut leases = Vec::new();
    for i in 0..3 {
        leases.push(
            fleet
                .try_acquire(&LeaseRequest::new(format!("b{i}"), "t", "d", 10, "upload"))
                .await
                .expect("fits"),
        );
    }
    // One of the three is released behind its holder's back.
    fleet
        .release_lease("b1", leases[1].token(), Outcome::Failed)
        .await
        .expect("released");
    // Two server seconds, the background renewal (all three in one call), two more seconds:
    // four seconds after admission, past the 3 s TTL, the two renewed leases are still held.
    fleet
        .advance_server_clock(Duration::from_secs(2))
        .await
        .expect("skew");
    fleet.renew_all_now().await;
    fleet
        .advance_server_clock(Duration::from_secs(2))
        .await
        .expect("skew");
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!(
        (
            snapshot.leases,
            snapshot.reaped,
            snapshot.occupancy.service_bytes
        ),
        (2, 0, 20)
    );
    assert_eq!(leases[1].loss(), Some(LossReason::Lost));
    assert_eq!((leases[0].loss(), leases[2].loss()), (None, None));
    // Without another renewal, two more seconds reap both.
    fleet
        .advance_server_clock(Duration::from_secs(2))
        .await
        .expect("skew");
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((snapshot.leases, snapshot.reaped), (0, 2));
}

#[tokio::test]
async fn an_externally_released_lease_is_lost_to_its_holder_and_a_stale_holder_cannot_touch_the_new_one()
 {
    let (host, port) = server("stale");
    let cell = cell("stale");
    let a = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
    let b = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
    let old = a
        .try_acquire(&LeaseRequest::new("job-1", "t", "d", 10, "upload"))
        .await
        .expect("fits");
    b.release_lease("job-1", old.token(), Outcome::Failed)
        .await
        .expect("released by an operator");
    assert!(matches!(
        old.renew_now().await,
        Err(LeaseError::Lost { .. })
    ));
    assert_eq!(old.lost().await, LossReason::Lost);
    // The id is taken again; the old holder's token is now stale.
    let new = b
        .try_acquire(&LeaseRequest::new("job-1", "t", "d", 20, "upload"))
        .await
        .expect("fits");
    assert!(new.token() > old.token());
    let stale = a
        .release_lease("job-1", old.token(), Outcome::Completed)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, LeaseError::Stale { token, current, .. } if token == old.token().0 && current == new.token().0),
        "{stale}"
    );
    let old_token = old.token();
    let stale = old.renew_now().await.unwrap_err();
    assert!(
        matches!(stale, LeaseError::Stale { current, .. } if current == new.token().0),
        "{stale}"
    );
    let stale = old.release(Outcome::Completed).await.unwrap_err();
    assert!(matches!(stale, LeaseError::Stale { .. }));
    // The new lease was not touched: still held, with its 20 bytes.
    let snapshot = a.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((snapshot.leases, snapshot.occupancy.service_bytes), (1, 20));
    new.renew_now().await.expect("the new holder renews");
    assert!(matches!(
        a.release_lease("job-1", old_token, Outcome::Completed)
            .await,
        Err(LeaseError::Stale { .. })
    ));
    new.release(Outcome::Completed).await.expect("released");
    assert_eq!(
        a.snapshot("t", "d").await.expect("snapshot").occupancy,
        Default::default()
    );
}

#[tokio::test]
async fn a_dropped_lease_is_released_as_interrupted() {
    let (host, port) = server("drop");
    let cell = cell("drop");
    let fleet = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
    let holder = {
        let fleet = fleet.clone();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let lease = fleet
                .try_acquire(&LeaseRequest::new("cancelled", "t", "d", 10, "upload"))
                .await
                .expect("fits");
            held_tx.send(lease.token()).expect("told");
            let _held = lease;
            std::future::pending::<()>().await;
        });
        let token = held_rx.await.expect("held");
        task.abort();
        let _ = task.await;
        token
    };
    // `settle` waits for the release the drop spawned: no waiting on the stream needed.
    fleet.settle().await;
    let events = admission_redis::read_events(&fleet).await.expect("events");
    let event = events
        .iter()
        .find(|e| e.kind == "interrupted")
        .expect("the drop's release");
    assert_eq!(
        (
            event.token,
            event.outcome.as_str(),
            event.occupancy.service_transfers
        ),
        (holder.0, "interrupted", 0)
    );
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_a_release_on_another_instance() {
    let (host, port) = server("wake");
    let cell = cell("wake");
    let a = connect(config(&host, port, &cell, ceilings(100, 1, 100, 1, 1))).await;
    let b = connect(config(&host, port, &cell, ceilings(100, 1, 100, 1, 1))).await;
    let held = a
        .try_acquire(&LeaseRequest::new("first", "t", "d", 10, "upload"))
        .await
        .expect("fits");
    let waiter = tokio::spawn(async move {
        b.acquire(
            &LeaseRequest::new("second", "t", "d", 10, "upload"),
            Duration::from_secs(5),
        )
        .await
    });
    // Once the waiter is queued (its event is in the stream), release on the other instance.
    wait_for_event(&a, &host, port, "queued", "second").await;
    held.release(Outcome::Completed).await.expect("released");
    let lease = waiter.await.expect("task").expect("woken and admitted");
    assert!(lease.token().0 > 0);
    let kinds = kinds(&a).await;
    assert_eq!(kinds, vec!["admitted", "queued", "completed", "admitted"]);
    lease.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn a_wait_that_times_out_records_it_and_takes_nothing() {
    let (host, port) = server("timeout");
    let cell = cell("timeout");
    let fleet = connect(config(&host, port, &cell, ceilings(100, 1, 100, 1, 1))).await;
    let held = fleet
        .try_acquire(&LeaseRequest::new("first", "t", "d", 10, "upload"))
        .await
        .expect("fits");
    let err = fleet
        .acquire(
            &LeaseRequest::new("second", "t", "d", 10, "upload"),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    let AcquireError::TimedOut {
        waited,
        dimension,
        held: h,
        asked,
        ceiling,
    } = err
    else {
        panic!("{err:?}")
    };
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert_eq!(
        (dimension, h, asked, ceiling),
        (Dimension::ServiceTransfers, 1, 1, 1)
    );
    assert_eq!(kinds(&fleet).await, vec!["admitted", "queued", "timed_out"]);
    assert_eq!(fleet.snapshot("t", "d").await.expect("snapshot").leases, 1);
    held.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn the_stream_stays_bounded_and_raw_tenant_ids_never_reach_redis() {
    let (host, port) = server("bounded");
    let cell = cell("bounded");
    let mut cfg = config(&host, port, &cell, ceilings(100, 2, 100, 2, 2));
    cfg.events_max_len = 10;
    let fleet = connect(cfg).await;
    // 50 leases, 100 records: the stream is trimmed (whole nodes at a time, `MAXLEN ~`) to at
    // least 10 records and at most 10 plus one node (100 records).
    for i in 0..50 {
        let lease = fleet
            .try_acquire(&LeaseRequest::new(
                format!("l{i}"),
                "Acme Corp <secret>",
                "disk-a",
                1,
                "upload",
            ))
            .await
            .expect("fits");
        lease.release(Outcome::Completed).await.expect("released");
    }
    let events = read_events(&fleet).await.expect("events");
    assert!(
        (10..100).contains(&events.len()),
        "{} records kept of 100 written, events_max_len 10",
        events.len()
    );
    assert_eq!(
        fleet.snapshot("x", "y").await.expect("snapshot").events,
        events.len() as u64
    );
    // What is kept is the newest records, in order, with no gap.
    let written: Vec<(String, String)> = (0..50)
        .flat_map(|i| [("admitted", i), ("completed", i)])
        .map(|(kind, i)| (kind.to_owned(), format!("l{i}")))
        .collect();
    let kept: Vec<(String, String)> = events
        .iter()
        .map(|e| (e.kind.clone(), e.lease.clone()))
        .collect();
    assert_eq!(kept, written[100 - events.len()..]);
    let last = events.last().expect("one");
    assert_eq!(
        (
            last.kind.as_str(),
            last.lease.as_str(),
            last.schema.as_str()
        ),
        ("completed", "l49", "admission-event-v1")
    );
    assert_eq!(last.tenant, hashed_id("Acme Corp <secret>"));
    assert_eq!(last.tenant.len(), 64);
    // No key and no value of the cell mentions the raw tenant id.
    let client = redis::Client::open(format!("redis://{host}:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let keys: Vec<String> = redis::AsyncCommands::keys(&mut conn, format!("it:{{{cell}}}:*"))
        .await
        .expect("keys");
    assert!(!keys.is_empty());
    for key in keys {
        assert!(!key.contains("Acme"), "{key}");
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("dump");
        assert!(
            !String::from_utf8_lossy(&dump).contains("Acme"),
            "{key} holds the raw tenant id"
        );
    }
}

#[tokio::test]
async fn a_second_instance_with_other_ceilings_is_refused() {
    let (host, port) = server("mismatch");
    let cell = cell("mismatch");
    let _a = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
    let b = admission_redis::RedisAdmission::connect(config(
        &host,
        port,
        &cell,
        ceilings(100, 3, 100, 2, 2),
    ))
    .await;
    match b {
        Err(ConnectError::Mismatch {
            cell: c,
            stored,
            ours,
        }) => {
            assert_eq!(c, cell);
            assert_ne!(stored, ours);
        }
        other => panic!("expected a mismatch, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn the_script_survives_a_flushed_script_cache() {
    let (host, port) = server("noscript");
    let cell = cell("noscript");
    let fleet = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
    let client = redis::Client::open(format!("redis://{host}:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("flush");
    let lease = fleet
        .try_acquire(&LeaseRequest::new("after-flush", "t", "d", 1, "upload"))
        .await
        .expect("reloaded on NOSCRIPT");
    lease.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn fencing_tokens_rise_across_leases_and_instances() {
    let (host, port) = server("tokens");
    let cell = cell("tokens");
    let a = connect(config(&host, port, &cell, ceilings(100, 10, 100, 10, 10))).await;
    let b = connect(config(&host, port, &cell, ceilings(100, 10, 100, 10, 10))).await;
    let mut last = 0;
    for i in 0..20 {
        let fleet = if i % 2 == 0 { &a } else { &b };
        let lease = fleet
            .try_acquire(&LeaseRequest::new(format!("k{i}"), "t", "d", 1, "upload"))
            .await
            .expect("fits");
        assert!(lease.token().0 > last, "{} after {last}", lease.token());
        last = lease.token().0;
        lease.release(Outcome::Completed).await.expect("released");
    }
    assert_eq!(
        a.snapshot("t", "d").await.expect("snapshot").last_token,
        last
    );
}
