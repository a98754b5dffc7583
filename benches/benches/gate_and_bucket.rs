//! Criterion benches of the counting gate and the token bucket, run beside `governor`'s
//! `check_n` (a direct rate limiter with a quota nothing can exhaust) as the baseline.
//!
//! - `single_thread`: a taking `ask` as the head + `give` of one unit, the `ask` alone, and the
//!   same pair on a frozen fake clock (the account's own cost without the OS clock read);
//!   `governor/check_n`.
//! - `two_threads`: two threads doing the same on one shared account; the time is per operation
//!   of one thread while the other competes.
//!
//! Budgets are so large that no bench drains them, so every take succeeds. Runs are kept short
//! (about a second of measurement per bench); `docs/benchmarks/2026-11-30-first-benchmarks.md` records a run and the ratios. The
//! accounts are called through `&dyn Account`, as the monitor calls them. Run with
//! `cargo bench -p admission-benches --bench gate_and_bucket`.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::counting_gate::CountingGate;
use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
use admission_benches::support::{self, check_n, on_two_threads};
use admission_core::{Account, Amount};
use admission_testkit::FakeClock;
use criterion::{Criterion, criterion_group, criterion_main};

/// A budget no bench can spend: tokens and requests per minute, permits.
const HUGE: u64 = 1 << 50;
/// One call: one token and one request (the gate reads only the first).
const ONE_CALL: Amount = Amount::pair(1, 1);

fn gate() -> CountingGate {
    CountingGate::on_system_clock("bench", HUGE).expect("a positive capacity")
}

fn bucket() -> TokenBucket {
    TokenBucket::on_system_clock("bench", TokenBucketConfig::new(HUGE, HUGE)).expect("budgets")
}

fn take_give(account: &dyn Account) {
    support::take_give(account, ONE_CALL);
}

fn take_only(account: &dyn Account) {
    support::take(account, ONE_CALL);
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("single_thread");
    let gate = gate();
    group.bench_function("counting_gate/take_give", |b| b.iter(|| take_give(&gate)));
    let gate_only = self::gate();
    group.bench_function("counting_gate/take_only", |b| {
        b.iter(|| take_only(&gate_only))
    });
    let frozen = CountingGate::new("bench", HUGE, FakeClock::new().shared()).expect("capacity");
    group.bench_function("counting_gate/take_give_frozen_clock", |b| {
        b.iter(|| take_give(&frozen))
    });

    let bucket = bucket();
    group.bench_function("token_bucket/take_give", |b| b.iter(|| take_give(&bucket)));
    let bucket_only = self::bucket();
    group.bench_function("token_bucket/take_only", |b| {
        b.iter(|| take_only(&bucket_only))
    });
    let frozen = TokenBucket::new(
        "bench",
        TokenBucketConfig::new(HUGE, HUGE),
        FakeClock::new().shared(),
    )
    .expect("budgets");
    group.bench_function("token_bucket/take_give_frozen_clock", |b| {
        b.iter(|| take_give(&frozen))
    });

    let limiter = support::governor_never_empty();
    group.bench_function("governor/check_n", |b| b.iter(|| check_n(&limiter)));
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads");
    let gate = Arc::new(gate());
    group.bench_function("counting_gate/take_give", |b| {
        b.iter_custom(|iters| on_two_threads(&gate, iters, |g| take_give(g)))
    });
    let bucket = Arc::new(bucket());
    group.bench_function("token_bucket/take_give", |b| {
        b.iter_custom(|iters| on_two_threads(&bucket, iters, |t| take_give(t)))
    });
    let limiter = Arc::new(support::governor_never_empty());
    group.bench_function("governor/check_n", |b| {
        b.iter_custom(|iters| on_two_threads(&limiter, iters, check_n))
    });
    group.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(40)
}

criterion_group! {
    name = benches;
    config = short();
    targets = single_thread, two_threads
}
criterion_main!(benches);
