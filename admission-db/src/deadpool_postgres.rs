//! The deadpool-postgres provider: one pooled `tokio_postgres` session per permit, async, from
//! acquire to close.
//!
//! deadpool waits for a connection forever unless told otherwise, and its recycling never rolls
//! back an open transaction. So the provider bounds every checkout with its own timeout (a
//! [`DbError::PoolTimeout`] naming the pool's size, available and waiting counts), and a handle
//! that is dropped (or closed) while a transaction may be open, a `begin` cancelled mid-flight
//! included, detaches its session from the pool ([`Object::take`]) instead of handing it back:
//! the session is closed and the server rolls back.
//!
//! A session the pool cannot open (the server down or restarting, `57P03` while it shuts down)
//! is [`DbError::Connect`], its source the `tokio_postgres::Error` itself (not deadpool's
//! wrapper, whose message would repeat it), so its [`code`](tokio_postgres::Error::code) gives
//! the SQLSTATE.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::Clock;
use deadpool_postgres::{Object, Pool, PoolError};
use parking_lot::Mutex;
use tokio::runtime::Handle as Runtime;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use crate::metrics::{PoolMetrics, PoolState};
use crate::{Aborter, DbError, DbHandle, DbResourceProvider, ProviderId};

/// The pool and driver, as [`DbError::Connect`] names them.
const BACKEND: &str = "deadpool-postgres";

/// The checkout timeout unless one is set: under a permit the pool should have a session at
/// once, so waiting longer means the bound exceeds what the pool reserves.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A provider over a deadpool-postgres pool.
///
/// Its bound is given, never inferred from the pool: it must not exceed the sessions the pool
/// reserves for jobs. The pool hands out sessions writable (`default_transaction_read_only` off);
/// a read-only handle turns it on and its close turns it off again (a read-only handle dropped
/// unclosed detaches its session).
///
/// The async face is [`checkout`](DeadpoolPostgresProvider::checkout) and the handle's
/// `*_async` verbs. The sync [`DbResourceProvider`] / [`DbHandle`] face runs them on the runtime
/// given to [`new`](DeadpoolPostgresProvider::new) with `block_on`: call it from a thread or
/// from `spawn_blocking`, never from inside a task (tokio panics there).
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use admission_core::{Demand, JobContext, Monitor};
/// use admission_db::deadpool_postgres::DeadpoolPostgresProvider;
/// use admission_db::DbPlan;
/// use deadpool_postgres::{Manager, Pool, Runtime};
///
/// # async fn job() -> Result<(), Box<dyn std::error::Error>> {
/// let config: tokio_postgres::Config = "postgres://postgres@127.0.0.1/shop".parse()?;
/// let manager = Manager::new(config, tokio_postgres::NoTls);
/// let pool = Pool::builder(manager).max_size(16).runtime(Runtime::Tokio1).build()?;
/// let monitor = Monitor::new();
/// let runtime = tokio::runtime::Handle::current();
/// // 12 of the pool's 16 sessions are the jobs'; the host keeps the rest for itself.
/// let db = Arc::new(DeadpoolPostgresProvider::new("shop", 12, pool, monitor.clock().clone(), runtime)?);
///
/// let demand = DbPlan::new().with(db.clone(), false).demand(Demand::new());
/// let grant = monitor.admit(demand, &JobContext::new("job"), None).await?;
/// let mut handle = db.checkout(false).await?; // under the grant's permit: never waits for one
/// handle.begin_async().await?;
/// handle.client()?.execute("INSERT INTO orders (id) VALUES ($1)", &[&42_i64]).await?;
/// handle.commit_async().await?;
/// handle.close_async().await?; // the session goes back to the pool first,
/// drop(grant);                 // then the permit to the gate
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct DeadpoolPostgresProvider {
    id: ProviderId,
    gate: Arc<CountingGate>,
    pool: Pool,
    runtime: Runtime,
    checkout_timeout: Duration,
    metrics: PoolMetrics,
}

impl DeadpoolPostgresProvider {
    /// A provider named `name` letting `bound` jobs hold a session of `pool` at once; its gate
    /// stamps on `clock` (the monitor's); the sync face blocks on `runtime`, which also runs the
    /// cancel requests of [`abort`](DbHandle::abort).
    ///
    /// # Errors
    ///
    /// [`DbError::Config`] for a bound of zero.
    pub fn new(
        name: impl Into<Arc<str>>,
        bound: u64,
        pool: Pool,
        clock: Arc<dyn Clock>,
        runtime: Runtime,
    ) -> Result<DeadpoolPostgresProvider, DbError> {
        let id = ProviderId::new(name);
        let gate = id.gate(bound, clock.clone())?;
        let metrics = PoolMetrics::new(id.name().into(), clock);
        Ok(DeadpoolPostgresProvider {
            id,
            gate,
            pool,
            runtime,
            checkout_timeout: CHECKOUT_TIMEOUT,
            metrics,
        })
    }

    /// The same provider, waiting at most `timeout` for a pooled session (5 s by default).
    pub fn with_checkout_timeout(mut self, timeout: Duration) -> DeadpoolPostgresProvider {
        self.checkout_timeout = timeout;
        self
    }

    /// The pool the handles come from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Sessions of the pool checked out now: its size less its available sessions.
    pub fn checked_out(&self) -> usize {
        let status = self.pool.status();
        status.size.saturating_sub(status.available)
    }

    /// [`acquire`](DbResourceProvider::acquire), async and typed.
    ///
    /// # Cancel safety
    ///
    /// Cancelling it before it returns leaves nothing checked out: a session already taken goes
    /// back in the state it was handed out, or is detached if the read-only switch was cut short.
    ///
    /// # Errors
    ///
    /// [`DbError::PoolTimeout`] when no session comes within the checkout timeout;
    /// [`DbError::Connect`] when the pool cannot open one (the driver's error, or deadpool's
    /// create timeout, as its source); [`DbError::Database`] for a closed pool or a driver
    /// error setting the read-only state.
    pub async fn checkout(&self, read_only: bool) -> Result<DeadpoolHandle, DbError> {
        let name = self.name();
        let started = self.metrics.now();
        let obj = match tokio::time::timeout(self.checkout_timeout, self.pool.get()).await {
            Ok(Ok(obj)) => obj,
            Ok(Err(e)) => return Err(self.pool_error(e)),
            Err(_) => return Err(self.pool_timeout("timed out".to_owned())),
        };
        self.metrics.checked_out(started, || pool_state(&self.pool));
        let token = obj.cancel_token();
        let aborted = Arc::new(AtomicBool::new(false));
        let cancel = Arc::new(Mutex::new(Cancel::default()));
        let (flag, state) = (aborted.clone(), cancel.clone());
        let runtime = self.runtime.clone();
        let abort = Aborter::new(move || {
            let mut state = state.lock();
            // Once closed, the session may serve another job: never cancel it.
            if state.closed || flag.swap(true, Ordering::AcqRel) {
                return;
            }
            let token = token.clone();
            state.request = Some(runtime.spawn(async move {
                if let Err(e) = token.cancel_query(NoTls).await {
                    tracing::warn!(error = %e, "cancelling an aborted PostgreSQL handle failed");
                }
            }));
        });
        let handle = DeadpoolHandle {
            provider: self.id.clone(),
            obj: Some(obj),
            runtime: self.runtime.clone(),
            read_only,
            // Counted switched before the round trip: a cancelled switch detaches on drop.
            switched: read_only,
            in_transaction: false,
            aborted,
            cancel,
            abort,
            pool: self.pool.clone(),
            metrics: self.metrics.clone(),
            handed_out: self.metrics.now(),
        };
        if read_only {
            handle
                .execute("acquire", "SET SESSION default_transaction_read_only = on")
                .await
                .map_err(|e| DbError::database(name, "acquire", e))?;
        }
        Ok(handle)
    }

    /// What deadpool's refusal means: a wait for a slot is a pool timeout; a session it could
    /// not create (the driver's error, a create timeout, a failed `post_create` hook) a
    /// connection failure; a closed pool a refusal of `acquire`.
    fn pool_error(&self, error: PoolError) -> DbError {
        use deadpool_postgres::{HookError, TimeoutType};
        let name = self.name();
        match error {
            PoolError::Timeout(TimeoutType::Wait) => self.pool_timeout(error.to_string()),
            PoolError::Backend(driver) | PoolError::PostCreateHook(HookError::Backend(driver)) => {
                DbError::connect(name, BACKEND, driver)
            }
            PoolError::Timeout(_) | PoolError::PostCreateHook(_) => {
                DbError::connect(name, BACKEND, error)
            }
            PoolError::Closed | PoolError::NoRuntimeSpecified => {
                DbError::database(name, "acquire", error)
            }
        }
    }

    /// No slot within the checkout timeout: the pool's counts and its words.
    fn pool_timeout(&self, message: String) -> DbError {
        self.metrics.timed_out(|| pool_state(&self.pool));
        let status = self.pool.status();
        DbError::PoolTimeout {
            provider: self.name().to_owned(),
            size: status.size,
            available: status.available,
            waiting: status.waiting,
            max_size: status.max_size,
            timeout: self.checkout_timeout,
            message,
        }
    }
}

/// The pool's state for the metrics, its waiters included.
fn pool_state(pool: &Pool) -> PoolState {
    let status = pool.status();
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    PoolState {
        idle: count(status.available),
        used: count(status.size.saturating_sub(status.available)),
        max: count(status.max_size),
        pending: Some(count(status.waiting)),
    }
}

impl DbResourceProvider for DeadpoolPostgresProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn admission(&self) -> &Arc<CountingGate> {
        &self.gate
    }

    /// [`checkout`](DeadpoolPostgresProvider::checkout) run with `block_on`: call it from a thread
    /// or `spawn_blocking`, never from inside a task.
    fn acquire(&self, read_only: bool) -> Result<Box<dyn DbHandle>, DbError> {
        Ok(Box::new(self.runtime.block_on(self.checkout(read_only))?))
    }
}

/// One pooled deadpool-postgres session held under a permit.
///
/// The handle knows its transaction from its own verbs: open transactions with `begin`, not
/// with a `BEGIN` of the job's own. `await_completion` is a no-op: a PostgreSQL commit is visible
/// to other sessions once it returns. `abort` sets a flag and spawns the server's cancel request on
/// the provider's runtime; only `rollback` and `close` are accepted after it. `rollback` and
/// `close` first wait for that request to reach the server, and an aborted session is detached
/// rather than pooled, so a cancel meant for this handle never reaches another job; an abort after
/// `close` (or drop) sends nothing.
///
/// # Cancel safety
///
/// A cancelled `begin_async` (or any verb cut short inside a transaction) leaves the handle
/// counted inside a transaction; its close rolls back, and a drop detaches the session.
pub struct DeadpoolHandle {
    provider: ProviderId,
    /// `None` once closed: the session went back to the pool, or was detached.
    obj: Option<Object>,
    runtime: Runtime,
    read_only: bool,
    /// Whether `default_transaction_read_only` may be on (the pool hands sessions out with it off).
    switched: bool,
    /// Set before `BEGIN` is sent, so a cancelled begin counts as open.
    in_transaction: bool,
    aborted: Arc<AtomicBool>,
    /// Shared with the aborter: the cancel request in flight, and whether the handle closed.
    cancel: Arc<Mutex<Cancel>>,
    abort: Aborter,
    /// The pool the session came from, read for the metrics once it is back.
    pool: Pool,
    metrics: PoolMetrics,
    /// When the pool handed the session out (the provider's clock), for `use_time`.
    handed_out: crate::metrics::Stamp,
}

/// An abort's cancel request, and whether the handle closed (after which abort sends none).
#[derive(Debug, Default)]
struct Cancel {
    closed: bool,
    /// The task sending the request, awaited before the session is rolled back or given up.
    request: Option<tokio::task::JoinHandle<()>>,
}

impl DeadpoolHandle {
    /// The client, for the job's statements.
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    pub fn client(&self) -> Result<&deadpool_postgres::Client, DbError> {
        self.live("client")
    }

    fn live(&self, operation: &'static str) -> Result<&Object, DbError> {
        let Some(obj) = self.obj.as_ref() else {
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
        Ok(obj)
    }

    async fn execute(&self, operation: &'static str, sql: &str) -> Result<(), DbError> {
        self.live(operation)?
            .batch_execute(sql)
            .await
            .map_err(|e| DbError::database(self.provider.name(), operation, e))
    }

    /// Waits for an abort's cancel request to reach the server (it then finds the session idle
    /// and is ignored), so that it never cancels the rollback; with `close`, no later abort sends
    /// one.
    async fn settle_cancel(&self, close: bool) {
        let request = {
            let mut state = self.cancel.lock();
            state.closed |= close;
            state.request.take()
        };
        if let Some(request) = request {
            let _ = request.await;
        }
    }

    fn refuse(&self, operation: &'static str, reason: &'static str) -> DbError {
        DbError::Transaction {
            provider: self.provider.name().to_owned(),
            operation,
            reason,
        }
    }

    /// Opens a transaction ([`DbHandle::begin`]).
    ///
    /// # Errors
    ///
    /// Inside a transaction, on a closed or aborted handle, or a driver error.
    pub async fn begin_async(&mut self) -> Result<(), DbError> {
        self.live("begin")?;
        if self.in_transaction {
            return Err(self.refuse("begin", "a transaction is already open"));
        }
        self.in_transaction = true;
        self.execute("begin", "BEGIN").await
    }

    /// Commits the open transaction ([`DbHandle::commit`]).
    ///
    /// # Errors
    ///
    /// Outside a transaction, on a closed or aborted handle, or a driver error.
    pub async fn commit_async(&mut self) -> Result<(), DbError> {
        self.live("commit")?;
        if !self.in_transaction {
            return Err(self.refuse("commit", "no transaction is open"));
        }
        self.execute("commit", "COMMIT").await?;
        self.in_transaction = false;
        Ok(())
    }

    /// Rolls back the open transaction ([`DbHandle::rollback`]); accepted after an abort.
    ///
    /// # Errors
    ///
    /// A driver error.
    pub async fn rollback_async(&mut self) -> Result<(), DbError> {
        if self.obj.is_none() || !self.in_transaction {
            return Ok(());
        }
        self.settle_cancel(false).await;
        let Some(obj) = self.obj.as_ref() else {
            return Ok(());
        };
        roll_back(obj)
            .await
            .map_err(|e| DbError::database(self.provider.name(), "rollback", e))?;
        self.in_transaction = false;
        Ok(())
    }

    /// Rolls back, turns the read-only state off again and gives the session back; a session it
    /// cannot bring back to autocommit and writable is detached from the pool
    /// ([`DbHandle::close`]).
    ///
    /// # Errors
    ///
    /// The first failure; the session went back or was detached all the same.
    pub async fn close_async(&mut self) -> Result<(), DbError> {
        if self.obj.is_none() {
            return Ok(());
        }
        self.settle_cancel(true).await;
        let Some(obj) = self.obj.as_ref() else {
            return Ok(());
        };
        let name = self.provider.name();
        let mut first = None;
        let mut clean = true;
        if self.in_transaction {
            if let Err(e) = roll_back(obj).await {
                clean = false;
                first = Some(DbError::database(name, "close", e));
            } else {
                self.in_transaction = false;
            }
        }
        if clean && self.switched {
            match obj
                .batch_execute("SET SESSION default_transaction_read_only = off")
                .await
            {
                Ok(()) => self.switched = false,
                Err(e) => {
                    first.get_or_insert(DbError::database(name, "close", e));
                }
            }
        }
        self.give_back();
        first.map_or(Ok(()), Err)
    }

    /// Back to the pool when clean, else detached (closed; the server rolls back). An aborted
    /// session is always detached: a cancel request may still be on its way to it.
    fn give_back(&mut self) {
        self.cancel.lock().closed = true;
        let Some(obj) = self.obj.take() else {
            self.in_transaction = false;
            return;
        };
        if self.in_transaction || self.switched || self.aborted.load(Ordering::Acquire) {
            drop(Object::take(obj));
        } else {
            drop(obj);
        }
        self.in_transaction = false;
        self.metrics
            .closed(self.handed_out, || pool_state(&self.pool));
    }
}

/// `ROLLBACK`, once more if an abort's cancel request landed on the first.
async fn roll_back(obj: &Object) -> Result<(), tokio_postgres::Error> {
    match obj.batch_execute("ROLLBACK").await {
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
            obj.batch_execute("ROLLBACK").await
        }
        other => other,
    }
}

impl DbHandle for DeadpoolHandle {
    fn provider(&self) -> &ProviderId {
        &self.provider
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn begin(&mut self) -> Result<(), DbError> {
        let runtime = self.runtime.clone();
        runtime.block_on(self.begin_async())
    }

    fn commit(&mut self) -> Result<(), DbError> {
        let runtime = self.runtime.clone();
        runtime.block_on(self.commit_async())
    }

    /// A no-op: a PostgreSQL commit is visible to other sessions once it returns.
    fn await_completion(&mut self) -> Result<(), DbError> {
        Ok(())
    }

    fn rollback(&mut self) -> Result<(), DbError> {
        let runtime = self.runtime.clone();
        runtime.block_on(self.rollback_async())
    }

    fn close(&mut self) -> Result<(), DbError> {
        if self.obj.is_none() {
            return Ok(());
        }
        let runtime = self.runtime.clone();
        runtime.block_on(self.close_async())
    }

    fn aborter(&self) -> Aborter {
        self.abort.clone()
    }

    fn in_transaction(&self) -> bool {
        self.obj.is_some() && self.in_transaction
    }

    fn is_closed(&self) -> bool {
        self.obj.is_none()
    }
}

/// A drop never blocks (it may run inside a task): a session that may be inside a transaction or
/// read-only is detached, any other goes back to the pool.
impl Drop for DeadpoolHandle {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl std::fmt::Debug for DeadpoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadpoolHandle")
            .field("provider", &self.provider)
            .field("read_only", &self.read_only)
            .field("in_transaction", &self.in_transaction())
            .field("closed", &self.is_closed())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io;

    use admission_core::SystemClock;
    use deadpool_postgres::{Manager, TimeoutType};

    use super::*;
    use crate::error::testing::{assert_says_each_thing_once, closed_port};

    fn provider(port: u16) -> (tokio::runtime::Runtime, DeadpoolPostgresProvider) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(port)
            .user("postgres")
            .dbname("postgres");
        let pool = Pool::builder(Manager::new(config, NoTls))
            .max_size(1)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap();
        let clock = Arc::new(SystemClock::new());
        let provider =
            DeadpoolPostgresProvider::new("pg", 1, pool, clock, runtime.handle().clone()).unwrap();
        (runtime, provider)
    }

    /// A refused connection was `acquire failed: Error occurred while creating a new object: db
    /// error`, twice over in a report, its cause a string: now the connection variant, the
    /// `tokio_postgres::Error` itself its source.
    #[test]
    fn a_refused_connection_is_connect_with_the_driver_error_as_its_source() {
        let (runtime, provider) = provider(closed_port());
        let error = runtime.block_on(provider.checkout(false)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "db provider `pg`: deadpool-postgres could not connect to the database"
        );
        assert!(
            matches!(&error, DbError::Connect { provider, backend: "deadpool-postgres", .. } if provider == "pg"),
            "{error:?}"
        );
        let driver = error
            .source()
            .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
            .expect("the driver's error is the source");
        assert_eq!(driver.code(), None);
        let io = driver
            .source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .expect("the refusal under it");
        assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
        assert_says_each_thing_once(&error);
        assert_eq!(provider.checked_out(), 0);
    }

    /// Only a wait for a slot is a pool timeout; a create timeout is a connection failure, a
    /// closed pool a refused acquire.
    #[test]
    fn deadpool_refusals_are_told_apart() {
        let (_runtime, provider) = provider(closed_port());
        let wait = provider.pool_error(PoolError::Timeout(TimeoutType::Wait));
        assert!(
            matches!(&wait, DbError::PoolTimeout { message, .. }
                if message == "Timeout occurred while waiting for a slot to become available"),
            "{wait:?}"
        );
        let create = provider.pool_error(PoolError::Timeout(TimeoutType::Create));
        assert_eq!(
            create.to_string(),
            "db provider `pg`: deadpool-postgres could not connect to the database"
        );
        assert!(
            create
                .source()
                .and_then(|s| s.downcast_ref::<PoolError>())
                .is_some_and(|e| matches!(e, PoolError::Timeout(TimeoutType::Create))),
            "{create:?}"
        );
        assert_says_each_thing_once(&create);
        let closed = provider.pool_error(PoolError::Closed);
        assert!(
            matches!(
                &closed,
                DbError::Database {
                    operation: "acquire",
                    ..
                }
            ),
            "{closed:?}"
        );
        assert_eq!(closed.to_string(), "db provider `pg`: acquire failed");
        assert_says_each_thing_once(&closed);
    }
}
