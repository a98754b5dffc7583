//! Criterion benches of the [`Monitor`], each group run beside the peer it is measured against.
//!
//! - `uncontended_three_limits` / `uncontended_one_limit`: admit and release a demand nobody
//!   competes for, against the chain of tokio semaphores and a governor limiter written by hand.
//! - `uncontended_parts`: the pieces the uncontended path is made of, to see where its time goes.
//! - `pass_over_10k_parked`: one evaluator pass over 10,000 waiters that all stay parked.
//! - `give_to_running`: from a release to the parked waiter running, against a `Condvar` wake and
//!   a tokio semaphore hand-off.
//! - `empty_line_by_drops`: a line of 1,000 or 100,000 parked admits on one held permit emptied
//!   by dropping each, oldest first (each drop is the head's) and newest first (each behind the
//!   head), against as many parked tokio `acquire` futures dropped; per drop (criterion's
//!   throughput: elements are drops).
//!
//! The accounts are the test-kit's reference accounts (`Permits`, `Meter`), as when the "Earlier
//! measurements" of `docs/benchmarks/2026-11-30-first-benchmarks.md` were recorded; the side-by-side benches (`side_by_side`) measure the
//! same paths on the production families. Run with
//! `cargo bench -p admission-benches --bench monitor`.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use admission_benches::support::{
    self, HandOff, HeldWatch, Link, MonitorTask, Parked, ParkedLine, SemaphoreTask, admit_release,
    hand_off,
};
use admission_core::{
    AccountRef, Admit, Amount, Ask, Clock, Demand, Grant, JobContext, Monitor, SystemClock,
    WakeSlot,
};
use admission_testkit::monitor::poll_once;
use admission_testkit::reference::{Meter, Permits};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor::DefaultDirectRateLimiter;
use tokio::sync::Semaphore;

/// Permits on the accounts nobody competes for: more than any bench takes at once.
const PLENTY: u64 = 1_000_000;
/// What an uncontended admit must answer.
const FREE: &str = "an uncontended demand is granted";
/// A token bucket so large and so fast that no bench can empty it.
const HUGE: u64 = 1 << 40;
/// Waiters parked for the pass benches.
const PARKED: usize = 10_000;
/// How long a hand-off bench lets the waiter (and the evaluator) fall asleep before it releases.
const SETTLE: Duration = Duration::from_micros(20);

fn ctx() -> JobContext {
    JobContext::new("bench")
}

fn permits(name: &str, capacity: u64) -> Arc<Permits> {
    Arc::new(Permits::new(name, capacity))
}

fn meter(name: &str) -> Arc<Meter> {
    Arc::new(Meter::new(name, HUGE, HUGE, Arc::new(SystemClock::new())))
}

/// The three limits of a typical call: an HTTP connection permit, model tokens, a DB permit.
struct ThreeLimits {
    http: AccountRef,
    tokens: AccountRef,
    db: AccountRef,
}

impl ThreeLimits {
    fn new() -> ThreeLimits {
        ThreeLimits {
            http: permits("http", PLENTY),
            tokens: meter("tokens"),
            db: permits("db", PLENTY),
        }
    }

    fn demand(&self) -> Demand {
        Demand::new()
            .with(self.http.clone(), Amount::ONE)
            .with(self.tokens.clone(), Amount::ONE)
            .with(self.db.clone(), Amount::ONE)
    }
}

/// The chain people write today: semaphore, rate limiter, semaphore, each tried in turn.
struct PeerChain {
    http: Semaphore,
    tokens: DefaultDirectRateLimiter,
    db: Semaphore,
}

impl PeerChain {
    fn new() -> PeerChain {
        PeerChain {
            http: Semaphore::new(PLENTY as usize),
            tokens: support::governor_one_cell_per_ns(),
            db: Semaphore::new(PLENTY as usize),
        }
    }
}

/// A started monitor with the accounts of [`ThreeLimits`]; with `watched`, a waiter parked on
/// all three once, so each account's wake slot holds the monitor's doorbell as it does in any
/// monitor that has ever had a waiter.
fn uncontended_monitor(limits: &ThreeLimits, watched: bool) -> Monitor {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    if watched {
        let job = ctx();
        let all_http = Demand::new().with(limits.http.clone(), Amount::units(PLENTY));
        let holder = monitor.admit_blocking(all_http, &job, None).expect("free");
        let mut waiter = Box::pin(monitor.admit(limits.demand(), &job, None));
        assert!(poll_once(&mut waiter).is_none(), "the waiter parks");
        drop(waiter);
        drop(holder);
        assert_eq!(monitor.queue_size(), 0);
    }
    monitor
}

fn uncontended_three_limits(c: &mut Criterion) {
    let limits = ThreeLimits::new();
    let monitor = uncontended_monitor(&limits, false);
    let watched_limits = ThreeLimits::new();
    let watched = uncontended_monitor(&watched_limits, true);
    let peer = PeerChain::new();
    let job = ctx();
    let prebuilt = limits.demand();
    let watched_prebuilt = watched_limits.demand();

    let mut group = c.benchmark_group("uncontended_three_limits");
    group.bench_function("ours_fresh_demand", |b| {
        b.iter(|| admit_release(&monitor, limits.demand(), &job))
    });
    group.bench_function("ours_cloned_demand", |b| {
        b.iter(|| admit_release(&monitor, prebuilt.clone(), &job))
    });
    group.bench_function("ours_cloned_demand_watched_accounts", |b| {
        b.iter(|| admit_release(&watched, watched_prebuilt.clone(), &job))
    });
    group.bench_function("peer_tokio_governor_tokio", |b| {
        b.iter(|| {
            let http = peer.http.try_acquire_many(1).expect("plenty");
            peer.tokens.check().expect("never empty");
            let db = peer.db.try_acquire().expect("plenty");
            drop(black_box((http, db)));
        })
    });
    group.finish();
}

fn uncontended_one_limit(c: &mut Criterion) {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let http: AccountRef = permits("http", PLENTY);
    let prebuilt = Demand::new().with(http.clone(), Amount::ONE);
    let peer = Semaphore::new(PLENTY as usize);
    let job = ctx();

    let mut group = c.benchmark_group("uncontended_one_limit");
    group.bench_function("ours_fresh_demand", |b| {
        b.iter(|| {
            let demand = Demand::new().with(http.clone(), Amount::ONE);
            admit_release(&monitor, demand, &job);
        })
    });
    group.bench_function("ours_cloned_demand", |b| {
        b.iter(|| admit_release(&monitor, prebuilt.clone(), &job))
    });
    group.bench_function("peer_tokio_try_acquire", |b| {
        b.iter(|| drop(black_box(peer.try_acquire().expect("plenty"))))
    });
    group.finish();
}

/// Runs `admit` on `n` demands made beforehand, and times only the admits and the releases
/// separately, in batches that fit in [`PLENTY`].
fn admit_then_release(monitor: &Monitor, demand: &Demand, iters: u64) -> (Duration, Duration) {
    const BATCH: u64 = 1_000;
    let job = ctx();
    let mut admitting = Duration::ZERO;
    let mut releasing = Duration::ZERO;
    let mut grants: Vec<Grant> = Vec::with_capacity(BATCH as usize);
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        let demands: Vec<Demand> = (0..n).map(|_| demand.clone()).collect();
        let started = Instant::now();
        for d in demands {
            grants.push(monitor.admit_blocking(d, &job, None).expect(FREE));
        }
        admitting += started.elapsed();
        let started = Instant::now();
        grants.clear();
        releasing += started.elapsed();
        left -= n;
    }
    (admitting, releasing)
}

fn uncontended_parts(c: &mut Criterion) {
    let limits = ThreeLimits::new();
    let monitor = uncontended_monitor(&limits, false);
    let prebuilt = limits.demand();
    let three_permits = Demand::new()
        .with(permits("a", PLENTY), Amount::ONE)
        .with(permits("b", PLENTY), Amount::ONE)
        .with(permits("c", PLENTY), Amount::ONE);
    let clock = SystemClock::new();
    let lock = parking_lot::Mutex::new(0u64);
    let job = ctx();

    let mut group = c.benchmark_group("uncontended_parts");
    group.bench_function("system_clock_now", |b| b.iter(|| black_box(clock.now())));
    group.bench_function("parking_lot_lock_unlock", |b| {
        b.iter(|| *black_box(&lock).lock() += 1)
    });
    group.bench_function("seqcst_fence", |b| {
        b.iter(|| std::sync::atomic::fence(Ordering::SeqCst))
    });
    group.bench_function("arc_clone_and_drop", |b| {
        b.iter(|| drop(black_box(limits.http.clone())))
    });
    group.bench_function("vec_alloc_4_entries_and_free", |b| {
        // The allocation a three-entry demand makes: room for four 48-byte entries.
        b.iter(|| drop(black_box(Vec::<[u64; 6]>::with_capacity(4))))
    });
    let slot = WakeSlot::new();
    group.bench_function("wake_slot_notify_empty", |b| {
        b.iter(|| black_box(&slot).notify())
    });
    group.bench_function("demand_build_3_and_drop", |b| {
        b.iter(|| drop(black_box(limits.demand())))
    });
    group.bench_function("demand_clone_3_and_drop", |b| {
        b.iter(|| drop(black_box(prebuilt.clone())))
    });
    group.bench_function("accounts_only_take_3_give_2", |b| {
        // What the three accounts cost by themselves: no monitor, no demand, no grant.
        b.iter(|| {
            for entry in prebuilt.entries() {
                let taken = entry.account().ask(entry.amount(), Ask::HEAD);
                assert!(taken.is_taken());
            }
            limits.http.give(Amount::ONE);
            limits.db.give(Amount::ONE);
        })
    });
    group.bench_function("ours_empty_demand", |b| {
        // The monitor alone: clock read, monitor lock, a grant built and settled.
        b.iter(|| admit_release(&monitor, Demand::new(), &job))
    });
    group.bench_function("ours_three_permits_no_meter", |b| {
        b.iter(|| admit_release(&monitor, three_permits.clone(), &job))
    });
    group.bench_function("ours_admit_only", |b| {
        b.iter_custom(|iters| admit_then_release(&monitor, &prebuilt, iters).0)
    });
    group.bench_function("ours_release_only", |b| {
        b.iter_custom(|iters| admit_then_release(&monitor, &prebuilt, iters).1)
    });
    group.finish();
}

/// `parked` waiters short on a one-permit account; with `three`, each demand also names a
/// plentiful permit account and a token bucket besides the scarce one.
fn park_line(parked: usize, three: bool) -> ParkedLine {
    let mut accounts: Vec<(AccountRef, Amount)> = Vec::new();
    if three {
        accounts.push((permits("http", PLENTY), Amount::ONE));
        accounts.push((meter("tokens"), Amount::ONE));
    }
    accounts.push((permits("scarce", 1), Amount::ONE));
    ParkedLine::new(parked, accounts)
}

fn pass_over_10k_parked(c: &mut Criterion) {
    let one = park_line(PARKED, false);
    let three = park_line(PARKED, true);
    let single = park_line(1, false);
    let mut group = c.benchmark_group("pass_over_10k_parked");
    group.sample_size(30);
    for (name, line) in [
        ("ours_one_account", &one),
        ("ours_three_accounts", &three),
        ("ours_one_account_1_parked", &single),
    ] {
        let parked = line.len();
        group.bench_function(name, |b| b.iter(|| line.pass()));
        assert_eq!(line.len(), parked, "a pass grants nobody");
    }
    for (name, line) in [
        ("floor_one_account", &one),
        ("floor_three_accounts", &three),
    ] {
        // The accounts' share of a pass: the same questions asked directly, 10,000 times.
        group.bench_function(name, |b| b.iter(|| line.ask_floor(PARKED)));
    }
    group.finish();
}

/// Ours, blocking: a waiter thread in `admit_blocking` on a permit the bench thread holds.
struct MonitorThread {
    monitor: Monitor,
    demand: Demand,
    held: Option<Grant>,
    watch: HeldWatch,
    link: Link,
    waiter: Option<thread::JoinHandle<()>>,
}

impl MonitorThread {
    fn new() -> MonitorThread {
        let monitor = Monitor::new();
        monitor.start().expect("a fresh monitor starts");
        let demand = Demand::new().with(permits("one", 1), Amount::ONE);
        let held = monitor
            .admit_blocking(demand.clone(), &ctx(), None)
            .expect("free");
        let (link, waiter) = support::link();
        let waiter = {
            let (monitor, demand) = (monitor.clone(), demand.clone());
            thread::spawn(move || {
                let job = ctx();
                waiter.serve_blocking(|| {
                    monitor
                        .admit_blocking(demand.clone(), &job, None)
                        .expect("granted")
                });
            })
        };
        MonitorThread {
            monitor,
            demand,
            held: Some(held),
            watch: HeldWatch::default(),
            link,
            waiter: Some(waiter),
        }
    }
}

impl HandOff for MonitorThread {
    fn arm(&mut self) {
        self.watch.install(&self.monitor);
        self.link.park();
        self.watch.wait(&self.monitor);
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn ran(&self) -> &AtomicU64 {
        self.link.ran()
    }
    fn reset(&mut self) {
        self.link.take_back();
        self.held = Some(
            self.monitor
                .admit_blocking(self.demand.clone(), &ctx(), None)
                .expect("free"),
        );
    }
}

impl Drop for MonitorThread {
    fn drop(&mut self) {
        self.link.stop();
        if let Some(waiter) = self.waiter.take() {
            waiter.join().expect("the waiter thread ends");
        }
    }
}

/// The peer of [`MonitorThread`]: a thread waiting on a `Condvar` for a flag the bench sets.
/// "Parked" once it has set its "waiting" flag, just before it blocks.
struct CondvarThread {
    pair: Arc<(Mutex<bool>, Condvar)>,
    waiting: Arc<AtomicBool>,
    link: Link,
    waiter: Option<thread::JoinHandle<()>>,
}

impl CondvarThread {
    fn new() -> CondvarThread {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let waiting = Arc::new(AtomicBool::new(false));
        let (link, waiter) = support::link();
        let waiter = {
            let (pair, waiting) = (pair.clone(), waiting.clone());
            thread::spawn(move || {
                waiter.serve_blocking(|| {
                    let (lock, cv) = &*pair;
                    let mut ready = lock.lock().expect("not poisoned");
                    waiting.store(true, Ordering::Release);
                    while !*ready {
                        ready = cv.wait(ready).expect("not poisoned");
                    }
                    *ready = false;
                });
            })
        };
        CondvarThread {
            pair,
            waiting,
            link,
            waiter: Some(waiter),
        }
    }
}

impl HandOff for CondvarThread {
    fn arm(&mut self) {
        self.waiting.store(false, Ordering::Release);
        self.link.park();
        while !self.waiting.load(Ordering::Acquire) {
            thread::yield_now();
        }
    }
    fn release(&mut self) {
        let (lock, cv) = &*self.pair;
        *lock.lock().expect("not poisoned") = true;
        cv.notify_one();
    }
    fn ran(&self) -> &AtomicU64 {
        self.link.ran()
    }
    fn reset(&mut self) {
        self.link.take_back();
    }
}

impl Drop for CondvarThread {
    fn drop(&mut self) {
        self.link.stop();
        if let Some(waiter) = self.waiter.take() {
            waiter.join().expect("the waiter thread ends");
        }
    }
}

/// Stamps when woken: a waker that tells the bench thread the releasing thread's pass got there.
#[derive(Default)]
struct StampWaker(AtomicU64);

impl Wake for StampWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(support::stamp(), Ordering::Release);
    }
}

/// Ours, first hop only: from the release until the parked admit has been granted and its waker
/// called. No waiter thread: the bench thread owns the future.
struct MonitorToWaker {
    monitor: Monitor,
    demand: Demand,
    held: Option<Grant>,
    pending: Option<Pin<Box<Admit>>>,
    watch: HeldWatch,
    woken: Arc<StampWaker>,
    waker: Waker,
}

impl MonitorToWaker {
    fn new() -> MonitorToWaker {
        let monitor = Monitor::new();
        monitor.start().expect("a fresh monitor starts");
        let demand = Demand::new().with(permits("one", 1), Amount::ONE);
        let held = monitor
            .admit_blocking(demand.clone(), &ctx(), None)
            .expect("free");
        let woken = Arc::new(StampWaker::default());
        MonitorToWaker {
            monitor,
            demand,
            held: Some(held),
            pending: None,
            watch: HeldWatch::default(),
            waker: Waker::from(woken.clone()),
            woken,
        }
    }

    fn poll(&mut self) -> Poll<Grant> {
        let admit = self.pending.as_mut().expect("an admit is pending");
        match admit.as_mut().poll(&mut Context::from_waker(&self.waker)) {
            Poll::Ready(outcome) => {
                self.pending = None;
                Poll::Ready(outcome.expect("granted"))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl HandOff for MonitorToWaker {
    fn arm(&mut self) {
        self.woken.0.store(0, Ordering::Release);
        self.watch.install(&self.monitor);
        self.pending = Some(Box::pin(self.monitor.admit(
            self.demand.clone(),
            &ctx(),
            None,
        )));
        assert!(self.poll().is_pending(), "the admit parks");
        self.watch.wait(&self.monitor);
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn ran(&self) -> &AtomicU64 {
        &self.woken.0
    }
    fn reset(&mut self) {
        match self.poll() {
            Poll::Ready(grant) => self.held = Some(grant),
            Poll::Pending => panic!("woken but not granted"),
        }
    }
}

/// Times `iters` hand-offs on `side`: idle ones wait [`SETTLE`] after the waiter parked.
fn time_hand_offs(side: &mut impl HandOff, iters: u64, idle: bool) -> Duration {
    let settle = if idle { SETTLE } else { Duration::ZERO };
    (0..iters).map(|_| hand_off(side, settle)).sum()
}

fn give_to_running(c: &mut Criterion) {
    let mut group = c.benchmark_group("give_to_running");
    group
        .sample_size(40)
        .measurement_time(Duration::from_secs(3));
    for (shape, idle) in [("idle", true), ("hot", false)] {
        let mut ours = MonitorThread::new();
        group.bench_function(format!("ours_thread_{shape}"), |b| {
            b.iter_custom(|n| time_hand_offs(&mut ours, n, idle))
        });
        drop(ours);
        let mut peer = CondvarThread::new();
        group.bench_function(format!("peer_condvar_thread_{shape}"), |b| {
            b.iter_custom(|n| time_hand_offs(&mut peer, n, idle))
        });
        drop(peer);
        let mut ours = MonitorTask::new(permits("one", 1), Parked::Held);
        group.bench_function(format!("ours_tokio_task_{shape}"), |b| {
            b.iter_custom(|n| time_hand_offs(&mut ours, n, idle))
        });
        drop(ours);
        let mut peer = SemaphoreTask::new();
        group.bench_function(format!("peer_tokio_semaphore_task_{shape}"), |b| {
            b.iter_custom(|n| time_hand_offs(&mut peer, n, idle))
        });
        drop(peer);
        let mut hop = MonitorToWaker::new();
        group.bench_function(format!("ours_release_to_waker_{shape}"), |b| {
            b.iter_custom(|n| time_hand_offs(&mut hop, n, idle))
        });
        drop(hop);
    }
    group.finish();
}

/// Which parked admit is dropped next.
#[derive(Clone, Copy)]
enum Order {
    /// The oldest: each drop is the head's.
    Oldest,
    /// The newest: each drop is behind the head.
    Newest,
}

/// Parks `n` admits behind a held permit on a started monitor, then times dropping them all in
/// `order`.
fn ours_emptied(n: usize, order: Order) -> Duration {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    let one = permits("one", 1);
    let demand = || Demand::new().with(one.clone(), Amount::ONE);
    let held = monitor
        .admit_blocking(demand(), &ctx(), None)
        .expect("free");
    let mut parked = admission_testkit::monitor::park_waiters(&monitor, n, demand);
    let start = Instant::now();
    match order {
        Order::Oldest => drop(parked),
        Order::Newest => {
            while let Some(admit) = parked.pop() {
                drop(admit);
            }
        }
    }
    let took = start.elapsed();
    assert_eq!(monitor.queue_size(), 0);
    drop(held);
    monitor.stop();
    took
}

/// The same with tokio's semaphore: `n` `acquire` futures parked (polled once) behind a held
/// permit, then dropped oldest first.
fn tokio_emptied(n: usize) -> Duration {
    let semaphore = Semaphore::new(1);
    let held = semaphore.try_acquire().expect("free");
    let mut cx = Context::from_waker(Waker::noop());
    let mut parked: Vec<Pin<Box<dyn Future<Output = _> + '_>>> = Vec::with_capacity(n);
    for _ in 0..n {
        let mut acquire: Pin<Box<dyn Future<Output = _>>> = Box::pin(semaphore.acquire());
        assert!(acquire.as_mut().poll(&mut cx).is_pending());
        parked.push(acquire);
    }
    let start = Instant::now();
    drop(parked);
    let took = start.elapsed();
    drop(held);
    took
}

fn empty_line_by_drops(c: &mut Criterion) {
    let mut group = c.benchmark_group("empty_line_by_drops");
    group.sample_size(10);
    for n in [1_000usize, 100_000] {
        group.throughput(Throughput::Elements(n as u64));
        let each = |f: fn(usize) -> Duration| {
            move |b: &mut criterion::Bencher| {
                b.iter_custom(|iters| (0..iters).map(|_| f(n)).sum());
            }
        };
        group.bench_function(
            format!("ours_oldest_first/{n}"),
            each(|n| ours_emptied(n, Order::Oldest)),
        );
        group.bench_function(
            format!("ours_newest_first/{n}"),
            each(|n| ours_emptied(n, Order::Newest)),
        );
        group.bench_function(format!("peer_tokio_oldest_first/{n}"), each(tokio_emptied));
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .without_plots()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = uncontended_three_limits, uncontended_one_limit, uncontended_parts,
        pass_over_10k_parked, give_to_running, empty_line_by_drops
}
criterion_main!(benches);
