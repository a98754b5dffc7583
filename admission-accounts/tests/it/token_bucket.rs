//! The token bucket: clocked tokens and requests per minute with an adaptive throttle, held to
//! the account contract and to every rule of its own, on a fake clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use admission_accounts::TokenBucketStatus;
use admission_accounts::counting_gate::CountingGate;
use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
use admission_core::{
    Account, AdmitError, Amount, Answer, Ask, Category, Clock, Demand, Instant, JobContext,
    Monitor, RefusalKind, Replenishment, WakeFn,
};
use admission_testkit::FakeClock;
use admission_testkit::contract::{self, Subject};
use admission_testkit::monitor::{poll_once, wait_until};
use proptest::prelude::*;

const SECOND: u64 = 1_000_000_000;

fn config(tokens_per_minute: u64, requests_per_minute: u64) -> TokenBucketConfig {
    TokenBucketConfig::new(tokens_per_minute, requests_per_minute)
}

fn bucket(clock: &FakeClock, tokens_per_minute: u64, requests_per_minute: u64) -> TokenBucket {
    TokenBucket::new(
        "gpt",
        config(tokens_per_minute, requests_per_minute),
        clock.shared(),
    )
    .expect("positive budgets are valid")
}

fn call(tokens: u64) -> Amount {
    Amount::pair(tokens, 1)
}

fn at(nanos: u64) -> Option<Instant> {
    Some(Instant::from_nanos(nanos))
}

/// Asks as the head and takes: true when taken, false when not now.
fn take(bucket: &TokenBucket, amount: Amount) -> bool {
    match bucket.ask(amount, Ask::HEAD) {
        Answer::Taken => true,
        Answer::NotNow(_) => false,
        Answer::Never(refusal) => panic!("expected the amount to fit the budgets: {refusal}"),
    }
}

/// The instant a look as the head says time alone makes `amount` fit (`Some(None)`: only an
/// event); `None` when it is taken or refused.
fn not_now(bucket: &TokenBucket, amount: Amount) -> Option<Option<Instant>> {
    bucket.ask(amount, Ask::HEAD.look()).not_now()
}

/// The kind of refusal a look as the head meets, if it meets one.
fn refusal_kind(bucket: &TokenBucket, amount: Amount) -> Option<RefusalKind> {
    bucket
        .ask(amount, Ask::HEAD.look())
        .refusal()
        .map(|r| r.kind())
}

fn too_large(asked: Amount, tokens_per_minute: u64, requests_per_minute: u64) -> RefusalKind {
    RefusalKind::TooLarge {
        asked,
        max: Amount::pair(tokens_per_minute, requests_per_minute),
    }
}

fn counting_wake() -> (Arc<AtomicUsize>, WakeFn) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let wake: WakeFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (calls, wake)
}

/// A bucket at 6,000 tokens and 60 requests a minute, drained to 100 tokens and 59 requests.
fn hundred_left(clock: &FakeClock) -> TokenBucket {
    let bucket = bucket(clock, 6_000, 60);
    assert!(take(&bucket, call(5_900)));
    bucket
}

// The contract ---------------------------------------------------------------------------------

#[test]
fn passes_the_whole_account_contract_when_both_budgets_bind_together() {
    contract::run_all(|| {
        let clock = FakeClock::new();
        let bucket = bucket(&clock, 600, 6);
        Subject::time(Arc::new(bucket), clock, call(100), 6).with_never_fits(call(601))
    });
}

#[test]
fn passes_the_whole_account_contract_when_requests_bind_first() {
    contract::run_all(|| {
        let clock = FakeClock::new();
        let bucket = bucket(&clock, 10_000, 3);
        Subject::time(Arc::new(bucket), clock, call(7), 3).with_never_fits(Amount::pair(1, 4))
    });
}

#[test]
fn passes_the_whole_account_contract_while_throttled() {
    contract::run_all(|| {
        let clock = FakeClock::new();
        let bucket = bucket(&clock, 700, 70);
        bucket.record_backpressure(3);
        Subject::time(Arc::new(bucket), clock, Amount::pair(70, 7), 10)
            .with_never_fits(Amount::pair(701, 1))
    });
}

#[test]
fn it_is_a_time_account_of_category_token_bucket() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    assert_eq!(bucket.category(), Category::custom("token_bucket"));
    assert_eq!(bucket.replenishment(), Replenishment::Time);
    assert_eq!(bucket.name(), "gpt");
}

// Configuration --------------------------------------------------------------------------------

#[test]
fn a_zero_budget_is_a_config_error_naming_the_field() {
    let clock = FakeClock::new();
    let no_tokens = TokenBucket::new("gpt", config(0, 60), clock.shared()).unwrap_err();
    assert_eq!(
        (no_tokens.limiter, no_tokens.field),
        ("token bucket", "tokens_per_minute")
    );
    let no_requests = TokenBucket::new("gpt", config(6_000, 0), clock.shared()).unwrap_err();
    assert_eq!(no_requests.field, "requests_per_minute");
    assert!(
        no_requests.to_string().contains("`requests_per_minute`"),
        "{no_requests}"
    );
}

#[test]
fn a_new_bucket_is_full_in_both_dimensions() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    assert_eq!((bucket.level(), bucket.requests_available()), (6_000, 60));
    assert_eq!(bucket.config(), config(6_000, 60));
    assert_eq!(bucket.throttle(), 0.0);
}

// The clocked level ----------------------------------------------------------------------------

#[test]
fn the_level_refills_from_the_clock_and_stops_at_the_budget() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, Amount::pair(6_000, 60)));
    assert_eq!((bucket.level(), bucket.requests_available()), (0, 0));
    clock.advance(Duration::from_secs(1));
    assert_eq!((bucket.level(), bucket.requests_available()), (100, 1));
    clock.advance(Duration::from_secs(29));
    assert_eq!((bucket.level(), bucket.requests_available()), (3_000, 30));
    clock.advance(Duration::from_secs(3_600));
    assert_eq!((bucket.level(), bucket.requests_available()), (6_000, 60));
}

#[test]
fn refilling_in_many_small_reads_loses_nothing() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 7, 7);
    assert!(take(&bucket, Amount::pair(7, 7)));
    // 7 a minute is one every 8.571... seconds: read every millisecond for one minute.
    for _ in 0..60_000 {
        clock.advance(Duration::from_millis(1));
        let _ = bucket.ask(call(1), Ask::HEAD.look());
    }
    assert_eq!((bucket.level(), bucket.requests_available()), (7, 7));
}

#[test]
fn a_take_debits_exactly_its_amount_in_both_dimensions() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, Amount::pair(1_234, 5)));
    assert_eq!((bucket.level(), bucket.requests_available()), (4_766, 55));
    assert!(take(&bucket, Amount::units(766)));
    assert_eq!((bucket.level(), bucket.requests_available()), (4_000, 55));
}

// Deadlines ------------------------------------------------------------------------------------

#[test]
fn one_hundred_tokens_short_at_six_thousand_a_minute_is_exactly_one_second() {
    let clock = FakeClock::new();
    let bucket = hundred_left(&clock);
    let next = call(200);
    assert_eq!(not_now(&bucket, next), Some(at(SECOND)));
    clock.advance(Duration::from_nanos(SECOND - 1));
    assert_eq!(not_now(&bucket, next), Some(at(SECOND)));
    clock.advance(Duration::from_nanos(1));
    assert!(matches!(bucket.ask(next, Ask::HEAD.look()), Answer::Taken));
    assert!(take(&bucket, next));
}

#[test]
fn one_request_short_at_two_a_minute_is_exactly_thirty_seconds() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 2);
    assert!(take(&bucket, Amount::pair(10, 2)));
    assert_eq!(not_now(&bucket, call(10)), Some(at(30 * SECOND)));
    clock.advance(Duration::from_nanos(30 * SECOND - 1));
    assert_eq!(not_now(&bucket, call(10)), Some(at(30 * SECOND)));
    clock.advance(Duration::from_nanos(1));
    assert!(take(&bucket, call(10)));
}

#[test]
fn the_deadline_is_the_later_of_the_two_dimensions() {
    let clock = FakeClock::new();
    // Tokens 1 s short, requests 30 s short: the requests decide.
    let bucket = bucket(&clock, 6_000, 2);
    assert!(take(&bucket, Amount::pair(5_900, 2)));
    assert_eq!(not_now(&bucket, call(200)), Some(at(30 * SECOND)));
    // Tokens 30 s short, requests free: the tokens decide.
    let other = self::bucket(&clock, 6_000, 60);
    assert!(take(&other, call(6_000)));
    assert_eq!(
        not_now(&other, call(3_000)),
        Some(Some(clock.now().saturating_add(Duration::from_secs(30))))
    );
}

#[test]
fn not_now_honours_the_reservation_of_the_head() {
    let clock = FakeClock::new();
    let bucket = hundred_left(&clock);
    // 100 left; mine 100 fits alone, but with 200 reserved it is 200 short: two seconds.
    assert!(matches!(
        bucket.ask(call(100), Ask::HEAD.look()),
        Answer::Taken
    ));
    assert_eq!(
        bucket
            .ask(call(100), Ask::behind(call(200)).look())
            .not_now(),
        Some(at(2 * SECOND))
    );
    assert_eq!(
        bucket.ask(call(100), Ask::behind(call(200))).not_now(),
        Some(at(2 * SECOND))
    );
    assert_eq!(bucket.level(), 100);
}

#[test]
fn an_amount_that_fits_now_is_taken_now_not_told_to_wait() {
    let clock = FakeClock::new();
    clock.advance(Duration::from_secs(7));
    let bucket = bucket(&clock, 6_000, 60);
    assert!(matches!(
        bucket.ask(call(6_000), Ask::HEAD.look()),
        Answer::Taken
    ));
    assert!(matches!(bucket.ask(call(6_000), Ask::HEAD), Answer::Taken));
    assert_eq!(bucket.level(), 0);
}

#[test]
fn time_alone_never_makes_room_beyond_a_full_bucket() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    // Beyond the budgets alone: never.
    assert_eq!(
        refusal_kind(&bucket, call(6_001)),
        Some(too_large(call(6_001), 6_000, 60))
    );
    assert_eq!(
        refusal_kind(&bucket, Amount::pair(1, 61)),
        Some(too_large(Amount::pair(1, 61), 6_000, 60))
    );
    // Beyond them only with the head's reservation: not now, and no instant (only an event).
    assert_eq!(
        bucket
            .ask(call(4_000), Ask::behind(call(4_000)).look())
            .not_now(),
        Some(None)
    );
}

// Never ----------------------------------------------------------------------------------------

#[test]
fn more_tokens_than_the_budget_is_refused_outright_naming_bucket_and_numbers() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    for ask in [Ask::HEAD.look(), Ask::HEAD] {
        let answer = bucket.ask(call(6_001), ask);
        let refusal = answer.refusal().expect("never");
        assert_eq!(refusal.kind(), too_large(call(6_001), 6_000, 60));
        assert_eq!(
            refusal.message(),
            "`gpt` allows 6000 tokens and 60 requests per minute; a demand of 6001 tokens and 1 \
             requests can never fit: split it into smaller calls or use a model with a larger \
             budget"
        );
    }
    assert_eq!(bucket.level(), 6_000);
}

#[test]
fn more_requests_than_a_minute_allows_is_refused_outright() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    let answer = bucket.ask(Amount::pair(1, 61), Ask::HEAD);
    let refusal = answer.refusal().expect("never");
    assert_eq!(refusal.kind(), too_large(Amount::pair(1, 61), 6_000, 60));
    assert!(
        refusal.message().contains("60 requests") && refusal.message().contains("61"),
        "{}",
        refusal.message()
    );
    assert_eq!(
        refusal_kind(&bucket, Amount::pair(1, 61)),
        Some(too_large(Amount::pair(1, 61), 6_000, 60))
    );
    assert_eq!(bucket.requests_available(), 60);
}

#[test]
fn a_reservation_beyond_the_budget_is_not_now_never_never() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    let behind = Ask::behind(call(4_000));
    assert_eq!(bucket.ask(call(4_000), behind.look()).not_now(), Some(None));
    assert_eq!(bucket.ask(call(4_000), behind).not_now(), Some(None));
    assert_eq!(bucket.level(), 6_000);
}

#[test]
fn a_cap_lowered_under_a_parked_amount_refuses_it_at_the_next_ask() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, call(6_000)));
    let parked = call(5_000);
    // 5,000 short at 6,000 a minute: fifty seconds.
    assert_eq!(not_now(&bucket, parked), Some(at(50 * SECOND)));
    bucket.set_config(config(4_000, 60)).unwrap();
    assert_eq!(
        refusal_kind(&bucket, parked),
        Some(too_large(parked, 4_000, 60))
    );
    assert_eq!(
        bucket.ask(parked, Ask::HEAD).refusal().map(|r| r.kind()),
        Some(too_large(parked, 4_000, 60))
    );
}

// Refunds --------------------------------------------------------------------------------------

#[test]
fn a_refund_is_immediate_without_the_clock_moving() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, Amount::pair(6_000, 60)));
    bucket.give(Amount::pair(2_500, 3));
    assert_eq!((bucket.level(), bucket.requests_available()), (2_500, 3));
    assert!(take(&bucket, Amount::pair(2_500, 3)));
}

#[test]
fn a_refund_is_bounded_by_both_caps() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, Amount::pair(100, 1)));
    bucket.give(Amount::pair(10_000, 1_000));
    assert_eq!((bucket.level(), bucket.requests_available()), (6_000, 60));
    bucket.give(Amount::pair(u64::MAX, u64::MAX));
    assert_eq!((bucket.level(), bucket.requests_available()), (6_000, 60));
}

#[test]
fn a_give_calls_the_wake_slot_and_a_take_never_does() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    let (calls, wake) = counting_wake();
    bucket.on_capacity_change(Some(wake));
    assert!(take(&bucket, call(100)));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    bucket.give(call(100));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    bucket.give(Amount::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    bucket.on_capacity_change(None);
    bucket.give(call(1));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// The adaptive throttle ------------------------------------------------------------------------

#[test]
fn a_429_adds_half_and_two_429s_double_the_wait() {
    let clock = FakeClock::new();
    let bucket = hundred_left(&clock);
    assert_eq!(not_now(&bucket, call(200)), Some(at(SECOND)));
    bucket.record_429();
    assert_eq!(bucket.throttle(), 0.5);
    assert_eq!(not_now(&bucket, call(200)), Some(at(1_500_000_000)));
    bucket.record_429();
    assert_eq!(bucket.throttle(), 1.0);
    assert_eq!(not_now(&bucket, call(200)), Some(at(2 * SECOND)));
    clock.advance(Duration::from_nanos(2 * SECOND - 1));
    assert_eq!(not_now(&bucket, call(200)), Some(at(2 * SECOND)));
    clock.advance(Duration::from_nanos(1));
    assert!(take(&bucket, call(200)));
}

#[test]
fn the_throttle_slows_the_request_refill_too() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 2);
    assert!(take(&bucket, Amount::pair(0, 2)));
    bucket.record_backpressure(2);
    assert_eq!(not_now(&bucket, call(0)), Some(at(60 * SECOND)));
}

#[test]
fn backpressure_adds_half_per_increment_the_caller_weighting_the_signal() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    bucket.record_backpressure(3); // an overload status, weighted 3
    assert_eq!(bucket.throttle(), 1.5);
    bucket.record_backpressure(1);
    assert_eq!(bucket.throttle(), 2.0);
    bucket.record_backpressure(0); // a plain 5xx, weighted 0
    assert_eq!(bucket.throttle(), 2.0);
}

#[test]
fn the_throttle_is_capped_at_nine_a_tenth_of_the_rate() {
    let clock = FakeClock::new();
    let bucket = hundred_left(&clock);
    bucket.record_backpressure(u32::MAX);
    assert_eq!(bucket.throttle(), 9.0);
    for _ in 0..100 {
        bucket.record_429();
    }
    assert_eq!(bucket.throttle(), 9.0);
    assert_eq!(bucket.status_indicator().as_deref(), Some("throttle:10.0x"));
    assert_eq!(not_now(&bucket, call(200)), Some(at(10 * SECOND)));
}

#[test]
fn time_before_a_throttle_change_is_credited_at_the_old_rate() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, call(6_000)));
    clock.advance(Duration::from_secs(1));
    bucket.record_429(); // the first second refilled 100 at full rate
    clock.advance(Duration::from_secs(3)); // then 3 s at 100/1.5 per second = 200
    assert_eq!(bucket.level(), 300);
}

#[test]
fn every_third_success_takes_two_tenths_off() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    bucket.record_backpressure(2);
    bucket.record_success();
    bucket.record_success();
    assert_eq!(bucket.throttle(), 1.0);
    bucket.record_success();
    assert_eq!(bucket.throttle(), 0.8);
    for _ in 0..3 {
        bucket.record_success();
    }
    assert_eq!(bucket.throttle(), 0.6);
    assert_eq!(bucket.status_indicator().as_deref(), Some("throttle:1.6x"));
}

#[test]
fn backpressure_restarts_the_count_of_successes() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    bucket.record_429();
    bucket.record_success();
    bucket.record_success();
    bucket.record_429();
    bucket.record_success();
    assert_eq!(bucket.throttle(), 1.0);
    bucket.record_success();
    bucket.record_success();
    assert_eq!(bucket.throttle(), 0.8);
}

#[test]
fn after_five_minutes_without_backpressure_every_success_takes_half_off() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    bucket.record_backpressure(4);
    clock.advance(Duration::from_nanos(300 * SECOND - 1));
    bucket.record_success(); // still inside the five minutes: counted, not yet a relief
    assert_eq!(bucket.throttle(), 2.0);
    clock.advance(Duration::from_nanos(1));
    bucket.record_success();
    assert_eq!(bucket.throttle(), 1.5);
    bucket.record_success();
    assert_eq!(bucket.throttle(), 1.0);
    bucket.record_429(); // backpressure again: back to counting in threes
    assert_eq!(bucket.throttle(), 1.5);
    bucket.record_success();
    assert_eq!(bucket.throttle(), 1.5);
}

#[test]
fn a_zero_weight_signal_does_not_restart_the_quiet_period() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    bucket.record_429();
    clock.advance(Duration::from_secs(299));
    bucket.record_backpressure(0);
    clock.advance(Duration::from_secs(1));
    bucket.record_success();
    assert_eq!(bucket.throttle(), 0.0);
}

#[test]
fn relief_never_takes_the_throttle_below_zero() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    bucket.record_backpressure(1);
    clock.advance(Duration::from_secs(300));
    bucket.record_success();
    assert_eq!(bucket.throttle(), 0.0);
    assert_eq!(bucket.status_indicator(), None);

    let counting = self::bucket(&clock, 6_000, 60);
    counting.record_backpressure(1);
    for _ in 0..9 {
        counting.record_success();
    }
    assert_eq!(counting.throttle(), 0.0);
}

#[test]
fn successes_on_a_healthy_bucket_are_no_ops() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    let (calls, wake) = counting_wake();
    bucket.on_capacity_change(Some(wake));
    for _ in 0..5 {
        bucket.record_success();
    }
    assert_eq!(bucket.throttle(), 0.0);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Nor do they count towards a later relief.
    bucket.record_429();
    bucket.record_success();
    assert_eq!(bucket.throttle(), 0.5);
}

#[test]
fn a_relaxation_calls_the_wake_slot_and_a_tightening_never_does() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    let (calls, wake) = counting_wake();
    bucket.on_capacity_change(Some(wake));
    bucket.record_429();
    bucket.record_backpressure(5);
    bucket.record_backpressure(u32::MAX);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    bucket.record_success();
    bucket.record_success();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no relief yet, no wake");
    bucket.record_success();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(300));
    bucket.record_success();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// set_config -----------------------------------------------------------------------------------

#[test]
fn set_config_applies_new_caps_in_place_and_keeps_the_throttle() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, call(6_000)));
    bucket.record_429();
    bucket.set_config(config(12_000, 120)).unwrap();
    assert_eq!(bucket.config(), config(12_000, 120));
    assert_eq!(bucket.throttle(), 0.5);
    assert_eq!(
        bucket.level(),
        0,
        "a larger budget does not add tokens by itself"
    );
    // The new rate, stretched by the kept throttle: 12,000/min / 1.5 = 8,000/min.
    clock.advance(Duration::from_secs(60));
    assert_eq!(bucket.level(), 8_000);
}

#[test]
fn set_config_credits_the_time_before_it_at_the_old_rate() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, call(6_000)));
    clock.advance(Duration::from_secs(1));
    bucket.set_config(config(60_000, 60)).unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(bucket.level(), 100 + 1_000);
}

#[test]
fn set_config_clamps_the_level_down_when_caps_shrink() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, Amount::pair(1_000, 10)));
    bucket.set_config(config(4_000, 20)).unwrap();
    assert_eq!((bucket.level(), bucket.requests_available()), (4_000, 20));
    // A budget that shrinks above the level leaves the level alone.
    bucket.set_config(config(4_000, 60)).unwrap();
    bucket.set_config(config(4_500, 30)).unwrap();
    assert_eq!((bucket.level(), bucket.requests_available()), (4_000, 20));
}

#[test]
fn set_config_calls_the_wake_slot_whenever_the_caps_change() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    let (calls, wake) = counting_wake();
    bucket.on_capacity_change(Some(wake));
    bucket.set_config(config(5_000, 60)).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "shrunk");
    bucket.set_config(config(5_000, 61)).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "grew");
    bucket.set_config(config(9_000, 30)).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "one grew, one shrank");
    bucket.set_config(config(9_000, 30)).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "unchanged");
}

#[test]
fn set_config_with_the_same_caps_is_a_silent_no_op() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, call(600)));
    let (calls, wake) = counting_wake();
    bucket.on_capacity_change(Some(wake));
    bucket.set_config(config(6_000, 60)).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!((bucket.level(), bucket.requests_available()), (5_400, 59));
}

#[test]
fn set_config_refuses_a_zero_budget_and_leaves_the_bucket_as_it_was() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    let refused = bucket.set_config(config(6_000, 0)).unwrap_err();
    assert_eq!(refused.field, "requests_per_minute");
    assert_eq!(bucket.config(), config(6_000, 60));
    assert_eq!(bucket.level(), 6_000);
}

// Status ---------------------------------------------------------------------------------------

#[test]
fn status_reads_the_level_from_the_clock_at_that_instant() {
    let clock = FakeClock::new();
    let bucket = bucket(&clock, 6_000, 60);
    assert!(take(&bucket, Amount::pair(6_000, 60)));
    clock.advance(Duration::from_millis(2_500));
    let expected = TokenBucketStatus {
        name: "gpt".into(),
        capacity: 6_000,
        level: 250,
        requests_per_minute: 60,
        requests_available: 2,
        throttle: 0.0,
    };
    assert_eq!(bucket.token_status(), expected);
    assert!(bucket.token_status().has_capacity(250));
    assert!(!bucket.token_status().has_capacity(251));
    let boxed = bucket.status();
    assert_eq!(boxed.category(), Category::custom("token_bucket"));
    assert_eq!(
        boxed.summary(),
        "gpt [token_bucket]: 250 of 6000 tokens, 2 of 60 requests/min available, throttle 0.0"
    );
}

#[test]
fn the_indicator_reads_throttle_and_the_factor_above_zero() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    assert_eq!(bucket.status_indicator(), None);
    assert_eq!(bucket.status().indicator(), None);
    bucket.record_429();
    assert_eq!(bucket.status_indicator().as_deref(), Some("throttle:1.5x"));
    assert_eq!(
        bucket.status().indicator().as_deref(),
        Some("throttle:1.5x")
    );
    assert_eq!(bucket.token_status().throttle, 0.5);
}

#[test]
fn debug_names_the_bucket_and_its_levels() {
    let bucket = bucket(&FakeClock::new(), 6_000, 60);
    let shown = format!("{bucket:?}");
    assert!(
        shown.starts_with("TokenBucket") && shown.contains("\"gpt\"") && shown.contains("6000"),
        "{shown}"
    );
}

#[test]
fn it_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TokenBucket>();
    assert_send_sync::<TokenBucketConfig>();
}

// Concurrency ----------------------------------------------------------------------------------

#[test]
fn eight_threads_racing_for_one_token_each_win_exactly_the_budget() {
    let bucket = Arc::new(bucket(&FakeClock::new(), 1_000, 100_000));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let bucket = bucket.clone();
            thread::spawn(move || {
                let mut wins = 0u64;
                while take(&bucket, call(1)) {
                    wins += 1;
                }
                wins
            })
        })
        .collect();
    let wins: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(wins, 1_000);
    assert_eq!(bucket.level(), 0);
}

#[test]
fn the_debit_is_atomic_against_a_concurrent_cap_change() {
    let bucket = Arc::new(bucket(&FakeClock::new(), 10_000, 100_000));
    let done = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicU64::new(0));
    let takers: Vec<_> = (0..4)
        .map(|_| {
            let (bucket, done, taken) = (bucket.clone(), done.clone(), taken.clone());
            thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    if take(&bucket, call(3)) {
                        taken.fetch_add(3, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for round in 0..2_000u64 {
        let tokens = if round % 2 == 0 { 4_000 } else { 10_000 };
        bucket.set_config(config(tokens, 100_000)).unwrap();
        let level = bucket.level();
        assert!(level <= 10_000, "level {level} above every budget");
    }
    done.store(true, Ordering::SeqCst);
    for taker in takers {
        taker.join().unwrap();
    }
    // The clock stood still: nothing refilled, so takes plus what is left never exceed the start.
    let taken = taken.load(Ordering::SeqCst);
    assert!(
        taken + bucket.level() <= 10_000,
        "took {taken}, {} left",
        bucket.level()
    );
    assert!(bucket.level() <= bucket.config().tokens_per_minute);
}

#[test]
fn four_threads_taking_and_giving_while_the_clock_moves_end_on_exact_totals() {
    // Drained in both dimensions, so that no refill in the run reaches a cap: 5 s at 6,000 tokens
    // and 60,000 requests a minute refill exactly 500 tokens and 5,000 requests, and every one
    // of them is either taken (and not given back) or still in the bucket at the end.
    let clock = FakeClock::new();
    let bucket = Arc::new(bucket(&clock, 6_000, 60_000));
    assert!(take(&bucket, Amount::pair(6_000, 60_000)));
    let done = Arc::new(AtomicBool::new(false));
    // Counts the workers' attempts: the clock moves on only once someone has asked since its
    // last move, so the run interleaves on a loaded machine too.
    let attempts = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..4u64)
        .map(|worker| {
            let (bucket, done, attempts) = (bucket.clone(), done.clone(), attempts.clone());
            thread::spawn(move || {
                let (mut taken, mut given, mut calls) = (0u64, 0u64, 0u64);
                let mut turn = worker;
                while !done.load(Ordering::SeqCst) {
                    turn += 1;
                    let tokens = 1 + turn % 5;
                    let took = take(&bucket, call(tokens));
                    attempts.fetch_add(1, Ordering::SeqCst);
                    if took {
                        taken += tokens;
                        calls += 1;
                        // Every third grant is handed back whole, as a call that never went out.
                        if turn % 3 == 0 {
                            bucket.give(call(tokens));
                            given += tokens;
                            calls -= 1;
                        }
                    }
                }
                (taken, given, calls)
            })
        })
        .collect();
    for _ in 0..5_000 {
        let before = attempts.load(Ordering::SeqCst);
        clock.advance(Duration::from_millis(1));
        while attempts.load(Ordering::SeqCst) == before {
            thread::yield_now();
        }
    }
    done.store(true, Ordering::SeqCst);
    let (mut taken, mut given, mut calls) = (0, 0, 0);
    for worker in workers {
        let (t, g, c) = worker.join().unwrap();
        (taken, given, calls) = (taken + t, given + g, calls + c);
    }
    assert!(
        taken - given <= 500,
        "took {taken}, gave back {given}: overdrawn"
    );
    assert_eq!(
        taken - given + bucket.level(),
        500,
        "took {taken}, gave {given}"
    );
    assert_eq!(calls + bucket.requests_available(), 5_000);
    assert!(taken > 0, "the workers never ran");
}

// Never overdrawn, whatever the sequence -------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Take(u64, u64),
    Give(u64, u64),
    Advance(u64),
    SetConfig(u64, u64),
    Backpressure(u32),
    Success,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..1_500u64, 0..12u64).prop_map(|(t, r)| Op::Take(t, r)),
        2 => (0..1_500u64, 0..12u64).prop_map(|(t, r)| Op::Give(t, r)),
        3 => prop_oneof![0..2 * SECOND, Just(u64::MAX / 2)].prop_map(Op::Advance),
        1 => (1..2_000u64, 1..15u64).prop_map(|(t, r)| Op::SetConfig(t, r)),
        1 => (0..4u32).prop_map(Op::Backpressure),
        1 => Just(Op::Success),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn random_operations_never_take_the_level_above_the_budget_or_below_zero(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let clock = FakeClock::new();
        let bucket = bucket(&clock, 1_000, 10);
        for op in ops {
            let before = (bucket.level(), bucket.requests_available());
            match op {
                Op::Take(tokens, requests) => {
                    let amount = Amount::pair(tokens, requests);
                    let said = bucket.ask(amount, Ask::HEAD.look());
                    let did = bucket.ask(amount, Ask::HEAD);
                    match (said, did) {
                        (Answer::Taken, Answer::Taken) => prop_assert_eq!(
                            (bucket.level(), bucket.requests_available()),
                            (before.0 - tokens, before.1 - requests)
                        ),
                        (Answer::NotNow(_), Answer::NotNow(_)) => {
                            prop_assert!(before.0 < tokens || before.1 < requests);
                            prop_assert_eq!((bucket.level(), bucket.requests_available()), before);
                        }
                        (Answer::Never(_), Answer::Never(_)) => {
                            let budget = bucket.config();
                            prop_assert!(tokens > budget.tokens_per_minute
                                || requests > budget.requests_per_minute);
                        }
                        (said, did) => prop_assert!(false, "a look said {:?} but the take {:?}", said, did),
                    }
                }
                Op::Give(tokens, requests) => bucket.give(Amount::pair(tokens, requests)),
                Op::Advance(nanos) => clock.advance(Duration::from_nanos(nanos)),
                Op::SetConfig(tokens, requests) => {
                    bucket.set_config(config(tokens, requests)).unwrap();
                }
                Op::Backpressure(n) => bucket.record_backpressure(n),
                Op::Success => bucket.record_success(),
            }
            let budget = bucket.config();
            let status = bucket.token_status();
            prop_assert!(status.level <= budget.tokens_per_minute, "{:?}", status);
            prop_assert!(status.requests_available <= budget.requests_per_minute, "{:?}", status);
            prop_assert!((0.0..=9.0).contains(&status.throttle), "{:?}", status);
        }
    }
}

// Inside a monitor -----------------------------------------------------------------------------

#[test]
fn a_waiter_short_on_tokens_is_granted_exactly_at_the_computed_deadline() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let http = Arc::new(CountingGate::http(2, clock.shared()).unwrap());
    let tokens = Arc::new(bucket(&clock, 6_000, 60));
    let demand = |n: u64| {
        Demand::new()
            .with(http.clone(), Amount::ONE)
            .with(tokens.clone(), call(n))
    };

    let first = monitor
        .admit_blocking(demand(5_900), &JobContext::new("first"), None)
        .unwrap();
    assert_eq!((http.in_use(), tokens.level()), (1, 100));

    // 200 tokens with 100 left at 6,000 a minute: one second.
    let mut second = Box::pin(monitor.admit(demand(200), &JobContext::new("second"), None));
    assert!(poll_once(&mut second).is_none());
    assert_eq!(monitor.pass_now(), at(SECOND));

    clock.advance(Duration::from_nanos(SECOND - 1));
    monitor.pass_now();
    assert!(poll_once(&mut second).is_none(), "one nanosecond early");
    assert_eq!(monitor.queue_size(), 1);

    clock.advance(Duration::from_nanos(1));
    monitor.pass_now();
    let granted = poll_once(&mut second)
        .expect("granted at the deadline")
        .unwrap();
    assert_eq!((http.in_use(), tokens.level()), (2, 0));

    drop(first);
    drop(granted);
    // The permits come back at release; the tokens stay spent (a time account).
    assert_eq!((http.in_use(), tokens.level()), (0, 0));
}

#[test]
fn a_budget_lowered_under_a_parked_demand_refuses_it_at_once_without_the_clock_moving() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    let tokens = Arc::new(bucket(&clock, 6_000, 60));
    assert!(take(&tokens, call(6_000)));
    // 5,000 tokens with none left at 6,000 a minute: a deadline 50 s away, which the fake clock
    // never reaches in this test.
    let mut parked = Box::pin(monitor.admit(
        Demand::new().with(tokens.clone(), call(5_000)),
        &JobContext::new("parked"),
        None,
    ));
    assert!(poll_once(&mut parked).is_none());

    // A marker behind it, disjoint from it, that the evaluator's first pass grants: once the
    // marker holds its grant, that pass has asked the bucket with the old budget and the
    // evaluator sleeps until rung (the fake clock gives it no real-time deadline).
    let marker_gate = Arc::new(CountingGate::new("marker", 1, clock.shared()).unwrap());
    assert!(matches!(
        marker_gate.ask(Amount::ONE, Ask::HEAD),
        Answer::Taken
    ));
    let mut marker = Box::pin(monitor.admit(
        Demand::new().with(marker_gate.clone(), Amount::ONE),
        &JobContext::new("marker"),
        None,
    ));
    assert!(poll_once(&mut marker).is_none());
    marker_gate.give(Amount::ONE);
    monitor.start().unwrap();
    let mut marker_grant = None;
    wait_until("the first pass grants the marker", || {
        marker_grant = poll_once(&mut marker);
        marker_grant.is_some()
    });
    assert!(matches!(marker_grant, Some(Ok(_))));
    assert!(
        poll_once(&mut parked).is_none(),
        "still waiting on the old budget"
    );

    // The budget falls under the parked amount: only the bucket's wake slot can make the
    // sleeping evaluator ask again, and the bucket then says "never".
    tokens.set_config(config(4_000, 60)).unwrap();
    let mut outcome = None;
    wait_until("the parked demand is refused", || {
        outcome = poll_once(&mut parked);
        outcome.is_some()
    });
    let refused = match outcome {
        Some(Err(refused)) => refused,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(matches!(&refused, AdmitError::Refused { account, .. } if account == "gpt"));
    assert_eq!(
        refused.to_string(),
        "account `gpt` refused the demand: `gpt` allows 4000 tokens and 60 requests per minute; \
         a demand of 5000 tokens and 1 requests can never fit: split it into smaller calls or \
         use a model with a larger budget"
    );
    assert_eq!(clock.now(), Instant::ZERO);
    assert_eq!(monitor.queue_size(), 0);
    drop(marker_grant);
    monitor.stop();
}

#[test]
fn a_throttled_waiter_in_a_monitor_waits_twice_as_long_after_two_429s() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let tokens = Arc::new(hundred_left(&clock));
    tokens.record_429();
    tokens.record_429();
    let mut waiter = Box::pin(monitor.admit(
        Demand::new().with(tokens.clone(), call(200)),
        &JobContext::new("throttled"),
        None,
    ));
    assert!(poll_once(&mut waiter).is_none());
    assert_eq!(monitor.pass_now(), at(2 * SECOND));
    clock.advance(Duration::from_secs(2));
    monitor.pass_now();
    assert!(poll_once(&mut waiter).expect("granted").is_ok());
    assert_eq!(tokens.level(), 0);
}
