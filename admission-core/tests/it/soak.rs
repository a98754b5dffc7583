//! A bounded soak of the started monitor: threads and tasks with random demands over shared
//! accounts, some cancelled, some abandoned, all on the real evaluator thread and system clock.
//!
//! What it holds: no account is ever held past its capacity, every admission ends (a lost
//! wake-up would surface as a timed-out admit, reported with its job), nothing is left held or
//! parked afterwards. Bounded in count (8 threads x 2,000 admissions, 4 tasks x 2,000, 24,000 in
//! all), and every wait but the deliberately short ones has a deadline far above what a healthy
//! run needs. Some jobs are cancelled from another thread, some futures abandoned after one poll,
//! some given a 1 ms timeout that they may meet.
//!
//! `ADMISSION_SOAK_ADMITS=N` runs about N admissions instead (`cargo xtask soak` runs 1,000,000 in
//! release and prints the tally).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::thread;
use std::time::Duration;

use admission_core::{AccountRef, AdmitError, Amount, Demand, JobContext, Monitor};
use admission_testkit::reference::Permits;

const THREADS: u64 = 8;
const TASKS: u64 = 4;
/// Rounds per worker: 2,000, or what `ADMISSION_SOAK_ADMITS` asks for in all.
fn rounds() -> u64 {
    std::env::var("ADMISSION_SOAK_ADMITS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(2_000, |total| total.div_ceil(THREADS + TASKS).max(1))
}
/// A deliberately short timeout, which a job may meet without anything being wrong.
const SHORT: Duration = Duration::from_millis(1);
/// Far above any healthy wait here: a wait this long means a waiter was never woken.
const DEADLINE: Duration = Duration::from_secs(20);
const CAPACITIES: [u64; 3] = [3, 2, 4];

/// The accounts, and how much of each the test itself counts as held.
struct World {
    monitor: Monitor,
    accounts: Vec<Arc<Permits>>,
    held: Vec<AtomicU64>,
    tally: Tally,
}

impl World {
    fn new() -> Arc<World> {
        let monitor = Monitor::new();
        monitor.start().unwrap();
        Arc::new(World {
            monitor,
            accounts: ["a", "b", "c"]
                .iter()
                .zip(CAPACITIES)
                .map(|(name, capacity)| Arc::new(Permits::new(*name, capacity)))
                .collect(),
            held: CAPACITIES.iter().map(|_| AtomicU64::new(0)).collect(),
            tally: Tally::default(),
        })
    }

    /// A demand drawn from `seed`: one to three accounts, each at most its capacity.
    fn demand(&self, seed: u64) -> (Demand, Vec<(usize, u64)>) {
        let mut demand = Demand::new();
        let mut parts = Vec::new();
        for (i, account) in self.accounts.iter().enumerate() {
            let pick = (seed >> (i * 8)) & 0xff;
            if pick.is_multiple_of(3) {
                continue;
            }
            let amount = 1 + pick % CAPACITIES[i];
            let account: AccountRef = account.clone();
            demand.add(account, Amount::units(amount));
            parts.push((i, amount));
        }
        if parts.is_empty() {
            let account: AccountRef = self.accounts[0].clone();
            demand.add(account, Amount::ONE);
            parts.push((0, 1));
        }
        (demand, parts)
    }

    /// Counts a grant's amounts as held and checks every account stays within its capacity.
    fn hold(&self, parts: &[(usize, u64)]) {
        for &(i, amount) in parts {
            let now = self.held[i].fetch_add(amount, Ordering::SeqCst) + amount;
            assert!(
                now <= CAPACITIES[i],
                "account {i} held {now} of {}",
                CAPACITIES[i]
            );
        }
    }

    fn unhold(&self, parts: &[(usize, u64)]) {
        for &(i, amount) in parts {
            self.held[i].fetch_sub(amount, Ordering::SeqCst);
        }
    }
}

/// splitmix64: the seeds of the demands, deterministic per worker.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How the admissions ended, tallied for the soak's report.
#[derive(Default)]
struct Tally {
    granted: AtomicU64,
    cancelled: AtomicU64,
    timed_out: AtomicU64,
    abandoned: AtomicU64,
}

fn ended_well(
    outcome: &Result<admission_core::Grant, AdmitError>,
    job: &str,
    short: bool,
    tally: &Tally,
) {
    match outcome {
        Ok(_) => tally.granted.fetch_add(1, Ordering::Relaxed),
        Err(AdmitError::Cancelled { .. }) => tally.cancelled.fetch_add(1, Ordering::Relaxed),
        Err(AdmitError::TimedOut { .. }) if short => {
            tally.timed_out.fetch_add(1, Ordering::Relaxed)
        }
        Err(error) => panic!("{job} ended with {error} (a timeout here is a waiter nobody woke)"),
    };
}

#[test]
fn threads_and_tasks_on_shared_accounts_never_overdraw_and_all_finish() {
    let world = World::new();
    let rounds = rounds();
    let started = std::time::Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let world = world.clone();
            thread::spawn(move || {
                let mut seed = t;
                for round in 0..rounds {
                    let (demand, parts) = world.demand(next(&mut seed));
                    let job = format!("thread {t} round {round}");
                    let ctx = JobContext::new(job.clone());
                    // Every tenth job is cancelled from another thread while it may be waiting.
                    let canceller = round.is_multiple_of(10).then(|| {
                        let ctx = ctx.clone();
                        thread::spawn(move || {
                            thread::yield_now();
                            ctx.cancel();
                        })
                    });
                    let short = round % 13 == 5;
                    let deadline = if short { SHORT } else { DEADLINE };
                    let outcome = world.monitor.admit_blocking(demand, &ctx, Some(deadline));
                    ended_well(&outcome, &job, short, &world.tally);
                    if let Ok(grant) = outcome {
                        world.hold(&parts);
                        thread::yield_now();
                        world.unhold(&parts);
                        drop(grant);
                    }
                    if let Some(canceller) = canceller {
                        canceller.join().unwrap();
                    }
                }
            })
        })
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let world = world.clone();
            runtime.spawn(async move {
                let mut seed = 1_000 + t;
                for round in 0..rounds {
                    let (demand, parts) = world.demand(next(&mut seed));
                    let job = format!("task {t} round {round}");
                    let ctx = JobContext::new(job.clone());
                    let short = round % 13 == 5;
                    let deadline = if short { SHORT } else { DEADLINE };
                    let mut admit = Box::pin(world.monitor.admit(demand, &ctx, Some(deadline)));
                    if round.is_multiple_of(7) {
                        // Abandoned after one poll: whatever it got must come back.
                        let polled = std::future::poll_fn(|cx: &mut Context<'_>| {
                            Poll::Ready(admit.as_mut().poll(cx))
                        })
                        .await;
                        match polled {
                            Poll::Ready(outcome) => ended_well(&outcome, &job, short, &world.tally),
                            Poll::Pending => {
                                world.tally.abandoned.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        drop(admit);
                        continue;
                    }
                    let outcome = admit.await;
                    ended_well(&outcome, &job, short, &world.tally);
                    if let Ok(grant) = outcome {
                        world.hold(&parts);
                        tokio::task::yield_now().await;
                        world.unhold(&parts);
                        drop(grant);
                    }
                }
            })
        })
        .collect();

    for thread in threads {
        thread.join().expect("a soak thread failed");
    }
    runtime.block_on(async {
        for task in tasks {
            task.await.expect("a soak task failed");
        }
    });

    let tally = &world.tally;
    let count = |n: &AtomicU64| n.load(Ordering::Relaxed);
    let ended = count(&tally.granted)
        + count(&tally.cancelled)
        + count(&tally.timed_out)
        + count(&tally.abandoned);
    println!(
        "soak: {ended} admissions in {:.1} s: {} granted, {} cancelled, {} timed out (1 ms), {} abandoned pending; 0 hung, 0 units leaked",
        started.elapsed().as_secs_f64(),
        count(&tally.granted),
        count(&tally.cancelled),
        count(&tally.timed_out),
        count(&tally.abandoned)
    );
    assert_eq!(
        ended,
        (THREADS + TASKS) * rounds,
        "every admission ended once"
    );
    assert_eq!(world.monitor.queue_size(), 0, "someone is still parked");
    for (account, capacity) in world.accounts.iter().zip(CAPACITIES) {
        assert_eq!(
            account.available(),
            capacity,
            "a permit of {account:?} leaked"
        );
    }
    world.monitor.stop();
}
