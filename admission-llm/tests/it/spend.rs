//! The spend cap: money arithmetic, the reserve/refuse rule, settlement, and a fan-out that never
//! commits past the cap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use admission_llm::spend::{
    CostLedger, LedgerStatus, Money, Reservation, Settlement, SpendGate, SpendRefused,
};
use proptest::prelude::*;

fn micros(n: u64) -> Money {
    Money::from_micros(n)
}

// ---- Money ----

#[test]
fn money_displays_units_a_dot_and_six_digits_of_micros() {
    assert_eq!(micros(1_234_567).to_string(), "1.234567");
    assert_eq!(Money::ZERO.to_string(), "0.000000");
    assert_eq!(micros(1).to_string(), "0.000001");
    assert_eq!(Money::from_units(42).to_string(), "42.000000");
    assert_eq!(
        micros(u64::MAX).to_string(),
        "18446744073709.551615",
        "the largest amount displays without overflow"
    );
}

#[test]
fn money_converts_between_units_and_micros() {
    assert_eq!(Money::from_units(3).micros(), 3_000_000);
    assert_eq!(micros(7).micros(), 7);
    assert_eq!(Money::default(), Money::ZERO);
    assert_eq!(Money::from_units(u64::MAX), micros(u64::MAX));
}

#[test]
fn money_arithmetic_saturates_instead_of_panicking() {
    assert_eq!(micros(5).saturating_add(micros(7)), micros(12));
    assert_eq!(micros(5) + micros(7), micros(12));
    assert_eq!(micros(7).saturating_sub(micros(5)), micros(2));
    assert_eq!(micros(5).saturating_sub(micros(7)), Money::ZERO);
    assert_eq!(micros(u64::MAX) + micros(1), micros(u64::MAX));
    assert_eq!(
        micros(u64::MAX).saturating_add(micros(u64::MAX)),
        micros(u64::MAX)
    );
}

#[test]
fn money_sums_exactly_and_saturates_at_the_top() {
    let charges = [micros(1), micros(20), micros(300)];
    assert_eq!(charges.iter().sum::<Money>(), micros(321));
    assert_eq!(charges.into_iter().sum::<Money>(), micros(321));
    assert_eq!(
        [micros(u64::MAX), micros(1)].into_iter().sum::<Money>(),
        micros(u64::MAX)
    );
    assert_eq!(std::iter::empty::<Money>().sum::<Money>(), Money::ZERO);
}

#[test]
fn money_orders_by_micros() {
    assert!(micros(1) < micros(2));
    assert!(Money::from_units(1) > micros(999_999));
}

#[test]
fn per_million_rounds_up_to_a_whole_micro() {
    assert_eq!(Money::per_million(1, 3), micros(1));
    assert_eq!(Money::per_million(1_000_000, 3_000_000), micros(3_000_000));
    assert_eq!(Money::per_million(1_000_000, 3), micros(3));
    assert_eq!(Money::per_million(1_000_001, 3), micros(4));
    assert_eq!(Money::per_million(333_333, 3), micros(1));
    assert_eq!(Money::per_million(333_334, 3), micros(2));
    assert_eq!(Money::per_million(0, 3_000_000), Money::ZERO);
    assert_eq!(Money::per_million(1_000, 0), Money::ZERO);
}

#[test]
fn per_million_saturates_at_the_largest_amount() {
    assert_eq!(Money::per_million(u64::MAX, u64::MAX), micros(u64::MAX));
    assert_eq!(
        Money::per_million(u64::MAX, 1_000_000),
        micros(u64::MAX),
        "exactly representable at one micro per token"
    );
    assert_eq!(Money::per_million(u64::MAX, 1_000_001), micros(u64::MAX));
    assert_eq!(
        Money::per_million(u64::MAX, 1),
        micros(18_446_744_073_710),
        "u64::MAX / 1e6 rounded up"
    );
}

#[test]
fn money_serializes_as_a_plain_integer_of_micros() {
    assert_eq!(
        serde_json::to_string(&micros(1_234_567)).unwrap(),
        "1234567"
    );
    let back: Money = serde_json::from_str("1234567").unwrap();
    assert_eq!(back, micros(1_234_567));
}

// ---- Reserve and refuse ----

#[test]
fn a_reservation_within_the_cap_is_granted_and_committed() {
    let ledger = CostLedger::new("w", micros(1_000));
    let held = ledger.reserve(micros(400)).expect("400 of 1000 fits");
    assert_eq!(held.amount(), micros(400));
    assert_eq!(ledger.committed(), micros(400));
    assert_eq!(ledger.spent(), Money::ZERO);
    assert_eq!(ledger.in_flight(), 1);
    assert_eq!(ledger.cap(), micros(1_000));
    assert_eq!(ledger.workflow(), "w");
    drop(held);
}

#[test]
fn a_reservation_reaching_the_cap_exactly_is_granted() {
    let ledger = CostLedger::new("w", micros(1_000));
    let first = ledger.reserve(micros(600)).expect("600 fits");
    first.settle(micros(600));
    let second = ledger.reserve(micros(300)).expect("600 + 300 fits");
    let last = ledger
        .reserve(micros(100))
        .expect("600 spent + 300 in flight + 100 reaches the cap exactly");
    assert_eq!(ledger.spent() + ledger.committed(), ledger.cap());
    assert_eq!(ledger.in_flight(), 2);
    drop((second, last));
}

#[test]
fn a_reservation_past_the_cap_is_refused_with_every_number() {
    let ledger = CostLedger::new("w", Money::from_units(1));
    ledger
        .reserve(micros(500_000))
        .expect("half the cap fits")
        .settle(micros(500_000));
    let held: Vec<Reservation> = [100_000, 100_000, 200_000]
        .into_iter()
        .map(|m| ledger.reserve(micros(m)).expect("fits"))
        .collect();

    let refused = ledger.reserve(micros(300_000)).unwrap_err();

    assert_eq!(refused.workflow, "w");
    assert_eq!(refused.cap, micros(1_000_000));
    assert_eq!(refused.spent, micros(500_000));
    assert_eq!(refused.committed, micros(400_000));
    assert_eq!(refused.in_flight, 3);
    assert_eq!(refused.requested, micros(300_000));
    assert_eq!(refused.excess(), micros(200_000));
    assert_eq!(
        refused.to_string(),
        "spend cap of workflow `w` refused a reservation of 0.300000: spent 0.500000 + in flight \
         0.400000 (3 reservations) + this 0.300000 would pass the cap 1.000000"
    );
    drop(held);
}

#[test]
fn a_refusal_with_one_reservation_in_flight_says_so_in_the_singular() {
    let ledger = CostLedger::new("etl", micros(10));
    let held = ledger.reserve(micros(6)).expect("fits");
    let refused = ledger.reserve(micros(5)).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "spend cap of workflow `etl` refused a reservation of 0.000005: spent 0.000000 + in flight \
         0.000006 (1 reservation) + this 0.000005 would pass the cap 0.000010"
    );
    drop(held);
}

#[test]
fn a_refusal_serializes_with_every_number() {
    let ledger = CostLedger::new("w", micros(10));
    let refused = ledger.reserve(micros(11)).unwrap_err();
    assert_eq!(
        serde_json::to_value(&refused).unwrap(),
        serde_json::json!({
            "workflow": "w", "cap": 10, "spent": 0, "committed": 0, "in_flight": 0, "requested": 11
        })
    );
}

#[test]
fn a_refused_job_costs_nothing() {
    let ledger = CostLedger::new("w", micros(100));
    let held = ledger.reserve(micros(60)).expect("fits");
    ledger.reserve(micros(30)).expect("fits").settle(micros(30));
    let before = ledger.status();

    let refused = ledger.reserve(micros(11)).unwrap_err();

    assert_eq!(refused.requested, micros(11));
    assert_eq!(ledger.status(), before);
    assert_eq!(ledger.spent(), micros(30));
    assert_eq!(ledger.committed(), micros(60));
    assert_eq!(ledger.in_flight(), 1);
    assert_eq!(ledger.settled(), 1);
    assert!(
        ledger.reserve(micros(10)).is_ok(),
        "what the refusal asked for was never taken"
    );
    drop(held);
}

#[test]
fn a_zero_cap_refuses_every_non_zero_reservation() {
    let ledger = CostLedger::new("free-tier", Money::ZERO);
    let refused = ledger.reserve(micros(1)).unwrap_err();
    assert_eq!(refused.cap, Money::ZERO);
    assert_eq!(refused.excess(), micros(1));
    let zero = ledger
        .reserve(Money::ZERO)
        .expect("a zero reservation is always granted");
    assert_eq!(ledger.in_flight(), 1);
    assert_eq!(
        zero.settle(Money::ZERO),
        Settlement {
            reserved: Money::ZERO,
            actual: Money::ZERO
        }
    );
    assert_eq!(ledger.status().spent, Money::ZERO);
}

#[test]
fn a_zero_reservation_is_granted_even_past_the_cap() {
    let ledger = CostLedger::new("w", micros(10));
    ledger.reserve(micros(10)).expect("fits").settle(micros(25));
    assert!(ledger.reserve(micros(1)).is_err());
    let zero = ledger
        .reserve(Money::ZERO)
        .expect("zero adds nothing to the books");
    assert_eq!(ledger.committed(), Money::ZERO);
    assert_eq!(ledger.in_flight(), 1);
    drop(zero);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn a_reservation_that_would_overflow_the_books_is_refused() {
    let ledger = CostLedger::new("w", micros(u64::MAX));
    let all = ledger
        .reserve(micros(u64::MAX))
        .expect("the whole cap fits");
    let refused = ledger.reserve(micros(1)).unwrap_err();
    assert_eq!(refused.committed, micros(u64::MAX));
    assert_eq!(refused.excess(), micros(1));
    assert_eq!(ledger.committed(), micros(u64::MAX));
    drop(all);
    assert_eq!(ledger.committed(), Money::ZERO);
}

// ---- Settle and drop ----

#[test]
fn settling_less_than_reserved_records_the_actual_and_frees_the_rest() {
    let ledger = CostLedger::new("w", micros(1_000));
    let held = ledger.reserve(micros(400)).expect("fits");
    let settlement = held.settle(micros(250));
    assert_eq!(
        settlement,
        Settlement {
            reserved: micros(400),
            actual: micros(250)
        }
    );
    assert_eq!(settlement.under(), micros(150));
    assert_eq!(settlement.over(), Money::ZERO);
    assert_eq!(ledger.spent(), micros(250));
    assert_eq!(ledger.committed(), Money::ZERO);
    assert_eq!(ledger.in_flight(), 0);
    assert_eq!(ledger.settled(), 1);
    assert!(
        ledger.reserve(micros(750)).is_ok(),
        "the unspent 150 is free again"
    );
}

#[test]
fn settling_more_than_reserved_records_the_overshoot_exactly() {
    let ledger = CostLedger::new("w", micros(1_000));
    let other = ledger.reserve(micros(100)).expect("fits");
    let held = ledger.reserve(micros(400)).expect("fits");
    let settlement = held.settle(micros(470));
    assert_eq!(settlement.over(), micros(70));
    assert_eq!(settlement.under(), Money::ZERO);
    assert_eq!(ledger.spent(), micros(470));
    assert_eq!(ledger.committed(), micros(100));
    assert_eq!(ledger.in_flight(), 1);
    drop(other);
}

#[test]
fn settling_exactly_the_reservation_records_it() {
    let ledger = CostLedger::new("w", micros(1_000));
    let settlement = ledger
        .reserve(micros(400))
        .expect("fits")
        .settle(micros(400));
    assert_eq!(settlement.over(), Money::ZERO);
    assert_eq!(settlement.under(), Money::ZERO);
    assert_eq!(ledger.spent(), micros(400));
    assert_eq!(ledger.committed(), Money::ZERO);
}

#[test]
fn a_settlement_past_the_cap_is_recorded_and_never_refused() {
    let ledger = CostLedger::new("w", micros(100));
    let a = ledger.reserve(micros(60)).expect("fits");
    let b = ledger.reserve(micros(40)).expect("reaches the cap");
    a.settle(micros(90));
    assert_eq!(
        ledger.spent() + ledger.committed(),
        micros(130),
        "the overshoot is on the books"
    );
    b.settle(micros(55));
    assert_eq!(ledger.spent(), micros(145));
    assert_eq!(ledger.committed(), Money::ZERO);
    assert_eq!(ledger.settled(), 2);
    let refused = ledger.reserve(micros(1)).unwrap_err();
    assert_eq!(refused.spent, micros(145));
    assert_eq!(refused.excess(), micros(46));
}

#[test]
fn dropping_a_reservation_unsettled_frees_it_and_spends_nothing() {
    let ledger = CostLedger::new("w", micros(100));
    let held = ledger.reserve(micros(100)).expect("fits");
    assert!(ledger.reserve(micros(1)).is_err());
    drop(held);
    assert_eq!(ledger.committed(), Money::ZERO);
    assert_eq!(ledger.spent(), Money::ZERO);
    assert_eq!(ledger.in_flight(), 0);
    assert_eq!(ledger.settled(), 0);
    assert!(ledger.reserve(micros(100)).is_ok());
}

#[test]
fn a_reservation_outlives_every_handle_to_its_ledger() {
    let ledger = CostLedger::new("w", micros(100));
    let gate: Arc<dyn SpendGate> = ledger.clone();
    let held = gate.reserve(micros(30)).expect("fits");
    let dropped = gate.reserve(micros(30)).expect("fits");
    let status = ledger.status();
    drop((ledger, gate));
    assert_eq!(held.settle(micros(20)).actual, micros(20));
    drop(dropped);
    assert_eq!(status.in_flight, 2);
}

#[test]
fn a_reservation_debugs_with_its_workflow_and_amount() {
    let ledger = CostLedger::new("w", micros(100));
    let held = ledger.reserve(micros(30)).expect("fits");
    assert_eq!(
        format!("{held:?}"),
        "Reservation { workflow: Some(\"w\"), amount: Money(30) }"
    );
    assert_eq!(
        format!("{ledger:?}"),
        "CostLedger { workflow: \"w\", cap: Money(100), spent: Money(0), committed: Money(30), \
         in_flight: 1 }"
    );
    drop(held);
}

// ---- Status ----

#[test]
fn status_reads_every_number_and_summarizes_them_on_one_line() {
    let ledger = CostLedger::new("nightly", Money::from_units(1));
    ledger
        .reserve(micros(500_000))
        .expect("fits")
        .settle(micros(500_000));
    let held: Vec<Reservation> = (0..3)
        .map(|_| ledger.reserve(micros(100_000)).expect("fits"))
        .collect();
    let status = ledger.status();
    assert_eq!(
        status,
        LedgerStatus {
            workflow: "nightly".to_owned(),
            cap: micros(1_000_000),
            spent: micros(500_000),
            committed: micros(300_000),
            in_flight: 3,
        }
    );
    assert_eq!(status.remaining(), micros(200_000));
    assert_eq!(
        status.summary(),
        "workflow `nightly`: spent 0.500000 + in flight 0.300000 (3 reservations) of cap \
         1.000000, 0.200000 left"
    );
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        serde_json::json!({
            "workflow": "nightly", "cap": 1_000_000, "spent": 500_000, "committed": 300_000,
            "in_flight": 3
        })
    );
    drop(held);
}

#[test]
fn status_has_nothing_left_once_the_cap_is_crossed() {
    let ledger = CostLedger::new("w", micros(10));
    ledger.reserve(micros(10)).expect("fits").settle(micros(12));
    assert_eq!(ledger.status().remaining(), Money::ZERO);
}

// ---- Types ----

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn ledger_reservation_and_refusal_are_send_and_sync() {
    assert_send_sync::<CostLedger>();
    assert_send_sync::<Arc<CostLedger>>();
    assert_send_sync::<Reservation>();
    assert_send_sync::<SpendRefused>();
    assert_send_sync::<Arc<dyn SpendGate>>();
}

#[test]
fn spend_gate_is_usable_as_a_trait_object() {
    let gate: Arc<dyn SpendGate> = CostLedger::new("w", micros(10));
    let held = gate.reserve(micros(4)).expect("fits");
    assert_eq!(gate.cap(), micros(10));
    assert_eq!(gate.committed(), micros(4));
    assert_eq!(gate.spent(), Money::ZERO);
    held.settle(micros(3));
    assert_eq!(gate.spent(), micros(3));
}

// ---- The fan-out ----

#[test]
fn a_fan_out_of_a_thousand_reservations_never_commits_past_the_cap() {
    const JOBS: usize = 1_000;
    const PRICE: u64 = 7;
    const CAP: u64 = 3_500;
    let ledger = CostLedger::new("fan-out", micros(CAP));
    let start = Barrier::new(JOBS + 1);
    let done = AtomicBool::new(false);

    let (outcomes, samples) = thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            start.wait();
            let mut samples = 0u64;
            loop {
                // Read `done` first so the last sample is taken after every worker finished.
                let finished = done.load(Ordering::Acquire);
                let status = ledger.status();
                assert!(
                    status.spent + status.committed <= status.cap,
                    "committed past the cap: {}",
                    status.summary()
                );
                samples += 1;
                if finished {
                    return samples;
                }
            }
        });
        let workers: Vec<_> = (0..JOBS)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    let outcome = ledger.reserve(micros(PRICE));
                    if outcome.is_ok() {
                        let status = ledger.status();
                        assert!(
                            status.committed <= status.cap,
                            "granted past the cap: {}",
                            status.summary()
                        );
                    }
                    outcome
                })
            })
            .collect();
        let outcomes: Vec<Result<Reservation, SpendRefused>> = workers
            .into_iter()
            .map(|worker| worker.join().expect("a worker panicked"))
            .collect();
        done.store(true, Ordering::Release);
        let samples = watcher.join().expect("the watcher saw the cap crossed");
        (outcomes, samples)
    });

    assert!(samples >= 1);
    let (granted, refused): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(Result::is_ok);
    let granted: Vec<Reservation> = granted.into_iter().map(Result::unwrap).collect();
    let refused: Vec<SpendRefused> = refused.into_iter().map(Result::unwrap_err).collect();
    assert_eq!(granted.len(), 500);
    assert_eq!(refused.len(), 500);
    for refusal in &refused {
        assert_eq!(refusal.requested, micros(PRICE));
        assert_eq!(refusal.cap, micros(CAP));
        assert_eq!(refusal.spent, Money::ZERO);
        assert_eq!(
            refusal.committed,
            micros(CAP),
            "refused only once the cap was full"
        );
        assert_eq!(refusal.in_flight, 500);
    }
    assert_eq!(ledger.committed(), micros(CAP));
    assert_eq!(ledger.in_flight(), 500);

    // Settle half at 5..=9 micros each (some under, some over the price of 7), drop the rest.
    let mut granted = granted.into_iter();
    let settled: Vec<Settlement> = (0..250u64)
        .zip(granted.by_ref())
        .map(|(i, held)| held.settle(micros(5 + i % 5)))
        .collect();
    drop(granted);

    let expected_spent: u64 = (0..250u64).map(|i| 5 + i % 5).sum();
    assert_eq!(expected_spent, 1_750);
    assert_eq!(
        settled.iter().map(|s| s.actual).sum::<Money>(),
        micros(expected_spent)
    );
    assert_eq!(ledger.spent(), micros(expected_spent));
    assert_eq!(ledger.committed(), Money::ZERO);
    assert_eq!(ledger.in_flight(), 0);
    assert_eq!(ledger.settled(), 250);
    assert_eq!(ledger.status().remaining(), micros(CAP - expected_spent));
}

// ---- The model ----

/// One step of the property test. Indices pick among the reservations held, modulo their count.
#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    Settle { index: usize, actual: u64 },
    Drop { index: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..40u64).prop_map(Op::Reserve),
        2 => (any::<usize>(), 0..60u64).prop_map(|(index, actual)| Op::Settle { index, actual }),
        1 => any::<usize>().prop_map(|index| Op::Drop { index }),
    ]
}

/// Plain integers that should agree with the ledger after every step.
#[derive(Default)]
struct Model {
    spent: u64,
    committed: u64,
    settled: u64,
}

fn matches_the_model(cap: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let ledger = CostLedger::new("model", micros(cap));
    let mut model = Model::default();
    let mut held: Vec<Reservation> = Vec::new();
    for op in ops {
        match op {
            Op::Reserve(amount) => {
                let fits = amount == 0 || model.spent + model.committed + amount <= cap;
                match ledger.reserve(micros(amount)) {
                    Ok(reservation) => {
                        prop_assert!(fits, "granted {amount} past the model");
                        prop_assert_eq!(reservation.amount(), micros(amount));
                        model.committed += amount;
                        if amount > 0 {
                            prop_assert!(model.spent + model.committed <= cap);
                        }
                        held.push(reservation);
                    }
                    Err(refused) => {
                        prop_assert!(!fits, "refused {amount} the model would grant");
                        prop_assert_eq!(refused.spent, micros(model.spent));
                        prop_assert_eq!(refused.committed, micros(model.committed));
                        prop_assert_eq!(refused.in_flight, held.len());
                        prop_assert_eq!(refused.requested, micros(amount));
                        prop_assert_eq!(refused.cap, micros(cap));
                    }
                }
            }
            Op::Settle { index, actual } => {
                if held.is_empty() {
                    continue;
                }
                let reservation = held.swap_remove(index % held.len());
                let reserved = reservation.amount().micros();
                let settlement = reservation.settle(micros(actual));
                prop_assert_eq!(
                    settlement,
                    Settlement {
                        reserved: micros(reserved),
                        actual: micros(actual)
                    }
                );
                model.committed -= reserved;
                model.spent += actual;
                model.settled += 1;
            }
            Op::Drop { index } => {
                if held.is_empty() {
                    continue;
                }
                let reservation = held.swap_remove(index % held.len());
                model.committed -= reservation.amount().micros();
                drop(reservation);
            }
        }
        let status = ledger.status();
        prop_assert_eq!(status.spent, micros(model.spent));
        prop_assert_eq!(status.committed, micros(model.committed));
        prop_assert_eq!(status.in_flight, held.len());
        prop_assert_eq!(ledger.settled(), model.settled);
        prop_assert!(status.committed <= status.cap, "committed past the cap");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// The ledger's answers and numbers are those of a plain model, after every step, and the
    /// reservations in flight never pass the cap.
    #[test]
    fn the_ledger_matches_a_plain_model_and_never_commits_past_the_cap(
        cap in 0..200u64,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        matches_the_model(cap, ops)?;
    }
}
