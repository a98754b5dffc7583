//! The account contract suite: one plain function per rule of [`Account`], runnable against any
//! implementation.
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
//! The rules:
//!
//! | rule | what it holds |
//! |---|---|
//! | [`never_blocks`] | every method returns while other threads call it |
//! | [`refuses_never_fitting_amount_with_err`] | "never" is an `Err`, and it debits nothing |
//! | [`answers_false_not_err_when_only_the_reservation_is_in_the_way`] | a reservation makes "not now", never "never" |
//! | [`try_take_debits_exactly_what_fits_reports`] | `fits` changes nothing; a take removes exactly its amount |
//! | [`try_take_is_atomic_against_concurrent_takers`] | racing takers win exactly the capacity |
//! | [`never_overdrawn_under_concurrent_takes_and_gives`] | takes and gives in parallel never hold more than the capacity |
//! | [`give_credits_back`] | a give makes room at once, without the clock moving |
//! | [`earliest_fit_semantics`] | `None` for event-driven accounts, a reachable future instant for clocked ones |
//! | [`replenishment_is_declared`] | the declared replenishment, and only that one, brings capacity back |
//! | [`status_has_a_one_line_summary`] | the status names the account, fits one line and serializes to an object |
//! | [`wake_slot_is_called_when_capacity_grows_and_cleared_by_none`] | a give calls the installed wake; `None` silences it |
//! | [`a_later_wake_replaces_an_earlier_one`] | only the last installed wake is called |
//!
//! No rule waits on real time: clocked accounts are moved with the subject's [`FakeClock`]. The
//! threaded rules give up after [`PATIENCE`] and report the hang as a blocking account.
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
//!     Account, AccountStatus, Amount, Category, Instant, Refusal, Replenishment, WakeFn, WakeSlot,
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
//! impl Slots {
//!     fn new(capacity: u64) -> Slots {
//!         Slots { capacity, free: Mutex::new(capacity), wake: WakeSlot::new() }
//!     }
//!
//!     fn check(&self, free: u64, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
//!         if mine.primary() > self.capacity {
//!             return Err(Refusal::new(format!(
//!                 "slots holds {} at most; ask for fewer than {}",
//!                 self.capacity,
//!                 mine.primary()
//!             )));
//!         }
//!         Ok(mine.primary().saturating_add(reserved.primary()) <= free)
//!     }
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
//!     fn fits(&self, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
//!         self.check(*self.free.lock().unwrap(), mine, reserved)
//!     }
//!     fn try_take(&self, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
//!         let mut free = self.free.lock().unwrap();
//!         let fits = self.check(*free, mine, reserved)?;
//!         if fits {
//!             *free -= mine.primary();
//!         }
//!         Ok(fits)
//!     }
//!     fn give(&self, amount: Amount) {
//!         {
//!             let mut free = self.free.lock().unwrap();
//!             *free = free.saturating_add(amount.primary()).min(self.capacity);
//!         }
//!         self.wake.notify();
//!     }
//!     fn earliest_fit(&self, _mine: Amount, _reserved: Amount) -> Option<Instant> {
//!         None
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
//! }
//!
//! // The few lines a third party writes:
//! contract::run_all(|| {
//!     Subject::release(Arc::new(Slots::new(3)), Amount::ONE, 3).with_never_fits(Amount::units(4))
//! });
//! ```

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::Duration;

use admission_core::{Account, Amount, Clock, Refusal, Replenishment, WakeFn};

use crate::FakeClock;
use crate::monitor::PATIENCE;

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
    /// How many `fits_alone` amounts a fresh account holds at once: exactly this many takes in a
    /// row succeed and the next is refused while the clock stands still. At least one.
    pub capacity: u64,
    /// An amount the account can never hold, when it has such a bound; `None` skips the rule
    /// about it.
    pub never_fits: Option<Amount>,
    /// What [`Account::replenishment`] must answer.
    pub expected_replenishment: Replenishment,
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
        }
    }

    /// Declares an amount larger than the account can ever hold.
    pub fn with_never_fits(mut self, amount: Amount) -> Subject {
        self.never_fits = Some(amount);
        self
    }
}

/// One rule of the suite: it builds what it needs from the factory and panics on a breach.
pub type Rule = fn(&dyn Fn() -> Subject);

/// Every rule, by name, in the order [`run_all`] runs them.
pub const RULES: &[(&str, Rule)] = &[
    ("never_blocks", never_blocks),
    (
        "refuses_never_fitting_amount_with_err",
        refuses_never_fitting_amount_with_err,
    ),
    (
        "answers_false_not_err_when_only_the_reservation_is_in_the_way",
        answers_false_not_err_when_only_the_reservation_is_in_the_way,
    ),
    (
        "try_take_debits_exactly_what_fits_reports",
        try_take_debits_exactly_what_fits_reports,
    ),
    (
        "try_take_is_atomic_against_concurrent_takers",
        try_take_is_atomic_against_concurrent_takers,
    ),
    (
        "never_overdrawn_under_concurrent_takes_and_gives",
        never_overdrawn_under_concurrent_takes_and_gives,
    ),
    ("give_credits_back", give_credits_back),
    ("earliest_fit_semantics", earliest_fit_semantics),
    ("replenishment_is_declared", replenishment_is_declared),
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

/// Every method returns promptly while other threads are calling it.
///
/// Four threads hammer `fits`, `try_take` (giving back every success), `give`, `earliest_fit`,
/// `status` and `on_capacity_change` for a bounded number of rounds; the rule holds when they all
/// finish, and the account is full again afterwards. No timing is measured; only a hang (beyond
/// [`PATIENCE`]) fails.
///
/// # Panics
///
/// When a thread does not finish within [`PATIENCE`], or the account is not full afterwards.
pub fn never_blocks(make: &dyn Fn() -> Subject) {
    let run = Run::new("never_blocks", make);
    let unit = run.unit();
    let never = run.subject.never_fits;
    let wakes = Arc::new(AtomicUsize::new(0));
    let account = run.subject.account.clone();
    let counter = wakes.clone();
    let wake: WakeFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::Relaxed);
    });
    run.on_threads(THREADS, move |t| {
        for round in 0..ROUNDS {
            let _ = account.fits(unit, Amount::ZERO);
            let _ = account.fits(unit, unit);
            if let Ok(true) = account.try_take(unit, Amount::ZERO) {
                let _ = account.earliest_fit(unit, Amount::ZERO);
                account.give(unit);
            }
            let _ = account.earliest_fit(unit, unit);
            if let Some(never) = never {
                let _ = account.fits(never, Amount::ZERO);
            }
            if round % 16 == t {
                let _ = account.status().summary();
                let _ = account.status_indicator();
                account.on_capacity_change(Some(wake.clone()));
            }
        }
    });
    run.subject.account.on_capacity_change(None);
    run.expect_free(
        run.subject.capacity,
        "after every thread gave back what it took",
    );
}

/// An amount larger than the account can ever hold is an `Err` from both `fits` and `try_take`,
/// whatever the reservation, and the refused take debits nothing.
///
/// Skipped (passes) when the subject declares no `never_fits` amount.
///
/// # Panics
///
/// When either call answers `Ok`, or capacity is missing afterwards.
pub fn refuses_never_fitting_amount_with_err(make: &dyn Fn() -> Subject) {
    let run = Run::new("refuses_never_fitting_amount_with_err", make);
    let Some(never) = run.subject.never_fits else {
        return;
    };
    let account = &run.subject.account;
    for reserved in [Amount::ZERO, run.unit()] {
        let seen = account.fits(never, reserved);
        assert!(
            seen.is_err(),
            "{}: expected fits({never}, reserved {reserved}) to be Err (the amount can never \
             fit), saw {}",
            run.at(),
            show(&seen)
        );
        let seen = account.try_take(never, reserved);
        assert!(
            seen.is_err(),
            "{}: expected try_take({never}, reserved {reserved}) to be Err (the amount can \
             never fit), saw {}",
            run.at(),
            show(&seen)
        );
    }
    run.expect_fits(
        run.unit(),
        Amount::ZERO,
        true,
        "after refusing the never-fitting amount",
    );
    run.expect_free(
        run.subject.capacity,
        "after refusing the never-fitting amount",
    );
}

/// When `fits_alone` fits but not together with the reservation, `fits` and `try_take` answer
/// `Ok(false)` (not now), never `Err` (never), and nothing is debited.
///
/// Checked on a fresh account whose whole capacity is reserved and on an account with exactly one
/// amount left, reserved for the head.
///
/// # Panics
///
/// When either answer is anything but `Ok(false)`, or capacity changed.
pub fn answers_false_not_err_when_only_the_reservation_is_in_the_way(make: &dyn Fn() -> Subject) {
    let run = Run::new(
        "answers_false_not_err_when_only_the_reservation_is_in_the_way",
        make,
    );
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let everything = times(unit, capacity);
    run.expect_fits(
        unit,
        everything,
        false,
        "on a fresh account with all of it reserved",
    );
    run.expect_take(
        unit,
        everything,
        false,
        "on a fresh account with all of it reserved",
    );
    run.expect_free(capacity, "after a take refused for the reservation");

    for _ in 1..capacity {
        run.expect_take(unit, Amount::ZERO, true, "while filling to one amount left");
    }
    run.expect_fits(unit, Amount::ZERO, true, "with one amount left");
    run.expect_fits(
        unit,
        unit,
        false,
        "with one amount left, reserved for the head",
    );
    run.expect_take(
        unit,
        unit,
        false,
        "with one amount left, reserved for the head",
    );
    run.expect_free(1, "after a take refused for the reservation");
}

/// `fits` changes nothing, and each successful `try_take` removes exactly one `fits_alone`:
/// after `k` takes, exactly `capacity - k` amounts are free (probed through the reservation), and
/// `try_take` succeeds exactly when `fits` said it would.
///
/// # Panics
///
/// When `try_take` disagrees with the `fits` just before it, or the free count is off.
pub fn try_take_debits_exactly_what_fits_reports(make: &dyn Fn() -> Subject) {
    let run = Run::new("try_take_debits_exactly_what_fits_reports", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    for _ in 0..3 {
        let _ = run.subject.account.fits(unit, Amount::ZERO);
        let _ = run.subject.account.fits(unit, unit);
    }
    run.expect_free(capacity, "after calling only fits");
    for taken in 1..=capacity {
        let said = run.subject.account.fits(unit, Amount::ZERO);
        let did = run.subject.account.try_take(unit, Amount::ZERO);
        assert!(
            matches!((&said, &did), (Ok(true), Ok(true))),
            "{}: take {taken} of {capacity}: expected fits and try_take both Ok(true), saw fits \
             {} then try_take {}",
            run.at(),
            show(&said),
            show(&did)
        );
        run.expect_free(capacity - taken, &format!("after {taken} takes"));
    }
    run.expect_fits(unit, Amount::ZERO, false, "once drained");
    run.expect_take(unit, Amount::ZERO, false, "once drained");
    run.expect_free(0, "after a refused take on a drained account");
}

/// Threads racing `try_take(fits_alone)` on a fresh account win exactly `capacity` times between
/// them: no two takes see the same free amount.
///
/// # Panics
///
/// When the successes are not exactly the capacity, or a thread hangs.
pub fn try_take_is_atomic_against_concurrent_takers(make: &dyn Fn() -> Subject) {
    let run = Run::new("try_take_is_atomic_against_concurrent_takers", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let threads = usize::try_from(capacity)
        .unwrap_or(usize::MAX)
        .clamp(THREADS, 4 * THREADS);
    let account = run.subject.account.clone();
    let wins = run.on_threads(threads, move |_| {
        // A correct account refuses once drained; the bound only stops a broken one.
        let mut wins = 0u64;
        for _ in 0..=capacity {
            match account.try_take(unit, Amount::ZERO) {
                Ok(true) => wins += 1,
                _ => break,
            }
        }
        wins
    });
    let total: u64 = wins.iter().sum();
    assert_eq!(
        total,
        capacity,
        "{}: expected {threads} racing takers to win exactly the capacity, {capacity} takes of \
         {unit}, between them; they won {total} ({wins:?} per thread)",
        run.at()
    );
    run.expect_free(0, "after the race drained it");
}

/// Threads taking and giving back in parallel never hold more than the capacity at once, and
/// the account is full again when they are done.
///
/// Each thread counts what it holds in a shared tally between a successful take and its give; a
/// tally above the capacity means two takes were granted the same room.
///
/// # Panics
///
/// When the tally ever exceeds the capacity, or the account is not full afterwards.
pub fn never_overdrawn_under_concurrent_takes_and_gives(make: &dyn Fn() -> Subject) {
    let run = Run::new("never_overdrawn_under_concurrent_takes_and_gives", make);
    let unit = run.unit();
    let capacity = run.subject.capacity;
    let held = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let account = run.subject.account.clone();
    let (tally, peak) = (held.clone(), most.clone());
    run.on_threads(THREADS * 2, move |_| {
        for _ in 0..ROUNDS {
            if let Ok(true) = account.try_take(unit, Amount::ZERO) {
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

/// A give makes room at once: drained, one `give(fits_alone)` lets exactly one more take
/// succeed, without the clock moving (for clocked accounts too: a give is the rollback path).
///
/// # Panics
///
/// When the take after the give is refused, or a second one succeeds.
pub fn give_credits_back(make: &dyn Fn() -> Subject) {
    let run = Run::new("give_credits_back", make);
    let unit = run.unit();
    run.drain();
    run.subject.account.give(unit);
    run.expect_fits(unit, Amount::ZERO, true, "after giving one amount back");
    run.expect_take(unit, Amount::ZERO, true, "after giving one amount back");
    run.expect_take(
        unit,
        Amount::ZERO,
        false,
        "after retaking the amount given back",
    );
}

/// `earliest_fit` means what it says.
///
/// - While `fits_alone` fits, the answer is `None` or an instant no later than now.
/// - A [`Replenishment::Release`] account answers `None` when it does not fit: only a give can
///   change that.
/// - A [`Replenishment::Time`] account, drained, answers an instant in the future; moving the
///   clock there makes `fits` true; a larger reservation never moves the instant earlier.
///
/// # Panics
///
/// When any of these answers is off.
pub fn earliest_fit_semantics(make: &dyn Fn() -> Subject) {
    let run = Run::new("earliest_fit_semantics", make);
    let unit = run.unit();
    let account = &run.subject.account;
    let clock = &run.subject.clock;
    run.expect_fit_now(unit, "on a fresh account");

    match run.subject.expected_replenishment {
        Replenishment::Release => {
            let everything = times(unit, run.subject.capacity);
            let seen = account.earliest_fit(unit, everything);
            assert_eq!(
                seen,
                None,
                "{}: expected earliest_fit({unit}, reserved {everything}) to be None on a release \
                 account where it does not fit; saw {seen:?}",
                run.at()
            );
            run.drain();
            let seen = account.earliest_fit(unit, Amount::ZERO);
            assert_eq!(
                seen,
                None,
                "{}: expected earliest_fit({unit}) to be None on a drained release account (only \
                 a give can help); saw {seen:?}",
                run.at()
            );
        }
        Replenishment::Time => {
            run.drain();
            let now = clock.now();
            let alone = account.earliest_fit(unit, Amount::ZERO);
            let Some(at) = alone.filter(|&at| at > now) else {
                panic!(
                    "{}: expected earliest_fit({unit}) on a drained clocked account to be an \
                     instant after now ({now:?}); saw {alone:?}",
                    run.at()
                );
            };
            if let Some(later) = account.earliest_fit(unit, unit) {
                assert!(
                    later >= at,
                    "{}: expected earliest_fit({unit}, reserved {unit}) to be no earlier than \
                     earliest_fit({unit}) = {at:?}; saw {later:?}",
                    run.at()
                );
            }
            clock.advance_to(at);
            run.expect_fits(
                unit,
                Amount::ZERO,
                true,
                &format!("at its earliest fit {at:?}"),
            );
            run.expect_fit_now(unit, &format!("at its earliest fit {at:?}"));
        }
    }
}

/// The account declares the replenishment the subject expects, and behaves by it: a drained
/// release account stays drained however far the clock moves; a drained clocked account fits
/// again once the clock has moved far enough (a year).
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
    let after = format!("drained, then a year later by the clock ({expected:?})");
    run.expect_fits(
        run.unit(),
        Amount::ZERO,
        expected == Replenishment::Time,
        &after,
    );
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

/// A give that grows capacity calls the installed wake at least once; after `None` is installed,
/// the same take and give call nothing.
///
/// # Panics
///
/// When the wake is not called after the give, or is still called after being cleared.
pub fn wake_slot_is_called_when_capacity_grows_and_cleared_by_none(make: &dyn Fn() -> Subject) {
    let run = Run::new(
        "wake_slot_is_called_when_capacity_grows_and_cleared_by_none",
        make,
    );
    let unit = run.unit();
    let account = &run.subject.account;
    let (calls, wake) = counting_wake();
    account.on_capacity_change(Some(wake));
    run.expect_take(unit, Amount::ZERO, true, "with a wake installed");
    account.give(unit);
    let seen = calls.load(Ordering::SeqCst);
    assert!(
        seen >= 1,
        "{}: expected the installed wake to be called at least once after a take and a give; \
         it was called {seen} times",
        run.at()
    );
    account.on_capacity_change(None);
    run.expect_take(unit, Amount::ZERO, true, "with the wake cleared");
    account.give(unit);
    let after = calls.load(Ordering::SeqCst);
    assert_eq!(
        after,
        seen,
        "{}: expected a cleared wake never to be called again; calls went from {seen} to {after}",
        run.at()
    );
}

/// Installing a second wake replaces the first: a give then calls only the second.
///
/// # Panics
///
/// When the first wake is called after being replaced, or the second is not called.
pub fn a_later_wake_replaces_an_earlier_one(make: &dyn Fn() -> Subject) {
    let run = Run::new("a_later_wake_replaces_an_earlier_one", make);
    let unit = run.unit();
    let account = &run.subject.account;
    let (first_calls, first) = counting_wake();
    let (second_calls, second) = counting_wake();
    account.on_capacity_change(Some(first));
    account.on_capacity_change(Some(second));
    run.expect_take(unit, Amount::ZERO, true, "with two wakes installed in turn");
    account.give(unit);
    let (first, second) = (
        first_calls.load(Ordering::SeqCst),
        second_calls.load(Ordering::SeqCst),
    );
    assert!(
        first == 0 && second >= 1,
        "{}: expected only the later wake to be called after a take and a give (first 0, \
         second at least 1); saw first {first}, second {second}",
        run.at()
    );
    account.on_capacity_change(None);
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

/// An answer of `fits` or `try_take`, printed for a failure message.
fn show(answer: &Result<bool, Refusal>) -> String {
    match answer {
        Ok(fits) => format!("Ok({fits})"),
        Err(refusal) => format!("Err({:?})", refusal.message()),
    }
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
        run.expect_fits(
            run.unit(),
            Amount::ZERO,
            true,
            "fresh from the factory (is the subject declared right?)",
        );
        run
    }

    /// "rule `r` on account `a`", the head of every failure message.
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

    fn expect_fits(&self, mine: Amount, reserved: Amount, expected: bool, when: &str) {
        let seen = self.subject.account.fits(mine, reserved);
        assert!(
            matches!(seen, Ok(fits) if fits == expected),
            "{} {when}: expected fits({mine}, reserved {reserved}) to be Ok({expected}), saw {}",
            self.at(),
            show(&seen)
        );
    }

    fn expect_take(&self, mine: Amount, reserved: Amount, expected: bool, when: &str) {
        let seen = self.subject.account.try_take(mine, reserved);
        assert!(
            matches!(seen, Ok(taken) if taken == expected),
            "{} {when}: expected try_take({mine}, reserved {reserved}) to be Ok({expected}), saw \
             {}",
            self.at(),
            show(&seen)
        );
    }

    /// `earliest_fit(mine)` is `None` or not after now, for an amount that fits now.
    fn expect_fit_now(&self, mine: Amount, when: &str) {
        let now = self.subject.clock.now();
        let seen = self.subject.account.earliest_fit(mine, Amount::ZERO);
        assert!(
            seen.is_none_or(|at| at <= now),
            "{} {when}: {mine} fits now, so expected earliest_fit({mine}) to be None or no later \
             than now ({now:?}); saw {seen:?}",
            self.at()
        );
    }

    /// How many `fits_alone` amounts are free now, read without changing anything: the smallest
    /// `k` for which `fits_alone` no longer fits with `k` of them reserved; `capacity + 1` when
    /// even the whole capacity reserved leaves room.
    fn free(&self) -> u64 {
        let unit = self.unit();
        for k in 0..=self.subject.capacity {
            let reserved = times(unit, k);
            match self.subject.account.fits(unit, reserved) {
                Ok(true) => {}
                Ok(false) => return k,
                Err(refusal) => panic!(
                    "{}: expected fits({unit}, reserved {reserved}) to be Ok (the amount fits the \
                     configuration), saw Err({:?})",
                    self.at(),
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

    /// Takes the whole capacity, one `fits_alone` at a time, and checks the next take is refused.
    fn drain(&self) {
        let capacity = self.subject.capacity;
        for taken in 1..=capacity {
            self.expect_take(
                self.unit(),
                Amount::ZERO,
                true,
                &format!("taking {taken} of {capacity}"),
            );
        }
        self.expect_take(self.unit(), Amount::ZERO, false, "once drained");
    }

    /// Runs `work(i)` on `n` threads released together, returning their results in thread order.
    ///
    /// A thread that has not finished within [`PATIENCE`] is reported as a blocking account; a
    /// thread that panicked re-raises its panic here.
    fn on_threads<T: Send + 'static>(
        &self,
        n: usize,
        work: impl Fn(usize) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
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
            match finished.recv_timeout(PATIENCE) {
                Ok((i, result)) => {
                    results[i] = Some(result);
                    count += 1;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "{}: expected all {n} threads to finish their calls; only {count} had \
                         after {PATIENCE:?}, so some method blocks",
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
