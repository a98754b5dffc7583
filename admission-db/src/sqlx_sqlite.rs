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

use crate::sqlx_pool::{SqlxDatabase, SqlxHandle, SqlxProvider, sealed};

/// A provider over a sqlx pool of SQLite connections.
pub type SqlxSqliteProvider = SqlxProvider<Sqlite>;

/// One pooled sqlx SQLite connection held under a permit.
pub type SqlxSqliteHandle = SqlxHandle<Sqlite>;

/// How many virtual-machine steps run between two looks at a handle's abort flag.
const PROGRESS_OPS: i32 = 1_000;

impl sealed::Sealed for Sqlite {}

impl SqlxDatabase for Sqlite {
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
