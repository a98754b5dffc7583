//! The contract suite against a real PostgreSQL server (`ADMISSION_PG_URL`, started by `cargo
//! xtask test` / `ci` / `with-services`), each test on a fresh database behind a pool larger than
//! the bound: the r2d2 provider over the sync client and the deadpool provider; then the issue's
//! run of 200 jobs with commits, rollbacks, drops, force-closes and cancellations, after which no
//! session is left `idle in transaction`.
//!
//! Without its server a test fails, saying how to start it; a plain `cargo nextest run` skips
//! these tests (`.config/nextest.toml`), `cargo xtask test` starts the servers and runs them.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use admission_core::{AdmitError, Clock, Demand, JobContext, Monitor, SystemClock};
use admission_db::contract::{self, DbSubject, TransactionalSubject};
use admission_db::{DbError, DbHandle, DbPlan, DbResourceProvider};
use parking_lot::Mutex;
use postgres::{Client, NoTls};

use crate::contract_suite::{Fresh, contract_rules};

/// The bound the suite runs under, and the pool's size, larger.
const BOUND: u64 = 8;
const POOL: u32 = 12;
/// Jobs through the monitor.
const JOBS: u32 = 200;

/// The server's URL, or `None` (after saying why) when unset outside CI.
///
/// # Panics
///
/// When unset under `CI=true`.
pub(crate) fn pg_url(test: &str) -> String {
    admission_testkit::services::postgres(test)
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

/// A fresh database with the jobs' table, dropped (sessions and all) at the end.
pub(crate) struct PgDb {
    url: String,
    name: String,
    pub(crate) config: postgres::Config,
}

impl PgDb {
    pub(crate) fn new(url: &str) -> PgDb {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "admission_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = Client::connect(url, NoTls).expect("connect to ADMISSION_PG_URL");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let mut config: postgres::Config = url.parse().unwrap();
        config.dbname(&name);
        let db = PgDb {
            url: url.to_owned(),
            name,
            config,
        };
        db.client()
            .batch_execute("CREATE TABLE jobs (id BIGINT PRIMARY KEY)")
            .unwrap();
        db
    }

    fn client(&self) -> Client {
        self.config.connect(NoTls).unwrap()
    }

    /// The committed rows, read on a session of its own.
    fn rows(&self) -> Vec<i64> {
        self.client()
            .query("SELECT id FROM jobs ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Sessions on this database left `idle in transaction`, once detached sessions have had up
    /// to 10 s to end (closing a socket reaches the server a moment later).
    /// Waits (polling the server's view of its sessions, up to 10 s) until a statement
    /// containing `fragment` runs on a session other than the poller's.
    fn wait_until_running(&self, fragment: &str) {
        let mut admin = Client::connect(&self.url, NoTls).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let pattern = format!("%{fragment}%");
        loop {
            let n: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                     AND state = 'active' AND query LIKE $2 AND pid <> pg_backend_pid()",
                    &[&self.name, &pattern],
                )
                .unwrap()
                .get(0);
            if n > 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no session ran `{fragment}` within 10 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn idle_in_transaction(&self) -> i64 {
        let mut admin = Client::connect(&self.url, NoTls).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = $1 AND state LIKE 'idle in transaction%'",
                    &[&self.name],
                )
                .unwrap()
                .get(0);
            if n == 0 || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let dropped = Client::connect(&self.url, NoTls).and_then(|mut admin| {
            admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
        });
        if let Err(e) = dropped {
            eprintln!("dropping test database {}: {e}", self.name);
        }
    }
}

/// What the PostgreSQL subjects add to the suite's: their database, and the most waiters the
/// pool counted while sampled.
trait PgSubject: TransactionalSubject {
    fn db(&self) -> &PgDb;
    fn most_waiting(&self) -> usize {
        0
    }
}

fn pg_err(operation: &'static str) -> impl Fn(postgres::Error) -> DbError {
    move |e| DbError::database("pg", operation, e)
}

#[cfg(feature = "r2d2-postgres")]
mod r2d2_pg {
    use admission_db::r2d2_postgres::{PgHandle, PgManager, R2d2PostgresProvider};

    use super::*;

    /// The r2d2 provider over the sync client.
    pub(super) struct R2d2Pg {
        provider: Arc<R2d2PostgresProvider>,
        db: PgDb,
    }

    pub(super) fn subject(url: &str) -> R2d2Pg {
        let db = PgDb::new(url);
        let pool = r2d2::Pool::builder()
            .max_size(POOL)
            .build(PgManager::new(db.config.clone()))
            .unwrap();
        let provider = R2d2PostgresProvider::new("pg", BOUND, pool, clock()).unwrap();
        R2d2Pg {
            provider: Arc::new(provider),
            db,
        }
    }

    fn pg(handle: &mut dyn DbHandle) -> &mut PgHandle {
        (handle as &mut dyn Any)
            .downcast_mut::<PgHandle>()
            .expect("a PgHandle")
    }

    impl DbSubject for R2d2Pg {
        fn provider(&self) -> Arc<dyn DbResourceProvider> {
            self.provider.clone()
        }
        fn checked_out(&self) -> u32 {
            self.provider.checked_out()
        }
        fn job(
            &self,
            handle: &mut dyn DbHandle,
            row: i64,
            commit: bool,
            while_connected: &mut dyn FnMut(),
        ) -> Result<(), DbError> {
            admission_db::contract::transactional_job(self, handle, row, commit, while_connected)
        }
        fn rows(&self) -> Vec<i64> {
            self.db.rows()
        }
    }

    impl TransactionalSubject for R2d2Pg {
        fn insert(&self, handle: &mut dyn DbHandle, row: i64) -> Result<(), DbError> {
            pg(handle)
                .client()?
                .execute("INSERT INTO jobs (id) VALUES ($1)", &[&row])
                .map(drop)
                .map_err(pg_err("insert"))
        }
    }

    impl PgSubject for R2d2Pg {
        fn db(&self) -> &PgDb {
            &self.db
        }
    }

    impl Fresh for R2d2Pg {
        fn fresh(test: &str) -> R2d2Pg {
            subject(&pg_url(test))
        }
    }

    contract_rules!(contract_rules: R2d2Pg, whole suite with JOBS);

    #[test]
    fn r2d2_postgres_jobs_leave_no_session_idle_in_transaction() {
        let url = pg_url("r2d2_postgres_jobs_leave_no_session_idle_in_transaction");
        jobs_with_drops_and_cancellations_leave_nothing_open(&subject(&url));
    }

    #[test]
    fn r2d2_postgres_a_checkout_past_the_pool_names_its_size_and_idle_count() {
        let url = pg_url("r2d2_postgres_a_checkout_past_the_pool_names_its_size");
        let db = PgDb::new(&url);
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .build(PgManager::new(db.config.clone()))
            .unwrap();
        let provider = R2d2PostgresProvider::new("small", 2, pool, clock())
            .unwrap()
            .with_checkout_timeout(Duration::from_millis(50));
        let held = provider.checkout(false).unwrap();
        let err = provider.checkout(false).unwrap_err();
        assert!(
            matches!(
                err,
                DbError::Checkout { ref provider, size: 1, idle: 0, max_size: 1, .. }
                    if provider == "small"
            ),
            "{err}"
        );
        drop(held);
        assert_eq!(provider.checked_out(), 0);
    }

    #[test]
    fn r2d2_postgres_force_close_cancels_a_running_statement_and_gives_everything_back() {
        let url = pg_url("r2d2_postgres_force_close_cancels_a_running_statement");
        let subject = subject(&url);
        let provider = subject.provider.clone();
        force_close_cancels_a_running_statement(&subject, |handle| {
            pg(handle)
                .client()?
                .batch_execute("SELECT pg_sleep(60)")
                .map_err(pg_err("sleep"))
        });
        assert_eq!(provider.checked_out(), 0);
    }

    #[test]
    fn r2d2_postgres_an_abort_never_reaches_the_next_job_on_the_session() {
        let url = pg_url("r2d2_postgres_an_abort_never_reaches_the_next_job");
        let db = PgDb::new(&url);
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .build(PgManager::new(db.config.clone()))
            .unwrap();
        let provider = R2d2PostgresProvider::new("pg", 1, pool, clock()).unwrap();
        an_abort_never_reaches_the_next_job_on_the_session(&db, &provider, |handle| {
            pg(handle)
                .client()?
                .batch_execute("SELECT pg_sleep(0.3)")
                .map_err(pg_err("sleep"))
        });
        assert_eq!(provider.checked_out(), 0);
    }
}

#[cfg(feature = "deadpool-postgres")]
pub(crate) mod deadpool_pg {
    use admission_db::deadpool_postgres::{DeadpoolHandle, DeadpoolPostgresProvider};
    use deadpool_postgres::{Manager, Pool, Runtime};

    use super::*;

    /// The deadpool provider, its sync face driven on a runtime of its own.
    pub(super) struct Deadpool {
        provider: Arc<DeadpoolPostgresProvider>,
        most_waiting: AtomicUsize,
        db: PgDb,
        runtime: tokio::runtime::Runtime,
    }

    pub(crate) fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    pub(crate) fn pool(db: &PgDb, size: usize) -> Pool {
        let mut config = tokio_postgres::Config::new();
        let c = &db.config;
        for host in c.get_hosts() {
            if let tokio_postgres::config::Host::Tcp(h) = host {
                config.host(h);
            }
        }
        config
            .port(c.get_ports()[0])
            .user(c.get_user().unwrap())
            .dbname(&db.name);
        Pool::builder(Manager::new(config, tokio_postgres::NoTls))
            .max_size(size)
            .runtime(Runtime::Tokio1)
            .build()
            .unwrap()
    }

    pub(super) fn subject(url: &str) -> Deadpool {
        let db = PgDb::new(url);
        let runtime = runtime();
        let pool = pool(&db, POOL as usize);
        // Every session opened up front: deadpool counts a checkout that is still creating its
        // session as waiting (`waiting` is its users less its size).
        runtime.block_on(async {
            let mut warm = Vec::new();
            for _ in 0..POOL {
                warm.push(pool.get().await.unwrap());
            }
        });
        let provider =
            DeadpoolPostgresProvider::new("pg", BOUND, pool, clock(), runtime.handle().clone())
                .unwrap();
        Deadpool {
            provider: Arc::new(provider),
            most_waiting: AtomicUsize::new(0),
            db,
            runtime,
        }
    }

    fn dp(handle: &mut dyn DbHandle) -> &mut DeadpoolHandle {
        (handle as &mut dyn Any)
            .downcast_mut::<DeadpoolHandle>()
            .expect("a DeadpoolHandle")
    }

    impl DbSubject for Deadpool {
        fn provider(&self) -> Arc<dyn DbResourceProvider> {
            self.provider.clone()
        }
        fn checked_out(&self) -> u32 {
            let status = self.provider.pool().status();
            self.most_waiting
                .fetch_max(status.waiting, Ordering::AcqRel);
            u32::try_from(self.provider.checked_out()).unwrap()
        }
        fn job(
            &self,
            handle: &mut dyn DbHandle,
            row: i64,
            commit: bool,
            while_connected: &mut dyn FnMut(),
        ) -> Result<(), DbError> {
            admission_db::contract::transactional_job(self, handle, row, commit, while_connected)
        }
        fn rows(&self) -> Vec<i64> {
            self.db.rows()
        }
    }

    impl TransactionalSubject for Deadpool {
        fn insert(&self, handle: &mut dyn DbHandle, row: i64) -> Result<(), DbError> {
            let client = dp(handle).client()?;
            self.runtime
                .block_on(client.execute("INSERT INTO jobs (id) VALUES ($1)", &[&row]))
                .map(drop)
                .map_err(|e| DbError::database("pg", "insert", e))
        }
    }

    impl PgSubject for Deadpool {
        fn db(&self) -> &PgDb {
            &self.db
        }
        fn most_waiting(&self) -> usize {
            self.most_waiting.load(Ordering::Acquire)
        }
    }

    impl Fresh for Deadpool {
        fn fresh(test: &str) -> Deadpool {
            subject(&pg_url(test))
        }
    }

    contract_rules!(contract_rules: Deadpool, whole suite with JOBS);

    #[test]
    fn deadpool_postgres_jobs_sharing_the_bound_never_wait_on_the_pool() {
        let url = pg_url("deadpool_postgres_jobs_sharing_the_bound_never_wait_on_the_pool");
        let subject = subject(&url);
        contract::jobs_sharing_a_bound_never_hold_more_connections_than_the_bound(&subject, JOBS);
        assert_eq!(subject.most_waiting(), 0, "a checkout waited on the pool");
    }

    /// `waiting` is not asserted here: a session detached by a dropped handle is replaced on a
    /// later checkout, which deadpool counts as waiting while it connects (users less size).
    #[test]
    fn deadpool_postgres_jobs_leave_no_session_idle_in_transaction() {
        let url = pg_url("deadpool_postgres_jobs_leave_no_session_idle_in_transaction");
        jobs_with_drops_and_cancellations_leave_nothing_open(&subject(&url));
    }

    #[test]
    fn deadpool_a_checkout_past_the_pool_times_out_naming_size_available_and_waiting() {
        let url = pg_url("deadpool_a_checkout_past_the_pool_times_out");
        let db = PgDb::new(&url);
        let runtime = runtime();
        let provider = DeadpoolPostgresProvider::new(
            "small",
            2,
            pool(&db, 1),
            clock(),
            runtime.handle().clone(),
        )
        .unwrap()
        .with_checkout_timeout(Duration::from_millis(50));
        runtime.block_on(async {
            let held = provider.checkout(false).await.unwrap();
            let err = provider.checkout(false).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    DbError::PoolTimeout { ref provider, size: 1, available: 0, max_size: 1, timeout, .. }
                        if provider == "small" && timeout == Duration::from_millis(50)
                ),
                "{err}"
            );
            drop(held);
        });
        assert_eq!(provider.checked_out(), 0);
    }

    #[test]
    fn deadpool_a_task_dropped_mid_transaction_or_mid_begin_detaches_its_session() {
        let url = pg_url("deadpool_a_task_dropped_mid_transaction_detaches");
        let subject = subject(&url);
        let provider = subject.provider.clone();
        subject.runtime.block_on(async {
            // A task cancelled inside its transaction: the handle is dropped, never closed.
            let (inserted, in_transaction) = tokio::sync::oneshot::channel();
            let task = tokio::spawn({
                let provider = provider.clone();
                async move {
                    let mut handle = provider.checkout(false).await.unwrap();
                    handle.begin_async().await.unwrap();
                    handle
                        .client()
                        .unwrap()
                        .execute("INSERT INTO jobs (id) VALUES (1)", &[])
                        .await
                        .unwrap();
                    let _ = inserted.send(());
                    std::future::pending::<()>().await;
                }
            });
            // Cancelled once its row is written inside the open transaction.
            in_transaction.await.unwrap();
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            // A begin cancelled before its answer.
            let mut handle = provider.checkout(false).await.unwrap();
            let begin = handle.begin_async();
            let _ = tokio::time::timeout(Duration::ZERO, begin).await;
            assert!(handle.in_transaction());
            drop(handle);
        });
        assert_eq!(provider.checked_out(), 0);
        assert_eq!(subject.db.idle_in_transaction(), 0);
        assert_eq!(subject.rows(), Vec::<i64>::new());
        let mut handle = provider.acquire(false).unwrap();
        assert!(!handle.in_transaction());
        handle.close().unwrap();
    }

    #[test]
    fn deadpool_postgres_force_close_cancels_a_running_statement_and_gives_everything_back() {
        let url = pg_url("deadpool_postgres_force_close_cancels_a_running_statement");
        let subject = subject(&url);
        let runtime = subject.runtime.handle().clone();
        force_close_cancels_a_running_statement(&subject, |handle| {
            let client = dp(handle).client()?;
            runtime
                .block_on(client.batch_execute("SELECT pg_sleep(60)"))
                .map_err(|e| DbError::database("pg", "sleep", e))
        });
        assert_eq!(subject.provider.checked_out(), 0);
    }

    #[test]
    fn deadpool_postgres_an_abort_never_reaches_the_next_job_on_the_session() {
        let url = pg_url("deadpool_postgres_an_abort_never_reaches_the_next_job");
        let db = PgDb::new(&url);
        let runtime = runtime();
        let provider =
            DeadpoolPostgresProvider::new("pg", 1, pool(&db, 1), clock(), runtime.handle().clone())
                .unwrap();
        an_abort_never_reaches_the_next_job_on_the_session(&db, &provider, |handle| {
            let client = dp(handle).client()?;
            runtime
                .block_on(client.batch_execute("SELECT pg_sleep(0.3)"))
                .map_err(|e| DbError::database("pg", "sleep", e))
        });
        assert_eq!(provider.checked_out(), 0);
    }
}

/// The run: `JOBS` jobs through the monitor sharing a bound of `BOUND`, each one of
/// commit, rollback, a drop inside its transaction (never closed), a force-close from another
/// thread inside its transaction, or a cancellation of its context while it may be waiting. The
/// pool's in-use count never passes the bound, the committed rows are exactly the commits, nothing
/// is checked out or held at the end, and no session is left `idle in transaction`.
fn jobs_with_drops_and_cancellations_leave_nothing_open(subject: &dyn PgSubject) {
    let provider = subject.provider();
    let gate = provider.admission().clone();
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(provider.clone(), false);
    let most = AtomicU64::new(0);
    let committed = Mutex::new(Vec::new());
    let cancelled = AtomicU64::new(0);
    std::thread::scope(|s| {
        for row in 0..JOBS {
            let (monitor, plan, most, committed, cancelled) =
                (&monitor, &plan, &most, &committed, &cancelled);
            s.spawn(move || {
                let ctx = JobContext::new(format!("job {row}"));
                let admit = || monitor.admit_blocking(plan.demand(Demand::new()), &ctx, None);
                let grant = if row % 5 == 4 {
                    std::thread::scope(|c| {
                        let waiter = c.spawn(admit);
                        std::thread::yield_now();
                        ctx.cancel();
                        waiter.join().unwrap()
                    })
                } else {
                    admit()
                };
                let grant = match grant {
                    Ok(grant) => grant,
                    Err(AdmitError::Cancelled { .. }) => {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Err(e) => panic!("job {row}: {e}"),
                };
                let job = plan.open(grant).expect("opened");
                most.fetch_max(u64::from(subject.checked_out()), Ordering::AcqRel);
                job.with(0, |h| {
                    h.begin().unwrap();
                    subject.insert(h, i64::from(row)).unwrap();
                });
                most.fetch_max(u64::from(subject.checked_out()), Ordering::AcqRel);
                match row % 5 {
                    0 | 4 => {
                        job.commit_all().expect("commit");
                        committed.lock().push(i64::from(row));
                        job.close().expect("close");
                    }
                    1 => {
                        job.rollback_all().expect("rollback");
                        job.close().expect("close");
                    }
                    2 => drop(job),
                    _ => {
                        job.force_closer().force_close().expect("force close");
                        job.close().expect("close after force close");
                    }
                }
            });
        }
    });
    let most = most.into_inner();
    assert!(
        most <= BOUND,
        "{most} connections out under a bound of {BOUND}"
    );
    let mut expected = committed.into_inner();
    expected.sort_unstable();
    assert_eq!(subject.rows(), expected);
    assert_eq!(
        (subject.checked_out(), gate.in_use(), monitor.queue_size()),
        (0, 0, 0)
    );
    assert_eq!(subject.db().idle_in_transaction(), 0);
    eprintln!(
        "{JOBS} jobs: {} committed, {} cancelled before admission, at most {most} connections out",
        expected.len(),
        cancelled.into_inner()
    );
    monitor.stop();
}

/// A job inside its transaction runs a statement that would last a minute; a force-close from
/// another thread cancels it on the server, rolls back, gives the session back and releases the
/// permit, and leaves no session idle in transaction.
fn force_close_cancels_a_running_statement(
    subject: &dyn PgSubject,
    sleep: impl Fn(&mut dyn DbHandle) -> Result<(), DbError> + Sync,
) {
    let provider = subject.provider();
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(provider.clone(), false);
    let ctx = JobContext::new("runaway");
    let grant = monitor
        .admit_blocking(plan.demand(Demand::new()), &ctx, None)
        .unwrap();
    let job = plan.open(grant).unwrap();
    let closer = job.force_closer();
    let started = Instant::now();
    std::thread::scope(|s| {
        let runner = s.spawn(|| {
            job.with(0, |h| {
                h.begin()?;
                subject.insert(h, 1)?;
                sleep(h)
            })
        });
        subject.db().wait_until_running("pg_sleep(60)");
        closer.force_close().unwrap();
        let err = runner.join().unwrap().unwrap_err();
        assert!(matches!(err, DbError::Database { .. }), "{err}");
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the statement was not cancelled"
    );
    assert_eq!(provider.admission().in_use(), 0);
    job.close().unwrap();
    assert_eq!(subject.checked_out(), 0);
    assert_eq!(subject.rows(), Vec::<i64>::new());
    assert_eq!(subject.db().idle_in_transaction(), 0);
    monitor.stop();
}

/// On a pool of one session: an abort after `close` sends no cancel request to the session's next
/// user, and an aborted handle's request (sent from another thread) never cancels a statement of
/// the next job, which runs `sleep` (a few tenths of a second) to its end every time.
fn an_abort_never_reaches_the_next_job_on_the_session(
    db: &PgDb,
    provider: &dyn DbResourceProvider,
    sleep: impl Fn(&mut dyn DbHandle) -> Result<(), DbError> + Sync,
) {
    let mut first = provider.acquire(false).unwrap();
    let late = first.aborter();
    first.close().unwrap();
    let mut next = provider.acquire(false).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // While the next job's statement runs on the session.
            db.wait_until_running("pg_sleep(0.3)");
            late.abort();
        });
        sleep(next.as_mut()).expect("an abort after close cancelled the next job");
    });
    next.begin().unwrap();
    next.abort();
    next.close().unwrap();
    let mut third = provider.acquire(false).unwrap();
    for _ in 0..3 {
        sleep(third.as_mut()).expect("an aborted handle's cancel reached the next job");
    }
    third.close().unwrap();
}
