//! The strategies keep their promises: fresh accounts within the capacity bounds, demands that
//! name each account at most once and never ask more than an account holds, and orchestrators.

use std::collections::HashSet;

use admission_core::{Amount, Ask, Refusal, RefusalKind, Replenishment};
use admission_testkit::FakeClock;
use admission_testkit::strategies::{
    self, AccountSpec, MAX_ACCOUNTS, MAX_CAPACITY, MAX_JOBS, MIN_CAPACITY,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

proptest! {
    #[test]
    fn accounts_are_fresh_and_within_bounds(accounts in strategies::accounts(FakeClock::new())) {
        prop_assert!((1..=MAX_ACCOUNTS).contains(&accounts.len()));
        for account in &accounts {
            // Fresh: the least capacity fits; within bounds: one unit past the most never does.
            let least = account.ask(Amount::units(MIN_CAPACITY), Ask::HEAD.look());
            prop_assert!(least.is_taken(), "{:?}", least);
            let most = Amount::units(MAX_CAPACITY + 1);
            let refused = account.ask(most, Ask::HEAD.look()).refusal().map(Refusal::kind);
            prop_assert!(
                matches!(refused, Some(RefusalKind::TooLarge { asked, .. }) if asked == most),
                "{:?}",
                refused
            );
        }
    }

    #[test]
    fn specs_build_what_they_describe(specs in strategies::account_specs()) {
        let accounts = strategies::build(&specs, &FakeClock::new());
        for (i, (spec, account)) in specs.iter().zip(&accounts).enumerate() {
            prop_assert!((MIN_CAPACITY..=MAX_CAPACITY).contains(&spec.capacity()));
            prop_assert_eq!(account.replenishment(), spec.replenishment());
            let suffix = format!("-{i}");
            prop_assert!(account.name().ends_with(&suffix));
            let whole = Amount::units(spec.capacity());
            let all = account.ask(whole, Ask::HEAD.look());
            prop_assert!(all.is_taken(), "{:?}", all);
            let too_many = whole + Amount::ONE;
            let refused = account.ask(too_many, Ask::HEAD.look()).refusal().map(Refusal::kind);
            prop_assert_eq!(
                refused,
                Some(RefusalKind::TooLarge { asked: too_many, max: whole })
            );
            if let AccountSpec::Meter { capacity, per_second } = *spec {
                prop_assert!((1..=capacity).contains(&per_second));
            }
        }
    }

    #[test]
    fn demand_shapes_name_each_account_once_and_ask_at_most_the_least_capacity(
        (n, jobs) in (0..=MAX_ACCOUNTS).prop_flat_map(|n| (Just(n), strategies::demand_shapes(n)))
    ) {
        prop_assert!((1..=MAX_JOBS).contains(&jobs.len()));
        for shape in &jobs {
            let named: HashSet<usize> = shape.iter().map(|&(i, _)| i).collect();
            prop_assert_eq!(named.len(), shape.len());
            for &(i, units) in shape {
                prop_assert!(i < n);
                prop_assert!((1..=MIN_CAPACITY).contains(&units));
            }
        }
    }

    #[test]
    fn shapes_within_capacities_never_ask_more_than_each_holds(
        (capacities, jobs) in prop::collection::vec(0..=MAX_CAPACITY, 0..=MAX_ACCOUNTS)
            .prop_flat_map(|caps| {
                let jobs = strategies::demand_shapes_within(&caps);
                (Just(caps), jobs)
            })
    ) {
        for shape in &jobs {
            for &(i, units) in shape {
                prop_assert!(units >= 1 && units <= capacities[i]);
            }
        }
    }

    #[test]
    fn a_shape_becomes_the_demand_it_describes(
        (accounts, jobs) in strategies::accounts(FakeClock::new())
            .prop_flat_map(|accounts| {
                let n = accounts.len();
                (Just(accounts), strategies::demand_shapes(n))
            })
    ) {
        for shape in &jobs {
            let demand = strategies::demand(&accounts, shape);
            prop_assert_eq!(demand.is_empty(), shape.is_empty());
            for &(i, units) in shape {
                prop_assert_eq!(demand.amount_on(&accounts[i]), Amount::units(units));
            }
        }
    }
}

#[test]
fn both_kinds_of_account_and_orchestrators_all_turn_up() {
    let mut runner = TestRunner::deterministic();
    let (mut release, mut time) = (0, 0);
    for _ in 0..64 {
        let specs = strategies::account_specs()
            .new_tree(&mut runner)
            .unwrap()
            .current();
        for spec in specs {
            match spec.replenishment() {
                Replenishment::Release => release += 1,
                Replenishment::Time => time += 1,
            }
        }
    }
    assert!(
        release > 0 && time > 0,
        "expected both kinds; saw {release} gates and {time} meters"
    );

    let shapes = strategies::demand_shapes(MAX_ACCOUNTS);
    let (mut empty, mut full) = (0, 0);
    for _ in 0..64 {
        for shape in shapes.new_tree(&mut runner).unwrap().current() {
            if shape.is_empty() {
                empty += 1;
            } else {
                full += 1;
            }
        }
    }
    assert!(
        empty > 0 && full > 0,
        "expected orchestrators and jobs; saw {empty} and {full}"
    );
}

#[test]
fn no_accounts_means_only_orchestrators() {
    let mut runner = TestRunner::deterministic();
    for _ in 0..16 {
        let jobs = strategies::demand_shapes(0)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        assert!(jobs.iter().all(Vec::is_empty), "saw {jobs:?}");
    }
}
