//! The token bucket's lock in wall time, CPU time and context switches (issue 38: no busy wait in
//! library code unless a bench shows it winning in CPU time as well as in wall time, in the same
//! run).
//!
//! A run of this binary measures the lock `admission-accounts` was built with: `spin`'s
//! `SpinMutex` that yields in a loop while the lock is taken (the bucket's lock, never blocking),
//! or, built with `RUSTFLAGS='--cfg admission_bucket_lock="parking_lot"'`, parking_lot's `Mutex`
//! (which spins a few times, then blocks). The bucket's code is the same in both builds; only the
//! lock type differs (`cells.rs`, which quotes the run that chose the lock).
//! `benches/scripts/bucket_lock.sh` builds both, runs them in turn round after round (the order
//! swapped every round) and prints each lock's medians side by side:
//!
//! ```text
//! benches/scripts/bucket_lock.sh [ROUNDS]
//! ```
//!
//! One run is one round of three shapes, each on a fresh bucket that never runs dry (as row 1 of
//! BENCHMARKS.md: `u64::MAX / 4` tokens and requests a minute, on the system clock), each ask a
//! taking `Account::ask` of 1 token and 1 request as the head, through the trait object:
//! - `1_thread`: one thread makes 20,000,000 asks;
//! - `4_threads`: four threads make 5,000,000 asks each on one bucket, released together by a
//!   barrier. On a 2-CPU machine that is more threads than cores, so a thread is sometimes
//!   preempted while it holds the lock.
//! - `16_threads`: sixteen threads make 1,250,000 asks each on one bucket, the same way: eight
//!   threads a core on a 2-CPU machine, where a holder preempted mid-take is common and a lock
//!   that never blocks makes its waiters yield over and over until the holder runs again (the
//!   case a spin lock pays for).
//!
//! Each shape prints its wall time, the process's CPU time over it (user + system, from
//! `getrusage(RUSAGE_SELF)`, which counts every thread of the process, ended ones included) and
//! the process's context switches over it (voluntary + involuntary, from the same call). A short
//! warm-up of 1,000,000 asks runs first and is not counted.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use admission_accounts::TokenBucket;
use admission_accounts::token_bucket::TokenBucketConfig;
use admission_benches::usage::Usage;
use admission_core::{AccountRef, Amount, Ask};

/// A per-minute budget no run can spend: tokens and requests alike.
const NEVER_DRY: u64 = u64::MAX / 4;
/// Asks in every shape: by the one thread, or by all the threads together.
const ASKS: u64 = 20_000_000;
/// Asks before anything is counted.
const WARM_UP: u64 = 1_000_000;

/// The lock this binary's bucket was built with.
const LOCK: &str = if cfg!(admission_bucket_lock = "parking_lot") {
    "parking_lot"
} else {
    "spin"
};

fn main() {
    asks(&bucket(), WARM_UP);
    report("1_thread", ASKS, measured(one_thread));
    report("4_threads", ASKS, measured(|| threads(4)));
    report("16_threads", ASKS, measured(|| threads(16)));
}

/// A full bucket that no run empties.
fn bucket() -> AccountRef {
    Arc::new(
        TokenBucket::on_system_clock("bench", TokenBucketConfig::new(NEVER_DRY, NEVER_DRY))
            .expect("a valid config"),
    )
}

/// `n` taking asks of 1 token and 1 request; every one must be taken.
fn asks(bucket: &AccountRef, n: u64) {
    let one = Amount::pair(1, 1);
    let mut taken = 0u64;
    for _ in 0..n {
        taken += u64::from(black_box(bucket.ask(black_box(one), Ask::HEAD).is_taken()));
    }
    assert_eq!(taken, n, "a bucket that never runs dry refused an ask");
}

/// One thread, [`ASKS`] asks; the wall time of the asks alone.
fn one_thread() -> Duration {
    let bucket = bucket();
    let start = Instant::now();
    asks(&bucket, ASKS);
    start.elapsed()
}

/// `n` threads on one bucket, [`ASKS`] asks in all; the wall time from the barrier's release to
/// the last thread's end. The threads are started before the measurement and wait at the
/// barrier.
fn threads(n: u64) -> Duration {
    let bucket = bucket();
    let go = Arc::new(Barrier::new(n as usize + 1));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (bucket, go) = (bucket.clone(), go.clone());
            thread::spawn(move || {
                go.wait();
                asks(&bucket, ASKS / n);
            })
        })
        .collect();
    let start = Instant::now();
    go.wait();
    for thread in threads {
        thread.join().expect("an asking thread panicked");
    }
    start.elapsed()
}

/// What a shape cost: its wall time, and the process's usage over it.
struct Cost {
    wall: Duration,
    usage: Usage,
}

/// Runs `shape` between two readings of the process's usage.
fn measured(shape: impl FnOnce() -> Duration) -> Cost {
    let (wall, usage) = Usage::measure(shape);
    Cost { wall, usage }
}

fn report(shape: &str, asks: u64, cost: Cost) {
    let Cost { wall, usage } = cost;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let cpu = usage.cpu;
    println!(
        "bucket_lock lock={LOCK} shape={shape} asks={asks} wall_ms={:.1} cpu_ms={:.1} \
         switches={} voluntary={} involuntary={} \
         wall_ns_per_ask={:.1} cpu_ns_per_ask={:.1}",
        ms(wall),
        ms(cpu),
        usage.switches(),
        usage.voluntary_switches,
        usage.involuntary_switches,
        wall.as_nanos() as f64 / asks as f64,
        cpu.as_nanos() as f64 / asks as f64,
    );
}
