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

use std::future::{Future, ready};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use admission_core::Clock;
use postgres::error::SqlState;
use postgres::{Client, NoTls};
use r2d2::{ManageConnection, Pool, PooledConnection};
use r2d2_postgres::PostgresConnectionManager;

use crate::DbError;
use crate::pooled::sealed::Backend;
use crate::pooled::{Failure, PooledHandle, PooledProvider, run_here};
use crate::r2d2_connect;
use abort::Cancel;

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

/// A provider over an r2d2 pool of sync PostgreSQL clients.
///
/// Its bound is given, never inferred from the pool: it must not exceed the sessions the pool
/// reserves for jobs (the pool's maximum, less what the host keeps for itself). A read-only
/// handle's session runs with `default_transaction_read_only` on, in and outside its
/// transactions; `close` sets it back. The engine (checkout, handle, close) is
/// [`PooledProvider`]'s.
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
pub type R2d2PostgresProvider = PooledProvider<PgManager>;

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
        PooledProvider::build(name, bound, pool, clock, OnceLock::new())
    }

    /// Sessions of the pool checked out now: its size less its idle sessions.
    pub fn checked_out(&self) -> u32 {
        r2d2_connect::checked_out(self.pool())
    }

    /// [`acquire`](crate::DbResourceProvider::acquire), typed.
    ///
    /// # Errors
    ///
    /// [`DbError::Checkout`] naming the pool's size and idle count (r2d2 does not count its
    /// waiters) when the pool timed out full; [`DbError::Connect`] when it could not open a
    /// session (see the module's docs); a driver error setting the read-only state.
    pub fn checkout(&self, read_only: bool) -> Result<PgHandle, DbError> {
        run_here(self.checkout_verb(read_only))
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

/// `ROLLBACK`, once more if an abort's cancel request landed on the first.
fn roll_back(client: &mut Client) -> Result<(), postgres::Error> {
    match client.batch_execute("ROLLBACK") {
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => client.batch_execute("ROLLBACK"),
        other => other,
    }
}

/// One pooled PostgreSQL session held under a permit.
///
/// The handle knows its transaction from its own verbs: open transactions with
/// [`begin`](crate::DbHandle::begin), not with a `BEGIN` of the job's own.
/// [`await_completion`](crate::DbHandle::await_completion) is a no-op: a PostgreSQL commit is
/// visible to other sessions once it returns. [`abort`](crate::DbHandle::abort) sets a flag and
/// sends the server a cancel request from a thread of its own, so the running statement stops;
/// only `rollback` and `close` are accepted after it. `rollback` and `close` first wait for that
/// request to reach the server, and an aborted session is dropped after its rollback rather than
/// pooled, so a cancel meant for this handle never reaches another job; an abort after `close`
/// sends nothing.
pub type PgHandle = PooledHandle<PgManager>;

impl PgHandle {
    /// The client, for the job's statements.
    ///
    /// # Errors
    ///
    /// On a closed or aborted handle.
    pub fn client(&mut self) -> Result<&mut Client, DbError> {
        Ok(&mut self.live_mut("client")?.client)
    }
}

/// What a handle's abort reaches: public for the engine's trait to name, in a module no one else
/// reaches.
mod abort {
    /// An abort's cancel request: the session's token, and the thread sending the request
    /// (joined before the session is rolled back or given up).
    pub struct Cancel {
        pub(super) token: postgres::CancelToken,
        pub(super) request: Option<std::thread::JoinHandle<()>>,
    }
}

impl r2d2_connect::Opens for PgManager {
    type Opener = postgres::Config;

    fn opener(conn: &PgConnection) -> &Arc<postgres::Config> {
        &conn.probe
    }

    fn probe(config: &postgres::Config) -> Result<(), postgres::Error> {
        config.connect(NoTls).map(drop)
    }
}

/// The handle counts its transaction (a failed `COMMIT` ends it: PostgreSQL rolls it back). An
/// aborted session, or one its close could not bring out of a transaction or back to its
/// read-only state, is marked broken, so r2d2 drops it (the server then rolls back).
impl crate::pooled::PoolBackend for PgManager {}

impl Backend for PgManager {
    const BACKEND: &'static str = "r2d2-postgres";
    const GIVES_UP_ABORTED: bool = true;
    const FAILED_COMMIT_ENDS_TRANSACTION: bool = true;
    const CLOSES_ON_DROP: bool = true;
    type Pool = Pool<PgManager>;
    type Conn = PooledConnection<PgManager>;
    type Error = postgres::Error;
    /// The pool's connection configuration, learned from the first session handed out.
    type Extra = OnceLock<Arc<postgres::Config>>;
    type Target = Cancel;

    fn get<'a>(
        pool: &'a Pool<PgManager>,
        probe: &'a Self::Extra,
        timeout: Duration,
    ) -> impl Future<Output = Result<Self::Conn, Failure>> + Send + 'a {
        ready(r2d2_connect::get(pool, probe, timeout))
    }

    fn handed_read_only(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = Result<bool, postgres::Error>> + Send + '_ {
        ready(Ok(conn.read_only))
    }

    fn set_read_only(
        conn: &mut Self::Conn,
        on: bool,
    ) -> impl Future<Output = Result<(), postgres::Error>> + Send + '_ {
        ready(set_read_only(conn, on))
    }

    fn in_transaction(_: &Self::Conn, counted: bool) -> bool {
        counted
    }

    fn begin(
        conn: &mut Self::Conn,
        _read_only: bool,
    ) -> impl Future<Output = Result<(), postgres::Error>> + Send + '_ {
        ready(conn.client.batch_execute("BEGIN"))
    }

    fn commit(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = Result<(), postgres::Error>> + Send + '_ {
        ready(conn.client.batch_execute("COMMIT"))
    }

    fn rollback(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = Result<(), postgres::Error>> + Send + '_ {
        ready(roll_back(&mut conn.client))
    }

    fn target(_: &Self::Extra, conn: &Self::Conn) -> Cancel {
        Cancel {
            token: conn.client.cancel_token(),
            request: None,
        }
    }

    /// The first abort sends the cancel request, which opens a connection of its own: never on
    /// the caller's thread.
    fn interrupt(cancel: &mut Cancel, first: bool) {
        if !first {
            return;
        }
        let token = cancel.token.clone();
        cancel.request = Some(std::thread::spawn(move || {
            if let Err(e) = token.cancel_query(NoTls) {
                tracing::warn!(error = %e, "cancelling an aborted PostgreSQL handle failed");
            }
        }));
    }

    /// Waits for the cancel request to reach the server (it then finds the session idle and is
    /// ignored), so that it never cancels the rollback or a later job's statement.
    fn settle(cancel: &mut Cancel) -> impl Future<Output = ()> + Send + 'static {
        let request = cancel.request.take();
        async move {
            if let Some(request) = request {
                let _ = request.join();
            }
        }
    }

    fn give_back(mut conn: Self::Conn, discard: bool) {
        conn.broken |= discard;
        drop(conn);
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use admission_core::SystemClock;

    use super::*;
    use crate::error::testing::{assert_refused_connect, assert_says_each_thing_once, closed_port};

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
        let _ = provider.extra().set(PgManager::new(config).probe);
        let error = provider.checkout(false).unwrap_err();
        let driver = assert_refused_connect::<postgres::Error>(&error, "r2d2-postgres");
        assert_eq!(driver.code(), None);
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
