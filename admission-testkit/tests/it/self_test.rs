//! The suite can fail: an account with one deliberate flaw makes the rule that guards against
//! that flaw panic, naming the rule, while the same account without the flaw passes every rule.
//! Every rule of the suite is broken by at least one planted flaw.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Clock, Refusal, RefusalKind,
    Replenishment, WakeFn,
};
use admission_testkit::FakeClock;
use admission_testkit::contract::{self, Subject};
use admission_testkit::reference::{Meter, Permits};
use parking_lot::{Condvar, Mutex};
use serde::Serialize;

/// The one thing a [`Flawed`] account gets wrong.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Flaw {
    /// Nothing: the wrapper only delegates.
    None,
    /// A look takes what it asks about.
    LookTakes,
    /// A taking ask is answered `Taken` whatever the account says (and debits nothing more).
    TakenIgnoresTheLimit,
    /// A taking ask that is taken debits `mine` twice.
    TakenDebitsTwice,
    /// A taking ask behind a head that is taken debits the head's reservation too.
    BehindDebitsTheReservation,
    /// A taking ask answered "not now" debits `mine` anyway when it fits alone.
    NotNowDebits,
    /// A taking ask answered "never" debits one unit anyway.
    NeverDebits,
    /// "Never" is answered "not now", with no instant.
    NeverIsNotNow,
    /// "Never" is answered as refusing everyone for a minute.
    NeverIsRefusingAll,
    /// A too-large refusal names the maximum as the amount asked.
    TooLargeNamesTheMaxAsAsked,
    /// "Never" only while something is free: drained, the never-fitting amount is "not now".
    NeverIsNotNowWhenDrained,
    /// "Not now" because of the reservation is answered "never".
    ReservationIsNever,
    /// A waiter behind a head is answered as the head: the reservation is ignored.
    ReservationIgnored,
    /// "Not now" always names the present instant ("ask again now").
    NotNowIsAlwaysNow,
    /// "Not now" names an instant a nanosecond before the true one.
    NotNowTooEarly,
    /// "Not now" names an instant a nanosecond after the true one.
    NotNowTooLate,
    /// "Not now, only an event can help" names an instant a second ahead instead.
    NotNowWithAnInstant,
    /// A taking ask that is "not now" waits (for a latch only the test opens) instead of
    /// answering.
    NotNowBlocks,
    /// `give` credits nothing.
    GiveLosesCredit,
    /// `capacity` names one unit more than the account holds.
    CapacityOverstated,
    /// `capacity` names one unit less than the account holds.
    CapacityUnderstated,
    /// The instant an ask carries is dropped: the account reads its own clock instead.
    IgnoresTheGivenInstant,
    /// Declares the other replenishment.
    WrongReplenishment,
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
    /// `forget_capacity_change` clears whatever wake is installed, someone else's too.
    ForgetClearsAnyWake,
    /// `forget_capacity_change` keeps the wake (the trait's default body).
    ForgetKeepsTheWake,
}

/// A gate a blocking flaw waits on until the test opens it, so no thread outlives its test.
#[derive(Clone, Default)]
struct Latch(Arc<(Mutex<bool>, Condvar)>);

impl Latch {
    fn wait(&self) {
        let (open, opened) = &*self.0;
        let mut open = open.lock();
        while !*open {
            opened.wait(&mut open);
        }
    }

    fn open(&self) {
        let (open, opened) = &*self.0;
        *open.lock() = true;
        opened.notify_all();
    }
}

/// A reference account with one [`Flaw`] layered on top.
struct Flawed {
    inner: Arc<dyn Account>,
    clock: FakeClock,
    flaw: Flaw,
    /// True once any wake has been installed (for [`Flaw::WakeKeepsTheFirst`]).
    installed: AtomicBool,
    /// What [`Flaw::NotNowBlocks`] waits on.
    latch: Latch,
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
        Permits::CATEGORY
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
        Permits::CATEGORY
    }
    fn summary(&self) -> String {
        self.summary.clone()
    }
}

/// The same question, taking (and asked at no instant).
fn taking(ask: Ask) -> Ask<'static> {
    if ask.is_head() {
        Ask::HEAD
    } else {
        Ask::behind(ask.reserved_ahead())
    }
}

/// The same question asked at no instant: the account's own clock decides.
fn timeless(ask: Ask) -> Ask<'static> {
    if ask.takes() {
        taking(ask)
    } else {
        taking(ask).look()
    }
}

impl Account for Flawed {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn category(&self) -> Category {
        self.inner.category()
    }
    fn capacity(&self) -> Option<Amount> {
        let inner = self.inner.capacity()?.primary();
        Some(Amount::units(match self.flaw {
            Flaw::CapacityOverstated => inner + 1,
            Flaw::CapacityUnderstated => inner - 1,
            _ => inner,
        }))
    }
    fn replenishment(&self) -> Replenishment {
        match (self.flaw, self.inner.replenishment()) {
            (Flaw::WrongReplenishment, Replenishment::Release) => Replenishment::Time,
            (Flaw::WrongReplenishment, Replenishment::Time) => Replenishment::Release,
            (_, declared) => declared,
        }
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let inner = &self.inner;
        let asked = match self.flaw {
            Flaw::LookTakes => taking(ask),
            Flaw::ReservationIgnored if ask.takes() => Ask::HEAD,
            Flaw::ReservationIgnored => Ask::HEAD.look(),
            Flaw::IgnoresTheGivenInstant => timeless(ask),
            _ => ask,
        };
        let answer = inner.ask(mine, asked);
        let takes = ask.takes();
        match (self.flaw, answer) {
            (Flaw::TakenIgnoresTheLimit, _) if takes => Answer::Taken,
            (Flaw::TakenDebitsTwice, Answer::Taken) if takes => {
                let _ = inner.ask(mine, Ask::HEAD);
                Answer::Taken
            }
            (Flaw::BehindDebitsTheReservation, Answer::Taken) if takes => {
                let _ = inner.ask(ask.reserved_ahead(), Ask::HEAD);
                Answer::Taken
            }
            (Flaw::NotNowDebits, Answer::NotNow(at)) if takes => {
                let _ = inner.ask(mine, Ask::HEAD);
                Answer::NotNow(at)
            }
            (Flaw::NeverDebits, Answer::Never(refusal)) if takes => {
                let _ = inner.ask(Amount::ONE, Ask::HEAD);
                Answer::Never(refusal)
            }
            (Flaw::NeverIsNotNow, Answer::Never(_)) => Answer::NotNow(None),
            (Flaw::NeverIsRefusingAll, Answer::Never(_)) => Answer::Never(Refusal::temporary(
                "refusing everyone",
                Duration::from_secs(60),
            )),
            (Flaw::TooLargeNamesTheMaxAsAsked, Answer::Never(refusal)) => match refusal.kind() {
                RefusalKind::TooLarge { max, .. } => Answer::Never(Refusal::too_large(max, max)),
                _ => Answer::Never(refusal),
            },
            (Flaw::NeverIsNotNowWhenDrained, Answer::Never(refusal)) => {
                if inner.ask(Amount::ONE, Ask::HEAD.look()).is_taken() {
                    Answer::Never(refusal)
                } else {
                    Answer::NotNow(None)
                }
            }
            (Flaw::ReservationIsNever, Answer::NotNow(at)) => {
                if inner.ask(mine, Ask::HEAD.look()).is_taken() {
                    Answer::Never(Refusal::new("refused for the reservation"))
                } else {
                    Answer::NotNow(at)
                }
            }
            (Flaw::NotNowIsAlwaysNow, Answer::NotNow(_)) => Answer::NotNow(Some(self.clock.now())),
            (Flaw::NotNowTooEarly, Answer::NotNow(Some(at))) => {
                Answer::NotNow(Some(at.saturating_sub(Duration::from_nanos(1))))
            }
            (Flaw::NotNowTooLate, Answer::NotNow(Some(at))) => {
                Answer::NotNow(Some(at.saturating_add(Duration::from_nanos(1))))
            }
            (Flaw::NotNowWithAnInstant, Answer::NotNow(None)) => Answer::NotNow(Some(
                self.clock.now().saturating_add(Duration::from_secs(1)),
            )),
            (Flaw::NotNowBlocks, Answer::NotNow(at)) if takes => {
                self.latch.wait();
                Answer::NotNow(at)
            }
            (_, answer) => answer,
        }
    }
    fn give(&self, amount: Amount) {
        if self.flaw != Flaw::GiveLosesCredit {
            self.inner.give(amount);
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
    fn forget_capacity_change(&self, wake: &WakeFn) {
        match self.flaw {
            Flaw::ForgetClearsAnyWake => self.inner.on_capacity_change(None),
            Flaw::ForgetKeepsTheWake => {}
            _ => self.inner.forget_capacity_change(wake),
        }
    }
}

/// Which reference account a flaw is planted on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum On {
    /// Four permits asked one at a time; five never fit.
    Permits,
    /// A single permit, with no never-fitting amount declared.
    SinglePermit,
    /// A meter of four units refilling two a second, asked two at a time; five never fit.
    Meter,
}

/// A fresh subject: the reference account `on`, with `flaw`, blocking (if it does) on `latch`.
fn flawed(on: On, flaw: Flaw, latch: &Latch) -> Subject {
    let clock = FakeClock::new();
    let inner: Arc<dyn Account> = match on {
        On::Permits => Arc::new(Permits::new("flawed-permits", 4)),
        On::SinglePermit => Arc::new(Permits::new("flawed-single", 1)),
        On::Meter => Arc::new(Meter::new("flawed-meter", 4, 2, clock.shared())),
    };
    let account = Arc::new(Flawed {
        inner,
        clock: clock.clone(),
        flaw,
        installed: AtomicBool::new(false),
        latch: latch.clone(),
    });
    let subject = match on {
        On::Permits => Subject::new(account, clock, Amount::ONE, 4, Replenishment::Release)
            .with_never_fits(Amount::units(5)),
        On::SinglePermit => Subject::new(account, clock, Amount::ONE, 1, Replenishment::Release),
        On::Meter => Subject::new(account, clock, Amount::units(2), 2, Replenishment::Time)
            .with_never_fits(Amount::units(5)),
    };
    if flaw == Flaw::NotNowBlocks {
        // The flaw blocks for good; a fifth of a second is patience enough to see it.
        subject.with_patience(Duration::from_millis(200))
    } else {
        subject
    }
}

/// Every planted flaw, the account it is planted on, and a rule that must catch it.
const CAUGHT: &[(Flaw, On, &str)] = &[
    (Flaw::NotNowBlocks, On::SinglePermit, "never_blocks"),
    (
        Flaw::IgnoresTheGivenInstant,
        On::Meter,
        "a_clocked_account_answers_at_the_instant_it_is_asked_at",
    ),
    (
        Flaw::TakenIgnoresTheLimit,
        On::Permits,
        "a_taking_ask_that_is_taken_debits_exactly_mine",
    ),
    (
        Flaw::TakenDebitsTwice,
        On::Permits,
        "a_taking_ask_that_is_taken_debits_exactly_mine",
    ),
    (
        Flaw::BehindDebitsTheReservation,
        On::Permits,
        "a_taking_ask_that_is_taken_debits_exactly_mine",
    ),
    (Flaw::LookTakes, On::Permits, "a_look_changes_nothing"),
    (Flaw::LookTakes, On::Meter, "a_look_changes_nothing"),
    (
        Flaw::NotNowDebits,
        On::Permits,
        "not_now_and_never_change_nothing",
    ),
    (
        Flaw::NotNowDebits,
        On::Meter,
        "not_now_and_never_change_nothing",
    ),
    (
        Flaw::NeverDebits,
        On::Permits,
        "not_now_and_never_change_nothing",
    ),
    (
        Flaw::NeverIsNotNow,
        On::Permits,
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
    ),
    (
        Flaw::NeverIsNotNow,
        On::Meter,
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
    ),
    (
        Flaw::NeverIsRefusingAll,
        On::Permits,
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
    ),
    (
        Flaw::TooLargeNamesTheMaxAsAsked,
        On::Meter,
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
    ),
    (
        Flaw::NeverIsNotNowWhenDrained,
        On::Permits,
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
    ),
    (
        Flaw::NeverDebits,
        On::Permits,
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
    ),
    (
        Flaw::TakenIgnoresTheLimit,
        On::Permits,
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
    ),
    (
        Flaw::NeverIsNotNowWhenDrained,
        On::Permits,
        "a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it",
    ),
    (
        Flaw::NeverIsNotNowWhenDrained,
        On::Meter,
        "a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it",
    ),
    (
        Flaw::NeverIsNotNow,
        On::Meter,
        "a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it",
    ),
    (
        Flaw::ReservationIsNever,
        On::Permits,
        "fits_alone_but_not_beside_the_reservation_is_not_now",
    ),
    (
        Flaw::ReservationIsNever,
        On::Meter,
        "fits_alone_but_not_beside_the_reservation_is_not_now",
    ),
    (
        Flaw::ReservationIgnored,
        On::Permits,
        "fits_alone_but_not_beside_the_reservation_is_not_now",
    ),
    (
        Flaw::ReservationIgnored,
        On::Meter,
        "fits_alone_but_not_beside_the_reservation_is_not_now",
    ),
    (
        Flaw::NotNowIsAlwaysNow,
        On::Meter,
        "not_now_instant_is_when_time_alone_makes_it_fit",
    ),
    (
        Flaw::NotNowTooEarly,
        On::Meter,
        "not_now_instant_is_when_time_alone_makes_it_fit",
    ),
    (
        Flaw::NotNowTooLate,
        On::Meter,
        "not_now_instant_is_when_time_alone_makes_it_fit",
    ),
    (
        Flaw::NotNowWithAnInstant,
        On::Permits,
        "a_release_account_answers_not_now_without_an_instant",
    ),
    (
        Flaw::NotNowIsAlwaysNow,
        On::Permits,
        "a_release_account_answers_not_now_without_an_instant",
    ),
    (
        Flaw::TakenIgnoresTheLimit,
        On::Permits,
        "asks_are_atomic_against_concurrent_takers",
    ),
    (
        Flaw::TakenDebitsTwice,
        On::Permits,
        "asks_are_atomic_against_concurrent_takers",
    ),
    (
        Flaw::TakenIgnoresTheLimit,
        On::SinglePermit,
        "never_overdrawn_under_concurrent_asks_and_gives",
    ),
    (
        Flaw::GiveLosesCredit,
        On::Permits,
        "never_overdrawn_under_concurrent_asks_and_gives",
    ),
    (Flaw::GiveLosesCredit, On::Permits, "give_credits_back"),
    (Flaw::GiveLosesCredit, On::Meter, "give_credits_back"),
    (Flaw::TakenIgnoresTheLimit, On::Permits, "give_credits_back"),
    (
        Flaw::WrongReplenishment,
        On::Permits,
        "replenishment_is_declared",
    ),
    (
        Flaw::WrongReplenishment,
        On::Meter,
        "replenishment_is_declared",
    ),
    (
        Flaw::CapacityOverstated,
        On::Permits,
        "a_named_capacity_is_what_a_fresh_account_holds",
    ),
    (
        Flaw::CapacityUnderstated,
        On::Meter,
        "a_named_capacity_is_what_a_fresh_account_holds",
    ),
    (
        Flaw::TwoLineSummary,
        On::Permits,
        "status_has_a_one_line_summary",
    ),
    (
        Flaw::StatusNamesAnother,
        On::Permits,
        "status_has_a_one_line_summary",
    ),
    (
        Flaw::StatusIsNotAnObject,
        On::Permits,
        "status_has_a_one_line_summary",
    ),
    (
        Flaw::WakeNeverInstalled,
        On::Permits,
        "wake_slot_is_called_when_capacity_grows_and_cleared_by_none",
    ),
    (
        Flaw::WakeNeverCleared,
        On::Meter,
        "wake_slot_is_called_when_capacity_grows_and_cleared_by_none",
    ),
    (
        Flaw::WakeKeepsTheFirst,
        On::Permits,
        "a_later_wake_replaces_an_earlier_one",
    ),
    (
        Flaw::ForgetClearsAnyWake,
        On::Permits,
        "forget_capacity_change_clears_only_its_own_wake",
    ),
    (
        Flaw::ForgetKeepsTheWake,
        On::Meter,
        "forget_capacity_change_clears_only_its_own_wake",
    ),
    (
        Flaw::WakeNeverInstalled,
        On::Meter,
        "forget_capacity_change_clears_only_its_own_wake",
    ),
];

/// The rule named `name`, looked up in the suite's own list.
fn rule_named(name: &str) -> contract::Rule {
    contract::RULES
        .iter()
        .find(|(rule, _)| *rule == name)
        .unwrap_or_else(|| panic!("the suite has no rule named `{name}`"))
        .1
}

/// Runs the rule `name` on `make` and returns its panic message; fails if it did not panic.
fn failure_of(name: &str, make: &dyn Fn() -> Subject) -> String {
    let outcome = catch_unwind(AssertUnwindSafe(|| rule_named(name)(make)));
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

/// Asserts the rule `name` fails on `make`, with a message naming the rule and what it expected.
fn assert_caught(name: &str, make: &dyn Fn() -> Subject) -> String {
    let message = failure_of(name, make);
    assert!(
        message.contains(&format!("contract rule `{name}`")) && message.contains("expected"),
        "expected the failure of `{name}` to name the rule and what it expected; saw {message:?}"
    );
    message
}

/// Asserts `rule` fails on `flaw` planted on `on`, and returns its message.
fn caught(flaw: Flaw, on: On, rule: &str) -> String {
    let latch = Latch::default();
    let message = failure_of(rule, &|| flawed(on, flaw, &latch));
    latch.open();
    assert!(
        message.contains(&format!("contract rule `{rule}`")) && message.contains("expected"),
        "expected {flaw:?} on {on:?} to make `{rule}` fail naming the rule and what it \
         expected; saw {message:?}"
    );
    message
}

#[test]
fn the_wrapper_without_a_flaw_passes_every_rule() {
    let latch = Latch::default();
    for on in [On::Permits, On::SinglePermit, On::Meter] {
        contract::run_all(|| flawed(on, Flaw::None, &latch));
    }
}

#[test]
fn every_planted_flaw_is_caught_by_the_rule_that_guards_against_it() {
    for &(flaw, on, rule) in CAUGHT {
        caught(flaw, on, rule);
    }
}

#[test]
fn every_rule_of_the_suite_is_broken_by_some_planted_flaw() {
    let unbroken: Vec<&str> = contract::RULES
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !CAUGHT.iter().any(|(_, _, rule)| rule == name))
        .collect();
    assert_eq!(unbroken, Vec::<&str>::new(), "rules no planted flaw breaks");
}

#[test]
fn a_not_now_that_blocks_is_reported_as_blocking() {
    let message = caught(Flaw::NotNowBlocks, On::SinglePermit, "never_blocks");
    assert!(message.contains("so some method blocks"), "{message}");
}

#[test]
fn a_not_now_instant_a_nanosecond_early_or_late_is_caught_at_the_nanosecond() {
    let rule = "not_now_instant_is_when_time_alone_makes_it_fit";
    let early = caught(Flaw::NotNowTooEarly, On::Meter, rule);
    assert!(
        early.contains("at its instant Instant(999.999999ms)")
            && early.contains("to answer Taken, saw NotNow(Some(Instant(999.999999ms)))"),
        "{early}"
    );
    let late = caught(Flaw::NotNowTooLate, On::Meter, rule);
    assert!(
        late.contains("one nanosecond before its instant Instant(1.000000001s)")
            && late.contains("to answer NotNow(Some(Instant(1.000000001s))), saw Taken"),
        "{late}"
    );
}

#[test]
fn a_refusal_of_the_wrong_kind_is_caught_naming_the_kinds_allowed() {
    let rule = "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now";
    let refusing = caught(Flaw::NeverIsRefusingAll, On::Permits, rule);
    assert!(
        refusing.contains("saw Never(RefusingAll { retry_after: 60s }"),
        "{refusing}"
    );
    let misnamed = caught(Flaw::TooLargeNamesTheMaxAsAsked, On::Meter, rule);
    assert!(
        misnamed.contains("RefusalKind::TooLarge { asked: Amount(5), max }")
            && misnamed.contains("saw Never(TooLarge { asked: Amount(4), max: Amount(4) }"),
        "{misnamed}"
    );
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
    let message = assert_caught("not_now_instant_is_when_time_alone_makes_it_fit", &make);
    assert!(message.contains("saw NotNow(None)"), "{message}");
}

#[test]
fn a_clocked_account_that_never_refills_is_caught() {
    let make = || {
        let clock = FakeClock::new();
        let meter = Meter::new("stuck", 2, 0, clock.shared());
        Subject::time(Arc::new(meter), clock, Amount::ONE, 2)
    };
    let message = assert_caught("replenishment_is_declared", &make);
    assert!(
        message.contains("to answer Taken, saw NotNow(None)"),
        "{message}"
    );
    assert_caught("not_now_instant_is_when_time_alone_makes_it_fit", &make);
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
        let message = caught(flaw, On::Permits, "status_has_a_one_line_summary");
        assert!(
            message.contains(check),
            "{flaw:?}: expected a failure about {check:?}; saw {message:?}"
        );
    }
}

#[test]
fn a_forget_that_clears_another_monitors_wake_is_caught() {
    let rule = "forget_capacity_change_clears_only_its_own_wake";
    let message = caught(Flaw::ForgetClearsAnyWake, On::Permits, rule);
    assert!(message.contains("(A, B); saw (0, 0)"), "{message}");
    let message = caught(Flaw::ForgetKeepsTheWake, On::Meter, rule);
    assert!(
        message.contains("it was called 2 times in all"),
        "{message}"
    );
}

#[test]
fn run_all_stops_at_the_first_broken_rule() {
    let latch = Latch::default();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        contract::run_all(|| flawed(On::Permits, Flaw::GiveLosesCredit, &latch));
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

#[test]
fn an_account_that_reads_its_own_clock_where_the_ask_gives_an_instant_is_caught() {
    let rule = "a_clocked_account_answers_at_the_instant_it_is_asked_at";
    let message = caught(Flaw::IgnoresTheGivenInstant, On::Meter, rule);
    // Drained at 0, the meter's next two units come after a second at two a second.
    assert!(
        message
            .contains("asked at its instant Instant(1s) with its own clock still at Instant(0ns)")
            && message.contains("to answer Taken, saw NotNow(Some(Instant(1s)))"),
        "{message}"
    );
    // The same meter reading its own clock for everything an ask gives no instant for (its
    // level, its gives) passes.
    let latch = Latch::default();
    rule_named(rule)(&|| flawed(On::Meter, Flaw::None, &latch));
}
