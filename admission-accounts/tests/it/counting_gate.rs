//! The counting gate: permits that come back on release, held to the account contract.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use admission_accounts::SemaphoreStatus;
use admission_accounts::counting_gate::CountingGate;
use admission_core::{
    Account, Amount, Answer, Ask, Capability, Category, Demand, Instant, JobContext, Monitor,
    RefusalKind, Replenishment, WakeFn,
};
use admission_testkit::FakeClock;
use admission_testkit::contract::{self, Subject};
use admission_testkit::monitor::poll_once;

fn gate(capacity: u64) -> CountingGate {
    gate_on(capacity, &FakeClock::new())
}

fn gate_on(capacity: u64, clock: &FakeClock) -> CountingGate {
    CountingGate::new("pool", capacity, clock.shared()).expect("a positive capacity is valid")
}

fn counting_wake() -> (Arc<AtomicUsize>, WakeFn) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let wake: WakeFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (calls, wake)
}

#[test]
fn passes_the_whole_account_contract_taking_two_at_a_time() {
    contract::run_all(|| {
        Subject::release(Arc::new(gate(10)), Amount::units(2), 5).with_never_fits(Amount::units(11))
    });
}

#[test]
fn passes_the_whole_account_contract_as_a_single_permit() {
    contract::run_all(|| {
        Subject::release(Arc::new(gate(1)), Amount::ONE, 1).with_never_fits(Amount::units(2))
    });
}

#[test]
fn a_zero_capacity_is_a_config_error_naming_the_field() {
    let refused = CountingGate::new("db", 0, FakeClock::new().shared()).unwrap_err();
    assert_eq!(refused.limiter, "counting gate");
    assert_eq!(refused.field, "capacity");
    assert!(refused.to_string().contains("`capacity`"), "{refused}");
    assert!(CountingGate::http(0, FakeClock::new().shared()).is_err());
    assert!(CountingGate::on_system_clock("db", 0).is_err());
}

#[test]
fn a_demand_above_capacity_is_never_on_a_look_and_on_a_take_naming_gate_demand_and_capacity() {
    let gate = gate(10);
    for ask in [Ask::HEAD.look(), Ask::HEAD, Ask::behind(Amount::units(5))] {
        let answer = gate.ask(Amount::units(11), ask);
        let refusal = answer.refusal().expect("never");
        assert_eq!(
            refusal.kind(),
            RefusalKind::TooLarge {
                asked: Amount::units(11),
                max: Amount::units(10)
            }
        );
        assert_eq!(
            refusal.message(),
            "`pool` has 10 permits in all; a demand of 11 can never fit (ask for at most 10)"
        );
    }
    assert_eq!(gate.in_use(), 0);
    assert_eq!(gate.last_activity(), None);
}

#[test]
fn a_demand_of_exactly_the_capacity_fits_a_free_gate() {
    let gate = gate(10);
    assert!(matches!(
        gate.ask(Amount::units(10), Ask::HEAD.look()),
        Answer::Taken
    ));
    assert_eq!(gate.in_use(), 0, "a look takes nothing");
    assert!(matches!(
        gate.ask(Amount::units(10), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!((gate.available(), gate.in_use()), (0, 10));
}

#[test]
fn only_the_primary_dimension_is_read() {
    let gate = gate(2);
    assert!(matches!(
        gate.ask(Amount::from_dimensions([2, 99, 99, 99]), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!(gate.in_use(), 2);
}

#[test]
fn the_reservation_makes_not_now_never_never() {
    let gate = gate(10);
    assert!(matches!(
        gate.ask(Amount::units(6), Ask::HEAD),
        Answer::Taken
    ));
    assert!(matches!(
        gate.ask(Amount::units(4), Ask::HEAD.look()),
        Answer::Taken
    ));
    assert_eq!(
        gate.ask(Amount::units(4), Ask::behind(Amount::ONE).look())
            .not_now(),
        Some(None)
    );
    assert_eq!(
        gate.ask(Amount::units(1), Ask::behind(Amount::units(4)))
            .not_now(),
        Some(None)
    );
    assert_eq!(
        gate.ask(Amount::units(10), Ask::behind(Amount::units(u64::MAX)))
            .not_now(),
        Some(None)
    );
    assert_eq!(gate.in_use(), 6);
}

#[test]
fn not_now_never_names_an_instant_because_only_a_give_frees_a_permit() {
    let gate = gate(3);
    assert!(matches!(
        gate.ask(Amount::units(3), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!(
        gate.ask(Amount::ONE, Ask::HEAD.look()).not_now(),
        Some(None)
    );
    assert_eq!(gate.ask(Amount::ONE, Ask::HEAD).not_now(), Some(None));
    assert_eq!(
        gate.ask(Amount::ONE, Ask::behind(Amount::ONE)).not_now(),
        Some(None)
    );
    assert_eq!(
        gate.ask(Amount::units(4), Ask::HEAD.look())
            .refusal()
            .map(|r| r.kind()),
        Some(RefusalKind::TooLarge {
            asked: Amount::units(4),
            max: Amount::units(3)
        })
    );
}

#[test]
fn every_take_and_give_stamps_last_activity_from_the_injected_clock() {
    let clock = FakeClock::new();
    let gate = gate_on(2, &clock);
    assert_eq!(gate.last_activity(), None);

    assert!(matches!(gate.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    assert_eq!(gate.last_activity(), Some(Instant::ZERO));

    clock.advance(Duration::from_secs(2));
    assert!(matches!(gate.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    assert_eq!(
        gate.last_activity(),
        Some(Instant::from_nanos(2_000_000_000))
    );

    clock.advance(Duration::from_secs(3));
    gate.give(Amount::ONE);
    assert_eq!(
        gate.last_activity(),
        Some(Instant::from_nanos(5_000_000_000))
    );
}

#[test]
fn a_refused_take_changes_nothing_not_even_the_stamp() {
    let clock = FakeClock::new();
    let gate = gate_on(1, &clock);
    assert!(matches!(gate.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    clock.advance(Duration::from_secs(1));
    assert_eq!(gate.ask(Amount::ONE, Ask::HEAD).not_now(), Some(None));
    assert_eq!(
        gate.ask(Amount::units(2), Ask::HEAD)
            .refusal()
            .map(|r| r.kind()),
        Some(RefusalKind::TooLarge {
            asked: Amount::units(2),
            max: Amount::ONE
        })
    );
    assert_eq!(gate.last_activity(), Some(Instant::ZERO));
    assert_eq!(gate.in_use(), 1);
}

#[test]
fn give_calls_the_wake_slot_and_take_never_does() {
    let gate = gate(2);
    let (calls, wake) = counting_wake();
    gate.on_capacity_change(Some(wake));
    assert!(matches!(
        gate.ask(Amount::units(2), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    gate.give(Amount::ONE);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    gate.give(Amount::ONE);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    gate.on_capacity_change(None);
    assert!(matches!(gate.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    gate.give(Amount::ONE);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn giving_back_more_than_is_in_use_never_underflows() {
    let gate = gate(4);
    assert!(matches!(gate.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    gate.give(Amount::units(u64::MAX));
    assert_eq!((gate.available(), gate.in_use()), (4, 0));
    assert!(matches!(
        gate.ask(Amount::units(4), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!(gate.ask(Amount::ONE, Ask::HEAD).not_now(), Some(None));
}

#[test]
fn status_reports_max_concurrent_available_active_and_the_stamp() {
    let clock = FakeClock::new();
    let gate = gate_on(8, &clock);
    clock.advance(Duration::from_secs(2));
    assert!(matches!(
        gate.ask(Amount::units(3), Ask::HEAD),
        Answer::Taken
    ));
    let expected = SemaphoreStatus {
        name: "pool".into(),
        max_concurrent: 8,
        available_permits: 5,
        last_activity: Some(Instant::from_nanos(2_000_000_000)),
    };
    assert_eq!(gate.semaphore_status(), expected);
    assert_eq!(gate.semaphore_status().active_count(), 3);
    let boxed = gate.status();
    assert_eq!(boxed.name(), "pool");
    assert_eq!(boxed.category(), Category::custom("semaphore"));
    assert_eq!(
        boxed.summary(),
        "pool [semaphore]: 3 of 8 permits in use, 5 available, last activity at 2s"
    );
    assert_eq!(gate.status_indicator(), None);
}

#[test]
fn the_http_gate_provides_the_http_connection_capability() {
    let http = CountingGate::http(16, FakeClock::new().shared()).unwrap();
    assert_eq!(http.name(), "http");
    assert_eq!(http.capacity(), 16);
    assert_eq!(http.provides(), Some(Capability::HTTP_CONNECTION));
    assert_eq!(gate(1).provides(), None);
    let custom = gate(1).with_capability(Capability::custom("gpu"));
    assert_eq!(custom.provides(), Some(Capability::custom("gpu")));
    assert_eq!(http.requires(), None);
}

#[test]
fn it_is_a_release_account_of_category_semaphore() {
    let gate = gate(1);
    assert_eq!(gate.category(), Category::custom("semaphore"));
    assert_eq!(gate.replenishment(), Replenishment::Release);
}

#[test]
fn debug_names_the_gate_and_its_counts() {
    let gate = gate(3);
    assert!(matches!(gate.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    let shown = format!("{gate:?}");
    assert!(
        shown.starts_with("CountingGate")
            && shown.contains("\"pool\"")
            && shown.contains("in_use: 1"),
        "{shown}"
    );
}

#[test]
fn it_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CountingGate>();
}

#[test]
fn a_waiter_on_a_full_gate_is_granted_by_the_release_of_a_permit() {
    let clock = FakeClock::new();
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let gate = Arc::new(gate_on(1, &clock));
    let demand = || Demand::new().with(gate.clone(), Amount::ONE);
    let first = monitor
        .admit_blocking(demand(), &JobContext::new("first"), None)
        .unwrap();

    let mut second = Box::pin(monitor.admit(demand(), &JobContext::new("second"), None));
    assert!(poll_once(&mut second).is_none());
    assert_eq!(monitor.pass_now(), None);
    clock.advance(Duration::from_secs(3_600));
    monitor.pass_now();
    assert!(
        poll_once(&mut second).is_none(),
        "time gives a gate nothing"
    );

    drop(first);
    monitor.pass_now();
    let granted = poll_once(&mut second).expect("granted").unwrap();
    assert_eq!(gate.in_use(), 1);
    drop(granted);
    assert_eq!(gate.in_use(), 0);
}
