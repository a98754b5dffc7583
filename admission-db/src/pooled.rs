//! The engine of the r2d2 and deadpool providers: one pooled connection per permit, from acquire
//! to close, over any pool that implements [`PoolBackend`] (r2d2 over rusqlite with feature
//! `r2d2-sqlite`, r2d2 over the sync `postgres::Client` with `r2d2-postgres`, deadpool-postgres
//! with `deadpool-postgres`). The modules `r2d2_sqlite`, `r2d2_postgres` and `deadpool_postgres`
//! name its provider and handle for their pool ([`PooledProvider<SqliteManager>`] is
//! `R2d2SqliteProvider`, and so on) and show them at work.
//!
//! What every pool shares is here:
//! - the provider: its bound (a gate named `db:<name>`, given, never inferred from the pool), its
//!   checkout timeout (5 s unless set), and the checkout's failures told apart once: a connection
//!   the pool could not open is [`DbError::Connect`] with the driver's error as its source, a pool
//!   that gave none in time while full is a pool timeout (counted in the metrics), a closed pool
//!   refuses the acquire;
//! - the handle: the guard that refuses every verb but `rollback` and `close` on a closed or
//!   aborted handle, `begin` inside a transaction and `commit` outside one; the transaction
//!   verbs; the read-only state set at checkout and put back as the pool handed it out; an abort
//!   that reaches the running statement and never, once the handle closed, the next job on the
//!   connection; and the close that rolls back, restores the read-only state and gives the
//!   connection back, or gives it up (the pool drops it) where it could not be made clean.
//!
//! The handle's verbs are written once, as futures. An r2d2 pool's never wait (they do their
//! work when polled), so its provider's verbs run them to their end on the calling thread; a
//! deadpool provider's verbs are async, and its blocking [`DbHandle`] verbs run them on the
//! provider's runtime.
//!
//! [`PooledProvider<SqliteManager>`]: PooledProvider

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::Clock;
use parking_lot::Mutex;

use crate::metrics::{PoolMetrics, Stamp};
use crate::{Aborter, DbError, DbHandle, DbResourceProvider, ProviderId};

/// The checkout timeout unless one is set: under a permit the pool should have a connection at
/// once, so waiting longer means the bound exceeds what the pool reserves.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool the [`PooledProvider`] runs over: how it checks a connection out and gives it back,
/// and what differs between databases in a handle's transaction, read-only state and abort.
/// Implemented for `r2d2_sqlite::SqliteManager`, `r2d2_postgres::PgManager` and
/// deadpool-postgres's `Manager` only: its items live in a trait of this crate's own (sealed),
/// so that a user names a provider's pool in a type and nothing more.
pub trait PoolBackend: sealed::Backend {}

/// A pool's counts, as its provider reports them. Implemented for the pools of the
/// [`PoolBackend`]s only (sealed, as that trait is).
pub trait PoolStatus: sealed::Status {}

/// What only this crate implements and calls: the items of [`PoolBackend`] and [`PoolStatus`].
pub(crate) mod sealed {
    use std::error::Error as StdError;
    use std::fmt;
    use std::future::Future;
    use std::time::Duration;

    use crate::DbError;
    use crate::metrics::PoolState;

    use super::run_here;

    /// The items of [`PoolBackend`](super::PoolBackend).
    pub trait Backend: Sized + Send + Sync + 'static {
        /// The pool and driver, as [`DbError::Connect`] names them (`r2d2-sqlite`, ...).
        const BACKEND: &'static str;

        /// Whether an aborted handle's connection is given up rather than pooled (an abort may
        /// still be on its way to the server); it is then not put back to its read-only state.
        const GIVES_UP_ABORTED: bool;

        /// Whether a failed `COMMIT` counts the transaction ended; else the handle still counts it
        /// open, for `close` to roll back.
        const FAILED_COMMIT_ENDS_TRANSACTION: bool;

        /// Whether a dropped handle closes (rolls back and restores, blocking); else it never
        /// blocks, and gives up a connection that may be inside a transaction or read-only.
        const CLOSES_ON_DROP: bool;

        /// The pool.
        type Pool: super::PoolStatus + fmt::Debug + Send + Sync;

        /// A connection checked out of the pool (back to it when dropped).
        type Conn: Send;

        /// The driver's error.
        type Error: StdError + Send + Sync + 'static;

        /// What the provider keeps beside the pool: what it learned from its connections, or the
        /// runtime its blocking verbs run on.
        type Extra: fmt::Debug + Send + Sync;

        /// What an abort reaches on a live handle's connection.
        type Target: Send;

        /// A connection within `timeout`, or why none came.
        fn get<'a>(
            pool: &'a Self::Pool,
            extra: &'a Self::Extra,
            timeout: Duration,
        ) -> impl Future<Output = Result<Self::Conn, Failure>> + Send + 'a;

        /// Runs `fut` to its end, blocking the calling thread: by default on that thread, for a
        /// pool whose futures never wait.
        fn block_on<T>(extra: &Self::Extra, fut: impl Future<Output = T>) -> T {
            let _ = extra;
            run_here(fut)
        }

        /// The read-only state the pool handed `conn` out in.
        fn handed_read_only(
            conn: &mut Self::Conn,
        ) -> impl Future<Output = Result<bool, Self::Error>> + Send + '_;

        /// Sets the session's read-only state.
        fn set_read_only(
            conn: &mut Self::Conn,
            on: bool,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;

        /// Whether a transaction is open on `conn`, where the handle's own verbs counted one open
        /// as `counted` says (a backend whose connection knows answers for itself).
        fn in_transaction(conn: &Self::Conn, counted: bool) -> bool;

        /// Opens a transaction, on a handle acquired read-only or not.
        fn begin(
            conn: &mut Self::Conn,
            read_only: bool,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;

        /// Commits the open transaction.
        fn commit(
            conn: &mut Self::Conn,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;

        /// Rolls the open transaction back (once more where an abort's interruption landed on the
        /// first attempt).
        fn rollback(
            conn: &mut Self::Conn,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;

        /// What an abort of the handle holding `conn` reaches.
        fn target(extra: &Self::Extra, conn: &Self::Conn) -> Self::Target;

        /// Interrupts what runs on the connection; `first` for the handle's first abort. Never
        /// blocks.
        fn interrupt(target: &mut Self::Target, first: bool);

        /// Makes the connection ready for a rollback after an abort: what the returned future
        /// awaits (an interruption still on its way) is done when it ends.
        fn settle(target: &mut Self::Target) -> impl Future<Output = ()> + Send + 'static;

        /// Gives `conn` back to the pool, or up (the pool drops it) when `discard` says so.
        fn give_back(conn: Self::Conn, discard: bool);
    }

    /// The items of [`PoolStatus`](super::PoolStatus).
    pub trait Status {
        /// The pool's state, for the metrics.
        fn pool_state(&self) -> PoolState;

        /// The pool timeout of `provider`: no connection within `timeout`, the pool full; `message`
        /// the pool's words.
        fn timeout_error(&self, provider: &str, timeout: Duration, message: String) -> DbError;
    }

    /// Why a checkout gave no connection, as a [`PoolBackend`](super::PoolBackend) tells it; the provider makes it a
    /// [`DbError`](crate::DbError).
    #[derive(Debug)]
    pub enum Failure {
        /// The pool could not open a connection: [`DbError::Connect`](crate::DbError::Connect), this its source (the driver's
        /// error, or the pool's own where it kept no driver error).
        Connect(Box<dyn StdError + Send + Sync>),
        /// The pool, full, gave no connection within the checkout timeout: a pool timeout, counted
        /// in the metrics; the pool's words.
        Timeout(String),
        /// The pool refused the checkout (closed): [`DbError::Database`](crate::DbError::Database) of `acquire`.
        Refused(Box<dyn StdError + Send + Sync>),
    }
}

pub(crate) use sealed::Failure;
use sealed::Status as _;

/// What a provider shares with its handles, behind one `Arc`.
struct Shared<B: PoolBackend> {
    id: ProviderId,
    pool: B::Pool,
    metrics: PoolMetrics,
    extra: B::Extra,
}

/// A provider over a pool (`PooledProvider<SqliteManager>`, `PooledProvider<PgManager>`,
/// `PooledProvider<deadpool_postgres::Manager>`: the modules `r2d2_sqlite`, `r2d2_postgres` and
/// `deadpool_postgres` name them `R2d2SqliteProvider`, `R2d2PostgresProvider` and
/// `DeadpoolPostgresProvider`, and show them at work).
///
/// Its bound is given, never inferred from the pool: it must not exceed the connections the pool
/// reserves for jobs (the pool's maximum, less what the host keeps for itself).
pub struct PooledProvider<B: PoolBackend> {
    shared: Arc<Shared<B>>,
    gate: Arc<CountingGate>,
    checkout_timeout: Duration,
}

impl<B: PoolBackend> PooledProvider<B> {
    /// A provider named `name` letting `bound` jobs hold a connection of `pool` at once; its
    /// gate stamps on `clock` (the monitor's).
    ///
    /// # Errors
    ///
    /// [`DbError::Config`] for a bound of zero.
    pub(crate) fn build(
        name: impl Into<Arc<str>>,
        bound: u64,
        pool: B::Pool,
        clock: Arc<dyn Clock>,
        extra: B::Extra,
    ) -> Result<PooledProvider<B>, DbError> {
        let id = ProviderId::new(name);
        let gate = id.gate(bound, clock.clone())?;
        let metrics = PoolMetrics::new(id.name().into(), clock);
        Ok(PooledProvider {
            shared: Arc::new(Shared {
                id,
                pool,
                metrics,
                extra,
            }),
            gate,
            checkout_timeout: CHECKOUT_TIMEOUT,
        })
    }

    /// The same provider, waiting at most `timeout` for a pooled connection (5 s by default).
    pub fn with_checkout_timeout(mut self, timeout: Duration) -> PooledProvider<B> {
        self.checkout_timeout = timeout;
        self
    }

    /// The pool the handles come from.
    pub fn pool(&self) -> &B::Pool {
        &self.shared.pool
    }

    /// What the provider keeps beside its pool.
    #[cfg(all(test, feature = "r2d2-postgres"))]
    pub(crate) fn extra(&self) -> &B::Extra {
        &self.shared.extra
    }

    /// A handle in autocommit, set read-only if asked: the read-only state the pool handed out
    /// is read, and changed only when it differs (the handle's close puts it back).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing checked out: a connection already taken goes back in
    /// the state it was handed out, or is given up if its read-only switch was cut short.
    ///
    /// # Errors
    ///
    /// What [`failed`](PooledProvider::failed) makes of a checkout that gave no connection; a
    /// driver error reading or setting the read-only state.
    pub(crate) async fn checkout_verb(&self, read_only: bool) -> Result<PooledHandle<B>, DbError> {
        let shared = &self.shared;
        let started = shared.metrics.now();
        let mut conn = B::get(&shared.pool, &shared.extra, self.checkout_timeout)
            .await
            .map_err(|failure| self.failed(failure))?;
        shared
            .metrics
            .checked_out(started, || shared.pool.pool_state());
        let handed_out = shared.metrics.now();
        let fail = |e| DbError::database(shared.id.name(), "acquire", e);
        let handed_read_only = B::handed_read_only(&mut conn).await.map_err(fail)?;
        let target = B::target(&shared.extra, &conn);
        let mut handle = PooledHandle {
            shared: shared.clone(),
            conn: Some(conn),
            abort: Arc::new(Abort {
                aborted: AtomicBool::new(false),
                target: Mutex::new(Some(target)),
            }),
            read_only,
            handed_read_only,
            // Counted switched before the round trip: a switch cut short gives the connection up.
            switched: handed_read_only != read_only,
            counted: false,
            handed_out,
        };
        if handle.switched {
            let conn = handle.conn.as_mut().expect("a fresh handle");
            if let Err(e) = B::set_read_only(conn, read_only).await {
                handle.give_back();
                return Err(fail(e));
            }
        }
        Ok(handle)
    }

    /// What a checkout that gave no connection reports: [`DbError::Connect`] for a connection
    /// the pool could not open, the pool's timeout (counted in the metrics) when it was full,
    /// [`DbError::Database`] of `acquire` when it refused.
    pub(crate) fn failed(&self, failure: Failure) -> DbError {
        let shared = &self.shared;
        let name = shared.id.name();
        match failure {
            Failure::Connect(source) => DbError::connect(name, B::BACKEND, source),
            Failure::Timeout(message) => {
                shared.metrics.timed_out(|| shared.pool.pool_state());
                shared
                    .pool
                    .timeout_error(name, self.checkout_timeout, message)
            }
            Failure::Refused(source) => DbError::database(name, "acquire", source),
        }
    }
}

impl<B: PoolBackend> DbResourceProvider for PooledProvider<B> {
    fn id(&self) -> &ProviderId {
        &self.shared.id
    }

    fn admission(&self) -> &Arc<CountingGate> {
        &self.gate
    }

    /// The provider's `checkout`, run to its end on this thread (deadpool-postgres's with
    /// `block_on` on the provider's runtime: call it from a thread or `spawn_blocking`, never
    /// from inside a task).
    fn acquire(&self, read_only: bool) -> Result<Box<dyn DbHandle>, DbError> {
        let handle = B::block_on(&self.shared.extra, self.checkout_verb(read_only))?;
        Ok(Box::new(handle))
    }
}

impl<B: PoolBackend> fmt::Debug for PooledProvider<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledProvider")
            .field("backend", &B::BACKEND)
            .field("id", &self.shared.id)
            .field("bound", &self.gate.capacity())
            .field("pool", &self.shared.pool)
            .field("checkout_timeout", &self.checkout_timeout)
            .finish_non_exhaustive()
    }
}

/// A handle's abort state, shared with its [`Aborter`]s.
struct Abort<T> {
    /// Set by the first abort, from any thread: every verb but `rollback` and `close` is refused.
    aborted: AtomicBool,
    /// What an abort reaches; `None` once the handle closed, since the connection may then serve
    /// another job (an abort after close reaches nothing).
    target: Mutex<Option<T>>,
}

/// One pooled connection held under a permit (`PooledHandle<SqliteManager>`, ...: the modules
/// `r2d2_sqlite`, `r2d2_postgres` and `deadpool_postgres` name them `SqliteHandle`, `PgHandle`
/// and `DeadpoolHandle`).
///
/// [`await_completion`](DbHandle::await_completion) is a no-op: a commit is visible to other
/// connections once it returns, on SQLite and PostgreSQL alike. After an
/// [`abort`](DbHandle::abort) only `rollback` and `close` are accepted, and an abort after
/// `close` reaches nothing: the pooled connection may be serving another job.
pub struct PooledHandle<B: PoolBackend> {
    shared: Arc<Shared<B>>,
    /// `None` once closed: the connection went back to the pool, or was given up.
    conn: Option<B::Conn>,
    abort: Arc<Abort<B::Target>>,
    read_only: bool,
    /// The read-only state the pool handed out, restored by `close`.
    handed_read_only: bool,
    /// Whether the connection's read-only state may differ from the one handed out.
    switched: bool,
    /// A transaction counted open by the handle's own verbs, before their round trip.
    counted: bool,
    /// When the pool handed the connection out (the provider's clock), for `use_time`.
    handed_out: Stamp,
}

impl<B: PoolBackend> PooledHandle<B> {
    /// The connection, for the job's statements.
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    #[cfg_attr(
        not(any(feature = "r2d2-sqlite", feature = "deadpool-postgres")),
        allow(dead_code)
    )]
    pub(crate) fn live(&self, operation: &'static str) -> Result<&B::Conn, DbError> {
        self.guard(operation)?;
        Ok(self
            .conn
            .as_ref()
            .expect("a live handle holds its connection"))
    }

    /// [`live`](PooledHandle::live), mutable.
    #[cfg_attr(not(feature = "r2d2-postgres"), allow(dead_code))]
    pub(crate) fn live_mut(&mut self, operation: &'static str) -> Result<&mut B::Conn, DbError> {
        self.guard(operation)?;
        Ok(self
            .conn
            .as_mut()
            .expect("a live handle holds its connection"))
    }

    fn guard(&self, operation: &'static str) -> Result<(), DbError> {
        let provider = || self.shared.id.name().to_owned();
        if self.conn.is_none() {
            return Err(DbError::Closed {
                provider: provider(),
                operation,
            });
        }
        if self.aborted() {
            return Err(DbError::Aborted {
                provider: provider(),
                operation,
            });
        }
        Ok(())
    }

    fn aborted(&self) -> bool {
        self.abort.aborted.load(Ordering::Acquire)
    }

    fn refuse(&self, operation: &'static str, reason: &'static str) -> DbError {
        DbError::Transaction {
            provider: self.shared.id.name().to_owned(),
            operation,
            reason,
        }
    }

    /// [`DbHandle::begin`], as a future.
    ///
    /// # Cancel safety
    ///
    /// The transaction is counted open before `BEGIN` is sent: a begin cut short leaves it
    /// counted, for `close` to roll back (or a drop to give the connection up).
    pub(crate) async fn begin_verb(&mut self) -> Result<(), DbError> {
        self.guard("begin")?;
        if self.in_transaction() {
            return Err(self.refuse("begin", "a transaction is already open"));
        }
        self.counted = true;
        let read_only = self.read_only;
        let conn = self.conn.as_mut().expect("checked live");
        B::begin(conn, read_only)
            .await
            .map_err(|e| DbError::database(self.shared.id.name(), "begin", e))
    }

    /// [`DbHandle::commit`], as a future.
    pub(crate) async fn commit_verb(&mut self) -> Result<(), DbError> {
        self.guard("commit")?;
        if !self.in_transaction() {
            return Err(self.refuse("commit", "no transaction is open"));
        }
        let conn = self.conn.as_mut().expect("checked live");
        let result = B::commit(conn).await;
        if result.is_ok() || B::FAILED_COMMIT_ENDS_TRANSACTION {
            self.counted = false;
        }
        result.map_err(|e| DbError::database(self.shared.id.name(), "commit", e))
    }

    /// [`DbHandle::rollback`], as a future: nothing to do outside a transaction or on a closed
    /// handle; accepted after an abort, once the abort's interruption is settled.
    pub(crate) async fn rollback_verb(&mut self) -> Result<(), DbError> {
        if !self.in_transaction() {
            return Ok(());
        }
        if self.aborted() {
            self.settle(false).await;
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        B::rollback(conn)
            .await
            .map_err(|e| DbError::database(self.shared.id.name(), "rollback", e))?;
        self.counted = false;
        Ok(())
    }

    /// [`DbHandle::close`], as a future: settles an abort (no later one reaches the
    /// connection), rolls back, restores the read-only state the pool handed out, and gives the
    /// connection back; one still inside a transaction, not restored, or aborted where the
    /// backend says so is given up instead. Idempotent.
    ///
    /// # Cancel safety
    ///
    /// The connection stays in the handle until the end: a close cut short leaves it to the
    /// handle's drop.
    pub(crate) async fn close_verb(&mut self) -> Result<(), DbError> {
        if self.conn.is_none() {
            return Ok(());
        }
        self.settle(true).await;
        let mut first = None;
        if self.in_transaction() {
            let conn = self.conn.as_mut().expect("open");
            match B::rollback(conn).await {
                Ok(()) => self.counted = false,
                Err(e) => first = Some(DbError::database(self.shared.id.name(), "close", e)),
            }
        }
        if self.switched && !self.given_up() {
            let handed = self.handed_read_only;
            let conn = self.conn.as_mut().expect("open");
            match B::set_read_only(conn, handed).await {
                Ok(()) => self.switched = false,
                Err(e) => {
                    first.get_or_insert(DbError::database(self.shared.id.name(), "close", e));
                }
            }
        }
        self.give_back();
        first.map_or(Ok(()), Err)
    }

    /// Whether the connection is to be given up whatever else is put right: still inside a
    /// transaction, or aborted where the backend gives such connections up.
    fn given_up(&self) -> bool {
        self.in_transaction() || (B::GIVES_UP_ABORTED && self.aborted())
    }

    /// Waits for an abort's interruption to be settled, so that it never reaches the rollback
    /// (or, once closed, another job); with `close`, no later abort reaches the connection.
    async fn settle(&self, close: bool) {
        let pending = {
            let mut target = self.abort.target.lock();
            let pending = target.as_mut().map(B::settle);
            if close {
                *target = None;
            }
            pending
        };
        if let Some(pending) = pending {
            pending.await;
        }
    }

    /// Without a round trip: back to the pool when clean, else given up. No abort reaches the
    /// connection afterwards.
    pub(crate) fn give_back(&mut self) {
        *self.abort.target.lock() = None;
        let discard = self.switched || self.given_up();
        self.counted = false;
        let Some(conn) = self.conn.take() else {
            return;
        };
        B::give_back(conn, discard);
        let shared = &self.shared;
        shared
            .metrics
            .closed(self.handed_out, || shared.pool.pool_state());
    }

    /// Runs a verb's future to its end on the provider's terms.
    fn block<T>(&mut self, verb: impl AsyncFnOnce(&mut PooledHandle<B>) -> T) -> T {
        let shared = self.shared.clone();
        B::block_on(&shared.extra, verb(self))
    }
}

impl<B: PoolBackend> DbHandle for PooledHandle<B> {
    fn provider(&self) -> &ProviderId {
        &self.shared.id
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn begin(&mut self) -> Result<(), DbError> {
        self.block(async |h| h.begin_verb().await)
    }

    fn commit(&mut self) -> Result<(), DbError> {
        self.block(async |h| h.commit_verb().await)
    }

    /// A no-op: a commit is visible to other connections once it returns.
    fn await_completion(&mut self) -> Result<(), DbError> {
        Ok(())
    }

    fn rollback(&mut self) -> Result<(), DbError> {
        self.block(async |h| h.rollback_verb().await)
    }

    fn close(&mut self) -> Result<(), DbError> {
        if self.conn.is_none() {
            return Ok(());
        }
        self.block(async |h| h.close_verb().await)
    }

    fn aborter(&self) -> Aborter {
        let abort = self.abort.clone();
        Aborter::new(move || {
            if let Some(target) = abort.target.lock().as_mut() {
                let first = !abort.aborted.swap(true, Ordering::AcqRel);
                B::interrupt(target, first);
            }
        })
    }

    fn in_transaction(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|conn| B::in_transaction(conn, self.counted))
    }

    fn is_closed(&self) -> bool {
        self.conn.is_none()
    }
}

/// A drop closes the handle where the backend blocks; where it must not block (deadpool's, which
/// may drop inside a task), a connection that may be inside a transaction or read-only is given
/// up and any other goes back to the pool.
impl<B: PoolBackend> Drop for PooledHandle<B> {
    fn drop(&mut self) {
        if !B::CLOSES_ON_DROP {
            self.give_back();
        } else if let Err(e) = DbHandle::close(self) {
            tracing::warn!(error = %e, "closing a dropped {} handle failed", B::BACKEND);
        }
    }
}

impl<B: PoolBackend> fmt::Debug for PooledHandle<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledHandle")
            .field("backend", &B::BACKEND)
            .field("provider", &self.shared.id)
            .field("read_only", &self.read_only)
            .field("in_transaction", &self.in_transaction())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Runs `fut` to its end on this thread, parking it while the future waits. An r2d2 backend's
/// futures never wait (they do their work when polled), so one poll ends them.
pub(crate) fn run_here<T>(fut: impl Future<Output = T>) -> T {
    /// Wakes the thread that parked.
    struct Unpark(std::thread::Thread);

    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    thread_local! {
        static WAKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    }
    WAKER.with(|waker| {
        let mut cx = Context::from_waker(waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    })
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use super::run_here;

    /// A future that waits (waking itself) is polled again, not lost: `run_here` parks until the
    /// wake and then finishes it.
    #[test]
    fn run_here_runs_a_future_that_waits_to_its_end() {
        let mut waited = 0;
        let out = run_here(std::future::poll_fn(|cx| {
            if waited == 3 {
                return Poll::Ready(waited);
            }
            waited += 1;
            let waker = cx.waker().clone();
            std::thread::spawn(move || waker.wake());
            Poll::Pending
        }));
        assert_eq!(out, 3);
    }
}
