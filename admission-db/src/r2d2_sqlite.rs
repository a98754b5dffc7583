//! The r2d2 provider over rusqlite: one pooled SQLite connection per permit, from acquire to
//! close.
//!
//! The pool is built over [`SqliteManager`], which wraps `r2d2_sqlite`'s manager. Its connections
//! are [`SqliteConnection`]s: a rusqlite connection together with what the provider keeps about
//! it, so that a checkout asks SQLite nothing the pool's own checkout test has not already asked.
//! The manager treats a connection still inside a transaction as broken: r2d2 then drops it
//! instead of pooling it, so a connection never goes back to the pool mid-transaction, whatever
//! happened to its handle.
//!
//! A connection the pool cannot open (a database file that cannot be opened) is
//! [`DbError::Connect`]. r2d2 keeps only the text of its connection errors, so the provider then
//! opens one connection itself, with the pool's manager, and that attempt's `rusqlite::Error` is
//! the source.

use std::future::{Future, ready};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use admission_core::Clock;
use r2d2::{ManageConnection, Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;

use crate::DbError;
use crate::pooled::sealed::Backend;
use crate::pooled::{Failure, PooledHandle, PooledProvider, run_here};
use crate::r2d2_connect;
use abort::AbortTarget;

/// `r2d2_sqlite`'s manager, refusing to pool a connection left inside a transaction.
///
/// Each connection it opens gets, after the wrapped manager's init, a progress handler that a
/// handle's abort uses to stop a running statement (see [`SqliteHandle`]); a host must not
/// replace it on a pooled connection. Its checkout test ([`is_valid`](ManageConnection::is_valid),
/// run by r2d2 on every checkout unless the pool's `test_on_check_out` is off) runs one statement,
/// `PRAGMA query_only`, in place of `r2d2_sqlite`'s `SELECT 1`: it proves the connection usable
/// just as well, and tells the provider the read-only state the pool is handing out.
#[derive(Debug)]
pub struct SqliteManager(Arc<SqliteConnectionManager>);

impl SqliteManager {
    /// Wraps `manager` (`SqliteConnectionManager::file(..)`, with its init).
    pub fn new(manager: SqliteConnectionManager) -> SqliteManager {
        SqliteManager(Arc::new(manager))
    }
}

impl ManageConnection for SqliteManager {
    type Connection = SqliteConnection;
    type Error = rusqlite::Error;

    fn connect(&self) -> Result<SqliteConnection, rusqlite::Error> {
        let conn = self.0.connect()?;
        let query_only = read_query_only(&conn)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        conn.progress_handler(PROGRESS_OPS, Some(move || flag.load(Ordering::Acquire)))?;
        Ok(SqliteConnection {
            conn,
            query_only: Some(query_only),
            stop,
            opener: self.0.clone(),
        })
    }

    /// Reads `PRAGMA query_only`: the statement that proves the connection usable also records
    /// the read-only state the pool hands out.
    fn is_valid(&self, conn: &mut SqliteConnection) -> Result<(), rusqlite::Error> {
        conn.query_only = None;
        conn.query_only = Some(read_query_only(&conn.conn)?);
        Ok(())
    }

    /// A connection outside autocommit (inside a transaction) is discarded, never pooled. Called
    /// on every return: whoever held the connection may have changed its read-only state, so the
    /// recorded one is forgotten until the next checkout test reads it again.
    fn has_broken(&self, conn: &mut SqliteConnection) -> bool {
        conn.query_only = None;
        !conn.conn.is_autocommit() || self.0.has_broken(&mut conn.conn)
    }
}

/// A connection of a [`SqliteManager`] pool: a rusqlite [`Connection`] (it derefs to one) and
/// what the provider keeps about it.
///
/// A host may use it like any connection; it should set `query_only` only on connections it
/// checked out of the pool itself, never through a handle (whose `read_only` decides it).
pub struct SqliteConnection {
    conn: Connection,
    /// `PRAGMA query_only` as this crate last read or set it; `None` from the connection's return
    /// to the pool until the next checkout test reads it (a checkout without that test reads it
    /// then).
    query_only: Option<bool>,
    /// Read by the progress handler installed at connect: true stops the running statement. Set
    /// only by the abort of the handle holding the connection, and cleared before that handle's
    /// rollback and close.
    stop: Arc<AtomicBool>,
    /// The manager that opened it: how the provider opens one connection itself to learn why the
    /// pool could not.
    opener: Arc<SqliteConnectionManager>,
}

impl Deref for SqliteConnection {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl DerefMut for SqliteConnection {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

impl std::fmt::Debug for SqliteConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteConnection")
            .field("autocommit", &self.conn.is_autocommit())
            .field("query_only", &self.query_only)
            .finish_non_exhaustive()
    }
}

fn read_query_only(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row("PRAGMA query_only", [], |row| row.get(0))
}

/// How many virtual-machine steps run between two looks at a connection's stop flag.
const PROGRESS_OPS: i32 = 1_000;

fn set_query_only(conn: &Connection, on: bool) -> rusqlite::Result<()> {
    conn.execute_batch(if on {
        "PRAGMA query_only = ON"
    } else {
        "PRAGMA query_only = OFF"
    })
}

/// A provider over an r2d2 pool of rusqlite connections.
///
/// Its bound is given, never inferred from the pool: it must not exceed the connections the
/// pool reserves for jobs (the pool's maximum, less what the host keeps for itself). A write
/// handle's [`begin`](crate::DbHandle::begin) is `BEGIN IMMEDIATE` (the write lock at once, so a
/// busy timeout rather than a deadlock decides between writers); a read-only handle's is `BEGIN`,
/// on a connection set to `PRAGMA query_only`. The engine (checkout, handle, close) is
/// [`PooledProvider`]'s.
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
pub type R2d2SqliteProvider = PooledProvider<SqliteManager>;

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
        PooledProvider::build(name, bound, pool, clock, OnceLock::new())
    }

    /// Connections of the pool checked out now: its size less its idle connections.
    pub fn checked_out(&self) -> u32 {
        r2d2_connect::checked_out(self.pool())
    }

    /// [`acquire`](crate::DbResourceProvider::acquire), typed.
    ///
    /// The read-only state the pool hands out is the one its checkout test just read (or, with
    /// that test off, read here); the connection is set to `read_only` only when it differs.
    ///
    /// # Errors
    ///
    /// [`DbError::Checkout`] naming the pool's size and idle count (r2d2 does not count its
    /// waiters) when the pool timed out full; [`DbError::Connect`] when it could not open a
    /// connection (see the module's docs); a driver error reading or setting the read-only
    /// state.
    pub fn checkout(&self, read_only: bool) -> Result<SqliteHandle, DbError> {
        run_here(self.checkout_verb(read_only))
    }
}

/// One pooled rusqlite connection held under a permit.
///
/// [`await_completion`](crate::DbHandle::await_completion) is a no-op: a SQLite commit is
/// visible to other connections once it returns. [`abort`](crate::DbHandle::abort) sets the
/// connection's stop flag, which the progress handler its pool installed reads every thousand
/// virtual-machine steps, and interrupts the running statement (`sqlite3_interrupt`, safe from
/// any thread), so a statement running or about to run stops with `SQLITE_INTERRUPT`; only
/// `rollback` and `close` are accepted after it (both clear the stop flag first, so that their
/// `ROLLBACK` runs). An abort after `close` interrupts nothing: the pooled connection may be
/// running another job's statement.
pub type SqliteHandle = PooledHandle<SqliteManager>;

impl SqliteHandle {
    /// The connection, for the job's statements. The job must leave `PRAGMA query_only` alone:
    /// the handle's `read_only` sets it, and `close` puts back what the pool handed out.
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    pub fn connection(&self) -> Result<&Connection, DbError> {
        self.live("connection").map(|conn| &***conn)
    }
}

/// What a handle's abort reaches: public for the engine's trait to name, in a module no one else
/// reaches.
mod abort {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use rusqlite::InterruptHandle;

    /// The connection a live handle holds, as its abort reaches it.
    pub struct AbortTarget {
        pub(super) interrupt: InterruptHandle,
        /// The connection's stop flag, read by its progress handler.
        pub(super) stop: Arc<AtomicBool>,
    }
}

impl r2d2_connect::Opens for SqliteManager {
    type Opener = SqliteConnectionManager;

    fn opener(conn: &SqliteConnection) -> &Arc<SqliteConnectionManager> {
        &conn.opener
    }

    fn probe(opener: &SqliteConnectionManager) -> rusqlite::Result<()> {
        opener.connect().map(drop)
    }
}

/// The connection knows its transaction (a job may open one itself); its abort stops the running
/// statement at once, so an aborted connection goes back to the pool, its stop flag cleared. A
/// connection a close could not bring out of its transaction is discarded by the manager; one
/// whose read-only state could not be put back is pooled, its state read again at the next
/// checkout.
impl crate::pooled::PoolBackend for SqliteManager {}

impl Backend for SqliteManager {
    const BACKEND: &'static str = "r2d2-sqlite";
    const GIVES_UP_ABORTED: bool = false;
    /// Unused: the connection knows its transaction.
    const FAILED_COMMIT_ENDS_TRANSACTION: bool = false;
    const CLOSES_ON_DROP: bool = true;
    type Pool = Pool<SqliteManager>;
    type Conn = PooledConnection<SqliteManager>;
    type Error = rusqlite::Error;
    /// The pool's manager, learned from the first connection handed out.
    type Extra = OnceLock<Arc<SqliteConnectionManager>>;
    type Target = AbortTarget;

    fn get<'a>(
        pool: &'a Pool<SqliteManager>,
        opener: &'a Self::Extra,
        timeout: Duration,
    ) -> impl Future<Output = Result<Self::Conn, Failure>> + Send + 'a {
        ready(r2d2_connect::get(pool, opener, timeout))
    }

    fn handed_read_only(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = rusqlite::Result<bool>> + Send + '_ {
        let handed = match conn.query_only {
            Some(known) => Ok(known),
            None => read_query_only(conn),
        };
        if let Ok(handed) = handed {
            conn.query_only = Some(handed);
        }
        ready(handed)
    }

    fn set_read_only(
        conn: &mut Self::Conn,
        on: bool,
    ) -> impl Future<Output = rusqlite::Result<()>> + Send + '_ {
        conn.query_only = None;
        let set = set_query_only(conn, on);
        if set.is_ok() {
            conn.query_only = Some(on);
        }
        ready(set)
    }

    fn in_transaction(conn: &Self::Conn, _counted: bool) -> bool {
        !conn.is_autocommit()
    }

    fn begin(
        conn: &mut Self::Conn,
        read_only: bool,
    ) -> impl Future<Output = rusqlite::Result<()>> + Send + '_ {
        ready(conn.execute_batch(if read_only {
            "BEGIN"
        } else {
            "BEGIN IMMEDIATE"
        }))
    }

    fn commit(conn: &mut Self::Conn) -> impl Future<Output = rusqlite::Result<()>> + Send + '_ {
        ready(conn.execute_batch("COMMIT"))
    }

    fn rollback(conn: &mut Self::Conn) -> impl Future<Output = rusqlite::Result<()>> + Send + '_ {
        ready(conn.execute_batch("ROLLBACK"))
    }

    fn target(_: &Self::Extra, conn: &Self::Conn) -> AbortTarget {
        AbortTarget {
            interrupt: conn.get_interrupt_handle(),
            stop: conn.stop.clone(),
        }
    }

    fn interrupt(target: &mut AbortTarget, _first: bool) {
        target.stop.store(true, Ordering::Release);
        target.interrupt.interrupt();
    }

    /// Clears the stop flag, so that the progress handler lets the rollback run.
    fn settle(target: &mut AbortTarget) -> impl Future<Output = ()> + Send + 'static {
        target.stop.store(false, Ordering::Release);
        ready(())
    }

    /// Back to the pool; `SqliteManager::has_broken` discards it if still in a transaction.
    fn give_back(conn: Self::Conn, _discard: bool) {
        drop(conn);
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use admission_core::SystemClock;
    use rusqlite::ErrorCode;

    use super::*;
    use crate::DbHandle;
    use crate::error::testing::assert_says_each_thing_once;

    fn provider(path: &std::path::Path) -> R2d2SqliteProvider {
        let pool = Pool::builder()
            .max_size(1)
            .min_idle(Some(0))
            .build_unchecked(SqliteManager::new(SqliteConnectionManager::file(path)));
        R2d2SqliteProvider::new("lite", 1, pool, Arc::new(SystemClock::new()))
            .unwrap()
            .with_checkout_timeout(Duration::from_millis(500))
    }

    /// The database's directory removed under a provider in use: the pool cannot open a
    /// connection, which was a pool timeout with advice on the bound; now the connection
    /// variant, rusqlite's `SQLITE_CANTOPEN` its source.
    #[test]
    fn a_file_that_cannot_be_opened_is_connect_with_the_driver_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let provider = provider(&data.join("db.sqlite"));
        provider.checkout(false).unwrap().close().unwrap();
        // The pooled connection discarded (returned inside a transaction), the file gone.
        let raw = provider.pool().get().unwrap();
        raw.execute_batch("BEGIN").unwrap();
        drop(raw);
        assert_eq!(provider.pool().state().connections, 0);
        std::fs::remove_dir_all(&data).unwrap();

        let error = provider.checkout(false).unwrap_err();
        assert_eq!(
            error.to_string(),
            "db provider `lite`: r2d2-sqlite could not connect to the database"
        );
        assert!(
            matches!(
                &error,
                DbError::Connect {
                    backend: "r2d2-sqlite",
                    ..
                }
            ),
            "{error:?}"
        );
        let driver = error
            .source()
            .and_then(|s| s.downcast_ref::<rusqlite::Error>())
            .expect("the driver's error is the source");
        assert_eq!(driver.sqlite_error_code(), Some(ErrorCode::CannotOpen));
        assert_says_each_thing_once(&error);
    }

    /// A full pool is still a pool timeout: the bound exceeds what the pool reserves.
    #[test]
    fn a_full_pool_is_still_a_checkout_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let provider = provider(&dir.path().join("db.sqlite"));
        let held = provider.checkout(false).unwrap();
        let error = provider.checkout(false).unwrap_err();
        assert!(
            matches!(
                error,
                DbError::Checkout {
                    size: 1,
                    idle: 0,
                    max_size: 1,
                    ..
                }
            ),
            "{error:?}"
        );
        drop(held);
    }
}
