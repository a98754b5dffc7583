//! A rate held over every rolling minute (a burst share of the budget), leases that spend several
//! requests, and slices of the rates spent call by call in one process. Arithmetic on the cell's
//! test clock (a minute of one hour, so real time adds next to nothing to a level during a test);
//! a slice given back at the end of its hold in real time.

use std::time::Duration;

use admission_redis::{
    AcquireError, Burst, Dimension, LeaseRequest, NeverReason, Outcome, RateSlices, Rates,
    RedisAdmission, RedisAdmissionConfig, SliceConfig, SliceStats,
};

use crate::support::{ceilings, cell, config, connect, server};

const HOUR: Duration = Duration::from_secs(3600);

/// A cell of `tokens` and `requests` per hour-long "minute", with the burst given.
fn hourly(
    host: &str,
    port: u16,
    test: &str,
    (tokens, requests): (u64, u64),
    burst: Option<Burst>,
) -> RedisAdmissionConfig {
    let mut cfg = config(
        host,
        port,
        &cell(test),
        ceilings(1 << 40, 1024, 1 << 40, 1024, 1024),
    );
    cfg.rates = Some(Rates {
        minute: HOUR,
        burst,
        ..Rates::per_minute(tokens, requests)
    });
    cfg
}

fn request(id: &str, tokens: u64) -> LeaseRequest {
    LeaseRequest::new(id, "org", "model", tokens, "call")
}

async fn levels(fleet: &RedisAdmission) -> (u64, u64) {
    let rates = fleet
        .snapshot("org", "model")
        .await
        .expect("snapshot")
        .rates
        .expect("a cell with rates");
    (rates.tokens_left, rates.requests_left)
}

/// Greedy 10-token leases, the cell's clock moved one sixtieth of its minute between rounds, for
/// three minutes: the leases granted in each round.
async fn greedy_rounds(fleet: &RedisAdmission) -> Vec<u64> {
    let mut rounds = Vec::new();
    let mut next = 0;
    for _ in 0..180 {
        let mut granted = 0;
        loop {
            match fleet.try_acquire(&request(&format!("g{next}"), 10)).await {
                Ok(lease) => {
                    next += 1;
                    granted += 1;
                    lease.release(Outcome::Completed).await.expect("released");
                }
                Err(AcquireError::Full {
                    dimension: Dimension::TokensPerMinute,
                    ..
                }) => break,
                Err(other) => panic!("expected a refusal on the token rate, got {other:?}"),
            }
        }
        rounds.push(granted);
        fleet.advance_server_clock(HOUR / 60).await.expect("skew");
    }
    rounds
}

/// The most leases granted within any 60 consecutive rounds (one minute of the cell's clock).
fn most_in_a_minute(rounds: &[u64]) -> u64 {
    rounds
        .windows(60)
        .map(|w| w.iter().sum())
        .max()
        .unwrap_or(0)
}

/// 1,000 tokens a minute with a burst of 100 tokens: the level holds 100 tokens and refills 900
/// a minute (15 each sixtieth), so greedy 10-token leases get 10 at once, then 1 and 2 in turn:
/// 98 in the first minute (100 + 59 * 15 tokens), 90 in every later one, 278 in three; never over
/// the 100 leases (1,000 tokens) of the budget in any rolling minute. The same budget without a
/// burst lets 198 through in the first minute: a full level, then a minute's refill.
#[tokio::test]
async fn a_burst_holds_the_budget_over_every_rolling_minute() {
    let (host, port) = server("rate_burst");
    let held = connect(hourly(
        &host,
        port,
        "rate_burst",
        (1_000, 10_000),
        Some(Burst {
            tokens: 100,
            requests: 1_000,
        }),
    ))
    .await;
    assert_eq!(
        levels(&held).await,
        (100, 1_000),
        "the levels hold the burst"
    );
    let rounds = greedy_rounds(&held).await;
    assert_eq!(rounds[..4], [10, 1, 2, 1], "the burst, then the refill");
    assert_eq!(rounds[..60].iter().sum::<u64>(), 98);
    assert_eq!(rounds[60..120].iter().sum::<u64>(), 90);
    assert_eq!(rounds.iter().sum::<u64>(), 278);
    assert_eq!(most_in_a_minute(&rounds), 98, "never over the budget's 100");

    let whole = connect(hourly(
        &host,
        port,
        "rate_burst_none",
        (1_000, 10_000),
        None,
    ))
    .await;
    let rounds = greedy_rounds(&whole).await;
    assert_eq!(rounds[0], 100, "a whole budget at once");
    let most = most_in_a_minute(&rounds);
    assert!(
        (197..=199).contains(&most),
        "nearly twice the budget: {most}"
    );
}

/// A lease may spend several requests; one that cannot fit in what a level holds is refused for
/// good, before or at the server, with the numbers; a slice's release gives back exactly the
/// tokens and requests it did not spend, never more than it took.
#[tokio::test]
async fn a_lease_spends_its_requests_and_a_slice_gives_back_the_rest() {
    let (host, port) = server("rate_requests_n");
    let fleet = connect(hourly(
        &host,
        port,
        "rate_requests_n",
        (1_000, 100),
        Some(Burst {
            tokens: 100,
            requests: 10,
        }),
    ))
    .await;
    assert_eq!(levels(&fleet).await, (100, 10));
    let slice = fleet
        .try_acquire(&request("s1", 80).with_requests(6))
        .await
        .expect("fits");
    assert_eq!(levels(&fleet).await, (20, 4));
    match fleet.try_acquire(&request("s2", 10).with_requests(5)).await {
        Err(AcquireError::Full {
            dimension: Dimension::RequestsPerMinute,
            held: 6,
            asked: 5,
            ceiling: 10,
            retry_in: Some(_),
        }) => {}
        other => panic!("expected a refusal on the request rate, got {other:?}"),
    }
    // Spent 30 tokens and 2 requests of 80 and 6: 50 and 4 go back.
    slice
        .release_slice(Outcome::Completed, 30, 2)
        .await
        .expect("released");
    assert_eq!(levels(&fleet).await, (70, 8));
    // A slice that says it spent nothing gives back what it took, no more.
    let slice = fleet
        .try_acquire(&request("s3", 70).with_requests(8))
        .await
        .expect("fits");
    assert_eq!(levels(&fleet).await, (0, 0));
    slice
        .release_slice(Outcome::Completed, 0, 0)
        .await
        .expect("released");
    assert_eq!(levels(&fleet).await, (70, 8));

    match fleet.try_acquire(&request("big", 101)).await {
        Err(AcquireError::Never {
            reason:
                NeverReason::OverCeiling {
                    dimension: Dimension::TokensPerMinute,
                    asked: 101,
                    ceiling: 100,
                },
        }) => {}
        other => panic!("expected a refusal for good on tokens, got {other:?}"),
    }
    let error = fleet
        .try_acquire(&request("many", 1).with_requests(11))
        .await
        .expect_err("over what the level holds");
    assert!(
        matches!(
            &error,
            AcquireError::Never {
                reason: NeverReason::OverCeiling {
                    dimension: Dimension::RequestsPerMinute,
                    asked: 11,
                    ceiling: 10,
                },
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("11 requests are over the requests_per_minute ceiling of 10"),
        "{error}"
    );
    match fleet
        .try_acquire(&request("none", 1).with_requests(0))
        .await
    {
        Err(AcquireError::Never {
            reason: NeverReason::NoRequests,
        }) => {}
        other => panic!("expected a refusal for good on zero requests, got {other:?}"),
    }
}

/// Slices grow with the demand: 1 call, then 2, 4, 8 and 8 again (`max_calls`), each taken when
/// the last was spent before its time, so 23 calls cost 5 slices; the tokens and requests they
/// took are exactly the calls'. `close` gives the rest of the slice held back (6 of 8 requests,
/// and 66 tokens: 6 calls' and what one call did not spend), and a slice whose hold ran out is
/// given back by itself, in real time. (Budgets of 1,000 an hour: real time refills less than a
/// token or a request during the test.)
#[tokio::test]
async fn slices_grow_with_demand_and_give_back_what_they_did_not_spend() {
    let (host, port) = server("rate_slices");
    let fleet = connect(hourly(&host, port, "rate_slices", (1_000, 1_000), None)).await;
    let slices = RateSlices::new(
        fleet.clone(),
        SliceConfig {
            max_calls: 8,
            hold: Duration::from_secs(1),
            ..SliceConfig::new("org", "model")
        },
    )
    .expect("a valid slice config");
    for _ in 0..23 {
        let call = slices.admit(10).await.expect("admitted");
        slices.finish(call, 10);
    }
    assert_eq!(
        slices.stats(),
        SliceStats {
            slices: 5,
            returned: 4,
            calls: 23,
            requests_returned: 0,
            tokens_returned: 0,
        }
    );
    assert_eq!(levels(&fleet).await, (1_000 - 230, 1_000 - 23));
    let call = slices.admit(10).await.expect("admitted");
    // The call spent 4 of its 10 tokens: 6 go back to the slice it came from.
    slices.finish(call, 4);
    let call = slices.admit(10).await.expect("admitted");
    slices.finish(call, 10);
    assert_eq!(
        slices.stats().slices,
        6,
        "a new slice of 8 for the two calls"
    );
    assert_eq!(levels(&fleet).await, (1_000 - 230 - 80, 1_000 - 23 - 8));
    slices.close().await;
    let stats = slices.stats();
    assert_eq!((stats.returned, stats.requests_returned), (6, 6));
    assert_eq!(stats.tokens_returned, 66);
    assert_eq!(levels(&fleet).await, (1_000 - 230 - 14, 1_000 - 25));

    // A slice held past its hold goes back by itself.
    let fast = RateSlices::new(
        fleet.clone(),
        SliceConfig {
            max_calls: 8,
            hold: Duration::from_millis(200),
            ..SliceConfig::new("org", "model")
        },
    )
    .expect("a valid slice config");
    for _ in 0..2 {
        let call = fast.admit(10).await.expect("admitted");
        fast.finish(call, 10);
    }
    // The first slice (1 call) was spent at once; the second covers 2 calls, 1 left.
    assert_eq!(levels(&fleet).await, (1_000 - 244 - 30, 1_000 - 28));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while fast.stats().returned < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slice was not given back at the end of its hold"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fast.stats().requests_returned, 1);
    assert_eq!(levels(&fleet).await, (1_000 - 244 - 20, 1_000 - 27));
}

/// Budgets the headers lower under slices that grew: a slice bigger than the levels now hold is
/// refused for good by the cell, and the slices shrink to what they hold (tokens, then requests)
/// and ask again, so the call is admitted.
#[tokio::test]
async fn slices_shrink_to_levels_that_a_lower_budget_holds() {
    let (host, port) = server("rate_slices_shrink");
    let fleet = connect(hourly(
        &host,
        port,
        "rate_slices_shrink",
        (1_000, 1_000),
        None,
    ))
    .await;
    let slices = RateSlices::new(
        fleet.clone(),
        SliceConfig {
            max_calls: 64,
            hold: Duration::from_secs(1),
            ..SliceConfig::new("org", "model")
        },
    )
    .expect("a valid slice config");
    // Slices of 1, 2, 4, 8 and 16 calls: the next asks for 32 (320 tokens, 32 requests).
    for _ in 0..31 {
        let call = slices.admit(10).await.expect("admitted");
        slices.finish(call, 10);
    }
    assert_eq!(slices.stats().slices, 5);
    fleet.update_rates(200, 20).await.expect("new budgets");
    assert_eq!(levels(&fleet).await, (200, 20));
    let call = slices
        .admit(10)
        .await
        .expect("admitted from a smaller slice");
    slices.finish(call, 10);
    assert_eq!(slices.stats().slices, 6);
    assert_eq!(
        levels(&fleet).await,
        (0, 0),
        "a slice of 20 calls, 200 tokens"
    );
    slices.close().await;
    assert_eq!(levels(&fleet).await, (190, 19));
}

/// A slice config that cannot work is refused with the field named.
#[tokio::test]
async fn a_slice_config_that_cannot_work_is_refused() {
    let (host, port) = server("rate_slices_cfg");
    let fleet = connect(hourly(&host, port, "rate_slices_cfg", (1_000, 100), None)).await;
    let bad = |change: fn(&mut SliceConfig)| {
        let mut cfg = SliceConfig::new("org", "model");
        change(&mut cfg);
        RateSlices::new(fleet.clone(), cfg).err().map(|e| e.field())
    };
    assert_eq!(bad(|c| c.hold = Duration::ZERO), Some("hold"));
    // A third of the lease TTL (3 s here) is the most.
    assert_eq!(bad(|c| c.hold = Duration::from_secs(4)), Some("hold"));
    assert_eq!(bad(|c| c.max_calls = 0), Some("max_calls"));
    assert_eq!(bad(|c| c.max_calls = 4_097), Some("max_calls"));
    assert_eq!(bad(|_| {}), None);
    let mut plain = config(
        &host,
        port,
        &cell("rate_slices_cfg_plain"),
        ceilings(100, 4, 100, 4, 4),
    );
    plain.rates = None;
    let plain = connect(plain).await;
    let error = RateSlices::new(plain, SliceConfig::new("org", "model"))
        .err()
        .expect("a cell without rates has no slices");
    assert_eq!(error.field(), "rates");
}

/// A burst must be at least one token and one request and at most half of each budget (else the
/// level would not refill): refused at validation with the field named.
#[test]
fn a_burst_that_cannot_work_is_refused_at_validation() {
    let field = |tokens: u64, requests: u64| {
        let mut cfg = config("127.0.0.1", 6379, "burst", ceilings(100, 4, 100, 4, 4));
        cfg.rates =
            Some(Rates::per_minute(1_000, 100).within_every_minute(Burst { tokens, requests }));
        cfg.validate().err().map(|e| e.field())
    };
    assert_eq!(field(60, 4), None);
    assert_eq!(field(500, 50), None);
    assert_eq!(field(0, 4), Some("rates.burst.tokens"));
    assert_eq!(field(501, 4), Some("rates.burst.tokens"));
    assert_eq!(field(60, 0), Some("rates.burst.requests"));
    assert_eq!(field(60, 51), Some("rates.burst.requests"));
}
