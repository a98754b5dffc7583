//! The gate contract suite: one plain function per rule of [`Gate`], runnable against any gate
//! (the memory gate, or a third party's), as [`contract`](crate::contract) is for accounts.
//!
//! A gate has no amounts, so the suite cannot find its states by itself: a [`GateSubject`] is the
//! gate plus two actions that move it, `press` (after which it holds a lone head: memory above
//! the latch, say) and `relieve` (after which it passes one), the [`FakeClock`] whose instants
//! the suite puts in each [`GateView`], and, when the gate has one, an `event` that changes its
//! answer without the clock moving (and so must call the installed wake-up).
//!
//! | rule | what it holds |
//! |---|---|
//! | [`names_are_stable_and_not_empty`] | the name and category a held job is reported with |
//! | [`a_relieved_gate_passes_a_lone_head`] | nothing pressing: the head goes on to the accounts |
//! | [`a_hold_names_a_later_instant_or_none`] | a hold's instant is after the view's (a past one would spin the evaluator) |
//! | [`check_changes_nothing`] | asking again with the same view gets the same answer |
//! | [`a_hold_ends_once_relieved_at_its_instant`] | relieved, the gate passes at the instant it named |
//! | [`an_event_calls_only_the_latest_wake`] | the last installed wake-up, and only it, hears of an event; `None` silences it |
//! | [`bookkeeping_takes_any_count`] | `passed`, `completed` and `holding` accept what a monitor may send, and change no answer by themselves |
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use admission_core::{Category, Gate, GateAnswer, GateView, WakeFn, WakeSlot};
//! use admission_testkit::gate_contract::{self, GateSubject};
//! use admission_testkit::FakeClock;
//!
//! /// Holds everyone while a flag is up, re-asking a second later.
//! #[derive(Default)]
//! struct Flag {
//!     up: AtomicBool,
//!     wake: WakeSlot,
//! }
//!
//! impl Gate for Flag {
//!     fn name(&self) -> &str { "flag" }
//!     fn category(&self) -> Category { Category::custom("flag") }
//!     fn check(&self, view: GateView) -> GateAnswer {
//!         if self.up.load(Ordering::SeqCst) {
//!             GateAnswer::Hold { until: Some(view.now().saturating_add(std::time::Duration::from_secs(1))) }
//!         } else {
//!             GateAnswer::Pass
//!         }
//!     }
//!     fn passed(&self, _view: GateView) {}
//!     fn completed(&self) {}
//!     fn on_change(&self, wake: Option<WakeFn>) { self.wake.install(wake) }
//! }
//!
//! gate_contract::run_all(|| {
//!     let flag = Arc::new(Flag::default());
//!     let (up, down) = (flag.clone(), flag.clone());
//!     GateSubject::new(flag, FakeClock::new())
//!         .press(move || up.up.store(true, Ordering::SeqCst))
//!         .relieve(move || down.up.store(false, Ordering::SeqCst))
//! });
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use admission_core::{Clock, Gate, GateAnswer, GateView, WakeFn};

use crate::FakeClock;

/// A gate under test, and how to move it.
#[non_exhaustive]
pub struct GateSubject {
    /// The gate, fresh.
    pub gate: Arc<dyn Gate>,
    /// The clock whose instants the suite puts in each view. The suite moves it forward between
    /// a change of state and the next question, so a gate that reads once per instant reads
    /// again.
    pub clock: FakeClock,
    /// After this, the gate holds a lone head.
    pub press: Box<dyn Fn()>,
    /// After this, the gate passes a lone head (at the instant its hold named, at the latest).
    pub relieve: Box<dyn Fn()>,
    /// An event that changes the gate's answer without the clock moving, if the gate has one; it
    /// must call the installed wake-up. `None` skips that rule.
    pub event: Option<Box<dyn Fn()>>,
}

impl GateSubject {
    /// A subject whose actions do nothing yet; set them with [`press`](GateSubject::press),
    /// [`relieve`](GateSubject::relieve) and [`event`](GateSubject::event).
    pub fn new(gate: Arc<dyn Gate>, clock: FakeClock) -> GateSubject {
        GateSubject {
            gate,
            clock,
            press: Box::new(|| {}),
            relieve: Box::new(|| {}),
            event: None,
        }
    }

    /// How to make the gate hold a lone head.
    pub fn press(mut self, press: impl Fn() + 'static) -> GateSubject {
        self.press = Box::new(press);
        self
    }

    /// How to make the gate pass a lone head again.
    pub fn relieve(mut self, relieve: impl Fn() + 'static) -> GateSubject {
        self.relieve = Box::new(relieve);
        self
    }

    /// An event that changes the gate's answer by itself (and calls the wake-up).
    pub fn event(mut self, event: impl Fn() + 'static) -> GateSubject {
        self.event = Some(Box::new(event));
        self
    }

    /// A lone head's view, a millisecond after the clock's present (which the view then is).
    fn lone_head(&self) -> GateView {
        self.clock.advance(Duration::from_millis(1));
        GateView::at(self.clock.now())
    }
}

/// A gate rule: a function of a subject factory.
pub type GateRule = fn(&dyn Fn() -> GateSubject);

/// Every rule, by name.
pub const RULES: &[(&str, GateRule)] = &[
    (
        "names_are_stable_and_not_empty",
        names_are_stable_and_not_empty,
    ),
    (
        "a_relieved_gate_passes_a_lone_head",
        a_relieved_gate_passes_a_lone_head,
    ),
    (
        "a_hold_names_a_later_instant_or_none",
        a_hold_names_a_later_instant_or_none,
    ),
    ("check_changes_nothing", check_changes_nothing),
    (
        "a_hold_ends_once_relieved_at_its_instant",
        a_hold_ends_once_relieved_at_its_instant,
    ),
    (
        "an_event_calls_only_the_latest_wake",
        an_event_calls_only_the_latest_wake,
    ),
    ("bookkeeping_takes_any_count", bookkeeping_takes_any_count),
];

/// Runs every rule against fresh subjects from `make`.
///
/// # Panics
///
/// At the first rule the gate breaks, naming it.
pub fn run_all(make: impl Fn() -> GateSubject) {
    for (_, rule) in RULES {
        rule(&make);
    }
}

fn fail(rule: &str, gate: &dyn Gate, what: String) -> ! {
    panic!("gate rule `{rule}` on gate `{}`: {what}", gate.name())
}

/// The name and category are not empty and do not change between calls: held jobs are reported
/// with them and their wait times keyed by the name.
///
/// # Panics
///
/// When either is empty or changes.
pub fn names_are_stable_and_not_empty(make: &dyn Fn() -> GateSubject) {
    let s = make();
    let gate = &*s.gate;
    let (name, category) = (gate.name().to_owned(), gate.category());
    if name.is_empty() || category.as_str().is_empty() {
        fail(
            "names_are_stable_and_not_empty",
            gate,
            format!("name {name:?}, category {category:?}"),
        );
    }
    (s.press)();
    let _ = gate.check(s.lone_head());
    if gate.name() != name || gate.category() != category {
        fail(
            "names_are_stable_and_not_empty",
            gate,
            format!(
                "was {name:?}/{category}, became {:?}/{}",
                gate.name(),
                gate.category()
            ),
        );
    }
}

/// Relieved, the gate lets a lone head through to the accounts.
///
/// # Panics
///
/// When it holds the head.
pub fn a_relieved_gate_passes_a_lone_head(make: &dyn Fn() -> GateSubject) {
    let s = make();
    (s.relieve)();
    let answer = s.gate.check(s.lone_head());
    if answer != GateAnswer::Pass {
        fail(
            "a_relieved_gate_passes_a_lone_head",
            &*s.gate,
            format!("answered {answer:?}"),
        );
    }
}

/// Pressed, the gate holds a lone head, and the instant it names to ask again is after the
/// view's (or there is none: only an event helps). An instant at or before the view's would have
/// the evaluator ask again at once, over and over.
///
/// # Panics
///
/// When the head passes, or the hold names an instant not after the view's.
pub fn a_hold_names_a_later_instant_or_none(make: &dyn Fn() -> GateSubject) {
    let s = make();
    (s.press)();
    let view = s.lone_head();
    match s.gate.check(view) {
        GateAnswer::Hold { until: None } => {}
        GateAnswer::Hold { until: Some(at) } if at > view.now() => {}
        other => fail(
            "a_hold_names_a_later_instant_or_none",
            &*s.gate,
            format!("pressed, a lone head at {:?} got {other:?}", view.now()),
        ),
    }
}

/// Asking again with the same view gets the same answer, pressed or relieved: a check is a
/// question, the monitor may ask it more than once per pass.
///
/// # Panics
///
/// When two answers to one view differ.
pub fn check_changes_nothing(make: &dyn Fn() -> GateSubject) {
    let s = make();
    for (state, action) in [("pressed", &s.press), ("relieved", &s.relieve)] {
        action();
        let view = s.lone_head();
        let first = s.gate.check(view);
        for _ in 0..4 {
            let again = s.gate.check(view);
            if again != first {
                fail(
                    "check_changes_nothing",
                    &*s.gate,
                    format!("{state}: {first:?}, then {again:?} for the same view"),
                );
            }
        }
    }
}

/// A hold ends: once relieved, the gate passes a lone head asked at the instant its hold named
/// (or at once, for a hold that named none).
///
/// # Panics
///
/// When the head is still held.
pub fn a_hold_ends_once_relieved_at_its_instant(make: &dyn Fn() -> GateSubject) {
    let s = make();
    (s.press)();
    let view = s.lone_head();
    let until = match s.gate.check(view) {
        GateAnswer::Hold { until } => until,
        GateAnswer::Pass => fail(
            "a_hold_ends_once_relieved_at_its_instant",
            &*s.gate,
            "pressed, it passed a lone head".to_owned(),
        ),
    };
    (s.relieve)();
    if let Some(at) = until {
        s.clock.advance(at.saturating_duration_since(s.clock.now()));
    }
    let mut later = s.lone_head();
    if let Some(at) = until {
        later = GateView::at(later.now().max(at));
    }
    let answer = s.gate.check(later);
    if answer != GateAnswer::Pass {
        fail(
            "a_hold_ends_once_relieved_at_its_instant",
            &*s.gate,
            format!(
                "held until {until:?}, relieved, asked at {:?}: {answer:?}",
                later.now()
            ),
        );
    }
}

/// An event that changes the gate's answer calls the wake-up installed last, and only it;
/// `on_change(None)` silences it. Skipped for a gate without such an event.
///
/// # Panics
///
/// When the latest wake-up is not called, an earlier one is, or a cleared slot still calls.
pub fn an_event_calls_only_the_latest_wake(make: &dyn Fn() -> GateSubject) {
    let s = make();
    let Some(event) = &s.event else {
        return;
    };
    let counter = |n: &Arc<AtomicUsize>| -> WakeFn {
        let n = n.clone();
        Arc::new(move || {
            n.fetch_add(1, Ordering::SeqCst);
        })
    };
    let (first, latest) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    s.gate.on_change(Some(counter(&first)));
    s.gate.on_change(Some(counter(&latest)));
    (s.press)();
    let _ = s.gate.check(s.lone_head());
    event();
    let (f, l) = (first.load(Ordering::SeqCst), latest.load(Ordering::SeqCst));
    if f != 0 || l == 0 {
        fail(
            "an_event_calls_only_the_latest_wake",
            &*s.gate,
            format!("the earlier wake-up was called {f} times, the latest {l} times"),
        );
    }

    let s = make();
    let Some(event) = &s.event else {
        return;
    };
    let silenced = Arc::new(AtomicUsize::new(0));
    s.gate.on_change(Some(counter(&silenced)));
    s.gate.on_change(None);
    (s.press)();
    let _ = s.gate.check(s.lone_head());
    event();
    let n = silenced.load(Ordering::SeqCst);
    if n != 0 {
        fail(
            "an_event_calls_only_the_latest_wake",
            &*s.gate,
            format!("a cleared wake-up was called {n} times"),
        );
    }
}

/// `passed`, `completed` and `holding` take whatever a monitor may send (a completion with
/// nobody passed, a count of zero or of `usize::MAX`) without panicking, and a relieved gate
/// still passes a lone head afterwards.
///
/// # Panics
///
/// When a call panics, or the relieved gate then holds the head.
pub fn bookkeeping_takes_any_count(make: &dyn Fn() -> GateSubject) {
    let s = make();
    (s.relieve)();
    s.gate.completed();
    s.gate.holding(0);
    s.gate.holding(usize::MAX);
    s.gate.holding(0);
    let view = s.lone_head();
    s.gate.passed(view);
    s.gate.completed();
    let answer = s.gate.check(s.lone_head());
    if answer != GateAnswer::Pass {
        fail(
            "bookkeeping_takes_any_count",
            &*s.gate,
            format!("relieved, after the bookkeeping, a lone head got {answer:?}"),
        );
    }
}
