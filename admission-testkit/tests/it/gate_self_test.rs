//! The gate suite can fail: a gate with one planted flaw breaks the rule written for it, and the
//! same gate without a flaw passes every rule.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use admission_core::{Category, Gate, GateAnswer, GateView, WakeFn, WakeSlot};
use admission_testkit::FakeClock;
use admission_testkit::gate_contract::{self, GateSubject};
use parking_lot::Mutex;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Flaw {
    None,
    EmptyName,
    HoldsWhenRelieved,
    HoldsUntilNow,
    AlternatesAnswers,
    NeverLetsGo,
    WakeKeepsTheFirst,
    WakeNeverCleared,
    HoldingLatches,
}

/// Holds everyone while its flag is up, re-asking a second later; `stop` lowers the flag and
/// calls the wake-up.
struct Flawed {
    flaw: Flaw,
    up: AtomicBool,
    /// Set once pressed, for `NeverLetsGo`.
    ever_up: AtomicBool,
    checks: AtomicUsize,
    latched: AtomicBool,
    wake: WakeSlot,
    first_wake: Mutex<Option<WakeFn>>,
}

impl Flawed {
    fn new(flaw: Flaw) -> Arc<Flawed> {
        Arc::new(Flawed {
            flaw,
            up: AtomicBool::new(false),
            ever_up: AtomicBool::new(false),
            checks: AtomicUsize::new(0),
            latched: AtomicBool::new(false),
            wake: WakeSlot::new(),
            first_wake: Mutex::new(None),
        })
    }

    fn stop(&self) {
        self.up.store(false, Ordering::SeqCst);
        if let Some(first) = &*self.first_wake.lock() {
            first();
        }
        self.wake.notify();
    }
}

impl Gate for Flawed {
    fn name(&self) -> &str {
        if self.flaw == Flaw::EmptyName {
            ""
        } else {
            "flawed"
        }
    }
    fn category(&self) -> Category {
        Category::custom("flawed")
    }
    fn check(&self, view: GateView) -> GateAnswer {
        let n = self.checks.fetch_add(1, Ordering::SeqCst);
        let up = self.up.load(Ordering::SeqCst)
            || self.latched.load(Ordering::SeqCst)
            || self.flaw == Flaw::HoldsWhenRelieved
            || (self.flaw == Flaw::NeverLetsGo && self.ever_up.load(Ordering::SeqCst))
            || (self.flaw == Flaw::AlternatesAnswers && n % 2 == 1);
        if !up {
            return GateAnswer::Pass;
        }
        let until = match self.flaw {
            Flaw::HoldsUntilNow => view.now(),
            _ => view.now().saturating_add(Duration::from_secs(1)),
        };
        GateAnswer::Hold { until: Some(until) }
    }
    fn passed(&self, _view: GateView) {}
    fn completed(&self) {}
    fn on_change(&self, wake: Option<WakeFn>) {
        match self.flaw {
            Flaw::WakeKeepsTheFirst => {
                let mut first = self.first_wake.lock();
                if first.is_none() {
                    *first = wake;
                }
            }
            Flaw::WakeNeverCleared if wake.is_none() => {}
            _ => self.wake.install(wake),
        }
    }
    fn holding(&self, count: usize) {
        if self.flaw == Flaw::HoldingLatches && count == usize::MAX {
            self.latched.store(true, Ordering::SeqCst);
        }
    }
}

fn subject(flaw: Flaw) -> GateSubject {
    let gate = Flawed::new(flaw);
    let (up, down, stop) = (gate.clone(), gate.clone(), gate.clone());
    GateSubject::new(gate, FakeClock::new())
        .press(move || {
            up.up.store(true, Ordering::SeqCst);
            up.ever_up.store(true, Ordering::SeqCst);
        })
        .relieve(move || down.up.store(false, Ordering::SeqCst))
        .event(move || stop.stop())
}

/// Which rule each flaw is planted to break.
const PLANTED: &[(Flaw, &str)] = &[
    (Flaw::EmptyName, "names_are_stable_and_not_empty"),
    (
        Flaw::HoldsWhenRelieved,
        "a_relieved_gate_passes_a_lone_head",
    ),
    (Flaw::HoldsUntilNow, "a_hold_names_a_later_instant_or_none"),
    (Flaw::AlternatesAnswers, "check_changes_nothing"),
    (
        Flaw::NeverLetsGo,
        "a_hold_ends_once_relieved_at_its_instant",
    ),
    (
        Flaw::WakeKeepsTheFirst,
        "an_event_calls_only_the_latest_wake",
    ),
    (
        Flaw::WakeNeverCleared,
        "an_event_calls_only_the_latest_wake",
    ),
    (Flaw::HoldingLatches, "bookkeeping_takes_any_count"),
];

fn breaks(flaw: Flaw, rule: &str) -> bool {
    let (_, run) = gate_contract::RULES
        .iter()
        .find(|(name, _)| *name == rule)
        .expect("a planted rule exists");
    catch_unwind(AssertUnwindSafe(|| run(&|| subject(flaw)))).is_err()
}

#[test]
fn a_gate_without_a_flaw_passes_every_gate_rule() {
    gate_contract::run_all(|| subject(Flaw::None));
}

#[test]
fn each_planted_flaw_breaks_the_gate_rule_it_was_planted_for() {
    for (flaw, rule) in PLANTED {
        assert!(breaks(*flaw, rule), "{flaw:?} did not break `{rule}`");
    }
}

#[test]
fn every_gate_rule_is_broken_by_some_flaw() {
    for (rule, _) in gate_contract::RULES {
        assert!(
            PLANTED.iter().any(|(_, planted)| planted == rule),
            "no flaw is planted for `{rule}`"
        );
    }
    assert_eq!(gate_contract::RULES.len(), 7);
}
