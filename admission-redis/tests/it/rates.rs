//! A cell's rates: tokens and requests per minute shared by the fleet, refilled on the server's
//! clock, charged in the same call as the in-flight ceilings, slowed by the fleet's backpressure,
//! changed by any instance, refunded by what a call did not spend. Arithmetic on the cell's test
//! clock; the schedule (a head served at its instant, with no call in between) in real time on a
//! private server whose script calls are counted.

use std::time::{Duration, Instant};

use admission_redis::{
    AcquireError, CallReport, Dimension, LeaseRequest, NeverReason, Outcome, PolicyError, Rates,
    RedisAdmission, RedisAdmissionConfig, Upstream,
};

use crate::support::{
    PrivateRedis, ceilings, cell, config, connect, redis_server_binary, script_calls, server,
    spawn_acquire,
};

fn rated(host: &str, port: u16, test: &str, tokens: u64, requests: u64) -> RedisAdmissionConfig {
    let mut cfg = config(
        host,
        port,
        &cell(test),
        ceilings(1 << 40, 64, 1 << 40, 64, 64),
    );
    cfg.rates = Some(Rates::per_minute(tokens, requests));
    cfg
}

fn request(id: &str, tokens: u64) -> LeaseRequest {
    LeaseRequest::new(id, "org", "model", tokens, "call")
}

/// Tokens left of the cell's budget, as a snapshot reads them.
async fn tokens_left(fleet: &RedisAdmission) -> u64 {
    let snapshot = fleet.snapshot("org", "model").await.expect("snapshot");
    snapshot.rates.expect("a cell with rates").tokens_left
}

/// Two instances take 100-token leases in turn from one cell of 1,000 tokens a minute: exactly
/// ten are granted between them, the eleventh is refused on the token rate with the time the
/// refill needs (100 tokens at 1,000 a minute: 6 s, less what has refilled since); a minute later
/// on the cell's clock exactly ten more, and two minutes later still ten (the budget caps what
/// accumulates).
#[tokio::test]
async fn two_instances_draining_one_cells_rate_get_exactly_the_budget() {
    let (host, port) = server("rate_budget");
    let cfg = rated(&host, port, "rate_budget", 1_000, 1_000);
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    let started = Instant::now();
    let mut granted = 0;
    let refusal = loop {
        let fleet = if granted % 2 == 0 { &a } else { &b };
        match fleet
            .try_acquire(&request(&format!("l{granted}"), 100))
            .await
        {
            Ok(lease) => {
                lease.release(Outcome::Completed).await.expect("released");
                granted += 1;
            }
            Err(error) => break error,
        }
    };
    assert_eq!(granted, 10, "the budget, no more");
    let AcquireError::Full {
        dimension,
        asked,
        ceiling,
        retry_in: Some(retry_in),
        ..
    } = refusal
    else {
        panic!("expected a refusal on the rate, got {refusal:?}");
    };
    assert_eq!(
        (dimension, asked, ceiling),
        (Dimension::TokensPerMinute, 100, 1_000)
    );
    let elapsed = started.elapsed();
    assert!(
        retry_in <= Duration::from_secs(6)
            && retry_in + elapsed + Duration::from_millis(5) >= Duration::from_secs(6),
        "{retry_in:?} after {elapsed:?}"
    );

    for (skip, round) in [(60, "m1"), (120, "m2")] {
        a.advance_server_clock(Duration::from_secs(skip))
            .await
            .expect("skew");
        let mut again = 0;
        while let Ok(lease) = b
            .try_acquire(&request(&format!("{round}-{again}"), 100))
            .await
        {
            lease.release(Outcome::Completed).await.expect("released");
            again += 1;
        }
        assert_eq!(again, 10, "a full budget after {skip} s, never more");
    }
}

/// The request rate is a budget of its own: three requests a minute admit three 1-token leases,
/// and the fourth is refused on `requests_per_minute`; a lease over the token budget is refused
/// for good, naming it.
#[tokio::test]
async fn the_request_rate_and_a_lease_over_the_token_budget() {
    let (host, port) = server("rate_requests");
    let fleet = connect(rated(&host, port, "rate_requests", 1_000, 3)).await;
    for i in 0..3 {
        let lease = fleet
            .try_acquire(&request(&format!("r{i}"), 1))
            .await
            .expect("a request left");
        lease.release(Outcome::Completed).await.expect("released");
    }
    match fleet.try_acquire(&request("r3", 1)).await {
        Err(AcquireError::Full {
            dimension: Dimension::RequestsPerMinute,
            held: 3,
            asked: 1,
            ceiling: 3,
            retry_in: Some(retry_in),
        }) => assert!(retry_in <= Duration::from_secs(20), "{retry_in:?}"),
        other => panic!("expected a refusal on the request rate, got {other:?}"),
    }
    match fleet.try_acquire(&request("big", 1_001)).await {
        Err(AcquireError::Never {
            reason:
                NeverReason::OverCeiling {
                    dimension: Dimension::TokensPerMinute,
                    asked: 1_001,
                    ceiling: 1_000,
                },
        }) => {}
        other => panic!("expected a refusal for good, got {other:?}"),
    }
}

/// The waiters of a drained rate are served in ticket order, each at the instant the refill
/// makes room, in real time: the head learns its instant from its own refusal, each next head
/// from a notice the line's walk writes when it stops at it (after the head before it was served
/// by its own call, holding its lease); a release of another lease meanwhile wakes none of them. Each waiter makes exactly two calls (its refusal and its ask at the
/// instant), the release one, counted by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_rate_alone_are_served_at_their_instants_with_no_call_between() {
    let binary = redis_server_binary("rate_instants");
    let redis = PrivateRedis::start(&binary, &[]);
    let port = redis.port;
    // 6,000 tokens a minute: 100 a second.
    let mut cfg = rated("127.0.0.1", port, "rate_instants", 6_000, 1_000);
    cfg.lease_ttl = Duration::from_secs(30);
    cfg.renew_every = Duration::from_secs(10);
    cfg.redis_wait = Duration::from_secs(20);
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    // Spend 5,950 tokens: held by a lease that is released while the waiters wait. The refill
    // counts from its grant, after `started`.
    let started = Instant::now();
    let holder = a
        .try_acquire(&request("holder", 5_950))
        .await
        .expect("fits");
    let before = script_calls(port).await;
    let mut waiters = Vec::new();
    for (i, fleet) in [&b, &a, &b].into_iter().enumerate() {
        let waiting = spawn_acquire(
            fleet,
            &format!("w{i}"),
            "org",
            "model",
            100,
            Duration::from_secs(20),
        );
        waiters.push(tokio::spawn(async move {
            // Held until all three are served: only the rates and the line's notices serve them.
            let lease = waiting.await.expect("task").expect("granted");
            (started.elapsed(), lease)
        }));
        // Queue them in this order.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A release of in-flight capacity: no waiter is short of that, and it wakes none of them.
    holder.release(Outcome::Completed).await.expect("released");
    let mut served = Vec::new();
    for waiter in waiters {
        served.push(waiter.await.expect("waiter"));
    }
    // 50 tokens short for the first (0.5 s), then 100 more for each (1 s each): granted at
    // about 0.5, 1.5 and 2.5 s, never before.
    for (i, (at, _)) in served.iter().enumerate() {
        let due = Duration::from_millis(500 + 1_000 * i as u64);
        assert!(*at >= due, "w{i} at {at:?}, before its instant {due:?}");
        assert!(
            *at < due + Duration::from_millis(900),
            "w{i} at {at:?}, long after {due:?}"
        );
    }
    assert!(
        served.windows(2).all(|w| w[0].1.token() < w[1].1.token()),
        "ticket order"
    );
    for (_, lease) in served {
        lease.release(Outcome::Completed).await.expect("released");
    }
    let calls = script_calls(port).await - before;
    // Three waiters x (refusal + ask at the instant + release), and the holder's release.
    assert_eq!(calls, 3 * 3 + 1, "no call in between");
}

/// A 429 recorded by one instance slows the other's refill: two 429s make the throttle 1.0, so
/// 30 s of the cell's clock refill 150 of 600 tokens a minute instead of 300; a header reading
/// applied by one instance (a smaller budget) is the other's budget at once, with a new policy
/// version, and a lease over it is refused for good; three successes relieve the throttle by
/// 0.2.
#[tokio::test]
async fn backpressure_and_budgets_recorded_by_one_instance_hold_for_the_other() {
    let (host, port) = server("rate_feedback");
    let cfg = rated(&host, port, "rate_feedback", 600, 1_000);
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    let lease = a.try_acquire(&request("all", 600)).await.expect("fits");
    lease.release(Outcome::Completed).await.expect("released");
    assert_eq!(a.record_429().await.expect("429"), 0.5);
    assert_eq!(a.record_429().await.expect("429"), 1.0);
    a.advance_server_clock(Duration::from_secs(30))
        .await
        .expect("skew");
    let left = tokens_left(&b).await;
    // Real time adds 0.005 tokens a millisecond at this throttle.
    assert!((150..=151).contains(&left), "{left}");
    let snapshot = b.snapshot("org", "model").await.expect("snapshot");
    assert_eq!(snapshot.rates.expect("rates").throttle_tenths, 10);

    let version = b
        .snapshot("org", "model")
        .await
        .expect("snapshot")
        .policy_version;
    let changed = a.update_rates(100, 1_000).await.expect("updated");
    assert!(changed > version);
    let snapshot = b.snapshot("org", "model").await.expect("snapshot");
    let rates = snapshot.rates.expect("rates");
    assert_eq!(
        (rates.tokens_per_minute, rates.requests_per_minute),
        (100, 1_000)
    );
    assert_eq!(
        rates.tokens_left, 100,
        "a budget that shrank lowers its level"
    );
    assert_eq!(snapshot.policy_version, changed);
    assert!(matches!(
        b.try_acquire(&request("over", 101)).await,
        Err(AcquireError::Never {
            reason: NeverReason::OverCeiling {
                dimension: Dimension::TokensPerMinute,
                asked: 101,
                ceiling: 100
            }
        })
    ));
    assert_eq!(
        a.update_rates(100, 1_000).await.expect("same"),
        changed,
        "no change"
    );
    assert!(matches!(
        a.update_rates(0, 10).await,
        Err(PolicyError::Invalid {
            field: "tokens_per_minute",
            value: 0,
            ..
        })
    ));

    assert_eq!(b.record_success().await.expect("success"), 1.0);
    assert_eq!(b.record_success().await.expect("success"), 1.0);
    assert_eq!(a.record_success().await.expect("success"), 0.8);
}

/// A lease declared 500 tokens and spent 200: releasing it with what it spent gives 300 back to
/// the rate (100 left + 300 = 400, and what real time refilled); a refund never goes past the
/// budget or past the footprint.
#[tokio::test]
async fn unused_tokens_go_back_to_the_rate() {
    let (host, port) = server("rate_refund");
    let fleet = connect(rated(&host, port, "rate_refund", 600, 1_000)).await;
    let lease = fleet
        .try_acquire(&request("call", 500))
        .await
        .expect("fits");
    let left = tokens_left(&fleet).await;
    assert!((100..=101).contains(&left), "{left}");
    lease
        .release_spent(Outcome::Completed, 200)
        .await
        .expect("released");
    let left = tokens_left(&fleet).await;
    assert!((400..=401).contains(&left), "{left}");
    // 50 declared, none spent: 50 back at most; the level never passes the budget.
    let small = fleet
        .try_acquire(&request("small", 50))
        .await
        .expect("fits");
    small
        .release_spent(Outcome::Failed, 0)
        .await
        .expect("released");
    let left = tokens_left(&fleet).await;
    assert!((400..=402).contains(&left), "{left}");
    fleet
        .advance_server_clock(Duration::from_secs(120))
        .await
        .expect("skew");
    let big = fleet
        .try_acquire(&request("big", 600))
        .await
        .expect("a full budget");
    big.release_spent(Outcome::Completed, 0)
        .await
        .expect("released");
    assert_eq!(tokens_left(&fleet).await, 600, "capped at the budget");
}

/// Without rates, the rate calls say so.
#[tokio::test]
async fn a_cell_without_rates_refuses_the_rate_calls() {
    let (host, port) = server("no_rates");
    let fleet = connect(config(
        &host,
        port,
        &cell("no_rates"),
        ceilings(10, 1, 10, 1, 1),
    ))
    .await;
    assert!(matches!(
        fleet.record_429().await,
        Err(PolicyError::NoRates)
    ));
    assert!(matches!(
        fleet.update_rates(10, 10).await,
        Err(PolicyError::NoRates)
    ));
    assert_eq!(
        fleet
            .snapshot("org", "model")
            .await
            .expect("snapshot")
            .rates,
        None
    );
}

/// A release carries what its call said of the upstream, in the same call: a 429 (refused, so it
/// spent nothing: all 300 tokens go back) raises the throttle the other instance sees to 0.5;
/// three successes take 0.2 off; a plain error changes nothing.
#[tokio::test]
async fn a_release_reports_the_upstreams_answer_to_the_whole_cell() {
    let (host, port) = server("rate_reported");
    let cfg = rated(&host, port, "rate_reported", 600, 1_000);
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    let throttle = async |fleet: &RedisAdmission| {
        let snapshot = fleet.snapshot("org", "model").await.expect("snapshot");
        snapshot.rates.expect("rates").throttle_tenths
    };
    let refused = a.try_acquire(&request("429", 300)).await.expect("fits");
    assert!((300..=301).contains(&tokens_left(&b).await));
    let report = CallReport {
        spent: 0,
        upstream: Upstream::Backpressure(1),
        tokens_left: None,
    };
    refused
        .release_reported(Outcome::Failed, report)
        .await
        .expect("released");
    assert_eq!(throttle(&b).await, 5);
    let left = tokens_left(&b).await;
    assert!((599..=600).contains(&left), "{left}");
    for i in 0..3 {
        let lease = b
            .try_acquire(&request(&format!("ok{i}"), 10))
            .await
            .expect("fits");
        let report = CallReport {
            spent: 10,
            upstream: Upstream::Success,
            tokens_left: None,
        };
        lease
            .release_reported(Outcome::Completed, report)
            .await
            .expect("released");
    }
    assert_eq!(throttle(&a).await, 3);
    let lease = a.try_acquire(&request("529", 10)).await.expect("fits");
    let report = CallReport {
        spent: 0,
        upstream: Upstream::Silent,
        tokens_left: None,
    };
    lease
        .release_reported(Outcome::Failed, report)
        .await
        .expect("released");
    assert_eq!(throttle(&b).await, 3);
}

/// The tokens an upstream says it has left bring a fuller level down to them, for every
/// instance (someone outside the fleet spent the same budget); never up.
#[tokio::test]
async fn the_upstreams_tokens_left_bring_the_level_down() {
    let (host, port) = server("rate_left");
    let cfg = rated(&host, port, "rate_left", 600, 1_000);
    let (a, b) = (connect(cfg.clone()).await, connect(cfg).await);
    let lease = a.try_acquire(&request("call", 100)).await.expect("fits");
    let report = CallReport {
        spent: 100,
        upstream: Upstream::Success,
        tokens_left: Some(200),
    };
    lease
        .release_reported(Outcome::Completed, report)
        .await
        .expect("released");
    let left = tokens_left(&b).await;
    assert!((200..=201).contains(&left), "{left}");
    // A larger reading raises nothing.
    let lease = b.try_acquire(&request("again", 10)).await.expect("fits");
    let report = CallReport {
        spent: 10,
        upstream: Upstream::Success,
        tokens_left: Some(590),
    };
    lease
        .release_reported(Outcome::Completed, report)
        .await
        .expect("released");
    let left = tokens_left(&a).await;
    assert!((190..=192).contains(&left), "{left}");
}
