//! The provider contract suite: plain functions, each named after the rule it checks, taking the
//! provider under test through a [`DbSubject`].
//!
//! Every provider of the workspace runs the whole list against a real database (a SQLite WAL file
//! behind a real pool, larger than the bound), and a third party's provider can run it in a few
//! lines: implement [`DbSubject`] (and [`TransactionalSubject`] for a provider whose verbs reach a
//! database), then call [`run_all`] or [`run_all_transactional`] with a factory that builds a
//! fresh database each time. A rule panics, naming what it saw, when the provider breaks it.
//!
//! # Panics
//!
//! Every rule panics when the subject breaks it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use admission_core::{Account, AdmitError, Amount, Demand, JobContext, Monitor, Replenishment};
use parking_lot::Mutex;

use crate::{CountingDbResourceProvider, DbError, DbHandle, DbPlan, DbResourceProvider};

/// A provider under test, the real pool its connections are counted on, and the table the jobs
/// write to.
pub trait DbSubject: Send + Sync {
    /// The provider under test (the same instance at every call); the rules check its bound.
    fn provider(&self) -> Arc<dyn DbResourceProvider>;

    /// Connections of the real pool checked out now: its size less its idle connections.
    fn checked_out(&self) -> u32;

    /// One job's write under `handle`: row `row` written in one transaction, committed when
    /// `commit` says so and rolled back otherwise. `while_connected` is called once while the job
    /// holds its pooled connection and before its transaction begins (no job may hold a write
    /// lock there: the suite makes jobs meet in it, and samples
    /// [`checked_out`](DbSubject::checked_out)).
    ///
    /// # Errors
    ///
    /// The database's refusal.
    fn job(
        &self,
        handle: &mut dyn DbHandle,
        row: i64,
        commit: bool,
        while_connected: &mut dyn FnMut(),
    ) -> Result<(), DbError>;

    /// The committed rows, sorted, read on a connection of the subject's own (not a handle's).
    fn rows(&self) -> Vec<i64>;
}

/// A subject whose handle's verbs reach the database: what a handle writes is in its transaction.
pub trait TransactionalSubject: DbSubject {
    /// Writes row `row` through `handle`'s connection (inside its transaction, if one is open).
    ///
    /// # Errors
    ///
    /// The database's refusal.
    fn insert(&self, handle: &mut dyn DbHandle, row: i64) -> Result<(), DbError>;
}

/// The job a transactional subject's [`DbSubject::job`] usually is: `while_connected`, then
/// `begin`, [`insert`](TransactionalSubject::insert) row `row`, and commit or roll back as
/// `commit` says.
///
/// # Errors
///
/// The first verb's error.
pub fn transactional_job<S: TransactionalSubject + ?Sized>(
    subject: &S,
    handle: &mut dyn DbHandle,
    row: i64,
    commit: bool,
    while_connected: &mut dyn FnMut(),
) -> Result<(), DbError> {
    while_connected();
    handle.begin()?;
    subject.insert(handle, row)?;
    if commit {
        handle.commit()
    } else {
        handle.rollback()
    }
}

/// How long a job of the suite may wait for its permit before the rule fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// `admission()` is a gate named `db:<name>`, positive, replenished by release; a demand over it
/// is refused at once, and nothing stays taken.
pub fn admission_is_a_release_gate_refusing_a_demand_over_the_bound(subject: &dyn DbSubject) {
    let provider = subject.provider();
    let gate = provider.admission().clone();
    assert_eq!(gate.name(), format!("db:{}", provider.name()));
    assert!(gate.capacity() > 0, "a bound of 0 was accepted");
    assert_eq!(gate.replenishment(), Replenishment::Release);
    assert_eq!(
        provider.name(),
        subject.provider().name(),
        "name() is not stable"
    );
    let monitor = Monitor::new();
    let over = Demand::new().with(gate.clone(), Amount::units(gate.capacity() + 1));
    match monitor.admit_blocking(over, &JobContext::new("over the bound"), Some(PATIENCE)) {
        Err(AdmitError::Refused { account, .. }) => assert_eq!(account, gate.name()),
        other => panic!("a demand over the bound was not refused at once: {other:?}"),
    }
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
}

/// `acquire` materializes a handle in autocommit and takes no permit; closing it (twice) gives
/// the connection back.
pub fn acquire_takes_no_permit_and_close_is_idempotent(subject: &dyn DbSubject) {
    let provider = subject.provider();
    let mut handle = provider.acquire(false).expect("acquire");
    assert_eq!(provider.admission().in_use(), 0);
    assert_eq!(
        (handle.in_transaction(), handle.read_only()),
        (false, false)
    );
    assert_eq!(handle.provider(), provider.id());
    handle.begin().expect("begin");
    handle.close().expect("close");
    handle.close().expect("a second close");
    handle.rollback().expect("a rollback after close");
    assert_eq!((handle.is_closed(), handle.in_transaction()), (true, false));
    assert_eq!(subject.checked_out(), 0);
    assert_eq!(provider.admission().in_use(), 0);
}

/// `abort` is idempotent and returns at once; a later `close` still gives the connection back.
pub fn a_close_after_abort_still_gives_the_connection_back(subject: &dyn DbSubject) {
    let provider = subject.provider();
    let mut handle = provider.acquire(false).expect("acquire");
    handle.begin().expect("begin");
    handle.abort();
    handle.abort();
    handle.rollback().expect("a rollback after abort");
    handle.close().expect("a close after abort");
    assert_eq!((handle.is_closed(), subject.checked_out()), (true, 0));
}

/// A provider refuses another provider's handle, even one of the same name, and leaves it open.
pub fn a_handle_from_another_provider_is_refused(subject: &dyn DbSubject) {
    let provider = subject.provider();
    let clock = Arc::new(admission_core::SystemClock::new());
    let other = CountingDbResourceProvider::new(provider.name(), 1, clock).expect("a provider");
    let mut foreign = other.acquire(false).expect("acquire");
    match provider.close(foreign.as_mut()) {
        Err(DbError::ForeignHandle { provider: p, owner }) => {
            assert_eq!(
                (p.as_str(), owner.as_str()),
                (provider.name(), provider.name())
            );
        }
        other => panic!("another provider's handle was not refused: {other:?}"),
    }
    assert!(!foreign.is_closed());
    let mut mine = provider.acquire(false).expect("acquire");
    assert!(matches!(
        other.close(mine.as_mut()),
        Err(DbError::ForeignHandle { .. })
    ));
    provider.close(mine.as_mut()).expect("its own handle");
    assert_eq!((mine.is_closed(), subject.checked_out()), (true, 0));
}

/// Outside a transaction the connection is in autocommit, and one handle runs several
/// transactions, each committed or rolled back on its own.
pub fn one_handle_runs_several_transactions(subject: &dyn TransactionalSubject) {
    let mut handle = subject.provider().acquire(false).expect("acquire");
    assert!(!handle.in_transaction());
    for (row, commit) in [(1, true), (2, false), (3, true)] {
        handle.begin().expect("begin");
        assert!(handle.in_transaction());
        subject.insert(handle.as_mut(), row).expect("insert");
        if commit {
            handle.commit().expect("commit");
        } else {
            handle.rollback().expect("rollback");
        }
        assert!(!handle.in_transaction());
    }
    handle.close().expect("close");
    assert_eq!(subject.rows(), [1, 3]);
}

/// A row written inside a transaction is invisible to another connection until the commit, and
/// visible once `await_completion` returns.
pub fn an_uncommitted_row_is_invisible_elsewhere_until_commit(subject: &dyn TransactionalSubject) {
    let mut handle = subject.provider().acquire(false).expect("acquire");
    handle.begin().expect("begin");
    subject.insert(handle.as_mut(), 7).expect("insert");
    assert_eq!(subject.rows(), Vec::<i64>::new());
    handle.commit().expect("commit");
    handle.await_completion().expect("await_completion");
    assert_eq!(subject.rows(), [7]);
    handle.close().expect("close");
}

/// A handle dropped inside a transaction leaves nothing open: the write is gone, the connection
/// is back, and every handle acquired afterwards starts in autocommit.
pub fn a_dropped_handle_never_leaves_a_transaction_open(subject: &dyn TransactionalSubject) {
    let provider = subject.provider();
    let mut handle = provider.acquire(false).expect("acquire");
    handle.begin().expect("begin");
    subject.insert(handle.as_mut(), 9).expect("insert");
    drop(handle);
    assert_eq!(subject.checked_out(), 0);
    assert_eq!(subject.rows(), Vec::<i64>::new());
    let bound = provider.admission().capacity();
    let handles: Vec<_> = (0..bound)
        .map(|_| provider.acquire(false).expect("acquire"))
        .collect();
    let open = handles.iter().filter(|h| h.in_transaction()).count();
    assert_eq!(open, 0);
    drop(handles);
    assert_eq!(subject.checked_out(), 0);
}

/// A read-only handle refuses a write, and its connection goes back writable.
pub fn a_read_only_handle_refuses_writes_and_goes_back_as_handed_out(
    subject: &dyn TransactionalSubject,
) {
    let provider = subject.provider();
    let mut reader = provider.acquire(true).expect("acquire");
    assert!(reader.read_only());
    reader.begin().expect("begin");
    assert!(
        subject.insert(reader.as_mut(), 5).is_err(),
        "a read-only handle wrote"
    );
    reader.close().expect("close");
    let bound = provider.admission().capacity();
    let mut writers: Vec<_> = (0..bound)
        .map(|_| provider.acquire(false).expect("acquire"))
        .collect();
    for (i, writer) in writers.iter_mut().enumerate() {
        subject
            .insert(writer.as_mut(), 100 + i as i64)
            .expect("a writer after a reader");
    }
    drop(writers);
    assert_eq!(
        subject.rows(),
        (0..bound as i64).map(|i| 100 + i).collect::<Vec<_>>()
    );
}

/// `jobs` jobs (at least the bound) through a real monitor, each taking one permit with its
/// demand and then a handle: the pool's most connections out at once is the bound exactly (the
/// first `bound` jobs to connect meet at a barrier before sampling, so the bound is reached, and
/// the permits keep it from being passed), every write is committed or rolled back as its job
/// said (every fourth rolls back), and nothing is out at the end.
pub fn jobs_sharing_a_bound_never_hold_more_connections_than_the_bound(
    subject: &dyn DbSubject,
    jobs: u32,
) {
    let provider = subject.provider();
    let gate = provider.admission().clone();
    let bound = u32::try_from(gate.capacity()).expect("a bound in u32");
    assert!(jobs >= bound, "{jobs} jobs cannot fill a bound of {bound}");
    let meet = Barrier::new(bound as usize);
    let connected = AtomicU32::new(0);
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(provider.clone(), false);
    let most = Mutex::new(0u32);
    std::thread::scope(|s| {
        for row in 0..jobs {
            let (monitor, plan, most) = (&monitor, &plan, &most);
            let (meet, connected) = (&meet, &connected);
            s.spawn(move || {
                let ctx = JobContext::new(format!("job {row}"));
                let grant = monitor
                    .admit_blocking(plan.demand(Demand::new()), &ctx, Some(PATIENCE))
                    .expect("admitted");
                let job = plan.open(grant).expect("opened");
                job.with(0, |handle| {
                    subject.job(handle, i64::from(row), row % 4 != 0, &mut || {
                        if connected.fetch_add(1, Ordering::AcqRel) < bound {
                            meet.wait();
                        }
                        let mut most = most.lock();
                        *most = (*most).max(subject.checked_out());
                    })
                })
                .expect("the job's write");
                job.close().expect("closed");
            });
        }
    });
    let most = most.into_inner();
    if most != bound {
        panic!("the most connections out at once were {most}, under a bound of {bound}");
    }
    let expected: Vec<i64> = (0..jobs).filter(|r| r % 4 != 0).map(i64::from).collect();
    assert_eq!(subject.rows(), expected);
    assert_eq!(
        (subject.checked_out(), gate.in_use(), monitor.queue_size()),
        (0, 0, 0)
    );
    monitor.stop();
}

/// A job cancelled while it waits for its permit never acquires a handle: the pool's count stays
/// at what the holders of every permit took.
pub fn a_job_cancelled_while_waiting_never_opens_a_connection(subject: &dyn DbSubject) {
    let provider = subject.provider();
    let gate = provider.admission().clone();
    let bound = gate.capacity();
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(provider.clone(), false);
    let holders: Vec<_> = (0..bound)
        .map(|i| {
            let ctx = JobContext::new(format!("holder {i}"));
            let grant = monitor
                .admit_blocking(plan.demand(Demand::new()), &ctx, Some(PATIENCE))
                .expect("admitted");
            plan.open(grant).expect("opened")
        })
        .collect();
    let held = subject.checked_out();
    let ctx = JobContext::new("cancelled");
    let opened = Mutex::new(false);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let grant = monitor.admit_blocking(plan.demand(Demand::new()), &ctx, Some(PATIENCE))?;
            *opened.lock() = true;
            let _job = plan.open(grant);
            Ok::<(), AdmitError>(())
        });
        while monitor.queue_size() != 1 {
            std::thread::yield_now();
        }
        ctx.cancel();
        match waiter.join().expect("the waiter") {
            Err(AdmitError::Cancelled { .. }) => {}
            other => panic!("the cancelled job was not withdrawn: {other:?}"),
        }
    });
    assert!(!*opened.lock(), "the cancelled job opened a connection");
    assert_eq!((subject.checked_out(), gate.in_use()), (held, bound));
    drop(holders);
    assert_eq!(
        (subject.checked_out(), gate.in_use(), monitor.queue_size()),
        (0, 0, 0)
    );
    monitor.stop();
}

/// Every rule for any provider, each on a fresh subject from `make`; `jobs` jobs for the shared
/// bound (200 in the workspace's runs).
pub fn run_all<S: DbSubject>(make: impl Fn() -> S, jobs: u32) {
    admission_is_a_release_gate_refusing_a_demand_over_the_bound(&make());
    acquire_takes_no_permit_and_close_is_idempotent(&make());
    a_close_after_abort_still_gives_the_connection_back(&make());
    a_handle_from_another_provider_is_refused(&make());
    jobs_sharing_a_bound_never_hold_more_connections_than_the_bound(&make(), jobs);
    a_job_cancelled_while_waiting_never_opens_a_connection(&make());
}

/// [`run_all`], then the rules for a provider whose verbs reach the database.
pub fn run_all_transactional<S: TransactionalSubject>(make: impl Fn() -> S, jobs: u32) {
    run_all(&make, jobs);
    one_handle_runs_several_transactions(&make());
    an_uncommitted_row_is_invisible_elsewhere_until_commit(&make());
    a_dropped_handle_never_leaves_a_transaction_open(&make());
    a_read_only_handle_refuses_writes_and_goes_back_as_handed_out(&make());
}
