//! The reference accounts pass the whole account contract suite, rule by rule, in several shapes.

use std::sync::Arc;

use admission_core::Amount;
use admission_testkit::FakeClock;
use admission_testkit::contract::{self, Subject};
use admission_testkit::reference::{Meter, Permits};

/// Ten permits asked two at a time.
fn permits_in_pairs() -> Subject {
    Subject::release(Arc::new(Permits::new("pool", 10)), Amount::units(2), 5)
        .with_never_fits(Amount::units(11))
}

/// A single permit: every take drains it.
fn one_permit() -> Subject {
    Subject::release(Arc::new(Permits::new("single", 1)), Amount::ONE, 1)
        .with_never_fits(Amount::units(2))
}

/// Eleven permits asked two at a time: one permit is always left over.
fn permits_with_a_remainder() -> Subject {
    Subject::release(Arc::new(Permits::new("odd", 11)), Amount::units(2), 5)
        .with_never_fits(Amount::units(12))
}

/// A meter of six units refilling two a second, asked three at a time.
fn meter_in_threes() -> Subject {
    let clock = FakeClock::new();
    let meter = Meter::new("model", 6, 2, clock.shared());
    Subject::time(Arc::new(meter), clock, Amount::units(3), 2).with_never_fits(Amount::units(7))
}

/// A meter of five units refilling one a second, asked one at a time.
fn slow_meter() -> Subject {
    let clock = FakeClock::new();
    let meter = Meter::new("slow", 5, 1, clock.shared());
    Subject::time(Arc::new(meter), clock, Amount::ONE, 5).with_never_fits(Amount::units(6))
}

/// A meter whose rate is far above its capacity: it refills within nanoseconds.
fn fast_meter() -> Subject {
    let clock = FakeClock::new();
    let meter = Meter::new("fast", 3, 1_000_000_000, clock.shared());
    Subject::time(Arc::new(meter), clock, Amount::ONE, 3)
}

/// One test per rule of the suite for one subject factory.
macro_rules! every_rule {
    ($module:ident, $make:ident) => {
        mod $module {
            use admission_testkit::contract;

            #[test]
            fn never_blocks() {
                contract::never_blocks(&super::$make);
            }
            #[test]
            fn a_taking_ask_that_is_taken_debits_exactly_mine() {
                contract::a_taking_ask_that_is_taken_debits_exactly_mine(&super::$make);
            }
            #[test]
            fn a_look_changes_nothing() {
                contract::a_look_changes_nothing(&super::$make);
            }
            #[test]
            fn not_now_and_never_change_nothing() {
                contract::not_now_and_never_change_nothing(&super::$make);
            }
            #[test]
            fn never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now() {
                contract::never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now(
                    &super::$make,
                );
            }
            #[test]
            fn a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it() {
                contract::a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it(
                    &super::$make,
                );
            }
            #[test]
            fn fits_alone_but_not_beside_the_reservation_is_not_now() {
                contract::fits_alone_but_not_beside_the_reservation_is_not_now(&super::$make);
            }
            #[test]
            fn not_now_instant_is_when_time_alone_makes_it_fit() {
                contract::not_now_instant_is_when_time_alone_makes_it_fit(&super::$make);
            }
            #[test]
            fn a_clocked_account_answers_at_the_instant_it_is_asked_at() {
                contract::a_clocked_account_answers_at_the_instant_it_is_asked_at(&super::$make);
            }
            #[test]
            fn a_release_account_answers_not_now_without_an_instant() {
                contract::a_release_account_answers_not_now_without_an_instant(&super::$make);
            }
            #[test]
            fn asks_are_atomic_against_concurrent_takers() {
                contract::asks_are_atomic_against_concurrent_takers(&super::$make);
            }
            #[test]
            fn never_overdrawn_under_concurrent_asks_and_gives() {
                contract::never_overdrawn_under_concurrent_asks_and_gives(&super::$make);
            }
            #[test]
            fn give_credits_back() {
                contract::give_credits_back(&super::$make);
            }
            #[test]
            fn replenishment_is_declared() {
                contract::replenishment_is_declared(&super::$make);
            }
            #[test]
            fn status_has_a_one_line_summary() {
                contract::status_has_a_one_line_summary(&super::$make);
            }
            #[test]
            fn wake_slot_is_called_when_capacity_grows_and_cleared_by_none() {
                contract::wake_slot_is_called_when_capacity_grows_and_cleared_by_none(
                    &super::$make,
                );
            }
            #[test]
            fn a_named_capacity_is_what_a_fresh_account_holds() {
                contract::a_named_capacity_is_what_a_fresh_account_holds(&super::$make);
            }
            #[test]
            fn a_later_wake_replaces_an_earlier_one() {
                contract::a_later_wake_replaces_an_earlier_one(&super::$make);
            }
            #[test]
            fn forget_capacity_change_clears_only_its_own_wake() {
                contract::forget_capacity_change_clears_only_its_own_wake(&super::$make);
            }
        }
    };
}

every_rule!(permits, permits_in_pairs);
every_rule!(meter, meter_in_threes);

#[test]
fn the_rule_macro_names_every_rule_of_the_suite() {
    // `every_rule!` lists nineteen rules by hand; a rule added to the suite must be added there.
    assert_eq!(contract::RULES.len(), 19);
    let mut names: Vec<&str> = contract::RULES.iter().map(|(name, _)| *name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), contract::RULES.len(), "rule names repeat");
}

#[test]
fn a_single_permit_passes_the_whole_suite() {
    contract::run_all(one_permit);
}

#[test]
fn permits_with_a_remainder_pass_the_whole_suite() {
    contract::run_all(permits_with_a_remainder);
}

#[test]
fn a_slow_meter_passes_the_whole_suite() {
    contract::run_all(slow_meter);
}

#[test]
fn a_meter_without_a_declared_bound_passes_the_whole_suite() {
    contract::run_all(fast_meter);
}
