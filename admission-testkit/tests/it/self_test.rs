//! The suite can fail: an account with one deliberate flaw makes the rule that guards against
//! that flaw panic, naming the rule, while the same account without the flaw passes every rule.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, Amount, Category, Clock, Instant, Refusal, Replenishment, WakeFn,
};
use admission_testkit::FakeClock;
use admission_testkit::contract::{self, Subject};
use admission_testkit::reference::{Meter, Permits};
use serde::Serialize;

/// The one thing a [`Flawed`] account gets wrong.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Flaw {
    /// Nothing: the wrapper only delegates.
    None,
    /// `try_take` reports success even when nothing fits (and then debits nothing).
    TakeIgnoresTheLimit,
    /// `try_take` debits twice what it was asked.
    TakeDebitsTwice,
    /// `fits` debits what it checks.
    FitsTakes,
    /// A never-fitting amount is "not now" instead of "never".
    NeverIsNotNow,
    /// A reservation in the way is "never" instead of "not now".
    ReservationIsNever,
    /// `give` credits nothing.
    GiveLosesCredit,
    /// Declares the other replenishment.
    WrongReplenishment,
    /// `earliest_fit` always answers now.
    EarliestFitIsAlwaysNow,
    /// `earliest_fit` answers a nanosecond before the true instant.
    EarliestFitTooEarly,
    /// The summary spans two lines.
    TwoLineSummary,
    /// The status names some other account.
    StatusNamesAnother,
    /// The status serializes to a bare string.
    StatusIsNotAnObject,
    /// The wake is never installed.
    WakeNeverInstalled,
    /// Installing `None` does not clear the wake.
    WakeNeverCleared,
    /// A second install does not replace the first.
    WakeKeepsTheFirst,
}

/// A reference account with one [`Flaw`] layered on top.
struct Flawed {
    inner: Arc<dyn Account>,
    clock: FakeClock,
    flaw: Flaw,
    /// True once any wake has been installed (for [`Flaw::WakeKeepsTheFirst`]).
    installed: AtomicBool,
}

/// A status record written by hand, to break it on purpose.
#[derive(Debug, Serialize)]
struct HandStatus {
    name: String,
    summary: String,
}

impl AccountStatus for HandStatus {
    fn name(&self) -> &str {
        &self.name
    }
    fn category(&self) -> Category {
        Category::SEMAPHORE
    }
    fn summary(&self) -> String {
        self.summary.clone()
    }
}

/// A status that serializes to a bare string (its summary) instead of an object.
#[derive(Debug)]
struct BareStatus {
    name: String,
    summary: String,
}

impl Serialize for BareStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.summary)
    }
}

impl AccountStatus for BareStatus {
    fn name(&self) -> &str {
        &self.name
    }
    fn category(&self) -> Category {
        Category::SEMAPHORE
    }
    fn summary(&self) -> String {
        self.summary.clone()
    }
}

impl Account for Flawed {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn category(&self) -> Category {
        self.inner.category()
    }
    fn replenishment(&self) -> Replenishment {
        match (self.flaw, self.inner.replenishment()) {
            (Flaw::WrongReplenishment, Replenishment::Release) => Replenishment::Time,
            (Flaw::WrongReplenishment, Replenishment::Time) => Replenishment::Release,
            (_, declared) => declared,
        }
    }
    fn fits(&self, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
        match self.flaw {
            Flaw::FitsTakes => self.inner.try_take(mine, reserved),
            _ => self.answer(self.inner.fits(mine, reserved), mine),
        }
    }
    fn try_take(&self, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
        let taken = self.answer(self.inner.try_take(mine, reserved), mine);
        match self.flaw {
            Flaw::TakeIgnoresTheLimit => Ok(true),
            Flaw::TakeDebitsTwice if matches!(taken, Ok(true)) => {
                let _ = self.inner.try_take(mine, Amount::ZERO);
                taken
            }
            _ => taken,
        }
    }
    fn give(&self, amount: Amount) {
        if self.flaw != Flaw::GiveLosesCredit {
            self.inner.give(amount);
        }
    }
    fn earliest_fit(&self, mine: Amount, reserved: Amount) -> Option<Instant> {
        let true_answer = self.inner.earliest_fit(mine, reserved);
        match self.flaw {
            Flaw::EarliestFitIsAlwaysNow => Some(self.clock.now()),
            Flaw::EarliestFitTooEarly => {
                true_answer.map(|at| at.saturating_sub(Duration::from_nanos(1)))
            }
            _ => true_answer,
        }
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        let inner = self.inner.status();
        match self.flaw {
            Flaw::TwoLineSummary => Box::new(HandStatus {
                name: inner.name().to_owned(),
                summary: format!("{}\nand a second line", inner.summary()),
            }),
            Flaw::StatusNamesAnother => Box::new(HandStatus {
                name: "another".to_owned(),
                summary: inner.summary(),
            }),
            Flaw::StatusIsNotAnObject => Box::new(BareStatus {
                name: inner.name().to_owned(),
                summary: inner.summary(),
            }),
            _ => inner,
        }
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        match self.flaw {
            Flaw::WakeNeverInstalled => {}
            Flaw::WakeNeverCleared if wake.is_none() => {}
            Flaw::WakeKeepsTheFirst if self.installed.swap(true, Ordering::SeqCst) => {}
            _ => self.inner.on_capacity_change(wake),
        }
    }
}

impl Flawed {
    /// The inner account's answer, bent by the flaws that concern "not now" and "never".
    fn answer(&self, answer: Result<bool, Refusal>, mine: Amount) -> Result<bool, Refusal> {
        match (self.flaw, answer) {
            (Flaw::NeverIsNotNow, Err(_)) => Ok(false),
            (Flaw::ReservationIsNever, Ok(false))
                if matches!(self.inner.fits(mine, Amount::ZERO), Ok(true)) =>
            {
                Err(Refusal::new("refused for the reservation"))
            }
            (_, answer) => answer,
        }
    }
}

/// Four permits asked one at a time, with `flaw`.
fn flawed_permits(flaw: Flaw) -> Subject {
    let clock = FakeClock::new();
    let account = Flawed {
        inner: Arc::new(Permits::new("flawed-permits", 4)),
        clock: clock.clone(),
        flaw,
        installed: AtomicBool::new(false),
    };
    Subject::new(
        Arc::new(account),
        clock,
        Amount::ONE,
        4,
        Replenishment::Release,
    )
    .with_never_fits(Amount::units(5))
}

/// A single permit, with `flaw`.
fn flawed_single_permit(flaw: Flaw) -> Subject {
    let clock = FakeClock::new();
    let account = Flawed {
        inner: Arc::new(Permits::new("flawed-single", 1)),
        clock: clock.clone(),
        flaw,
        installed: AtomicBool::new(false),
    };
    Subject::new(
        Arc::new(account),
        clock,
        Amount::ONE,
        1,
        Replenishment::Release,
    )
}

/// A meter of four units refilling two a second, asked two at a time, with `flaw`.
fn flawed_meter(flaw: Flaw) -> Subject {
    let clock = FakeClock::new();
    let account = Flawed {
        inner: Arc::new(Meter::new("flawed-meter", 4, 2, clock.shared())),
        clock: clock.clone(),
        flaw,
        installed: AtomicBool::new(false),
    };
    Subject::new(
        Arc::new(account),
        clock,
        Amount::units(2),
        2,
        Replenishment::Time,
    )
    .with_never_fits(Amount::units(5))
}

/// The rule named `name`, looked up in the suite's own list.
fn rule(name: &str) -> contract::Rule {
    contract::RULES
        .iter()
        .find(|(rule, _)| *rule == name)
        .unwrap_or_else(|| panic!("the suite has no rule named `{name}`"))
        .1
}

/// Runs the rule `name` on `make` and returns its panic message; fails if it did not panic.
fn failure_of(name: &str, make: &dyn Fn() -> Subject) -> String {
    let outcome = catch_unwind(AssertUnwindSafe(|| rule(name)(make)));
    let payload = match outcome {
        Ok(()) => panic!("expected rule `{name}` to fail on the flawed account; it passed"),
        Err(payload) => payload,
    };
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// Asserts the rule `name` fails on `make`, with a message naming the rule.
fn assert_caught(name: &str, make: &dyn Fn() -> Subject) {
    let message = failure_of(name, make);
    assert!(
        message.contains(&format!("contract rule `{name}`")) && message.contains("expected"),
        "expected the failure of `{name}` to name the rule and what it expected; saw {message:?}"
    );
}

#[test]
fn the_wrapper_without_a_flaw_passes_every_rule() {
    contract::run_all(|| flawed_permits(Flaw::None));
    contract::run_all(|| flawed_single_permit(Flaw::None));
    contract::run_all(|| flawed_meter(Flaw::None));
}

#[test]
fn a_take_that_ignores_the_limit_is_caught() {
    let make = || flawed_permits(Flaw::TakeIgnoresTheLimit);
    assert_caught("try_take_debits_exactly_what_fits_reports", &make);
    assert_caught("try_take_is_atomic_against_concurrent_takers", &make);
    assert_caught("give_credits_back", &make);
    assert_caught("refuses_never_fitting_amount_with_err", &make);
}

#[test]
fn a_take_that_ignores_the_limit_is_caught_overdrawing_under_contention() {
    assert_caught("never_overdrawn_under_concurrent_takes_and_gives", &|| {
        flawed_single_permit(Flaw::TakeIgnoresTheLimit)
    });
}

#[test]
fn a_take_that_debits_twice_is_caught() {
    assert_caught("try_take_debits_exactly_what_fits_reports", &|| {
        flawed_permits(Flaw::TakeDebitsTwice)
    });
    assert_caught("try_take_is_atomic_against_concurrent_takers", &|| {
        flawed_permits(Flaw::TakeDebitsTwice)
    });
}

#[test]
fn a_fits_that_takes_is_caught() {
    assert_caught("try_take_debits_exactly_what_fits_reports", &|| {
        flawed_permits(Flaw::FitsTakes)
    });
}

#[test]
fn never_answered_as_not_now_is_caught() {
    assert_caught("refuses_never_fitting_amount_with_err", &|| {
        flawed_permits(Flaw::NeverIsNotNow)
    });
    assert_caught("refuses_never_fitting_amount_with_err", &|| {
        flawed_meter(Flaw::NeverIsNotNow)
    });
}

#[test]
fn a_reservation_answered_as_never_is_caught() {
    assert_caught(
        "answers_false_not_err_when_only_the_reservation_is_in_the_way",
        &|| flawed_permits(Flaw::ReservationIsNever),
    );
    assert_caught(
        "answers_false_not_err_when_only_the_reservation_is_in_the_way",
        &|| flawed_meter(Flaw::ReservationIsNever),
    );
}

#[test]
fn a_give_that_loses_credit_is_caught() {
    assert_caught("give_credits_back", &|| {
        flawed_permits(Flaw::GiveLosesCredit)
    });
    assert_caught("never_overdrawn_under_concurrent_takes_and_gives", &|| {
        flawed_permits(Flaw::GiveLosesCredit)
    });
}

#[test]
fn a_wrong_replenishment_is_caught() {
    assert_caught("replenishment_is_declared", &|| {
        flawed_permits(Flaw::WrongReplenishment)
    });
    assert_caught("replenishment_is_declared", &|| {
        flawed_meter(Flaw::WrongReplenishment)
    });
}

#[test]
fn a_release_account_that_never_refills_by_time_but_claims_to_is_caught() {
    // A permit gate declared as clocked: draining it and waiting a year gives nothing back.
    let make = || {
        Subject::time(
            Arc::new(Permits::new("claims-time", 2)),
            FakeClock::new(),
            Amount::ONE,
            2,
        )
    };
    let message = failure_of("replenishment_is_declared", &make);
    assert!(
        message.contains("expected replenishment Time, saw Release"),
        "{message}"
    );
    assert_caught("earliest_fit_semantics", &make);
}

#[test]
fn a_clocked_account_that_never_refills_is_caught() {
    let make = || {
        let clock = FakeClock::new();
        let meter = Meter::new("stuck", 2, 0, clock.shared());
        Subject::time(Arc::new(meter), clock, Amount::ONE, 2)
    };
    assert_caught("replenishment_is_declared", &make);
    assert_caught("earliest_fit_semantics", &make);
}

#[test]
fn an_earliest_fit_of_now_when_nothing_fits_is_caught() {
    assert_caught("earliest_fit_semantics", &|| {
        flawed_permits(Flaw::EarliestFitIsAlwaysNow)
    });
    assert_caught("earliest_fit_semantics", &|| {
        flawed_meter(Flaw::EarliestFitIsAlwaysNow)
    });
}

#[test]
fn an_earliest_fit_that_comes_too_early_is_caught() {
    let message = failure_of("earliest_fit_semantics", &|| {
        flawed_meter(Flaw::EarliestFitTooEarly)
    });
    assert!(message.contains("at its earliest fit"), "{message}");
}

#[test]
fn broken_statuses_are_caught() {
    for (flaw, check) in [
        (Flaw::TwoLineSummary, "one non-empty line"),
        (
            Flaw::StatusNamesAnother,
            "status().name() to be the account's name",
        ),
        (Flaw::StatusIsNotAnObject, "serialize to a JSON object"),
    ] {
        let message = failure_of("status_has_a_one_line_summary", &|| flawed_permits(flaw));
        assert!(
            message.contains(check),
            "{flaw:?}: expected a failure about {check:?}; saw {message:?}"
        );
    }
}

#[test]
fn broken_wake_slots_are_caught() {
    assert_caught(
        "wake_slot_is_called_when_capacity_grows_and_cleared_by_none",
        &|| flawed_permits(Flaw::WakeNeverInstalled),
    );
    assert_caught(
        "wake_slot_is_called_when_capacity_grows_and_cleared_by_none",
        &|| flawed_meter(Flaw::WakeNeverCleared),
    );
    assert_caught("a_later_wake_replaces_an_earlier_one", &|| {
        flawed_permits(Flaw::WakeKeepsTheFirst)
    });
}

#[test]
fn run_all_stops_at_the_first_broken_rule() {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        contract::run_all(|| flawed_permits(Flaw::GiveLosesCredit));
    }));
    assert!(
        outcome.is_err(),
        "expected run_all to fail on a give that loses credit"
    );
}

#[test]
fn a_subject_of_no_capacity_is_refused() {
    let outcome =
        catch_unwind(|| Subject::release(Arc::new(Permits::new("empty", 0)), Amount::ONE, 0));
    assert!(outcome.is_err(), "expected a capacity of 0 to be refused");
}
