//! The contract suite against the sqlx provider on a real PostgreSQL server (`ADMISSION_PG_URL`,
//! which `cargo xtask ci` and `cargo xtask with-services` export), each test on a database of
//! its own, created with a random name and dropped at the end; then what cancelled verbs leave
//! behind in `pg_stat_activity`.
//!
//! Without its server a test fails, saying how to start it; a plain `cargo nextest run` skips
//! these tests (`.config/nextest.toml`), `cargo xtask test` starts the servers and runs them.

use std::any::Any;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use admission_core::{Clock, SystemClock};
use admission_db::contract::{DbSubject, TransactionalSubject};
use admission_db::sqlx_postgres::{SqlxPgHandle, SqlxPgProvider};
use admission_db::{DbError, DbHandle, DbResourceProvider};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection};
use tokio::runtime::Runtime;

use crate::contract_suite::{Fresh, contract_rules};

/// The bound the suite runs under, and the pool's size, larger.
const BOUND: u64 = 8;
const POOL: u32 = 12;

/// The server's URL.
///
/// # Panics
///
/// When unset: the test fails, saying how to start the server.
pub(crate) fn server_url(test: &str) -> String {
    admission_testkit::services::postgres(test)
}

/// A database of its own on the server, with the jobs' table; dropped with it.
pub(crate) struct Db {
    pub(crate) runtime: Runtime,
    server: PgConnectOptions,
    name: String,
}

static NEXT_DB: AtomicU32 = AtomicU32::new(0);

impl Db {
    pub(crate) fn new(url: &str) -> Db {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server: PgConnectOptions = url.parse().unwrap();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "admission_{}_{}_{nanos}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        let db = Db {
            runtime,
            server,
            name,
        };
        db.runtime.block_on(async {
            let mut admin = db.server.connect().await.unwrap();
            admin
                .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {}", db.name)))
                .await
                .unwrap();
            admin.close().await.unwrap();
            let mut conn = db.options().connect().await.unwrap();
            conn.execute("CREATE TABLE jobs (id BIGINT PRIMARY KEY)")
                .await
                .unwrap();
            conn.close().await.unwrap();
        });
        db
    }

    pub(crate) fn options(&self) -> PgConnectOptions {
        self.server.clone().database(&self.name)
    }

    fn provider(&self, name: &str, bound: u64, size: u32) -> SqlxPgProvider {
        let options = self.options();
        let pool = self.runtime.block_on(async {
            PgPoolOptions::new()
                .max_connections(size)
                .connect_with(options)
                .await
                .unwrap()
        });
        SqlxPgProvider::new(name, bound, pool, clock(), self.runtime.handle().clone()).unwrap()
    }

    /// The committed rows, read on a connection of its own.
    async fn rows_async(&self) -> Vec<i64> {
        let mut conn = self.options().connect().await.unwrap();
        let rows = sqlx::query_scalar("SELECT id FROM jobs ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        rows
    }

    fn rows(&self) -> Vec<i64> {
        self.runtime.block_on(self.rows_async())
    }

    /// Sessions on this database left `idle in transaction` (aborted ones included).
    async fn idle_in_transaction(&self) -> i64 {
        let mut conn = self.options().connect().await.unwrap();
        let n = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        n
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let drop_sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = self.runtime.block_on(async {
            let mut admin = self.server.connect().await?;
            admin.execute(sqlx::AssertSqlSafe(drop_sql)).await?;
            admin.close().await
        });
        if let Err(e) = dropped {
            eprintln!("could not drop database {}: {e}", self.name);
        }
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

async fn insert(conn: &mut PgConnection, row: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO jobs (id) VALUES ($1)")
        .bind(row)
        .execute(conn)
        .await
        .map(drop)
}

/// The sqlx provider: each handle holds its pooled session. Declared before its database, so
/// the pool closes before the database is dropped.
struct Subject {
    provider: Arc<SqlxPgProvider>,
    db: Db,
}

impl Drop for Subject {
    fn drop(&mut self) {
        self.db.runtime.block_on(self.provider.pool().close());
    }
}

fn subject_on(url: &str) -> Subject {
    let db = Db::new(url);
    let provider = Arc::new(db.provider("sqlx-pg", BOUND, POOL));
    Subject { provider, db }
}

fn pg_handle(handle: &mut dyn DbHandle) -> &mut SqlxPgHandle {
    (handle as &mut dyn Any)
        .downcast_mut::<SqlxPgHandle>()
        .expect("a SqlxPgHandle")
}

impl DbSubject for Subject {
    fn provider(&self) -> Arc<dyn DbResourceProvider> {
        self.provider.clone()
    }
    fn checked_out(&self) -> u32 {
        self.provider.checked_out()
    }
    fn job(
        &self,
        handle: &mut dyn DbHandle,
        row: i64,
        commit: bool,
        while_connected: &mut dyn FnMut(),
    ) -> Result<(), DbError> {
        admission_db::contract::transactional_job(self, handle, row, commit, while_connected)
    }
    fn rows(&self) -> Vec<i64> {
        self.db.rows()
    }
}

impl TransactionalSubject for Subject {
    fn insert(&self, handle: &mut dyn DbHandle, row: i64) -> Result<(), DbError> {
        let conn = pg_handle(handle).connection()?;
        self.db
            .runtime
            .block_on(insert(conn, row))
            .map_err(|e| DbError::database("sqlx-pg", "insert", e))
    }
}

impl Fresh for Subject {
    fn fresh(test: &str) -> Subject {
        subject_on(&server_url(test))
    }
}

contract_rules!(contract_rules: Subject, whole suite with 40);

/// `fut` under a timeout already due: polled once, then dropped unless it finished.
async fn timeout_zero<F: Future>(fut: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    let past = tokio::time::Instant::now() - Duration::from_millis(10);
    tokio::time::timeout_at(past, fut).await
}

/// Polls `fut` once, then drops it.
async fn poll_once_and_drop(fut: impl Future) {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| {
        let _ = fut.as_mut().poll(cx);
        Poll::Ready(())
    })
    .await;
}

/// Nothing out, no session idle in a transaction, no row leaked; every session the pool hands
/// out (all at once) begins and rolls back with none left open.
async fn assert_the_pool_is_clean(db: &Db, provider: &SqlxPgProvider, size: u32) {
    assert_eq!(provider.checked_out(), 0);
    assert_eq!(db.idle_in_transaction().await, 0);
    assert_eq!(db.rows_async().await, Vec::<i64>::new());
    let mut handles = Vec::new();
    for _ in 0..size {
        handles.push(provider.checkout(false).await.unwrap());
    }
    // Idle in the pool a moment ago: any leaked transaction would show now.
    assert_eq!(db.idle_in_transaction().await, 0);
    for handle in &mut handles {
        assert!(!handle.in_transaction());
        handle.begin_async().await.expect("a fresh checkout begins");
        handle.rollback_async().await.unwrap();
        handle.close_async().await.unwrap();
    }
    assert_eq!(provider.checked_out(), 0);
}

#[test]
fn a_cancelled_begin_never_pools_a_session_inside_a_transaction() {
    let url = server_url("a_cancelled_begin_never_pools_a_session_inside_a_transaction");
    let db = Db::new(&url);
    let provider = db.provider("sqlx-pg", 2, 3);
    db.runtime.block_on(async {
        let mut cut = 0;
        for i in 0..20 {
            let mut handle = provider.checkout(false).await.unwrap();
            let cancelled = if i % 2 == 0 {
                timeout_zero(handle.begin_async()).await.is_err()
            } else {
                poll_once_and_drop(handle.begin_async()).await;
                handle.in_transaction()
            };
            if !cancelled {
                handle.rollback_async().await.unwrap();
                handle.close_async().await.unwrap();
                continue;
            }
            cut += 1;
            assert!(handle.in_transaction(), "a cut-off begin reads as open");
            handle.close_async().await.unwrap();
            assert_eq!(provider.checked_out(), 0);
        }
        assert!(cut > 0, "no begin of 20 was cut off");
        assert_the_pool_is_clean(&db, &provider, 3).await;
    });
    db.runtime.block_on(provider.pool().close());
}

#[test]
fn handles_dropped_after_a_cancelled_begin_leave_no_session_idle_in_a_transaction() {
    let url = server_url(
        "handles_dropped_after_a_cancelled_begin_leave_no_session_idle_in_a_transaction",
    );
    let db = Db::new(&url);
    let provider = db.provider("sqlx-pg", 2, 3);
    db.runtime.block_on(async {
        for _ in 0..10 {
            let mut handle = provider.checkout(false).await.unwrap();
            poll_once_and_drop(handle.begin_async()).await;
            // Dropped inside the runtime: nothing blocks; the session is closed on a task.
            drop(handle);
        }
        // Closing the pool waits for every session, the closing ones included.
        provider.pool().close().await;
        assert_eq!(provider.pool().size(), 0);
        assert_eq!(db.idle_in_transaction().await, 0);
    });
    // Off the runtime, a dropped handle inside a transaction closes before the drop returns.
    let provider = db.provider("sqlx-pg", 1, 2);
    let mut handle = db.runtime.block_on(provider.checkout(false)).unwrap();
    handle.begin().unwrap();
    db.runtime
        .block_on(insert(handle.connection().unwrap(), 1))
        .unwrap();
    drop(handle);
    assert_eq!(provider.checked_out(), 0);
    db.runtime
        .block_on(assert_the_pool_is_clean(&db, &provider, 2));
    db.runtime.block_on(provider.pool().close());
}

#[test]
fn close_restores_the_read_only_state_the_pool_handed_out() {
    let url = server_url("close_restores_the_read_only_state_the_pool_handed_out");
    let db = Db::new(&url);
    let provider = db.provider("sqlx-pg", 1, 1);
    db.runtime.block_on(async {
        let read_only = async |conn: &mut PgConnection| -> String {
            sqlx::query_scalar("SHOW default_transaction_read_only")
                .fetch_one(conn)
                .await
                .unwrap()
        };
        let mut reader = provider.checkout(true).await.unwrap();
        assert_eq!(read_only(reader.connection().unwrap()).await, "on");
        assert!(insert(reader.connection().unwrap(), 1).await.is_err());
        reader.close_async().await.unwrap();
        let mut writer = provider.checkout(false).await.unwrap();
        assert_eq!(read_only(writer.connection().unwrap()).await, "off");
        insert(writer.connection().unwrap(), 2).await.unwrap();
        writer.close_async().await.unwrap();
        assert_eq!(db.rows_async().await, [2]);
        provider.pool().close().await;
    });
}

#[test]
fn a_commit_after_a_failed_statement_is_refused_not_a_quiet_rollback() {
    let url = server_url("a_commit_after_a_failed_statement_is_refused_not_a_quiet_rollback");
    let db = Db::new(&url);
    let provider = db.provider("sqlx-pg", 1, 2);
    db.runtime.block_on(async {
        let mut handle = provider.checkout(false).await.unwrap();
        handle.begin_async().await.unwrap();
        insert(handle.connection().unwrap(), 1).await.unwrap();
        assert!(
            insert(handle.connection().unwrap(), 1).await.is_err(),
            "a duplicate key"
        );
        let err = handle.commit_async().await.unwrap_err();
        assert!(
            matches!(
                err,
                DbError::Database {
                    operation: "commit",
                    ..
                }
            ),
            "{err}"
        );
        assert!(handle.in_transaction());
        handle.rollback_async().await.unwrap();
        handle.close_async().await.unwrap();
        assert_eq!(db.rows_async().await, Vec::<i64>::new());
        assert_the_pool_is_clean(&db, &provider, 2).await;
        provider.pool().close().await;
    });
}
