//! A release that hands its permit to a parked waiter allocates nothing, on the releasing thread
//! or the waiter's: the pass's bookkeeping (the accounts it touched, the waiters leaving, whom to
//! wake) and the grant's record of what held the waiter stay in place for the common case of
//! one account and one waiter granted. Counted by dhat's allocator, in a test binary of its own
//! holding this one test, so that nothing else allocates while it counts.

use std::pin::Pin;
use std::sync::Arc;

use admission_core::{AccountRef, Admit, Amount, Demand, JobContext, Monitor};
use admission_testkit::monitor::poll_once;
use admission_testkit::reference::Permits;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

const WAITERS: usize = 100;

#[test]
fn a_release_that_hands_its_permit_to_a_parked_waiter_allocates_nothing() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let monitor = Monitor::builder().manual_passes().build();
    let gate = Arc::new(Permits::new("gate", 1));
    let demand = Demand::new().with(gate.clone() as AccountRef, Amount::ONE);
    let contexts: Vec<JobContext> = (0..WAITERS)
        .map(|i| JobContext::new(format!("waiter-{i}")))
        .collect();
    let mut parked: Vec<Pin<Box<Admit>>> = contexts
        .iter()
        .map(|ctx| Box::pin(monitor.admit(demand.clone(), ctx, None)))
        .collect();
    let mut holder = Some(
        monitor
            .admit_blocking(demand.clone(), &JobContext::new("holder"), None)
            .expect("the permit is free"),
    );
    for admit in &mut parked {
        assert!(
            poll_once(admit).is_none(),
            "every waiter parks behind the holder"
        );
    }
    assert_eq!(monitor.queue_size(), WAITERS);

    let before = dhat::HeapStats::get();
    // Each release hands the one permit to the next waiter, which takes its grant from its
    // future and releases it in turn.
    for admit in &mut parked {
        drop(holder.take());
        let grant = poll_once(admit)
            .expect("the hand-off granted the next waiter")
            .expect("granted, not refused");
        assert_eq!(gate.available(), 0);
        holder = Some(grant);
    }
    let after = dhat::HeapStats::get();
    drop(holder);

    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(gate.available(), 1);
    dhat::assert_eq!(
        after.total_blocks - before.total_blocks,
        0,
        "allocations made by {WAITERS} hand-offs"
    );
}
