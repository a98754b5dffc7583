//! The contract suite against a real SQLite WAL file behind a real r2d2 pool, larger than the
//! bound: the counting provider (its jobs check out of the host's pool themselves) and the r2d2
//! provider (its handles hold the pooled connection); then what only the r2d2 provider promises.

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use admission_core::{Clock, Demand, JobContext, Monitor, SystemClock};
use admission_db::contract::{DbSubject, TransactionalSubject};
use admission_db::r2d2_sqlite::{R2d2SqliteProvider, SqliteHandle, SqliteManager};
use admission_db::{CountingDbResourceProvider, DbError, DbHandle, DbPlan, DbResourceProvider};
use r2d2::{HandleEvent, Pool, event::ReleaseEvent};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;
use tempfile::TempDir;

use crate::contract_suite::{Fresh, contract_rules};

/// The bound the suite runs under, and the pool's size, larger.
const BOUND: u64 = 8;
const POOL: u32 = 12;

/// A fresh SQLite file in WAL mode with the jobs' table.
pub(crate) struct Db {
    _dir: TempDir,
    path: PathBuf,
}

impl Db {
    pub(crate) fn new() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let conn = Connection::open(&path).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        conn.execute_batch("CREATE TABLE jobs (id INTEGER PRIMARY KEY)")
            .unwrap();
        Db { _dir: dir, path }
    }

    /// A pool of `size` connections over the file, each with a busy timeout.
    pub(crate) fn pool(&self, size: u32) -> Pool<SqliteManager> {
        self.pool_with(size, Counter::default())
    }

    fn pool_with(&self, size: u32, releases: Counter) -> Pool<SqliteManager> {
        let manager = SqliteConnectionManager::file(&self.path)
            .with_init(|c| c.execute_batch("PRAGMA busy_timeout = 10000;"));
        Pool::builder()
            .max_size(size)
            .event_handler(Box::new(releases))
            .build(SqliteManager::new(manager))
            .unwrap()
    }

    /// The committed rows, read on a connection of its own.
    pub(crate) fn rows(&self) -> Vec<i64> {
        let conn = Connection::open(&self.path).unwrap();
        let mut stmt = conn.prepare("SELECT id FROM jobs ORDER BY id").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

/// Counts the connections the pool destroyed.
#[derive(Clone, Debug, Default)]
struct Counter(Arc<AtomicU32>);

impl HandleEvent for Counter {
    fn handle_release(&self, _: ReleaseEvent) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

pub(crate) fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

fn checked_out(pool: &Pool<SqliteManager>) -> u32 {
    let state = pool.state();
    state.connections - state.idle_connections
}

pub(crate) fn insert(conn: &Connection, row: i64) -> rusqlite::Result<usize> {
    conn.execute("INSERT INTO jobs (id) VALUES (?1)", [row])
}

/// The counting provider: a bound only; each job checks out of the host's pool itself.
struct Counting {
    db: Db,
    pool: Pool<SqliteManager>,
    provider: Arc<CountingDbResourceProvider>,
}

fn counting() -> Counting {
    let db = Db::new();
    let pool = db.pool(POOL);
    let provider = Arc::new(CountingDbResourceProvider::new("counting", BOUND, clock()).unwrap());
    Counting { db, pool, provider }
}

impl DbSubject for Counting {
    fn provider(&self) -> Arc<dyn DbResourceProvider> {
        self.provider.clone()
    }
    fn checked_out(&self) -> u32 {
        checked_out(&self.pool)
    }
    fn job(
        &self,
        handle: &mut dyn DbHandle,
        row: i64,
        commit: bool,
        while_connected: &mut dyn FnMut(),
    ) -> Result<(), DbError> {
        let fail = |e: rusqlite::Error| DbError::database("counting", "job", e);
        handle.begin()?;
        let conn = self.pool.get().unwrap();
        while_connected();
        conn.execute_batch("BEGIN IMMEDIATE").map_err(fail)?;
        insert(&conn, row).map_err(fail)?;
        conn.execute_batch(if commit { "COMMIT" } else { "ROLLBACK" })
            .map_err(fail)?;
        drop(conn);
        if commit {
            handle.commit()
        } else {
            handle.rollback()
        }
    }
    fn rows(&self) -> Vec<i64> {
        self.db.rows()
    }
}

/// The r2d2 provider: each handle holds its pooled connection.
struct R2d2 {
    db: Db,
    provider: Arc<R2d2SqliteProvider>,
}

fn r2d2() -> R2d2 {
    let db = Db::new();
    let provider = R2d2SqliteProvider::new("sqlite", BOUND, db.pool(POOL), clock()).unwrap();
    R2d2 {
        db,
        provider: Arc::new(provider),
    }
}

fn sqlite(handle: &mut dyn DbHandle) -> &mut SqliteHandle {
    (handle as &mut dyn Any)
        .downcast_mut::<SqliteHandle>()
        .expect("a SqliteHandle")
}

impl DbSubject for R2d2 {
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

impl TransactionalSubject for R2d2 {
    fn insert(&self, handle: &mut dyn DbHandle, row: i64) -> Result<(), DbError> {
        let conn = sqlite(handle).connection()?;
        insert(conn, row)
            .map(drop)
            .map_err(|e| DbError::database("sqlite", "insert", e))
    }
}

impl Fresh for Counting {
    fn fresh(_: &str) -> Counting {
        counting()
    }
}

impl Fresh for R2d2 {
    fn fresh(_: &str) -> R2d2 {
        r2d2()
    }
}

contract_rules!(counting_provider: Counting, bound only);
contract_rules!(r2d2_provider: R2d2, whole suite with 40);

#[test]
fn a_checkout_past_the_pool_names_its_size_and_idle_count() {
    let db = Db::new();
    let provider = R2d2SqliteProvider::new("small", 2, db.pool(1), clock())
        .unwrap()
        .with_checkout_timeout(Duration::from_millis(20));
    let held = provider.checkout(false).unwrap();
    let err = provider.checkout(false).unwrap_err();
    assert!(
        matches!(
            err,
            DbError::Checkout { ref provider, size: 1, idle: 0, max_size: 1, timeout, .. }
                if provider == "small" && timeout == Duration::from_millis(20)
        ),
        "{err}"
    );
    drop(held);
    assert_eq!(provider.checked_out(), 0);
}

#[test]
fn the_pool_discards_a_connection_left_inside_a_transaction() {
    let db = Db::new();
    let releases = Counter::default();
    let pool = db.pool_with(2, releases.clone());
    let conn = pool.get().unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    insert(&conn, 1).unwrap();
    drop(conn);
    assert_eq!(releases.0.load(Ordering::SeqCst), 1);
    let conn = pool.get().unwrap();
    assert!(conn.is_autocommit());
    drop(conn);
    assert_eq!(db.rows(), Vec::<i64>::new());
}

#[test]
fn a_dropped_handle_rolls_back_and_pools_its_connection() {
    let db = Db::new();
    let releases = Counter::default();
    let provider =
        R2d2SqliteProvider::new("sqlite", 1, db.pool_with(1, releases.clone()), clock()).unwrap();
    let mut handle = provider.checkout(false).unwrap();
    handle.begin().unwrap();
    insert(handle.connection().unwrap(), 1).unwrap();
    drop(handle);
    assert_eq!(
        (releases.0.load(Ordering::SeqCst), provider.checked_out()),
        (0, 0)
    );
    let handle = provider.checkout(false).unwrap();
    assert!(!handle.in_transaction());
    assert_eq!(db.rows(), Vec::<i64>::new());
}

#[test]
fn an_aborted_handle_refuses_every_verb_but_rollback_and_close() {
    let db = Db::new();
    let provider = R2d2SqliteProvider::new("sqlite", 1, db.pool(2), clock()).unwrap();
    let mut handle = provider.checkout(false).unwrap();
    handle.begin().unwrap();
    insert(handle.connection().unwrap(), 1).unwrap();
    let aborter = handle.aborter();
    std::thread::spawn(move || aborter.abort()).join().unwrap();
    let err = handle.commit().unwrap_err();
    assert_eq!(
        err.to_string(),
        "db provider `sqlite`: the handle was aborted, commit refused"
    );
    assert!(matches!(
        handle.begin(),
        Err(DbError::Aborted {
            operation: "begin",
            ..
        })
    ));
    handle.close().unwrap();
    assert_eq!((provider.checked_out(), db.rows()), (0, vec![]));
}

#[test]
fn begin_inside_a_transaction_and_commit_outside_one_are_refused() {
    let db = Db::new();
    let provider = R2d2SqliteProvider::new("sqlite", 1, db.pool(2), clock()).unwrap();
    let mut handle = provider.checkout(false).unwrap();
    let err = handle.commit().unwrap_err();
    assert_eq!(
        err.to_string(),
        "db provider `sqlite`: commit refused: no transaction is open"
    );
    handle.begin().unwrap();
    let err = handle.begin().unwrap_err();
    assert_eq!(
        err.to_string(),
        "db provider `sqlite`: begin refused: a transaction is already open"
    );
    handle.close().unwrap();
    let err = handle.begin().unwrap_err();
    assert_eq!(
        err.to_string(),
        "db provider `sqlite`: the handle is closed, begin refused"
    );
}

#[test]
fn force_close_interrupts_a_running_statement_and_gives_everything_back() {
    let db = Db::new();
    let monitor = Monitor::new();
    let provider = Arc::new(
        R2d2SqliteProvider::new("sqlite", 1, db.pool(2), monitor.clock().clone()).unwrap(),
    );
    let plan = DbPlan::new().with(provider.clone(), false);
    let ctx = JobContext::new("runaway");
    let grant = monitor
        .admit_blocking(plan.demand(Demand::new()), &ctx, None)
        .unwrap();
    let job = plan.open(grant).unwrap();
    let closer = job.force_closer();
    let (started, start) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let runner = s.spawn(|| {
            job.with_handle(0, |handle: &mut SqliteHandle| {
                let conn = handle.connection().unwrap();
                conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                started.send(()).unwrap();
                // Endless without an interrupt.
                conn.query_row(
                    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
                     SELECT count(*) FROM c",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .unwrap()
        });
        start.recv().unwrap();
        closer.force_close().unwrap();
        let err = runner.join().unwrap().unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::OperationInterrupted)
        );
    });
    assert_eq!(
        (provider.checked_out(), provider.admission().in_use()),
        (0, 0)
    );
    let conn = provider.pool().get().unwrap();
    assert!(conn.is_autocommit());
    drop(conn);
    job.close().unwrap();
    assert_eq!(provider.admission().in_use(), 0);
}

#[test]
fn close_restores_the_read_only_state_the_pool_handed_out() {
    let db = Db::new();
    restores_the_handed_out_read_only_state(&db, db.pool(1));
}

/// With r2d2's checkout test off, `SqliteManager::is_valid` never reads `query_only`: the
/// provider reads it itself, and a host's change to a pooled connection is still seen.
#[test]
fn without_the_checkout_test_close_still_restores_the_read_only_state_the_pool_handed_out() {
    let db = Db::new();
    let manager = SqliteConnectionManager::file(&db.path);
    let pool = Pool::builder()
        .max_size(1)
        .test_on_check_out(false)
        .build(SqliteManager::new(manager))
        .unwrap();
    restores_the_handed_out_read_only_state(&db, pool);
}

fn restores_the_handed_out_read_only_state(db: &Db, pool: Pool<SqliteManager>) {
    let provider = R2d2SqliteProvider::new("sqlite", 1, pool, clock()).unwrap();
    let query_only = |conn: &Connection| -> bool {
        conn.query_row("PRAGMA query_only", [], |r| r.get(0))
            .unwrap()
    };
    let mut reader = provider.checkout(true).unwrap();
    assert!(query_only(reader.connection().unwrap()));
    let err = insert(reader.connection().unwrap(), 1).unwrap_err();
    assert_eq!(err.sqlite_error_code(), Some(rusqlite::ErrorCode::ReadOnly));
    reader.close().unwrap();
    let conn = provider.pool().get().unwrap();
    assert!(!query_only(&conn));
    // A host changes the state on a connection it checked out itself.
    conn.execute_batch("PRAGMA query_only = ON").unwrap();
    drop(conn);
    // A connection handed out read-only goes back read-only after a writer used it.
    let mut writer = provider.checkout(false).unwrap();
    insert(writer.connection().unwrap(), 2).unwrap();
    writer.close().unwrap();
    assert!(query_only(&provider.pool().get().unwrap()));
    // And a reader of it leaves it as it found it.
    let mut reader = provider.checkout(true).unwrap();
    assert!(query_only(reader.connection().unwrap()));
    reader.close().unwrap();
    let conn = provider.pool().get().unwrap();
    assert!(query_only(&conn));
    conn.execute_batch("PRAGMA query_only = OFF").unwrap();
    drop(conn);
    let mut writer = provider.checkout(false).unwrap();
    insert(writer.connection().unwrap(), 3).unwrap();
    writer.close().unwrap();
    assert!(!query_only(&provider.pool().get().unwrap()));
    assert_eq!(db.rows(), [2, 3]);
}

/// The abort check stays installed on the pooled connection; an abort's stop flag is cleared by
/// the handle's rollback and close, so the next job on the connection runs long statements.
#[test]
fn after_an_abort_the_next_job_on_the_connection_runs_long_statements() {
    let db = Db::new();
    let provider = R2d2SqliteProvider::new("sqlite", 1, db.pool(1), clock()).unwrap();
    let count = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) \
                 SELECT count(*) FROM c";
    let mut first = provider.checkout(false).unwrap();
    first.begin().unwrap();
    insert(first.connection().unwrap(), 1).unwrap();
    first.aborter().abort();
    first.rollback().unwrap();
    first.close().unwrap();
    let mut next = provider.checkout(false).unwrap();
    let counted: i64 = next
        .connection()
        .unwrap()
        .query_row(count, [], |r| r.get(0))
        .unwrap();
    assert_eq!(counted, 100_000);
    next.begin().unwrap();
    insert(next.connection().unwrap(), 2).unwrap();
    next.commit().unwrap();
    next.close().unwrap();
    assert_eq!((provider.checked_out(), db.rows()), (0, vec![2]));
}

#[test]
fn a_handle_asked_as_another_type_or_index_is_refused_without_running() {
    let db = Db::new();
    let monitor = Monitor::new();
    let provider = Arc::new(
        R2d2SqliteProvider::new("sqlite", 1, db.pool(2), monitor.clock().clone()).unwrap(),
    );
    let plan = DbPlan::new().with(provider.clone(), true);
    let ctx = JobContext::new("typed");
    let job = plan
        .open(
            monitor
                .admit_blocking(plan.demand(Demand::new()), &ctx, None)
                .unwrap(),
        )
        .unwrap();
    let err = job
        .with_handle(0, |_: &mut admission_db::CountingDbHandle| ())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "db provider `sqlite`: the job's handle 0 is not a `admission_db::counting::CountingDbHandle`"
    );
    let err = job.with_handle(1, |_: &mut SqliteHandle| ()).unwrap_err();
    assert!(
        matches!(err, DbError::WrongHandle { index: 1, .. }),
        "{err}"
    );
    assert!(
        job.with_handle(0, |h: &mut SqliteHandle| h.read_only())
            .unwrap()
    );
}

#[test]
fn a_checkout_failing_while_materializing_gives_back_the_first_connection_and_the_permits() {
    let db = Db::new();
    let monitor = Monitor::new();
    // A bound of 2 over a pool of 1: the misconfiguration the bound's documentation warns of.
    let provider = Arc::new(
        R2d2SqliteProvider::new("sqlite", 2, db.pool(1), monitor.clock().clone())
            .unwrap()
            .with_checkout_timeout(Duration::from_millis(20)),
    );
    let plan = DbPlan::new()
        .with(provider.clone(), false)
        .with(provider.clone(), true);
    let ctx = JobContext::new("two handles");
    let grant = monitor
        .admit_blocking(plan.demand(Demand::new()), &ctx, None)
        .unwrap();
    assert_eq!(provider.admission().in_use(), 2);
    let errors = plan.open(grant).unwrap_err().into_vec();
    assert_eq!(errors.len(), 1);
    assert!(
        matches!(
            errors[0],
            DbError::Checkout {
                size: 1,
                idle: 0,
                max_size: 1,
                ..
            }
        ),
        "{}",
        errors[0]
    );
    assert_eq!(
        (provider.checked_out(), provider.admission().in_use()),
        (0, 0)
    );
}

#[test]
fn an_abort_after_close_never_interrupts_the_next_job_on_the_connection() {
    let db = Db::new();
    let provider = R2d2SqliteProvider::new("sqlite", 1, db.pool(1), clock()).unwrap();
    let mut first = provider.checkout(false).unwrap();
    let late = first.aborter();
    first.close().unwrap();
    let next = provider.checkout(false).unwrap();
    let conn = next.connection().unwrap();
    // `running(x)` tells the aborting thread, from inside the statement, that it runs: the late
    // abort lands mid-statement, with millions of rows still to go.
    let (running, is_running) = std::sync::mpsc::channel();
    let running = std::sync::Mutex::new(Some(running));
    conn.create_scalar_function(
        "running",
        1,
        rusqlite::functions::FunctionFlags::SQLITE_UTF8,
        move |ctx| {
            if let Some(tell) = running.lock().unwrap().take() {
                let _ = tell.send(());
            }
            ctx.get::<i64>(0)
        },
    )
    .unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            is_running.recv().unwrap();
            late.abort();
        });
        let counted: i64 = conn
            .query_row(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 3000000) \
                 SELECT count(CASE WHEN x = 1 THEN running(x) ELSE x END) FROM c",
                [],
                |r| r.get(0),
            )
            .expect("an abort after close interrupted the next job");
        assert_eq!(counted, 3_000_000);
    });
}
