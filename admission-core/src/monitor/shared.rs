//! [`Shared`]: what every handle, waiter and grant of one monitor shares, around the monitor lock.
//!
//! The transitions live in the files of their concept, each an `impl Shared` block: an arrival
//! (`arrival.rs`), a pass (`pass.rs`), a release (`release.rs`), leaving and stopping
//! (`lifecycle.rs`). Everything that touches the line runs under the one monitor lock
//! (`Shared::state`); events are collected while it is held and emitted after it is released,
//! and waiters are woken after it too (`outbox.rs`).

use std::sync::{Arc, Weak};

use crate::clock::{Timer, WakeFn};
use crate::error::AdmitError;
use crate::event::EventSink;
use crate::gate::Gate;
use crate::sync::{AtomicBool, MonitorLock, Ordering, fence};

use super::evaluator::Doorbell;
use super::line::{OwnLine, Phase, State};
use super::outbox::{Outbox, Sink};

pub(crate) struct Shared {
    pub(crate) clock: Arc<dyn Timer>,
    pub(crate) gate: Option<Arc<dyn Gate>>,
    /// The monitor lock. Never held while waking or emitting.
    pub(crate) state: OwnLine<MonitorLock<State>>,
    /// True while the phase is [`Phase::Open`]: the lock-free fast path's view of it. Cleared
    /// under the monitor lock, with the phase.
    pub(crate) open: AtomicBool,
    pub(crate) bell: Arc<Doorbell>,
    /// The callback installed in accounts' wake slots, the gate and the clock.
    pub(crate) kick: WakeFn,
    /// True for a monitor whose passes run only when asked (`test-util`): no evaluator unless
    /// started by hand.
    pub(crate) manual: bool,
    /// Waiters a pass visits per critical section before it lets others take the lock.
    pub(crate) pass_batch: usize,
    pub(crate) sink: Sink,
    /// This monitor itself, for a grant's hand-off pass (which may grant, and a grant holds
    /// its monitor): upgraded only when someone waits.
    pub(crate) me: Weak<Shared>,
}

impl Shared {
    pub(crate) fn new(
        clock: Arc<dyn Timer>,
        gate: Option<Arc<dyn Gate>>,
        sink: Option<Arc<dyn EventSink>>,
        manual: bool,
        pass_batch: usize,
        time_holds: bool,
    ) -> Arc<Shared> {
        let bell = Arc::new(Doorbell::new());
        let for_kick = bell.clone();
        let kick: WakeFn = Arc::new(move || for_kick.ring_if_waiting());
        bell.rung_by(&kick);
        if let Some(gate) = &gate {
            gate.on_change(Some(kick.clone()));
        }
        let shared = Arc::new_cyclic(|me| Shared {
            clock,
            gate,
            state: OwnLine(Self::lock(time_holds)),
            open: AtomicBool::new(true),
            bell,
            kick,
            manual,
            pass_batch,
            sink: Sink::new(sink),
            me: me.clone(),
        });
        shared.clock.subscribe(&shared.kick);
        shared
    }

    /// The monitor lock around an open monitor's empty line; its holds timed when asked (a test
    /// hook).
    fn lock(time_holds: bool) -> MonitorLock<State> {
        let lock = MonitorLock::new(State::new());
        #[cfg(any(test, feature = "test-util"))]
        if time_holds {
            return lock.timed();
        }
        let _ = time_holds;
        lock
    }

    /// An empty outbox for one critical section.
    pub(crate) fn outbox(&self) -> Outbox<'_> {
        Outbox::new(&*self.clock, &self.sink)
    }

    /// Delivers an outbox. Called with no lock held.
    pub(crate) fn deliver(&self, out: Outbox<'_>) {
        out.deliver(&self.sink);
    }

    /// Publishes how many waiters are parked. Under the monitor lock, which is the only place the
    /// count is written.
    pub(crate) fn publish_parked(&self, parked: usize) {
        self.bell.parked.store(parked, Ordering::SeqCst);
        // The parker's half of the Dekker pattern with a giver's `someone_waiting` (a fence, then
        // a load of `parked`): an account may answer the parker's ask with a plain atomic load
        // (a counting gate's "not now" is a failed compare-and-swap), and a sequentially
        // consistent store followed by a weaker load of another word does not order the two.
        fence(Ordering::SeqCst);
    }

    /// The error every admit gets in `phase`, `None` while open.
    pub(crate) fn phase_error(phase: &Phase) -> Option<AdmitError> {
        match phase {
            Phase::Open => None,
            Phase::Stopped => Some(AdmitError::Shutdown),
            Phase::Closed(cause) => Some(AdmitError::Closed {
                cause: cause.clone(),
            }),
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        matches!(self.state.lock().phase, Phase::Open)
    }

    /// The gate's name, as holds and events report it.
    pub(crate) fn gate_name(&self) -> &str {
        self.gate.as_ref().map_or("gate", |g| g.name())
    }

    /// Tells the gate how many waiters it holds after one left the line. Under the monitor lock.
    pub(crate) fn tell_gate_holding(&self, st: &State) {
        if let Some(gate) = &self.gate {
            gate.holding(st.on_gate());
        }
    }
}
