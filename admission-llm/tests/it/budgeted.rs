//! The spend cap in the call path: `Registry::demand_within` prices a call against its
//! workflow's cap before it can wait, reserves the price while it is in flight, and settles it
//! with the answer's usage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use admission_core::{JobContext, Monitor};
use admission_llm::model_spec::ModelSpec;
use admission_llm::provider::{ProviderError, Registry};
use admission_llm::spend::{CostLedger, Money};
use admission_llm::{BudgetedCall, CallError, CallReservation};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use proptest::prelude::*;

/// 1,000 in at 3 per million + 1,000 out at 15 per million.
const ONE_CALL: u64 = 3_000 + 15_000;

fn registry(clock: &FakeClock) -> Registry {
    let registry = Registry::new(clock.shared())
        .with_http_connections(8)
        .unwrap();
    registry
        .register(
            ModelSpec::new("sonnet", "claude-sonnet-4-5", 60_000)
                .with_requests_per_minute(30)
                .with_max_concurrent(1)
                .with_prices(3_000_000, 15_000_000),
        )
        .unwrap();
    registry
}

fn micros(n: u64) -> Money {
    Money::from_micros(n)
}

fn books(ledger: &CostLedger) -> (Money, Money, usize) {
    let status = ledger.status();
    (status.spent, status.committed, status.in_flight)
}

fn manual_monitor(clock: &FakeClock) -> Monitor {
    Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build()
}

#[test]
fn an_unaffordable_call_is_refused_with_the_numbers_before_it_waits() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    let monitor = manual_monitor(&clock);
    let ledger = CostLedger::new("nightly-review", micros(50_000));

    // One call in flight holds the model gate's only slot and 18,000 of the cap.
    let first = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap();
    assert_eq!(first.call.price, micros(ONE_CALL));
    let grant = poll_once(&mut Box::pin(monitor.admit(
        first.call.demand,
        &JobContext::new("a"),
        None,
    )))
    .unwrap()
    .unwrap();
    let bucket = registry.bucket("sonnet").unwrap();
    assert_eq!(bucket.level(), 58_000);

    // 2,000 in + 2,000 out = 6,000 + 30,000 = 36,000: 0 + 18,000 + 36,000 > 50,000.
    let error = registry
        .demand_within("sonnet", 2_000, 2_000, &*ledger)
        .unwrap_err();
    let CallError::OverBudget(refused) = &error else {
        panic!("expected a spend refusal, got {error}");
    };
    assert_eq!(
        (
            refused.workflow.as_str(),
            refused.requested,
            refused.spent,
            refused.committed,
            refused.in_flight,
            refused.cap,
        ),
        (
            "nightly-review",
            micros(36_000),
            Money::ZERO,
            micros(18_000),
            1,
            micros(50_000)
        )
    );
    assert_eq!(error.over_budget(), Some(refused));
    let expected = refused.clone();
    assert_eq!(expected.excess(), micros(4_000));
    assert_eq!(
        error.to_string(),
        "spend cap of workflow `nightly-review` refused a reservation of 0.036000: spent 0.000000 + \
         in flight 0.018000 (1 reservation) + this 0.036000 would pass the cap 0.050000"
    );
    // It never reached the monitor: nobody in line, no connection, no tokens, nothing reserved.
    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(registry.http().in_use(), 1);
    assert_eq!(bucket.level(), 58_000);
    assert_eq!(books(&ledger), (Money::ZERO, micros(18_000), 1));

    // An affordable call in the same state is priced, reserved, and then waits for the gate.
    let second = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap();
    let mut waiting = Box::pin(monitor.admit(second.call.demand, &JobContext::new("b"), None));
    assert!(poll_once(&mut waiting).is_none());
    assert_eq!(monitor.queue_size(), 1);
    assert_eq!(books(&ledger), (Money::ZERO, micros(36_000), 2));

    drop((waiting, grant, first.reservation, second.reservation));
    assert_eq!(books(&ledger), (Money::ZERO, Money::ZERO, 0));
}

#[test]
fn an_unknown_model_is_a_provider_error_and_reserves_nothing() {
    let registry = registry(&FakeClock::new());
    let ledger = CostLedger::new("w", micros(1));
    let error = registry
        .demand_within("opus", 1_000_000, 1_000_000, &*ledger)
        .unwrap_err();
    assert_eq!(
        error,
        CallError::Provider(ProviderError::UnknownModel {
            model: "opus".into(),
            known: vec!["sonnet".into()],
        })
    );
    assert_eq!(error.over_budget(), None);
    assert_eq!(books(&ledger), (Money::ZERO, Money::ZERO, 0));
}

#[test]
fn a_reservation_counts_against_the_cap_while_its_call_is_in_flight() {
    let registry = registry(&FakeClock::new());
    let ledger = CostLedger::new("w", micros(40_000));
    let first = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap();
    assert_eq!(first.reservation.amount(), micros(18_000));
    assert_eq!(first.reservation.model(), "sonnet");
    let second = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap();
    assert_eq!(books(&ledger), (Money::ZERO, micros(36_000), 2));
    assert_eq!(ledger.status().remaining(), micros(4_000));

    // 4,000 left: a third 18,000 is refused with both siblings' reservations counted ...
    let refused = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap_err();
    let refused = refused.over_budget().unwrap();
    assert_eq!(
        (refused.committed, refused.in_flight, refused.requested),
        (micros(36_000), 2, micros(18_000))
    );
    // ... while a call priced exactly at what is left fits (1,000 in + 66 out = 3,000 + 990,
    // whole micros).
    let small = registry
        .demand_within("sonnet", 1_000, 66, &*ledger)
        .unwrap();
    assert_eq!(small.reservation.amount(), micros(3_990));
    assert_eq!(books(&ledger), (Money::ZERO, micros(39_990), 3));
    drop((first, second, small));
    assert_eq!(books(&ledger), (Money::ZERO, Money::ZERO, 0));
}

#[test]
fn settlement_spends_what_the_answer_used_and_returns_the_difference() {
    let registry = registry(&FakeClock::new());
    let ledger = CostLedger::new("w", micros(40_000));
    let call = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap();
    drop(call.call.demand); // admitted and sent, in a real caller

    // The answer: 1,000 in, 300 out = 3,000 + 4,500.
    let settlement = call.reservation.settle(1_000, 300);
    assert_eq!(
        (settlement.reserved, settlement.actual),
        (micros(18_000), micros(7_500))
    );
    assert_eq!(
        (settlement.under(), settlement.over()),
        (micros(10_500), Money::ZERO)
    );
    assert_eq!(books(&ledger), (micros(7_500), Money::ZERO, 0));
    assert_eq!(ledger.settled(), 1);

    // The difference is free again: 32,500 left, so 1,000 in + 2,000 out (33,000) is refused
    // and 1,000 in + 1,900 out (31,500) fits.
    let refused = registry
        .demand_within("sonnet", 1_000, 2_000, &*ledger)
        .unwrap_err();
    assert_eq!(refused.over_budget().unwrap().spent, micros(7_500));
    let fits = registry
        .demand_within("sonnet", 1_000, 1_900, &*ledger)
        .unwrap();
    assert_eq!(fits.reservation.amount(), micros(31_500));

    // An answer past what was declared is recorded exactly, over the cap if it must be.
    let settlement = fits.settle(1_000, 2_500);
    assert_eq!(settlement.over(), micros(9_000)); // 40,500 - 31,500
    assert_eq!(books(&ledger), (micros(7_500 + 40_500), Money::ZERO, 0));
    assert_eq!(ledger.status().remaining(), Money::ZERO);
}

#[test]
fn a_call_never_made_releases_its_reservation_and_spends_nothing() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    let monitor = manual_monitor(&clock);
    let ledger = CostLedger::new("w", micros(40_000));

    let holder = registry.demand_for("sonnet", 1_000, 1_000).unwrap();
    let held = poll_once(&mut Box::pin(monitor.admit(
        holder.demand,
        &JobContext::new("a"),
        None,
    )))
    .unwrap()
    .unwrap();

    // Priced and waiting behind the gate; then the waiter is cancelled (its future dropped).
    let call = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap();
    let BudgetedCall { call, reservation } = call;
    let mut waiting = Box::pin(monitor.admit(
        call.demand,
        &JobContext::new("b"),
        Some(Duration::from_secs(5)),
    ));
    assert!(poll_once(&mut waiting).is_none());
    assert_eq!(books(&ledger), (Money::ZERO, micros(18_000), 1));
    drop(waiting);
    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(
        books(&ledger),
        (Money::ZERO, micros(18_000), 1),
        "held until released"
    );
    drop(reservation);
    assert_eq!(books(&ledger), (Money::ZERO, Money::ZERO, 0));
    assert_eq!(ledger.settled(), 0);

    // Dropping the whole call unsettled, the same.
    let whole = registry
        .demand_within("sonnet", 1_000, 1_000, &*ledger)
        .unwrap();
    assert_eq!(books(&ledger), (Money::ZERO, micros(18_000), 1));
    drop(whole);
    assert_eq!(books(&ledger), (Money::ZERO, Money::ZERO, 0));
    drop(held);
}

#[test]
fn concurrent_calls_never_commit_past_the_cap() {
    const THREADS: usize = 8;
    const ATTEMPTS: usize = 10;
    const AFFORDABLE: u64 = 25;
    let registry = Arc::new(registry(&FakeClock::new()));
    let ledger = CostLedger::new("fan-out", micros(AFFORDABLE * ONE_CALL));
    let barrier = Arc::new(Barrier::new(THREADS));
    let (granted, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (registry, ledger, barrier) = (registry.clone(), ledger.clone(), barrier.clone());
            let (granted, refused) = (granted.clone(), refused.clone());
            thread::spawn(move || {
                barrier.wait();
                for attempt in 0..ATTEMPTS {
                    match registry.demand_within("sonnet", 1_000, 1_000, &*ledger) {
                        Ok(call) => {
                            granted.fetch_add(1, Ordering::Relaxed);
                            let status = ledger.status();
                            assert!(status.spent.saturating_add(status.committed) <= status.cap);
                            // Half settle at the full price, half at the prompt alone
                            // (the rest then frees for later callers).
                            let output = if attempt % 2 == 0 { 1_000 } else { 0 };
                            let _ = call.settle(1_000, output);
                        }
                        Err(CallError::OverBudget(refusal)) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            assert!(refusal.excess() > Money::ZERO);
                        }
                        Err(other) => panic!("unexpected {other}"),
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let (granted, refused) = (
        granted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    assert_eq!(granted + refused, (THREADS * ATTEMPTS) as u64);
    let status = ledger.status();
    assert_eq!((status.committed, status.in_flight), (Money::ZERO, 0));
    assert_eq!(ledger.settled(), granted);
    assert!(status.spent <= status.cap, "{}", status.summary());
    // Nothing fits once less than one call's price is left.
    assert!(
        status.remaining() < micros(ONE_CALL),
        "{}",
        status.summary()
    );
}

#[test]
fn concurrent_full_price_calls_spend_the_cap_exactly() {
    const THREADS: usize = 8;
    const ATTEMPTS: usize = 10;
    let registry = Arc::new(registry(&FakeClock::new()));
    let ledger = CostLedger::new("fan-out", micros(25 * ONE_CALL));
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (registry, ledger, barrier) = (registry.clone(), ledger.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut granted = 0_u64;
                for _ in 0..ATTEMPTS {
                    if let Ok(call) = registry.demand_within("sonnet", 1_000, 1_000, &*ledger) {
                        granted += 1;
                        thread::yield_now();
                        let _ = call.settle(1_000, 1_000);
                    }
                }
                granted
            })
        })
        .collect();
    let granted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    // Every granted call spends its whole price, so exactly 25 fit and 55 are refused.
    assert_eq!(granted, 25);
    assert_eq!(books(&ledger), (micros(25 * ONE_CALL), Money::ZERO, 0));
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn the_call_path_types_are_send_and_sync() {
    assert_send_sync::<BudgetedCall>();
    assert_send_sync::<CallReservation>();
    assert_send_sync::<CallError>();
}

/// One step of a workflow in the property: a call of `input` in and `max_output` out, answered
/// with `output` out (at most the declared most), settled or dropped.
#[derive(Clone, Debug)]
struct Step {
    input: u64,
    max_output: u64,
    output_share: u8,
    settle: bool,
    hold: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0_u64..3_000,
        0_u64..3_000,
        0_u8..=100,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(input, max_output, output_share, settle, hold)| Step {
            input,
            max_output,
            output_share,
            settle,
            hold,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The ledger agrees with a hand-kept model of the books after every step, and a workflow
    /// whose answers stay within what they declared never spends past its cap.
    #[test]
    fn the_books_match_a_model_and_never_pass_the_cap(
        cap in 0_u64..200_000,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let registry = registry(&FakeClock::new());
        let ledger = CostLedger::new("w", micros(cap));
        let (mut spent, mut committed) = (0_u64, 0_u64);
        let mut held: Vec<(CallReservation, u64, u64, bool)> = Vec::new();
        for s in steps {
            // 3 and 15 micros per token: whole micros, no rounding.
            let price = s.input * 3 + s.max_output * 15;
            let fits = price == 0 || spent + committed + price <= cap;
            match registry.demand_within("sonnet", s.input, s.max_output, &*ledger) {
                Ok(call) => {
                    prop_assert!(fits);
                    prop_assert_eq!(call.reservation.amount(), micros(price));
                    committed += price;
                    let output = s.max_output * u64::from(s.output_share) / 100;
                    held.push((call.reservation, s.input, output, s.settle));
                }
                Err(CallError::OverBudget(refused)) => {
                    prop_assert!(!fits);
                    prop_assert_eq!(
                        (refused.spent, refused.committed, refused.requested, refused.cap),
                        (micros(spent), micros(committed), micros(price), micros(cap))
                    );
                }
                Err(other) => return Err(TestCaseError::fail(other.to_string())),
            }
            if !s.hold && let Some((reservation, input, output, settle)) = held.pop() {
                committed -= reservation.amount().micros();
                if settle {
                    let actual = input * 3 + output * 15;
                    let settlement = reservation.settle(input, output);
                    prop_assert_eq!(settlement.actual, micros(actual));
                    spent += actual;
                } else {
                    drop(reservation);
                }
            }
            prop_assert_eq!(books(&ledger), (micros(spent), micros(committed), held.len()));
            prop_assert!(spent + committed <= cap);
        }
        drop(held);
        prop_assert_eq!(books(&ledger), (micros(spent), Money::ZERO, 0));
    }
}
