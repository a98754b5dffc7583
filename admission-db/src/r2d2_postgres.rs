//! The r2d2 provider over the sync `postgres::Client`: one pooled PostgreSQL session per permit,
//! from acquire to close.
//!
//! The pool is built over [`PgManager`], which wraps `r2d2_postgres`'s manager and pools a
//! [`PgConnection`]: the client and the session state the provider set on it. A connection whose
//! handle could not bring it out of a transaction is marked broken, so r2d2 drops it (the server
//! then rolls back) instead of pooling it: a session never goes back to the pool mid-transaction.
//!
//! The sync client runs its own runtime: call it from threads, or from `spawn_blocking` under an
//! async runtime, never from inside a task.
//!
//! A session the pool cannot open (the server down or restarting, `57P03` while it shuts down)
//! is [`DbError::Connect`]. r2d2 keeps only the text of its connection errors, so the provider
//! then connects once itself, with the pool's configuration (bounded by [`PROBE_TIMEOUT`]), and
//! that attempt's `postgres::Error` is the source, [`code`](postgres::Error::code) and all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::Clock;
use parking_lot::Mutex;
use postgres::error::SqlState;
use postgres::{Client, NoTls};
use r2d2::{ManageConnection, Pool, PooledConnection};
use r2d2_postgres::PostgresConnectionManager;

use crate::metrics::{PoolMetrics, PoolState};
use crate::r2d2_connect::connect_failure;
use crate::{Aborter, DbError, DbHandle, DbResourceProvider, ProviderId};

/// The pool and driver, as [`DbError::Connect`] names them.
const BACKEND: &str = "r2d2-postgres";

/// The longest the provider's own connection attempt after a failed checkout may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One pooled PostgreSQL session: the client, and the state the provider keeps on it.
pub struct PgConnection {
    client: Client,
    /// `default_transaction_read_only` as last set through a handle (off when connected).
    read_only: bool,
    /// Set when a handle could not end the session's transaction: r2d2 drops it.
    broken: bool,
    /// The manager's configuration, bounded by [`PROBE_TIMEOUT`]: how the provider connects
    /// once itself to learn why the pool could not.
    probe: Arc<postgres::Config>,
}

impl PgConnection {
    /// The client.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }
}

impl std::fmt::Debug for PgConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConnection")
            .field("read_only", &self.read_only)
            .field("broken", &self.broken)
            .field("closed", &self.client.is_closed())
            .finish()
    }
}

/// `r2d2_postgres`'s manager over [`PgConnection`], refusing to pool a session its handle left
/// inside a transaction.
#[derive(Debug)]
pub struct PgManager {
    inner: PostgresConnectionManager<NoTls>,
    /// `config`, its connect timeout bounded by [`PROBE_TIMEOUT`], shared with every connection.
    probe: Arc<postgres::Config>,
}

impl PgManager {
    /// A manager connecting with `config`, without TLS (a session's default
    /// `default_transaction_read_only` must be off: the provider sets it per handle).
    pub fn new(config: postgres::Config) -> PgManager {
        let mut probe = config.clone();
        let bound = config
            .get_connect_timeout()
            .map_or(PROBE_TIMEOUT, |t| (*t).min(PROBE_TIMEOUT));
        probe.connect_timeout(bound);
        PgManager {
            inner: PostgresConnectionManager::new(config, NoTls),
            probe: Arc::new(probe),
        }
    }
}

impl ManageConnection for PgManager {
    type Connection = PgConnection;
    type Error = postgres::Error;

    fn connect(&self) -> Result<PgConnection, postgres::Error> {
        Ok(PgConnection {
            client: self.inner.connect()?,
            read_only: false,
            broken: false,
            probe: self.probe.clone(),
        })
    }

    fn is_valid(&self, conn: &mut PgConnection) -> Result<(), postgres::Error> {
        self.inner.is_valid(&mut conn.client)
    }

    /// A session its handle left inside a transaction, or a closed one, is dropped.
    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        conn.broken || conn.client.is_closed()
    }
}

/// The checkout timeout unless one is set: under a permit the pool should have a session at
/// once, so waiting longer means the bound exceeds what the pool reserves.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A provider over an r2d2 pool of sync PostgreSQL clients.
///
/// Its bound is given, never inferred from the pool: it must not exceed the sessions the pool
/// reserves for jobs (the pool's maximum, less what the host keeps for itself). A read-only
/// handle's session runs with `default_transaction_read_only` on, in and outside its
/// transactions; `close` sets it back.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use admission_core::{Demand, JobContext, Monitor};
/// use admission_db::r2d2_postgres::{PgHandle, PgManager, R2d2PostgresProvider};
/// use admission_db::{DbPlan, DbResourceProvider};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config: postgres::Config = "postgres://postgres@127.0.0.1/shop".parse()?;
/// let pool = r2d2::Pool::builder().max_size(16).build(PgManager::new(config))?;
/// let monitor = Monitor::new();
/// // 12 of the pool's 16 sessions are the jobs'; the host keeps the rest for itself.
/// let db = Arc::new(R2d2PostgresProvider::new("shop", 12, pool, monitor.clock().clone())?);
///
/// let plan = DbPlan::new().with(db.clone(), false);
/// let grant = monitor.admit_blocking(plan.demand(Demand::new()), &JobContext::new("job"), None)?;
/// let job = plan.open(grant)?;
/// job.begin_all()?;
/// job.with_handle(0, |db: &mut PgHandle| -> Result<(), Box<dyn std::error::Error>> {
///     db.client()?.execute("INSERT INTO orders (id) VALUES ($1)", &[&42_i64])?;
///     Ok(())
/// })??;
/// job.commit_all()?;
/// job.close()?; // the session goes back to the pool, then the permit to the gate
/// assert_eq!(db.admission().in_use(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct R2d2PostgresProvider {
    id: ProviderId,
    gate: Arc<CountingGate>,
    pool: Pool<PgManager>,
    checkout_timeout: Duration,
    metrics: PoolMetrics,
    /// The pool's connection configuration, learned from the first session handed out.
    probe: OnceLock<Arc<postgres::Config>>,
}

impl R2d2PostgresProvider {
    /// A provider named `name` letting `bound` jobs hold a session of `pool` at once; its gate
    /// stamps on `clock` (the monitor's).
    ///
    /// # Errors
    ///
    /// [`DbError::Config`] for a bound of zero.
    pub fn new(
        name: impl Into<Arc<str>>,
        bound: u64,
        pool: Pool<PgManager>,
        clock: Arc<dyn Clock>,
    ) -> Result<R2d2PostgresProvider, DbError> {
        let id = ProviderId::new(name);
        let gate = id.gate(bound, clock.clone())?;
        let metrics = PoolMetrics::new(id.name().into(), clock);
        Ok(R2d2PostgresProvider {
            id,
            gate,
            pool,
            checkout_timeout: CHECKOUT_TIMEOUT,
            metrics,
            probe: OnceLock::new(),
        })
    }

    /// The same provider, waiting at most `timeout` for a pooled session (5 s by default).
    pub fn with_checkout_timeout(mut self, timeout: Duration) -> R2d2PostgresProvider {
        self.checkout_timeout = timeout;
        self
    }

    /// The pool the handles come from.
    pub fn pool(&self) -> &Pool<PgManager> {
        &self.pool
    }

    /// Sessions of the pool checked out now: its size less its idle sessions.
    pub fn checked_out(&self) -> u32 {
        let state = self.pool.state();
        state.connections.saturating_sub(state.idle_connections)
    }

    /// [`acquire`](DbResourceProvider::acquire), typed.
    ///
    /// # Errors
    ///
    /// [`DbError::Checkout`] naming the pool's size and idle count (r2d2 does not count its
    /// waiters) when the pool timed out full; [`DbError::Connect`] when it could not open a
    /// session (see the module's docs); a driver error setting the read-only state.
    pub fn checkout(&self, read_only: bool) -> Result<PgHandle, DbError> {
        let started = self.metrics.now();
        let mut conn = self
            .pool
            .get_timeout(self.checkout_timeout)
            .map_err(|e| self.timed_out(e))?;
        self.probe.get_or_init(|| conn.probe.clone());
        self.metrics.checked_out(started, || pool_state(&self.pool));
        let handed_out = self.metrics.now();
        let handed_read_only = conn.read_only;
        if handed_read_only != read_only {
            set_read_only(&mut conn, read_only)
                .map_err(|e| DbError::database(self.name(), "acquire", e))?;
        }
        let token = conn.client.cancel_token();
        let aborted = Arc::new(AtomicBool::new(false));
        let cancel = Arc::new(Mutex::new(Cancel::default()));
        let (flag, state) = (aborted.clone(), cancel.clone());
        let abort = Aborter::new(move || {
            let mut state = state.lock();
            // Once closed, the session may serve another job: never cancel it.
            if state.closed || flag.swap(true, Ordering::AcqRel) {
                return;
            }
            // The cancel request opens a connection of its own: never on the caller's thread.
            let token = token.clone();
            state.request = Some(std::thread::spawn(move || {
                if let Err(e) = token.cancel_query(NoTls) {
                    tracing::warn!(error = %e, "cancelling an aborted PostgreSQL handle failed");
                }
            }));
        });
        Ok(PgHandle {
            provider: self.id.clone(),
            conn: Some(conn),
            read_only,
            handed_read_only,
            in_transaction: false,
            aborted,
            cancel,
            abort,
            pool: self.pool.clone(),
            metrics: self.metrics.clone(),
            handed_out,
        })
    }
}

impl R2d2PostgresProvider {
    /// A checkout that ended in `error`: [`DbError::Connect`] for a session the pool could not
    /// open, else [`DbError::Checkout`].
    fn timed_out(&self, error: r2d2::Error) -> DbError {
        let state = self.pool.state();
        let room = state.connections < self.pool.max_size();
        let probe = self
            .probe
            .get()
            .map(|config| move || config.connect(NoTls).map(drop));
        match connect_failure(self.name(), BACKEND, error, room, probe) {
            Ok(connect) => connect,
            Err(error) => {
                self.metrics.timed_out(|| pool_state(&self.pool));
                DbError::Checkout {
                    provider: self.name().to_owned(),
                    size: state.connections,
                    idle: state.idle_connections,
                    max_size: self.pool.max_size(),
                    timeout: self.checkout_timeout,
                    message: error.to_string(),
                }
            }
        }
    }
}

/// The pool's state for the metrics (r2d2 does not count its waiters).
fn pool_state(pool: &Pool<PgManager>) -> PoolState {
    let state = pool.state();
    PoolState {
        idle: state.idle_connections,
        used: state.connections.saturating_sub(state.idle_connections),
        max: pool.max_size(),
        pending: None,
    }
}

fn set_read_only(conn: &mut PgConnection, on: bool) -> Result<(), postgres::Error> {
    conn.client.batch_execute(if on {
        "SET SESSION default_transaction_read_only = on"
    } else {
        "SET SESSION default_transaction_read_only = off"
    })?;
    conn.read_only = on;
    Ok(())
}

/// An abort's cancel request, and whether the handle closed (after which abort sends none).
#[derive(Debug, Default)]
struct Cancel {
    closed: bool,
    /// The thread sending the request, joined before the session is rolled back or given up.
    request: Option<std::thread::JoinHandle<()>>,
}

/// `ROLLBACK`, once more if an abort's cancel request landed on the first.
fn roll_back(client: &mut Client) -> Result<(), postgres::Error> {
    match client.batch_execute("ROLLBACK") {
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => client.batch_execute("ROLLBACK"),
        other => other,
    }
}

impl DbResourceProvider for R2d2PostgresProvider {
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

/// One pooled PostgreSQL session held under a permit.
///
/// The handle knows its transaction from its own verbs: open transactions with
/// [`begin`](DbHandle::begin), not with a `BEGIN` of the job's own.
/// [`await_completion`](DbHandle::await_completion) is a no-op: a PostgreSQL commit is visible to
/// other sessions once it returns. [`abort`](DbHandle::abort) sets a flag and sends the server a cancel request from a
/// thread of its own, so the running statement stops; only `rollback` and `close` are accepted
/// after it. `rollback` and `close` first wait for that request to reach the server, and an
/// aborted session is dropped after its rollback rather than pooled, so a cancel meant for this
/// handle never reaches another job; an abort after `close` sends nothing.
pub struct PgHandle {
    provider: ProviderId,
    /// `None` once closed: the session went back to the pool (or was dropped).
    conn: Option<PooledConnection<PgManager>>,
    read_only: bool,
    /// The read-only state the pool handed out, restored by `close`.
    handed_read_only: bool,
    in_transaction: bool,
    aborted: Arc<AtomicBool>,
    /// Shared with the aborter: the cancel request in flight, and whether the handle closed.
    cancel: Arc<Mutex<Cancel>>,
    abort: Aborter,
    /// The pool the session came from, read for the metrics once it is back.
    pool: Pool<PgManager>,
    metrics: PoolMetrics,
    /// When the pool handed the session out (the provider's clock), for `use_time`.
    handed_out: crate::metrics::Stamp,
}

impl PgHandle {
    /// The client, for the job's statements.
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    pub fn client(&mut self) -> Result<&mut Client, DbError> {
        Ok(&mut self.live("client")?.client)
    }

    fn live(&mut self, operation: &'static str) -> Result<&mut PgConnection, DbError> {
        if self.conn.is_some() && self.aborted.load(Ordering::Acquire) {
            return Err(DbError::Aborted {
                provider: self.provider.name().to_owned(),
                operation,
            });
        }
        match self.conn.as_deref_mut() {
            Some(conn) => Ok(conn),
            None => Err(DbError::Closed {
                provider: self.provider.name().to_owned(),
                operation,
            }),
        }
    }

    /// Waits for an abort's cancel request to reach the server (it then finds the session idle
    /// and is ignored), so that it never cancels the rollback or a later job's statement; with
    /// `close`, no later abort sends one.
    fn settle_cancel(&self, close: bool) {
        let request = {
            let mut state = self.cancel.lock();
            state.closed |= close;
            state.request.take()
        };
        if let Some(request) = request {
            let _ = request.join();
        }
    }

    fn refuse(&self, operation: &'static str, reason: &'static str) -> DbError {
        DbError::Transaction {
            provider: self.provider.name().to_owned(),
            operation,
            reason,
        }
    }
}

impl DbHandle for PgHandle {
    fn provider(&self) -> &ProviderId {
        &self.provider
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn begin(&mut self) -> Result<(), DbError> {
        self.live("begin")?;
        if self.in_transaction {
            return Err(self.refuse("begin", "a transaction is already open"));
        }
        // Counted open before the round trip: whatever happens to it, close rolls back.
        self.in_transaction = true;
        let name = self.provider.name().to_owned();
        self.live("begin")?
            .client
            .batch_execute("BEGIN")
            .map_err(|e| DbError::database(&name, "begin", e))
    }

    fn commit(&mut self) -> Result<(), DbError> {
        self.live("commit")?;
        if !self.in_transaction {
            return Err(self.refuse("commit", "no transaction is open"));
        }
        let name = self.provider.name().to_owned();
        let result = self.live("commit")?.client.batch_execute("COMMIT");
        // A failed COMMIT still ends the transaction (PostgreSQL rolls it back).
        self.in_transaction = false;
        result.map_err(|e| DbError::database(&name, "commit", e))
    }

    /// A no-op: a PostgreSQL commit is visible to other sessions once it returns.
    fn await_completion(&mut self) -> Result<(), DbError> {
        Ok(())
    }

    fn rollback(&mut self) -> Result<(), DbError> {
        if !self.in_transaction {
            return Ok(());
        }
        if self.conn.is_none() {
            return Ok(());
        }
        self.settle_cancel(false);
        let Some(conn) = self.conn.as_deref_mut() else {
            return Ok(());
        };
        let result = roll_back(&mut conn.client);
        if result.is_ok() {
            self.in_transaction = false;
        }
        result.map_err(|e| DbError::database(self.provider.name(), "rollback", e))
    }

    fn close(&mut self) -> Result<(), DbError> {
        if self.conn.is_none() {
            return Ok(());
        }
        self.settle_cancel(true);
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        let name = self.provider.name();
        let mut first = None;
        // A cancel request may still be on its way through the network: an aborted session is
        // dropped after its rollback, never pooled for another job.
        conn.broken |= self.aborted.load(Ordering::Acquire);
        if self.in_transaction {
            if let Err(e) = roll_back(&mut conn.client) {
                // Still inside: the pool drops the session instead of pooling it.
                conn.broken = true;
                first = Some(DbError::database(name, "close", e));
            }
            self.in_transaction = false;
        }
        if !conn.broken
            && conn.read_only != self.handed_read_only
            && let Err(e) = set_read_only(&mut conn, self.handed_read_only)
        {
            conn.broken = true;
            first.get_or_insert(DbError::database(name, "close", e));
        }
        drop(conn);
        self.metrics
            .closed(self.handed_out, || pool_state(&self.pool));
        first.map_or(Ok(()), Err)
    }

    fn aborter(&self) -> Aborter {
        self.abort.clone()
    }

    fn in_transaction(&self) -> bool {
        self.conn.is_some() && self.in_transaction
    }

    fn is_closed(&self) -> bool {
        self.conn.is_none()
    }
}

impl Drop for PgHandle {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing a dropped PostgreSQL handle failed");
        }
    }
}

impl std::fmt::Debug for PgHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgHandle")
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

    use super::*;
    use crate::error::testing::{assert_says_each_thing_once, closed_port};

    fn provider(config: &postgres::Config) -> R2d2PostgresProvider {
        let pool = Pool::builder()
            .max_size(1)
            .min_idle(Some(0))
            .build_unchecked(PgManager::new(config.clone()));
        R2d2PostgresProvider::new("pg", 1, pool, Arc::new(SystemClock::new()))
            .unwrap()
            .with_checkout_timeout(Duration::from_millis(500))
    }

    fn refused() -> postgres::Config {
        let mut config = postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(closed_port())
            .user("postgres");
        config
    }

    /// A provider that has held a session knows its pool's configuration: a refused connection
    /// is the connection variant, the `postgres::Error` of its own attempt the source.
    #[test]
    fn a_refused_connection_is_connect_with_the_driver_error_as_its_source() {
        let config = refused();
        let provider = provider(&config);
        // As the first session handed out would have taught it.
        let _ = provider.probe.set(PgManager::new(config).probe);
        let error = provider.checkout(false).unwrap_err();
        assert_eq!(
            error.to_string(),
            "db provider `pg`: r2d2-postgres could not connect to the database"
        );
        assert!(
            matches!(&error, DbError::Connect { provider, backend: "r2d2-postgres", .. } if provider == "pg"),
            "{error:?}"
        );
        let driver = error
            .source()
            .and_then(|s| s.downcast_ref::<postgres::Error>())
            .expect("the driver's error is the source");
        assert_eq!(driver.code(), None);
        let io = driver
            .source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .expect("the refusal under it");
        assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
        assert_says_each_thing_once(&error);
    }

    /// Before its first session the provider has only r2d2's text of the error: still the
    /// connection variant, `r2d2::Error` its source.
    #[test]
    fn a_provider_that_never_connected_has_r2d2s_words_as_the_source() {
        let provider = provider(&refused());
        let error = provider.checkout(false).unwrap_err();
        assert!(
            matches!(
                &error,
                DbError::Connect {
                    backend: "r2d2-postgres",
                    ..
                }
            ),
            "{error:?}"
        );
        let pool = error
            .source()
            .and_then(|s| s.downcast_ref::<r2d2::Error>())
            .expect("r2d2's error is the source");
        assert_eq!(
            pool.to_string(),
            "timed out waiting for connection: error connecting to server"
        );
        assert_says_each_thing_once(&error);
    }
}
