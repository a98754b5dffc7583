//! Criterion benches of the elastic window, run beside `governor`'s `check_n` (a direct rate
//! limiter with a quota nothing can exhaust) as the baseline, in the same run.
//!
//! - `elastic_window_single_thread`: a taking `ask` as the head + `give` of one request on the
//!   system clock and on a frozen fake clock (the window's own cost without the OS clock read);
//!   `governor/check_n`.
//! - `elastic_window_two_threads`: two threads doing the same on one shared window (or one shared
//!   governor limiter); the time is per operation of one thread while the other competes.
//!
//! Only take + `give` pairs are measured: a take that is given back leaves the log empty,
//! so the window never fills and the log never grows however many iterations criterion runs.
//! Runs are kept short (two seconds of measurement per bench). Run with
//! `cargo bench -p admission-benches --bench elastic_window`.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
use admission_benches::support::{self, check_n, on_two_threads};
use admission_core::{Amount, Clock, SystemClock};
use admission_testkit::FakeClock;
use criterion::{Criterion, criterion_group, criterion_main};

/// Requests per window no bench can spend.
const HUGE: u64 = 1 << 50;

/// A window that never fills, on `clock`.
fn window(clock: Arc<dyn Clock>) -> ElasticWindow {
    ElasticWindow::new(
        "bench",
        ElasticWindowConfig::new(HUGE, Duration::from_secs(60)),
        clock,
    )
    .expect("a valid configuration")
}

fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

fn take_give(window: &ElasticWindow) {
    support::take_give(window, Amount::ONE);
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("elastic_window_single_thread");
    let system = window(self::system());
    group.bench_function("elastic_window/take_give", |b| {
        b.iter(|| take_give(&system))
    });
    let frozen = window(FakeClock::new().shared());
    group.bench_function("elastic_window/take_give_frozen_clock", |b| {
        b.iter(|| take_give(&frozen))
    });
    // A take alone leaves its stamp: a one-millisecond window keeps the log short (stamps older
    // than the widest window, ten milliseconds at the default throttle cap, are pruned).
    let short = ElasticWindow::new(
        "bench",
        ElasticWindowConfig::new(HUGE, Duration::from_millis(1)),
        self::system(),
    )
    .expect("a valid configuration");
    group.bench_function("elastic_window/take_only", |b| {
        b.iter(|| support::take(&short, Amount::ONE))
    });
    let limiter = support::governor_never_empty();
    group.bench_function("governor/check_n", |b| b.iter(|| check_n(&limiter)));
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("elastic_window_two_threads");
    let system = Arc::new(window(self::system()));
    group.bench_function("elastic_window/take_give", |b| {
        b.iter_custom(|iters| on_two_threads(&system, iters, take_give))
    });
    let limiter = Arc::new(support::governor_never_empty());
    group.bench_function("governor/check_n", |b| {
        b.iter_custom(|iters| on_two_threads(&limiter, iters, check_n))
    });
    group.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = short();
    targets = single_thread, two_threads
}
criterion_main!(benches);
