//! The evaluator: the one thread that runs a pass whenever the doorbell rings or a computed
//! deadline comes due.
//!
//! It starts with the first waiter that parks (or at [`Monitor::start`](crate::Monitor::start)),
//! so no parked waiter ever depends on a pass that nobody runs: a monitor that grants everything
//! inline never spawns it, and one that makes anyone wait always has it.

use std::sync::Arc;

use crate::error::StartError;
use crate::sync::thread;

use super::pass::Scope;
use super::shared::{Phase, Shared, State};

impl Shared {
    /// [`Monitor::start`](crate::Monitor::start): starts the evaluator if it is not running,
    /// in every monitor (one with manual passes too: a test may want its real thread).
    pub(crate) fn start(self: &Arc<Shared>) -> Result<(), StartError> {
        let mut st = self.state.lock();
        self.spawn_evaluator(&mut st)
    }

    /// Makes sure a waiter about to park has an evaluator to serve its deadline: starts it
    /// unless it runs or the monitor's passes are manual (`test-util`). Under the monitor lock.
    pub(crate) fn ensure_evaluator(self: &Arc<Shared>, st: &mut State) -> Result<(), StartError> {
        if self.manual {
            return Ok(());
        }
        self.spawn_evaluator(st)
    }

    fn spawn_evaluator(self: &Arc<Shared>, st: &mut State) -> Result<(), StartError> {
        if !matches!(st.phase, Phase::Open) {
            return Err(StartError::Stopped);
        }
        if st.evaluator.is_some() {
            return Ok(());
        }
        let shared = self.clone();
        let handle = thread::spawn("admission-evaluator", move || shared.run_evaluator())
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        let id = handle.thread().id();
        st.evaluator = Some((handle, id));
        Ok(())
    }

    /// The evaluator thread's body: pass, then sleep until rung or until the pass's wake-up.
    fn run_evaluator(self: Arc<Shared>) {
        loop {
            self.bell.answer();
            let mut out = self.outbox();
            let wake = self.pass_guarded(&mut out, Scope::Full);
            self.deliver(out);
            if !self.is_open() {
                return;
            }
            self.bell.sleep(&*self.clock, wake);
        }
    }
}
