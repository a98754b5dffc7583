//! The fixed-window rate limiter: configuration and settings changed after takes, exact counting
//! under contention, alignment, waiting through a sleeper, events, every extreme value (1 ns
//! windows, limits up to `u64::MAX`, the end of the clock), async acquire, the account contract
//! and one monitor scenario. Time is a `FakeClock`, and every sleep a fake that advances it;
//! except where the sleep under test is tokio's timer itself (no sleeper given), where the
//! limiter reads tokio's paused clock, which moves only when every task waits on a timer.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, Weak};
use std::thread;
use std::time::Duration;

use admission_accounts::ConfigError;
use admission_accounts::FixedWindowStatus;
use admission_accounts::fixed_window::{
    CancelToken, FixedWindow, FixedWindowError, FixedWindowEvent, MissingTimer, SleepFuture,
    Sleeper,
};
use admission_core::{
    Account, Amount, Answer, Ask, Category, Clock, Demand, Instant, JobContext, Monitor,
    RefusalKind, Replenishment, WakeFn,
};
use admission_testkit::FakeClock;
use admission_testkit::contract::{self, Subject};
use admission_testkit::monitor::{poll_once, spawn_thread_waiter, wait_for_queue};
use admission_testkit::reference::Permits;
use proptest::prelude::{Just, Strategy, TestCaseError, prop_assert, prop_assert_eq, prop_oneof};

const SECOND: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(nanos: u64) -> Instant {
    Instant::from_nanos(nanos)
}

/// A sleeper whose every sleep advances the fake clock by exactly the time asked and records it.
/// `after_sleep` runs at the end of each sleep, as if another caller acted while this one slept.
/// Its async sleep does the same and then yields to tokio once, so the waiter really suspends.
struct FakeSleeper {
    clock: FakeClock,
    sleeps: Mutex<Vec<Duration>>,
    after_sleep: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl FakeSleeper {
    fn new(clock: &FakeClock) -> Arc<FakeSleeper> {
        Arc::new(FakeSleeper {
            clock: clock.clone(),
            sleeps: Mutex::new(Vec::new()),
            after_sleep: Mutex::new(None),
        })
    }

    fn sleeps(&self) -> Vec<Duration> {
        self.sleeps.lock().unwrap().clone()
    }

    fn after_each_sleep(&self, action: impl Fn() + Send + 'static) {
        *self.after_sleep.lock().unwrap() = Some(Box::new(action));
    }
}

impl Sleeper for FakeSleeper {
    fn sleep(&self, duration: Duration) {
        self.sleeps.lock().unwrap().push(duration);
        self.clock.advance(duration);
        if let Some(action) = &*self.after_sleep.lock().unwrap() {
            action();
        }
    }

    fn sleep_async(&self, duration: Duration) -> SleepFuture {
        self.sleep(duration);
        Box::pin(tokio::task::yield_now())
    }
}

/// A sleeper whose async sleep never ends; it counts the sleeps still alive.
#[derive(Default)]
struct ParkedSleeper {
    alive: Arc<AtomicUsize>,
    asked: Mutex<Vec<Duration>>,
}

/// Counts one live sleep until dropped.
struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Sleeper for ParkedSleeper {
    fn sleep(&self, duration: Duration) {
        panic!("the parked sleeper serves async waits only; asked to block for {duration:?}");
    }

    fn sleep_async(&self, duration: Duration) -> SleepFuture {
        self.asked.lock().unwrap().push(duration);
        self.alive.fetch_add(1, Ordering::SeqCst);
        let alive = Alive(self.alive.clone());
        Box::pin(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        })
    }
}

/// A listener that keeps every event, and the events it kept.
fn recorder() -> (
    Arc<Mutex<Vec<FixedWindowEvent>>>,
    impl Fn(&FixedWindowEvent) + Send + Sync + 'static,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let kept = events.clone();
    (events, move |event: &FixedWindowEvent| {
        kept.lock().unwrap().push(event.clone())
    })
}

/// A limiter on `clock`, waiting through `sleeper`.
fn limiter(
    limit: u64,
    period: Duration,
    max_wait: Duration,
    clock: &FakeClock,
    sleeper: &Arc<FakeSleeper>,
) -> FixedWindow {
    FixedWindow::of("sms", limit, period)
        .expect("a valid configuration")
        .with_max_wait(max_wait)
        .with_clock(clock.shared())
        .with_sleeper(sleeper.clone())
}

/// A limiter of `limit` per `period` on `clock`, built at the clock's present reading.
fn on_clock(limit: u64, period: Duration, clock: &FakeClock) -> FixedWindow {
    FixedWindow::of("sms", limit, period)
        .expect("every limit >= 1 with every positive period is accepted")
        .with_clock(clock.shared())
}

fn rejected(limit: u64, period: Duration, max_wait: Duration) -> FixedWindowError {
    FixedWindowError::Rejected {
        name: "sms",
        limit,
        period,
        max_wait,
    }
}

// ---- configuration ------------------------------------------------------------------------

#[test]
fn of_refuses_a_zero_limit_naming_the_limit() {
    let error = FixedWindow::of("sms", 0, SECOND).unwrap_err();
    assert_eq!(
        error,
        ConfigError::new("fixed window", "limit", "must be at least 1; got 0")
    );
    assert_eq!(
        error.to_string(),
        "invalid fixed window configuration: `limit` must be at least 1; got 0"
    );
}

#[test]
fn of_refuses_a_zero_period_naming_the_period() {
    let error = FixedWindow::of("sms", 10, Duration::ZERO).unwrap_err();
    assert_eq!(
        error,
        ConfigError::new("fixed window", "period", "must be positive; got 0s")
    );
}

#[test]
fn every_limit_from_one_is_accepted_with_every_positive_period() {
    for period in [
        Duration::from_nanos(1),
        Duration::from_nanos(3),
        Duration::from_micros(1),
        ms(1),
        SECOND,
        Duration::MAX,
    ] {
        for limit in [1, 511, 512, u64::from(u32::MAX), u64::MAX] {
            let window = FixedWindow::of("sms", limit, period)
                .unwrap_or_else(|error| panic!("{limit} per {period:?}: {error}"));
            assert_eq!((window.limit(), window.period()), (limit, period));
        }
    }
}

#[test]
fn with_limit_and_with_period_validate_again_naming_the_field_they_change() {
    let window = || FixedWindow::of("sms", 1_000, SECOND).unwrap();
    assert_eq!(window().with_limit(0).unwrap_err().field, "limit");
    assert_eq!(
        window().with_period(Duration::ZERO).unwrap_err().field,
        "period"
    );
    assert_eq!(
        window()
            .with_period(Duration::from_nanos(1))
            .unwrap()
            .period(),
        Duration::from_nanos(1),
        "a limit of 1,000 fits a 1 ns window"
    );
    assert_eq!(window().with_limit(7).unwrap().limit(), 7);
    assert_eq!(window().with_period(ms(5)).unwrap().period(), ms(5));
}

/// A limiter of 2 per second built at 300 ms with both permits taken, read at 500 ms.
fn spent_at_500_ms(clock: &FakeClock) -> FixedWindow {
    clock.advance_to(at(300_000_000));
    let spent = on_clock(2, SECOND, clock);
    spent.try_acquire().unwrap();
    spent.try_acquire().unwrap();
    clock.advance_to(at(500_000_000));
    spent
}

/// The window's start and count as the limiter reads them now.
fn window_of(window: &FixedWindow) -> (Instant, u64) {
    let status = window.snapshot();
    (status.window_start, status.used)
}

#[test]
fn a_setting_changed_after_takes_keeps_the_window_start_and_the_count() {
    let clock = FakeClock::new();
    let kept = (at(300_000_000), 2);
    let (events, listener) = recorder();
    let window = spent_at_500_ms(&clock)
        .with_max_wait(ms(1_500))
        .with_listener(listener)
        .with_sleeper(FakeSleeper::new(&clock));
    assert_eq!(window_of(&window), kept);
    assert_eq!(window.origin(), at(300_000_000));
    assert_eq!(
        (
            window.name(),
            window.limit(),
            window.period(),
            window.max_wait()
        ),
        ("sms", 2, SECOND, ms(1_500))
    );
    assert!(events.lock().unwrap().is_empty());

    let window = window.with_limit(3).unwrap();
    assert_eq!(window_of(&window), kept);
    assert_eq!(
        window.try_acquire(),
        Ok(()),
        "the third permit of the raised limit"
    );
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD).not_now(),
        Some(Some(at(1_300_000_000)))
    );
    clock.advance_to(at(1_300_000_000));
    assert_eq!(window_of(&window), (at(1_300_000_000), 0));
}

#[test]
fn a_limit_lowered_below_the_count_leaves_the_window_spent_until_it_ends() {
    let clock = FakeClock::new();
    let window = spent_at_500_ms(&clock).with_limit(1).unwrap();
    assert_eq!(window_of(&window), (at(300_000_000), 2));
    assert_eq!(window.snapshot().remaining(), 0);
    assert_eq!(
        window.try_acquire(),
        Err(rejected(1, SECOND, Duration::ZERO))
    );
    clock.advance_to(at(1_300_000_000));
    assert_eq!(window.try_acquire(), Ok(()));
    assert_eq!(window_of(&window), (at(1_300_000_000), 1));
}

#[test]
fn a_period_changed_after_takes_keeps_the_window_in_progress_for_the_new_length() {
    let clock = FakeClock::new();
    let window = spent_at_500_ms(&clock).with_period(ms(400)).unwrap();
    assert_eq!(window_of(&window), (at(300_000_000), 2));
    assert_eq!(window.origin(), at(300_000_000));
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD).not_now(),
        Some(Some(at(700_000_000))),
        "the window in progress now ends 400 ms after its start"
    );
    clock.advance_to(at(1_550_000_000));
    assert_eq!(window_of(&window), (at(1_500_000_000), 0));

    // Shortened past its end, the window in progress is over at once.
    let clock = FakeClock::new();
    let window = spent_at_500_ms(&clock).with_period(ms(100)).unwrap();
    assert_eq!(window_of(&window), (at(500_000_000), 0));
}

#[test]
fn a_period_changed_after_the_window_ended_does_not_revive_its_count() {
    let clock = FakeClock::new();
    let window = spent_at_500_ms(&clock);
    clock.advance_to(at(3_800_000_000));
    let window = window.with_period(SECOND * 10).unwrap();
    assert_eq!(window_of(&window), (at(3_300_000_000), 0));
}

#[test]
fn a_new_clock_restarts_the_window_at_its_reading_and_keeps_the_count() {
    let clock = FakeClock::new();
    let other = FakeClock::new();
    other.advance_to(at(5_000_000_000));
    let window = spent_at_500_ms(&clock).with_clock(other.shared());
    assert_eq!(window_of(&window), (at(5_000_000_000), 2));
    assert_eq!(window.origin(), at(5_000_000_000));
    assert_eq!(
        window.try_acquire(),
        Err(rejected(2, SECOND, Duration::ZERO))
    );
    other.advance(SECOND);
    assert_eq!(window_of(&window), (at(6_000_000_000), 0));

    // Right after construction there is nothing to keep: a fresh window on the new clock.
    let fresh = FixedWindow::of("sms", 2, SECOND)
        .unwrap()
        .with_clock(clock.shared());
    assert_eq!(window_of(&fresh), (at(500_000_000), 0));
    assert_eq!(fresh.origin(), at(500_000_000));
}

// ---- counting -----------------------------------------------------------------------------

#[test]
fn five_hundred_threads_against_a_limit_of_100_win_exactly_100_per_window() {
    let clock = FakeClock::new();
    let (events, listener) = recorder();
    let window = Arc::new(
        FixedWindow::of("sms", 100, SECOND)
            .unwrap()
            .with_clock(clock.shared())
            .with_listener(listener),
    );
    for round in 0..2u64 {
        let start = Arc::new(Barrier::new(500));
        let racers: Vec<_> = (0..500)
            .map(|_| {
                let (window, start) = (window.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    window.try_acquire().is_ok()
                })
            })
            .collect();
        let wins = racers
            .into_iter()
            .map(|racer| racer.join().unwrap())
            .filter(|&won| won)
            .count();
        assert_eq!(wins, 100, "window {round}");
        assert_eq!(window.snapshot().used, 100, "window {round}");

        let mut remaining: Vec<u64> = events
            .lock()
            .unwrap()
            .drain(..)
            .filter_map(|event| match event {
                FixedWindowEvent::Permitted { remaining, .. } => Some(remaining),
                _ => None,
            })
            .collect();
        remaining.sort_unstable();
        assert_eq!(
            remaining,
            (0..100).collect::<Vec<_>>(),
            "each remaining count is seen by exactly one winner in window {round}"
        );
        clock.advance(SECOND);
    }
}

#[test]
fn windows_stay_aligned_to_creation_after_1000_idle_periods() {
    let clock = FakeClock::new();
    clock.advance(Duration::new(7, 123));
    let period = ms(250);
    let (events, listener) = recorder();
    let window = FixedWindow::of("sms", 1, period)
        .unwrap()
        .with_clock(clock.shared())
        .with_listener(listener);
    let origin = window.origin();
    assert_eq!(origin, at(7_000_000_123));

    clock.advance(period * 1_000 + ms(100));
    window.try_acquire().unwrap();
    assert_eq!(
        window.snapshot().window_start,
        origin.saturating_add(period * 1_000)
    );
    assert_eq!(window.snapshot().window_start, at(257_000_000_123));
    assert_eq!(
        window.try_acquire(),
        Err(rejected(1, period, Duration::ZERO))
    );
    assert_eq!(
        events.lock().unwrap().last(),
        Some(&FixedWindowEvent::Rejected {
            at: at(257_100_000_123),
            name: "sms",
            estimated_wait: ms(150),
        })
    );
}

#[test]
fn unused_permits_never_carry_over() {
    let clock = FakeClock::new();
    let window = FixedWindow::of("sms", 5, SECOND)
        .unwrap()
        .with_clock(clock.shared());
    window.try_acquire().unwrap();
    window.try_acquire().unwrap();
    clock.advance(SECOND);
    let granted = (0..10).filter(|_| window.try_acquire().is_ok()).count();
    assert_eq!(
        granted, 5,
        "three unused permits of the first window are gone"
    );
    clock.advance(SECOND * 3);
    let granted = (0..10).filter(|_| window.try_acquire().is_ok()).count();
    assert_eq!(granted, 5, "idle windows leave nothing behind either");
}

// ---- waiting ------------------------------------------------------------------------------

#[test]
fn a_wait_that_cannot_succeed_is_rejected_without_sleeping() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, ms(500), &clock, &sleeper);
    window.try_acquire().unwrap();
    clock.advance(ms(100));
    // The next window opens 900 ms from now; the deadline is 500 ms from now.
    assert_eq!(window.acquire(), Err(rejected(1, SECOND, ms(500))));
    assert_eq!(sleeper.sleeps(), Vec::<Duration>::new());
    assert_eq!(clock.now(), at(100_000_000));
}

#[test]
fn the_default_max_wait_of_zero_rejects_at_once() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, Duration::ZERO, &clock, &sleeper);
    window.acquire().unwrap();
    assert_eq!(window.acquire(), Err(rejected(1, SECOND, Duration::ZERO)));
    assert!(sleeper.sleeps().is_empty());
}

#[test]
fn a_waiter_sleeps_once_until_the_next_window_and_acquires_there() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let (events, listener) = recorder();
    let window = limiter(2, SECOND, SECOND, &clock, &sleeper).with_listener(listener);
    window.acquire().unwrap();
    window.acquire().unwrap();
    clock.advance(ms(250));

    assert_eq!(window.acquire(), Ok(()));
    assert_eq!(sleeper.sleeps(), vec![ms(750)]);
    assert_eq!(
        window.snapshot(),
        FixedWindowStatus {
            name: "sms".into(),
            limit: 2,
            period: SECOND,
            used: 1,
            window_start: at(1_000_000_000),
        }
    );
    assert_eq!(
        events.lock().unwrap().last(),
        Some(&FixedWindowEvent::Permitted {
            at: at(1_000_000_000),
            name: "sms",
            remaining: 1,
        })
    );
    assert_eq!(events.lock().unwrap().len(), 3, "one event per acquire");
}

#[test]
fn a_next_window_opening_exactly_at_the_deadline_is_still_waited_for() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, ms(400), &clock, &sleeper);
    window.try_acquire().unwrap();
    clock.advance(ms(600));
    assert_eq!(window.acquire(), Ok(()));
    assert_eq!(sleeper.sleeps(), vec![ms(400)]);
}

#[test]
fn a_waiter_that_loses_the_next_window_competes_again_until_its_deadline() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = Arc::new(limiter(1, SECOND, ms(2_500), &clock, &sleeper));
    // A rival takes each new window's only permit while the waiter sleeps.
    let rival: Weak<FixedWindow> = Arc::downgrade(&window);
    sleeper.after_each_sleep(move || {
        if let Some(window) = rival.upgrade() {
            window.try_acquire().unwrap();
        }
    });
    window.try_acquire().unwrap();

    // Windows open at 1 s and 2 s, both lost; the one at 3 s is past the deadline of 2.5 s.
    assert_eq!(window.acquire(), Err(rejected(1, SECOND, ms(2_500))));
    assert_eq!(sleeper.sleeps(), vec![SECOND, SECOND]);
    assert_eq!(clock.now(), at(2_000_000_000));
}

#[test]
fn call_runs_the_operation_on_a_permit_and_never_on_a_rejection() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, Duration::ZERO, &clock, &sleeper);
    let runs = AtomicUsize::new(0);
    let run = || runs.fetch_add(1, Ordering::SeqCst) + 1;
    assert_eq!(window.call(run), Ok(1));
    assert_eq!(window.call(run), Err(rejected(1, SECOND, Duration::ZERO)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_wait_cancelled_while_sleeping_fails_and_takes_nothing() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let (events, listener) = recorder();
    let window = limiter(1, SECOND, SECOND * 5, &clock, &sleeper).with_listener(listener);
    let token = CancelToken::new();
    let cancel = token.clone();
    sleeper.after_each_sleep(move || cancel.cancel());
    window.try_acquire().unwrap();

    assert_eq!(
        window.acquire_cancellable(&token),
        Err(FixedWindowError::Cancelled { name: "sms" })
    );
    assert_eq!(sleeper.sleeps(), vec![SECOND]);
    assert_eq!(
        window.snapshot().used,
        0,
        "the window that opened was not touched"
    );
    assert_eq!(window.snapshot().window_start, at(1_000_000_000));
    assert_eq!(events.lock().unwrap().len(), 1, "a cancel reports no event");
}

#[test]
fn a_token_cancelled_before_the_call_fails_without_trying() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, SECOND, &clock, &sleeper);
    let token = CancelToken::new();
    token.cancel();
    assert_eq!(
        window.acquire_cancellable(&token),
        Err(FixedWindowError::Cancelled { name: "sms" })
    );
    assert_eq!(window.snapshot().used, 0);
    assert!(sleeper.sleeps().is_empty());
}

#[test]
fn a_cancel_from_another_thread_ends_a_thread_sleeper_wait() {
    // The fake clock never moves, so only the cancel can end an hour-long real sleep.
    let clock = FakeClock::new();
    let window = Arc::new(
        FixedWindow::of("sms", 1, Duration::from_secs(3_600))
            .unwrap()
            .with_max_wait(Duration::from_secs(7_200))
            .with_clock(clock.shared()),
    );
    window.try_acquire().unwrap();
    let token = CancelToken::new();
    let waiter = {
        let (window, token) = (window.clone(), token.clone());
        thread::spawn(move || window.acquire_cancellable(&token))
    };
    token.cancel();
    assert_eq!(
        waiter.join().unwrap(),
        Err(FixedWindowError::Cancelled { name: "sms" })
    );
}

// ---- events -------------------------------------------------------------------------------

#[test]
fn the_listener_hears_exact_remaining_counts_and_the_exact_wait() {
    let clock = FakeClock::new();
    let (events, listener) = recorder();
    let window = FixedWindow::of("sms", 3, SECOND)
        .unwrap()
        .with_clock(clock.shared())
        .with_listener(listener);
    for _ in 0..3 {
        window.try_acquire().unwrap();
        clock.advance(ms(100));
    }
    window.try_acquire().unwrap_err();
    let permitted = |at_ms: u64, remaining| FixedWindowEvent::Permitted {
        at: at(at_ms * 1_000_000),
        name: "sms",
        remaining,
    };
    assert_eq!(
        *events.lock().unwrap(),
        vec![
            permitted(0, 2),
            permitted(100, 1),
            permitted(200, 0),
            FixedWindowEvent::Rejected {
                at: at(300_000_000),
                name: "sms",
                estimated_wait: ms(700),
            },
        ]
    );
    assert_eq!(events.lock().unwrap()[3].name(), "sms");
    assert_eq!(events.lock().unwrap()[3].at(), at(300_000_000));
}

#[test]
fn a_panicking_listener_is_ignored() {
    let clock = FakeClock::new();
    let heard = Arc::new(AtomicUsize::new(0));
    let count = heard.clone();
    let window = FixedWindow::of("sms", 1, SECOND)
        .unwrap()
        .with_clock(clock.shared())
        .with_listener(move |_| {
            count.fetch_add(1, Ordering::SeqCst);
            panic!("a listener bug");
        });
    assert_eq!(window.try_acquire(), Ok(()));
    assert_eq!(
        window.try_acquire(),
        Err(rejected(1, SECOND, Duration::ZERO))
    );
    assert_eq!(window.call(|| ()), Err(rejected(1, SECOND, Duration::ZERO)));
    assert_eq!(heard.load(Ordering::SeqCst), 3);
    assert_eq!(window.snapshot().used, 1);
}

#[test]
fn a_rejection_names_the_limiter_its_limit_period_and_max_wait() {
    assert_eq!(
        rejected(100, SECOND, ms(250)).to_string(),
        "fixed window `sms` rejected the call: its 100 permits per 1s are used up and no window \
         opens within the max wait of 250ms"
    );
    assert_eq!(
        FixedWindowError::Cancelled { name: "sms" }.to_string(),
        "fixed window `sms`: the wait for a permit was cancelled"
    );
}

#[test]
fn takes_through_the_account_report_no_listener_events() {
    let clock = FakeClock::new();
    let (events, listener) = recorder();
    let window = FixedWindow::of("sms", 1, SECOND)
        .unwrap()
        .with_clock(clock.shared())
        .with_listener(listener);
    assert!(matches!(window.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD).not_now(),
        Some(Some(at(1_000_000_000)))
    );
    assert!(events.lock().unwrap().is_empty());
}

// ---- extreme values -----------------------------------------------------------------------

#[test]
fn a_max_wait_of_duration_max_clamps_the_deadline_to_instant_max_and_still_waits() {
    let clock = FakeClock::new();
    clock.advance_to(at(u64::MAX - 10_000_000_123));
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, Duration::MAX, &clock, &sleeper);
    window.try_acquire().unwrap();
    clock.advance(ms(250));
    assert_eq!(window.acquire(), Ok(()));
    assert_eq!(sleeper.sleeps(), vec![ms(750)]);
    assert_eq!(window.snapshot().window_start, at(u64::MAX - 9_000_000_123));
}

#[test]
fn a_next_window_past_the_end_of_the_clock_is_rejected_at_once_whatever_the_max_wait() {
    let clock = FakeClock::new();
    clock.advance_to(at(u64::MAX - 500_000_000));
    let sleeper = FakeSleeper::new(&clock);
    let (events, listener) = recorder();
    let window = limiter(1, SECOND, Duration::MAX, &clock, &sleeper).with_listener(listener);
    window.acquire().unwrap();
    assert_eq!(window.acquire(), Err(rejected(1, SECOND, Duration::MAX)));
    assert!(sleeper.sleeps().is_empty());
    assert_eq!(
        events.lock().unwrap().last(),
        Some(&FixedWindowEvent::Rejected {
            at: at(u64::MAX - 500_000_000),
            name: "sms",
            estimated_wait: Duration::MAX,
        })
    );
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD.look()).not_now(),
        Some(None)
    );
    clock.advance(Duration::MAX);
    assert_eq!(
        window.try_acquire(),
        Err(rejected(1, SECOND, Duration::MAX))
    );
}

#[test]
fn a_period_of_duration_max_is_clamped_before_conversion_and_still_counts_windows() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, Duration::MAX, Duration::MAX, &clock, &sleeper);
    assert_eq!(window.period(), Duration::MAX);
    window.acquire().unwrap();
    // Window 1 starts at u64::MAX nanoseconds: the last instant of the clock.
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD.look()).not_now(),
        Some(Some(Instant::MAX))
    );
    assert_eq!(window.acquire(), Ok(()));
    assert_eq!(sleeper.sleeps(), vec![Duration::from_nanos(u64::MAX)]);
    let status = window.snapshot();
    assert_eq!((status.window_start, status.used), (Instant::MAX, 1));
    assert_eq!(status.window_end(), Instant::MAX);
    assert_eq!(
        window.acquire(),
        Err(rejected(1, Duration::MAX, Duration::MAX))
    );
}

#[test]
fn a_window_idle_for_most_of_the_clock_is_placed_exactly_without_overflow() {
    let clock = FakeClock::new();
    let period = Duration::from_micros(1);
    let window = FixedWindow::of("sms", 500, period)
        .unwrap()
        .with_clock(clock.shared());
    clock.advance_to(at(u64::MAX - 2_000));
    assert_eq!(
        (0..501).filter(|_| window.try_acquire().is_ok()).count(),
        500
    );
    let index = (u64::MAX - 2_000) / 1_000;
    assert_eq!(window.snapshot().window_start, at(index * 1_000));
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD.look()).not_now(),
        Some(Some(at((index + 1) * 1_000)))
    );
    // The last window the clock can start: the one after it would begin past Instant::MAX.
    clock.advance_to(Instant::MAX);
    window.try_acquire().unwrap();
    assert_eq!(window.snapshot().window_start, at(u64::MAX / 1_000 * 1_000));
    assert_eq!(
        window.ask(Amount::units(500), Ask::HEAD.look()).not_now(),
        Some(None)
    );
}

/// A clock a test sets by hand, free to go backwards (which a real clock must not).
#[derive(Debug, Default)]
struct SettableClock(AtomicU64);

impl Clock for SettableClock {
    fn now(&self) -> Instant {
        at(self.0.load(Ordering::SeqCst))
    }
}

#[test]
fn a_clock_reading_before_creation_counts_against_the_current_window() {
    let clock = Arc::new(SettableClock::default());
    clock.0.store(10_000_000_000, Ordering::SeqCst);
    let (events, listener) = recorder();
    let window = FixedWindow::of("sms", 1, SECOND)
        .unwrap()
        .with_clock(clock.clone())
        .with_listener(listener);
    clock.0.store(12_500_000_000, Ordering::SeqCst);
    window.try_acquire().unwrap();
    clock.0.store(3_000_000_000, Ordering::SeqCst);
    assert_eq!(
        window.try_acquire(),
        Err(rejected(1, SECOND, Duration::ZERO))
    );
    assert_eq!(
        window.snapshot().window_start,
        at(12_000_000_000),
        "the window never moves back"
    );
    assert_eq!(
        events.lock().unwrap().last(),
        Some(&FixedWindowEvent::Rejected {
            at: at(3_000_000_000),
            name: "sms",
            estimated_wait: Duration::from_secs(10),
        })
    );
}

// ---- async --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_acquire_under_tokio_waits_on_the_injected_sleeper_for_the_next_window() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = Arc::new(limiter(2, SECOND, SECOND * 3, &clock, &sleeper));
    window.acquire_async().await.unwrap();
    window.acquire_async().await.unwrap();
    clock.advance(ms(400));
    let task = {
        let window = window.clone();
        tokio::spawn(async move { window.acquire_async().await })
    };
    assert_eq!(task.await.unwrap(), Ok(()));
    assert_eq!(sleeper.sleeps(), vec![ms(600)]);
    assert_eq!(
        (window.snapshot().window_start, window.snapshot().used),
        (at(1_000_000_000), 1)
    );
}

#[tokio::test]
async fn async_acquire_rejects_a_wait_that_cannot_succeed_without_sleeping() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, ms(200), &clock, &sleeper);
    window.acquire_async().await.unwrap();
    assert_eq!(
        window.acquire_async().await,
        Err(rejected(1, SECOND, ms(200)))
    );
    assert!(sleeper.sleeps().is_empty());
}

#[tokio::test]
async fn call_async_calls_the_operation_only_on_a_permit() {
    let clock = FakeClock::new();
    let sleeper = FakeSleeper::new(&clock);
    let window = limiter(1, SECOND, Duration::ZERO, &clock, &sleeper);
    let calls = AtomicUsize::new(0);
    let operation = || {
        calls.fetch_add(1, Ordering::SeqCst);
        async { "sent" }
    };
    assert_eq!(window.call_async(operation).await, Ok("sent"));
    assert_eq!(
        window.call_async(operation).await,
        Err(rejected(1, SECOND, Duration::ZERO))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_dropped_async_acquire_leaks_nothing_and_retries_nothing() {
    let clock = FakeClock::new();
    let sleeper = Arc::new(ParkedSleeper::default());
    let (events, listener) = recorder();
    let window = Arc::new(
        FixedWindow::of("sms", 2, SECOND)
            .unwrap()
            .with_max_wait(SECOND * 10)
            .with_clock(clock.shared())
            .with_sleeper(sleeper.clone())
            .with_listener(listener),
    );
    window.try_acquire().unwrap();
    window.try_acquire().unwrap();

    // Parked on the sleeper, then dropped by hand...
    let mut pending = Box::pin(window.acquire_async());
    assert!(poll_once(&mut pending).is_none());
    assert_eq!(sleeper.alive.load(Ordering::SeqCst), 1);
    drop(pending);
    // ... and parked in a tokio task, then aborted.
    let task = {
        let window = window.clone();
        tokio::spawn(async move { window.acquire_async().await })
    };
    while sleeper.asked.lock().unwrap().len() < 2 {
        tokio::task::yield_now().await;
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());

    assert_eq!(
        sleeper.alive.load(Ordering::SeqCst),
        0,
        "every sleep dropped"
    );
    assert_eq!(*sleeper.asked.lock().unwrap(), vec![SECOND, SECOND]);
    assert_eq!(events.lock().unwrap().len(), 2, "only the two permits");
    assert_eq!(window.snapshot().used, 2);
    clock.advance(SECOND);
    assert_eq!(
        window.snapshot().used,
        0,
        "nothing was taken in the next window"
    );
    let granted = (0..3).filter(|_| window.try_acquire().is_ok()).count();
    assert_eq!(granted, 2);
}

/// A clock that reads tokio's, from zero at its creation: on a paused runtime it stands still
/// until every task waits on a timer, then jumps exactly to the earliest timer's instant.
#[cfg(feature = "tokio")]
#[derive(Debug)]
struct TokioTime {
    origin: tokio::time::Instant,
}

#[cfg(feature = "tokio")]
impl TokioTime {
    fn starting_now() -> Arc<TokioTime> {
        Arc::new(TokioTime {
            origin: tokio::time::Instant::now(),
        })
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioTime {
    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn with_no_sleeper_an_async_wait_sleeps_on_the_runtimes_timer_until_the_next_window() {
    let (events, listener) = recorder();
    let window = FixedWindow::of("sms", 2, SECOND)
        .unwrap()
        .with_max_wait(SECOND * 3)
        .with_clock(TokioTime::starting_now())
        .with_listener(listener);
    window.acquire_async().await.unwrap();
    window.acquire_async().await.unwrap();
    tokio::time::advance(ms(400)).await;

    let asked = tokio::time::Instant::now();
    assert_eq!(window.acquire_async().await, Ok(()));
    assert_eq!(
        asked.elapsed(),
        ms(600),
        "one sleep, to the next window's start"
    );
    let permitted = |at_ms: u64, remaining| FixedWindowEvent::Permitted {
        at: at(at_ms * 1_000_000),
        name: "sms",
        remaining,
    };
    assert_eq!(
        *events.lock().unwrap(),
        vec![permitted(0, 1), permitted(0, 0), permitted(1_000, 1)]
    );
    assert_eq!(window_of(&window), (at(1_000_000_000), 1));
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_wait_on_the_runtimes_timer_takes_nothing_in_the_next_window() {
    let window = FixedWindow::of("sms", 1, SECOND)
        .unwrap()
        .with_max_wait(SECOND * 10)
        .with_clock(TokioTime::starting_now());
    window.try_acquire().unwrap();
    let mut pending = Box::pin(window.acquire_async());
    assert!(poll_once(&mut pending).is_none());
    drop(pending);
    tokio::time::advance(SECOND).await;
    assert_eq!(window_of(&window), (at(1_000_000_000), 0));
}

#[test]
fn with_no_sleeper_and_no_runtime_a_call_that_must_wait_fails_at_once_naming_what_is_missing() {
    let clock = FakeClock::new();
    let (events, listener) = recorder();
    let window = on_clock(1, SECOND, &clock)
        .with_max_wait(SECOND * 10)
        .with_listener(listener);
    window.try_acquire().unwrap();
    clock.advance(ms(400));

    let missing = if cfg!(feature = "tokio") {
        MissingTimer::NoRuntime
    } else {
        MissingTimer::TokioFeatureOff
    };
    let no_timer = FixedWindowError::NoTimer {
        name: "sms",
        wait: ms(600),
        missing,
    };
    assert_eq!(
        poll_once(&mut Box::pin(window.acquire_async())),
        Some(Err(no_timer.clone()))
    );
    assert_eq!(
        no_timer.to_string(),
        format!(
            "fixed window `sms` must wait 600ms for its next window but has no timer to wait on: \
             {missing}, and no sleeper was given; poll the call on a tokio runtime with \
             admission-accounts' `tokio` feature on, or pass your runtime's timer to \
             `FixedWindow::with_sleeper`"
        )
    );
    assert_eq!(events.lock().unwrap().len(), 1, "the first permit only");
    assert_eq!(window_of(&window), (at(0), 1), "nothing taken");

    // `call_async` fails the same way, without calling the operation.
    let called = AtomicUsize::new(0);
    let mut call = Box::pin(window.call_async(|| {
        called.fetch_add(1, Ordering::SeqCst);
        async {}
    }));
    assert_eq!(poll_once(&mut call), Some(Err(no_timer.clone())));
    assert_eq!(
        called.load(Ordering::SeqCst),
        0,
        "the operation is not called"
    );
    assert_eq!(events.lock().unwrap().len(), 1);
    assert_eq!(window_of(&window), (at(0), 1));

    // A call that takes its permit at once, or is rejected at once, needs no timer.
    clock.advance(ms(600));
    assert_eq!(
        poll_once(&mut Box::pin(window.acquire_async())),
        Some(Ok(()))
    );
    let at_once = FixedWindow::of("sms", 1, SECOND)
        .unwrap()
        .with_clock(clock.shared());
    at_once.try_acquire().unwrap();
    assert_eq!(
        poll_once(&mut Box::pin(at_once.acquire_async())),
        Some(Err(rejected(1, SECOND, Duration::ZERO)))
    );
}

// ---- the account --------------------------------------------------------------------------

#[test]
fn the_account_passes_the_whole_contract_suite() {
    for limit in [1, 5] {
        contract::run_all(|| {
            let clock = FakeClock::new();
            let window = FixedWindow::of("sms", limit, SECOND)
                .unwrap()
                .with_clock(clock.shared());
            Subject::time(Arc::new(window), clock, Amount::ONE, limit)
                .with_never_fits(Amount::units(limit + 1))
        });
    }
    // Two permits at a time out of ten.
    contract::run_all(|| {
        let clock = FakeClock::new();
        let window = FixedWindow::of("sms", 10, ms(100))
            .unwrap()
            .with_clock(clock.shared());
        Subject::time(Arc::new(window), clock, Amount::units(2), 5)
            .with_never_fits(Amount::units(11))
    });
}

#[test]
fn the_account_declares_its_category_and_replenishment() {
    let window = FixedWindow::of("sms", 1, SECOND).unwrap();
    assert_eq!(Account::name(&window), "sms");
    assert_eq!(window.category(), Category::custom("fixed_window"));
    assert_eq!(window.replenishment(), Replenishment::Time);
}

#[test]
fn the_account_refuses_a_demand_above_the_limit_outright() {
    let window = FixedWindow::of("sms", 100, SECOND).unwrap();
    let too_large = Some(RefusalKind::TooLarge {
        asked: Amount::units(101),
        max: Amount::units(100),
    });
    let answer = window.ask(Amount::units(101), Ask::HEAD);
    let refusal = answer.refusal().expect("never");
    assert_eq!(Some(refusal.kind()), too_large);
    assert_eq!(
        refusal.message(),
        "fixed window `sms` allows 100 calls per 1s window, so a demand of 101 can never fit; \
         ask for at most 100 at a time"
    );
    assert_eq!(
        window
            .ask(Amount::units(101), Ask::HEAD.look())
            .refusal()
            .map(|r| r.kind()),
        too_large
    );
    // Beyond the limit only with the reservation: not now, and no window will ever hold both.
    assert_eq!(
        window
            .ask(Amount::units(100), Ask::behind(Amount::ONE).look())
            .not_now(),
        Some(None)
    );
    assert_eq!(window.snapshot().used, 0);
}

#[test]
fn the_account_counts_the_primary_dimension_with_the_reservation_set_aside() {
    let clock = FakeClock::new();
    let window = FixedWindow::of("sms", 10, SECOND)
        .unwrap()
        .with_clock(clock.shared());
    assert!(matches!(
        window.ask(Amount::pair(6, 99), Ask::HEAD),
        Answer::Taken
    ));
    let next_window = Some(Some(at(1_000_000_000)));
    assert_eq!(
        window
            .ask(Amount::units(3), Ask::behind(Amount::units(2)).look())
            .not_now(),
        next_window
    );
    assert_eq!(
        window
            .ask(Amount::units(3), Ask::behind(Amount::units(2)))
            .not_now(),
        next_window
    );
    assert!(matches!(
        window.ask(Amount::units(3), Ask::behind(Amount::ONE)),
        Answer::Taken
    ));
    assert_eq!(window.snapshot().used, 9);
}

#[test]
fn the_answer_is_taken_now_or_not_until_the_next_window_start_or_never() {
    let clock = FakeClock::new();
    clock.advance(ms(40));
    let window = FixedWindow::of("sms", 4, ms(100))
        .unwrap()
        .with_clock(clock.shared());
    clock.advance(ms(30));
    assert!(matches!(
        window.ask(Amount::units(4), Ask::HEAD.look()),
        Answer::Taken
    ));
    assert!(matches!(
        window.ask(Amount::units(3), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!(
        window.ask(Amount::units(2), Ask::HEAD.look()).not_now(),
        Some(Some(at(140_000_000)))
    );
    assert_eq!(
        window
            .ask(Amount::units(2), Ask::behind(Amount::units(2)).look())
            .not_now(),
        Some(Some(at(140_000_000)))
    );
    assert_eq!(
        window
            .ask(Amount::units(2), Ask::behind(Amount::units(3)).look())
            .not_now(),
        Some(None)
    );
    assert_eq!(
        window
            .ask(Amount::units(5), Ask::HEAD.look())
            .refusal()
            .map(|r| r.kind()),
        Some(RefusalKind::TooLarge {
            asked: Amount::units(5),
            max: Amount::units(4)
        })
    );
}

#[test]
fn a_give_returns_permits_to_the_open_window_only_and_never_below_zero() {
    let clock = FakeClock::new();
    let window = FixedWindow::of("sms", 5, SECOND)
        .unwrap()
        .with_clock(clock.shared());
    let wakes = Arc::new(AtomicUsize::new(0));
    let count = wakes.clone();
    let wake: WakeFn = Arc::new(move || {
        count.fetch_add(1, Ordering::SeqCst);
    });
    window.on_capacity_change(Some(wake));

    assert!(matches!(
        window.ask(Amount::units(3), Ask::HEAD),
        Answer::Taken
    ));
    window.give(Amount::units(2));
    assert_eq!(
        (window.snapshot().used, wakes.load(Ordering::SeqCst)),
        (1, 1)
    );
    window.give(Amount::units(10));
    assert_eq!(
        (window.snapshot().used, wakes.load(Ordering::SeqCst)),
        (0, 2)
    );

    assert!(matches!(
        window.ask(Amount::units(4), Ask::HEAD),
        Answer::Taken
    ));
    clock.advance(SECOND);
    window.give(Amount::units(4));
    assert_eq!(
        (window.snapshot().used, wakes.load(Ordering::SeqCst)),
        (0, 2),
        "a give after its window ended credits nothing and wakes no one"
    );
    assert!(matches!(
        window.ask(Amount::units(5), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD).not_now(),
        Some(Some(at(2_000_000_000)))
    );
}

#[test]
fn the_status_is_the_window_read_from_the_clock() {
    let clock = FakeClock::new();
    let window = FixedWindow::of("sms", 4, SECOND)
        .unwrap()
        .with_clock(clock.shared());
    assert!(matches!(
        window.ask(Amount::units(3), Ask::HEAD),
        Answer::Taken
    ));
    clock.advance(ms(2_500));
    assert!(matches!(window.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    let status = window.status();
    assert_eq!(status.category(), Category::custom("fixed_window"));
    assert_eq!(
        status.summary(),
        "sms [fixed_window]: 1 of 4 used in the 1s window from 2s, 3 remaining"
    );
    let json = serde_json::to_value(&*status).unwrap();
    assert_eq!(json["used"], 1);
    assert_eq!(json["window_start"], 2_000_000_000u64);
}

// ---- inside a demand ----------------------------------------------------------------------

#[test]
fn a_waiter_short_on_the_window_is_granted_when_the_next_window_opens() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    monitor.start().unwrap();
    let window = Arc::new(
        FixedWindow::of("sms", 2, SECOND)
            .unwrap()
            .with_clock(clock.shared()),
    );
    let http = Arc::new(Permits::new("http", 4));
    let demand = || {
        Demand::new()
            .with(window.clone(), Amount::ONE)
            .with(http.clone(), Amount::ONE)
    };
    let first = monitor
        .admit_blocking(demand(), &JobContext::new("first"), None)
        .unwrap();
    let second = monitor
        .admit_blocking(demand(), &JobContext::new("second"), None)
        .unwrap();
    clock.advance(ms(300));

    let third = spawn_thread_waiter(&monitor, demand(), JobContext::new("third"), None);
    wait_for_queue(&monitor, 1);
    assert!(third.try_outcome().is_none());
    assert_eq!(http.in_use(), 2, "a parked waiter holds nothing");

    clock.advance(ms(700));
    let third = third.outcome().unwrap();
    assert_eq!(
        (window.snapshot().window_start, window.snapshot().used),
        (at(1_000_000_000), 1)
    );
    assert_eq!(http.in_use(), 3);
    drop((first, second, third));
    assert_eq!(http.in_use(), 0);
    assert_eq!(window.snapshot().used, 1, "a release gives no window back");
    monitor.stop();
}

// ---- a model ------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Take(u64, u64),
    Give(u64),
    Acquire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..2_500u64).prop_map(Op::Advance),
        (0..8u64, 0..8u64).prop_map(|(n, r)| Op::Take(n, r)),
        (0..8u64).prop_map(Op::Give),
        Just(Op::Acquire),
    ]
}

proptest::proptest! {
    /// The limiter matches a plain model of windows on a grid: the count never exceeds the limit,
    /// resets at each window, and every answer is the model's.
    #[test]
    fn the_window_matches_a_plain_model_and_never_overdraws(
        limit in 1..8u64,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        matches_the_model(limit, ops)?;
    }
}

/// Runs `ops` on a limiter created at 123 ms with 1 s windows and on the model beside it.
fn matches_the_model(limit: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    const ORIGIN: u64 = 123_000_000;
    const PERIOD: u64 = 1_000_000_000;
    let clock = FakeClock::new();
    clock.advance_to(at(ORIGIN));
    let window = FixedWindow::of("sms", limit, Duration::from_nanos(PERIOD))
        .unwrap()
        .with_clock(clock.shared());
    let window_of = |clock: &FakeClock| (clock.now().as_nanos() - ORIGIN) / PERIOD;
    let (mut index, mut used) = (0u64, 0u64);
    for op in ops {
        if window_of(&clock) > index {
            (index, used) = (window_of(&clock), 0);
        }
        match op {
            Op::Advance(by) => clock.advance(ms(by)),
            Op::Take(n, reserved) => {
                // `None` for never, `Some(true)` for taken, `Some(false)` for not now.
                let expected = (n <= limit).then(|| n + reserved <= limit - used);
                let seen = window.ask(Amount::units(n), Ask::behind(Amount::units(reserved)));
                let seen_kind = match &seen {
                    Answer::Taken => Some(true),
                    Answer::NotNow(_) => Some(false),
                    Answer::Never(_) => None,
                };
                prop_assert_eq!(seen_kind, expected);
                if expected == Some(false) {
                    // The next window's start, unless no window holds `n` and the reservation.
                    let next = at(ORIGIN + (index + 1) * PERIOD);
                    let at_next = (n + reserved <= limit).then_some(next);
                    prop_assert_eq!(seen.not_now(), Some(at_next));
                }
                if expected == Some(true) {
                    used += n;
                }
            }
            Op::Give(n) => {
                window.give(Amount::units(n));
                used -= n.min(used);
            }
            Op::Acquire => {
                let expected = used < limit;
                prop_assert_eq!(window.try_acquire().is_ok(), expected);
                used += u64::from(expected);
            }
        }
        let status = window.snapshot();
        let current = window_of(&clock);
        prop_assert!(status.used <= limit);
        prop_assert_eq!(status.used, if current > index { 0 } else { used });
        prop_assert_eq!(status.window_start, at(ORIGIN + current * PERIOD));
    }
    Ok(())
}

// ---- the whole range: any period, any limit -----------------------------------------------

const NANO: Duration = Duration::from_nanos(1);
const MICRO: Duration = Duration::from_micros(1);
const U32_MAX: u64 = u32::MAX as u64;

/// Fills the current window to exactly `limit`: all but one permit through the account in one
/// ask, the last through `try_acquire`; then checks the next permit is refused.
fn fill_to_the_limit(window: &FixedWindow, limit: u64) {
    assert!(window.ask(Amount::units(limit - 1), Ask::HEAD).is_taken());
    assert_eq!(window.snapshot().used, limit - 1);
    assert_eq!(window.try_acquire(), Ok(()));
    assert_eq!(window.snapshot().used, limit);
    assert_eq!(
        window.try_acquire(),
        Err(FixedWindowError::Rejected {
            name: "sms",
            limit,
            period: window.period(),
            max_wait: Duration::ZERO,
        })
    );
    assert_eq!(window.snapshot().used, limit, "a refusal takes nothing");
}

#[test]
fn a_one_nanosecond_window_counts_u32_max_permits_exactly_and_resets() {
    let clock = FakeClock::new();
    clock.advance_to(at(1_000));
    let window = on_clock(U32_MAX, NANO, &clock);
    fill_to_the_limit(&window, U32_MAX);
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD).not_now(),
        Some(Some(at(1_001)))
    );
    clock.advance(NANO);
    assert_eq!(
        (window.snapshot().window_start, window.snapshot().used),
        (at(1_001), 0)
    );
    fill_to_the_limit(&window, U32_MAX);
}

#[test]
fn a_one_microsecond_window_counts_u32_max_permits_exactly_and_resets() {
    let clock = FakeClock::new();
    let window = on_clock(U32_MAX, MICRO, &clock);
    clock.advance(Duration::from_nanos(999));
    fill_to_the_limit(&window, U32_MAX);
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD.look()).not_now(),
        Some(Some(at(1_000)))
    );
    clock.advance(NANO);
    assert_eq!(
        (window.snapshot().window_start, window.snapshot().used),
        (at(1_000), 0)
    );
    fill_to_the_limit(&window, U32_MAX);
}

#[test]
fn a_limit_of_u64_max_is_counted_to_the_last_permit_in_a_one_nanosecond_window() {
    let clock = FakeClock::new();
    let window = on_clock(u64::MAX, NANO, &clock);
    fill_to_the_limit(&window, u64::MAX);
    window.give(Amount::units(3));
    assert_eq!(window.snapshot().used, u64::MAX - 3);
    assert!(window.ask(Amount::units(3), Ask::HEAD).is_taken());
    assert_eq!(window.snapshot().remaining(), 0);
    clock.advance(NANO);
    assert_eq!(window.snapshot().used, 0);
}

#[test]
fn one_nanosecond_windows_at_the_end_of_the_clock_are_placed_and_counted_exactly() {
    let clock = FakeClock::new();
    let window = on_clock(U32_MAX, NANO, &clock);
    clock.advance_to(at(u64::MAX - 1));
    fill_to_the_limit(&window, U32_MAX);
    assert_eq!(window.snapshot().window_start, at(u64::MAX - 1));
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD).not_now(),
        Some(Some(Instant::MAX))
    );
    // The last window of the clock: the next one would start past `Instant::MAX`.
    clock.advance_to(Instant::MAX);
    assert_eq!(
        (window.snapshot().window_start, window.snapshot().used),
        (Instant::MAX, 0)
    );
    fill_to_the_limit(&window, U32_MAX);
    assert_eq!(window.ask(Amount::ONE, Ask::HEAD).not_now(), Some(None));
}

#[test]
fn a_one_microsecond_window_near_the_end_of_the_clock_counts_u32_max_permits() {
    let clock = FakeClock::new();
    clock.advance_to(at(7));
    let window = on_clock(U32_MAX, MICRO, &clock);
    clock.advance_to(at(u64::MAX - 1_500));
    fill_to_the_limit(&window, U32_MAX);
    let start = (u64::MAX - 1_500 - 7) / 1_000 * 1_000 + 7;
    assert_eq!(window.snapshot().window_start, at(start));
    assert_eq!(
        window.ask(Amount::ONE, Ask::HEAD).not_now(),
        Some(Some(at(start + 1_000)))
    );
}

/// `threads` threads race `tries` try_acquires each on `window`; the number that won.
fn race(window: &Arc<FixedWindow>, threads: usize, tries: usize) -> u64 {
    let start = Arc::new(Barrier::new(threads));
    let racers: Vec<_> = (0..threads)
        .map(|_| {
            let (window, start) = (window.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                (0..tries).filter(|_| window.try_acquire().is_ok()).count() as u64
            })
        })
        .collect();
    racers.into_iter().map(|racer| racer.join().unwrap()).sum()
}

#[test]
fn threads_racing_for_the_last_permits_below_u64_max_win_exactly_the_limit() {
    let clock = FakeClock::new();
    clock.advance_to(at(u64::MAX - 10));
    let window = Arc::new(on_clock(u64::MAX, NANO, &clock));
    assert!(
        window
            .ask(Amount::units(u64::MAX - 20_000), Ask::HEAD)
            .is_taken()
    );
    assert_eq!(race(&window, 8, 5_000), 20_000);
    assert_eq!(window.snapshot().used, u64::MAX);
    assert_eq!(window.snapshot().window_start, at(u64::MAX - 10));
}

#[test]
fn threads_racing_in_a_one_nanosecond_window_win_exactly_the_limit_per_window() {
    let clock = FakeClock::new();
    let window = Arc::new(on_clock(30_000, NANO, &clock));
    for round in 0..3 {
        assert_eq!(race(&window, 8, 6_000), 30_000, "window {round}");
        assert_eq!(window.snapshot().used, 30_000, "window {round}");
        clock.advance(NANO);
    }
}
