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

use std::future::{Future, ready};
use std::sync::Arc;
use std::time::Duration;

use admission_core::Clock;
use deadpool_postgres::{Manager, Object, Pool, PoolError};
use tokio::runtime::Handle as Runtime;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use crate::DbError;
use crate::metrics::PoolState;
use crate::pooled::sealed::{Backend, Status};
use crate::pooled::{Failure, PooledHandle, PooledProvider};
use abort::Cancel;

/// A provider over a deadpool-postgres pool.
///
/// Its bound is given, never inferred from the pool: it must not exceed the sessions the pool
/// reserves for jobs. The pool hands out sessions writable (`default_transaction_read_only` off);
/// a read-only handle turns it on and its close turns it off again (a read-only handle dropped
/// unclosed detaches its session). The engine (checkout, handle, close) is [`PooledProvider`]'s.
///
/// The async face is [`checkout`](DeadpoolPostgresProvider::checkout) and the handle's
/// `*_async` verbs. The sync [`DbResourceProvider`](crate::DbResourceProvider) /
/// [`DbHandle`](crate::DbHandle) face runs them on the runtime given to
/// [`new`](DeadpoolPostgresProvider::new) with `block_on`: call it from a thread or from
/// `spawn_blocking`, never from inside a task (tokio panics there).
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
pub type DeadpoolPostgresProvider = PooledProvider<Manager>;

impl DeadpoolPostgresProvider {
    /// A provider named `name` letting `bound` jobs hold a session of `pool` at once; its gate
    /// stamps on `clock` (the monitor's); the sync face blocks on `runtime`, which also runs the
    /// cancel requests of [`abort`](crate::DbHandle::abort).
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
        PooledProvider::build(name, bound, pool, clock, runtime)
    }

    /// Sessions of the pool checked out now: its size less its available sessions.
    pub fn checked_out(&self) -> usize {
        let status = self.pool().status();
        status.size.saturating_sub(status.available)
    }

    /// [`acquire`](crate::DbResourceProvider::acquire), async and typed.
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
        self.checkout_verb(read_only).await
    }
}

/// What deadpool's refusal means: a wait for a slot is a pool timeout; a session it could not
/// create (the driver's error, a create timeout, a failed `post_create` hook) a connection
/// failure, the driver's error itself its source where there is one (not deadpool's wrapper,
/// whose message would repeat it); a closed pool a refusal of `acquire`.
fn classify(error: PoolError) -> Failure {
    use deadpool_postgres::{HookError, TimeoutType};
    match error {
        PoolError::Timeout(TimeoutType::Wait) => Failure::Timeout(error.to_string()),
        PoolError::Backend(driver) | PoolError::PostCreateHook(HookError::Backend(driver)) => {
            Failure::Connect(Box::new(driver))
        }
        PoolError::Timeout(_) | PoolError::PostCreateHook(_) => Failure::Connect(Box::new(error)),
        PoolError::Closed | PoolError::NoRuntimeSpecified => Failure::Refused(Box::new(error)),
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
/// A drop never blocks (it may run inside a task): a session that may be inside a transaction or
/// read-only is detached, any other goes back to the pool.
///
/// # Cancel safety
///
/// A cancelled `begin_async` (or any verb cut short inside a transaction) leaves the handle
/// counted inside a transaction; its close rolls back, and a drop detaches the session.
pub type DeadpoolHandle = PooledHandle<Manager>;

impl DeadpoolHandle {
    /// The client, for the job's statements.
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    pub fn client(&self) -> Result<&deadpool_postgres::Client, DbError> {
        self.live("client")
    }

    /// Opens a transaction ([`DbHandle::begin`](crate::DbHandle::begin)).
    ///
    /// # Errors
    ///
    /// Inside a transaction, on a closed or aborted handle, or a driver error.
    pub async fn begin_async(&mut self) -> Result<(), DbError> {
        self.begin_verb().await
    }

    /// Commits the open transaction ([`DbHandle::commit`](crate::DbHandle::commit)).
    ///
    /// # Errors
    ///
    /// Outside a transaction, on a closed or aborted handle, or a driver error.
    pub async fn commit_async(&mut self) -> Result<(), DbError> {
        self.commit_verb().await
    }

    /// Rolls back the open transaction ([`DbHandle::rollback`](crate::DbHandle::rollback));
    /// accepted after an abort.
    ///
    /// # Errors
    ///
    /// A driver error.
    pub async fn rollback_async(&mut self) -> Result<(), DbError> {
        self.rollback_verb().await
    }

    /// Rolls back, turns the read-only state off again and gives the session back; a session it
    /// cannot bring back to autocommit and writable is detached from the pool
    /// ([`DbHandle::close`](crate::DbHandle::close)).
    ///
    /// # Errors
    ///
    /// The first failure; the session went back or was detached all the same.
    pub async fn close_async(&mut self) -> Result<(), DbError> {
        self.close_verb().await
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

/// What a handle's abort reaches: public for the engine's trait to name, in a module no one else
/// reaches.
mod abort {
    /// An abort's cancel request: the session's token, the runtime it is sent on, and the task
    /// sending it (awaited before the session is rolled back or given up).
    pub struct Cancel {
        pub(super) token: tokio_postgres::CancelToken,
        pub(super) runtime: tokio::runtime::Handle,
        pub(super) request: Option<tokio::task::JoinHandle<()>>,
    }
}

/// deadpool counts its waiters.
impl crate::pooled::PoolStatus for Pool {}

impl Status for Pool {
    fn pool_state(&self) -> PoolState {
        let status = self.status();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        PoolState {
            idle: count(status.available),
            used: count(status.size.saturating_sub(status.available)),
            max: count(status.max_size),
            pending: Some(count(status.waiting)),
        }
    }

    /// [`DbError::PoolTimeout`]: the pool's size, available and waiting counts.
    fn timeout_error(&self, provider: &str, timeout: Duration, message: String) -> DbError {
        let status = self.status();
        DbError::PoolTimeout {
            provider: provider.to_owned(),
            size: status.size,
            available: status.available,
            waiting: status.waiting,
            max_size: status.max_size,
            timeout,
            message,
        }
    }
}

/// The handle counts its transaction, and a failed `COMMIT` leaves it counted open (its close
/// rolls back). deadpool's recycling never rolls back, so a session that may be inside a
/// transaction, may still be read-only, or was aborted is detached ([`Object::take`]) rather
/// than handed back: the session is closed and the server rolls back.
impl crate::pooled::PoolBackend for Manager {}

impl Backend for Manager {
    const BACKEND: &'static str = "deadpool-postgres";
    const GIVES_UP_ABORTED: bool = true;
    const FAILED_COMMIT_ENDS_TRANSACTION: bool = false;
    const CLOSES_ON_DROP: bool = false;
    type Pool = Pool;
    type Conn = Object;
    type Error = tokio_postgres::Error;
    /// The runtime the sync face blocks on and the cancel requests run on.
    type Extra = Runtime;
    type Target = Cancel;

    /// deadpool waits for a connection forever unless told otherwise: the checkout timeout
    /// bounds the wait.
    async fn get<'a>(pool: &'a Pool, _: &'a Runtime, timeout: Duration) -> Result<Object, Failure> {
        match tokio::time::timeout(timeout, pool.get()).await {
            Ok(Ok(obj)) => Ok(obj),
            Ok(Err(e)) => Err(classify(e)),
            Err(_) => Err(Failure::Timeout("timed out".to_owned())),
        }
    }

    /// `block_on` on the provider's runtime.
    fn block_on<T>(runtime: &Runtime, fut: impl Future<Output = T>) -> T {
        runtime.block_on(fut)
    }

    /// The pool hands sessions out writable.
    fn handed_read_only(
        _: &mut Object,
    ) -> impl Future<Output = Result<bool, tokio_postgres::Error>> + Send + '_ {
        ready(Ok(false))
    }

    async fn set_read_only(obj: &mut Object, on: bool) -> Result<(), tokio_postgres::Error> {
        obj.batch_execute(if on {
            "SET SESSION default_transaction_read_only = on"
        } else {
            "SET SESSION default_transaction_read_only = off"
        })
        .await
    }

    fn in_transaction(_: &Object, counted: bool) -> bool {
        counted
    }

    async fn begin(obj: &mut Object, _read_only: bool) -> Result<(), tokio_postgres::Error> {
        obj.batch_execute("BEGIN").await
    }

    async fn commit(obj: &mut Object) -> Result<(), tokio_postgres::Error> {
        obj.batch_execute("COMMIT").await
    }

    async fn rollback(obj: &mut Object) -> Result<(), tokio_postgres::Error> {
        roll_back(obj).await
    }

    fn target(runtime: &Runtime, obj: &Object) -> Cancel {
        Cancel {
            token: obj.cancel_token(),
            runtime: runtime.clone(),
            request: None,
        }
    }

    /// The first abort spawns the cancel request on the provider's runtime.
    fn interrupt(cancel: &mut Cancel, first: bool) {
        if !first {
            return;
        }
        let token = cancel.token.clone();
        cancel.request = Some(cancel.runtime.spawn(async move {
            if let Err(e) = token.cancel_query(NoTls).await {
                tracing::warn!(error = %e, "cancelling an aborted PostgreSQL handle failed");
            }
        }));
    }

    /// Awaits the cancel request's task (the server then finds the session idle and ignores
    /// it), so that it never cancels the rollback.
    fn settle(cancel: &mut Cancel) -> impl Future<Output = ()> + Send + 'static {
        let request = cancel.request.take();
        async move {
            if let Some(request) = request {
                let _ = request.await;
            }
        }
    }

    fn give_back(obj: Object, discard: bool) {
        if discard {
            drop(Object::take(obj));
        } else {
            drop(obj);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use admission_core::SystemClock;
    use deadpool_postgres::{Manager, TimeoutType};

    use super::*;
    use crate::error::testing::{assert_refused_connect, assert_says_each_thing_once, closed_port};

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
        let driver = assert_refused_connect::<tokio_postgres::Error>(&error, "deadpool-postgres");
        assert_eq!(driver.code(), None);
        assert_eq!(provider.checked_out(), 0);
    }

    /// Only a wait for a slot is a pool timeout; a create timeout is a connection failure, a
    /// closed pool a refused acquire.
    #[test]
    fn deadpool_refusals_are_told_apart() {
        let (_runtime, provider) = provider(closed_port());
        let wait = provider.failed(classify(PoolError::Timeout(TimeoutType::Wait)));
        assert!(
            matches!(&wait, DbError::PoolTimeout { message, .. }
                if message == "Timeout occurred while waiting for a slot to become available"),
            "{wait:?}"
        );
        let create = provider.failed(classify(PoolError::Timeout(TimeoutType::Create)));
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
        let closed = provider.failed(classify(PoolError::Closed));
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
