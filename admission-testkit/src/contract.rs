//! The account contract suite: one plain function per rule of [`Account`], runnable against any
//! implementation, speaking only the one question [`Account::ask`].
//!
//! Every rule function takes a factory, `&dyn Fn() -> Subject`, calls it for a fresh account (a
//! rule never reuses another rule's account) and panics with what it expected and what it saw
//! when the account breaks the rule. [`run_all`] runs the whole list, [`RULES`] names every entry
//! so a caller can turn each into a test of its own, and the functions are public so a caller can
//! run one alone while fixing it (the shape of arrow-rs object_store's `integration` module).
//!
//! A [`Subject`] is the account plus the few facts the suite cannot find out for itself: an
//! amount that fits a fresh account, how many of that amount the account holds, an amount that can
//! never fit (if it has a bound), the [`FakeClock`] it reads, and the [`Replenishment`] it should
//! declare. The suite assumes amounts add up linearly: `k` copies of `fits_alone` held or reserved
//! count as `k` times the amount.
//!
//! The suite asks as the monitor does: a lone asker is [`Ask::HEAD`], a waiter behind a head
//! that holds `k` amounts on the account is [`Ask::behind`]`(k amounts)`, and either may be a
//! [`look`](Ask::look). It counts what is free with looks only (the smallest `k` such that
//! `fits_alone` no longer fits behind `k` of them), so a rule sees exactly what a take debited.
//!
//! The rules:
//!
//! | rule | what it holds |
//! |---|---|
//! | [`never_blocks`] | every method returns while other threads call it |
//! | [`a_taking_ask_that_is_taken_debits_exactly_mine`] | a take removes its own amount, never the reservation's |
//! | [`a_look_changes_nothing`] | a look answers what the take would, and takes nothing |
//! | [`not_now_and_never_change_nothing`] | a taking ask answered "not now" or "never" debits nothing |
//! | [`never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now`] | "never" is a refusal naming what was asked, fresh or drained |
//! | [`a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it`] | a monitor refuses that amount at once while a head waits on the drained account |
//! | [`fits_alone_but_not_beside_the_reservation_is_not_now`] | a reservation makes "not now", never "never" |
//! | [`not_now_instant_is_when_time_alone_makes_it_fit`] | a clocked account's instant is the earliest, not a nanosecond off |
//! | [`a_clocked_account_answers_at_the_instant_it_is_asked_at`] | a clocked account answers as of the ask's instant, not its own clock's |
//! | [`a_release_account_answers_not_now_without_an_instant`] | only a give can help a release account |
//! | [`asks_are_atomic_against_concurrent_takers`] | racing takers win exactly the capacity |
//! | [`never_overdrawn_under_concurrent_asks_and_gives`] | asks and gives in parallel never hold more than the capacity |
//! | [`give_credits_back`] | a give makes room at once, without the clock moving |
//! | [`replenishment_is_declared`] | the declared replenishment, and only that one, brings capacity back |
//! | [`a_named_capacity_is_what_a_fresh_account_holds`] | `capacity()`, when named, is exactly the most a fresh account grants at once |
//! | [`status_has_a_one_line_summary`] | the status names the account, fits one line and serializes to an object |
//! | [`wake_slot_is_called_when_capacity_grows_and_cleared_by_none`] | a give calls the installed wake once; `None` silences it |
//! | [`a_later_wake_replaces_an_earlier_one`] | only the last installed wake is called |
//! | [`forget_capacity_change_clears_only_its_own_wake`] | forgetting a wake clears it, and never a wake someone else installed |
//!
//! No rule waits on real time: clocked accounts are moved with the subject's [`FakeClock`]. The
//! threaded rules give up after the subject's [`patience`](Subject::patience) and report the
//! hang as a blocking account.
//!
//! # Examples
//!
//! A reference account runs the whole suite in one call:
//!
//! ```
//! use std::sync::Arc;
//! use admission_core::Amount;
//! use admission_testkit::contract::{self, Subject};
//! use admission_testkit::reference::Permits;
//!
//! // Ten permits asked two at a time: a fresh gate holds five such amounts.
//! contract::run_all(|| {
//!     Subject::release(Arc::new(Permits::new("pool", 10)), Amount::units(2), 5)
//!         .with_never_fits(Amount::units(11))
//! });
//! ```
//!
//! A clocked account names its fake clock, which the suite moves:
//!
//! ```
//! use std::sync::Arc;
//! use admission_core::Amount;
//! use admission_testkit::FakeClock;
//! use admission_testkit::contract::{self, Subject};
//! use admission_testkit::reference::Meter;
//!
//! contract::run_all(|| {
//!     let clock = FakeClock::new();
//!     let meter = Meter::new("model", 6, 2, clock.shared());
//!     Subject::time(Arc::new(meter), clock, Amount::units(3), 2).with_never_fits(Amount::units(7))
//! });
//! ```
//!
//! A third party's own account, written from scratch, checked the same way:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use admission_core::{
//!     Account, AccountStatus, Amount, Answer, Ask, Category, Refusal, Replenishment, WakeFn,
//!     WakeSlot,
//! };
//! use admission_testkit::contract::{self, Subject};
//! use admission_testkit::reference::ReferenceStatus;
//!
//! /// A pool of slots that come back when released.
//! struct Slots {
//!     capacity: u64,
//!     free: Mutex<u64>,
//!     wake: WakeSlot,
//! }
//!
//! impl Account for Slots {
//!     fn name(&self) -> &str {
//!         "slots"
//!     }
//!     fn category(&self) -> Category {
//!         Category::custom("slots")
//!     }
//!     fn replenishment(&self) -> Replenishment {
//!         Replenishment::Release
//!     }
//!     fn ask(&self, mine: Amount, ask: Ask) -> Answer {
//!         if mine.primary() > self.capacity {
//!             return Answer::Never(Refusal::too_large(mine, Amount::units(self.capacity)));
//!         }
//!         let mut free = self.free.lock().unwrap();
//!         if mine.primary() + ask.reserved_ahead().primary() > *free {
//!             return Answer::NotNow(None); // only a give brings slots back
//!         }
//!         if ask.takes() {
//!             *free -= mine.primary();
//!         }
//!         Answer::Taken
//!     }
//!     fn give(&self, amount: Amount) {
//!         {
//!             let mut free = self.free.lock().unwrap();
//!             *free = free.saturating_add(amount.primary()).min(self.capacity);
//!         }
//!         self.wake.notify();
//!     }
//!     fn status(&self) -> Box<dyn AccountStatus> {
//!         Box::new(ReferenceStatus {
//!             name: self.name().to_owned(),
//!             category: self.category(),
//!             capacity: self.capacity,
//!             available: *self.free.lock().unwrap(),
//!         })
//!     }
//!     fn on_capacity_change(&self, wake: Option<WakeFn>) {
//!         self.wake.install(wake);
//!     }
//!     fn forget_capacity_change(&self, wake: &WakeFn) {
//!         self.wake.clear_if(wake);
//!     }
//! }
//!
//! // The few lines a third party writes:
//! contract::run_all(|| {
//!     let slots = Slots { capacity: 3, free: Mutex::new(3), wake: WakeSlot::new() };
//!     Subject::release(Arc::new(slots), Amount::ONE, 3).with_never_fits(Amount::units(4))
//! });
//! ```

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, AdmitError, Amount, Answer, Ask, Capability, Category, Clock, Demand,
    Instant, JobContext, Monitor, Reading, RefusalKind, Replenishment, TryAdmitError, WakeFn,
};

use crate::FakeClock;
use crate::monitor::{PATIENCE, poll_once};
use crate::reference::ReferenceStatus;

/// An account under test and what the suite must be told about it.
///
/// Build one with [`Subject::release`] or [`Subject::time`]; add [`Subject::with_never_fits`] when
/// the account has a bound. The factory handed to a rule must return a *fresh* account each call:
/// nothing taken, every unit available.
#[derive(Debug)]
#[non_exhaustive]
pub struct Subject {
    /// The account, fresh.
    pub account: Arc<dyn Account>,
    /// The clock the account reads. The suite moves it forward to test clocked replenishment and
    /// otherwise leaves it standing, so a clocked account gains nothing while a rule runs.
    pub clock: FakeClock,
    /// An amount that fits a fresh account on its own.
    pub fits_alone: Amount,
    /// How many `fits_alone` amounts a fresh account holds at once: exactly this many taking
    /// asks in a row are taken and the next is "not now" while the clock stands still. At least
    /// one.
    pub capacity: u64,
    /// An amount the account can never hold, when it has such a bound; `None` skips the rule
    /// about it.
    pub never_fits: Option<Amount>,
    /// What [`Account::replenishment`] must answer.
    pub expected_replenishment: Replenishment,
    /// How long the threaded rules wait for their threads before calling the account blocking;
    /// [`PATIENCE`] unless [`Subject::with_patience`] says otherwise. Only a hang spends it.
    pub patience: Duration,
}

impl Subject {
    /// A [`Replenishment::Release`] account that holds `capacity` copies of `fits_alone`.
    ///
    /// Its clock is a new [`FakeClock`]; the suite moves it to show that time alone gives a
    /// release account nothing back, which holds whether or not the account reads it.
    ///
    /// # Panics
    ///
    /// When `capacity` is zero: the suite needs at least one amount that fits.
    pub fn release(account: Arc<dyn Account>, fits_alone: Amount, capacity: u64) -> Subject {
        Subject::new(
            account,
            FakeClock::new(),
            fits_alone,
            capacity,
            Replenishment::Release,
        )
    }

    /// A [`Replenishment::Time`] account reading `clock` and holding `capacity` copies of
    /// `fits_alone` when full. It must be built on `clock` and start full.
    ///
    /// # Panics
    ///
    /// When `capacity` is zero.
    pub fn time(
        account: Arc<dyn Account>,
        clock: FakeClock,
        fits_alone: Amount,
        capacity: u64,
    ) -> Subject {
        Subject::new(account, clock, fits_alone, capacity, Replenishment::Time)
    }

    /// Every fact spelled out, for an account whose replenishment is decided at run time.
    ///
    /// # Panics
    ///
    /// When `capacity` is zero.
    pub fn new(
        account: Arc<dyn Account>,
        clock: FakeClock,
        fits_alone: Amount,
        capacity: u64,
        expected_replenishment: Replenishment,
    ) -> Subject {
        assert!(
            capacity > 0,
            "a contract subject must hold at least one `fits_alone` amount; `{}` was declared \
             with capacity 0",
            account.name()
        );
        Subject {
            account,
            clock,
            fits_alone,
            capacity,
            never_fits: None,
            expected_replenishment,
            patience: PATIENCE,
        }
    }

    /// Declares an amount larger than the account can ever hold.
    pub fn with_never_fits(mut self, amount: Amount) -> Subject {
        self.never_fits = Some(amount);
        self
    }

    /// Waits `patience` instead of [`PATIENCE`] before a threaded rule calls the account
    /// blocking (a test that plants a blocking account on purpose need not wait twenty seconds).
    pub fn with_patience(mut self, patience: Duration) -> Subject {
        self.patience = patience;
        self
    }
}

/// One rule of the suite: it builds what it needs from the factory and panics on a breach.
pub type Rule = fn(&dyn Fn() -> Subject);

/// Every rule, by name, in the order [`run_all`] runs them.
pub const RULES: &[(&str, Rule)] = &[
    ("never_blocks", never_blocks),
    (
        "a_taking_ask_that_is_taken_debits_exactly_mine",
        a_taking_ask_that_is_taken_debits_exactly_mine,
    ),
    ("a_look_changes_nothing", a_look_changes_nothing),
    (
        "not_now_and_never_change_nothing",
        not_now_and_never_change_nothing,
    ),
    (
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
        never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now,
    ),
    (
        "a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it",
        a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it,
    ),
    (
        "fits_alone_but_not_beside_the_reservation_is_not_now",
        fits_alone_but_not_beside_the_reservation_is_not_now,
    ),
    (
        "not_now_instant_is_when_time_alone_makes_it_fit",
        not_now_instant_is_when_time_alone_makes_it_fit,
    ),
    (
        "a_clocked_account_answers_at_the_instant_it_is_asked_at",
        a_clocked_account_answers_at_the_instant_it_is_asked_at,
    ),
    (
        "a_release_account_answers_not_now_without_an_instant",
        a_release_account_answers_not_now_without_an_instant,
    ),
    (
        "asks_are_atomic_against_concurrent_takers",
        asks_are_atomic_against_concurrent_takers,
    ),
    (
        "never_overdrawn_under_concurrent_asks_and_gives",
        never_overdrawn_under_concurrent_asks_and_gives,
    ),
    ("give_credits_back", give_credits_back),
    ("replenishment_is_declared", replenishment_is_declared),
    (
        "a_named_capacity_is_what_a_fresh_account_holds",
        a_named_capacity_is_what_a_fresh_account_holds,
    ),
    (
        "status_has_a_one_line_summary",
        status_has_a_one_line_summary,
    ),
    (
        "wake_slot_is_called_when_capacity_grows_and_cleared_by_none",
        wake_slot_is_called_when_capacity_grows_and_cleared_by_none,
    ),
    (
        "a_later_wake_replaces_an_earlier_one",
        a_later_wake_replaces_an_earlier_one,
    ),
    (
        "forget_capacity_change_clears_only_its_own_wake",
        forget_capacity_change_clears_only_its_own_wake,
    ),
];

/// Runs every rule in [`RULES`] against fresh accounts from `make`.
///
/// # Panics
///
/// At the first rule the account breaks, naming the rule, the account, what was expected and
/// what was seen.
pub fn run_all(make: impl Fn() -> Subject) {
    for (_, rule) in RULES {
        rule(&make);
    }
}

/// How many calls of each kind a thread makes in the threaded rules.
const ROUNDS: usize = 500;
/// How many threads the threaded rules start.
const THREADS: usize = 4;
/// How far the suite moves the clock to show what time alone does: a year covers any window.
const LONG_AGO: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// The clock's grain: an instant one nanosecond early is too early.
const NANOSECOND: Duration = Duration::from_nanos(1);

/// Every method returns promptly while other threads are calling it.
///
/// Four threads hammer `ask` (head and behind, taking and looking, giving back every amount
/// taken, and the never-fitting amount), `status`, `status_indicator`, `on_capacity_change`
/// and `forget_capacity_change` for a bounded number of rounds; the rule holds when they all
/// finish, and the account is full again afterwards. No timing is measured; only a hang (beyond
/// the subject's [`patience`](Subject::patience)) fails.
///
/// # Panics
///
/// When a thread does not finish in time, or the account is not full afterwards.
pub fn never_blocks(make: &dyn Fn() -> Subject) {
    let run = Run::new("never_blocks", make);
    let unit = run.unit();
    let never = run.subject.never_fits;
    let account = run.subject.account.clone();
    let (_, wake) = counting_wake();
    let (_, stranger) = counting_wake();
    run.on_threads(THREADS, move |t| {
        for round in 0..ROUNDS {
            let _ = account.ask(unit, Ask::HEAD.look());
            let _ = account.ask(unit, Ask::behind(unit).look());
            if account.ask(unit, Ask::HEAD).is_taken() {
                account.give(unit);
            }
            if account.ask(unit, Ask::behind(unit)).is_taken() {
                account.give(unit);
            }
            if let Some(never) = never {
                let _ = account.ask(never, Ask::HEAD);
            }
            if round % 16 == t {
                let _ = account.status().summary();
                let _ = account.status_indicator();
                account.on_capacity_change(Some(wake.clone()));
                account.forget_capacity_change(&stranger);
            }
        }
    });
    run.subject.account.on_capacity_change(None);
    run.expect_free(
        run.subject.capacity,
        "after every thread gave back what it took",
    );
}

/// A taking ask answered [`Answer::Taken`] debits exactly `mine`: after `k` takes of
/// `fits_alone` as the head exactly `capacity - k` amounts are free and the next take is "not
/// now"; a take of two amounts at once leaves `capacity - 2`; and a waiter behind a head's one
/// amount that is taken debits its own amount, not the reservation too.
///
/// # Panics
///
/// When a take is not taken, or the free count after it is off.
pub fn a_taking_ask_that_is_taken_debits_exactly_mine(make: &dyn Fn() -> Subject) {
    const RULE: &str = "a_taking_ask_that_is_taken_debits_exactly_mine";
    let run = Run::new(RULE, make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    for taken in 1..=capacity {
        run.expect(
            unit,
            Ask::HEAD,
            &Said::Taken,
            &format!("take {taken} of {capacity}"),
        );
        run.expect_free(capacity - taken, &format!("after {taken} takes"));
    }
    run.expect_not_now(unit, Ask::HEAD, "once drained");
    run.expect_free(0, "after a take answered not now on a drained account");
    if capacity < 2 {
        return;
    }

    let run = Run::new(RULE, make);
    let two = times(unit, 2);
    run.expect(two, Ask::HEAD, &Said::Taken, "on a fresh account");
    run.expect_free(capacity - 2, &format!("after one take of {two}"));

    let run = Run::new(RULE, make);
    run.expect(
        unit,
        Ask::behind(unit),
        &Said::Taken,
        "on a fresh account, behind a head holding one amount",
    );
    run.expect_free(
        capacity - 1,
        "after a take behind the head (the reservation stays, it is not debited)",
    );
}

/// A look answers what the same taking ask would, and changes nothing: any number of looks
/// leaves a fresh account full; while amounts are free a look says [`Answer::Taken`] and the
/// take after it is taken and debits one amount; drained, a look and a take both answer "not
/// now" with the same instant.
///
/// # Panics
///
/// When a look changes the free count, or disagrees with the take after it.
pub fn a_look_changes_nothing(make: &dyn Fn() -> Subject) {
    let run = Run::new("a_look_changes_nothing", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let account = &run.subject.account;
    for _ in 0..3 {
        let _ = account.ask(unit, Ask::HEAD.look());
        let _ = account.ask(unit, Ask::behind(unit).look());
        let _ = account.ask(times(unit, capacity), Ask::HEAD.look());
        if let Some(never) = run.subject.never_fits {
            let _ = account.ask(never, Ask::HEAD.look());
        }
    }
    run.expect_free(capacity, "after looks only");
    for taken in 1..=capacity {
        let when = format!("before take {taken} of {capacity}");
        run.expect(unit, Ask::HEAD.look(), &Said::Taken, &when);
        run.expect(unit, Ask::HEAD, &Said::Taken, &when);
        run.expect_free(capacity - taken, &format!("after {taken} looks and takes"));
    }
    let looked = run.expect_not_now(unit, Ask::HEAD.look(), "once drained");
    run.expect(
        unit,
        Ask::HEAD,
        &Said::NotNow(looked),
        "once drained, right after a look answered so",
    );
    run.expect_free(0, "after a look and a take on a drained account");
}

/// A taking ask answered "not now" or "never" changes nothing: not now for the reservation on a
/// fresh account and on one with a single amount left, not now on a drained account, and never
/// for the never-fitting amount (when declared) at each of those points.
///
/// # Panics
///
/// When any of those answers is not the expected kind, or the free count moved.
pub fn not_now_and_never_change_nothing(make: &dyn Fn() -> Subject) {
    let run = Run::new("not_now_and_never_change_nothing", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let never = run.subject.never_fits;
    let refuse = |ask: Ask, free: u64, when: &str| {
        if let Some(never) = never {
            run.expect_never(never, ask, when);
            run.expect_free(free, &format!("{when}, after a take answered never"));
        }
    };

    let when = "on a fresh account with all of it reserved ahead";
    run.expect_not_now(unit, Ask::behind(times(unit, capacity)), when);
    run.expect_free(capacity, &format!("{when}, after a take answered not now"));
    refuse(Ask::HEAD, capacity, "on a fresh account");

    for _ in 1..capacity {
        run.expect(
            unit,
            Ask::HEAD,
            &Said::Taken,
            "while filling to one amount left",
        );
    }
    let when = "with one amount left, reserved for the head";
    run.expect_not_now(unit, Ask::behind(unit), when);
    run.expect_free(1, &format!("{when}, after a take answered not now"));
    refuse(Ask::behind(unit), 1, when);

    run.expect(unit, Ask::HEAD, &Said::Taken, "taking the last amount");
    run.expect_not_now(unit, Ask::HEAD, "once drained");
    run.expect_free(0, "once drained, after a take answered not now");
    refuse(Ask::HEAD, 0, "once drained");
}

/// An amount larger than the account can ever hold is [`Answer::Never`], fresh and drained, as
/// the head and behind one, looking and taking: never "not now" (the job would park forever)
/// and never [`RefusalKind::RefusingAll`] (that says "try later", and later will not help). A
/// [`RefusalKind::TooLarge`] names exactly the amount asked, and a maximum that the amount
/// exceeds in some dimension and `fits_alone` exceeds in none; [`RefusalKind::Other`] is the
/// account's own words. Nothing is debited.
///
/// Skipped (passes) when the subject declares no `never_fits` amount.
///
/// # Panics
///
/// When any answer is not such a refusal, or capacity is missing afterwards.
pub fn never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now(
    make: &dyn Fn() -> Subject,
) {
    let run = Run::new(
        "never_fitting_amount_is_refused_as_too_large_or_other_never_as_not_now",
        make,
    );
    let Some(never) = run.subject.never_fits else {
        return;
    };
    let unit = run.unit();
    let asks = [
        Ask::HEAD,
        Ask::HEAD.look(),
        Ask::behind(unit),
        Ask::behind(unit).look(),
    ];
    for ask in asks {
        run.expect_too_large_or_other(never, ask, "on a fresh account");
    }
    run.expect_free(
        run.subject.capacity,
        "after refusing the never-fitting amount",
    );
    run.drain();
    for ask in asks {
        run.expect_too_large_or_other(never, ask, "once drained");
    }
    run.expect_free(0, "drained, after refusing the never-fitting amount");
}

/// "Never" wins over "not now" in a monitor too: with the account drained and a head parked
/// for `fits_alone`, a demand of the never-fitting amount is refused at once, by
/// [`Monitor::admit`] on its first poll (with a timeout or without) and by
/// [`Monitor::try_admit`], naming the account; it is neither parked behind the head nor told to
/// wait, and nothing is taken. The monitor runs on the subject's clock with manual passes, so no
/// time passes and no pass runs meanwhile.
///
/// Skipped (passes) when the subject declares no `never_fits` amount.
///
/// # Panics
///
/// When the head is not parked on the drained account, or the never-fitting demand is anything
/// but refused by this account at once.
pub fn a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it(
    make: &dyn Fn() -> Subject,
) {
    let run = Run::new(
        "a_monitor_refuses_a_never_fitting_demand_at_once_behind_a_head_short_on_it",
        make,
    );
    let Some(never) = run.subject.never_fits else {
        return;
    };
    let account = run.subject.account.clone();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(run.subject.clock.shared())
        .build();
    // An account that requires a capability (a provider's window needs an HTTP connection) is
    // asked beside one that provides it and always has room.
    let companion: Option<Arc<dyn Account>> = account
        .requires()
        .map(|capability| Arc::new(Provider(capability)) as Arc<dyn Account>);
    let demand_of = |amount: Amount| {
        let demand = Demand::new().with(account.clone(), amount);
        match &companion {
            Some(provider) => demand.with(provider.clone(), Amount::ONE),
            None => demand,
        }
    };
    run.drain();
    let mut head = Box::pin(monitor.admit(demand_of(run.unit()), &JobContext::new("head"), None));
    if let Some(outcome) = poll_once(&mut head) {
        panic!(
            "{}: expected a head asking {} of the drained account to wait in the line, saw {}",
            run.at(),
            run.unit(),
            match outcome {
                Ok(_) => "it granted".to_owned(),
                Err(error) => format!("it refused: {error}"),
            }
        );
    }
    let name = account.name().to_owned();
    let refused_by_it = |error: &AdmitError| matches!(error, AdmitError::Refused { account, .. } if *account == name);
    for (how, timeout) in [
        ("admit", None),
        ("admit with a timeout", Some(Duration::from_secs(60))),
    ] {
        let mut admit =
            Box::pin(monitor.admit(demand_of(never), &JobContext::new("never"), timeout));
        match poll_once(&mut admit) {
            Some(Err(error)) if refused_by_it(&error) => {}
            seen => panic!(
                "{}: expected `{how}` of {never} behind a head waiting on the drained account to \
                 be refused by `{name}` on its first poll (the amount can never fit), saw {}",
                run.at(),
                match seen {
                    None => "it wait in the line".to_owned(),
                    Some(Ok(_)) => "a grant".to_owned(),
                    Some(Err(error)) => format!("{error:?}"),
                }
            ),
        }
    }
    let demand = demand_of(never);
    match monitor.try_admit(&demand, &JobContext::new("try")) {
        Err(TryAdmitError::Admit(error)) if refused_by_it(&error) => {}
        seen => panic!(
            "{}: expected `try_admit` of {never} behind a head waiting on the drained account to \
             be refused by `{name}` (the amount can never fit), saw {seen:?}",
            run.at()
        ),
    }
    assert!(
        monitor.queue_size() == 1,
        "{}: expected only the head in the line, saw {} waiters",
        run.at(),
        monitor.queue_size()
    );
    run.expect_free(
        0,
        "drained, after the monitor refused the never-fitting amount",
    );
    drop(head);
    monitor.stop();
}

/// An account that provides a capability and always has room: the companion a rule adds to a
/// demand on an account that requires that capability.
struct Provider(Capability);

impl Account for Provider {
    fn name(&self) -> &str {
        "provider"
    }
    fn category(&self) -> Category {
        Category::custom("provider")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, _mine: Amount, _ask: Ask) -> Answer {
        Answer::Taken
    }
    fn give(&self, _amount: Amount) {}
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: "provider".to_owned(),
            category: Category::custom("provider"),
            capacity: u64::MAX,
            available: u64::MAX,
        })
    }
    fn on_capacity_change(&self, _wake: Option<WakeFn>) {}
    fn provides(&self) -> Option<Capability> {
        Some(self.0)
    }
}

/// When `fits_alone` fits the account alone but not beside the head's reservation, the answer
/// is "not now", looking or taking, never "never" and never "taken": on a fresh account with
/// the whole capacity reserved ahead, and with one amount left reserved for the head, which then
/// takes it.
///
/// # Panics
///
/// When an answer is anything but "not now", or the head cannot take what was left for it.
pub fn fits_alone_but_not_beside_the_reservation_is_not_now(make: &dyn Fn() -> Subject) {
    let run = Run::new("fits_alone_but_not_beside_the_reservation_is_not_now", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let everything = times(unit, capacity);
    let when = "on a fresh account with all of it reserved ahead";
    run.expect_not_now(unit, Ask::behind(everything).look(), when);
    run.expect_not_now(unit, Ask::behind(everything), when);
    run.expect(unit, Ask::HEAD.look(), &Said::Taken, "on a fresh account");

    for _ in 1..capacity {
        run.expect(
            unit,
            Ask::HEAD,
            &Said::Taken,
            "while filling to one amount left",
        );
    }
    run.expect(unit, Ask::HEAD.look(), &Said::Taken, "with one amount left");
    let when = "with one amount left, reserved for the head";
    run.expect_not_now(unit, Ask::behind(unit).look(), when);
    run.expect_not_now(unit, Ask::behind(unit), when);
    run.expect(
        unit,
        Ask::HEAD,
        &Said::Taken,
        "the head taking the amount left for it",
    );
    run.expect_free(0, "after the head took the amount left for it");
}

/// A [`Replenishment::Time`] account's "not now" carries the earliest instant time alone makes
/// the amount fit, to the nanosecond.
///
/// Drained, a look and a take as the head both answer `NotNow(Some(at))` with `at` after now.
/// One nanosecond before `at` the look still answers `NotNow(Some(at))` (the instant is not
/// late, and does not drift as time passes); at `at` it is taken. Behind a head's one amount
/// (when the account holds two) the instant `later` is no earlier than `at`, is named again
/// one nanosecond before it (and before `at`), and is taken at `later`. No give, only the
/// subject's [`FakeClock`].
///
/// Skipped (passes) for a [`Replenishment::Release`] subject.
///
/// # Panics
///
/// When an instant is missing, past, early or late.
pub fn not_now_instant_is_when_time_alone_makes_it_fit(make: &dyn Fn() -> Subject) {
    let run = Run::new("not_now_instant_is_when_time_alone_makes_it_fit", make);
    if run.subject.expected_replenishment != Replenishment::Time {
        return;
    }
    let unit = run.unit();
    let clock = &run.subject.clock;
    let (_, at) = run.drained_until();
    run.expect(unit, Ask::HEAD, &Said::NotNow(Some(at)), "once drained");
    let behind = Ask::behind(unit).look();
    let later = if run.subject.capacity >= 2 {
        let seen = run.expect_not_now(unit, behind, "once drained");
        let Some(later) = seen.filter(|&later| later >= at) else {
            panic!(
                "{} once drained: expected {} to be not now with an instant no earlier than \
                 the head's {at:?} (a reservation never brings the instant forward); saw \
                 NotNow({seen:?})",
                run.at(),
                show_ask(unit, behind)
            );
        };
        Some(later)
    } else {
        None
    };

    clock.advance_to(at.saturating_sub(NANOSECOND));
    let when = format!("one nanosecond before its instant {at:?}");
    run.expect(unit, Ask::HEAD.look(), &Said::NotNow(Some(at)), &when);
    if let Some(later) = later {
        run.expect(unit, behind, &Said::NotNow(Some(later)), &when);
    }
    clock.advance_to(at);
    run.expect(
        unit,
        Ask::HEAD.look(),
        &Said::Taken,
        &format!("at its instant {at:?}"),
    );
    if let Some(later) = later {
        if later > at {
            clock.advance_to(later.saturating_sub(NANOSECOND));
            run.expect(
                unit,
                behind,
                &Said::NotNow(Some(later)),
                &format!("one nanosecond before the instant {later:?} it named behind a head"),
            );
        }
        clock.advance_to(later);
        run.expect(
            unit,
            behind,
            &Said::Taken,
            &format!("at the instant {later:?} it named behind a head"),
        );
    }
    run.expect(unit, Ask::HEAD, &Said::Taken, "taking at its instant");
}

/// A clocked account answers as of the instant it is asked at ([`Ask::at`], or a monitor's
/// [`Reading`]), whatever its own clock reads: a monitor reads its clock once for a whole
/// demand and hands every account that one instant, so an account that reads its own clock
/// where the ask gives an instant answers for another moment than its neighbours (and, for a
/// deadline, for the wrong one).
///
/// Drained, with the clock standing at `now`, the account names the instant `at` at which time
/// alone makes a unit fit. With the clock still at `now`: asked a nanosecond before `at`, the
/// unit is not now, at `at`; asked at `at`, it fits, looking and taking (through a
/// [`Reading`] taken at `at`, as a monitor's pass hands it). An account that also reads its own
/// clock for something else (an activity stamp, a cache, an ask that gives no instant) passes.
///
/// Skipped (passes) for a [`Replenishment::Release`] subject.
///
/// # Panics
///
/// When an answer to an ask with an instant is not the answer for that instant.
pub fn a_clocked_account_answers_at_the_instant_it_is_asked_at(make: &dyn Fn() -> Subject) {
    let run = Run::new(
        "a_clocked_account_answers_at_the_instant_it_is_asked_at",
        make,
    );
    if run.subject.expected_replenishment != Replenishment::Time {
        return;
    }
    let unit = run.unit();
    let clock = &run.subject.clock;
    let (now, at) = run.drained_until();
    let before = at.saturating_sub(NANOSECOND);
    run.expect(
        unit,
        Ask::HEAD.look().at(before),
        &Said::NotNow(Some(at)),
        &format!("asked at {before:?}, a nanosecond before its instant, its clock at {now:?}"),
    );
    let when = format!("asked at its instant {at:?} with its own clock still at {now:?}");
    run.expect(unit, Ask::HEAD.look().at(at), &Said::Taken, &when);
    let reading = Reading::taken_at(clock, at);
    run.expect(unit, Ask::HEAD.with(&reading), &Said::Taken, &when);
}

/// A [`Replenishment::Release`] account's "not now" has no instant (`NotNow(None)`): only a
/// give brings capacity back, so the monitor must not set a timer. Checked looking and taking,
/// with the whole capacity reserved ahead of a fresh account and on a drained one.
///
/// Skipped (passes) for a [`Replenishment::Time`] subject.
///
/// # Panics
///
/// When an answer is anything but `NotNow(None)`.
pub fn a_release_account_answers_not_now_without_an_instant(make: &dyn Fn() -> Subject) {
    let run = Run::new("a_release_account_answers_not_now_without_an_instant", make);
    if run.subject.expected_replenishment != Replenishment::Release {
        return;
    }
    let unit = run.unit();
    let everything = Ask::behind(times(unit, run.subject.capacity));
    let when = "on a fresh account with all of it reserved ahead";
    run.expect(unit, everything.look(), &Said::NotNow(None), when);
    run.expect(unit, everything, &Said::NotNow(None), when);
    run.drain();
    run.expect(unit, Ask::HEAD.look(), &Said::NotNow(None), "once drained");
    run.expect(unit, Ask::HEAD, &Said::NotNow(None), "once drained");
}

/// Threads racing taking asks of `fits_alone` as the head on a fresh account are taken exactly
/// `capacity` times between them: no two takes see the same free amount.
///
/// # Panics
///
/// When the takes are not exactly the capacity, or a thread hangs.
pub fn asks_are_atomic_against_concurrent_takers(make: &dyn Fn() -> Subject) {
    let run = Run::new("asks_are_atomic_against_concurrent_takers", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let threads = usize::try_from(capacity)
        .unwrap_or(usize::MAX)
        .clamp(THREADS, 4 * THREADS);
    let account = run.subject.account.clone();
    let wins = run.on_threads(threads, move |_| {
        // A correct account says "not now" once drained; the bound only stops a broken one.
        let mut wins = 0u64;
        for _ in 0..=capacity {
            if !account.ask(unit, Ask::HEAD).is_taken() {
                break;
            }
            wins += 1;
        }
        wins
    });
    let total: u64 = wins.iter().sum();
    assert_eq!(
        total,
        capacity,
        "{}: expected {threads} racing takers to be taken exactly the capacity, {capacity} takes \
         of {unit}, between them; they were taken {total} times ({wins:?} per thread)",
        run.at()
    );
    run.expect_free(0, "after the race drained it");
}

/// Threads asking and giving back in parallel never hold more than the capacity at once, and
/// the account is full again when they are done.
///
/// Half the threads ask as the head, half as waiters behind a head that holds nothing here
/// ([`Ask::behind`]`(ZERO)`). Each counts what it holds in a shared tally between a take and its
/// give; a tally above the capacity means two takes were granted the same room.
///
/// # Panics
///
/// When the tally ever exceeds the capacity, or the account is not full afterwards.
pub fn never_overdrawn_under_concurrent_asks_and_gives(make: &dyn Fn() -> Subject) {
    let run = Run::new("never_overdrawn_under_concurrent_asks_and_gives", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let held = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let account = run.subject.account.clone();
    let (tally, peak) = (held.clone(), most.clone());
    run.on_threads(THREADS * 2, move |t| {
        let ask = if t % 2 == 0 {
            Ask::HEAD
        } else {
            Ask::behind(Amount::ZERO)
        };
        for _ in 0..ROUNDS {
            if account.ask(unit, ask).is_taken() {
                let now = tally.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                thread::yield_now();
                tally.fetch_sub(1, Ordering::SeqCst);
                account.give(unit);
            }
        }
    });
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= capacity,
        "{}: expected no more than {capacity} takes of {unit} held at once, saw {most}",
        run.at()
    );
    run.expect_free(capacity, "after every thread gave back what it took");
}

/// A give makes room at once: drained, one `give(fits_alone)` lets exactly one more take be
/// taken, without the clock moving (for clocked accounts too: a give is the rollback path).
///
/// # Panics
///
/// When the take after the give is not taken, or a second one is.
pub fn give_credits_back(make: &dyn Fn() -> Subject) {
    let run = Run::new("give_credits_back", make);
    let unit = run.unit();
    run.drain();
    run.subject.account.give(unit);
    let when = "after giving one amount back";
    run.expect_free(1, when);
    run.expect(unit, Ask::HEAD.look(), &Said::Taken, when);
    run.expect(unit, Ask::HEAD, &Said::Taken, when);
    run.expect_not_now(unit, Ask::HEAD, "after retaking the amount given back");
    run.expect_free(0, "after retaking the amount given back");
}

/// The account declares the replenishment the subject expects, and behaves by it: a drained
/// release account answers `NotNow(None)` however far the clock moves; a drained clocked
/// account is taken again once the clock has moved far enough (a year).
///
/// # Panics
///
/// When the declaration differs, or the account does not behave by it.
pub fn replenishment_is_declared(make: &dyn Fn() -> Subject) {
    let run = Run::new("replenishment_is_declared", make);
    let expected = run.subject.expected_replenishment;
    let seen = run.subject.account.replenishment();
    assert_eq!(
        seen,
        expected,
        "{}: expected replenishment {expected:?}, saw {seen:?}",
        run.at()
    );
    run.drain();
    run.subject.clock.advance(LONG_AGO);
    let after = match expected {
        Replenishment::Time => Said::Taken,
        Replenishment::Release => Said::NotNow(None),
    };
    run.expect(
        run.unit(),
        Ask::HEAD.look(),
        &after,
        &format!("drained, then a year later by the clock ({expected:?})"),
    );
}

/// An account that names its capacity ([`Account::capacity`]) names exactly what it holds when
/// full, on the primary dimension: a fresh account grants that much to the head at once (a
/// look), and refuses one unit more for good; and it holds the subject's `capacity` copies of
/// `fits_alone`. An account that names none (the default) passes.
///
/// # Panics
///
/// When the named capacity is more or less than that.
pub fn a_named_capacity_is_what_a_fresh_account_holds(make: &dyn Fn() -> Subject) {
    let run = Run::new("a_named_capacity_is_what_a_fresh_account_holds", make);
    let Some(named) = run.subject.account.capacity() else {
        return;
    };
    let full = named.primary();
    let holds = u128::from(run.unit().primary()) * u128::from(run.subject.capacity);
    assert!(
        u128::from(full) >= holds,
        "{}: expected the capacity it names ({full}) to be at least the {holds} that {} \
         copies of {} make, which it holds fresh",
        run.at(),
        run.subject.capacity,
        run.unit().primary()
    );
    run.expect(
        Amount::units(full),
        Ask::HEAD.look(),
        &Said::Taken,
        &format!("fresh, asked for the capacity it names ({full})"),
    );
    if let Some(more) = full.checked_add(1) {
        let seen = run
            .subject
            .account
            .ask(Amount::units(more), Ask::HEAD.look());
        assert!(
            matches!(seen, Answer::Never(_)),
            "{}: expected {more}, one past the capacity it names, to be refused for good \
             (\"never\") by a fresh account; saw {seen:?}",
            run.at()
        );
    }
}

/// The status names the account (same name and category), its summary is one non-empty line
/// that contains the name, and it serializes to a JSON object; fresh and drained alike.
///
/// # Panics
///
/// When any of these fails.
pub fn status_has_a_one_line_summary(make: &dyn Fn() -> Subject) {
    let run = Run::new("status_has_a_one_line_summary", make);
    let account = &run.subject.account;
    for when in ["fresh", "drained"] {
        if when == "drained" {
            run.drain();
        }
        let status = account.status();
        assert_eq!(
            status.name(),
            account.name(),
            "{} ({when}): expected status().name() to be the account's name",
            run.at()
        );
        assert_eq!(
            status.category(),
            account.category(),
            "{} ({when}): expected status().category() to be the account's category",
            run.at()
        );
        let summary = status.summary();
        assert!(
            !summary.trim().is_empty()
                && !summary.contains('\n')
                && summary.contains(account.name()),
            "{} ({when}): expected a summary on one non-empty line containing the name `{}`; \
             saw {summary:?}",
            run.at(),
            account.name()
        );
        let json = serde_json::to_value(&*status);
        assert!(
            matches!(json, Ok(serde_json::Value::Object(_))),
            "{} ({when}): expected the status to serialize to a JSON object; saw {json:?}",
            run.at()
        );
    }
}

/// A give that grows capacity calls the installed wake exactly once; after `None` is
/// installed, the same take and give call nothing.
///
/// # Panics
///
/// When the wake is not called exactly once after the give, or is called after being cleared.
pub fn wake_slot_is_called_when_capacity_grows_and_cleared_by_none(make: &dyn Fn() -> Subject) {
    let run = Run::new(
        "wake_slot_is_called_when_capacity_grows_and_cleared_by_none",
        make,
    );
    let account = &run.subject.account;
    let (calls, wake) = counting_wake();
    account.on_capacity_change(Some(wake));
    run.take_and_give_back("with a wake installed");
    let seen = calls.load(Ordering::SeqCst);
    assert_eq!(
        seen,
        1,
        "{}: expected the installed wake to be called exactly once by a take and a give; it was \
         called {seen} times",
        run.at()
    );
    account.on_capacity_change(None);
    run.take_and_give_back("with the wake cleared");
    let after = calls.load(Ordering::SeqCst);
    assert_eq!(
        after,
        1,
        "{}: expected a wake cleared by None never to be called again; it was called {after} \
         times in all",
        run.at()
    );
}

/// Installing a second wake replaces the first: a give then calls only the second, once.
///
/// # Panics
///
/// When the first wake is called after being replaced, or the second is not called once.
pub fn a_later_wake_replaces_an_earlier_one(make: &dyn Fn() -> Subject) {
    let run = Run::new("a_later_wake_replaces_an_earlier_one", make);
    let account = &run.subject.account;
    let (first_calls, first) = counting_wake();
    let (second_calls, second) = counting_wake();
    account.on_capacity_change(Some(first));
    account.on_capacity_change(Some(second));
    run.take_and_give_back("with two wakes installed in turn");
    let seen = (
        first_calls.load(Ordering::SeqCst),
        second_calls.load(Ordering::SeqCst),
    );
    assert_eq!(
        seen,
        (0, 1),
        "{}: expected a take and a give to call the later wake once and the earlier never \
         (first, second); saw {seen:?}",
        run.at()
    );
    account.on_capacity_change(None);
}

/// [`Account::forget_capacity_change`] clears the slot only when it holds that same wake: with
/// wake A installed, forgetting B (which another monitor might have installed and since lost
/// the slot) leaves A, which a give then calls once; forgetting A clears it, and the next give
/// calls nothing.
///
/// # Panics
///
/// When forgetting B silences A, or forgetting A does not.
pub fn forget_capacity_change_clears_only_its_own_wake(make: &dyn Fn() -> Subject) {
    let run = Run::new("forget_capacity_change_clears_only_its_own_wake", make);
    let account = &run.subject.account;
    let (a_calls, a) = counting_wake();
    let (b_calls, b) = counting_wake();
    account.on_capacity_change(Some(a.clone()));
    account.forget_capacity_change(&b);
    run.take_and_give_back("with A installed and B forgotten");
    let seen = (
        a_calls.load(Ordering::SeqCst),
        b_calls.load(Ordering::SeqCst),
    );
    assert_eq!(
        seen,
        (1, 0),
        "{}: expected wake A, installed, to be called once by a take and a give after wake B \
         (never installed) was forgotten, and B never (A, B); saw {seen:?}",
        run.at()
    );
    account.forget_capacity_change(&a);
    run.take_and_give_back("with A forgotten");
    let after = a_calls.load(Ordering::SeqCst);
    assert_eq!(
        after,
        1,
        "{}: expected wake A, once forgotten, never to be called again; it was called {after} \
         times in all",
        run.at()
    );
}

/// A wake that counts its calls.
fn counting_wake() -> (Arc<AtomicUsize>, WakeFn) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let wake: WakeFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (calls, wake)
}

/// `amount` added to itself `n` times, per dimension, saturating.
fn times(amount: Amount, n: u64) -> Amount {
    Amount::from_dimensions(amount.dimensions().map(|d| d.saturating_mul(n)))
}

/// An answer as the rules compare it: a refusal stands for its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Said {
    Taken,
    NotNow(Option<Instant>),
    Never(RefusalKind),
}

impl From<&Answer> for Said {
    fn from(answer: &Answer) -> Said {
        match answer {
            Answer::Taken => Said::Taken,
            Answer::NotNow(at) => Said::NotNow(*at),
            Answer::Never(refusal) => Said::Never(refusal.kind()),
        }
    }
}

/// An answer, printed for a failure message (a refusal with its message).
fn show(answer: &Answer) -> String {
    match answer {
        Answer::Taken => "Taken".to_owned(),
        Answer::NotNow(at) => format!("NotNow({at:?})"),
        Answer::Never(refusal) => format!("Never({:?}: {:?})", refusal.kind(), refusal.message()),
    }
}

/// The call, printed for a failure message: `ask(2, Ask::behind(4).look())`.
fn show_ask(mine: Amount, ask: Ask) -> String {
    let who = if ask.is_head() {
        "Ask::HEAD".to_owned()
    } else {
        format!("Ask::behind({})", ask.reserved_ahead())
    };
    let look = if ask.takes() { "" } else { ".look()" };
    format!("ask({mine}, {who}{look})")
}

/// One rule running on one fresh subject.
struct Run {
    rule: &'static str,
    subject: Subject,
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.at())
    }
}

impl Run {
    /// Builds the subject and checks that it is fresh as declared.
    fn new(rule: &'static str, make: &dyn Fn() -> Subject) -> Run {
        let run = Run {
            rule,
            subject: make(),
        };
        assert!(
            run.subject.capacity > 0,
            "{}: the subject declares a capacity of 0",
            run.at()
        );
        run.expect(
            run.unit(),
            Ask::HEAD.look(),
            &Said::Taken,
            "fresh from the factory (is the subject declared right?)",
        );
        run
    }

    /// "contract rule `r` on account `a`", the head of every failure message.
    fn at(&self) -> String {
        format!(
            "contract rule `{}` on account `{}`",
            self.rule,
            self.subject.account.name()
        )
    }

    fn unit(&self) -> Amount {
        self.subject.fits_alone
    }

    /// Asks and checks the answer is exactly `expected`.
    fn expect(&self, mine: Amount, ask: Ask, expected: &Said, when: &str) {
        let seen = self.subject.account.ask(mine, ask);
        assert!(
            Said::from(&seen) == *expected,
            "{} {when}: expected {} to answer {expected:?}, saw {}",
            self.at(),
            show_ask(mine, ask),
            show(&seen)
        );
    }

    /// Asks, checks the answer is "not now", and returns its instant.
    fn expect_not_now(&self, mine: Amount, ask: Ask, when: &str) -> Option<Instant> {
        let seen = self.subject.account.ask(mine, ask);
        match seen {
            Answer::NotNow(at) => at,
            _ => panic!(
                "{} {when}: expected {} to answer NotNow(_), saw {}",
                self.at(),
                show_ask(mine, ask),
                show(&seen)
            ),
        }
    }

    /// Drains the (clocked) subject and returns the clock's present and the instant a lone head's
    /// look names for one unit, which must come after it: time alone refills a clocked account.
    fn drained_until(&self) -> (Instant, Instant) {
        let unit = self.unit();
        self.drain();
        let now = self.subject.clock.now();
        let seen = self.expect_not_now(unit, Ask::HEAD.look(), "once drained");
        match seen.filter(|&at| at > now) {
            Some(at) => (now, at),
            None => panic!(
                "{} once drained: expected ask({unit}, Ask::HEAD.look()) to be not now with an \
                 instant after now ({now:?}), time alone refilling a clocked account; saw \
                 NotNow({seen:?})",
                self.at()
            ),
        }
    }

    /// Asks, and checks the answer is "never", of any kind.
    fn expect_never(&self, mine: Amount, ask: Ask, when: &str) {
        let seen = self.subject.account.ask(mine, ask);
        assert!(
            matches!(seen, Answer::Never(_)),
            "{} {when}: expected {} to answer Never(_) (the amount can never fit), saw {}",
            self.at(),
            show_ask(mine, ask),
            show(&seen)
        );
    }

    /// Asks `never`, and checks the answer is a refusal as too large (naming exactly `never`
    /// and a maximum it exceeds while `fits_alone` does not) or in the account's own words.
    fn expect_too_large_or_other(&self, never: Amount, ask: Ask, when: &str) {
        let seen = self.subject.account.ask(never, ask);
        let unit = self.unit();
        let exceeds = |a: Amount, max: Amount| {
            a.dimensions()
                .iter()
                .zip(max.dimensions())
                .any(|(&a, m)| a > m)
        };
        let right = match &seen {
            Answer::Never(refusal) => match refusal.kind() {
                RefusalKind::TooLarge { asked, max } => {
                    asked == never && exceeds(never, max) && !exceeds(unit, max)
                }
                RefusalKind::Other => true,
                _ => false,
            },
            _ => false,
        };
        assert!(
            right,
            "{} {when}: expected {} to answer Never with RefusalKind::TooLarge {{ asked: {never:?}, \
             max }} (a max that {never} exceeds and {unit} does not) or RefusalKind::Other: the \
             amount can never fit, so neither not now nor refusing all; saw {}",
            self.at(),
            show_ask(never, ask),
            show(&seen)
        );
    }

    /// How many `fits_alone` amounts are free now, read with looks only: the smallest `k` for
    /// which `fits_alone` is not taken behind `k` of them (`k = 0`: as the head);
    /// `capacity + 1` when even the whole capacity reserved leaves room.
    fn free(&self) -> u64 {
        let unit = self.unit();
        for k in 0..=self.subject.capacity {
            let ask = if k == 0 {
                Ask::HEAD.look()
            } else {
                Ask::behind(times(unit, k)).look()
            };
            match self.subject.account.ask(unit, ask) {
                Answer::Taken => {}
                Answer::NotNow(_) => return k,
                Answer::Never(refusal) => panic!(
                    "{}: expected {} to be taken or not now (the amount fits the \
                     configuration), saw Never({:?}: {:?})",
                    self.at(),
                    show_ask(unit, ask),
                    refusal.kind(),
                    refusal.message()
                ),
            }
        }
        self.subject.capacity + 1
    }

    fn expect_free(&self, expected: u64, when: &str) {
        let seen = self.free();
        let capacity = self.subject.capacity;
        assert!(
            seen == expected,
            "{} {when}: expected {expected} free amounts of {} (of {capacity}), saw {}",
            self.at(),
            self.unit(),
            if seen > capacity {
                format!(
                    "more than {capacity} (does the account set `reserved_ahead` aside, and is \
                     the subject's capacity right?)"
                )
            } else {
                seen.to_string()
            }
        );
    }

    /// Takes the whole capacity as the head, one `fits_alone` at a time, and checks the next
    /// take is "not now".
    fn drain(&self) {
        let capacity = self.subject.capacity;
        for taken in 1..=capacity {
            self.expect(
                self.unit(),
                Ask::HEAD,
                &Said::Taken,
                &format!("taking {taken} of {capacity}"),
            );
        }
        self.expect_not_now(self.unit(), Ask::HEAD, "once drained");
    }

    /// One take of `fits_alone` as the head and its give, for the wake rules.
    fn take_and_give_back(&self, when: &str) {
        self.expect(self.unit(), Ask::HEAD, &Said::Taken, when);
        self.subject.account.give(self.unit());
    }

    /// Runs `work(i)` on `n` threads released together, returning their results in thread order.
    ///
    /// A thread that has not finished within the subject's patience is reported as a blocking
    /// account; a thread that panicked re-raises its panic here.
    fn on_threads<T: Send + 'static>(
        &self,
        n: usize,
        work: impl Fn(usize) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let patience = self.subject.patience;
        let work = Arc::new(work);
        let start = Arc::new(Barrier::new(n));
        let (done, finished) = mpsc::channel();
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (work, start, done) = (work.clone(), start.clone(), done.clone());
                thread::spawn(move || {
                    start.wait();
                    let _ = done.send((i, work(i)));
                })
            })
            .collect();
        drop(done);
        let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
        let mut count = 0;
        while count < n {
            match finished.recv_timeout(patience) {
                Ok((i, result)) => {
                    results[i] = Some(result);
                    count += 1;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "{}: expected all {n} threads to finish their calls; only {count} had \
                         after {patience:?}, so some method blocks",
                        self.at()
                    );
                }
            }
        }
        for handle in handles {
            if let Err(payload) = handle.join() {
                std::panic::resume_unwind(reraise(self, payload));
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every thread that did not panic sent its result"))
            .collect()
    }
}

/// A worker's panic, with the rule named in front.
fn reraise(run: &Run, payload: Box<dyn Any + Send>) -> Box<dyn Any + Send> {
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()));
    match message {
        Some(message) => Box::new(format!(
            "{}: a thread calling the account panicked: {message}",
            run.at()
        )),
        None => payload,
    }
}
