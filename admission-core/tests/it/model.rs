//! The monitor against a reference model written for clarity, not speed: one FIFO line, walked
//! from its front after every change; the first waiter that does not fit is the head, and every
//! waiter behind it is asked with the head's amounts set aside (EASY backfilling); a waiter whose
//! deadline passed leaves first, a demand an account can never grant is refused wherever it
//! stands. Random sequences of arrivals, releases, cancellations, clock moves, capacity changes
//! and a stop drive both; after each operation the monitor's grants (in the order its events
//! report them) and refusals (by reason) must be the model's, and no account may ever be
//! overdrawn. Each sequence (200 of them, of 1,000 operations) ends with nothing held and nothing
//! parked. This drives the whole monitor (its shell: the lock, the events, the futures); the
//! state machine alone runs a million operations against the same reference in its unit tests
//! (`src/machine/model.rs`). A planted flaw, a backfill that ignores the head's reservation (the
//! machine's pass asking followers with no head), fails both within the first sequences.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use admission_core::event::EventKind;
use admission_core::{
    Account, AccountStatus, Admit, AdmitError, Amount, Answer, Ask, Category, Demand, Grant,
    JobContext, Monitor, Refusal, Replenishment, WakeFn, WakeSlot,
};
use admission_events::Recorder;
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use admission_testkit::reference::ReferenceStatus;
use parking_lot::Mutex;
use proptest::prelude::*;

const ACCOUNTS: usize = 3;

/// A release account whose capacity a test changes: `Permits` with a knob. A take past the
/// capacity is a test failure at once (the overdraw check runs at every debit).
struct Pool {
    name: String,
    capacity: AtomicU64,
    in_use: Mutex<u64>,
    wake: WakeSlot,
}

impl Pool {
    fn new(name: String, capacity: u64) -> Pool {
        Pool {
            name,
            capacity: AtomicU64::new(capacity),
            in_use: Mutex::new(0),
            wake: WakeSlot::new(),
        }
    }

    fn set_capacity(&self, capacity: u64) {
        let before = self.capacity.swap(capacity, Ordering::SeqCst);
        if capacity > before {
            self.wake.notify();
        }
    }

    fn in_use(&self) -> u64 {
        *self.in_use.lock()
    }
}

impl Account for Pool {
    fn name(&self) -> &str {
        &self.name
    }
    fn category(&self) -> Category {
        Category::custom("pool")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let capacity = self.capacity.load(Ordering::SeqCst);
        if mine.primary() > capacity {
            return Answer::Never(Refusal::too_large(mine, Amount::units(capacity)));
        }
        let mut in_use = self.in_use.lock();
        let free = capacity.saturating_sub(*in_use);
        if mine.primary() + ask.reserved_ahead().primary() > free {
            return Answer::NotNow(None);
        }
        if ask.takes() {
            *in_use += mine.primary();
            assert!(
                *in_use <= capacity,
                "{} overdrawn: {in_use} of {capacity}",
                self.name
            );
        }
        Answer::Taken
    }
    fn give(&self, amount: Amount) {
        {
            let mut in_use = self.in_use.lock();
            *in_use = in_use
                .checked_sub(amount.primary())
                .expect("a give of more than was taken");
        }
        if amount.primary() > 0 {
            self.wake.notify();
        }
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        let capacity = self.capacity.load(Ordering::SeqCst);
        Box::new(ReferenceStatus {
            name: self.name.clone(),
            category: Category::custom("pool"),
            capacity,
            available: capacity.saturating_sub(self.in_use()),
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Op {
    /// A job asks for `amounts` (account, units), waiting at most `timeout_ms` if any.
    Arrive {
        amounts: Vec<(usize, u64)>,
        timeout_ms: Option<u64>,
    },
    /// The `n`th held grant (modulo how many are held) is released.
    Release(usize),
    /// The `n`th waiting job (modulo) is cancelled.
    Cancel(usize),
    /// The clock moves on.
    Advance(u64),
    /// An account's capacity changes.
    Capacity(usize, u64),
    /// The monitor stops.
    Stop,
}

fn op() -> impl Strategy<Value = Op> {
    let amounts = proptest::sample::subsequence((0..ACCOUNTS).collect::<Vec<_>>(), 1..=ACCOUNTS)
        .prop_flat_map(|accounts| {
            let n = accounts.len();
            (Just(accounts), proptest::collection::vec(1..=6u64, n))
        })
        .prop_map(|(accounts, units)| accounts.into_iter().zip(units).collect::<Vec<_>>());
    prop_oneof![
        40 => (amounts, proptest::option::weighted(0.5, 1..=40u64))
            .prop_map(|(amounts, timeout_ms)| Op::Arrive { amounts, timeout_ms }),
        25 => any::<usize>().prop_map(Op::Release),
        8 => any::<usize>().prop_map(Op::Cancel),
        12 => (0..=20u64).prop_map(Op::Advance),
        8 => (0..ACCOUNTS, 1..=6u64).prop_map(|(a, c)| Op::Capacity(a, c)),
        1 => Just(Op::Stop),
    ]
}

/// How a job ended, as both sides report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Granted,
    Never,
    TimedOut,
    Cancelled,
    Shutdown,
}

fn end_of(error: &AdmitError) -> End {
    match error {
        AdmitError::Refused { .. } => End::Never,
        AdmitError::TimedOut { .. } => End::TimedOut,
        AdmitError::Cancelled { .. } => End::Cancelled,
        AdmitError::Shutdown => End::Shutdown,
        other => panic!("an error the model does not know: {other}"),
    }
}

/// The model's waiter: its job, its amounts, and its deadline on the clock (ms).
#[derive(Clone, Debug)]
struct Waiting {
    job: u64,
    amounts: Vec<(usize, u64)>,
    deadline: Option<u64>,
}

/// The reference: plain vectors and one walk.
struct Model {
    capacity: [u64; ACCOUNTS],
    in_use: [u64; ACCOUNTS],
    line: Vec<Waiting>,
    held: Vec<(u64, Vec<(usize, u64)>)>,
    now: u64,
    stopped: bool,
}

impl Model {
    fn free(&self, account: usize) -> u64 {
        self.capacity[account].saturating_sub(self.in_use[account])
    }

    fn never(&self, amounts: &[(usize, u64)]) -> bool {
        amounts.iter().any(|&(a, units)| units > self.capacity[a])
    }

    fn fits(&self, amounts: &[(usize, u64)], ahead: &[u64; ACCOUNTS]) -> bool {
        amounts
            .iter()
            .all(|&(a, units)| units + ahead[a] <= self.free(a))
    }

    fn take(&mut self, job: u64, amounts: Vec<(usize, u64)>) {
        for &(a, units) in &amounts {
            self.in_use[a] += units;
        }
        self.held.push((job, amounts));
    }

    /// The walk from the front: the grants in order, and the refusals.
    fn walk(&mut self, granted: &mut Vec<u64>, ended: &mut BTreeMap<u64, End>) {
        let mut ahead: Option<[u64; ACCOUNTS]> = None;
        let mut i = 0;
        while i < self.line.len() {
            let w = self.line[i].clone();
            if w.deadline.is_some_and(|d| d <= self.now) {
                self.line.remove(i);
                ended.insert(w.job, End::TimedOut);
                continue;
            }
            if self.never(&w.amounts) {
                self.line.remove(i);
                ended.insert(w.job, End::Never);
                continue;
            }
            if self.fits(&w.amounts, &ahead.unwrap_or([0; ACCOUNTS])) {
                self.line.remove(i);
                self.take(w.job, w.amounts.clone());
                granted.push(w.job);
                ended.insert(w.job, End::Granted);
                continue;
            }
            if ahead.is_none() {
                let mut reserved = [0; ACCOUNTS];
                for &(a, units) in &w.amounts {
                    reserved[a] = units;
                }
                ahead = Some(reserved);
            }
            i += 1;
        }
    }
}

/// The monitor's side: its jobs in the line, its grants held, what its events said.
struct Real {
    monitor: Monitor,
    clock: FakeClock,
    pools: Vec<Arc<Pool>>,
    recorder: Arc<Recorder>,
    waiting: Vec<(u64, JobContext, Pin<Box<Admit>>)>,
    held: Vec<(u64, Grant)>,
}

impl Real {
    /// The jobs its events report granted since the last look, in order (the recorder is
    /// emptied at each look).
    fn granted(&mut self) -> Vec<u64> {
        let events = self.recorder.events();
        self.recorder.clear();
        events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    EventKind::GrantedImmediate | EventKind::GrantedFromHold { .. }
                )
            })
            .map(|e| e.job.id)
            .collect()
    }

    /// Every waiting future polled once: the jobs that ended, and how.
    fn settle(&mut self, ended: &mut BTreeMap<u64, End>) {
        let mut still = Vec::new();
        for (job, ctx, mut admit) in self.waiting.drain(..) {
            match poll_once(&mut admit) {
                None => still.push((job, ctx, admit)),
                Some(Ok(grant)) => {
                    ended.insert(job, End::Granted);
                    self.held.push((job, grant));
                }
                Some(Err(error)) => {
                    ended.insert(job, end_of(&error));
                }
            }
        }
        self.waiting = still;
    }
}

fn check(ops: &[Op], capacities: [u64; ACCOUNTS]) {
    let clock = FakeClock::new();
    let recorder = Arc::new(Recorder::new());
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .sink(recorder.clone())
        .build();
    let pools: Vec<Arc<Pool>> = (0..ACCOUNTS)
        .map(|a| Arc::new(Pool::new(format!("pool-{a}"), capacities[a])))
        .collect();
    let mut real = Real {
        monitor,
        clock,
        pools,
        recorder,
        waiting: Vec::new(),
        held: Vec::new(),
    };
    let mut model = Model {
        capacity: capacities,
        in_use: [0; ACCOUNTS],
        line: Vec::new(),
        held: Vec::new(),
        now: 0,
        stopped: false,
    };
    for (step, op) in ops.iter().enumerate() {
        let mut model_granted = Vec::new();
        let mut model_ended = BTreeMap::new();
        let mut real_ended = BTreeMap::new();
        match op {
            Op::Arrive {
                amounts,
                timeout_ms,
            } => {
                let ctx = JobContext::new(format!("job-{step}"));
                let job = ctx.id();
                let mut demand = Demand::new();
                for &(a, units) in amounts {
                    demand.add(real.pools[a].clone(), Amount::units(units));
                }
                let timeout = timeout_ms.map(Duration::from_millis);
                let mut admit = Box::pin(real.monitor.admit(demand, &ctx, timeout));
                match poll_once(&mut admit) {
                    Some(Ok(grant)) => {
                        real_ended.insert(job, End::Granted);
                        real.held.push((job, grant));
                    }
                    Some(Err(error)) => {
                        real_ended.insert(job, end_of(&error));
                    }
                    None => real.waiting.push((job, ctx, admit)),
                }
                if model.stopped {
                    model_ended.insert(job, End::Shutdown);
                } else if model.never(amounts) {
                    model_ended.insert(job, End::Never);
                } else {
                    model.line.push(Waiting {
                        job,
                        amounts: amounts.clone(),
                        deadline: timeout_ms.map(|t| model.now + t),
                    });
                }
            }
            Op::Release(n) => {
                if !real.held.is_empty() {
                    let at = n % real.held.len();
                    let (job, grant) = real.held.remove(at);
                    drop(grant);
                    let at = model
                        .held
                        .iter()
                        .position(|(j, _)| *j == job)
                        .expect("the model holds it too");
                    let (_, amounts) = model.held.remove(at);
                    for (a, units) in amounts {
                        model.in_use[a] -= units;
                    }
                }
            }
            Op::Cancel(n) => {
                if !real.waiting.is_empty() {
                    let at = n % real.waiting.len();
                    let job = real.waiting[at].0;
                    real.waiting[at].1.cancel();
                    if let Some(i) = model.line.iter().position(|w| w.job == job) {
                        model.line.remove(i);
                        model_ended.insert(job, End::Cancelled);
                    }
                }
            }
            Op::Advance(ms) => {
                real.clock.advance(Duration::from_millis(*ms));
                model.now += ms;
            }
            Op::Capacity(a, capacity) => {
                real.pools[*a].set_capacity(*capacity);
                model.capacity[*a] = *capacity;
            }
            Op::Stop => {
                real.monitor.stop();
                if !model.stopped {
                    model.stopped = true;
                    for w in model.line.drain(..) {
                        model_ended.insert(w.job, End::Shutdown);
                    }
                }
            }
        }
        if !model.stopped {
            real.monitor.pass_now();
            model.walk(&mut model_granted, &mut model_ended);
        }
        real.settle(&mut real_ended);
        let real_granted = real.granted();
        assert_eq!(
            real_granted, model_granted,
            "step {step} ({op:?}): the grants, in order"
        );
        assert_eq!(
            real_ended, model_ended,
            "step {step} ({op:?}): how jobs ended"
        );
        for (a, pool) in real.pools.iter().enumerate() {
            assert_eq!(
                pool.in_use(),
                model.in_use[a],
                "step {step}: pool-{a} in use"
            );
        }
        assert_eq!(
            real.monitor.queue_size(),
            model.line.len(),
            "step {step}: parked"
        );
    }
    // The end: every waiter refused by a stop, every grant given back; nothing held or parked.
    real.monitor.stop();
    let mut ended = BTreeMap::new();
    real.settle(&mut ended);
    assert!(ended.values().all(|e| *e == End::Shutdown), "{ended:?}");
    real.held.clear();
    assert_eq!(real.monitor.queue_size(), 0);
    assert!(real.pools.iter().all(|p| p.in_use() == 0), "leaked a unit");
}

/// The number of sequences: 200 by default (200,000 operations of 1,000 each, about 5 s in a
/// debug build); `ADMISSION_MODEL_CASES` sets another. Under valgrind (the memcheck step,
/// `ADMISSION_UNDER_VALGRIND`), which runs the code tens of times slower, 10.
fn cases() -> u32 {
    if let Some(n) = std::env::var("ADMISSION_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        return n;
    }
    if std::env::var_os("ADMISSION_UNDER_VALGRIND").is_some() {
        10
    } else {
        200
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_monitor_grants_and_refuses_as_the_reference_model_does(
        ops in proptest::collection::vec(op(), 1_000),
        capacities in proptest::array::uniform3(1..=6u64),
    ) {
        check(&ops, capacities);
    }
}
