//! Criterion benches of the [`Monitor`], each group run beside the peer it is measured against.
//!
//! - `uncontended_three_limits` / `uncontended_one_limit`: admit and release a demand nobody
//!   competes for, against the chain of tokio semaphores and a governor limiter written by hand.
//! - `uncontended_parts`: the pieces the uncontended path is made of, to see where its time goes.
//! - `pass_over_10k_parked`: one evaluator pass over 10,000 waiters that all stay parked.
//! - `give_to_running`: from a release to the parked waiter running, against a `Condvar` wake and
//!   a tokio semaphore hand-off.
//!
//! `BENCHMARKS.md` at the workspace root records a run and compares the medians.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use admission_core::{
    AccountRef, Admit, Amount, Ask, Clock, Demand, Event, EventKind, EventSink, Grant, JobContext,
    Monitor, SystemClock, WakeSlot, event::SinkError,
};
use admission_testkit::monitor::{park_waiters, poll_once};
use admission_testkit::reference::{Meter, Permits};
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Permits on the accounts nobody competes for: more than any bench takes at once.
const PLENTY: u64 = 1_000_000;
/// What an uncontended admit must answer.
const FREE: &str = "an uncontended demand is granted";
/// A token bucket so large and so fast that no bench can empty it.
const HUGE: u64 = 1 << 40;
/// Waiters parked for the pass benches.
const PARKED: usize = 10_000;
/// How long a hand-off bench waits for a `Held` event before it trusts the line's size alone.
const HELD_PATIENCE: Duration = Duration::from_millis(2);
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
        // One cell a nanosecond with a burst of u32::MAX cells: never empty in a bench.
        let quota = Quota::with_period(Duration::from_nanos(1))
            .expect("a non-zero period")
            .allow_burst(NonZeroU32::MAX);
        PeerChain {
            http: Semaphore::new(PLENTY as usize),
            tokens: RateLimiter::direct(quota),
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
        let mut waiter = monitor.admit(limits.demand(), &job, None);
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
        b.iter(|| {
            let grant = monitor
                .admit_blocking(limits.demand(), &job, None)
                .expect(FREE);
            drop(black_box(grant));
        })
    });
    group.bench_function("ours_cloned_demand", |b| {
        b.iter(|| {
            let grant = monitor
                .admit_blocking(prebuilt.clone(), &job, None)
                .expect(FREE);
            drop(black_box(grant));
        })
    });
    group.bench_function("ours_cloned_demand_watched_accounts", |b| {
        b.iter(|| {
            let grant = watched
                .admit_blocking(watched_prebuilt.clone(), &job, None)
                .expect(FREE);
            drop(black_box(grant));
        })
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
            drop(black_box(
                monitor.admit_blocking(demand, &job, None).expect(FREE),
            ));
        })
    });
    group.bench_function("ours_cloned_demand", |b| {
        b.iter(|| {
            let grant = monitor
                .admit_blocking(prebuilt.clone(), &job, None)
                .expect(FREE);
            drop(black_box(grant));
        })
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
        b.iter(|| {
            let grant = monitor
                .admit_blocking(Demand::new(), &job, None)
                .expect(FREE);
            drop(black_box(grant));
        })
    });
    group.bench_function("ours_three_permits_no_meter", |b| {
        b.iter(|| {
            let grant = monitor
                .admit_blocking(three_permits.clone(), &job, None)
                .expect(FREE);
            drop(black_box(grant));
        })
    });
    group.bench_function("ours_admit_only", |b| {
        b.iter_custom(|iters| admit_then_release(&monitor, &prebuilt, iters).0)
    });
    group.bench_function("ours_release_only", |b| {
        b.iter_custom(|iters| admit_then_release(&monitor, &prebuilt, iters).1)
    });
    group.finish();
}

/// A monitor that was never started, holding parked waiters that cannot be granted.
struct ParkedLine {
    monitor: Monitor,
    /// The demand the waiters are short on; holds the only permit of the scarce account.
    _holder: Grant,
    /// The pending admits: alive, so their waiters stay in the line.
    _waiters: Vec<Admit>,
    /// The accounts, for the floor bench.
    accounts: Vec<(AccountRef, Amount)>,
}

/// Parks `parked` waiters on a monitor with manual passes. With `three`, each demand names a
/// plentiful permit account and a token bucket besides the scarce one.
fn park_line(parked: usize, three: bool) -> ParkedLine {
    let monitor = Monitor::builder().manual_passes().build();
    let scarce: AccountRef = permits("scarce", 1);
    let mut accounts = Vec::new();
    if three {
        accounts.push((permits("http", PLENTY) as AccountRef, Amount::ONE));
        accounts.push((meter("tokens") as AccountRef, Amount::ONE));
    }
    accounts.push((scarce.clone(), Amount::ONE));
    let holder = monitor
        .admit_blocking(Demand::new().with(scarce, Amount::ONE), &ctx(), None)
        .expect("the scarce permit is free");
    let waiters = park_waiters(&monitor, parked, || {
        let mut demand = Demand::new();
        for (account, amount) in &accounts {
            demand.add(account.clone(), *amount);
        }
        demand
    });
    assert_eq!(monitor.queue_size(), parked);
    // The first pass records when each waiter began to be held; later passes only ask.
    monitor.pass_now();
    assert_eq!(monitor.queue_size(), parked);
    ParkedLine {
        monitor,
        _holder: holder,
        _waiters: waiters,
        accounts,
    }
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
        let parked = line.monitor.queue_size();
        group.bench_function(name, |b| b.iter(|| black_box(line.monitor.pass_now())));
        assert_eq!(line.monitor.queue_size(), parked, "a pass grants nobody");
    }
    for (name, line) in [
        ("floor_one_account", &one),
        ("floor_three_accounts", &three),
    ] {
        // The accounts' share of a pass: the same questions asked directly, 10,000 times.
        group.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..PARKED {
                    for (account, amount) in &line.accounts {
                        let _ = black_box(account.ask(*amount, Ask::behind(Amount::ONE).look()));
                    }
                }
            })
        });
    }
    group.finish();
}

/// Records that the evaluator finished the pass that first held a waiter.
#[derive(Default)]
struct HeldSeen(AtomicBool);

impl EventSink for HeldSeen {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        if matches!(event.kind, EventKind::Held) {
            self.0.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// Spins the bench thread for [`SETTLE`], so the threads that just parked sleep on an idle core.
fn settle() {
    let started = Instant::now();
    while started.elapsed() < SETTLE {
        std::hint::spin_loop();
    }
}

/// Waits until the evaluator has finished the pass that first held the new waiter.
///
/// That pass reports `Held` to [`HeldSeen`], unless it began before the sink was installed: a
/// pass decides at its start whether to build events, and a pass started by an earlier event may
/// still be in flight.
/// Then the waiter is parked and its first pass long over once [`HELD_PATIENCE`] has passed.
fn wait_held(monitor: &Monitor, seen: &HeldSeen) {
    let started = Instant::now();
    while !seen.0.load(Ordering::Acquire) {
        if monitor.queue_size() == 1 && started.elapsed() > HELD_PATIENCE {
            return;
        }
        thread::yield_now();
    }
}

fn yield_until(flag: &AtomicBool) {
    while !flag.load(Ordering::Acquire) {
        thread::yield_now();
    }
}

/// One release-to-running round trip, cut into the part that is timed and the parts that are not.
trait HandOff {
    /// Untimed: has the waiter park and waits until it is parked (and the evaluator is done).
    fn arm(&mut self);
    /// Timed: gives the resource back.
    fn release(&mut self);
    /// Set by the waiter once it runs with the resource.
    fn running(&self) -> &AtomicBool;
    /// Untimed: takes the resource back from the waiter.
    fn reset(&mut self);
}

/// Times `iters` hand-offs. With `idle`, each waits [`SETTLE`] after the waiter parked, so the
/// waiter's core has gone idle by the release; without it the release follows at once.
///
/// The bench thread polls the waiter's flag with `yield_now` between reads rather than a pure
/// spin: on two cores a spinning bench thread competes with the very threads it is waiting for
/// (the scheduler may wake them on its core), which made pure-spin runs vary by 2x.
fn time_hand_offs(hand_off: &mut impl HandOff, iters: u64, idle: bool) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        hand_off.arm();
        if idle {
            settle();
        }
        let started = Instant::now();
        hand_off.release();
        yield_until(hand_off.running());
        total += started.elapsed();
        hand_off.reset();
    }
    total
}

enum Cmd {
    Park,
    Release,
}

/// What the bench thread and a waiter share.
struct Link {
    cmd: mpsc::Sender<Cmd>,
    done: mpsc::Receiver<()>,
    running: Arc<AtomicBool>,
}

impl Link {
    fn park(&self) {
        self.running.store(false, Ordering::Release);
        self.cmd.send(Cmd::Park).expect("the waiter lives");
    }

    fn take_back(&self) {
        self.cmd.send(Cmd::Release).expect("the waiter lives");
        self.done.recv().expect("the waiter gives back");
    }
}

/// Ours, blocking: a waiter thread in `admit_blocking` on a permit the bench thread holds.
struct MonitorThread {
    monitor: Monitor,
    demand: Demand,
    held: Option<Grant>,
    seen: Arc<HeldSeen>,
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
        let (cmd, cmds) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let running = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (monitor, demand, running) = (monitor.clone(), demand.clone(), running.clone());
            thread::spawn(move || {
                let job = ctx();
                while let Ok(Cmd::Park) = cmds.recv() {
                    let grant = monitor
                        .admit_blocking(demand.clone(), &job, None)
                        .expect("granted");
                    running.store(true, Ordering::Release);
                    let Ok(Cmd::Release) = cmds.recv() else {
                        return;
                    };
                    drop(grant);
                    let _ = done_tx.send(());
                }
            })
        };
        MonitorThread {
            monitor,
            demand,
            held: Some(held),
            seen: Arc::new(HeldSeen::default()),
            link: Link { cmd, done, running },
            waiter: Some(waiter),
        }
    }
}

impl HandOff for MonitorThread {
    fn arm(&mut self) {
        self.seen.0.store(false, Ordering::Release);
        self.monitor.set_sink(Some(self.seen.clone()));
        self.link.park();
        wait_held(&self.monitor, &self.seen);
        self.monitor.set_sink(None);
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn running(&self) -> &AtomicBool {
        &self.link.running
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
        let (cmd, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.link.cmd, cmd));
        if let Some(waiter) = self.waiter.take() {
            waiter.join().expect("the waiter thread ends");
        }
    }
}

/// The peer of [`MonitorThread`]: a thread waiting on a `Condvar` for a flag the bench sets.
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
        let (cmd, cmds) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let running = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (pair, waiting, running) = (pair.clone(), waiting.clone(), running.clone());
            thread::spawn(move || {
                while let Ok(Cmd::Park) = cmds.recv() {
                    let (lock, cv) = &*pair;
                    let mut ready = lock.lock().expect("not poisoned");
                    waiting.store(true, Ordering::Release);
                    while !*ready {
                        ready = cv.wait(ready).expect("not poisoned");
                    }
                    *ready = false;
                    drop(ready);
                    running.store(true, Ordering::Release);
                    let Ok(Cmd::Release) = cmds.recv() else {
                        return;
                    };
                    let _ = done_tx.send(());
                }
            })
        };
        CondvarThread {
            pair,
            waiting,
            link: Link { cmd, done, running },
            waiter: Some(waiter),
        }
    }
}

impl HandOff for CondvarThread {
    fn arm(&mut self) {
        self.waiting.store(false, Ordering::Release);
        self.link.park();
        yield_until(&self.waiting);
    }
    fn release(&mut self) {
        let (lock, cv) = &*self.pair;
        *lock.lock().expect("not poisoned") = true;
        cv.notify_one();
    }
    fn running(&self) -> &AtomicBool {
        &self.link.running
    }
    fn reset(&mut self) {
        self.link.take_back();
    }
}

impl Drop for CondvarThread {
    fn drop(&mut self) {
        let (cmd, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.link.cmd, cmd));
        if let Some(waiter) = self.waiter.take() {
            waiter.join().expect("the waiter thread ends");
        }
    }
}

/// A tokio runtime with one worker, so the bench thread, the worker and (for ours) the evaluator
/// share the two cores as they would in a service.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("a runtime")
}

/// Commands to a task: a tokio channel, so the task awaits it without blocking the worker.
struct TaskLink {
    cmd: tokio::sync::mpsc::UnboundedSender<Cmd>,
    done: mpsc::Receiver<()>,
    running: Arc<AtomicBool>,
}

impl TaskLink {
    fn park(&self) {
        self.running.store(false, Ordering::Release);
        self.cmd
            .send(Cmd::Park)
            .map_err(|_| ())
            .expect("the task lives");
    }

    fn take_back(&self) {
        self.cmd
            .send(Cmd::Release)
            .map_err(|_| ())
            .expect("the task lives");
        self.done.recv().expect("the task gives back");
    }
}

/// Ours, async: a tokio task awaiting `Monitor::admit` on a permit the bench thread holds.
struct MonitorTask {
    monitor: Monitor,
    demand: Demand,
    held: Option<Grant>,
    seen: Arc<HeldSeen>,
    link: TaskLink,
    _rt: tokio::runtime::Runtime,
}

impl MonitorTask {
    fn new() -> MonitorTask {
        let rt = runtime();
        let monitor = Monitor::new();
        monitor.start().expect("a fresh monitor starts");
        let demand = Demand::new().with(permits("one", 1), Amount::ONE);
        let held = monitor
            .admit_blocking(demand.clone(), &ctx(), None)
            .expect("free");
        let (cmd, mut cmds) = tokio::sync::mpsc::unbounded_channel();
        let (done_tx, done) = mpsc::channel();
        let running = Arc::new(AtomicBool::new(false));
        {
            let (monitor, demand, running) = (monitor.clone(), demand.clone(), running.clone());
            rt.spawn(async move {
                let job = ctx();
                while let Some(Cmd::Park) = cmds.recv().await {
                    let grant = monitor
                        .admit(demand.clone(), &job, None)
                        .await
                        .expect("granted");
                    running.store(true, Ordering::Release);
                    let Some(Cmd::Release) = cmds.recv().await else {
                        return;
                    };
                    drop(grant);
                    let _ = done_tx.send(());
                }
            });
        }
        MonitorTask {
            monitor,
            demand,
            held: Some(held),
            seen: Arc::new(HeldSeen::default()),
            link: TaskLink { cmd, done, running },
            _rt: rt,
        }
    }
}

impl HandOff for MonitorTask {
    fn arm(&mut self) {
        self.seen.0.store(false, Ordering::Release);
        self.monitor.set_sink(Some(self.seen.clone()));
        self.link.park();
        wait_held(&self.monitor, &self.seen);
        self.monitor.set_sink(None);
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn running(&self) -> &AtomicBool {
        &self.link.running
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

/// The peer of [`MonitorTask`]: a tokio task awaiting `Semaphore::acquire` on a permit the bench
/// thread holds.
struct SemaphoreTask {
    semaphore: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    waiting: Arc<AtomicBool>,
    link: TaskLink,
    _rt: tokio::runtime::Runtime,
}

impl SemaphoreTask {
    fn new() -> SemaphoreTask {
        let rt = runtime();
        let semaphore = Arc::new(Semaphore::new(1));
        let held = semaphore.clone().try_acquire_owned().expect("free");
        let (cmd, mut cmds) = tokio::sync::mpsc::unbounded_channel();
        let (done_tx, done) = mpsc::channel();
        let running = Arc::new(AtomicBool::new(false));
        let waiting = Arc::new(AtomicBool::new(false));
        {
            let (semaphore, waiting, running) =
                (semaphore.clone(), waiting.clone(), running.clone());
            rt.spawn(async move {
                while let Some(Cmd::Park) = cmds.recv().await {
                    // Say "waiting" only once the first poll has queued the task on the semaphore.
                    let mut acquire = std::pin::pin!(semaphore.acquire());
                    let permit = std::future::poll_fn(|cx| {
                        let polled = acquire.as_mut().poll(cx);
                        if polled.is_pending() {
                            waiting.store(true, Ordering::Release);
                        }
                        polled
                    })
                    .await
                    .expect("not closed");
                    running.store(true, Ordering::Release);
                    let Some(Cmd::Release) = cmds.recv().await else {
                        return;
                    };
                    drop(permit);
                    let _ = done_tx.send(());
                }
            });
        }
        SemaphoreTask {
            semaphore,
            held: Some(held),
            waiting,
            link: TaskLink { cmd, done, running },
            _rt: rt,
        }
    }
}

impl HandOff for SemaphoreTask {
    fn arm(&mut self) {
        self.waiting.store(false, Ordering::Release);
        self.link.park();
        yield_until(&self.waiting);
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn running(&self) -> &AtomicBool {
        &self.link.running
    }
    fn reset(&mut self) {
        self.link.take_back();
        self.held = Some(self.semaphore.clone().try_acquire_owned().expect("free"));
    }
}

/// Sets its flag when woken: a waker that tells the bench thread the evaluator got there.
#[derive(Default)]
struct FlagWaker(AtomicBool);

impl Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// Ours, first hop only: from the release until the evaluator has granted the parked admit and
/// called its waker. No waiter thread: the bench thread owns the future.
struct MonitorToWaker {
    monitor: Monitor,
    demand: Demand,
    held: Option<Grant>,
    pending: Option<Admit>,
    seen: Arc<HeldSeen>,
    flag: Arc<FlagWaker>,
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
        let flag = Arc::new(FlagWaker::default());
        MonitorToWaker {
            monitor,
            demand,
            held: Some(held),
            pending: None,
            seen: Arc::new(HeldSeen::default()),
            waker: Waker::from(flag.clone()),
            flag,
        }
    }

    fn poll(&mut self) -> Poll<Grant> {
        let admit = self.pending.as_mut().expect("an admit is pending");
        match Pin::new(admit).poll(&mut Context::from_waker(&self.waker)) {
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
        self.flag.0.store(false, Ordering::Release);
        self.seen.0.store(false, Ordering::Release);
        self.monitor.set_sink(Some(self.seen.clone()));
        self.pending = Some(self.monitor.admit(self.demand.clone(), &ctx(), None));
        assert!(self.poll().is_pending(), "the admit parks");
        wait_held(&self.monitor, &self.seen);
        self.monitor.set_sink(None);
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn running(&self) -> &AtomicBool {
        &self.flag.0
    }
    fn reset(&mut self) {
        match self.poll() {
            Poll::Ready(grant) => self.held = Some(grant),
            Poll::Pending => panic!("woken but not granted"),
        }
    }
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
        let mut ours = MonitorTask::new();
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
        pass_over_10k_parked, give_to_running
}
criterion_main!(benches);
