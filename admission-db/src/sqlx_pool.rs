//! The sqlx providers' shared engine: one pooled async connection per permit, from acquire to
//! close, over any database that implements [`SqlxDatabase`] (SQLite with feature
//! `sqlx-sqlite`, PostgreSQL with feature `sqlx-postgres`).
//!
//! The handle's verbs are async (`checkout`, `begin_async`, `commit_async`, `rollback_async`,
//! `close_async`); the [`DbResourceProvider`] and [`DbHandle`] verbs run those same futures to
//! completion on the provider's runtime ([`tokio::runtime::Handle::block_on`]), so a plain thread
//! (the contract suite's jobs, a [`JobDb`](crate::JobDb) driven from threads) uses the provider
//! like any other.
//!
//! A connection never goes back to the pool inside a transaction. Before a statement that changes
//! the transaction state is sent, the handle marks its state unknown and clears the mark only when
//! the statement's answer came back; a future dropped in between (a cancelled `begin_async`, a
//! timeout) leaves the mark, and a handle so marked, or still in a transaction its rollback could
//! not end, closes its connection instead of pooling it. That also covers sqlx 0.9.0 handing a
//! PostgreSQL session back mid-`BEGIN` when a begin is cancelled: the handle never gives such a
//! session to the pool.
//!
//! A connection the pool cannot open is [`DbError::Connect`] with the `sqlx::Error` as its
//! source. sqlx retries a refused connection, and a PostgreSQL server that is starting up or
//! shutting down (`57P03`), until its acquire timeout and then keeps only "timed out"; so when a
//! checkout times out while the pool had room to connect, the provider connects once more
//! itself (bounded by [`PROBE_TIMEOUT`]) and reports that attempt's error. A pool that timed out
//! full is [`DbError::Checkout`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::Clock;
use sqlx::pool::PoolConnection;
use sqlx::{ConnectOptions, Connection, Pool};
use tokio::runtime::Handle;

use crate::metrics::{PoolMetrics, PoolState, Stamp};
use crate::{Aborter, DbError, DbHandle, DbResourceProvider, ProviderId};

/// The checkout timeout unless one is set: under a permit the pool should have a connection at
/// once, so waiting longer means the bound exceeds what the pool reserves.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest the provider's own connection attempt after a checkout timeout may take (at most
/// the checkout timeout).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A database the sqlx providers run over: its transaction and read-only statements, and how a
/// handle's abort reaches a running statement. Implemented for SQLite and PostgreSQL only: its
/// items live in a trait of this crate's own (sealed).
pub trait SqlxDatabase: sqlx::Database + sealed::Database {}

/// What only this crate implements and calls: the items of [`SqlxDatabase`].
pub(crate) mod sealed {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// The items of [`SqlxDatabase`](super::SqlxDatabase).
    pub trait Database: sqlx::Database {
        /// The pool and driver, as [`DbError::Connect`](crate::DbError::Connect) names them (`sqlx-postgres`, `sqlx-sqlite`).
        const BACKEND: &'static str;

        /// The statement that opens a transaction on a write or a read-only handle.
        fn begin_sql(read_only: bool) -> &'static str;

        /// The statement that sets the session's read-only state.
        fn read_only_sql(on: bool) -> &'static str;

        /// Runs one statement.
        fn run<'c>(
            conn: &'c mut Self::Connection,
            sql: &'static str,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

        /// The session's read-only state now.
        fn read_only_now(
            conn: &mut Self::Connection,
        ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_;

        /// Fails when the open transaction can no longer commit (where a commit would quietly roll
        /// back, as PostgreSQL's does after a failed statement).
        fn can_commit(
            conn: &mut Self::Connection,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

        /// Makes `aborted` stop a running statement, where the driver can.
        fn arm(
            conn: &mut Self::Connection,
            aborted: Arc<AtomicBool>,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

        /// Undoes [`arm`](Database::arm); false when the connection could not be reached.
        fn disarm(conn: &mut Self::Connection) -> impl Future<Output = bool> + Send + '_;
    }
}

/// A provider over a sqlx pool (`SqlxProvider<Sqlite>`, `SqlxProvider<Postgres>`; the modules
/// `sqlx_sqlite` and `sqlx_postgres` name them and show them at work).
///
/// Its bound is given, never inferred from the pool: it must not exceed the connections the pool
/// reserves for jobs (the pool's maximum, less what the host keeps for itself).
///
/// The async methods run on any task; the blocking trait verbs run them on the runtime given to
/// [`new`](SqlxProvider::new) and refuse, with a typed error, to run on a thread inside a
/// tokio runtime (where blocking would stall or panic).
///
/// # Cancel safety
///
/// Dropping any of the async methods' futures leaves no connection in the pool inside a
/// transaction: a handle whose state-changing statement was cut off closes its connection (on
/// `close_async`, `close`, or drop) rather than giving it back.
pub struct SqlxProvider<DB: SqlxDatabase> {
    id: ProviderId,
    gate: Arc<CountingGate>,
    pool: Pool<DB>,
    runtime: Handle,
    checkout_timeout: Duration,
    metrics: PoolMetrics,
}

impl<DB: SqlxDatabase> SqlxProvider<DB> {
    /// A provider named `name` letting `bound` jobs hold a connection of `pool` at once; its gate
    /// stamps on `clock` (the monitor's), and its blocking verbs run on `runtime` (one with its
    /// time driver enabled).
    ///
    /// # Errors
    ///
    /// [`DbError::Config`] for a bound of zero.
    pub fn new(
        name: impl Into<Arc<str>>,
        bound: u64,
        pool: Pool<DB>,
        clock: Arc<dyn Clock>,
        runtime: Handle,
    ) -> Result<SqlxProvider<DB>, DbError> {
        let id = ProviderId::new(name);
        let gate = id.gate(bound, clock.clone())?;
        let metrics = PoolMetrics::new(id.name().into(), clock);
        Ok(SqlxProvider {
            id,
            gate,
            pool,
            runtime,
            checkout_timeout: CHECKOUT_TIMEOUT,
            metrics,
        })
    }

    /// The same provider, waiting at most `timeout` for a pooled connection (5 s by default).
    pub fn with_checkout_timeout(mut self, timeout: Duration) -> SqlxProvider<DB> {
        self.checkout_timeout = timeout;
        self
    }

    /// The pool the handles come from.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Connections of the pool in use now: its size less its idle connections.
    pub fn checked_out(&self) -> u32 {
        let idle = u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX);
        self.pool.size().saturating_sub(idle)
    }

    /// [`acquire`](DbResourceProvider::acquire), async and typed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future loses no connection for good: one checked out meanwhile goes back to
    /// the pool (or is closed) by sqlx.
    ///
    /// # Errors
    ///
    /// [`DbError::Checkout`] naming the pool's size and idle count (sqlx does not count its
    /// waiters) when the pool timed out full; [`DbError::Connect`] with the `sqlx::Error` when
    /// a connection could not be opened (see the module's docs for a timeout with room in the
    /// pool); [`DbError::Database`] for a closed pool or a driver error setting the read-only
    /// state.
    pub async fn checkout(&self, read_only: bool) -> Result<SqlxHandle<DB>, DbError> {
        let started = self.metrics.now();
        let acquired = tokio::time::timeout(self.checkout_timeout, self.pool.acquire()).await;
        let conn = match acquired {
            Ok(Ok(conn)) => conn,
            Ok(Err(sqlx::Error::PoolTimedOut)) => {
                return Err(self.timed_out(sqlx::Error::PoolTimedOut.to_string()).await);
            }
            Err(_) => return Err(self.timed_out("timed out".to_owned()).await),
            Ok(Err(e @ sqlx::Error::PoolClosed)) => {
                return Err(DbError::database(self.name(), "acquire", e));
            }
            Ok(Err(e)) => return Err(DbError::connect(self.name(), DB::BACKEND, e)),
        };
        self.metrics.checked_out(started, || pool_state(&self.pool));
        let mut handle = SqlxHandle {
            pool: self.pool.clone(),
            metrics: self.metrics.clone(),
            handed_out: self.metrics.now(),
            provider: self.id.clone(),
            runtime: self.runtime.clone(),
            conn: Some(conn),
            read_only,
            handed_read_only: false,
            state: State::Autocommit,
            aborted: Arc::new(AtomicBool::new(false)),
        };
        handle.prepare().await.inspect_err(|_| handle.discard())?;
        Ok(handle)
    }

    /// A checkout that timed out: a connection failure when the pool had room and a connection
    /// attempt of the provider's own fails, else [`DbError::Checkout`].
    async fn timed_out(&self, message: String) -> DbError {
        if self.pool.size() < self.pool.options().get_max_connections()
            && let Some(error) = self.probe().await
        {
            return DbError::connect(self.name(), DB::BACKEND, error);
        }
        self.metrics.timed_out(|| pool_state(&self.pool));
        self.checkout_error(message)
    }

    /// One connection attempt with the pool's options, bounded by [`PROBE_TIMEOUT`] (and the
    /// checkout timeout): its error, or `None` when it connected (the connection is closed) or
    /// did not answer in time.
    async fn probe(&self) -> Option<sqlx::Error> {
        let options = self.pool.connect_options();
        let bound = PROBE_TIMEOUT.min(self.checkout_timeout);
        match tokio::time::timeout(bound, options.connect()).await {
            Ok(Err(error)) => Some(error),
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                None
            }
            Err(_) => None,
        }
    }

    fn checkout_error(&self, message: String) -> DbError {
        DbError::Checkout {
            provider: self.name().to_owned(),
            size: self.pool.size(),
            idle: u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX),
            max_size: self.pool.options().get_max_connections(),
            timeout: self.checkout_timeout,
            message,
        }
    }
}

/// The pool's state for the metrics (sqlx does not count its waiters).
fn pool_state<DB: SqlxDatabase>(pool: &Pool<DB>) -> PoolState {
    let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX);
    PoolState {
        idle,
        used: pool.size().saturating_sub(idle),
        max: pool.options().get_max_connections(),
        pending: None,
    }
}

impl<DB: SqlxDatabase> DbResourceProvider for SqlxProvider<DB> {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn admission(&self) -> &Arc<CountingGate> {
        &self.gate
    }

    /// [`checkout`](SqlxProvider::checkout), run on the provider's runtime.
    fn acquire(&self, read_only: bool) -> Result<Box<dyn DbHandle>, DbError> {
        let handle = block(
            &self.runtime,
            self.name(),
            "acquire",
            self.checkout(read_only),
        )?;
        Ok(Box::new(handle))
    }
}

impl<DB: SqlxDatabase> std::fmt::Debug for SqlxProvider<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxProvider")
            .field("id", &self.id)
            .field("bound", &self.gate.capacity())
            .field("pool_size", &self.pool.size())
            .field("checkout_timeout", &self.checkout_timeout)
            .finish()
    }
}

/// Runs `fut` to completion on `runtime`, refusing on a thread inside a tokio runtime.
fn block<T>(
    runtime: &Handle,
    provider: &str,
    operation: &'static str,
    fut: impl Future<Output = Result<T, DbError>>,
) -> Result<T, DbError> {
    if Handle::try_current().is_ok() {
        return Err(DbError::database(
            provider,
            operation,
            "a blocking verb was called inside a tokio runtime: await the async method instead",
        ));
    }
    runtime.block_on(fut)
}

/// What the handle knows of its connection's transaction state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Autocommit,
    InTransaction,
    /// A statement that changes the state was sent and its answer never came back (its future
    /// was dropped): the connection is closed rather than pooled.
    Unknown,
}

/// One pooled sqlx connection held under a permit.
///
/// [`await_completion`](DbHandle::await_completion) is a no-op: a commit is visible to other
/// connections once it returns, on SQLite and PostgreSQL alike. [`abort`](DbHandle::abort) sets a
/// flag that refuses every later verb but `rollback` and `close`; on SQLite the connection's
/// progress handler also reads it every thousand virtual-machine steps, interrupting the running
/// statement (sqlx offers PostgreSQL no cancel request: a running statement there finishes).
///
/// The job's own statements run on [`connection`](SqlxHandle::connection); they must not
/// open or end transactions themselves (the handle's verbs do).
///
/// # Cancel safety
///
/// Every async verb may be cancelled: the handle then reports itself in a transaction and its
/// connection is closed, not pooled, when the handle closes or drops.
pub struct SqlxHandle<DB: SqlxDatabase> {
    provider: ProviderId,
    runtime: Handle,
    /// `None` once closed: the connection went back to the pool or was closed.
    conn: Option<PoolConnection<DB>>,
    read_only: bool,
    /// The read-only state the pool handed out, restored by `close`.
    handed_read_only: bool,
    state: State,
    /// Set by `abort`, from any thread (and read by SQLite's progress handler).
    aborted: Arc<AtomicBool>,
    /// The pool the connection came from, read for the metrics once it is back.
    pool: Pool<DB>,
    metrics: PoolMetrics,
    /// When the pool handed the connection out (the provider's clock), for `use_time`.
    handed_out: Stamp,
}

impl<DB: SqlxDatabase> SqlxHandle<DB> {
    /// The connection, for the job's statements (`sqlx::query(..).execute(handle.connection()?)`).
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    pub fn connection(&mut self) -> Result<&mut DB::Connection, DbError> {
        self.live("connection")
    }

    fn live(&mut self, operation: &'static str) -> Result<&mut DB::Connection, DbError> {
        let Some(conn) = self.conn.as_deref_mut() else {
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

    fn refuse(&self, operation: &'static str, reason: &'static str) -> DbError {
        DbError::Transaction {
            provider: self.provider.name().to_owned(),
            operation,
            reason,
        }
    }

    /// Reads the handed-out read-only state, sets the asked one, arms the abort check.
    async fn prepare(&mut self) -> Result<(), DbError> {
        let name = self.provider.name().to_owned();
        let fail = |e: sqlx::Error| DbError::database(&name, "acquire", e);
        let read_only = self.read_only;
        let conn = self.conn.as_deref_mut().expect("a fresh handle");
        let handed = DB::read_only_now(conn).await.map_err(fail)?;
        self.handed_read_only = handed;
        if handed != read_only {
            DB::run(conn, DB::read_only_sql(read_only))
                .await
                .map_err(fail)?;
        }
        DB::arm(conn, self.aborted.clone()).await.map_err(fail)
    }

    /// Runs `sql`, which moves the state to `to`; the state is unknown while it runs.
    async fn transition(
        &mut self,
        operation: &'static str,
        sql: &'static str,
        to: State,
    ) -> Result<(), DbError> {
        let from = self.state;
        self.state = State::Unknown;
        let name = self.provider.name().to_owned();
        let conn = self.conn.as_deref_mut().expect("checked live");
        match DB::run(conn, sql).await {
            Ok(()) => {
                self.state = to;
                Ok(())
            }
            Err(e) => {
                // The statement answered: a refused BEGIN opened nothing, a refused COMMIT or
                // ROLLBACK left the transaction open.
                self.state = from;
                Err(DbError::database(&name, operation, e))
            }
        }
    }

    /// [`DbHandle::begin`], async.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the handle in an unknown state, reported as in a transaction;
    /// its connection is then closed, never pooled.
    ///
    /// # Errors
    ///
    /// Inside a transaction (or an unknown state), on a closed or aborted handle, or a driver
    /// error.
    pub async fn begin_async(&mut self) -> Result<(), DbError> {
        self.live("begin")?;
        if self.state != State::Autocommit {
            return Err(self.refuse("begin", "a transaction is already open"));
        }
        let sql = DB::begin_sql(self.read_only);
        self.transition("begin", sql, State::InTransaction).await
    }

    /// [`DbHandle::commit`], async.
    ///
    /// # Cancel safety
    ///
    /// As [`begin_async`](SqlxHandle::begin_async).
    ///
    /// # Errors
    ///
    /// Outside a transaction, on a closed or aborted handle, on a transaction that can no longer
    /// commit (PostgreSQL's after a failed statement: the transaction stays open, to be rolled
    /// back), or a driver error.
    pub async fn commit_async(&mut self) -> Result<(), DbError> {
        self.live("commit")?;
        if self.state != State::InTransaction {
            return Err(self.refuse("commit", "no transaction is open"));
        }
        let name = self.provider.name().to_owned();
        let conn = self.conn.as_deref_mut().expect("checked live");
        // The state is unchanged whatever happens here: a refusal leaves the transaction open.
        DB::can_commit(conn)
            .await
            .map_err(|e| DbError::database(&name, "commit", e))?;
        self.transition("commit", "COMMIT", State::Autocommit).await
    }

    /// [`DbHandle::rollback`], async: nothing to do outside a transaction or on a closed handle.
    /// In an unknown state it does nothing either: the connection will be closed.
    ///
    /// # Cancel safety
    ///
    /// As [`begin_async`](SqlxHandle::begin_async).
    ///
    /// # Errors
    ///
    /// A driver error.
    pub async fn rollback_async(&mut self) -> Result<(), DbError> {
        if self.conn.is_none() || self.state != State::InTransaction {
            return Ok(());
        }
        if self.aborted.load(Ordering::Acquire) {
            self.disarm().await;
        }
        self.transition("rollback", "ROLLBACK", State::Autocommit)
            .await
    }

    /// Removes the abort check, so that a rollback after an abort runs and a pooled connection
    /// keeps no closure of a closed handle; false when the connection could not be reached.
    async fn disarm(&mut self) -> bool {
        match self.conn.as_deref_mut() {
            Some(conn) => DB::disarm(conn).await,
            None => true,
        }
    }

    /// [`DbHandle::close`], async: rolls back, restores the handed-out read-only state, gives
    /// the connection back to the pool, awaiting its return; a connection whose state is unknown,
    /// that stays in a transaction, or whose read-only state or abort check could not be put
    /// back is closed instead (awaited too). Idempotent.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the connection: sqlx closes it or returns it on a task.
    ///
    /// # Errors
    ///
    /// The first failure; the connection went back (or was closed) all the same.
    pub async fn close_async(&mut self) -> Result<(), DbError> {
        if self.conn.is_none() {
            return Ok(());
        }
        let name = self.provider.name().to_owned();
        let disarmed = self.disarm().await;
        let mut first = self.rollback_async().await.err();
        if self.state == State::Autocommit && self.read_only != self.handed_read_only {
            let conn = self.conn.as_deref_mut().expect("open");
            if let Err(e) = DB::run(conn, DB::read_only_sql(self.handed_read_only)).await {
                first.get_or_insert(DbError::database(&name, "close", e));
            }
        }
        let mut conn = self.conn.take().expect("open");
        if self.state == State::Autocommit && disarmed && first.is_none() {
            // Awaited, so the connection is idle again when this returns.
            conn.return_to_pool().await;
        } else if let Err(e) = conn.close().await {
            first.get_or_insert(DbError::database(&name, "close", e));
        }
        self.state = State::Autocommit;
        self.metrics
            .closed(self.handed_out, || pool_state(&self.pool));
        first.map_or(Ok(()), Err)
    }

    /// Gives the connection up without waiting: closed on a task unless it is clean (see
    /// below), else returned on a task. Needs a runtime context (the handle's is entered).
    fn discard(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        // Without awaiting, neither the rollback, the read-only state nor the abort check can be
        // put right: only a clean connection of an unaborted handle goes back.
        if self.state != State::Autocommit
            || self.read_only != self.handed_read_only
            || self.aborted.load(Ordering::Acquire)
        {
            conn.close_on_drop();
        }
        self.state = State::Autocommit;
        let _entered = self.runtime.enter();
        drop(conn);
        // The connection goes back (or is closed) on a task: the gauges may still count it used.
        self.metrics
            .closed(self.handed_out, || pool_state(&self.pool));
    }

    fn block<T>(
        &mut self,
        operation: &'static str,
        verb: impl AsyncFnOnce(&mut SqlxHandle<DB>) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let (runtime, name) = (self.runtime.clone(), self.provider.name().to_owned());
        block(&runtime, &name, operation, verb(self))
    }
}

impl<DB: SqlxDatabase> DbHandle for SqlxHandle<DB> {
    fn provider(&self) -> &ProviderId {
        &self.provider
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn begin(&mut self) -> Result<(), DbError> {
        self.block("begin", async |h| h.begin_async().await)
    }

    fn commit(&mut self) -> Result<(), DbError> {
        self.block("commit", async |h| h.commit_async().await)
    }

    /// A no-op: a SQLite commit is visible to other connections once it returns.
    fn await_completion(&mut self) -> Result<(), DbError> {
        Ok(())
    }

    fn rollback(&mut self) -> Result<(), DbError> {
        if self.conn.is_none() || self.state != State::InTransaction {
            return Ok(());
        }
        self.block("rollback", async |h| h.rollback_async().await)
    }

    /// [`close_async`](SqlxHandle::close_async), run on the provider's runtime; on a
    /// thread inside a tokio runtime it never blocks: the connection is closed (if its state is
    /// not autocommit) or returned on a task, and may be counted out a moment longer.
    fn close(&mut self) -> Result<(), DbError> {
        if self.conn.is_none() {
            return Ok(());
        }
        if Handle::try_current().is_ok() {
            self.discard();
            return Ok(());
        }
        self.block("close", async |h| h.close_async().await)
    }

    fn aborter(&self) -> Aborter {
        let aborted = self.aborted.clone();
        Aborter::new(move || aborted.store(true, Ordering::Release))
    }

    /// True inside a transaction, and in the unknown state a cancelled verb leaves.
    fn in_transaction(&self) -> bool {
        self.conn.is_some() && self.state != State::Autocommit
    }

    fn is_closed(&self) -> bool {
        self.conn.is_none()
    }
}

impl<DB: SqlxDatabase> Drop for SqlxHandle<DB> {
    fn drop(&mut self) {
        if let Err(e) = DbHandle::close(self) {
            let e: &(dyn std::error::Error + 'static) = &e;
            tracing::warn!(error = e, "closing a dropped sqlx handle failed");
        }
    }
}

impl<DB: SqlxDatabase> std::fmt::Debug for SqlxHandle<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxHandle")
            .field("provider", &self.provider)
            .field("read_only", &self.read_only)
            .field("state", &self.state)
            .field("closed", &self.is_closed())
            .finish()
    }
}
