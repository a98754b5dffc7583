//! The gate slot: one distinguished limit that every demand with entries meets before any account.
//!
//! The memory pressure gate fills it (see `admission-accounts`). Unlike an account, a gate has no
//! amounts: it decides who may leave the line now, from what it measures and from how many
//! waiters it is already holding, and it hears of each grant it let through and of each completion.

use std::fmt;

use crate::account::Category;
use crate::clock::{Instant, WakeFn};

/// Where the asking waiter stands, as the gate sees it.
///
/// The monitor builds one for every attempt; a gate reads it. Its fields are private, so that
/// the monitor may tell a gate more later without breaking it; a test of a gate builds views
/// with [`GateView::at`] and the `with_` methods.
///
/// # Examples
///
/// ```
/// use admission_core::{GateView, Instant};
///
/// let now = Instant::from_nanos(5);
/// let lone = GateView::at(now);
/// assert!(lone.is_head() && lone.held() == 0 && !lone.was_on_gate());
/// let third = GateView::at(now).behind_the_head().with_held(2).with_on_gate(true);
/// assert_eq!((third.is_head(), third.held(), third.was_on_gate()), (false, 2, true));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GateView {
    head: bool,
    held: usize,
    now: Instant,
    on_gate: bool,
    elsewhere: bool,
}

impl GateView {
    /// A lone head at `now`: the first asker of an empty line, never held before, nobody on
    /// the gate's line.
    pub const fn at(now: Instant) -> GateView {
        GateView {
            head: true,
            held: 0,
            now,
            on_gate: false,
            elsewhere: false,
        }
    }

    /// The same view of an asker behind the head.
    pub const fn behind_the_head(self) -> GateView {
        GateView {
            head: false,
            ..self
        }
    }

    /// The same view with `held` waiters on the gate's line, the asker excluded.
    pub const fn with_held(self, held: usize) -> GateView {
        GateView { held, ..self }
    }

    /// The same view of an asker the gate held (`true`) or not at its previous attempt.
    pub const fn with_on_gate(self, on_gate: bool) -> GateView {
        GateView { on_gate, ..self }
    }

    /// The same view of an asker an account held (`true`) or not at its previous attempt.
    pub const fn with_elsewhere(self, elsewhere: bool) -> GateView {
        GateView { elsewhere, ..self }
    }

    /// True when the asker is the head of the line (or arrives to an empty line).
    pub const fn is_head(&self) -> bool {
        self.head
    }

    /// How many waiters the gate is holding right now, the asker excluded.
    pub const fn held(&self) -> usize {
        self.held
    }

    /// The instant the monitor read for this attempt.
    pub const fn now(&self) -> Instant {
        self.now
    }

    /// True when the gate held this asker at its previous attempt: it is on the gate's own line.
    pub const fn was_on_gate(&self) -> bool {
        self.on_gate
    }

    /// True when an account, not the gate, held this asker at its previous attempt: the gate
    /// let it through before, and releasing it is that account's business.
    pub const fn was_held_elsewhere(&self) -> bool {
        self.elsewhere
    }
}

/// The gate's answer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GateAnswer {
    /// The asker may proceed to the accounts.
    Pass,
    /// The asker waits; `until` is when the gate's answer may change by time alone (`None`: only
    /// an event such as a completion can change it).
    Hold {
        /// The instant to re-ask at.
        until: Option<Instant>,
    },
}

/// A limit consulted before every account, at every attempt, for every demand with entries.
///
/// # Panics
///
/// A gate is part of the monitor: a panic inside it is a defect that closes admission.
pub trait Gate: Send + Sync + 'static {
    /// The gate's name; it keys the wait time of a job held here.
    fn name(&self) -> &str;
    /// What kind of gate this is; a job held here is reported with it.
    fn category(&self) -> Category;
    /// May this waiter pass now? Changes nothing.
    fn check(&self, view: GateView) -> GateAnswer;
    /// A waiter the gate passed was granted its whole demand.
    fn passed(&self, view: GateView);
    /// A grant with entries was settled (released or rolled back): a job completed.
    fn completed(&self);
    /// Installs or clears the callback that wakes the monitor when the gate's answer may change.
    fn on_change(&self, wake: Option<WakeFn>);
    /// How many waiters the gate holds once a pass, a withdrawal or a stop has settled the line
    /// (zero when the line empties); it feeds a gate's status. The default ignores it.
    fn holding(&self, count: usize) {
        let _ = count;
    }
}

impl fmt::Debug for dyn Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}
