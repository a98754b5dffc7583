//! ```
//! use std::sync::Arc;
//! use admission_core::{Demand, JobContext, Monitor};
//! use admission_db::sqlx_sqlite::SqlxSqliteProvider;
//! use admission_db::DbResourceProvider;
//! use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
//! let dir = std::env::temp_dir().join(format!("admission-db-sqlx-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let options = SqliteConnectOptions::new()
//!     .filename(dir.join("orders.db"))
//!     .create_if_missing(true)
//!     .journal_mode(SqliteJournalMode::Wal)
//!     .busy_timeout(std::time::Duration::from_secs(5));
//! let monitor = Monitor::new();
//! runtime.block_on(async {
//!     let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
//!     let db = SqlxSqliteProvider::new("orders", 2, pool, monitor.clock().clone(),
//!         tokio::runtime::Handle::current())?;
//!     let grant = monitor
//!         .admit(Demand::new().with(db.admission().clone(), admission_core::Amount::ONE),
//!                &JobContext::new("job"), None)
//!         .await?;
//!     let mut handle = db.checkout(false).await?;
//!     handle.begin_async().await?;
//!     sqlx::query("CREATE TABLE IF NOT EXISTS t (x)").execute(handle.connection()?).await?;
//!     handle.commit_async().await?;
//!     handle.close_async().await?;   // the connection is back in the pool...
//!     drop(grant);                   // ...before the permit is back on the gate
//!     assert_eq!((db.checked_out(), db.admission().in_use()), (0, 0));
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::{Executor, Sqlite, SqliteConnection};

use crate::sqlx_pool::{SqlxHandle, SqlxProvider, sealed};

/// A provider over a sqlx pool of SQLite connections.
pub type SqlxSqliteProvider = SqlxProvider<Sqlite>;

/// One pooled sqlx SQLite connection held under a permit.
pub type SqlxSqliteHandle = SqlxHandle<Sqlite>;

/// How many virtual-machine steps run between two looks at a handle's abort flag.
const PROGRESS_OPS: i32 = 1_000;

impl crate::sqlx_pool::SqlxDatabase for Sqlite {}

impl sealed::Database for Sqlite {
    const BACKEND: &'static str = "sqlx-sqlite";

    fn begin_sql(read_only: bool) -> &'static str {
        if read_only {
            "BEGIN"
        } else {
            "BEGIN IMMEDIATE"
        }
    }

    fn read_only_sql(on: bool) -> &'static str {
        if on {
            "PRAGMA query_only = ON"
        } else {
            "PRAGMA query_only = OFF"
        }
    }

    async fn run(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        conn.execute(sql).await.map(drop)
    }

    fn read_only_now(
        conn: &mut SqliteConnection,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_ {
        sqlx::query_scalar("PRAGMA query_only").fetch_one(conn)
    }

    /// Always: a failed statement leaves a SQLite transaction able to commit what succeeded.
    fn can_commit(
        _conn: &mut SqliteConnection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        std::future::ready(Ok(()))
    }

    async fn arm(conn: &mut SqliteConnection, aborted: Arc<AtomicBool>) -> Result<(), sqlx::Error> {
        conn.lock_handle()
            .await?
            .set_progress_handler(PROGRESS_OPS, move || !aborted.load(Ordering::Acquire));
        Ok(())
    }

    async fn disarm(conn: &mut SqliteConnection) -> bool {
        match conn.lock_handle().await {
            Ok(mut locked) => {
                locked.remove_progress_handler();
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use admission_core::SystemClock;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    use super::*;
    use crate::DbError;
    use crate::error::testing::assert_says_each_thing_once;

    /// A database file that cannot be opened was a pool timeout with advice on the bound: now
    /// the connection variant, sqlx's error (SQLite's `SQLITE_CANTOPEN`, 14) its source.
    #[test]
    fn a_file_that_cannot_be_opened_is_connect_with_the_driver_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("missing").join("db.sqlite"))
            .create_if_missing(true);
        let error = runtime.block_on(async {
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(options);
            let clock = Arc::new(SystemClock::new());
            let provider =
                SqlxSqliteProvider::new("lite", 1, pool, clock, runtime.handle().clone()).unwrap();
            provider.checkout(false).await.unwrap_err()
        });
        assert_eq!(
            error.to_string(),
            "db provider `lite`: sqlx-sqlite could not connect to the database"
        );
        assert!(
            matches!(
                &error,
                DbError::Connect {
                    backend: "sqlx-sqlite",
                    ..
                }
            ),
            "{error:?}"
        );
        let driver = error
            .source()
            .and_then(|s| s.downcast_ref::<sqlx::Error>())
            .expect("the driver's error is the source");
        let code = driver.as_database_error().and_then(|db| db.code());
        assert_eq!(code.as_deref(), Some("14"), "{driver:?}");
        assert_says_each_thing_once(&error);
    }
}
