//! The longest monitor-lock hold while one release grants a whole long line (issue 26's row
//! "longest monitor-lock hold during one release that grants 1,000,000 waiters").
//!
//! A started monitor on the system clock, one `CountingGate` of `n` permits all held by one
//! grant, `n` admits of one permit parked behind it (polled once each). A probe thread then calls
//! `try_admit` on the same monitor in a loop (with a line standing, each call takes the monitor
//! lock and answers `WouldWait`) and records how long each call took, while the main thread drops
//! the holder: its release grants every waiter. The longest probe call is the longest time an
//! admit waited for the lock behind the release's pass (plus the probe's own ~0.1 us); the
//! release's own time and the probes' p50/p99 are printed beside it, and before each run the
//! longest stall the machine itself imposes on a spinning thread (a virtual CPU preempted by its
//! host stalls whatever holds the lock at that moment).
//!
//! The monitor also times its own lock's holds (`MonitorBuilder::time_lock_holds`, two clock
//! readings per hold): the longest single hold during the release is the row's figure read
//! directly, beside the probe's view of it.
//!
//! ```text
//! cargo bench -p admission-benches --bench long_line            # 1,000,000 waiters
//! cargo bench -p admission-benches --bench long_line -- 100000  # another line length
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use admission_accounts::counting_gate::CountingGate;
use admission_core::{Amount, Demand, JobContext, Monitor, TryAdmitError};
use admission_testkit::monitor::park_waiters;
use hdrhistogram::Histogram;

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(1_000_000);
    for run in 1..=2 {
        hiccups();
        measure(n, run);
    }
}

/// What the machine itself does to a thread that holds nothing: the longest gap between two
/// clock reads of a thread spinning alone for a second (a preempted virtual CPU, an interrupt).
/// No critical section can be shorter than that, whatever the monitor does.
fn hiccups() {
    let started = Instant::now();
    let mut last = started;
    let mut longest = Duration::ZERO;
    let mut over_1ms = 0;
    while started.elapsed() < Duration::from_secs(1) {
        let now = Instant::now();
        let gap = now - last;
        longest = longest.max(gap);
        if gap > Duration::from_millis(1) {
            over_1ms += 1;
        }
        last = now;
    }
    println!(
        "long_line machine: a thread spinning alone for 1 s saw its longest gap of {:.3} ms ({over_1ms} over 1 ms)",
        longest.as_secs_f64() * 1e3
    );
}

fn measure(n: usize, run: usize) {
    let monitor = Monitor::builder().time_lock_holds().build();
    let gate = Arc::new(
        CountingGate::new("gate", n as u64, monitor.clock().clone()).expect("a positive capacity"),
    );
    let one = |units: u64| {
        let mut demand = Demand::new();
        demand.add(gate.clone(), Amount::units(units));
        demand
    };
    let holder = monitor
        .admit_blocking(one(n as u64), &JobContext::new("holder"), None)
        .expect("the whole gate is free");
    let started = Instant::now();
    let waiters = park_waiters(&monitor, n, || one(1));
    let parked_in = started.elapsed();
    let parking = monitor.take_lock_holds().expect("timed");
    assert_eq!(monitor.queue_size(), n);

    let monitor = Arc::new(monitor);
    let probing = Arc::new(AtomicBool::new(true));
    let probe = {
        let monitor = monitor.clone();
        let probing = probing.clone();
        let demand = one(1);
        thread::spawn(move || {
            let ctx = JobContext::new("probe");
            let mut calls = Histogram::<u64>::new(3).expect("a histogram");
            while probing.load(Ordering::Acquire) {
                let began = Instant::now();
                let answer = monitor.try_admit(&demand, &ctx);
                let took = began.elapsed();
                match answer {
                    Err(TryAdmitError::WouldWait { .. }) => {}
                    // The line emptied: the release is over.
                    Ok(_) => break,
                    Err(other) => panic!("the probe was refused: {other}"),
                }
                calls.record(took.as_nanos() as u64).expect("in range");
            }
            calls
        })
    };
    // Let the probe start taking the lock before the release.
    thread::sleep(Duration::from_millis(20));
    let _probe_started = monitor.take_lock_holds();
    let released = Instant::now();
    drop(holder);
    let release_took = released.elapsed();
    let holds = monitor.take_lock_holds().expect("timed");
    probing.store(false, Ordering::Release);
    let calls = probe.join().expect("the probe");
    assert_eq!(
        monitor.queue_size(),
        0,
        "the release granted the whole line"
    );
    let started = Instant::now();
    drop(waiters);
    let dropped_in = started.elapsed();
    println!(
        "long_line run {run}: {n} waiters (parked in {:.2} s, the longest lock hold of a park \
         {:.3} ms); the release that granted them all took {:.1} ms; \
         probe try_admit calls during it: {}, p50 {:.1} us, p99 {:.1} us, longest {:.3} ms; \
         the granted admits dropped in {:.2} s; \
         monitor lock held {} times during the release (the pass's batches and the probe's calls): \
         longest {:.3} ms, 99 % under {:.1} us, {:.1} ms in all",
        parked_in.as_secs_f64(),
        parking.longest.as_secs_f64() * 1e3,
        release_took.as_secs_f64() * 1e3,
        calls.len(),
        calls.value_at_quantile(0.5) as f64 / 1e3,
        calls.value_at_quantile(0.99) as f64 / 1e3,
        calls.max() as f64 / 1e6,
        dropped_in.as_secs_f64(),
        holds.count,
        holds.longest.as_secs_f64() * 1e3,
        holds.at_most(0.99).as_secs_f64() * 1e6,
        holds.total.as_secs_f64() * 1e3,
    );
}
