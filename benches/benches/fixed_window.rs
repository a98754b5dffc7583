//! The fixed window against its peer, governor's direct `RateLimiter::check_n`, in one run.
//!
//! - `acquire/1_thread`: one uncontended permit, on real clocks (admission's `SystemClock`,
//!   governor's default quanta clock) and on fake clocks (the test-kit's `FakeClock`, governor's
//!   `FakeRelativeClock`), so the clock's own cost can be told apart from the limiter's.
//! - `acquire/2_threads`: two threads taking permits from one shared limiter at once; the time is
//!   per permit per thread (one iteration is one permit on each thread).
//! - `account/ask_take_give`: the `Account` path a monitor uses, a taking `ask` as the head and
//!   its rollback.
//! - `reference/clock_now`: one read of each real clock alone, for scale.
//!
//! Both limiters are configured so that no call is ever refused during the run (a fixed window
//! of 2 x 10^12 per hour, a GCRA burst of `u32::MAX` per second): the benches measure the
//! permitted path. Run with `cargo bench -p admission-benches --bench fixed_window`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use admission_accounts::fixed_window::FixedWindow;
use admission_benches::support::{on_two_threads, quota_never_empty};
use admission_core::{Account, Amount, Ask};
use admission_testkit::FakeClock;
use criterion::{Criterion, criterion_group, criterion_main};
use governor::RateLimiter;
use governor::clock::FakeRelativeClock;

const HOUR: Duration = Duration::from_secs(3_600);
/// Far more permits than a run can take.
const PLENTY: u64 = 2_000_000_000_000;

fn window() -> FixedWindow {
    FixedWindow::of("bench", PLENTY, HOUR).expect("fits an hour's window")
}

fn fake_window() -> FixedWindow {
    window().with_clock(FakeClock::new().shared())
}

fn acquire_one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("acquire/1_thread");
    let one = NonZeroU32::MIN;

    let fixed = window();
    group.bench_function("fixed_window/system_clock", |b| {
        b.iter(|| black_box(fixed.try_acquire()))
    });
    let governor = RateLimiter::direct(quota_never_empty());
    group.bench_function("governor_check_n/quanta_clock", |b| {
        b.iter(|| black_box(governor.check_n(black_box(one))))
    });

    let fixed = fake_window();
    group.bench_function("fixed_window/fake_clock", |b| {
        b.iter(|| black_box(fixed.try_acquire()))
    });
    let governor =
        RateLimiter::direct_with_clock(quota_never_empty(), FakeRelativeClock::default());
    group.bench_function("governor_check_n/fake_clock", |b| {
        b.iter(|| black_box(governor.check_n(black_box(one))))
    });
    group.finish();
}

fn acquire_two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("acquire/2_threads");
    let one = NonZeroU32::MIN;

    let fixed = Arc::new(window());
    group.bench_function("fixed_window/system_clock", |b| {
        b.iter_custom(|iters| {
            on_two_threads(&fixed, iters, |fixed| {
                let _ = black_box(fixed.try_acquire());
            })
        })
    });
    let governor = Arc::new(RateLimiter::direct(quota_never_empty()));
    group.bench_function("governor_check_n/quanta_clock", |b| {
        b.iter_custom(|iters| {
            on_two_threads(&governor, iters, move |governor| {
                let _ = black_box(governor.check_n(black_box(one)));
            })
        })
    });

    let fixed = Arc::new(fake_window());
    group.bench_function("fixed_window/fake_clock", |b| {
        b.iter_custom(|iters| {
            on_two_threads(&fixed, iters, |fixed| {
                let _ = black_box(fixed.try_acquire());
            })
        })
    });
    let governor = Arc::new(RateLimiter::direct_with_clock(
        quota_never_empty(),
        FakeRelativeClock::default(),
    ));
    group.bench_function("governor_check_n/fake_clock", |b| {
        b.iter_custom(|iters| {
            on_two_threads(&governor, iters, move |governor| {
                let _ = black_box(governor.check_n(black_box(one)));
            })
        })
    });
    group.finish();
}

fn clock_reads(c: &mut Criterion) {
    use governor::clock::Clock as _;
    let mut group = c.benchmark_group("reference/clock_now");
    let system: Arc<dyn admission_core::Clock> = Arc::new(admission_core::SystemClock::new());
    group.bench_function("admission_system_clock", |b| {
        b.iter(|| black_box(system.now()))
    });
    let quanta = governor::clock::DefaultClock::default();
    group.bench_function("governor_quanta_clock", |b| {
        b.iter(|| black_box(quanta.now()))
    });
    group.finish();
}

fn account_take_give(c: &mut Criterion) {
    let mut group = c.benchmark_group("account/ask_take_give");
    for (name, account) in [
        ("fixed_window/system_clock", window()),
        ("fixed_window/fake_clock", fake_window()),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let taken = account.ask(black_box(Amount::ONE), Ask::HEAD);
                if taken.is_taken() {
                    account.give(Amount::ONE);
                }
                black_box(taken.refusal().is_none())
            })
        });
    }
    group.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = short();
    targets = acquire_one_thread, acquire_two_threads, account_take_give, clock_reads
}
criterion_main!(benches);
