//! Time is read once per admission, whatever the number of accounts: the monitor hands one
//! instant to every account it asks, an account that needs no time reads none, and a counting
//! gate stamps its activity from that instant or a coarse reading. Counted on a clock that
//! counts its precise and its coarse readings apart.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use admission_accounts::counting_gate::CountingGate;
use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
use admission_core::{Clock, Demand, Instant, JobContext, Monitor};

use crate::{demand, on};

/// A still clock (moved by hand) that counts `now` and `coarse_now` apart.
#[derive(Debug, Default)]
struct Counted {
    at: AtomicU64,
    precise: AtomicUsize,
    coarse: AtomicUsize,
}

impl Counted {
    /// (precise, coarse) readings since the last call.
    fn take(&self) -> (usize, usize) {
        (
            self.precise.swap(0, Ordering::SeqCst),
            self.coarse.swap(0, Ordering::SeqCst),
        )
    }

    fn advance(&self, by: Duration) {
        self.at
            .fetch_add(u64::try_from(by.as_nanos()).unwrap(), Ordering::SeqCst);
    }
}

impl Clock for Counted {
    fn now(&self) -> Instant {
        self.precise.fetch_add(1, Ordering::SeqCst);
        Instant::from_nanos(self.at.load(Ordering::SeqCst))
    }
    fn coarse_now(&self) -> Instant {
        self.coarse.fetch_add(1, Ordering::SeqCst);
        Instant::from_nanos(self.at.load(Ordering::SeqCst))
    }
}

/// A monitor sleeps on it as on any clock real time moves (the tests run passes by hand).
impl admission_core::Timer for Counted {}

/// A monitor on `clock` whose passes the test runs.
fn monitor_on(clock: &Arc<Counted>) -> Monitor {
    Monitor::builder()
        .manual_passes()
        .clock(clock.clone())
        .build()
}

fn buckets(clock: &Arc<Counted>, n: usize) -> Vec<Arc<TokenBucket>> {
    let buckets = (0..n)
        .map(|i| {
            let config = TokenBucketConfig::new(60, 60);
            Arc::new(TokenBucket::new(format!("bucket-{i}"), config, clock.clone()).unwrap())
        })
        .collect();
    // Building a bucket reads its clock once (the instant it starts full).
    clock.take();
    buckets
}

fn gates(clock: &Arc<Counted>, n: usize) -> Vec<Arc<CountingGate>> {
    (0..n)
        .map(|i| Arc::new(CountingGate::new(format!("gate-{i}"), 2, clock.clone()).unwrap()))
        .collect()
}

fn on_each<A: admission_core::Account>(accounts: &[Arc<A>], units: u64) -> Demand {
    let parts: Vec<_> = accounts.iter().map(|a| (on(a), units)).collect();
    demand(&parts)
}

#[test]
fn an_admit_on_three_clocked_accounts_reads_the_clock_once() {
    let clock = Arc::new(Counted::default());
    let monitor = monitor_on(&clock);
    let three = buckets(&clock, 3);
    let ctx = JobContext::new("three");

    let grant = monitor
        .admit_blocking(on_each(&three, 1), &ctx, None)
        .unwrap();
    assert_eq!(clock.take(), (1, 0), "admit_blocking");
    // A release gives a clocked account nothing back and reads no time.
    drop(grant);
    assert_eq!(clock.take(), (0, 0), "release");

    let demand = on_each(&three, 1);
    let grant = monitor.try_admit(&demand, &ctx).unwrap();
    assert_eq!(clock.take(), (1, 0), "try_admit");
    drop(grant);
    assert_eq!(clock.take(), (0, 0), "release of the borrowed grant");
}

#[test]
fn counting_gates_read_no_precise_time_and_stamp_a_coarse_one() {
    let clock = Arc::new(Counted::default());
    let monitor = monitor_on(&clock);
    let three = gates(&clock, 3);
    clock.advance(Duration::from_millis(7));
    let grant = monitor
        .admit_blocking(on_each(&three, 1), &JobContext::new("gates"), None)
        .unwrap();
    // One coarse reading per take: nobody read a precise instant to share.
    assert_eq!(clock.take(), (0, 3), "admit");
    clock.advance(Duration::from_millis(5));
    drop(grant);
    assert_eq!(clock.take(), (0, 3), "release: a coarse reading per give");
    for gate in &three {
        assert_eq!(
            gate.last_activity(),
            Some(Instant::from_nanos(12_000_000)),
            "{}'s stamp is its give's coarse reading",
            gate.name()
        );
    }
}

#[test]
fn a_gate_after_a_clocked_account_stamps_the_instant_the_demand_was_asked_at() {
    let clock = Arc::new(Counted::default());
    let monitor = monitor_on(&clock);
    let gate_before = gates(&clock, 1).remove(0);
    let bucket = buckets(&clock, 1).remove(0);
    let gate_after = gates(&clock, 1).remove(0);
    clock.advance(Duration::from_millis(3));
    let demand = demand(&[
        (on(&gate_before), 1),
        (on(&bucket), 1),
        (on(&gate_after), 1),
    ]);
    let grant = monitor
        .admit_blocking(demand, &JobContext::new("mixed"), None)
        .unwrap();
    // The first gate found no instant read yet (a coarse one); the bucket read the one instant;
    // the second gate stamped it.
    assert_eq!(clock.take(), (1, 1));
    let three_ms = Some(Instant::from_nanos(3_000_000));
    assert_eq!(gate_before.last_activity(), three_ms);
    assert_eq!(gate_after.last_activity(), three_ms);
    drop(grant);
}

#[test]
fn a_pass_asks_every_waiter_and_account_at_one_instant() {
    let clock = Arc::new(Counted::default());
    let monitor = monitor_on(&clock);
    // 60 tokens a minute: each bucket holds 60 and refills one a second.
    let three = buckets(&clock, 3);
    let ctx = JobContext::new("drain");
    let held = monitor.admit_blocking(on_each(&three, 60), &ctx, None);
    assert!(held.is_ok());
    clock.take();
    // Two waiters of one token on every bucket park (each arrival reads once).
    let mut waiting: Vec<_> = (0..2)
        .map(|i| {
            Box::pin(monitor.admit(on_each(&three, 1), &JobContext::new(format!("w{i}")), None))
        })
        .collect();
    for admit in &mut waiting {
        assert!(admission_testkit::monitor::poll_once(admit).is_none());
    }
    assert_eq!(clock.take(), (2, 0), "two arrivals, one reading each");
    clock.advance(Duration::from_secs(2));
    monitor.pass_now();
    // One reading for the whole pass: two waiters granted, three buckets asked for each.
    assert_eq!(clock.take(), (1, 0), "the pass");
    for admit in &mut waiting {
        assert!(matches!(
            admission_testkit::monitor::poll_once(admit),
            Some(Ok(_))
        ));
    }
}
