//! The cell's fair line: tenants waiting on one cell, from any instance, are served by their
//! weights in what their leases hold (start-time fair queuing inside the one script call), a
//! higher level's waiter goes before a lower level's head, the levels' reserves are left aside
//! (always on the rates, on transfers while the level waits), a level dips into its reserve of a
//! rate while a higher level's head waits for it (within its reserve, earned back by the others'
//! grants), and a cell without fair shares keeps arrival order.

use std::time::Duration;

use admission_core::{FairShares, Level, Levels};
use admission_redis::{
    AcquireError, Dimension, LeaseRequest, NeverReason, Outcome, RedisAdmission,
    RedisAdmissionConfig, read_events,
};
use redis::AsyncCommands;

use crate::support::{
    admissions, blocking_connection, ceilings, cell, config, connect, full, lease, server,
    spawn_acquire, spawn_request, wait_for_event_on,
};

const WAIT: Duration = Duration::from_secs(20);

/// A cell that holds one lease at a time, its service bytes 2^20 (so a byte costs one unit of
/// virtual time at weight 1).
fn one_at_a_time(host: &str, port: u16, cell: &str) -> RedisAdmissionConfig {
    config(host, port, cell, ceilings(1 << 20, 1, 1 << 20, 1, 1))
}

/// Queues `request` on `fleet` (a task that releases its lease as soon as it has it) and waits
/// for its `queued` event, so the line's order of arrival is the order of these calls.
async fn queue(
    fleet: &RedisAdmission,
    events: &mut redis::aio::MultiplexedConnection,
    request: LeaseRequest,
) -> tokio::task::JoinHandle<()> {
    let id = request.id.clone();
    let task = {
        let fleet = fleet.clone();
        tokio::spawn(async move {
            let lease = fleet.acquire(&request, WAIT).await.expect("granted");
            lease.release(Outcome::Completed).await.expect("released");
        })
    };
    wait_for_event_on(events, fleet, "queued", &id).await;
    task
}

/// The leases of the cell's `admitted` events, in order.
async fn admitted(fleet: &RedisAdmission) -> Vec<String> {
    read_events(fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == "admitted")
        .map(|e| e.lease)
        .collect()
}

/// Holds the cell's one lease, queues `line` (id, tenant, level) in that order, half of them
/// from a second instance, then lets them through one at a time: the order they were granted.
async fn served(
    host: &str,
    port: u16,
    cfg: RedisAdmissionConfig,
    line: &[(&str, &str, Option<&str>)],
) -> Vec<String> {
    let a = connect(cfg.clone()).await;
    let b = connect(cfg).await;
    let mut events = blocking_connection(host, port).await;
    let held = lease(&a, "held", "x", "d", 1).await;
    let mut tasks = Vec::new();
    for (i, (id, tenant, level)) in line.iter().enumerate() {
        let mut request = LeaseRequest::new(*id, *tenant, "d", 1, "upload");
        if let Some(level) = level {
            request = request.with_level(*level);
        }
        let fleet = if i % 2 == 0 { &a } else { &b };
        tasks.push(queue(fleet, &mut events, request).await);
    }
    held.release(Outcome::Completed).await.expect("released");
    for task in tasks {
        task.await.expect("the waiter's task");
    }
    let mut order = admitted(&a).await;
    assert_eq!(order.remove(0), "held");
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_of_equal_weight_take_turns_where_arrival_order_serves_the_first_tenants_backlog() {
    let (host, port) = server("fair_line_turns");
    let line = [
        ("a1", "acme", None),
        ("a2", "acme", None),
        ("a3", "acme", None),
        ("a4", "acme", None),
        ("b1", "globex", None),
        ("b2", "globex", None),
    ];
    // Arrival order: acme's four, then globex's two.
    let plain = one_at_a_time(&host, port, &cell("fair_line_plain"));
    assert_eq!(
        served(&host, port, plain, &line).await,
        ["a1", "a2", "a3", "a4", "b1", "b2"]
    );
    // Fair shares, weights 1:1: globex's first waiter starts at the virtual time (0, as acme's
    // first), its second a byte later, as acme's second: the tenants alternate (ties go by
    // arrival).
    let mut fair = one_at_a_time(&host, port, &cell("fair_line_fair"));
    fair.fair_shares = Some(FairShares::new());
    let fleet = connect(fair.clone()).await;
    assert_eq!(
        served(&host, port, fair, &line).await,
        ["a1", "b1", "a2", "b2", "a3", "a4"]
    );
    // The line emptied: its tags are forgotten, nothing of them is left in Redis.
    let mut conn = blocking_connection(&host, port).await;
    let fair_key = fleet.keys()[7].clone();
    assert!(fair_key.ends_with(":fair"), "{fair_key}");
    let exists: bool = conn.exists(&fair_key).await.expect("EXISTS");
    assert!(!exists, "finish tags left after the line emptied");
    let fields: Vec<String> = conn.hkeys(&fleet.keys()[1]).await.expect("HKEYS");
    assert!(
        !fields.iter().any(|f| f.starts_with("v:")),
        "virtual times left after the line emptied: {fields:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_weight_three_is_served_three_leases_to_one() {
    let (host, port) = server("fair_line_weights");
    let mut cfg = one_at_a_time(&host, port, &cell("fair_line_weights"));
    cfg.fair_shares = Some(FairShares::new().weight("acme", 3).expect("weight"));
    let line = [
        ("a1", "acme", None),
        ("a2", "acme", None),
        ("a3", "acme", None),
        ("a4", "acme", None),
        ("a5", "acme", None),
        ("a6", "acme", None),
        ("b1", "globex", None),
        ("b2", "globex", None),
    ];
    // acme's start tags 0, 1/3, 2/3, 1, 4/3, 5/3; globex's 0 and 1: three of acme's for each
    // of globex's, ties by arrival.
    assert_eq!(
        served(&host, port, cfg, &line).await,
        ["a1", "b1", "a2", "a3", "a4", "b2", "a5", "a6"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_levels_waiter_goes_before_a_lower_levels_head() {
    let (host, port) = server("fair_line_levels");
    let mut cfg = one_at_a_time(&host, port, &cell("fair_line_levels"));
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("interactive"))
            .and_then(|l| l.level(Level::new("batch")))
            .expect("levels"),
    );
    let line = [
        ("batch1", "acme", None),
        ("batch2", "acme", Some("batch")),
        ("live1", "globex", Some("interactive")),
        ("batch3", "globex", None),
        ("live2", "acme", Some("interactive")),
    ];
    // Without weights, arrival order within each level; the interactive waiters before batch1,
    // the head when they came.
    let fleet = connect(cfg.clone()).await;
    assert_eq!(
        served(&host, port, cfg, &line).await,
        ["live1", "live2", "batch1", "batch2", "batch3"]
    );
    // Each waiter's records carry its level's rank: 0 interactive, 1 batch (the default).
    let levels: Vec<(String, String, Option<u32>)> = read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.lease == "live1" || e.lease == "batch1" || e.lease == "held")
        .map(|e| (e.lease, e.kind, e.level))
        .collect();
    let level =
        |lease: &str, kind: &str, level: Option<u32>| (lease.to_owned(), kind.to_owned(), level);
    assert_eq!(
        levels,
        [
            level("held", "admitted", Some(1)),
            level("batch1", "queued", Some(1)),
            level("live1", "queued", Some(0)),
            level("held", "completed", None),
            level("live1", "admitted", Some(0)),
            level("live1", "completed", None),
            level("batch1", "admitted", Some(1)),
            level("batch1", "completed", None),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_the_cell_does_not_declare_is_refused_before_any_call() {
    let (host, port) = server("fair_line_unknown");
    let mut cfg = one_at_a_time(&host, port, &cell("fair_line_unknown"));
    let plain = connect(cfg.clone()).await;
    let request = LeaseRequest::new("r", "acme", "d", 1, "upload").with_level("urgent");
    let err = plain.try_acquire(&request).await.expect_err("no levels");
    assert!(
        matches!(&err, AcquireError::Never { reason: NeverReason::UnknownLevel { level, known } }
            if level == "urgent" && known == "none"),
        "{err:?}"
    );
    cfg.cell = cell("fair_line_unknown_levels");
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("interactive"))
            .and_then(|l| l.level(Level::new("batch")))
            .expect("levels"),
    );
    let leveled = connect(cfg).await;
    let err = leveled.try_acquire(&request).await.expect_err("unknown");
    assert_eq!(
        err.to_string(),
        AcquireError::Never {
            reason: NeverReason::UnknownLevel {
                level: "urgent".into(),
                known: "interactive, batch".into()
            }
        }
        .to_string()
    );
    assert!(
        err.to_string().contains(
            "no priority level is named \"urgent\" in this cell (declared: interactive, batch)"
        ),
        "{err}"
    );
}

#[test]
fn a_cells_fair_shares_name_no_scarce_account_and_its_levels_reserve_only_its_ceilings() {
    let mut cfg = RedisAdmissionConfig::new("localhost", 6379, "c", ceilings(10, 1, 10, 1, 1));
    cfg.fair_shares = Some(FairShares::new().scarce("gpt-4o"));
    let err = cfg.validate().expect_err("a scarce account");
    assert_eq!(err.field(), "fair_shares");
    assert!(err.to_string().contains("\"gpt-4o\""), "{err}");
    cfg.fair_shares = Some(FairShares::new());
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("interactive").reserve("gpt-4o", admission_core::Amount::units(5)))
            .expect("levels"),
    );
    let err = cfg.validate().expect_err("a reserve");
    assert_eq!(err.field(), "levels");
    assert!(
        err.to_string().contains("level `interactive` reserves"),
        "{err}"
    );
    let one = |account: &str, amount: u64| {
        Some(
            Levels::new()
                .level(
                    Level::new("interactive")
                        .reserve(account, admission_core::Amount::units(amount)),
                )
                .expect("levels"),
        )
    };
    cfg.levels = one("service_bytes", 5);
    assert!(cfg.validate().is_ok(), "5 of 10 bytes");
    cfg.levels = one("service_transfers", 1);
    let err = cfg.validate().expect_err("the whole ceiling");
    assert_eq!(
        err.reason(),
        "level `interactive` reserves 1 of service_transfers, its ceiling 1: nothing would be left for the other levels"
    );
    cfg.levels = one("tokens_per_minute", 5);
    let err = cfg.validate().expect_err("no rates");
    assert_eq!(
        err.reason(),
        "level `interactive` reserves tokens_per_minute, and the cell has no rates"
    );
    cfg.levels = Some(Levels::new());
    assert_eq!(cfg.validate().expect_err("no level").field(), "levels");
    cfg.levels = None;
    assert!(cfg.validate().is_ok());
    // Fair shares enter the fingerprint (every instance of a cell must agree on them); weights
    // do too; none at all leaves it as it was.
    let plain = {
        let mut c = cfg.clone();
        c.fair_shares = None;
        c.fingerprint()
    };
    let equal = cfg.fingerprint();
    cfg.fair_shares = Some(FairShares::new().weight("acme", 3).expect("weight"));
    let weighted = cfg.fingerprint();
    assert!(plain != equal && equal != weighted && plain != weighted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_behind_on_its_share_still_waits_behind_another_tenants_head() {
    let (host, port) = server("fair_line_head");
    let mut cfg = config(
        &host,
        port,
        &cell("fair_line_head"),
        ceilings(10, 10, 10, 10, 10),
    );
    cfg.fair_shares = Some(FairShares::new());
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    let held = lease(&fleet, "held", "x", "d", 6).await;
    let first = spawn_acquire(&fleet, "a1", "acme", "d", 5, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "a1").await;
    // acme's second waiter starts where its first finished: behind the virtual time.
    let big = spawn_acquire(&fleet, "big", "acme", "d", 10, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "big").await;
    held.release(Outcome::Completed).await.expect("released");
    let a1 = first
        .await
        .expect("task")
        .expect("a1 fits once held is gone");
    // `big` is the head now (5 + 10 > 10). globex has had nothing, yet its newcomer starts no
    // earlier than the head's own start tag: it stands behind the head, and may not take from
    // the head's reservation (5 held + 10 set aside + 1 > 10).
    assert_eq!(
        full(&fleet, "g1", "globex", "d", 1).await,
        (Dimension::ServiceBytes, 15, 1, 10)
    );
    a1.release(Outcome::Completed).await.expect("released");
    let big = big.await.expect("task").expect("the head is granted");
    assert_eq!(big.occupancy().service_bytes, 10);
    big.release(Outcome::Completed).await.expect("released");
    assert_eq!(admitted(&fleet).await, ["held", "a1", "big"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_no_place_in_a_fair_line() {
    let (host, port) = server("fair_line_withdraw");
    let mut cfg = one_at_a_time(&host, port, &cell("fair_line_withdraw"));
    cfg.fair_shares = Some(FairShares::new());
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    let held = lease(&fleet, "held", "x", "d", 1).await;
    // acme's waiter gives up after 300 ms; globex's waits on.
    let gives_up = spawn_acquire(&fleet, "a1", "acme", "d", 1, Duration::from_millis(300));
    wait_for_event_on(&mut events, &fleet, "queued", "a1").await;
    let stays = spawn_acquire(&fleet, "g1", "globex", "d", 1, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "g1").await;
    let err = gives_up.await.expect("task").expect_err("timed out");
    assert!(matches!(err, AcquireError::TimedOut { .. }), "{err:?}");
    let mut conn = blocking_connection(&host, port).await;
    let line: Vec<String> = conn.zrange(&fleet.keys()[5], 0, -1).await.expect("ZRANGE");
    assert_eq!(line.len(), 1, "only g1's place is left: {line:?}");
    assert!(line[0].ends_with("g1"), "{line:?}");
    held.release(Outcome::Completed).await.expect("released");
    let g1 = stays.await.expect("task").expect("granted");
    g1.release(Outcome::Completed).await.expect("released");
    assert_eq!(admitted(&fleet).await, ["held", "g1"]);
    let left: u64 = conn.zcard(&fleet.keys()[5]).await.expect("ZCARD");
    assert_eq!(left, 0);
}

/// Levels `interactive` (reserving `amount` of `dimension`) and `batch`, the default.
fn reserving(dimension: &str, amount: u64) -> Levels {
    Levels::new()
        .level(Level::new("interactive").reserve(dimension, admission_core::Amount::units(amount)))
        .and_then(|l| l.level(Level::new("batch")))
        .expect("levels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_levels_reserve_of_transfers_is_left_aside_while_it_waits_and_lent_when_it_does_not() {
    let (host, port) = server("fair_line_lend");
    let mut cfg = config(
        &host,
        port,
        &cell("fair_line_lend"),
        ceilings(100, 3, 100, 1, 3),
    );
    cfg.levels = Some(reserving("service_transfers", 1));
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    let held = lease(&fleet, "held", "acme", "d", 1).await;
    // acme's interactive call waits for acme's one transfer: it is the head.
    let live = LeaseRequest::new("live", "acme", "d", 1, "upload").with_level("interactive");
    let waiting = spawn_request(&fleet, live, Duration::from_millis(500));
    wait_for_event_on(&mut events, &fleet, "queued", "live").await;
    // A batch call leaves the head's transfer and the interactive reserve aside: 1 held + 1 +
    // 1 + 1 > 3.
    assert_eq!(
        full(&fleet, "g1", "globex", "d", 1).await,
        (Dimension::ServiceTransfers, 3, 1, 3)
    );
    let err = waiting
        .await
        .expect("task")
        .expect_err("acme's transfer stays held");
    assert!(matches!(err, AcquireError::TimedOut { .. }), "{err:?}");
    // Nobody of the interactive level waits: batch borrows its reserve, up to the ceiling.
    let g1 = lease(&fleet, "g1", "globex", "d", 1).await;
    let i1 = lease(&fleet, "i1", "initech", "d", 1).await;
    assert_eq!(i1.occupancy().service_transfers, 3);
    for lease in [held, g1, i1] {
        lease.release(Outcome::Completed).await.expect("released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_lending_levels_last_waiter_is_granted_the_hand_off_walks_the_line_again() {
    let (host, port) = server("fair_line_again");
    let mut cfg = config(
        &host,
        port,
        &cell("fair_line_again"),
        ceilings(100, 3, 100, 1, 3),
    );
    // Here batch, the lower level, reserves two transfers.
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("interactive"))
            .and_then(|l| {
                l.level(
                    Level::new("batch")
                        .reserve("service_transfers", admission_core::Amount::units(2)),
                )
            })
            .expect("levels"),
    );
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    let _kept = lease(&fleet, "kept", "initech", "d", 1).await;
    let held = lease(&fleet, "held", "acme", "d", 1).await;
    // A batch call of acme waits for acme's transfer; an interactive call of globex, ahead of it
    // in the line, waits beside batch's reserve (2 held + 2 + 1 > 3).
    let batch = spawn_acquire(&fleet, "b1", "acme", "d", 1, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "b1").await;
    let live = LeaseRequest::new("i1", "globex", "d", 1, "upload").with_level("interactive");
    let interactive = spawn_request(&fleet, live, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "i1").await;
    // The release grants b1 (behind i1, the head, beside its transfer), batch's last waiter: the
    // same hand-off walks again and grants i1, batch's reserve lent now.
    held.release(Outcome::Completed).await.expect("released");
    let b1 = batch.await.expect("task").expect("granted");
    let i1 = interactive.await.expect("task").expect("granted");
    assert_eq!(
        admissions(&fleet).await,
        ["kept:admitted", "held:admitted", "b1:handoff", "i1:handoff"]
    );
    for lease in [b1, i1] {
        lease.release(Outcome::Completed).await.expect("released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_levels_reserve_of_tokens_is_always_left_aside_except_by_an_exempt_level() {
    let (host, port) = server("fair_line_kept");
    let mut cfg = config(
        &host,
        port,
        &cell("fair_line_kept"),
        ceilings(1 << 20, 10, 1 << 20, 10, 10),
    );
    cfg.rates = Some(admission_redis::Rates {
        tokens_per_minute: 1_000,
        requests_per_minute: 1_000,
        minute: Duration::from_secs(60),
        burst: None,
    });
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("health").exempt())
            .and_then(|l| {
                l.level(
                    Level::new("interactive")
                        .reserve("tokens_per_minute", admission_core::Amount::units(400)),
                )
            })
            .and_then(|l| l.level(Level::new("batch")))
            .expect("levels"),
    );
    let fleet = connect(cfg).await;
    let at = |id: &str, tokens: u64, level: &str| {
        LeaseRequest::new(id, "acme", "d", tokens, "call").with_level(level)
    };
    // 700 tokens never fit beside the 400 kept for interactive work.
    let err = fleet
        .try_acquire(&at("big", 700, "batch"))
        .await
        .expect_err("never");
    assert!(
        matches!(
            &err,
            AcquireError::Never {
                reason: NeverReason::OverCeiling {
                    dimension: Dimension::TokensPerMinute,
                    asked: 700,
                    ceiling: 600
                }
            }
        ),
        "{err:?}"
    );
    let batch = fleet
        .try_acquire(&at("b1", 600, "batch"))
        .await
        .expect("600 + 400 fit");
    // Nobody interactive waits, yet the reserve is kept: the rates refill with time.
    match fleet.try_acquire(&at("b2", 100, "batch")).await {
        Err(AcquireError::Full {
            dimension: Dimension::TokensPerMinute,
            held: 1_000,
            asked: 100,
            ceiling: 1_000,
            ..
        }) => {}
        other => panic!("expected no room beside the reserve, got {other:?}"),
    }
    // The exempt level leaves nothing aside; the interactive level takes its own reserve.
    let health = fleet
        .try_acquire(&at("h1", 100, "health"))
        .await
        .expect("exempt");
    let live = fleet
        .try_acquire(&at("i1", 300, "interactive"))
        .await
        .expect("its reserve");
    assert!(
        fleet
            .try_acquire(&at("i2", 1, "interactive"))
            .await
            .is_err(),
        "all spent"
    );
    for lease in [batch, health, live] {
        lease.release(Outcome::Completed).await.expect("released");
    }
}

/// Levels `interactive`, then `batch` reserving `bytes` of the service bytes.
fn batch_reserving_bytes(bytes: u64) -> Levels {
    Levels::new()
        .level(Level::new("interactive"))
        .and_then(|l| {
            l.level(
                Level::new("batch").reserve("service_bytes", admission_core::Amount::units(bytes)),
            )
        })
        .expect("levels")
}

/// A cell of 100 bytes whose batch level reserves 30, 50 of them held by a batch lease, and
/// acme's interactive call of 80 waiting: the head, held back by batch's reserve once batch
/// waits too. The cell, a connection for its events, the held lease and the head's task.
async fn batch_reserving_30_behind_a_head(
    test: &str,
) -> (
    RedisAdmission,
    redis::aio::MultiplexedConnection,
    admission_redis::Lease,
    tokio::task::JoinHandle<Result<admission_redis::Lease, AcquireError>>,
) {
    batch_reserving_30_behind_a_head_on(test, 10, "d").await
}

/// [`batch_reserving_30_behind_a_head`] with `per_backend` transfers a backend, the 50 held on
/// backend `held_on`.
async fn batch_reserving_30_behind_a_head_on(
    test: &str,
    per_backend: u64,
    held_on: &str,
) -> (
    RedisAdmission,
    redis::aio::MultiplexedConnection,
    admission_redis::Lease,
    tokio::task::JoinHandle<Result<admission_redis::Lease, AcquireError>>,
) {
    let (host, port) = server(test);
    let mut cfg = config(
        &host,
        port,
        &cell(test),
        ceilings(100, 10, 100, 10, per_backend),
    );
    cfg.levels = Some(batch_reserving_bytes(30));
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    let held = lease(&fleet, "held", "x", held_on, 50).await;
    let live = LeaseRequest::new("h", "acme", "d", 80, "upload").with_level("interactive");
    let head = spawn_request(&fleet, live, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "h").await;
    (fleet, events, held, head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_held_back_by_a_lower_levels_reserve_and_that_levels_waiter_never_wait_for_each_other()
 {
    let (fleet, mut events, held, head) =
        batch_reserving_30_behind_a_head("fair_line_no_deadlock").await;
    let batch = spawn_acquire(&fleet, "l", "globex", "d", 30, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "l").await;
    // The cell empties. h (80) waits while batch has a waiter (80 + its 30 > 100); l asks only
    // for batch's own reserve, and leaves aside only the part of h's demand beyond it (50):
    // granted by the same hand-off. Once it gives its bytes back, h.
    held.release(Outcome::Completed).await.expect("released");
    let l = batch
        .await
        .expect("task")
        .expect("l, from batch's own reserve");
    l.release(Outcome::Completed).await.expect("released");
    let h = head.await.expect("task").expect("then the head");
    h.release(Outcome::Completed).await.expect("released");
    assert_eq!(
        admissions(&fleet).await,
        ["held:admitted", "l:handoff", "h:handoff"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_borrows_a_lower_levels_reserve_that_levels_waiter_cannot_use() {
    let (fleet, mut events, held, head) =
        batch_reserving_30_behind_a_head("fair_line_borrow").await;
    // l asks 60, more than batch's reserve: beside h's 80 less that reserve (50) it never fits
    // in 100, and nobody else of batch waits.
    let batch = spawn_acquire(&fleet, "l", "globex", "d", 60, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "l").await;
    // The cell empties: the hand-off finds l short of room too, so h borrows batch's reserve.
    held.release(Outcome::Completed).await.expect("released");
    let h = head
        .await
        .expect("task")
        .expect("h, borrowing batch's reserve");
    assert_eq!(h.occupancy().service_bytes, 80);
    h.release(Outcome::Completed).await.expect("released");
    let l = batch.await.expect("task").expect("then l");
    l.release(Outcome::Completed).await.expect("released");
    assert_eq!(
        admissions(&fleet).await,
        ["held:admitted", "h:handoff", "l:handoff"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lender_held_back_by_the_heads_own_reservation_does_not_keep_its_reserve_from_it() {
    // One transfer per backend: h (80 bytes) and l (30, batch's own reserve) share backend d.
    let (fleet, mut events, held, head) =
        batch_reserving_30_behind_a_head_on("fair_line_lender_held", 1, "e").await;
    let batch = spawn_acquire(&fleet, "l", "globex", "d", 30, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "l").await;
    // The cell's bytes come back: h lacks them only for batch's reserve, and l, with room on
    // the bytes, lacks backend d's one transfer only for h's reservation of it: h borrows.
    held.release(Outcome::Completed).await.expect("released");
    let h = head
        .await
        .expect("task")
        .expect("h, borrowing batch's reserve");
    h.release(Outcome::Completed).await.expect("released");
    let l = batch.await.expect("task").expect("then l");
    l.release(Outcome::Completed).await.expect("released");
    assert_eq!(
        admissions(&fleet).await,
        ["held:admitted", "h:handoff", "l:handoff"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_lending_levels_last_waiter_is_dropped_late_the_hand_off_walks_again() {
    let (fleet, mut events, held, head) = batch_reserving_30_behind_a_head("fair_line_late").await;
    // batch's one waiter asks 60 (beyond its reserve) and waits 2 s; the cell's clock moves
    // 2.5 s on (less than a lease TTL, so everything else stays alive): on the cell's clock its
    // caller has stopped waiting, and the next hand-off drops it as late.
    let batch = spawn_acquire(&fleet, "l", "globex", "d", 60, Duration::from_secs(2));
    wait_for_event_on(&mut events, &fleet, "queued", "l").await;
    fleet
        .advance_server_clock(Duration::from_millis(2_500))
        .await
        .expect("skewed");
    // The release's hand-off holds h (batch still waits), drops l, and walks again: h is granted
    // by that same hand-off, not at its own next call.
    held.release(Outcome::Completed).await.expect("released");
    let h = head.await.expect("task").expect("the head");
    h.release(Outcome::Completed).await.expect("released");
    // l's caller, which has not stopped waiting on its own clock, may ask again afresh.
    if let Ok(l) = batch.await.expect("task") {
        l.release(Outcome::Completed).await.expect("released");
    }
    assert_eq!(
        admissions(&fleet).await[..2],
        ["held:admitted", "h:handoff"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_charged_while_its_level_was_idle_is_not_placed_behind_later_arrivals() {
    let (host, port) = server("fair_line_epoch");
    // Two transfers in all, one per tenant; fair shares, levels interactive and batch.
    let mut cfg = config(
        &host,
        port,
        &cell("fair_line_epoch"),
        ceilings(1 << 20, 2, 1 << 20, 1, 2),
    );
    cfg.fair_shares = Some(FairShares::new());
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("interactive"))
            .and_then(|l| l.level(Level::new("batch")))
            .expect("levels"),
    );
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    // A batch waiter keeps the line busy while tenant tt takes ten interactive leases, each
    // granted at once with nobody interactive waiting: they cost tt nothing.
    let zed = lease(&fleet, "z1", "tz", "d", 10).await;
    let waiter = spawn_acquire(&fleet, "zb", "tz", "d", 10, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "zb").await;
    for i in 0..10 {
        let request =
            LeaseRequest::new(format!("t{i}"), "tt", "d", 10, "upload").with_level("interactive");
        let lease = fleet
            .try_acquire(&request)
            .await
            .expect("one transfer left");
        lease.release(Outcome::Completed).await.expect("released");
    }
    // The interactive level gets busy: tu's first waiter, then tt's, then tu's next two.
    let filler = LeaseRequest::new("w", "tw", "d", 1, "upload").with_level("interactive");
    let filler = fleet.try_acquire(&filler).await.expect("the last transfer");
    let mut tasks = Vec::new();
    for (id, tenant) in [("u1", "tu"), ("tq", "tt"), ("u2", "tu"), ("u3", "tu")] {
        let request = LeaseRequest::new(id, tenant, "d", 10, "upload").with_level("interactive");
        let asker = fleet.clone();
        tasks.push(tokio::spawn(async move {
            let lease = asker.acquire(&request, WAIT).await.expect("granted");
            lease.release(Outcome::Completed).await.expect("released");
        }));
        wait_for_event_on(&mut events, &fleet, "queued", id).await;
    }
    // tt starts at the level's virtual time beside tu's first, not behind tu's later ones.
    let mut conn = blocking_connection(&host, port).await;
    let line: Vec<String> = conn.zrange(&fleet.keys()[5], 0, -1).await.expect("ZRANGE");
    let order: Vec<&str> = line.iter().map(|m| &m[43..]).collect();
    assert_eq!(order, ["u1", "tq", "u2", "u3", "zb"]);
    filler.release(Outcome::Completed).await.expect("released");
    for task in tasks {
        task.await.expect("task");
    }
    zed.release(Outcome::Completed).await.expect("released");
    waiter
        .await
        .expect("task")
        .expect("zb")
        .release(Outcome::Completed)
        .await
        .expect("released");
}

#[test]
fn reserves_on_the_rates_are_checked_against_what_the_rates_hold_and_together() {
    let mut cfg = RedisAdmissionConfig::new(
        "localhost",
        6379,
        "c",
        ceilings(1 << 20, 10, 1 << 20, 10, 10),
    );
    cfg.rates = Some(
        admission_redis::Rates::per_minute(1_000, 1_000).within_every_minute(
            admission_redis::Burst {
                tokens: 400,
                requests: 10,
            },
        ),
    );
    let reserve = |amount: u64| {
        Level::new("interactive")
            .reserve("tokens_per_minute", admission_core::Amount::units(amount))
    };
    cfg.levels = Some(
        Levels::new()
            .level(reserve(450))
            .and_then(|l| l.level(Level::new("batch")))
            .expect("levels"),
    );
    assert_eq!(
        cfg.validate().expect_err("over the burst").reason(),
        "level `interactive` reserves 450 of tokens_per_minute, its ceiling 400: nothing would be left for the other levels"
    );
    cfg.rates = Some(admission_redis::Rates::per_minute(1_000, 1_000));
    let two = Levels::new()
        .level(reserve(600))
        .and_then(|l| {
            l.level(
                Level::new("batch")
                    .reserve("tokens_per_minute", admission_core::Amount::units(600)),
            )
        })
        .and_then(|l| l.level(Level::new("bulk")))
        .expect("levels");
    cfg.levels = Some(two);
    assert_eq!(
        cfg.validate()
            .expect_err("1,200 of 1,000 kept from bulk")
            .reason(),
        "the other levels reserve 1200 of tokens_per_minute beside level `bulk`, its ceiling 1000: nothing would be left for it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_out_of_turn_does_not_move_the_virtual_time() {
    let (host, port) = server("fair_line_backfill");
    // Three transfers, one per tenant; the service bytes 2^20, so a byte costs one unit.
    let mut cfg = config(
        &host,
        port,
        &cell("fair_line_backfill"),
        ceilings(1 << 20, 3, 1 << 20, 1, 3),
    );
    cfg.fair_shares = Some(FairShares::new());
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    let x1 = lease(&fleet, "x1", "acme", "d", 100).await;
    // acme's next call waits for acme's transfer: the head, at start tag 0.
    let a1 = spawn_acquire(&fleet, "a1", "acme", "d", 100, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "a1").await;
    // initech is granted beside the head (charged 100), and its next call waits at start 100.
    let c0 = lease(&fleet, "c0", "initech", "d", 100).await;
    let c1 = spawn_acquire(&fleet, "c1", "initech", "d", 100, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "c1").await;
    // c0 leaves: the hand-off grants c1 out of turn, behind the head (start 100, the head's 0).
    c0.release(Outcome::Completed).await.expect("released");
    let c1 = c1.await.expect("task").expect("c1, beside the head");
    // A new tenant starts at the level's virtual time, the head's start tag 0, not at 100.
    let d1 = spawn_acquire(&fleet, "d1", "globex", "d", 100, WAIT);
    wait_for_event_on(&mut events, &fleet, "queued", "d1").await;
    let mut conn = blocking_connection(&host, port).await;
    let line: Vec<String> = conn.zrange(&fleet.keys()[5], 0, -1).await.expect("ZRANGE");
    let starts: Vec<(&str, &str)> = line.iter().map(|m| (&m[43..], &m[2..27])).collect();
    assert_eq!(
        starts,
        [
            ("a1", "0000000000000000.00000000"),
            ("d1", "0000000000000000.00000000")
        ]
    );
    for lease in [x1, c1] {
        lease.release(Outcome::Completed).await.expect("released");
    }
    for task in [a1, d1] {
        task.await
            .expect("task")
            .expect("granted")
            .release(Outcome::Completed)
            .await
            .expect("released");
    }
}

/// On a cell of 10 service bytes and one transfer per tenant, with `fair_shares` (or arrival
/// order): acme holds its transfer (1 byte) and initech 5 bytes; acme's next call is the head
/// (short on its tenant's transfer, setting 1 byte aside), globex's call of 5 bytes waits behind
/// it (6 + 1 + 5 > 10), and a call of tenant `other` (1 byte) waits for its tenant's transfer,
/// which `y` holds. The cell's admitted leases once `y` is released and `other`'s waiter has
/// asked again (its liveness renewed), and once everyone has been served after initech's 5
/// bytes and acme's transfer are released.
async fn small_call_behind_a_short_one(
    name: &str,
    fair_shares: Option<FairShares>,
) -> (Vec<String>, Vec<String>) {
    let (host, port) = server(name);
    let mut cfg = config(&host, port, &cell(name), ceilings(10, 10, 10, 1, 10));
    cfg.fair_shares = fair_shares;
    let fleet = connect(cfg).await;
    let mut events = blocking_connection(&host, port).await;
    let x1 = lease(&fleet, "x1", "acme", "d", 1).await;
    let x2 = lease(&fleet, "x2", "initech", "d", 5).await;
    let y = lease(&fleet, "y", "other", "d", 1).await;
    let mut waiters = Vec::new();
    for (id, tenant, bytes) in [("a1", "acme", 1), ("g1", "globex", 5), ("u1", "other", 1)] {
        waiters.push(spawn_acquire(&fleet, id, tenant, "d", bytes, WAIT));
        wait_for_event_on(&mut events, &fleet, "queued", id).await;
    }
    y.release(Outcome::Completed).await.expect("released");
    // u1's waiter asks again (it renews its liveness every second): wait for a renewal.
    let mut conn = blocking_connection(&host, port).await;
    let live = &fleet.keys()[6];
    let renewed_from: Option<f64> = conn.zscore(live, "u1").await.expect("ZSCORE");
    if let Some(from) = renewed_from {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let now: Option<f64> = conn.zscore(live, "u1").await.expect("ZSCORE");
            if now.is_none_or(|at| at > from) || tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let after_y = admitted(&fleet).await;
    x2.release(Outcome::Completed).await.expect("released");
    x1.release(Outcome::Completed).await.expect("released");
    for waiter in waiters {
        let lease = waiter.await.expect("task").expect("granted");
        lease.release(Outcome::Completed).await.expect("released");
    }
    (after_y, admitted(&fleet).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_short_on_the_footprint_keeps_its_turn_there() {
    // In arrival order, `other`'s one byte is granted beside the head's as soon as its transfer
    // is free, before globex's earlier 5.
    let (after_y, all) = small_call_behind_a_short_one("fair_line_turns_off", None).await;
    assert_eq!(after_y, ["x1", "x2", "y", "u1"]);
    assert_eq!(all, ["x1", "x2", "y", "u1", "g1", "a1"]);
    // With fair shares globex's 5 bytes keep their turn: `other`'s byte waits beside them and
    // the head's, at the hand-off and when it asks again, and goes after them.
    let fair = Some(FairShares::new());
    let (after_y, all) = small_call_behind_a_short_one("fair_line_turns", fair).await;
    assert_eq!(after_y, ["x1", "x2", "y"]);
    assert_eq!(all, ["x1", "x2", "y", "g1", "u1", "a1"]);
}

/// How long the waiters of the dip tests wait: longer than the cell's clock moves on in them.
const LONG: Duration = Duration::from_secs(240);

/// A cell of 1,000 tokens a minute (no burst, so the tokens hold 1,000 at once), level `high`
/// and level `low` reserving 200 tokens. Leases and waiters live 300 s and renew every minute,
/// so the cell's clock may move a minute or two on with everyone alive, and no waiter asks
/// again of its own meanwhile (only the calls below grant).
fn low_reserving_200_tokens(host: &str, port: u16, test: &str) -> RedisAdmissionConfig {
    let mut cfg = config(
        host,
        port,
        &cell(test),
        ceilings(1 << 20, 16, 1 << 20, 16, 16),
    );
    cfg.rates = Some(admission_redis::Rates::per_minute(1_000, 1_000));
    cfg.lease_ttl = Duration::from_secs(300);
    cfg.renew_every = Duration::from_secs(60);
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("high"))
            .and_then(|l| {
                l.level(
                    Level::new("low")
                        .reserve("tokens_per_minute", admission_core::Amount::units(200)),
                )
            })
            .expect("levels"),
    );
    cfg
}

/// A call of acme's asking `tokens` at `level`.
fn tokens(id: &str, tokens: u64, level: &str) -> LeaseRequest {
    LeaseRequest::new(id, "acme", "d", tokens, "call").with_level(level)
}

/// What level `low` (rank 1) has spent of its reserve of tokens, in units of 2^-16 of a token,
/// as the cell keeps it (`None`: nothing, or forgotten).
async fn low_spent(
    conn: &mut redis::aio::MultiplexedConnection,
    fleet: &RedisAdmission,
) -> Option<u64> {
    spent_of(conn, fleet, 1).await
}

/// What the level of rank `rank` has spent of its reserve of tokens, as [`low_spent`].
async fn spent_of(
    conn: &mut redis::aio::MultiplexedConnection,
    fleet: &RedisAdmission,
    rank: u8,
) -> Option<u64> {
    let field = format!("sp:{rank}:6");
    conn.hget(&fleet.keys()[1], field).await.expect("HGET")
}

/// high's 700 granted at once from `fleet` (leaving low's 200 aside: 300 left), and high's next
/// 700 queued behind it, short (700 + 200 + 700 > 1,000): the head, claiming the tokens.
async fn drain_700_and_a_high_head(
    fleet: &RedisAdmission,
    events: &mut redis::aio::MultiplexedConnection,
) -> (
    admission_redis::Lease,
    tokio::task::JoinHandle<Result<admission_redis::Lease, AcquireError>>,
) {
    let drain = fleet
        .try_acquire(&tokens("drain", 700, "high"))
        .await
        .expect("700 + 200 fit");
    let h1 = spawn_request(fleet, tokens("h1", 700, "high"), LONG);
    wait_for_event_on(events, fleet, "queued", "h1").await;
    (drain, h1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_levels_waiter_dips_into_its_reserve_of_tokens_while_a_higher_levels_head_waits() {
    let (host, port) = server("fair_line_dip");
    let cfg = low_reserving_200_tokens(&host, port, "fair_line_dip");
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    let mut events = blocking_connection(&host, port).await;
    let mut conn = blocking_connection(&host, port).await;
    let (drain, h1) = drain_700_and_a_high_head(&a, &mut events).await;
    // low's 150, then 50, from the other instance, are taken out of its reserve at once, not
    // leaving the head's 700 aside: 200 of 200 spent.
    let l1 = b
        .try_acquire(&tokens("l1", 150, "low"))
        .await
        .expect("a dip");
    assert_eq!(low_spent(&mut conn, &a).await, Some(150 * 65_536));
    let l1b = b
        .try_acquire(&tokens("l1b", 50, "low"))
        .await
        .expect("a dip, to the reserve's end");
    assert_eq!(low_spent(&mut conn, &a).await, Some(200 * 65_536));
    // low's next 100 would fit the 100 left, but not its reserve (200 + 100 > 200): it waits
    // behind the head as any waiter does, and so does high's next 700 (before it: its level).
    let l2 = spawn_request(&b, tokens("l2", 100, "low"), LONG);
    wait_for_event_on(&mut events, &a, "queued", "l2").await;
    let h2 = spawn_request(&a, tokens("h2", 700, "high"), LONG);
    wait_for_event_on(&mut events, &a, "queued", "h2").await;
    assert_eq!(
        admissions(&a).await,
        ["drain:admitted", "l1:admitted", "l1b:admitted"]
    );
    assert_eq!(low_spent(&mut conn, &a).await, Some(200 * 65_536));
    // A minute on the cell's clock, the tokens whole again. drain's release hands off: h1 is
    // granted 700, not a dip, which earns low back floor(700 * 200 * 65,536 / 800), 175
    // tokens' worth (25 left spent); h2 is the head now, short (700 + 200 + 700 > 1,000), and
    // l2 dips beside it: 25 + 100 = 125 spent.
    a.advance_server_clock(Duration::from_secs(60))
        .await
        .expect("skew");
    drain.release(Outcome::Completed).await.expect("released");
    assert_eq!(
        admissions(&a).await,
        [
            "drain:admitted",
            "l1:admitted",
            "l1b:admitted",
            "h1:handoff",
            "l2:handoff"
        ]
    );
    assert_eq!(low_spent(&mut conn, &a).await, Some(125 * 65_536));
    let h1 = h1.await.expect("task").expect("h1");
    let l2 = l2.await.expect("task").expect("l2, a dip");
    // Another minute: h1's release hands the tokens to h2, the line empties, and what low spent
    // is forgotten with it.
    a.advance_server_clock(Duration::from_secs(60))
        .await
        .expect("skew");
    h1.release(Outcome::Completed).await.expect("released");
    let h2 = h2.await.expect("task").expect("h2");
    assert_eq!(low_spent(&mut conn, &a).await, None);
    for lease in [l1, l1b, l2, h2] {
        lease.release(Outcome::Completed).await.expect("released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_at_once_that_earns_a_level_back_its_reserve_lets_that_levels_waiter_dip() {
    let (host, port) = server("fair_line_dip_earned");
    let mut cfg = low_reserving_200_tokens(&host, port, "fair_line_dip_earned");
    // A level `top` above high and low.
    cfg.levels = Some(
        Levels::new()
            .level(Level::new("top"))
            .and_then(|l| l.level(Level::new("high")))
            .and_then(|l| {
                l.level(
                    Level::new("low")
                        .reserve("tokens_per_minute", admission_core::Amount::units(200)),
                )
            })
            .expect("levels"),
    );
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    let mut events = blocking_connection(&host, port).await;
    let mut conn = blocking_connection(&host, port).await;
    // low is rank 2 here.
    let (drain, h1) = drain_700_and_a_high_head(&a, &mut events).await;
    let l1 = b
        .try_acquire(&tokens("l1", 200, "low"))
        .await
        .expect("a dip of the whole reserve");
    assert_eq!(spent_of(&mut conn, &a, 2).await, Some(200 * 65_536));
    let l2 = spawn_request(&b, tokens("l2", 100, "low"), LONG);
    wait_for_event_on(&mut events, &a, "queued", "l2").await;
    // A minute on: the tokens are whole. top's 700, before the line, is granted at once; it is
    // not a dip, and earns low back floor(700 * 200 * 65,536 / 800), 175 tokens' worth: that
    // call hands off, and l2 dips beside the head h1 (25 + 100 spent), not at some later call.
    a.advance_server_clock(Duration::from_secs(60))
        .await
        .expect("skew");
    let t = a
        .try_acquire(&tokens("t", 700, "top"))
        .await
        .expect("700 + 200 fit");
    assert_eq!(
        admissions(&a).await,
        ["drain:admitted", "l1:admitted", "t:admitted", "l2:handoff"]
    );
    assert_eq!(spent_of(&mut conn, &a, 2).await, Some(125 * 65_536));
    let l2 = l2.await.expect("task").expect("l2, a dip");
    a.advance_server_clock(Duration::from_secs(60))
        .await
        .expect("skew");
    drain.release(Outcome::Completed).await.expect("released");
    let h1 = h1.await.expect("task").expect("h1");
    for lease in [l1, l2, t, h1] {
        lease.release(Outcome::Completed).await.expect("released");
    }
    assert_eq!(spent_of(&mut conn, &a, 2).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_short_on_tokens_waits_for_no_more_than_a_lower_levels_reserve_of_dips() {
    let (host, port) = server("fair_line_dip_bound");
    let cfg = low_reserving_200_tokens(&host, port, "fair_line_dip_bound");
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    let mut events = blocking_connection(&host, port).await;
    let mut conn = blocking_connection(&host, port).await;
    // The tokens spent: high's 800 and low's own 200 (no head: nobody dips, nothing spent).
    let drain = a
        .try_acquire(&tokens("drain", 800, "high"))
        .await
        .expect("800 + 200 fit");
    let fill = b
        .try_acquire(&tokens("fill", 200, "low"))
        .await
        .expect("its reserve");
    assert_eq!(low_spent(&mut conn, &a).await, None);
    // high's head h (700, then h2 behind it), and a backlog of five low calls of 50, from both
    // instances: no room for any of them.
    let h = spawn_request(&a, tokens("h", 700, "high"), LONG);
    wait_for_event_on(&mut events, &a, "queued", "h").await;
    let h2 = spawn_request(&b, tokens("h2", 700, "high"), LONG);
    wait_for_event_on(&mut events, &a, "queued", "h2").await;
    // A low call that may dip but finds no room is told when the rate has room for it beside
    // the reserves (none are kept from low): 50 tokens at 1,000 a minute, 3 s from the rate's
    // last grant.
    match b.try_acquire(&tokens("probe", 50, "low")).await {
        Err(AcquireError::Full {
            dimension: Dimension::TokensPerMinute,
            retry_in: Some(retry_in),
            ..
        }) => assert!(
            // (Less the real time since fill's grant, as the rate refills: at most a second.)
            retry_in <= Duration::from_secs(3) && retry_in >= Duration::from_secs(2),
            "{retry_in:?}"
        ),
        other => panic!("expected no room yet, and when, got {other:?}"),
    }
    let mut lows = Vec::new();
    for i in 1..=5 {
        let fleet = if i % 2 == 0 { &b } else { &a };
        let id = format!("l{i}");
        lows.push(spawn_request(fleet, tokens(&id, 50, "low"), LONG));
        wait_for_event_on(&mut events, &a, "queued", &id).await;
    }
    // 12 s on the cell's clock refill 200 tokens. fill's release hands off: the head is short
    // (800 + 200 + 700 > 1,000) and h2 behind it may not take tokens; l1 to l4 dip (200 of
    // low's 200), l5 would pass the reserve.
    a.advance_server_clock(Duration::from_secs(12))
        .await
        .expect("skew");
    fill.release(Outcome::Completed).await.expect("released");
    let dipped = [
        "drain:admitted",
        "fill:admitted",
        "l1:handoff",
        "l2:handoff",
        "l3:handoff",
        "l4:handoff",
    ];
    assert_eq!(admissions(&a).await, dipped);
    assert_eq!(low_spent(&mut conn, &a).await, Some(200 * 65_536));
    let mut lows = lows.into_iter();
    let mut dips = Vec::new();
    for _ in 1..=4 {
        let task = lows.next().expect("a low call");
        dips.push(task.await.expect("task").expect("a dip"));
    }
    // 30 s more: 500 tokens left, room for l5's 50, but not in its reserve, and the head is
    // still short (500 + 200 + 700 > 1,000): a hand-off grants nobody.
    a.advance_server_clock(Duration::from_secs(30))
        .await
        .expect("skew");
    let mut dips = dips.into_iter();
    dips.next()
        .expect("l1")
        .release(Outcome::Completed)
        .await
        .expect("released");
    assert_eq!(admissions(&a).await, dipped);
    // 24 s more: 900 refilled since the dips, the head's 700 and the 200 it leaves aside. The
    // next hand-off grants it first (the dips delayed it by low's reserve, once), which earns
    // low back 175 (25 left spent); h2 is the head now and l5 dips beside it (75 spent).
    a.advance_server_clock(Duration::from_secs(24))
        .await
        .expect("skew");
    dips.next()
        .expect("l2")
        .release(Outcome::Completed)
        .await
        .expect("released");
    let mut all = dipped.to_vec();
    all.extend(["h:handoff", "l5:handoff"]);
    assert_eq!(admissions(&a).await, all);
    assert_eq!(low_spent(&mut conn, &a).await, Some(75 * 65_536));
    let h = h.await.expect("task").expect("h");
    let l5 = lows
        .next()
        .expect("l5")
        .await
        .expect("task")
        .expect("l5, a dip");
    // A minute more: h's release hands the tokens to h2, the line empties, low's spent count is
    // forgotten.
    a.advance_server_clock(Duration::from_secs(60))
        .await
        .expect("skew");
    h.release(Outcome::Completed).await.expect("released");
    let h2 = h2.await.expect("task").expect("h2");
    assert_eq!(low_spent(&mut conn, &a).await, None);
    for lease in dips.chain([drain, l5, h2]) {
        lease.release(Outcome::Completed).await.expect("released");
    }
}
