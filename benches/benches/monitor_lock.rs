//! The monitor's lock, for choosing between parking_lot's mutex (the default) and std's: ours
//! alone on the contended rows of the side-by-side table and on its uncontended gate row, with
//! what each cost the process ([`Usage`]: wall time, CPU time, context switches).
//!
//! The lock is chosen when `admission-core` is compiled (`--cfg admission_monitor_lock="std"`),
//! so one binary measures one lock. `cargo xtask lock-bench` builds this target twice, in two
//! target directories, and runs the two binaries alternately: the machine's slow and fast spells
//! then fall on both locks alike, which two runs minutes apart cannot promise.
//!
//! Rows ([`ROWS`]), each a warm-up workload and then `--workloads K` measured ones:
//!
//! - `contended_held`: 64 tasks x 10,000 admits of one permit of 8, each held across a
//!   `yield_now`, on two tokio workers (waiters park: the lock is fought over);
//! - `contended_no_await`: the same with nothing awaited while holding (two threads fight over
//!   the acquire path, nobody parks);
//! - `gate_try_admit`: one thread, `try_admit` + release of one permit of a plentiful gate,
//!   1,000,000 times: the lock-free fast path, which takes no monitor lock; it tells whether the
//!   two builds differ where the lock plays no part.
//!
//! ```text
//! monitor_lock --workloads K [--rounds R]   one JSON line per row: the lock, the row, the admits
//!                                           of one workload, and per workload (the mean of K)
//!                                           wall_ns, cpu_ns, voluntary and involuntary switches
//! cargo bench -p admission-benches --bench monitor_lock     the same with K = 1
//! ```
//!
//! `--rounds R` shortens the contended workloads (R admits per task instead of 10,000). Run
//! without `--bench` or `--workloads` (as `cargo test --benches` does), it makes one short
//! workload of each row to prove it works.

use std::sync::Arc;

use admission_accounts::CountingGate;
use admission_benches::Results;
use admission_benches::support::{self, try_admit_release};
use admission_benches::usage::Usage;
use admission_core::{Amount, Demand, JobContext, Monitor};

const TASKS: usize = 64;
const ROUNDS: usize = 10_000;
const PERMITS: u64 = 8;
/// Admits per workload of the uncontended row.
const ADMITS: usize = 1_000_000;

/// The rows, in the order they run.
const ROWS: [&str; 3] = ["contended_held", "contended_no_await", "gate_try_admit"];

/// The lock this binary's `admission-core` was built with (the cfg reaches every crate alike).
fn lock() -> &'static str {
    if cfg!(admission_monitor_lock = "std") {
        "std"
    } else {
        "parking_lot"
    }
}

/// The value after `flag`, parsed as a positive number.
fn arg(args: &[String], flag: &str) -> Option<usize> {
    let at = args.iter().position(|a| a == flag)?;
    let n = args.get(at + 1).and_then(|n| n.parse::<usize>().ok());
    Some(
        n.filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{flag} takes a positive number")),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workloads = arg(&args, "--workloads");
    let full = workloads.is_some() || args.iter().any(|a| a == "--bench");
    let (workloads, rounds, admits) = if full {
        let rounds = arg(&args, "--rounds").unwrap_or(ROUNDS);
        (workloads.unwrap_or(1), rounds, ADMITS)
    } else {
        (1, 100, 10_000)
    };
    let rt = support::two_workers();
    for row in ROWS {
        let (work, ops): (Box<dyn Fn() -> Usage>, usize) = match row {
            "contended_held" => (
                Box::new(|| support::contended_gate(&rt, PERMITS, TASKS, rounds, true)),
                TASKS * rounds,
            ),
            "contended_no_await" => (
                Box::new(|| support::contended_gate(&rt, PERMITS, TASKS, rounds, false)),
                TASKS * rounds,
            ),
            _ => (Box::new(|| uncontended(admits)), admits),
        };
        // One workload not counted: threads, allocator and caches warm.
        work();
        let total: Usage = (0..workloads).map(|_| work()).sum();
        let k = workloads as f64;
        let line = Results::new("monitor_lock")
            .text("lock", lock())
            .text("row", row)
            .number("admits", ops as f64)
            .number("workloads", k)
            .number("wall_ns", total.wall.as_nanos() as f64 / k)
            .number("cpu_ns", total.cpu.as_nanos() as f64 / k)
            .number("voluntary", total.voluntary_switches as f64 / k)
            .number("involuntary", total.involuntary_switches as f64 / k);
        println!("{}", line.to_json_line());
    }
    if !full {
        println!(
            "monitor_lock: smoke run on the {} lock (pass --bench or --workloads K)",
            lock()
        );
    }
}

/// `admits` times `try_admit` + release of one permit of a plentiful gate, on this thread,
/// through a started monitor (its evaluator idle); only the loop is measured.
fn uncontended(admits: usize) -> Usage {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let gate = CountingGate::on_system_clock("gate", 1_000_000).expect("a positive capacity");
    let demand = Demand::new().with(Arc::new(gate), Amount::ONE);
    let job = JobContext::new("bench");
    let ((), usage) = Usage::measure(|| {
        for _ in 0..admits {
            try_admit_release(&monitor, &demand, &job);
        }
    });
    monitor.stop();
    usage
}
