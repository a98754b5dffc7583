//! Context switches under contention, ours beside tokio's semaphore (issue 26's "the lock
//! itself": at 512 contending tasks the monitor made 21,779 context switches where tokio made
//! 115).
//!
//! `tasks` tasks on a two-worker tokio runtime each admit one permit of 8 and hold it across one
//! `yield_now`, `320,000 / tasks` times, through the monitor (a `CountingGate`) and through
//! tokio's `Semaphore`, alternately, three runs each. The process's context switches (voluntary
//! and not, summed over its threads from `/proc/self/task/*/status`) are counted around each
//! run, with its wall time. A fourth run of ours has the monitor time its lock's holds
//! (`MonitorBuilder::time_lock_holds`): holds per admit, their median and 99th percentile (to a
//! power of two), the longest, and the share of the run the lock was held.
//!
//! ```text
//! cargo bench -p admission-benches --bench switches
//! ```

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::counting_gate::CountingGate;
use admission_benches::support;
use admission_core::{Amount, Demand, Monitor};

const PERMITS: u64 = 8;
const ADMITS: usize = 320_000;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("a runtime");
    for tasks in [64, 512] {
        let rounds = ADMITS / tasks;
        for run in 1..=3 {
            let (ours, ours_switches) = counted(|| ours(&rt, tasks, rounds));
            let (peer, peer_switches) = counted(|| tokio_side(&rt, tasks, rounds));
            println!(
                "switches {tasks} tasks x {rounds} run {run}: ours {:.0} ms, {} switches \
                 ({} voluntary); tokio {:.0} ms, {} switches ({} voluntary); time {:.2}x, switches {:.1}x",
                ours.as_secs_f64() * 1e3,
                ours_switches.0 + ours_switches.1,
                ours_switches.0,
                peer.as_secs_f64() * 1e3,
                peer_switches.0 + peer_switches.1,
                peer_switches.0,
                ours.as_secs_f64() / peer.as_secs_f64(),
                (ours_switches.0 + ours_switches.1) as f64
                    / ((peer_switches.0 + peer_switches.1).max(1)) as f64,
            );
        }
        timed_holds(&rt, tasks, rounds);
    }
}

/// One more run of ours with the monitor timing its lock's holds (two clock readings per hold
/// more, so its time is not compared): how often and how long the lock is held per admit.
fn timed_holds(rt: &tokio::runtime::Runtime, tasks: usize, rounds: usize) {
    let monitor = Monitor::builder().time_lock_holds().build();
    monitor.start().expect("a fresh monitor starts");
    let gate = Arc::new(
        CountingGate::new("gate", PERMITS, monitor.clock().clone()).expect("a positive capacity"),
    );
    let demand = Demand::new().with(gate, Amount::ONE);
    let took = support::contended_admits(rt, &monitor, &demand, tasks, rounds, true).wall;
    let holds = monitor.take_lock_holds().expect("timed");
    monitor.stop();
    let admits = (tasks * rounds) as f64;
    println!(
        "switches {tasks} tasks x {rounds} lock holds: {:.2} per admit, 50 % under {:.2} us, \
         99 % under {:.2} us, longest {:.3} ms; held {:.0} % of the run's {:.0} ms",
        holds.count as f64 / admits,
        holds.at_most(0.5).as_secs_f64() * 1e6,
        holds.at_most(0.99).as_secs_f64() * 1e6,
        holds.longest.as_secs_f64() * 1e3,
        holds.total.as_secs_f64() / took.as_secs_f64() * 100.0,
        took.as_secs_f64() * 1e3,
    );
}

/// Runs `f`, returning its wall time and the process's (voluntary, involuntary) context
/// switches during it.
fn counted(f: impl FnOnce() -> Duration) -> (Duration, (u64, u64)) {
    let before = switches();
    let took = f();
    let after = switches();
    (
        took,
        (
            after.0.saturating_sub(before.0),
            after.1.saturating_sub(before.1),
        ),
    )
}

/// (voluntary, involuntary) context switches of every thread of this process so far. Threads
/// that ended take theirs with them; the runtime's workers and the monitor's evaluator live
/// through the whole bench.
fn switches() -> (u64, u64) {
    let mut total = (0, 0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return total;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            let mut parts = line.split_whitespace();
            match (
                parts.next(),
                parts.next().and_then(|n| n.parse::<u64>().ok()),
            ) {
                (Some("voluntary_ctxt_switches:"), Some(n)) => total.0 += n,
                (Some("nonvoluntary_ctxt_switches:"), Some(n)) => total.1 += n,
                _ => {}
            }
        }
    }
    total
}

fn ours(rt: &tokio::runtime::Runtime, tasks: usize, rounds: usize) -> Duration {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let gate = Arc::new(
        CountingGate::new("gate", PERMITS, monitor.clock().clone()).expect("a positive capacity"),
    );
    let demand = Demand::new().with(gate, Amount::ONE);
    let took = support::contended_admits(rt, &monitor, &demand, tasks, rounds, true).wall;
    monitor.stop();
    took
}

fn tokio_side(rt: &tokio::runtime::Runtime, tasks: usize, rounds: usize) -> Duration {
    support::contended_semaphore(rt, PERMITS as usize, tasks, rounds, true).wall
}
