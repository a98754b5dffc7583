//! The sqlx provider over PostgreSQL: [`SqlxPgProvider`], one pooled async session per permit.
//!
//! A handle's begin is `BEGIN`; a read-only handle's session is set to
//! `default_transaction_read_only`, put back as the pool handed it out, so its transactions
//! refuse writes. sqlx 0.9.0 can hand a session back to the pool mid-`BEGIN` when a `begin` is
//! cancelled; a handle whose begin (or any state-changing verb) was cut off closes its session
//! instead of pooling it. sqlx offers no cancel request, so an abort refuses later verbs but lets
//! a running statement finish. A commit first checks that the transaction did not fail (where
//! `COMMIT` would quietly roll back), one round trip more. The engine, its blocking verbs and its cancel safety are
//! [`SqlxProvider`]'s.
//!
//! # Examples
//!
//! ```no_run
//! use admission_core::{Amount, Demand, JobContext, Monitor};
//! use admission_db::sqlx_postgres::SqlxPgProvider;
//! use admission_db::DbResourceProvider;
//! use sqlx::postgres::PgPoolOptions;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let monitor = Monitor::new();
//! let pool = PgPoolOptions::new().max_connections(16).connect("postgres://localhost/app").await?;
//! // The bound is what the pool reserves for jobs: never more than its 16.
//! let db = SqlxPgProvider::new("app", 12, pool, monitor.clock().clone(),
//!     tokio::runtime::Handle::current())?;
//! let demand = Demand::new().with(db.admission().clone(), Amount::ONE);
//! let grant = monitor.admit(demand, &JobContext::new("job"), None).await?;
//! let mut handle = db.checkout(false).await?;
//! handle.begin_async().await?;
//! sqlx::query("INSERT INTO jobs (id) VALUES (1)").execute(handle.connection()?).await?;
//! handle.commit_async().await?;
//! handle.close_async().await?;   // the session is back in the pool before the permit
//! drop(grant);
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use sqlx::{Executor, PgConnection, Postgres};

use crate::sqlx_pool::{SqlxHandle, SqlxProvider, sealed};

/// A provider over a sqlx pool of PostgreSQL sessions.
pub type SqlxPgProvider = SqlxProvider<Postgres>;

/// One pooled sqlx PostgreSQL session held under a permit.
pub type SqlxPgHandle = SqlxHandle<Postgres>;

impl crate::sqlx_pool::SqlxDatabase for Postgres {}

impl sealed::Database for Postgres {
    const BACKEND: &'static str = "sqlx-postgres";

    fn begin_sql(_read_only: bool) -> &'static str {
        "BEGIN"
    }

    fn read_only_sql(on: bool) -> &'static str {
        if on {
            "SET default_transaction_read_only = on"
        } else {
            "SET default_transaction_read_only = off"
        }
    }

    async fn run(conn: &mut PgConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        conn.execute(sql).await.map(drop)
    }

    async fn read_only_now(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        let on: String = sqlx::query_scalar("SHOW default_transaction_read_only")
            .fetch_one(conn)
            .await?;
        Ok(on == "on")
    }

    /// A statement in a failed transaction is refused ("current transaction is aborted"), where
    /// `COMMIT` would answer with a quiet rollback.
    async fn can_commit(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        conn.execute("SELECT 1").await.map(drop)
    }

    /// Nothing to arm: sqlx has no cancel request; the flag alone refuses later verbs.
    fn arm(
        _conn: &mut PgConnection,
        _aborted: Arc<AtomicBool>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        std::future::ready(Ok(()))
    }

    fn disarm(_conn: &mut PgConnection) -> impl Future<Output = bool> + Send + '_ {
        std::future::ready(true)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io;
    use std::time::Duration;

    use admission_core::SystemClock;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    use super::*;
    use crate::DbError;
    use crate::error::testing::{assert_says_each_thing_once, closed_port};

    /// sqlx retries a refused connection until its acquire timeout and then says only "pool
    /// timed out", which the provider reported as a pool timeout with advice on the bound: now
    /// the connection variant, the refused attempt's `sqlx::Error` its source.
    #[test]
    fn a_refused_connection_is_connect_with_the_driver_error_as_its_source() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(closed_port())
            .username("postgres");
        let error = runtime.block_on(async {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_millis(300))
                .connect_lazy_with(options);
            let clock = Arc::new(SystemClock::new());
            let provider = SqlxPgProvider::new("pg", 1, pool, clock, runtime.handle().clone())
                .unwrap()
                .with_checkout_timeout(Duration::from_secs(2));
            provider.checkout(false).await.unwrap_err()
        });
        assert_eq!(
            error.to_string(),
            "db provider `pg`: sqlx-postgres could not connect to the database"
        );
        assert!(
            matches!(&error, DbError::Connect { provider, backend: "sqlx-postgres", .. } if provider == "pg"),
            "{error:?}"
        );
        let driver = error
            .source()
            .and_then(|s| s.downcast_ref::<sqlx::Error>())
            .expect("the driver's error is the source");
        assert!(
            matches!(driver, sqlx::Error::Io(io) if io.kind() == io::ErrorKind::ConnectionRefused),
            "{driver:?}"
        );
        assert_says_each_thing_once(&error);
    }
}
