//! The two paths issue 38 counts files on, run once each for `cargo xtask paths` to measure under
//! callgrind: a parked `admit_blocking` (the call parks behind the holder of the only permit and
//! returns the grant a release on another thread hands it) and the release that wakes it (dropping
//! the holder's `Grant` while that one waiter is parked).
//!
//! Each path runs inside a function of its own, `parked_admit` (on the waiter's thread) and
//! `waking_release` (on the holder's), which callgrind's `--toggle-collect` turns collection on
//! for; nothing else is counted. A first round runs the same steps through `warm_admit` and
//! `warm_release` (same bodies, other names, so not collected) on the same two threads and the
//! same monitor, so the one-time work (the evaluator thread's start, tracing's callsite
//! registration, each thread's first use of its thread-locals) is done before the measured round.
//! Built in the dev profile (no optimisation, so nothing of the core is inlined away).
//!
//! Run it alone with `cargo run -p admission-testkit --example paths`: it prints what each round
//! got, and exits non-zero if the waiter was not granted.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use admission_core::{AdmitError, Amount, Demand, Grant, JobContext, Monitor};
use admission_testkit::reference::Permits;

/// The measured parked admit: parks behind the holder, returns the grant it is handed.
#[inline(never)]
fn parked_admit(monitor: &Monitor, demand: Demand, job: &JobContext) -> Result<Grant, AdmitError> {
    monitor.admit_blocking(demand, job, None)
}

/// The measured waking release: gives the permit back while one waiter is parked for it.
#[inline(never)]
fn waking_release(grant: Grant) {
    drop(grant);
}

/// [`parked_admit`] under another name: the warm-up round, not collected.
#[inline(never)]
fn warm_admit(monitor: &Monitor, demand: Demand, job: &JobContext) -> Result<Grant, AdmitError> {
    monitor.admit_blocking(demand, job, None)
}

/// [`waking_release`] under another name: the warm-up round, not collected.
#[inline(never)]
fn warm_release(grant: Grant) {
    drop(grant);
}

/// One round's pair of paths.
#[derive(Clone, Copy)]
struct Round {
    name: &'static str,
    admit: fn(&Monitor, Demand, &JobContext) -> Result<Grant, AdmitError>,
    release: fn(Grant),
}

const ROUNDS: [Round; 2] = [
    Round {
        name: "warm-up",
        admit: warm_admit,
        release: warm_release,
    },
    Round {
        name: "measured",
        admit: parked_admit,
        release: waking_release,
    },
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let monitor = Monitor::new();
    let permits = Arc::new(Permits::new("permit", 1));
    let demand = Demand::new().with(permits.clone(), Amount::ONE);

    // The waiter (thread B): one admit per round it is sent, reporting whether it was granted.
    let (rounds, to_waiter) = mpsc::channel::<(Round, Demand, JobContext)>();
    let (granted, from_waiter) = mpsc::channel::<Result<(), AdmitError>>();
    let waiter = {
        let monitor = monitor.clone();
        thread::Builder::new()
            .name("waiter".into())
            .spawn(move || {
                for (round, demand, job) in to_waiter {
                    let outcome = (round.admit)(&monitor, demand, &job);
                    // The grant is given back here, outside the measured call.
                    let _ = granted.send(outcome.map(drop));
                }
            })?
    };

    // The holder (this thread, A).
    for round in ROUNDS {
        let held = monitor.admit_blocking(demand.clone(), &JobContext::new("holder"), None)?;
        rounds.send((round, demand.clone(), JobContext::new("waiter")))?;
        while monitor.queue_size() != 1 {
            thread::sleep(Duration::from_millis(1));
        }
        // Parked in the line is not yet asleep on its thread: leave it time to get there, so
        // the release wakes a sleeping thread, as the path is meant.
        thread::sleep(Duration::from_millis(50));
        (round.release)(held);
        from_waiter.recv()??;
        println!(
            "paths: {} round: the waiter was granted; {} parked, {} permit in use",
            round.name,
            monitor.queue_size(),
            permits.in_use()
        );
    }
    drop(rounds);
    waiter.join().map_err(|_| "the waiter thread panicked")?;
    Ok(())
}
