//! Rules of the script that a mutation would otherwise survive: the hand-off's reservation for the
//! line's head, the bound on reaping per call, the `failed` kind, the backend digest, every key of
//! a cell under one hash tag and expiring when the cell is idle, a renewal that never brings an
//! expired lease back, and a production script with no way to move time.

use std::time::Duration;

use admission_redis::{
    LeaseError, LeaseRequest, Outcome, hashed_id, production_script_source, read_events,
    script_source,
};

use crate::support::{
    ceilings, cell, config, connect, lease, server, spawn_acquire, wait_for_event,
};

async fn raw_connection(host: &str, port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{host}:{port}/"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("conn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hand_off_keeps_the_heads_reservation_from_a_follower_that_fits_alone() {
    let (host, port) = server("handoff_reservation");
    let cell = cell("handoff_reservation");
    // The tenant's bytes are the scarce dimension (10); the service has room to spare, so the
    // hand-off's walk does not stop at the head for lack of service bytes.
    let fleet = connect(config(&host, port, &cell, ceilings(100, 10, 10, 10, 10))).await;
    // Nine of the tenant's ten bytes held, by 8 + 1.
    let big = lease(&fleet, "big", "t", "d", 8).await;
    let small = lease(&fleet, "small", "t", "d", 1).await;
    // The head wants 5 (short on tenant bytes); a follower of the same tenant wants 1, which
    // fits alone (9 + 1), but not beside the head: it waits behind it.
    let head = spawn_acquire(&fleet, "head", "t", "d", 5, Duration::from_secs(10));
    wait_for_event(&fleet, &host, port, "queued", "head").await;
    let follower = spawn_acquire(&fleet, "follower", "t", "d", 1, Duration::from_secs(10));
    wait_for_event(&fleet, &host, port, "queued", "follower").await;

    // One byte comes back (8 held): the head still does not fit (8 + 5 > 10), and the hand-off
    // must not give the follower the byte (8 + 1 fits alone) that the head waits for.
    small.release(Outcome::Completed).await.expect("released");
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!(
        (snapshot.occupancy.tenant_bytes, snapshot.leases),
        (8, 1),
        "the hand-off granted a follower what the head waits for"
    );
    assert!(!head.is_finished() && !follower.is_finished());

    // Everything back: the head first, then the follower beside it.
    big.release(Outcome::Completed).await.expect("released");
    let head = head.await.expect("task").expect("the head is granted");
    let follower = follower
        .await
        .expect("task")
        .expect("the follower is granted");
    assert!(head.token() < follower.token(), "granted in ticket order");
    let handoffs: Vec<String> = read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == "admitted" && e.outcome == "handoff")
        .map(|e| e.lease)
        .collect();
    assert_eq!(handoffs, ["head", "follower"]);
    head.release(Outcome::Completed).await.expect("released");
    follower
        .release(Outcome::Completed)
        .await
        .expect("released");
}

#[tokio::test]
async fn one_call_reaps_at_most_reap_batch_expired_leases() {
    let (host, port) = server("reap_bound");
    let mut cfg = config(
        &host,
        port,
        &cell("reap_bound"),
        ceilings(100, 10, 100, 10, 10),
    );
    cfg.reap_batch = 2;
    let fleet = connect(cfg).await;
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(lease(&fleet, &format!("l{i}"), "t", "d", 1).await);
    }
    // Past every lease's TTL on the cell's clock: each call reaps two.
    fleet
        .advance_server_clock(Duration::from_secs(4))
        .await
        .expect("skew");
    let first = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((first.reaped, first.leases), (2, 3));
    let second = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((second.reaped, second.leases), (2, 1));
    let third = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((third.reaped, third.leases), (1, 0));
    let expired = crate::support::leases_of(&fleet, "expired").await;
    assert_eq!(expired.len(), 5);
    drop(held);
}

#[tokio::test]
async fn the_reap_skips_the_expiries_only_until_the_earliest_one_left() {
    // The reap reads the expiries only once the cell's `ne` (no lease expires before it) has
    // passed, and then sets it to the earliest expiry left: not a later one, or a lease in
    // between would outlive its TTL.
    let (host, port) = server("reap_skip");
    let fleet = connect(config(
        &host,
        port,
        &cell("reap_skip"),
        ceilings(100, 10, 100, 10, 10),
    ))
    .await;
    let clock = |ms| fleet.advance_server_clock(Duration::from_millis(ms));
    // TTL 3 s: `a` expires at 3.0 s, `b` at 4.0 s, `c` at 5.0 s on the cell's clock.
    let a = lease(&fleet, "a", "t", "d", 1).await;
    clock(1_000).await.expect("skew");
    let b = lease(&fleet, "b", "t", "d", 1).await;
    clock(1_000).await.expect("skew");
    let c = lease(&fleet, "c", "t", "d", 1).await;
    // 3.1 s: `a` is reaped; the earliest expiry left is `b`'s.
    clock(1_100).await.expect("skew");
    let first = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((first.reaped, first.leases), (1, 2));
    // 4.1 s: `b` is reaped, `c` still runs.
    clock(1_000).await.expect("skew");
    let second = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((second.reaped, second.leases), (1, 1));
    assert_eq!(
        crate::support::leases_of(&fleet, "expired").await,
        vec!["a".to_owned(), "b".to_owned()]
    );
    drop((a, b, c));
}

#[tokio::test]
async fn a_failed_transfer_is_recorded_as_failed_with_the_backends_digest() {
    let (host, port) = server("failed_kind");
    let fleet = connect(config(
        &host,
        port,
        &cell("failed_kind"),
        ceilings(100, 10, 100, 10, 10),
    ))
    .await;
    let request = LeaseRequest::new("job", "tenant-a", "disk-7", 3, "download");
    let held = fleet.try_acquire(&request).await.expect("fits");
    held.release(Outcome::Failed).await.expect("released");
    let events = read_events(&fleet).await.expect("events");
    let last = events.last().expect("a record");
    assert_eq!(
        (last.kind.as_str(), last.outcome.as_str()),
        ("failed", "failed")
    );
    assert_eq!(last.lease, "job");
    assert_eq!(last.backend, hashed_id("disk-7"));
    assert_eq!(last.tenant, hashed_id("tenant-a"));
    assert_eq!(last.operation, "download");
    assert_eq!(last.footprint, 3);
    let admitted = &events[events.len() - 2];
    assert_eq!(admitted.kind, "admitted");
    assert_eq!(admitted.backend, hashed_id("disk-7"));
    assert_eq!(last.occupancy.backend_transfers, 0);
    assert_eq!(admitted.occupancy.backend_transfers, 1);
}

#[tokio::test]
async fn every_key_of_a_cell_shares_its_hash_tag_and_nothing_else_is_written() {
    let (host, port) = server("one_slot");
    let cell = cell("one_slot");
    let mut cfg = config(&host, port, &cell, ceilings(100, 1, 100, 1, 1));
    cfg.quotas = Some(admission_redis::Quotas {
        requests_per_minute: 10,
        bytes_per_hour: 1000,
    });
    cfg.fair_shares = Some(admission_core::FairShares::new());
    let fleet = connect(cfg).await;
    // Touch every key: a lease, a waiter in the line (and its tenant's finish tag in the fair
    // line), a quota window, a policy.
    let held = lease(&fleet, "held", "t", "d", 1).await;
    let waiter = spawn_acquire(&fleet, "waiter", "t", "d", 1, Duration::from_secs(10));
    wait_for_event(&fleet, &host, port, "queued", "waiter").await;
    fleet.charge_request("t").await.expect("charged");
    fleet.set_tenant_override("t", 50, 1).await.expect("policy");

    let keys = fleet.keys();
    assert_eq!(keys.len(), 8);
    let tag = format!("{{{cell}}}");
    for key in &keys {
        // The hash tag is the part between the first `{` and the next `}`.
        let open = key.find('{').expect("a hash tag");
        let close = open + key[open..].find('}').expect("closed");
        assert_eq!(&key[open..=close], tag, "{key}");
    }
    let mut conn = raw_connection(&host, port).await;
    let mut written: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{cell}*"))
        .query_async(&mut conn)
        .await
        .expect("keys");
    written.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(
        written, expected,
        "every key the cell wrote, and only those"
    );
    held.release(Outcome::Completed).await.expect("released");
    waiter
        .await
        .expect("task")
        .expect("granted")
        .release(Outcome::Completed)
        .await
        .expect("released");
    // The hand-off told the waiter's instance: one more key, its notices, under the same tag.
    let mut after: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{cell}*"))
        .query_async(&mut conn)
        .await
        .expect("keys");
    after.retain(|k| !expected.contains(k));
    assert_eq!(after.len(), 1, "{after:?}");
    let notices = after[0]
        .strip_prefix(&format!("{}:{tag}:to:", fleet.config().key_prefix))
        .unwrap_or_else(|| panic!("the notices of an instance: {}", after[0]));
    assert!(notices.len() == 32 && notices.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[tokio::test]
async fn every_key_of_a_cell_expires_when_the_cell_is_idle_and_calls_refresh_it() {
    let (host, port) = server("idle_cell");
    let cell = cell("idle_cell");
    let mut cfg = config(&host, port, &cell, ceilings(100, 1, 100, 1, 1));
    cfg.cell_idle_expiry = Duration::from_secs(90);
    let fleet = connect(cfg.clone()).await;
    let held = lease(&fleet, "held", "t", "d", 1).await;
    let waiter = spawn_acquire(&fleet, "waiter", "t", "d", 1, Duration::from_secs(10));
    wait_for_event(&fleet, &host, port, "queued", "waiter").await;
    let mut conn = raw_connection(&host, port).await;
    let ttls = async |conn: &mut redis::aio::MultiplexedConnection| -> Vec<i64> {
        let mut out = Vec::new();
        for key in fleet.keys() {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(conn)
                .await
                .expect("pttl");
            out.push(ttl);
        }
        out
    };
    // cfg, occ, exp, events, quota (none charged: absent), line, live.
    let after_call = ttls(&mut conn).await;
    assert_eq!(after_call[4], -2, "no quota window was written");
    for (key, ttl) in fleet.keys().iter().zip(&after_call) {
        if *ttl != -2 {
            assert!(
                (80_000..=90_000).contains(ttl),
                "{key} expires in {ttl} ms, not within the idle time of 90 s"
            );
        }
    }
    // Shorten every key's expiry by hand. A call right after the last refresh leaves them: a
    // refresh costs seven calls, so it is made once a tenth of the idle time (9 s here) has
    // passed since the last one.
    let shorten = async |conn: &mut redis::aio::MultiplexedConnection, ms: u64| {
        for key in fleet.keys() {
            let _: i64 = redis::cmd("PEXPIRE")
                .arg(&key)
                .arg(ms)
                .query_async(conn)
                .await
                .expect("pexpire");
        }
    };
    shorten(&mut conn, 30_000).await;
    fleet.snapshot("t", "d").await.expect("snapshot");
    for (key, ttl) in fleet.keys().iter().zip(ttls(&mut conn).await) {
        assert!(
            ttl <= 30_000,
            "{key} was refreshed before a tenth of the idle time: {ttl} ms"
        );
    }
    // Ten seconds later on the cell's clock, the next call refreshes every key.
    waiter.abort();
    drop(held);
    fleet.settle().await;
    fleet
        .advance_server_clock(Duration::from_secs(10))
        .await
        .expect("skew");
    fleet.snapshot("t", "d").await.expect("snapshot");
    for (key, ttl) in fleet.keys().iter().zip(ttls(&mut conn).await) {
        if ttl != -2 {
            assert!(
                ttl > 80_000,
                "{key} was not refreshed by the call: {ttl} ms"
            );
        }
    }

    // A cell left alone expires whole (shortened here by hand, the server's own expiry does the
    // rest), and the next call creates it again.
    for key in fleet.keys() {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(1)
            .query_async(&mut conn)
            .await
            .expect("pexpire");
    }
    crate::support::wait_until_gone(&mut conn, &fleet.keys()).await;
    let again = lease(&fleet, "again", "t", "d", 1).await;
    assert_eq!(again.occupancy().service_transfers, 1);
    again.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn a_renewal_never_brings_back_a_lease_that_expired_but_was_not_yet_reaped() {
    let (host, port) = server("no_revival");
    let mut cfg = config(
        &host,
        port,
        &cell("no_revival"),
        ceilings(100, 3, 100, 3, 3),
    );
    // One lease reaped per call: the renewal's own reap takes only the earliest.
    cfg.reap_batch = 1;
    let fleet = connect(cfg).await;
    let first = lease(&fleet, "first", "t", "d", 1).await;
    let second = lease(&fleet, "second", "t", "d", 1).await;
    let third = lease(&fleet, "third", "t", "d", 1).await;
    fleet
        .advance_server_clock(Duration::from_secs(4))
        .await
        .expect("skew");
    // The call reaps `first`; `third` expired too and is still recorded, but is not held.
    match third.renew_now().await {
        Err(LeaseError::Lost { lease }) => assert_eq!(lease, "third"),
        other => panic!("expected the expired lease to be lost, got {other:?}"),
    }
    let expired = crate::support::leases_of(&fleet, "expired").await;
    assert_eq!(expired, ["first", "third"]);
    // `second` expired too; the next call reaps it, and nothing is held.
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((snapshot.reaped, snapshot.leases), (1, 0));
    assert_eq!(snapshot.occupancy.service_transfers, 0);
    drop((first, second));
}

#[tokio::test]
async fn the_production_script_has_no_operation_that_moves_time() {
    let (host, port) = server("production_script");
    let source = production_script_source();
    assert!(!source.contains("'skew'"));
    // The production library, loaded under its own name beside the test build's.
    let name = source
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("#!lua name="))
        .expect("a library")
        .to_owned();
    assert!(name.starts_with("admission_"), "{name}");
    assert_ne!(
        format!("#!lua name={name}"),
        script_source().lines().next().unwrap()
    );
    let mut conn = raw_connection(&host, port).await;
    let loaded: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&source)
        .query_async(&mut conn)
        .await
        .expect("loads");
    assert_eq!(loaded, name);
    let cell = cell("production_script");
    let keys: Vec<String> = [
        "cfg", "occ", "exp", "events", "quota", "line", "live", "fair",
    ]
    .iter()
    .map(|k| format!("it:{{{cell}}}:{k}"))
    .collect();
    let skew = |keys: Vec<String>, fingerprint: String| {
        let mut call = redis::cmd("FCALL");
        call.arg(&name).arg(keys.len()).arg(keys);
        call.arg("skew").arg(fingerprint).arg("3600000");
        call
    };
    let reply: redis::RedisResult<Vec<String>> = skew(keys, "any-fingerprint".into())
        .query_async(&mut conn)
        .await;
    match reply {
        Err(error) => assert!(
            error.to_string().contains("unknown operation skew"),
            "{error}"
        ),
        // A missing cell answers NOCONFIG before any operation is looked at.
        Ok(words) => assert_eq!(words, ["NOCONFIG"]),
    }
    // With the cell created, the operation is unknown.
    let fleet = connect(config(&host, port, &cell, ceilings(10, 1, 10, 1, 1))).await;
    let fingerprint = fleet.config().fingerprint();
    let error = skew(fleet.keys().to_vec(), fingerprint)
        .query_async::<Vec<String>>(&mut conn)
        .await
        .expect_err("no skew in production");
    assert!(
        error.to_string().contains("unknown operation skew"),
        "{error}"
    );
    let skew: Option<String> = redis::cmd("HGET")
        .arg(&fleet.keys()[0])
        .arg("skew_ms")
        .query_async(&mut conn)
        .await
        .expect("hget");
    assert_eq!(skew, None, "nothing moved the cell's clock");
}
