//! The r2d2 provider over rusqlite: one pooled SQLite connection per permit, from acquire to
//! close.
//!
//! The pool is built over [`SqliteManager`], which wraps `r2d2_sqlite`'s manager and treats a
//! connection still inside a transaction as broken: r2d2 then drops it instead of pooling it, so a
//! connection never goes back to the pool mid-transaction, whatever happened to its handle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::Clock;
use parking_lot::Mutex;
use r2d2::{ManageConnection, Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, InterruptHandle};

use crate::metrics::{PoolMetrics, PoolState};
use crate::{Aborter, DbError, DbHandle, DbResourceProvider, ProviderId};

/// `r2d2_sqlite`'s manager, refusing to pool a connection left inside a transaction.
#[derive(Debug)]
pub struct SqliteManager(SqliteConnectionManager);

impl SqliteManager {
    /// Wraps `manager` (`SqliteConnectionManager::file(..)`, with its init).
    pub fn new(manager: SqliteConnectionManager) -> SqliteManager {
        SqliteManager(manager)
    }
}

impl ManageConnection for SqliteManager {
    type Connection = Connection;
    type Error = rusqlite::Error;

    fn connect(&self) -> Result<Connection, rusqlite::Error> {
        self.0.connect()
    }

    fn is_valid(&self, conn: &mut Connection) -> Result<(), rusqlite::Error> {
        self.0.is_valid(conn)
    }

    /// A connection outside autocommit (inside a transaction) is discarded, never pooled.
    fn has_broken(&self, conn: &mut Connection) -> bool {
        !conn.is_autocommit() || self.0.has_broken(conn)
    }
}

/// The checkout timeout unless one is set: under a permit the pool should have a connection at
/// once, so waiting longer means the bound exceeds what the pool reserves.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A provider over an r2d2 pool of rusqlite connections.
///
/// Its bound is given, never inferred from the pool: it must not exceed the connections the
/// pool reserves for jobs (the pool's maximum, less what the host keeps for itself). A write
/// handle's [`begin`](DbHandle::begin) is `BEGIN IMMEDIATE` (the write lock at once, so a busy
/// timeout rather than a deadlock decides between writers); a read-only handle's is `BEGIN`, on a
/// connection set to `PRAGMA query_only`.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_core::{Demand, JobContext, Monitor};
/// use admission_db::r2d2_sqlite::{R2d2SqliteProvider, SqliteHandle, SqliteManager};
/// use admission_db::{DbPlan, DbResourceProvider};
/// use r2d2_sqlite::SqliteConnectionManager;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("admission-db-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let manager = SqliteConnectionManager::file(dir.join("orders.db"))
///     .with_init(|c| c.execute_batch("PRAGMA busy_timeout = 5000;"));
/// let pool = r2d2::Pool::builder().max_size(4).build(SqliteManager::new(manager))?;
/// let monitor = Monitor::new();
/// let db = Arc::new(R2d2SqliteProvider::new("orders", 2, pool, monitor.clock().clone())?);
///
/// let plan = DbPlan::new().with(db.clone(), false);
/// let grant = monitor.admit_blocking(plan.demand(Demand::new()), &JobContext::new("job"), None)?;
/// let job = plan.open(grant)?;
/// job.begin_all()?;
/// job.with_handle(0, |db: &mut SqliteHandle| -> Result<(), Box<dyn std::error::Error>> {
///     db.connection()?.execute_batch("CREATE TABLE IF NOT EXISTS t (x)")?;
///     Ok(())
/// })??;
/// job.commit_all()?;
/// job.close()?;
/// assert_eq!(db.admission().in_use(), 0);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct R2d2SqliteProvider {
    id: ProviderId,
    gate: Arc<CountingGate>,
    pool: Pool<SqliteManager>,
    checkout_timeout: Duration,
    metrics: PoolMetrics,
}

impl R2d2SqliteProvider {
    /// A provider named `name` letting `bound` jobs hold a connection of `pool` at once; its
    /// gate stamps on `clock` (the monitor's).
    ///
    /// # Errors
    ///
    /// [`DbError::Config`] for a bound of zero.
    pub fn new(
        name: impl Into<Arc<str>>,
        bound: u64,
        pool: Pool<SqliteManager>,
        clock: Arc<dyn Clock>,
    ) -> Result<R2d2SqliteProvider, DbError> {
        let id = ProviderId::new(name);
        let gate = id.gate(bound, clock.clone())?;
        let metrics = PoolMetrics::new(id.name().into(), clock);
        Ok(R2d2SqliteProvider {
            id,
            gate,
            pool,
            checkout_timeout: CHECKOUT_TIMEOUT,
            metrics,
        })
    }

    /// The same provider, waiting at most `timeout` for a pooled connection (5 s by default).
    pub fn with_checkout_timeout(mut self, timeout: Duration) -> R2d2SqliteProvider {
        self.checkout_timeout = timeout;
        self
    }

    /// The pool the handles come from.
    pub fn pool(&self) -> &Pool<SqliteManager> {
        &self.pool
    }

    /// Connections of the pool checked out now: its size less its idle connections.
    pub fn checked_out(&self) -> u32 {
        let state = self.pool.state();
        state.connections.saturating_sub(state.idle_connections)
    }

    /// The pool's state for the metrics (r2d2 does not count its waiters).
    fn pool_state(&self) -> PoolState {
        pool_state(&self.pool)
    }

    /// [`acquire`](DbResourceProvider::acquire), typed.
    ///
    /// # Errors
    ///
    /// [`DbError::Checkout`] naming the pool's size and idle count (r2d2 does not count its
    /// waiters), or a driver error setting the read-only state.
    pub fn checkout(&self, read_only: bool) -> Result<SqliteHandle, DbError> {
        let started = self.metrics.now();
        let conn = self.pool.get_timeout(self.checkout_timeout).map_err(|e| {
            self.metrics.timed_out(self.pool_state());
            let state = self.pool.state();
            DbError::Checkout {
                provider: self.name().to_owned(),
                size: state.connections,
                idle: state.idle_connections,
                max_size: self.pool.max_size(),
                timeout: self.checkout_timeout,
                message: e.to_string(),
            }
        })?;
        self.metrics.checked_out(started, self.pool_state());
        let handed_out = self.metrics.now();
        let name = self.name();
        let handed_query_only: bool = conn
            .query_row("PRAGMA query_only", [], |row| row.get(0))
            .map_err(|e| DbError::database(name, "acquire", e))?;
        if handed_query_only != read_only {
            set_query_only(&conn, read_only).map_err(|e| DbError::database(name, "acquire", e))?;
        }
        let aborted = Arc::new(AtomicBool::new(false));
        let flag = aborted.clone();
        conn.progress_handler(PROGRESS_OPS, Some(move || flag.load(Ordering::Acquire)))
            .map_err(|e| DbError::database(name, "acquire", e))?;
        Ok(SqliteHandle {
            provider: self.id.clone(),
            interrupt: Arc::new(Mutex::new(Some(conn.get_interrupt_handle()))),
            conn: Some(conn),
            read_only,
            handed_query_only,
            aborted,
            pool: self.pool.clone(),
            metrics: self.metrics.clone(),
            handed_out,
        })
    }
}

fn pool_state(pool: &Pool<SqliteManager>) -> PoolState {
    let state = pool.state();
    PoolState {
        idle: state.idle_connections,
        used: state.connections.saturating_sub(state.idle_connections),
        max: pool.max_size(),
        pending: None,
    }
}

/// How many virtual-machine steps run between two looks at a handle's abort flag.
const PROGRESS_OPS: i32 = 1_000;

/// Removes the abort check, so that the rollback after an abort runs and a pooled connection
/// keeps no closure of a closed handle.
fn disarm(conn: &Connection) {
    let _ = conn.progress_handler(0, None::<fn() -> bool>);
}

fn set_query_only(conn: &Connection, on: bool) -> rusqlite::Result<()> {
    conn.execute_batch(if on {
        "PRAGMA query_only = ON"
    } else {
        "PRAGMA query_only = OFF"
    })
}

impl DbResourceProvider for R2d2SqliteProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn admission(&self) -> &Arc<CountingGate> {
        &self.gate
    }

    fn acquire(&self, read_only: bool) -> Result<Box<dyn DbHandle>, DbError> {
        Ok(Box::new(self.checkout(read_only)?))
    }
}

/// One pooled rusqlite connection held under a permit.
///
/// [`await_completion`](DbHandle::await_completion) is a no-op: a SQLite commit is visible to
/// other connections once it returns. [`abort`](DbHandle::abort) sets a flag that the connection's
/// progress handler reads every thousand virtual-machine steps and interrupts the running
/// statement (`sqlite3_interrupt`, safe from any thread), so a statement running or about to run
/// stops with `SQLITE_INTERRUPT`; only `rollback` and `close` are accepted after it. An abort after
/// `close` interrupts nothing: the pooled connection may be running another job's statement.
pub struct SqliteHandle {
    provider: ProviderId,
    /// `None` once closed: the connection went back to the pool (or was discarded).
    conn: Option<PooledConnection<SqliteManager>>,
    /// What `abort` interrupts; `None` once closed, since the connection may then serve
    /// another job (an abort after close interrupts nothing).
    interrupt: Arc<Mutex<Option<InterruptHandle>>>,
    read_only: bool,
    /// The `query_only` state the pool handed out, restored by `close`.
    handed_query_only: bool,
    /// Set by `abort`, from any thread.
    aborted: Arc<AtomicBool>,
    /// The pool the connection came from, read for the metrics once it is back.
    pool: Pool<SqliteManager>,
    metrics: PoolMetrics,
    /// When the pool handed the connection out (the provider's clock), for `use_time`.
    handed_out: admission_core::Instant,
}

impl SqliteHandle {
    /// The connection, for the job's statements.
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    pub fn connection(&self) -> Result<&Connection, DbError> {
        self.live("connection")
    }

    fn live(&self, operation: &'static str) -> Result<&Connection, DbError> {
        let Some(conn) = self.conn.as_deref() else {
            return Err(DbError::Closed {
                provider: self.provider.name().to_owned(),
                operation,
            });
        };
        if self.aborted.load(Ordering::Acquire) {
            return Err(DbError::Aborted {
                provider: self.provider.name().to_owned(),
                operation,
            });
        }
        Ok(conn)
    }

    fn run(&self, operation: &'static str, sql: &str) -> Result<(), DbError> {
        self.live(operation)?
            .execute_batch(sql)
            .map_err(|e| DbError::database(self.provider.name(), operation, e))
    }

    fn refuse(&self, operation: &'static str, reason: &'static str) -> DbError {
        DbError::Transaction {
            provider: self.provider.name().to_owned(),
            operation,
            reason,
        }
    }
}

impl DbHandle for SqliteHandle {
    fn provider(&self) -> &ProviderId {
        &self.provider
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn begin(&mut self) -> Result<(), DbError> {
        if !self.live("begin")?.is_autocommit() {
            return Err(self.refuse("begin", "a transaction is already open"));
        }
        self.run(
            "begin",
            if self.read_only {
                "BEGIN"
            } else {
                "BEGIN IMMEDIATE"
            },
        )
    }

    fn commit(&mut self) -> Result<(), DbError> {
        if self.live("commit")?.is_autocommit() {
            return Err(self.refuse("commit", "no transaction is open"));
        }
        self.run("commit", "COMMIT")
    }

    /// A no-op: a SQLite commit is visible to other connections once it returns.
    fn await_completion(&mut self) -> Result<(), DbError> {
        Ok(())
    }

    fn rollback(&mut self) -> Result<(), DbError> {
        match self.conn.as_deref() {
            Some(conn) if !conn.is_autocommit() => {
                if self.aborted.load(Ordering::Acquire) {
                    disarm(conn);
                }
                conn.execute_batch("ROLLBACK")
                    .map_err(|e| DbError::database(self.provider.name(), "rollback", e))
            }
            _ => Ok(()),
        }
    }

    fn close(&mut self) -> Result<(), DbError> {
        let Some(conn) = self.conn.take() else {
            return Ok(());
        };
        // From here on an abort interrupts nothing: the connection is about to serve others.
        self.interrupt.lock().take();
        let name = self.provider.name();
        let mut first = None;
        disarm(&conn);
        if !conn.is_autocommit()
            && let Err(e) = conn.execute_batch("ROLLBACK")
        {
            first = Some(DbError::database(name, "close", e));
        }
        if self.read_only != self.handed_query_only
            && let Err(e) = set_query_only(&conn, self.handed_query_only)
        {
            first.get_or_insert(DbError::database(name, "close", e));
        }
        // Back to the pool; `SqliteManager::has_broken` discards it if still in a transaction.
        drop(conn);
        self.metrics.closed(self.handed_out, pool_state(&self.pool));
        first.map_or(Ok(()), Err)
    }

    fn aborter(&self) -> Aborter {
        let (aborted, interrupt) = (self.aborted.clone(), self.interrupt.clone());
        Aborter::new(move || {
            if let Some(interrupt) = interrupt.lock().as_ref() {
                aborted.store(true, Ordering::Release);
                interrupt.interrupt();
            }
        })
    }

    fn in_transaction(&self) -> bool {
        self.conn.as_deref().is_some_and(|c| !c.is_autocommit())
    }

    fn is_closed(&self) -> bool {
        self.conn.is_none()
    }
}

impl Drop for SqliteHandle {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing a dropped SQLite handle failed");
        }
    }
}

impl std::fmt::Debug for SqliteHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteHandle")
            .field("provider", &self.provider)
            .field("read_only", &self.read_only)
            .field("in_transaction", &self.in_transaction())
            .field("closed", &self.is_closed())
            .finish()
    }
}
