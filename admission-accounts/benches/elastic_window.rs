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
//! Runs are kept short (two seconds of measurement per bench).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
use admission_core::{Account, Amount, Answer, Ask, Clock, SystemClock};
use admission_testkit::FakeClock;
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

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

fn governor() -> DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX))
}

fn take_give(window: &ElasticWindow) {
    let taken = window.ask(black_box(Amount::ONE), Ask::HEAD);
    assert!(
        matches!(taken, Answer::Taken),
        "the bench window never fills"
    );
    window.give(black_box(Amount::ONE));
}

fn check_n(limiter: &DefaultDirectRateLimiter) {
    let checked = limiter.check_n(black_box(NonZeroU32::MIN));
    assert!(
        matches!(checked, Ok(Ok(()))),
        "the bench quota never runs out"
    );
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
        b.iter(|| {
            let taken = short.ask(black_box(Amount::ONE), Ask::HEAD);
            assert!(
                matches!(taken, Answer::Taken),
                "the bench window never fills"
            );
        })
    });
    let limiter = governor();
    group.bench_function("governor/check_n", |b| b.iter(|| check_n(&limiter)));
    group.finish();
}

/// Runs `op` `iters` times on each of two threads released together; answers the slower thread's
/// wall time, so the reported time is per operation of one thread under contention.
fn on_two_threads<T: Send + Sync + 'static>(shared: &Arc<T>, iters: u64, op: fn(&T)) -> Duration {
    let start = Arc::new(Barrier::new(2));
    let other = {
        let (shared, start) = (shared.clone(), start.clone());
        thread::spawn(move || {
            start.wait();
            let began = Instant::now();
            for _ in 0..iters {
                op(&shared);
            }
            began.elapsed()
        })
    };
    start.wait();
    let began = Instant::now();
    for _ in 0..iters {
        op(shared);
    }
    let mine = began.elapsed();
    mine.max(other.join().expect("the bench thread does not panic"))
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("elastic_window_two_threads");
    let system = Arc::new(window(self::system()));
    group.bench_function("elastic_window/take_give", |b| {
        b.iter_custom(|iters| on_two_threads(&system, iters, take_give))
    });
    let limiter = Arc::new(governor());
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
