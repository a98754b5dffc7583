//! The core's integration tests: one binary, one module per part of the statement of record.
//!
//! Most rule tests drive a monitor that was never started, parking admissions with `poll_once` and
//! running passes with `pass_now`, so the order of events is exact. Tests of wake-ups run the
//! real evaluator thread on a `FakeClock`.

mod accounts;
mod admission;
mod clock_reads;
mod events;
mod gate;
mod grant_and_demand;
mod layering;
mod model;
mod never_fits;
mod never_overdraw;
mod reentrancy;
mod soak;
mod spans;
mod try_admit;
mod unlocked;
mod waiter_frame;

use std::sync::Arc;

use admission_core::{Account, AccountRef, Amount, Demand, Monitor};
use admission_events::Recorder;
use admission_testkit::FakeClock;
use admission_testkit::reference::{Meter, Permits};

pub(crate) fn permits(name: &str, capacity: u64) -> Arc<Permits> {
    Arc::new(Permits::new(name, capacity))
}

pub(crate) fn meter(name: &str, capacity: u64, per_second: u64, clock: &FakeClock) -> Arc<Meter> {
    Arc::new(Meter::new(name, capacity, per_second, clock.shared()))
}

/// A demand of `amount` units on each account, in order.
pub(crate) fn demand(parts: &[(AccountRef, u64)]) -> Demand {
    let mut demand = Demand::new();
    for (account, amount) in parts {
        demand.add(account.clone(), Amount::units(*amount));
    }
    demand
}

pub(crate) fn on<A: Account>(account: &Arc<A>) -> AccountRef {
    account.clone()
}

/// A monitor on a fake clock with a recorder installed; not started.
pub(crate) fn recorded() -> (Monitor, FakeClock, Arc<Recorder>) {
    let clock = FakeClock::new();
    let recorder = Arc::new(Recorder::new());
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .sink(recorder.clone())
        .build();
    (monitor, clock, recorder)
}

#[test]
fn the_public_handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Monitor>();
    send_sync::<admission_core::Grant>();
    send_sync::<admission_core::BorrowedGrant<'static>>();
    send_sync::<Demand>();
    send_sync::<admission_core::JobContext>();
    send_sync::<admission_core::AdmitError>();
    send::<admission_core::Admit>();
}
