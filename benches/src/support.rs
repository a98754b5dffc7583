//! What the bench targets share, each loop written once: the peer limiters nobody can empty, one
//! admit and release, one take and give, two threads on one shared limiter, a line of parked
//! waiters for the pass benches, the release-to-running hand-off with the waiters both sides of
//! it use, and the contended runs (ours on a `CountingGate`, tokio's semaphore) with what each
//! cost the process.
//!
//! The criterion targets sum these per iteration (`iter_custom`); the `scarce_and_wakes` harness
//! records the same round trips one by one into histograms.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Barrier, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use admission_accounts::CountingGate;
use admission_core::event::SinkError;
use admission_core::{
    Account, AccountRef, Admit, Amount, Answer, Ask, Demand, Event, EventKind, EventSink, Grant,
    JobContext, Monitor,
};
use admission_testkit::monitor::park_waiters;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::usage::Usage;

// ------------------------------------------------------------------------------------------------
// Peers and single operations

/// A governor limiter that replenishes one cell a nanosecond (its finest period) with a burst of
/// `u32::MAX` cells: a take of one cell per iteration can never empty it. The peer of the
/// monitor benches.
pub fn governor_one_cell_per_ns() -> DefaultDirectRateLimiter {
    let quota = Quota::with_period(Duration::from_nanos(1))
        .expect("a non-zero period")
        .allow_burst(NonZeroU32::MAX);
    RateLimiter::direct(quota)
}

/// `u32::MAX` cells a second, as a burst of as many: the replenish interval rounds down to zero,
/// so no take is ever refused. The peer of the account-family benches.
pub fn quota_never_empty() -> Quota {
    Quota::per_second(NonZeroU32::MAX)
}

/// A direct governor limiter on [`quota_never_empty`] and governor's default (quanta) clock.
pub fn governor_never_empty() -> DefaultDirectRateLimiter {
    RateLimiter::direct(quota_never_empty())
}

/// One `check_n(1)` on `limiter`, asserted to pass.
#[inline]
pub fn check_n(limiter: &DefaultDirectRateLimiter) {
    let checked = limiter.check_n(black_box(NonZeroU32::MIN));
    assert!(
        matches!(checked, Ok(Ok(()))),
        "the bench quota never runs out"
    );
}

/// A taking `ask` of `amount` as the head, asserted to be taken. Pass `&dyn Account` to time the
/// call as the monitor makes it, through the trait object.
#[inline]
pub fn take<A: Account + ?Sized>(account: &A, amount: Amount) {
    let taken = account.ask(black_box(amount), Ask::HEAD);
    assert!(
        matches!(taken, Answer::Taken),
        "the bench budget never runs out"
    );
}

/// [`take`] and then the `give` that rolls it back.
#[inline]
pub fn take_give<A: Account + ?Sized>(account: &A, amount: Amount) {
    take(account, amount);
    account.give(black_box(amount));
}

/// [`take_give`] with the synchronization the monitor adds to it on an empty line: after the
/// take and after the give, a sequentially consistent fence and a load of a shared word (the
/// check for a waiter that parked meanwhile, Dekker's pattern against the parker). The floor of
/// a `try_admit` + release, which takes no reference count.
#[inline]
pub fn take_give_fenced<A: Account + ?Sized>(account: &A, amount: Amount, parked: &AtomicUsize) {
    take(account, amount);
    fence(Ordering::SeqCst);
    black_box(parked.load(Ordering::SeqCst));
    account.give(black_box(amount));
    fence(Ordering::SeqCst);
    black_box(parked.load(Ordering::SeqCst));
}

/// [`take_give_fenced`] with the reference counts an owned [`Grant`] takes and drops: the
/// demand cloned into it, the job's context, and the handle to the monitor it gives back to
/// (`owner`). The floor of an `admit_blocking` + release of a cloned demand.
#[inline]
pub fn owned_take_give_fenced(
    demand: &Demand,
    job: &JobContext,
    owner: &Arc<AtomicUsize>,
    amount: Amount,
) {
    let (demand, job, owner) = (
        black_box(demand.clone()),
        black_box(job.clone()),
        black_box(owner.clone()),
    );
    take_give_fenced(&**demand.entries()[0].account(), amount, &owner);
    drop((demand, job, owner));
}

/// One uncontended admit of `demand` on `monitor` and the release of its grant.
///
/// # Panics
///
/// When the demand is not granted at once.
#[inline]
pub fn admit_release(monitor: &Monitor, demand: Demand, job: &JobContext) {
    let grant = monitor
        .admit_blocking(demand, job, None)
        .expect("an uncontended demand is granted");
    drop(black_box(grant));
}

/// One `try_admit` of a prebuilt `demand` on behalf of `job`, granted, and its borrowed grant
/// dropped (released).
pub fn try_admit_release(monitor: &Monitor, demand: &Demand, job: &JobContext) {
    let grant = monitor
        .try_admit(demand, job)
        .expect("an uncontended demand is granted");
    drop(black_box(grant));
}

/// Runs `op` `iters` times on the bench thread and on one more thread, released together by a
/// barrier, and answers the slower thread's wall time: the time per operation of one thread
/// while the other competes for the same `shared` limiter.
pub fn on_two_threads<T, F>(shared: &Arc<T>, iters: u64, op: F) -> Duration
where
    T: Send + Sync + 'static,
    F: Fn(&T) + Copy + Send + 'static,
{
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

// ------------------------------------------------------------------------------------------------
// A line that stands still

/// A monitor with manual passes (never started) holding parked waiters that cannot be granted:
/// what one evaluator pass walks in the `pass_over_10k_parked` benches.
pub struct ParkedLine {
    monitor: Monitor,
    /// Holds the scarce account's amount, so every waiter stays short on it.
    _holder: Grant,
    /// The pending admits: alive, so their waiters stay in the line.
    _waiters: Vec<std::pin::Pin<Box<Admit>>>,
    /// The accounts and amounts of every waiter, for the floor.
    accounts: Vec<(AccountRef, Amount)>,
}

impl ParkedLine {
    /// Parks `parked` waiters, each demanding every entry of `accounts`. The last entry is the
    /// scarce one: a holder takes its amount first, so it must hold exactly that much (a
    /// one-permit gate for [`Amount::ONE`]). The monitor runs on the system clock, as every
    /// account built `on_system_clock` does.
    ///
    /// # Panics
    ///
    /// When `accounts` is empty, the holder is not granted, or a waiter does not park.
    pub fn new(parked: usize, accounts: Vec<(AccountRef, Amount)>) -> ParkedLine {
        let monitor = Monitor::builder().manual_passes().build();
        let (scarce, amount) = accounts.last().cloned().expect("a scarce account");
        let holder = monitor
            .admit_blocking(
                Demand::new().with(scarce, amount),
                &JobContext::new("holder"),
                None,
            )
            .expect("the scarce account is free");
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

    /// One pass over the whole line; it grants nobody.
    pub fn pass(&self) {
        black_box(self.monitor.pass_now());
    }

    /// How many waiters are parked.
    pub fn len(&self) -> usize {
        self.monitor.queue_size()
    }

    /// Whether the line is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The accounts' share of a pass: the same questions asked directly, `asks` times, one look
    /// per account behind a reservation, with no monitor.
    pub fn ask_floor(&self, asks: usize) {
        let behind = Ask::behind(Amount::ONE).look();
        for _ in 0..asks {
            for (account, amount) in &self.accounts {
                let answer = account.ask(*amount, behind);
                assert!(answer.refusal().is_none(), "fits a capacity");
                let _ = black_box(answer);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Release to running

/// Nanoseconds since the process's first stamp, plus one (zero means "not yet").
pub fn stamp() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX) + 1
}

/// One release-to-running round trip, cut into the part that is timed and the parts that are not.
pub trait HandOff {
    /// Untimed: has the waiter park and returns once it is parked.
    fn arm(&mut self);
    /// Timed: gives the resource back.
    fn release(&mut self);
    /// The [`stamp`] of the moment the waiter ran with the resource; zero before.
    fn ran(&self) -> &AtomicU64;
    /// Untimed: takes the resource back from the waiter.
    fn reset(&mut self);
}

/// One hand-off: from just before the release to the waiter's first instruction with the
/// resource, by the waiter's own [`stamp`]. With a non-zero `settle`, the bench thread spins that
/// long after the waiter parked, so the waiter's core has gone idle by the release; with zero the
/// release follows at once.
///
/// The bench thread waits for the stamp with `yield_now` between reads rather than a pure spin:
/// on two cores a spinning bench thread competes with the very threads it is waiting for (the
/// scheduler may wake them on its core), which made pure-spin runs vary by 2x.
pub fn hand_off(side: &mut impl HandOff, settle: Duration) -> Duration {
    side.arm();
    if !settle.is_zero() {
        let parked = Instant::now();
        while parked.elapsed() < settle {
            std::hint::spin_loop();
        }
    }
    let released = stamp();
    side.release();
    let ran = loop {
        let ran = side.ran().load(Ordering::Acquire);
        if ran != 0 {
            break ran;
        }
        thread::yield_now();
    };
    side.reset();
    Duration::from_nanos(ran.saturating_sub(released).max(1))
}

/// What the bench thread tells a waiter.
enum Cmd {
    /// Acquire (and park, since the bench thread holds the resource).
    Park,
    /// Give back what was acquired.
    Release,
    /// End the loop.
    Stop,
}

/// The bench thread's end of a waiter: commands out, "given back" in, the waiter's stamp.
pub struct Link {
    cmd: UnboundedSender<Cmd>,
    done: mpsc::Receiver<()>,
    ran: Arc<AtomicU64>,
}

/// The waiter's end of a [`Link`]: a thread's or a task's loop of "acquire when told, stamp,
/// give back when told".
pub struct Waiter {
    cmds: UnboundedReceiver<Cmd>,
    done: mpsc::Sender<()>,
    ran: Arc<AtomicU64>,
}

/// A new link and the waiter at its other end.
pub fn link() -> (Link, Waiter) {
    let (cmd, cmds) = unbounded_channel();
    let (done_tx, done) = mpsc::channel();
    let ran = Arc::new(AtomicU64::new(0));
    let link = Link {
        cmd,
        done,
        ran: ran.clone(),
    };
    (
        link,
        Waiter {
            cmds,
            done: done_tx,
            ran,
        },
    )
}

impl Link {
    fn send(&self, cmd: Cmd) {
        self.cmd
            .send(cmd)
            .map_err(|_| ())
            .expect("the waiter lives");
    }

    /// Clears the stamp and tells the waiter to acquire.
    pub fn park(&self) {
        self.ran.store(0, Ordering::Release);
        self.send(Cmd::Park);
    }

    /// Tells the waiter to give back, and waits until it has.
    pub fn take_back(&self) {
        self.send(Cmd::Release);
        self.done.recv().expect("the waiter gives back");
    }

    /// Tells the waiter to end its loop once it is waiting for its next "park".
    pub fn stop(&self) {
        let _ = self.cmd.send(Cmd::Stop);
    }

    /// The waiter's stamp, for [`HandOff::ran`].
    pub fn ran(&self) -> &AtomicU64 {
        &self.ran
    }
}

impl Waiter {
    /// A task's loop: on each "park", awaits `acquire()`, stamps, and holds what it got until
    /// told to give it back. Ends when the link is stopped or dropped.
    pub async fn serve<G, F: Future<Output = G>>(mut self, mut acquire: impl FnMut() -> F) {
        while let Some(Cmd::Park) = self.cmds.recv().await {
            let held = acquire().await;
            self.ran.store(stamp(), Ordering::Release);
            let Some(Cmd::Release) = self.cmds.recv().await else {
                return;
            };
            drop(held);
            let _ = self.done.send(());
        }
    }

    /// A thread's loop: the same as [`Waiter::serve`], blocking in `acquire()`.
    pub fn serve_blocking<G>(mut self, mut acquire: impl FnMut() -> G) {
        while let Some(Cmd::Park) = self.cmds.blocking_recv() {
            let held = acquire();
            self.ran.store(stamp(), Ordering::Release);
            let Some(Cmd::Release) = self.cmds.blocking_recv() else {
                return;
            };
            drop(held);
            let _ = self.done.send(());
        }
    }
}

/// A multi-thread tokio runtime with `workers` workers and the timer enabled.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_time()
        .build()
        .expect("a runtime")
}

/// How long [`HeldWatch::wait`] waits for a `Held` event before it trusts the line's size alone.
const HELD_PATIENCE: Duration = Duration::from_millis(2);

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

/// Watches a monitor for the end of the evaluator's pass that first holds a new waiter: the
/// stricter "parked" of the `give_to_running` benches.
#[derive(Clone, Default)]
pub struct HeldWatch(Arc<HeldSeen>);

impl HeldWatch {
    /// Installs the watch as `monitor`'s sink; call it before the waiter arrives.
    pub fn install(&self, monitor: &Monitor) {
        self.0.0.store(false, Ordering::Release);
        monitor.set_sink(Some(self.0.clone()));
    }

    /// Waits until the pass that first held the new waiter is over, then removes the sink.
    ///
    /// That pass reports `Held`, unless it began before the sink was installed: a pass decides
    /// at its start whether to build events, and a pass started by an earlier event may still be
    /// in flight. Then the waiter is parked and its first pass long over once two milliseconds
    /// have passed with one waiter in the line.
    pub fn wait(&self, monitor: &Monitor) {
        let started = Instant::now();
        while !self.0.0.load(Ordering::Acquire) {
            if monitor.queue_size() == 1 && started.elapsed() > HELD_PATIENCE {
                break;
            }
            thread::yield_now();
        }
        monitor.set_sink(None);
    }
}

/// When a monitor-side waiter counts as parked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parked {
    /// Once it is in the line (`queue_size() == 1`, set inside its first poll).
    InLine,
    /// Once the evaluator's pass that first held it is over ([`HeldWatch`]).
    Held,
}

/// Ours, async: a task on a one-worker runtime awaiting `Monitor::admit` on `account`, whose
/// whole amount the bench thread holds.
pub struct MonitorTask {
    monitor: Monitor,
    demand: Demand,
    held: Option<Grant>,
    parked: Parked,
    watch: HeldWatch,
    link: Link,
    _rt: tokio::runtime::Runtime,
}

impl MonitorTask {
    /// A started monitor, `account` (asked `Amount::ONE`) held by the bench thread, and the
    /// waiting task.
    pub fn new(account: AccountRef, parked: Parked) -> MonitorTask {
        let rt = runtime(1);
        let monitor = Monitor::new();
        monitor.start().expect("a fresh monitor starts");
        let demand = Demand::new().with(account, Amount::ONE);
        let held = monitor
            .admit_blocking(demand.clone(), &JobContext::new("holder"), None)
            .expect("free");
        let (link, waiter) = link();
        {
            let (monitor, demand) = (monitor.clone(), demand.clone());
            let job = JobContext::new("waiter");
            rt.spawn(waiter.serve(move || {
                let admit = monitor.admit(demand.clone(), &job, None);
                async move { admit.await.expect("granted") }
            }));
        }
        MonitorTask {
            monitor,
            demand,
            held: Some(held),
            parked,
            watch: HeldWatch::default(),
            link,
            _rt: rt,
        }
    }

    /// Stops the monitor's evaluator.
    pub fn stop(&self) {
        self.monitor.stop();
    }
}

impl HandOff for MonitorTask {
    fn arm(&mut self) {
        match self.parked {
            Parked::InLine => {
                self.link.park();
                while self.monitor.queue_size() == 0 {
                    thread::yield_now();
                }
            }
            Parked::Held => {
                self.watch.install(&self.monitor);
                self.link.park();
                self.watch.wait(&self.monitor);
            }
        }
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn ran(&self) -> &AtomicU64 {
        self.link.ran()
    }
    fn reset(&mut self) {
        self.link.take_back();
        let grant = self
            .monitor
            .admit_blocking(self.demand.clone(), &JobContext::new("holder"), None)
            .expect("free");
        self.held = Some(grant);
    }
}

/// The peer of [`MonitorTask`]: a task on a one-worker runtime awaiting tokio's
/// `Semaphore::acquire` on the one permit the bench thread holds. "Parked" once the acquire's
/// first poll returned `Pending`, i.e. the task is queued on the semaphore.
pub struct SemaphoreTask {
    semaphore: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    waiting: Arc<AtomicBool>,
    link: Link,
    _rt: tokio::runtime::Runtime,
}

impl SemaphoreTask {
    /// A one-permit semaphore, its permit held by the bench thread, and the waiting task.
    pub fn new() -> SemaphoreTask {
        let rt = runtime(1);
        let semaphore = Arc::new(Semaphore::new(1));
        let held = semaphore.clone().try_acquire_owned().expect("free");
        let waiting = Arc::new(AtomicBool::new(false));
        let (link, waiter) = link();
        {
            let (semaphore, waiting) = (semaphore.clone(), waiting.clone());
            rt.spawn(waiter.serve(move || {
                let (semaphore, waiting) = (semaphore.clone(), waiting.clone());
                async move {
                    // Say "waiting" only once the first poll has queued the task.
                    let mut acquire = std::pin::pin!(semaphore.acquire_owned());
                    std::future::poll_fn(|cx| {
                        let polled = acquire.as_mut().poll(cx);
                        if polled.is_pending() {
                            waiting.store(true, Ordering::Release);
                        }
                        polled
                    })
                    .await
                    .expect("not closed")
                }
            }));
        }
        SemaphoreTask {
            semaphore,
            held: Some(held),
            waiting,
            link,
            _rt: rt,
        }
    }
}

impl Default for SemaphoreTask {
    fn default() -> SemaphoreTask {
        SemaphoreTask::new()
    }
}

impl HandOff for SemaphoreTask {
    fn arm(&mut self) {
        self.waiting.store(false, Ordering::Release);
        self.link.park();
        while !self.waiting.load(Ordering::Acquire) {
            thread::yield_now();
        }
    }
    fn release(&mut self) {
        drop(self.held.take());
    }
    fn ran(&self) -> &AtomicU64 {
        self.link.ran()
    }
    fn reset(&mut self) {
        self.link.take_back();
        self.held = Some(self.semaphore.clone().try_acquire_owned().expect("free"));
    }
}

// ------------------------------------------------------------------------------------------------
// Contention

/// A two-worker tokio runtime without the timer: the runtime of the contended runs.
pub fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("a runtime")
}

/// One contended run through a fresh monitor: `tasks` tasks on `rt` each admit one permit of a
/// fresh `CountingGate` of `permits` `rounds` times ([`contended_admits`]). Only the run is
/// measured, not the monitor's start or stop.
pub fn contended_gate(
    rt: &tokio::runtime::Runtime,
    permits: u64,
    tasks: usize,
    rounds: usize,
    hold: bool,
) -> Usage {
    let monitor = Monitor::new();
    monitor.start().expect("a fresh monitor starts");
    // The monitor runs on the system clock, so the gate's stamps do too.
    let gate = CountingGate::on_system_clock("gate", permits).expect("a positive capacity");
    let demand = Demand::new().with(Arc::new(gate), Amount::ONE);
    let usage = contended_admits(rt, &monitor, &demand, tasks, rounds, hold);
    monitor.stop();
    usage
}

/// `tasks` tasks on `rt` each admit `demand` through `monitor` `rounds` times, holding each
/// grant across one `yield_now` when `hold` says so. Returns what the run cost the process, from
/// the first spawn to the last task's end.
pub fn contended_admits(
    rt: &tokio::runtime::Runtime,
    monitor: &Monitor,
    demand: &Demand,
    tasks: usize,
    rounds: usize,
    hold: bool,
) -> Usage {
    let ((), usage) = Usage::measure(|| {
        rt.block_on(async {
            let running: Vec<_> = (0..tasks)
                .map(|_| {
                    let (monitor, demand) = (monitor.clone(), demand.clone());
                    tokio::spawn(async move {
                        let job = JobContext::new("bench");
                        for _ in 0..rounds {
                            let grant = monitor
                                .admit(demand.clone(), &job, None)
                                .await
                                .expect("granted");
                            if hold {
                                tokio::task::yield_now().await;
                            }
                            drop(grant);
                        }
                    })
                })
                .collect();
            for task in running {
                task.await.expect("the task finishes");
            }
        })
    });
    usage
}

/// The same run on a fresh tokio `Semaphore` of `permits`.
pub fn contended_semaphore(
    rt: &tokio::runtime::Runtime,
    permits: usize,
    tasks: usize,
    rounds: usize,
    hold: bool,
) -> Usage {
    let semaphore = Arc::new(Semaphore::new(permits));
    let ((), usage) = Usage::measure(|| {
        rt.block_on(async {
            let running: Vec<_> = (0..tasks)
                .map(|_| {
                    let semaphore = semaphore.clone();
                    tokio::spawn(async move {
                        for _ in 0..rounds {
                            let permit = semaphore.acquire().await.expect("not closed");
                            if hold {
                                tokio::task::yield_now().await;
                            }
                            drop(permit);
                        }
                    })
                })
                .collect();
            for task in running {
                task.await.expect("the task finishes");
            }
        })
    });
    usage
}
