//! What a parked waiter costs in memory (issue 15): the heap the monitor holds for each waiter
//! in its line, counted by `dhat`'s allocator, beside the size of the `Admit` future the caller
//! holds.
//!
//! The demands (their entries: an account reference and an amount each), the job contexts and
//! the futures themselves (pinned, each in a box of its own: the caller's storage, as a task's
//! would be) are all built before the count starts, so the figure is what parking adds to the
//! monitor's heap: the waiter's slot in the line's slab, which keeps its record (the demand's
//! handle, the job, the deadline, the holds, the waker) and later its decision. The total a
//! parked waiter costs adds the future's own size. Three demand shapes (1, 3 and 8 entries) show
//! what grows with the entries.
//!
//! Run with `cargo bench -p admission-benches --bench waiter_memory`; results in
//! `target/side-by-side/waiter_memory.json`.

use std::pin::Pin;
use std::sync::Arc;

use admission_benches::Results;
use admission_core::{AccountRef, Admit, Amount, Demand, JobContext, Monitor};
use admission_testkit::monitor::poll_once;
use admission_testkit::reference::Permits;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

const WAITERS: usize = 10_000;

fn heap() -> (u64, u64) {
    let stats = dhat::HeapStats::get();
    (stats.curr_bytes as u64, stats.curr_blocks as u64)
}

/// Parks [`WAITERS`] waiters demanding one unit of each of `entries` accounts (the last one is
/// held, so all park) and returns the heap bytes and blocks parking added per waiter.
fn per_waiter(entries: usize) -> (f64, f64) {
    let monitor = Monitor::builder().manual_passes().build();
    let accounts: Vec<Arc<Permits>> = (0..entries)
        .map(|i| Arc::new(Permits::new(format!("account-{i}"), 1_000_000)))
        .collect();
    let scarce = Arc::new(Permits::new("scarce", 1));
    let holder = monitor
        .admit_blocking(
            Demand::new().with(scarce.clone() as AccountRef, Amount::ONE),
            &JobContext::new("holder"),
            None,
        )
        .expect("the scarce permit is free");
    let demands: Vec<Demand> = (0..WAITERS)
        .map(|_| {
            let mut demand = Demand::new();
            for account in &accounts[..entries - 1] {
                demand.add(account.clone() as AccountRef, Amount::ONE);
            }
            demand.add(scarce.clone() as AccountRef, Amount::ONE);
            demand
        })
        .collect();
    let contexts: Vec<JobContext> = (0..WAITERS)
        .map(|i| JobContext::new(format!("waiter-{i}")))
        .collect();
    // The futures are built (and pinned, each in a box of its own) before the count starts:
    // their storage is the caller's, as a task's or a stack frame's would be.
    let mut parked: Vec<Pin<Box<Admit>>> = demands
        .into_iter()
        .zip(&contexts)
        .map(|(demand, ctx)| Box::pin(monitor.admit(demand, ctx, None)))
        .collect();
    let (bytes_before, blocks_before) = heap();
    for admit in &mut parked {
        assert!(poll_once(admit).is_none(), "the waiter parks");
    }
    let (bytes_after, blocks_after) = heap();
    assert_eq!(monitor.queue_size(), WAITERS);
    drop(parked);
    drop(holder);
    let n = WAITERS as f64;
    (
        (bytes_after - bytes_before) as f64 / n,
        (blocks_after - blocks_before) as f64 / n,
    )
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let future = std::mem::size_of::<admission_core::Admit>();
    let mut results = Results::new("waiter_memory").number("admit_future_bytes", future as f64);
    println!("the Admit future the caller holds: {future} bytes (inline, not heap)");
    for entries in [1, 3, 8] {
        let (bytes, blocks) = per_waiter(entries);
        println!(
            "{entries} entries: the monitor holds {bytes:.1} heap bytes in {blocks:.2} allocations per parked waiter"
        );
        let total = bytes + future as f64;
        println!(
            "{entries} entries: {total:.1} bytes per parked waiter with the future the caller holds"
        );
        results = results
            .number(&format!("heap_bytes_per_waiter_{entries}_entries"), bytes)
            .number(&format!("total_bytes_per_waiter_{entries}_entries"), total)
            .number(&format!("allocations_per_waiter_{entries}_entries"), blocks);
    }
    match results.write() {
        Ok(path) => println!("wrote {}", path.display()),
        Err(error) => eprintln!("could not write results: {error}"),
    }
}
