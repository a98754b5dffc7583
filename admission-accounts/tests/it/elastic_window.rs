//! The elastic window's rules, each on a fake clock with exact values: the sliding log, the
//! throttle, the circuit breaker, the configuration checks, the HTTP requirement, the contract
//! suite, two scenarios inside a real monitor, and the concurrency properties.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use admission_accounts::counting_gate::CountingGate;
use admission_accounts::elastic_window::{CircuitState, ElasticWindow, ElasticWindowConfig};
use admission_core::event::{EventKind, RejectReason};
use admission_core::{
    Account, AccountStatus, AdmitError, Amount, Answer, Ask, Capability, Category, Demand, Instant,
    JobContext, Monitor, RefusalKind, Replenishment, WakeFn,
};
use admission_events::Recorder;
use admission_testkit::FakeClock;
use admission_testkit::contract::{self, Subject};
use admission_testkit::monitor::{poll_once, spawn_thread_waiter, wait_for_queue};
use admission_testkit::reference::Permits;
use proptest::prelude::*;

const SECOND: u64 = 1_000_000_000;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The instant `n` seconds after the clock's origin.
fn at(n: u64) -> Instant {
    Instant::from_nanos(n * SECOND)
}

/// `max` requests per `base` seconds, every other field at its default.
fn config(max: u64, base: u64) -> ElasticWindowConfig {
    ElasticWindowConfig::new(max, secs(base))
}

/// A window named `search` built from `config`, on `clock`.
fn window_with(config: ElasticWindowConfig, clock: &FakeClock) -> ElasticWindow {
    ElasticWindow::new("search", config, clock.shared()).expect("a valid configuration")
}

/// `max` requests per `base` seconds on `clock`, defaults otherwise.
fn window(max: u64, base: u64, clock: &FakeClock) -> ElasticWindow {
    window_with(config(max, base), clock)
}

/// 60 requests per 60 s with no throttle to climb, so three failures open the circuit.
fn breakable(clock: &FakeClock) -> ElasticWindow {
    window_with(config(60, 60).with_max_throttle(0.0), clock)
}

/// Opens `w`'s circuit with three failures described `text`.
fn open(w: &ElasticWindow, text: &str) {
    for _ in 0..3 {
        w.record_failure(text);
    }
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
}

/// Asks for `n` requests as the head of the line, taking them if they fit.
fn take(w: &ElasticWindow, n: u64) -> Answer {
    w.ask(Amount::units(n), Ask::HEAD)
}

/// A look as the head of the line at `n` requests.
fn look(w: &ElasticWindow, n: u64) -> Answer {
    w.ask(Amount::units(n), Ask::HEAD.look())
}

/// The message of a "never".
fn message(answer: Answer) -> String {
    match answer {
        Answer::Never(refusal) => refusal.message().to_owned(),
        other => panic!("expected a refusal, saw {other:?}"),
    }
}

/// The kind of a "never", if the answer is one.
fn refusal_kind(answer: Answer) -> Option<RefusalKind> {
    answer.refusal().map(|r| r.kind())
}

/// A wake that counts its calls.
fn counting_wake() -> (Arc<AtomicUsize>, WakeFn) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let wake: WakeFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (calls, wake)
}

fn blocked_message(remaining: &str, failure: &str) -> String {
    format!(
        "The rate limiter `search` (60 requests per 60 s) is refusing every call for another \
         {remaining}: its upstream kept failing, so its circuit breaker is open. The upstream's \
         last failure: {failure}. Do not wait for this tool; pick another tool to continue."
    )
}

fn probe_message(failure: &str) -> String {
    format!(
        "The rate limiter `search` (60 requests per 60 s) is refusing every call while a single \
         trial call checks whether its upstream has recovered: its upstream kept failing, so its \
         circuit breaker is open. The upstream's last failure: {failure}. Do not wait for this \
         tool; pick another tool to continue."
    )
}

/// An HTTP connection gate for these tests: the test-kit's permits, standing for a connection.
#[derive(Debug)]
struct Http(Permits);

impl Http {
    fn new(capacity: u64) -> Http {
        Http(Permits::new("http", capacity))
    }
}

impl Account for Http {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn category(&self) -> Category {
        self.0.category()
    }
    fn replenishment(&self) -> Replenishment {
        self.0.replenishment()
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        self.0.ask(mine, ask)
    }
    fn give(&self, amount: Amount) {
        self.0.give(amount)
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        self.0.status()
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.0.on_capacity_change(wake)
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.0.forget_capacity_change(wake)
    }
    fn provides(&self) -> Option<Capability> {
        Some(Capability::HTTP_CONNECTION)
    }
}

// ---------------------------------------------------------------------------------------------
// The sliding log

#[test]
fn a_fresh_window_is_healthy_at_throttle_zero_and_a_take_counts_in_use() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    assert_eq!(w.circuit_state(), CircuitState::Healthy);
    assert_eq!(w.throttle(), 0.0);
    assert_eq!(w.in_use(), 0);
    assert_eq!(w.replenishment(), Replenishment::Time);
    assert_eq!(w.category(), Category::custom("elastic_window"));
    assert!(take(&w, 2).is_taken());
    assert_eq!(w.in_use(), 2);
    assert_eq!(w.status_indicator(), None);
}

#[test]
fn a_request_counts_until_its_stamp_leaves_the_window() {
    let clock = FakeClock::new();
    let w = window(2, 10, &clock);
    assert!(take(&w, 1).is_taken());
    clock.advance(secs(4));
    assert!(take(&w, 1).is_taken());
    assert_eq!(take(&w, 1).not_now(), Some(Some(at(10))));
    clock.advance_to(Instant::from_nanos(10 * SECOND - 1));
    assert_eq!(w.in_use(), 2);
    assert_eq!(look(&w, 1).not_now(), Some(Some(at(10))));
    clock.advance_to(at(10));
    assert_eq!(w.in_use(), 1);
    assert!(look(&w, 1).is_taken());
    clock.advance_to(at(14));
    assert_eq!(w.in_use(), 0);
}

#[test]
fn a_demand_above_max_requests_is_refused_outright_and_debits_nothing() {
    let clock = FakeClock::new();
    let w = window(60, 60, &clock);
    let expected = "The rate limiter `search` allows at most 60 requests per 60 s; a demand of 61 \
                    requests can never fit. Ask for at most 60 requests at a time.";
    let too_large = RefusalKind::TooLarge {
        asked: Amount::units(61),
        max: Amount::units(60),
    };
    for ask in [Ask::HEAD.look(), Ask::behind(Amount::units(3)), Ask::HEAD] {
        assert_eq!(refusal_kind(w.ask(Amount::units(61), ask)), Some(too_large));
        assert_eq!(message(w.ask(Amount::units(61), ask)), expected);
    }
    assert_eq!(w.in_use(), 0);
    assert!(take(&w, 60).is_taken());
}

#[test]
fn a_reservation_in_the_way_is_not_now_never_never() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    assert!(take(&w, 3).is_taken());
    assert!(look(&w, 2).is_taken());
    // Short by one beside the head's reservation: until the three stamps at 0 s leave.
    let behind_one = Ask::behind(Amount::ONE);
    assert_eq!(
        w.ask(Amount::units(2), behind_one.look()).not_now(),
        Some(Some(at(10)))
    );
    assert_eq!(
        w.ask(Amount::units(2), behind_one).not_now(),
        Some(Some(at(10)))
    );
    // More than the window together with the reservation: not by time alone.
    assert_eq!(
        w.ask(Amount::ONE, Ask::behind(Amount::units(5)).look())
            .not_now(),
        Some(None)
    );
    assert_eq!(w.in_use(), 3);
}

#[test]
fn not_now_lasts_until_the_kth_oldest_stamp_leaves_the_window() {
    let clock = FakeClock::new();
    let w = window(4, 10, &clock);
    for _ in 0..4 {
        assert!(take(&w, 1).is_taken());
        clock.advance(secs(1));
    }
    // Stamps at 0, 1, 2 and 3 s; now 4 s.
    assert_eq!(look(&w, 1).not_now(), Some(Some(at(10))));
    assert_eq!(look(&w, 2).not_now(), Some(Some(at(11))));
    assert_eq!(
        w.ask(Amount::units(2), Ask::behind(Amount::ONE).look())
            .not_now(),
        Some(Some(at(12)))
    );
    assert_eq!(look(&w, 4).not_now(), Some(Some(at(13))));
    assert_eq!(
        w.ask(Amount::units(3), Ask::behind(Amount::units(2)).look())
            .not_now(),
        Some(None)
    );
    clock.advance_to(at(11));
    assert!(look(&w, 2).is_taken());
    assert!(take(&w, 2).is_taken());
}

#[test]
fn give_drops_the_newest_stamps_so_the_oldest_deadline_stays() {
    let clock = FakeClock::new();
    let w = window(3, 10, &clock);
    for _ in 0..3 {
        assert!(take(&w, 1).is_taken());
        clock.advance(secs(1));
    }
    w.give(Amount::ONE);
    assert_eq!(w.in_use(), 2);
    // Stamps at 0 and 1 s remain: two more need the one at 0 s gone.
    assert_eq!(look(&w, 2).not_now(), Some(Some(at(10))));
    w.give(Amount::units(9));
    assert_eq!(w.in_use(), 0);
}

#[test]
fn the_effective_window_is_the_base_window_times_one_plus_the_throttle() {
    let clock = FakeClock::new();
    let w = window(1, 10, &clock);
    assert!(take(&w, 1).is_taken());
    w.record_pressure();
    assert_eq!(w.effective_window(), secs(20));
    assert_eq!(look(&w, 1).not_now(), Some(Some(at(20))));
    clock.advance(secs(15));
    assert_eq!(w.in_use(), 1);
    clock.advance(secs(5));
    assert_eq!(w.in_use(), 0);
}

#[test]
fn a_stretched_window_counts_stamps_the_base_window_had_let_go() {
    let clock = FakeClock::new();
    let w = window(2, 10, &clock);
    assert!(take(&w, 1).is_taken());
    clock.advance(secs(12));
    assert_eq!(w.in_use(), 0);
    w.record_advisory_pressure();
    assert_eq!(w.in_use(), 1);
    assert_eq!(look(&w, 2).not_now(), Some(Some(at(20))));
}

#[test]
fn counts_stay_exact_as_time_runs_and_the_window_stretches_and_shrinks() {
    // One stamp a second for thirty seconds: each count starts where the last one left off
    // (the log's mark) only while that cannot miss a stamp.
    let clock = FakeClock::new();
    let w = window(100, 10, &clock);
    for s in 0..30 {
        assert!(take(&w, 1).is_taken());
        assert_eq!(w.in_use(), (s + 1).min(10));
        clock.advance(secs(1));
    }
    assert_eq!(w.in_use(), 9, "the stamps of 21 s to 29 s");
    w.record_pressure();
    assert_eq!(w.in_use(), 19, "a 20 s window: 11 s to 29 s");
    w.record_pressure();
    assert_eq!(w.in_use(), 29, "a 30 s window: 1 s to 29 s");
    for _ in 0..3 {
        w.record_success();
    }
    assert_eq!(w.effective_window(), Duration::from_millis(28_000));
    assert_eq!(w.in_use(), 27, "a 28 s window: 3 s to 29 s");
    clock.advance(secs(1));
    assert_eq!(w.in_use(), 26, "4 s to 29 s");
    // Short by one: the oldest stamp inside, at 4 s, leaves at 32 s.
    assert_eq!(look(&w, 75).not_now(), Some(Some(at(32))));
    assert!(take(&w, 74).is_taken());
    assert_eq!(w.in_use(), 100);
}

#[test]
fn no_stretch_of_the_window_ever_holds_more_than_max_requests_taken() {
    // Takes at uneven steps of time, some given back at once: every ten seconds hold at most
    // five requests kept, and each refusal is right (the window was full at that instant).
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let mut kept: Vec<u64> = Vec::new();
    let mut now = 0;
    for _ in 0..5_000 {
        let step = rng.next(1_500);
        clock.advance(Duration::from_millis(step));
        now += step * 1_000_000;
        let inside = kept.iter().filter(|&&t| t + 10 * SECOND > now).count() as u64;
        let n = 1 + rng.next(2);
        let taken = take(&w, n).is_taken();
        assert_eq!(taken, inside + n <= 5, "{n} at {now} ns beside {inside}");
        if taken {
            if rng.next(4) == 0 {
                w.give(Amount::units(n));
            } else {
                kept.extend(std::iter::repeat_n(now, n as usize));
            }
        }
    }
    assert!(
        kept.len() > 100,
        "the run exercised the window: {}",
        kept.len()
    );
    // Any six requests kept span at least the window.
    for six in kept.windows(6) {
        assert!(six[5] >= six[0] + 10 * SECOND, "{six:?}");
    }
}

#[test]
fn the_wake_is_replaced_by_a_later_install_and_forgotten_only_by_its_own() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    let (a_calls, a) = counting_wake();
    let (b_calls, b) = counting_wake();
    let take_give = || {
        assert!(take(&w, 1).is_taken());
        w.give(Amount::ONE);
    };
    w.on_capacity_change(Some(a.clone()));
    take_give();
    assert_eq!(a_calls.load(Ordering::SeqCst), 1);
    w.forget_capacity_change(&b);
    take_give();
    assert_eq!(a_calls.load(Ordering::SeqCst), 2, "b was not installed");
    w.on_capacity_change(Some(b.clone()));
    take_give();
    w.give(Amount::ONE);
    assert_eq!(a_calls.load(Ordering::SeqCst), 2, "replaced");
    assert_eq!(
        b_calls.load(Ordering::SeqCst),
        1,
        "a give of nothing held wakes no one"
    );
    w.forget_capacity_change(&a);
    take_give();
    assert_eq!(
        b_calls.load(Ordering::SeqCst),
        2,
        "a is no longer installed"
    );
    w.forget_capacity_change(&b);
    take_give();
    assert_eq!(b_calls.load(Ordering::SeqCst), 2);
}

#[test]
fn the_log_keeps_no_more_than_max_requests_stamps() {
    let clock = FakeClock::new();
    let w = window(3, 10, &clock);
    assert!(take(&w, 3).is_taken());
    clock.advance(secs(10));
    assert!(take(&w, 3).is_taken());
    w.record_advisory_pressure();
    assert_eq!(w.in_use(), 3);
    assert_eq!(w.status_record().in_use, 3);
}

// ---------------------------------------------------------------------------------------------
// The throttle

#[test]
fn each_pressure_signal_adds_one_capped_at_the_max_throttle() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    w.record_pressure();
    assert_eq!(w.throttle(), 1.0);
    w.record_failure("HTTP 500");
    w.record_advisory_pressure();
    assert_eq!(w.throttle(), 3.0);
    for _ in 0..20 {
        w.record_advisory_pressure();
    }
    assert_eq!(w.throttle(), 9.0);
    assert_eq!(w.effective_window(), secs(100));
}

#[test]
fn three_successes_take_two_tenths_off_never_below_zero() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    w.record_pressure();
    let mut seen = Vec::new();
    for _ in 0..18 {
        w.record_success();
        seen.push(w.throttle());
    }
    assert_eq!(
        seen,
        [
            1.0, 1.0, 0.8, 0.8, 0.8, 0.6, 0.6, 0.6, 0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0,
            0.0
        ]
    );
}

#[test]
fn a_pressure_signal_starts_the_round_of_successes_over() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    w.record_pressure();
    w.record_success();
    w.record_success();
    w.record_advisory_pressure();
    w.record_success();
    assert_eq!(w.throttle(), 2.0);
    w.record_success();
    w.record_success();
    assert_eq!(w.throttle(), 1.8);
}

#[test]
fn after_five_minutes_without_pressure_every_success_takes_half_off() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    w.record_pressure();
    w.record_pressure();
    // Five minutes.
    clock.advance(Duration::from_secs(300) - Duration::from_nanos(1));
    w.record_success();
    assert_eq!(w.throttle(), 2.0);
    clock.advance(Duration::from_nanos(1));
    w.record_success();
    assert_eq!(w.throttle(), 1.5);
    w.record_success();
    w.record_success();
    w.record_success();
    assert_eq!(w.throttle(), 0.0);
    w.record_success();
    assert_eq!(w.throttle(), 0.0);
}

#[test]
fn a_relaxation_calls_the_wake_slot_and_a_tightening_does_not() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    let (calls, wake) = counting_wake();
    w.on_capacity_change(Some(wake));
    w.record_success();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a success at zero changes nothing"
    );
    w.record_pressure();
    w.record_advisory_pressure();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "tightening never wakes");
    w.record_success();
    w.record_success();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no step taken yet");
    w.record_success();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(w.throttle(), 1.8);
}

#[test]
fn advisory_pressure_raises_the_throttle_and_never_opens_the_circuit() {
    let clock = FakeClock::new();
    let w = window_with(config(5, 10).with_max_throttle(0.0), &clock);
    let (calls, wake) = counting_wake();
    w.on_capacity_change(Some(wake));
    for _ in 0..100 {
        w.record_advisory_pressure();
    }
    assert_eq!(w.circuit_state(), CircuitState::Healthy);
    assert_eq!(w.circuit_openings(), 0);
    assert_eq!(w.last_failure(), None);
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let w = window(5, 10, &clock);
    for _ in 0..100 {
        w.record_advisory_pressure();
    }
    assert_eq!(w.throttle(), 9.0);
    assert_eq!(w.circuit_state(), CircuitState::Healthy);
    assert!(take(&w, 1).is_taken());
}

#[test]
fn the_indicator_is_blocked_probing_or_the_stretch_factor() {
    let clock = FakeClock::new();
    let w = window_with(config(60, 60).with_max_throttle(2.5), &clock);
    assert_eq!(w.status_indicator(), None);
    w.record_advisory_pressure();
    assert_eq!(w.status_indicator().as_deref(), Some("throttle:2.0x"));
    for _ in 0..3 {
        w.record_success();
    }
    assert_eq!(w.status_indicator().as_deref(), Some("throttle:1.8x"));
    for _ in 0..4 {
        w.record_failure("HTTP 503");
    }
    assert_eq!(w.throttle(), 2.5);
    assert_eq!(w.status_indicator().as_deref(), Some("throttle:3.5x"));
    w.record_failure("HTTP 503");
    assert_eq!(w.status_indicator().as_deref(), Some("blocked"));
    assert_eq!(w.status().indicator().as_deref(), Some("blocked"));
    clock.advance(secs(30));
    assert!(take(&w, 1).is_taken());
    assert_eq!(w.status_indicator().as_deref(), Some("probing"));
    assert_eq!(w.status().indicator().as_deref(), Some("probing"));
}

// ---------------------------------------------------------------------------------------------
// The circuit breaker

#[test]
fn the_circuit_opens_after_three_consecutive_failures_at_max_throttle() {
    let clock = FakeClock::new();
    let w = window(60, 60, &clock);
    // Nine failures bring the throttle to its cap; only failures arriving there count.
    for failure in 1..=11 {
        w.record_failure("HTTP 503");
        assert_eq!(
            w.circuit_state(),
            CircuitState::Healthy,
            "after failure {failure}"
        );
    }
    assert_eq!(w.throttle(), 9.0);
    w.record_failure("HTTP 503");
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    assert_eq!(w.cooldown_remaining(), secs(30));
    assert_eq!(w.circuit_openings(), 1);
}

#[test]
fn any_success_resets_the_failure_streak() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    w.record_failure("HTTP 503");
    w.record_failure("HTTP 503");
    w.record_success();
    w.record_failure("HTTP 503");
    w.record_failure("HTTP 503");
    assert_eq!(w.circuit_state(), CircuitState::Healthy);
    w.record_failure("HTTP 503");
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
}

#[test]
fn while_the_cooldown_runs_everyone_is_refused_with_a_readable_message() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    open(&w, "HTTP 503 Service Unavailable");
    let expected = blocked_message("30 s", "HTTP 503 Service Unavailable");
    assert_eq!(message(look(&w, 1)), expected);
    assert_eq!(message(take(&w, 1)), expected);
    assert_eq!(
        message(w.ask(Amount::ONE, Ask::behind(Amount::ONE))),
        expected
    );
    assert_eq!(
        message(w.ask(Amount::ONE, Ask::behind(Amount::ZERO))),
        expected
    );
    assert_eq!(message(look(&w, 0)), expected);
    clock.advance(Duration::from_millis(12_300));
    assert_eq!(
        message(look(&w, 1)),
        blocked_message("18 s", "HTTP 503 Service Unavailable")
    );
    clock.advance(Duration::from_millis(17_500));
    assert_eq!(
        message(look(&w, 1)),
        blocked_message("200 ms", "HTTP 503 Service Unavailable")
    );
    assert_eq!(w.in_use(), 0);
    // The refusal holds for the rest of the cooldown, for the head and a follower alike.
    let for_now = Some(RefusalKind::RefusingAll {
        retry_after: Duration::from_millis(200),
    });
    assert_eq!(refusal_kind(look(&w, 1)), for_now);
    assert_eq!(
        refusal_kind(w.ask(Amount::ONE, Ask::behind(Amount::ONE).look())),
        for_now
    );
}

#[test]
fn an_open_circuit_refuses_for_now_and_an_oversized_demand_for_good() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    let answer = look(&w, 61);
    let oversized = answer.refusal().expect("never");
    assert!(oversized.is_permanent());
    assert_eq!(oversized.retry_after(), None);

    open(&w, "HTTP 503");
    clock.advance(Duration::from_millis(12_300));
    let answer = look(&w, 1);
    let blocked = answer.refusal().expect("refused while the cooldown runs");
    assert!(!blocked.is_permanent());
    assert_eq!(blocked.retry_after(), Some(Duration::from_millis(17_700)));
    assert_eq!(
        blocked.kind(),
        RefusalKind::RefusingAll {
            retry_after: Duration::from_millis(17_700)
        }
    );
}

#[test]
fn cooldown_remaining_is_zero_unless_blocked() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    assert_eq!(w.cooldown_remaining(), Duration::ZERO);
    open(&w, "HTTP 503");
    clock.advance(secs(10));
    assert_eq!(w.cooldown_remaining(), secs(20));
    assert_eq!(w.status_record().cooldown_remaining, secs(20));
    clock.advance(secs(20));
    assert_eq!(w.cooldown_remaining(), Duration::ZERO);
    assert!(take(&w, 1).is_taken());
    assert_eq!(w.circuit_state(), CircuitState::Probing);
    assert_eq!(w.cooldown_remaining(), Duration::ZERO);
    w.record_success();
    assert_eq!(w.circuit_state(), CircuitState::Healthy);
    assert_eq!(w.cooldown_remaining(), Duration::ZERO);
}

#[test]
fn after_the_cooldown_only_the_head_claims_the_probe() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    open(&w, "HTTP 503");
    clock.advance(secs(30));
    let probe = probe_message("HTTP 503");
    // A follower of a head that needs the window too is refused as if the probe were out.
    let follower = Ask::behind(Amount::ONE);
    assert_eq!(message(w.ask(Amount::ONE, follower.look())), probe);
    assert_eq!(message(w.ask(Amount::ONE, follower)), probe);
    // The head may take it; a look changes nothing.
    assert!(look(&w, 1).is_taken());
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    assert!(take(&w, 1).is_taken());
    assert_eq!(w.circuit_state(), CircuitState::Probing);
    assert_eq!(w.in_use(), 1);
    // While the probe is out, everyone is refused, the head included.
    assert_eq!(message(look(&w, 1)), probe);
    assert_eq!(message(take(&w, 1)), probe);
    assert_eq!(message(w.ask(Amount::ONE, follower)), probe);
    assert_eq!(
        message(w.ask(Amount::ONE, Ask::behind(Amount::ZERO))),
        probe
    );
    assert_eq!(w.in_use(), 1);
}

#[test]
fn a_waiter_behind_a_head_that_does_not_use_the_window_never_claims_the_probe() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    open(&w, "HTTP 503");
    clock.advance(secs(30));
    // The probe is the head's, and a zero reservation (the head does not use this window) does
    // not make the asker the head: not now, and only an event (the head leaving) can change it.
    let behind = Ask::behind(Amount::ZERO);
    assert_eq!(w.ask(Amount::ONE, behind).not_now(), Some(None));
    assert_eq!(w.ask(Amount::ONE, behind.look()).not_now(), Some(None));
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    assert_eq!(w.in_use(), 0);
    // The head takes it.
    assert!(w.ask(Amount::ONE, Ask::HEAD).is_taken());
    assert_eq!(w.circuit_state(), CircuitState::Probing);
    assert_eq!(w.in_use(), 1);
    // Once it is out, that waiter is refused like everyone else.
    assert_eq!(
        message(w.ask(Amount::ONE, behind)),
        probe_message("HTTP 503")
    );
}

#[test]
fn the_probe_still_needs_room_in_the_window() {
    let clock = FakeClock::new();
    let w = window_with(config(1, 60).with_max_throttle(0.0), &clock);
    assert!(take(&w, 1).is_taken());
    for _ in 0..3 {
        w.record_failure("HTTP 503");
    }
    clock.advance(secs(30));
    // The stamp at 0 s fills the window until 60 s.
    assert_eq!(look(&w, 1).not_now(), Some(Some(at(60))));
    assert_eq!(take(&w, 1).not_now(), Some(Some(at(60))));
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    clock.advance_to(at(60));
    assert!(take(&w, 1).is_taken());
    assert_eq!(w.circuit_state(), CircuitState::Probing);
}

#[test]
fn a_successful_probe_closes_the_circuit_and_wakes() {
    let clock = FakeClock::new();
    let w = window_with(
        config(60, 60)
            .with_max_throttle(0.0)
            .with_max_cooldown(secs(600)),
        &clock,
    );
    open(&w, "HTTP 503");
    clock.advance(secs(30));
    assert!(take(&w, 1).is_taken());
    w.record_failure("HTTP 503");
    assert_eq!(w.cooldown(), secs(60));
    clock.advance(secs(60));
    assert!(take(&w, 1).is_taken());
    let (calls, wake) = counting_wake();
    w.on_capacity_change(Some(wake));
    w.record_success();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(w.circuit_state(), CircuitState::Healthy);
    assert_eq!(
        w.cooldown(),
        secs(30),
        "the next opening starts from the initial cooldown"
    );
    assert!(take(&w, 1).is_taken());
    assert!(w.ask(Amount::ONE, Ask::behind(Amount::ONE)).is_taken());
    open(&w, "HTTP 503");
    assert_eq!(w.cooldown_remaining(), secs(30));
}

#[test]
fn a_failed_probe_reopens_with_the_cooldown_doubled_and_clamped() {
    let clock = FakeClock::new();
    let w = window_with(
        config(60, 60)
            .with_max_throttle(0.0)
            .with_max_cooldown(secs(100)),
        &clock,
    );
    open(&w, "HTTP 503");
    let mut seen = Vec::new();
    for _ in 0..4 {
        clock.advance(w.cooldown_remaining());
        assert!(take(&w, 1).is_taken(), "the head takes the probe");
        w.record_failure("HTTP 503");
        assert_eq!(w.circuit_state(), CircuitState::Blocked);
        seen.push((w.cooldown(), w.cooldown_remaining()));
    }
    assert_eq!(
        seen,
        [
            (secs(60), secs(60)),
            (secs(100), secs(100)),
            (secs(100), secs(100)),
            (secs(100), secs(100)),
        ]
    );
    assert_eq!(w.circuit_openings(), 5);
}

#[test]
fn a_cooldown_equal_to_its_maximum_stays_there() {
    let clock = FakeClock::new();
    let w = window_with(
        config(60, 60)
            .with_max_throttle(0.0)
            .with_initial_cooldown(secs(45))
            .with_max_cooldown(secs(45)),
        &clock,
    );
    open(&w, "HTTP 503");
    clock.advance(secs(45));
    assert!(take(&w, 1).is_taken());
    w.record_failure("HTTP 503");
    assert_eq!(w.cooldown(), secs(45));
    assert_eq!(w.cooldown_remaining(), secs(45));
}

#[test]
fn a_refund_without_a_verdict_reverts_the_probe_to_blocked() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    open(&w, "HTTP 503");
    clock.advance(secs(30));
    assert!(take(&w, 1).is_taken());
    let (calls, wake) = counting_wake();
    w.on_capacity_change(Some(wake));
    w.give(Amount::ONE);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    assert_eq!(w.in_use(), 0);
    assert_eq!(w.cooldown(), secs(30), "the cooldown is kept, not doubled");
    assert_eq!(
        w.cooldown_remaining(),
        Duration::ZERO,
        "and it is already over"
    );
    assert_eq!(w.circuit_openings(), 1);
    // The next head probes again at once; a follower is still refused.
    assert_eq!(
        message(w.ask(Amount::ONE, Ask::behind(Amount::ONE))),
        probe_message("HTTP 503")
    );
    assert!(take(&w, 1).is_taken());
    assert_eq!(w.circuit_state(), CircuitState::Probing);
}

#[test]
fn a_probe_without_a_verdict_expires_after_the_probe_timeout() {
    let clock = FakeClock::new();
    let w = window_with(
        config(60, 60)
            .with_max_throttle(0.0)
            .with_probe_timeout(secs(300)),
        &clock,
    );
    open(&w, "HTTP 503");
    clock.advance(secs(30));
    assert!(take(&w, 1).is_taken());
    // Refused while the probe is out, for as long as the probe may stay out: until 330 s.
    assert_eq!(
        refusal_kind(look(&w, 1)),
        Some(RefusalKind::RefusingAll {
            retry_after: secs(300)
        })
    );
    clock.advance_to(Instant::from_nanos(330 * SECOND - 1));
    assert_eq!(w.circuit_state(), CircuitState::Probing);
    clock.advance_to(at(330));
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    assert_eq!(w.cooldown(), secs(30));
    assert_eq!(w.cooldown_remaining(), Duration::ZERO);
    assert!(take(&w, 1).is_taken(), "the next head probes again");
    assert_eq!(w.circuit_state(), CircuitState::Probing);
}

#[test]
fn the_probe_timeout_defaults_to_the_max_cooldown() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    assert_eq!(w.config().resolved_probe_timeout(), secs(3_600));
    open(&w, "HTTP 503");
    clock.advance(secs(30));
    assert!(take(&w, 1).is_taken());
    clock.advance_to(Instant::from_nanos(3_630 * SECOND - 1));
    assert_eq!(w.circuit_state(), CircuitState::Probing);
    clock.advance_to(at(3_630));
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
}

#[test]
fn failures_while_blocked_change_only_the_throttle_and_the_text() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    open(&w, "HTTP 503");
    clock.advance(secs(5));
    w.record_failure("HTTP 504 Gateway Timeout");
    assert_eq!(w.circuit_openings(), 1);
    assert_eq!(w.cooldown_remaining(), secs(25));
    assert_eq!(
        message(look(&w, 1)),
        blocked_message("25 s", "HTTP 504 Gateway Timeout")
    );
}

#[test]
fn a_success_while_blocked_leaves_the_circuit_blocked() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    open(&w, "HTTP 503");
    w.record_success();
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    assert_eq!(w.cooldown_remaining(), secs(30));
}

#[test]
fn record_pressure_is_a_failure_with_a_fixed_text() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    for _ in 0..3 {
        w.record_pressure();
    }
    assert_eq!(w.circuit_state(), CircuitState::Blocked);
    assert_eq!(
        w.last_failure().as_deref(),
        Some("rate limited by the upstream")
    );
    assert_eq!(
        message(look(&w, 1)),
        blocked_message("30 s", "rate limited by the upstream")
    );
}

#[test]
fn the_refusal_quotes_a_tidied_and_bounded_failure_text() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    let page = format!("<html>\n  <body>{}</body>\n</html>", "x".repeat(500));
    open(&w, &page);
    let kept = w.last_failure().unwrap();
    // 200 characters kept, and "...".
    assert_eq!(kept.chars().count(), 203);
    assert!(kept.starts_with("<html> <body>xxx"));
    assert!(kept.ends_with("xxx..."));
    assert_eq!(message(look(&w, 1)), blocked_message("30 s", &kept));
}

#[test]
fn opening_the_circuit_calls_the_wake_slot_so_waiters_hear_at_once() {
    let clock = FakeClock::new();
    let w = breakable(&clock);
    let (calls, wake) = counting_wake();
    w.on_capacity_change(Some(wake));
    w.record_failure("HTTP 503");
    w.record_failure("HTTP 503");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    w.record_failure("HTTP 503");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------------------------
// Configuration

#[test]
fn the_defaults_are_the_documented_ones() {
    let c = config(60, 60);
    assert_eq!(c.max_throttle, 9.0);
    assert_eq!(c.failures_at_max_to_block, 3);
    assert_eq!(c.successes_per_decrease, 3);
    assert_eq!(c.initial_cooldown, secs(30));
    assert_eq!(c.max_cooldown, secs(3_600));
    assert_eq!(c.probe_timeout, None);
    assert_eq!(c.resolved_probe_timeout(), secs(3_600));
    assert_eq!(
        c.clone()
            .with_max_cooldown(secs(7_200))
            .resolved_probe_timeout(),
        secs(7_200)
    );
}

#[test]
fn the_constructor_refuses_each_field_that_cannot_work() {
    let cases: Vec<(ElasticWindowConfig, &str, &str)> = vec![
        (config(0, 60), "max_requests", "must be positive, was 0"),
        (
            ElasticWindowConfig::new(60, Duration::ZERO),
            "base_window",
            "must be positive, was 0ns",
        ),
        (
            config(60, 60).with_initial_cooldown(Duration::ZERO),
            "initial_cooldown",
            "must be positive, was 0ns",
        ),
        (
            config(60, 60).with_failures_at_max_to_block(0),
            "failures_at_max_to_block",
            "must be positive, was 0",
        ),
        (
            config(60, 60).with_successes_per_decrease(0),
            "successes_per_decrease",
            "must be positive, was 0",
        ),
        (
            config(60, 60).with_probe_timeout(Duration::ZERO),
            "probe_timeout",
            "must be positive, was 0ns",
        ),
        (
            config(60, 60).with_max_throttle(-0.5),
            "max_throttle",
            "must be a finite number of at least 0, was -0.5",
        ),
        (
            config(60, 60).with_max_throttle(f64::NAN),
            "max_throttle",
            "must be a finite number of at least 0, was NaN",
        ),
        (
            config(60, 60).with_max_throttle(f64::INFINITY),
            "max_throttle",
            "must be a finite number of at least 0, was inf",
        ),
        (
            config(60, 60).with_max_cooldown(secs(29)),
            "max_cooldown",
            "must be at least the initial cooldown (30s), was 29s",
        ),
    ];
    for (config, field, reason) in cases {
        let refused = ElasticWindow::new("search", config, FakeClock::new().shared()).unwrap_err();
        assert_eq!(refused.limiter, "elastic window");
        assert_eq!((refused.field, refused.reason.as_str()), (field, reason));
        assert_eq!(
            refused.to_string(),
            format!("invalid elastic window configuration: `{field}` {reason}")
        );
    }
}

#[test]
fn a_zero_max_throttle_and_equal_cooldowns_are_accepted() {
    let c = config(1, 1)
        .with_max_throttle(0.0)
        .with_initial_cooldown(secs(5))
        .with_max_cooldown(secs(5));
    assert!(ElasticWindow::new("search", c.clone(), FakeClock::new().shared()).is_ok());
    assert!(ElasticWindow::on_system_clock("search", c).is_ok());
}

// ---------------------------------------------------------------------------------------------
// The HTTP requirement, the status, the contract

#[test]
fn every_window_requires_an_http_connection_in_the_same_demand() {
    let clock = FakeClock::new();
    let search: Arc<ElasticWindow> = Arc::new(window(5, 10, &clock));
    assert_eq!(search.requires(), Some(Capability::HTTP_CONNECTION));
    assert_eq!(search.provides(), None);

    let alone = Demand::new().with(search.clone(), Amount::ONE);
    assert!(matches!(
        alone.check_requirements(),
        Err(AdmitError::Unmet { ref account, requires })
            if account == "search" && requires == Capability::HTTP_CONNECTION
    ));
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let refused = monitor
        .admit_blocking(alone, &JobContext::new("lonely"), None)
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "account `search` requires a `http_connection` in the same demand, and none of its \
         accounts provides one"
    );
    assert_eq!(search.in_use(), 0);

    let http = Arc::new(Http::new(1));
    let both = Demand::new()
        .with(http, Amount::ONE)
        .with(search.clone(), Amount::ONE);
    let grant = monitor
        .admit_blocking(both, &JobContext::new("connected"), None)
        .unwrap();
    assert_eq!(search.in_use(), 1);
    drop(grant);
    monitor.stop();
}

#[test]
fn the_status_reads_every_number_at_that_instant() {
    let clock = FakeClock::new();
    let w = window(5, 10, &clock);
    assert!(take(&w, 2).is_taken());
    w.record_pressure();
    clock.advance(secs(15));
    let status = w.status_record();
    assert_eq!(status.name, "search");
    assert_eq!(status.max_requests, 5);
    assert_eq!(status.base_window, secs(10));
    assert_eq!(status.effective_window, secs(20));
    assert_eq!(status.in_use, 2);
    assert_eq!(status.throttle, 1.0);
    assert_eq!(status.circuit, CircuitState::Healthy);
    assert_eq!(status.cooldown_remaining, Duration::ZERO);
    let boxed = w.status();
    assert_eq!(boxed.category(), Category::custom("elastic_window"));
    assert_eq!(
        boxed.summary(),
        "search [elastic_window]: 2 of 5 requests in a 20s window (base 10s), throttle 1.0, \
         circuit healthy, cooldown 0ns"
    );
    let json = serde_json::to_value(&*boxed).unwrap();
    assert_eq!(json["in_use"], 2);
    assert_eq!(json["circuit"], "healthy");
    assert_eq!(json["effective_window"], 20_000.0);
}

#[test]
fn a_healthy_window_passes_the_account_contract_suite() {
    contract::run_all(|| {
        let clock = FakeClock::new();
        let w = window(5, 10, &clock);
        Subject::time(Arc::new(w), clock, Amount::ONE, 5).with_never_fits(Amount::units(6))
    });
    contract::run_all(|| {
        let clock = FakeClock::new();
        let w = window(12, 1, &clock);
        Subject::time(Arc::new(w), clock, Amount::units(4), 3).with_never_fits(Amount::units(13))
    });
}

// ---------------------------------------------------------------------------------------------
// Inside a real monitor

/// A started monitor on `clock` recording its events.
fn monitor_on(clock: &FakeClock) -> (Monitor, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::new());
    let monitor = Monitor::builder()
        .clock(clock.shared())
        .sink(recorder.clone())
        .build();
    monitor.start().expect("a fresh monitor starts");
    (monitor, recorder)
}

#[test]
fn inside_a_monitor_a_waiter_short_on_the_window_is_granted_when_its_oldest_stamp_leaves() {
    let clock = FakeClock::new();
    let (monitor, recorder) = monitor_on(&clock);
    let http = Arc::new(Http::new(4));
    let search = Arc::new(window(2, 10, &clock));
    let demand = || {
        Demand::new()
            .with(http.clone(), Amount::ONE)
            .with(search.clone(), Amount::ONE)
    };
    drop(
        monitor
            .admit_blocking(demand(), &JobContext::new("first"), None)
            .unwrap(),
    );
    clock.advance(secs(1));
    drop(
        monitor
            .admit_blocking(demand(), &JobContext::new("second"), None)
            .unwrap(),
    );

    let third = JobContext::new("third");
    let id = third.id();
    let waiter = spawn_thread_waiter(&monitor, demand(), third, None);
    wait_for_queue(&monitor, 1);
    // A pass at 1 s (ours or the evaluator's, whichever runs first) finds it short on `search`
    // until the stamp taken at 0 s leaves the window at 10 s.
    assert_eq!(monitor.pass_now(), Some(at(10)));
    clock.advance_to(Instant::from_nanos(10 * SECOND - 1));
    assert_eq!(monitor.pass_now(), Some(at(10)));
    assert_eq!(monitor.queue_size(), 1);

    clock.advance_to(at(10));
    let grant = waiter
        .outcome()
        .expect("granted when the stamp at 0 s leaves");
    assert_eq!(grant.wall_wait(), secs(9));
    assert_eq!(grant.wait_times().get("search"), Some(&secs(9)));
    assert_eq!(search.in_use(), 2);
    assert_eq!(http.0.in_use(), 1);
    let kinds: Vec<&str> = recorder
        .for_job(id)
        .iter()
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(kinds, ["held", "granted_from_hold"]);
    drop(grant);
    assert_eq!(http.0.in_use(), 0);
    monitor.stop();
}

#[test]
fn inside_a_monitor_an_open_circuit_refuses_a_parked_waiter_with_circuit_blocked() {
    let clock = FakeClock::new();
    let (monitor, recorder) = monitor_on(&clock);
    let http = Arc::new(Http::new(4));
    let search = Arc::new(window_with(config(2, 60).with_max_throttle(0.0), &clock));
    let demand = || {
        Demand::new()
            .with(http.clone(), Amount::ONE)
            .with(search.clone(), Amount::ONE)
    };
    drop(
        monitor
            .admit_blocking(demand(), &JobContext::new("first"), None)
            .unwrap(),
    );
    drop(
        monitor
            .admit_blocking(demand(), &JobContext::new("second"), None)
            .unwrap(),
    );
    let parked = JobContext::new("parked");
    let id = parked.id();
    let waiter = spawn_thread_waiter(&monitor, demand(), parked, None);
    wait_for_queue(&monitor, 1);

    for _ in 0..3 {
        search.record_failure("HTTP 503 Service Unavailable");
    }
    // The clock has not moved: the opening itself woke the monitor.
    let refusal = match waiter.outcome() {
        Err(AdmitError::Refused { account, refusal }) => {
            assert_eq!(account, "search");
            refusal
        }
        other => panic!("expected a refusal from `search`, saw {other:?}"),
    };
    let text = "The rate limiter `search` (2 requests per 60 s) is refusing every call for \
                another 30 s: its upstream kept failing, so its circuit breaker is open. The \
                upstream's last failure: HTTP 503 Service Unavailable. Do not wait for this \
                tool; pick another tool to continue.";
    assert_eq!(refusal.message(), text);
    assert_eq!(
        refusal.retry_after(),
        Some(secs(30)),
        "the whole cooldown is ahead"
    );
    let events = recorder.for_job(id);
    let last = events.last().expect("events for the parked job");
    assert_eq!(
        last.kind,
        EventKind::Rejected {
            reason: RejectReason::CircuitBlocked,
            message: format!("account `search` refused the demand: {text}"),
        }
    );
    assert_eq!(http.0.in_use(), 0);
    assert_eq!(monitor.queue_size(), 0);
    monitor.stop();
}

/// A monitor with manual passes on `clock`, an HTTP gate of four, a `db` gate of one permit held
/// by the returned grant (taken outside any line), and a breakable `search` window whose circuit
/// is half open: blocked, its cooldown over, the probe the head's to take.
fn half_open_rig(clock: &FakeClock) -> (Monitor, Arc<Http>, Arc<CountingGate>, Arc<ElasticWindow>) {
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let http = Arc::new(Http::new(4));
    let db = Arc::new(CountingGate::new("db", 1, clock.shared()).expect("one permit is valid"));
    let search = Arc::new(breakable(clock));
    open(&search, "HTTP 503");
    clock.advance(secs(30));
    (monitor, http, db, search)
}

#[test]
fn inside_a_monitor_a_waiter_behind_a_head_that_does_not_use_the_window_never_takes_the_probe() {
    let clock = FakeClock::new();
    let (monitor, http, db, search) = half_open_rig(&clock);
    let holder = monitor
        .admit_blocking(
            Demand::new().with(db.clone(), Amount::ONE),
            &JobContext::new("holder"),
            None,
        )
        .unwrap();

    // The older job heads the line, parked on the db, which it cannot get; it does not use the
    // window.
    let mut head = Box::pin(monitor.admit(
        Demand::new().with(db.clone(), Amount::ONE),
        &JobContext::new("head"),
        None,
    ));
    assert!(poll_once(&mut head).is_none());
    // The newer job needs only the window (and its connection). It is not the head, so the
    // window's one probe is not its to take, on arrival or in any pass.
    let mut newer = Box::pin(Box::pin(
        monitor.admit(
            Demand::new()
                .with(http.clone(), Amount::ONE)
                .with(search.clone(), Amount::ONE),
            &JobContext::new("newer"),
            None,
        ),
    ));
    assert!(
        poll_once(&mut newer).is_none(),
        "the newer waiter took the probe while the head was not the one asking"
    );
    assert_eq!(monitor.pass_now(), None, "only an event can change this");
    assert!(poll_once(&mut newer).is_none());
    assert_eq!(monitor.queue_size(), 2);
    assert_eq!(search.circuit_state(), CircuitState::Blocked);
    assert_eq!((search.in_use(), http.0.in_use()), (0, 0));

    // The db comes back: the head is granted and leaves, the newer job heads the line and,
    // asking as the head, takes the probe.
    drop(holder);
    monitor.pass_now();
    let head = poll_once(&mut head)
        .expect("the head is granted the db")
        .unwrap();
    let newer = poll_once(&mut newer)
        .expect("the new head takes the probe")
        .unwrap();
    assert_eq!(search.circuit_state(), CircuitState::Probing);
    assert_eq!((search.in_use(), http.0.in_use(), db.in_use()), (1, 1, 1));
    assert_eq!(monitor.queue_size(), 0);
    drop((head, newer));
}

#[test]
fn inside_a_monitor_a_head_that_uses_the_window_takes_the_probe_and_its_follower_is_refused() {
    let clock = FakeClock::new();
    let (monitor, http, db, search) = half_open_rig(&clock);
    let holder = monitor
        .admit_blocking(
            Demand::new().with(db.clone(), Amount::ONE),
            &JobContext::new("holder"),
            None,
        )
        .unwrap();

    // The head needs the db and the window; it parks on the db.
    let mut head = Box::pin(Box::pin(
        monitor.admit(
            Demand::new()
                .with(db.clone(), Amount::ONE)
                .with(http.clone(), Amount::ONE)
                .with(search.clone(), Amount::ONE),
            &JobContext::new("head"),
            None,
        ),
    ));
    assert!(poll_once(&mut head).is_none());
    assert_eq!(search.circuit_state(), CircuitState::Blocked);
    // A follower that needs the window is refused as though the head's probe were out.
    let mut follower = Box::pin(Box::pin(
        monitor.admit(
            Demand::new()
                .with(http.clone(), Amount::ONE)
                .with(search.clone(), Amount::ONE),
            &JobContext::new("follower"),
            None,
        ),
    ));
    match poll_once(&mut follower) {
        Some(Err(AdmitError::Refused { account, refusal })) => {
            assert_eq!(account, "search");
            assert_eq!(refusal.message(), probe_message("HTTP 503"));
        }
        other => panic!("expected a refusal from `search`, saw {other:?}"),
    }

    // The db comes back: the head, asking as the head, takes the probe with its demand.
    drop(holder);
    monitor.pass_now();
    let head = poll_once(&mut head)
        .expect("the head is granted with the probe")
        .unwrap();
    assert_eq!(search.circuit_state(), CircuitState::Probing);
    assert_eq!((search.in_use(), http.0.in_use(), db.in_use()), (1, 1, 1));
    drop(head);
    assert_eq!((http.0.in_use(), db.in_use()), (0, 0));
}

// ---------------------------------------------------------------------------------------------
// Concurrency

/// Runs `work(i)` on `n` threads released together; returns their results in thread order.
fn race<T: Send + 'static>(n: usize, work: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let work = Arc::new(work);
    let start = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (work, start) = (work.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                work(i)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("a racing thread panicked"))
        .collect()
}

#[test]
fn of_fifty_threads_racing_for_the_probe_exactly_one_wins() {
    let clock = FakeClock::new();
    let w = Arc::new(breakable(&clock));
    open(&w, "HTTP 503");
    clock.advance(secs(30));
    let racer = w.clone();
    let answers = race(50, move |_| racer.ask(Amount::ONE, Ask::HEAD));
    let won = answers.iter().filter(|a| a.is_taken()).count();
    let refused = answers.iter().filter(|a| a.refusal().is_some()).count();
    assert_eq!((won, refused), (1, 49));
    assert_eq!(w.circuit_state(), CircuitState::Probing);
    assert_eq!(w.in_use(), 1);
}

#[test]
fn concurrent_failures_open_the_circuit_once_and_leave_it_blocked() {
    for w in [
        window(60, 60, &FakeClock::new()),
        breakable(&FakeClock::new()),
    ] {
        let w = Arc::new(w);
        let racer = w.clone();
        race(50, move |_| {
            for _ in 0..10 {
                racer.record_failure("HTTP 503");
            }
        });
        assert_eq!(w.circuit_openings(), 1);
        assert_eq!(w.circuit_state(), CircuitState::Blocked);
        assert_eq!(w.cooldown_remaining(), secs(30));
    }
}

#[test]
fn concurrent_status_reads_never_drop_a_live_stamp() {
    const TAKERS: usize = 4;
    const EACH: u64 = 250;
    let clock = FakeClock::new();
    let w = Arc::new(window(TAKERS as u64 * EACH, 60, &clock));
    let taken = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let (racer, count, finished, ticker) = (w.clone(), taken.clone(), done.clone(), clock.clone());
    let seen = race(TAKERS * 2 + 1, move |i| {
        let mut last = 0;
        if i < TAKERS {
            for _ in 0..EACH {
                assert!(racer.ask(Amount::ONE, Ask::HEAD).is_taken());
                count.fetch_add(1, Ordering::SeqCst);
            }
            finished.fetch_add(1, Ordering::SeqCst);
        } else if i < TAKERS * 2 {
            while finished.load(Ordering::SeqCst) < TAKERS {
                let floor = count.load(Ordering::SeqCst);
                let status = racer.status_record();
                let _ = racer.ask(Amount::ONE, Ask::HEAD.look());
                let _ = racer.status_indicator();
                assert!(
                    status.in_use >= floor && status.in_use >= last,
                    "a read saw {} in use after {floor} takes and an earlier read of {last}",
                    status.in_use
                );
                last = status.in_use;
            }
        } else {
            // Time moves, but never far enough for a stamp to leave the 60 s window.
            for _ in 0..1_000 {
                ticker.advance(Duration::from_millis(10));
                thread::yield_now();
            }
        }
        last
    });
    assert!(seen.iter().all(|&n| n <= TAKERS as u64 * EACH));
    assert_eq!(w.in_use(), TAKERS as u64 * EACH);
    assert_eq!(taken.load(Ordering::SeqCst), TAKERS as u64 * EACH);
}

/// A small deterministic generator for the soak's choices.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Checks the window's bounds: in use within `max`, throttle within `[0, max_throttle]`.
fn assert_in_bounds(w: &ElasticWindow) {
    let status = w.status_record();
    let c = w.config();
    assert!(
        status.in_use <= c.max_requests,
        "{} in use of {}",
        status.in_use,
        c.max_requests
    );
    assert!(
        (0.0..=c.max_throttle).contains(&status.throttle),
        "throttle {} outside [0, {}]",
        status.throttle,
        c.max_throttle
    );
    // Windows are kept in nanoseconds, so one beyond u64::MAX of them counts as that long.
    assert!(status.effective_window >= c.base_window.min(Duration::from_nanos(u64::MAX)));
    if status.circuit != CircuitState::Blocked {
        assert_eq!(status.cooldown_remaining, Duration::ZERO);
    }
}

#[test]
fn a_soak_of_twenty_threads_of_mixed_operations_stays_within_bounds() {
    let clock = FakeClock::new();
    let w = Arc::new(window_with(
        config(10, 1)
            .with_max_throttle(3.0)
            .with_initial_cooldown(secs(1))
            .with_max_cooldown(secs(8))
            .with_probe_timeout(secs(5)),
        &clock,
    ));
    let (calls, wake) = counting_wake();
    w.on_capacity_change(Some(wake));
    let (racer, ticker) = (w.clone(), clock.clone());
    race(20, move |i| {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1));
        for _ in 0..500 {
            // The head, a waiter behind a head that does not use the window, or behind one that
            // reserves one request of it.
            let ask = match rng.next(3) {
                0 => Ask::HEAD,
                n => Ask::behind(Amount::units(n - 1)),
            };
            match rng.next(10) {
                0 | 1 => {
                    let taken = racer.ask(Amount::units(1 + rng.next(3)), ask);
                    if taken.is_taken() && rng.next(4) == 0 {
                        racer.give(Amount::ONE);
                    }
                }
                2 => racer.give(Amount::units(rng.next(3))),
                3 => racer.record_success(),
                4 => racer.record_failure("HTTP 503"),
                5 => racer.record_pressure(),
                6 => racer.record_advisory_pressure(),
                7 => {
                    let _ = racer.ask(Amount::units(rng.next(12)), ask.look());
                }
                8 => {
                    let _ = racer.status_indicator();
                    let _ = racer.cooldown_remaining();
                }
                _ => ticker.advance(Duration::from_millis(rng.next(2_000))),
            }
            assert_in_bounds(&racer);
        }
    });
    assert_in_bounds(&w);
    assert!(calls.load(Ordering::SeqCst) > 0);
}

// ---------------------------------------------------------------------------------------------
// No input panics

#[derive(Clone, Debug)]
enum Op {
    /// Asks for the first count, as the head (`None`) or behind a head reserving the second.
    Take(u64, Option<u64>),
    Look(u64, Option<u64>),
    Give(u64),
    Success,
    Failure,
    Advisory,
    Advance(u64),
    Status,
}

/// The head for `None`, else a waiter behind a head reserving that many requests.
fn asker(reserved: Option<u64>) -> Ask<'static> {
    reserved.map_or(Ask::HEAD, |r| Ask::behind(Amount::units(r)))
}

fn any_count() -> impl Strategy<Value = u64> {
    prop_oneof![0..20u64, Just(u64::MAX), Just(u64::MAX - 1), any::<u64>()]
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any_count(), prop::option::of(any_count())).prop_map(|(m, r)| Op::Take(m, r)),
        (any_count(), prop::option::of(any_count())).prop_map(|(m, r)| Op::Look(m, r)),
        any_count().prop_map(Op::Give),
        Just(Op::Success),
        Just(Op::Failure),
        Just(Op::Advisory),
        prop_oneof![0..5 * SECOND, any::<u64>()].prop_map(Op::Advance),
        Just(Op::Status),
    ]
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (1..100u64).prop_map(Duration::from_secs),
        (1..u64::MAX).prop_map(Duration::from_nanos),
        Just(Duration::MAX),
    ]
}

fn any_config() -> impl Strategy<Value = ElasticWindowConfig> {
    (
        prop_oneof![1..20u64, Just(u64::MAX)],
        any_duration(),
        prop_oneof![0.0..20.0f64, Just(f64::MAX)],
        1..5u32,
        any_duration(),
    )
        .prop_map(|(max, base, throttle, failures, cooldown)| {
            ElasticWindowConfig::new(max, base)
                .with_max_throttle(throttle)
                .with_failures_at_max_to_block(failures)
                .with_initial_cooldown(cooldown)
                .with_max_cooldown(cooldown.saturating_mul(4))
        })
}

proptest! {
    #[test]
    fn no_sequence_of_calls_panics_or_leaves_the_bounds(
        config in any_config(),
        ops in prop::collection::vec(any_op(), 1..60),
    ) {
        let clock = FakeClock::new();
        let w = window_with(config, &clock);
        for op in ops {
            match op {
                Op::Take(m, r) => { let _ = w.ask(Amount::units(m), asker(r)); }
                Op::Look(m, r) => { let _ = w.ask(Amount::units(m), asker(r).look()); }
                Op::Give(n) => w.give(Amount::units(n)),
                Op::Success => w.record_success(),
                Op::Failure => w.record_failure("HTTP 503"),
                Op::Advisory => w.record_advisory_pressure(),
                Op::Advance(n) => clock.advance(Duration::from_nanos(n)),
                Op::Status => {
                    let _ = w.status().summary();
                    let _ = w.status_indicator();
                }
            }
            assert_in_bounds(&w);
        }
    }
}
