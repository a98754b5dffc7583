//! The contract suite against the sqlx provider on a real SQLite WAL file behind a sqlx pool
//! larger than the bound, driven from plain threads through the blocking verbs; then what the
//! async verbs promise when their futures are cancelled.

use std::any::Any;
use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use admission_core::{Clock, SystemClock};
use admission_db::contract::{DbSubject, TransactionalSubject};
use admission_db::sqlx_sqlite::{SqlxSqliteHandle, SqlxSqliteProvider};
use admission_db::{DbError, DbHandle, DbResourceProvider};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tempfile::TempDir;
use tokio::runtime::Runtime;

use crate::contract_suite::{Fresh, contract_rules};

/// The bound the suite runs under, and the pool's size, larger.
const BOUND: u64 = 8;
const POOL: u32 = 12;

/// A fresh SQLite file in WAL mode with the jobs' table, and the runtime its pool runs on.
pub(crate) struct Db {
    _dir: TempDir,
    path: PathBuf,
    runtime: Runtime,
}

impl Db {
    pub(crate) fn new() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let db = Db {
            _dir: dir,
            path,
            runtime,
        };
        db.runtime.block_on(async {
            let mut conn = SqliteConnection::connect_with(&db.options().create_if_missing(true))
                .await
                .unwrap();
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert_eq!(mode, "wal");
            sqlx::query("CREATE TABLE jobs (id INTEGER PRIMARY KEY)")
                .execute(&mut conn)
                .await
                .unwrap();
            conn.close().await.unwrap();
        });
        db
    }

    fn options(&self) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(&self.path)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10))
    }

    /// A pool of at most `size` connections over the file.
    fn pool(&self, size: u32) -> SqlitePool {
        let options = self.options();
        self.runtime.block_on(async {
            SqlitePoolOptions::new()
                .max_connections(size)
                .connect_with(options)
                .await
                .unwrap()
        })
    }

    pub(crate) fn provider(&self, name: &str, bound: u64, size: u32) -> SqlxSqliteProvider {
        let pool = self.pool(size);
        SqlxSqliteProvider::new(name, bound, pool, clock(), self.runtime.handle().clone()).unwrap()
    }

    /// The committed rows, read on a connection of its own.
    async fn rows_async(&self) -> Vec<i64> {
        let mut conn = SqliteConnection::connect_with(&self.options())
            .await
            .unwrap();
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
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

async fn insert(conn: &mut SqliteConnection, row: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO jobs (id) VALUES (?1)")
        .bind(row)
        .execute(conn)
        .await
        .map(drop)
}

/// The sqlx provider: each handle holds its pooled connection.
struct Subject {
    db: Db,
    provider: Arc<SqlxSqliteProvider>,
}

fn subject() -> Subject {
    let db = Db::new();
    let provider = Arc::new(db.provider("sqlx", BOUND, POOL));
    Subject { db, provider }
}

fn sqlx_handle(handle: &mut dyn DbHandle) -> &mut SqlxSqliteHandle {
    (handle as &mut dyn Any)
        .downcast_mut::<SqlxSqliteHandle>()
        .expect("a SqlxSqliteHandle")
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
        let conn = sqlx_handle(handle).connection()?;
        self.db
            .runtime
            .block_on(insert(conn, row))
            .map_err(|e| DbError::database("sqlx", "insert", e))
    }
}

impl Fresh for Subject {
    fn fresh(_: &str) -> Subject {
        subject()
    }
}

contract_rules!(contract_rules: Subject, whole suite with 40);

/// `fut` under a timeout of zero: a deadline already past, so the timer is due at the first poll
/// (`timeout(Duration::ZERO, ..)` rounds up to the timer's next millisecond, by which time a
/// local BEGIN has long answered). The future is polled once, then dropped unless it finished.
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

/// After a cancelled verb: nothing is out, no row leaked, and every connection the pool can hand
/// out (all of them at once) begins a write transaction, which a connection left inside one
/// would block past the busy timeout.
async fn assert_the_pool_is_clean(db: &Db, provider: &SqlxSqliteProvider, size: u32) {
    assert_eq!(provider.checked_out(), 0);
    assert_eq!(db.rows_async().await, Vec::<i64>::new());
    let mut handles = Vec::new();
    for _ in 0..size {
        handles.push(provider.checkout(false).await.unwrap());
    }
    for handle in &mut handles {
        assert!(!handle.in_transaction());
        handle.begin_async().await.expect("a fresh checkout begins");
        handle.rollback_async().await.unwrap();
    }
    for handle in &mut handles {
        handle.close_async().await.unwrap();
    }
    assert_eq!(provider.checked_out(), 0);
}

#[test]
fn a_begin_cancelled_by_a_zero_timeout_never_pools_a_connection_inside_a_transaction() {
    let db = Db::new();
    // A short busy timeout: a leaked write lock would fail the fresh checkouts' BEGIN IMMEDIATE.
    let provider = {
        let pool = db.runtime.block_on(
            SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(db.options().busy_timeout(Duration::from_millis(200))),
        );
        SqlxSqliteProvider::new(
            "sqlx",
            1,
            pool.unwrap(),
            clock(),
            db.runtime.handle().clone(),
        )
        .unwrap()
    };
    db.runtime.block_on(async {
        let mut cut = 0;
        // Whether a begin is cut off is a race with the worker thread: at least 20 tries, and
        // more (up to 200) until one is.
        for attempt in 0..200 {
            if attempt >= 20 && cut > 0 {
                break;
            }
            let mut handle = provider.checkout(false).await.unwrap();
            if let Ok(begun) = timeout_zero(handle.begin_async()).await {
                // The worker answered within the one poll: nothing was cut off this time.
                begun.unwrap();
                handle.rollback_async().await.unwrap();
                handle.close_async().await.unwrap();
                continue;
            }
            cut += 1;
            assert!(handle.in_transaction(), "a cut-off begin reads as open");
            assert!(matches!(
                handle.begin_async().await,
                Err(DbError::Transaction {
                    operation: "begin",
                    ..
                })
            ));
            if let Ok(conn) = handle.connection() {
                // Whatever the worker did with the BEGIN, the write happens on this connection.
                let _ = insert(conn, 1).await;
            }
            handle.close_async().await.unwrap();
            assert_eq!((handle.is_closed(), provider.checked_out()), (true, 0));
        }
        assert!(cut > 0, "no begin of 200 was cut off");
        assert_the_pool_is_clean(&db, &provider, 2).await;
    });
}

#[test]
fn a_begin_dropped_after_one_poll_then_the_handle_dropped_on_a_task_never_pools_it() {
    let db = Db::new();
    let provider = Arc::new(db.provider("sqlx", 2, 3));
    db.runtime.block_on(async {
        for _ in 0..20 {
            let mut handle = provider.checkout(false).await.unwrap();
            poll_once_and_drop(handle.begin_async()).await;
            assert!(handle.in_transaction());
            // Dropped inside the runtime: nothing blocks; the connection is closed on a task.
            drop(handle);
        }
        // Closing the pool waits for every connection, the closing ones included.
        provider.pool().close().await;
        assert_eq!((provider.pool().size(), provider.checked_out()), (0, 0));
    });
    // A fresh pool over the file: no lock held, no row left.
    let provider = db.provider("sqlx", 2, 3);
    db.runtime
        .block_on(assert_the_pool_is_clean(&db, &provider, 3));
}

#[test]
fn a_dropped_handle_after_a_cancelled_begin_closes_its_connection_before_returning() {
    let db = Db::new();
    let provider = db.provider("sqlx", 1, 2);
    let handle = db.runtime.block_on(async {
        loop {
            let mut handle = provider.checkout(false).await.unwrap();
            if timeout_zero(handle.begin_async()).await.is_err() {
                break handle;
            }
            handle.rollback_async().await.unwrap();
            handle.close_async().await.unwrap();
        }
    });
    assert!(handle.in_transaction());
    // Off the runtime, the drop blocks until the connection is closed: the count is back at once.
    drop(handle);
    assert_eq!((provider.checked_out(), provider.pool().size()), (0, 0));
    db.runtime
        .block_on(assert_the_pool_is_clean(&db, &provider, 2));
}

#[test]
fn a_checkout_past_the_pool_names_its_size_and_idle_count() {
    let db = Db::new();
    let provider = db
        .provider("small", 2, 1)
        .with_checkout_timeout(Duration::from_millis(20));
    let held = provider.acquire(false).unwrap();
    let Err(err) = provider.acquire(false) else {
        panic!("acquired")
    };
    assert!(
        matches!(
            err,
            DbError::Checkout { ref provider, size: 1, idle: 0, max_size: 1, timeout, .. }
                if provider == "small" && timeout == Duration::from_millis(20)
        ),
        "{err}"
    );
    drop(held);
    assert_eq!(provider.checked_out(), 0);
}

#[test]
fn a_blocking_verb_inside_the_runtime_is_refused_not_run() {
    let db = Db::new();
    let provider = db.provider("sqlx", 1, 2);
    db.runtime.block_on(async {
        let Err(err) = provider.acquire(false) else {
            panic!("acquired")
        };
        assert_eq!(err.to_string(), "db provider `sqlx`: acquire failed");
        assert_eq!(
            std::error::Error::source(&err).map(ToString::to_string),
            Some(
                "a blocking verb was called inside a tokio runtime: await the async method \
                 instead"
                    .to_owned()
            )
        );
        let mut handle = provider.checkout(false).await.unwrap();
        assert!(matches!(
            DbHandle::begin(&mut handle),
            Err(DbError::Database {
                operation: "begin",
                ..
            })
        ));
        assert!(!handle.in_transaction());
        handle.close_async().await.unwrap();
        assert_eq!(provider.checked_out(), 0);
    });
}

#[test]
fn an_aborted_handle_interrupts_its_statement_and_refuses_every_verb_but_rollback_and_close() {
    let db = Db::new();
    let provider = db.provider("sqlx", 1, 2);
    db.runtime.block_on(async {
        let mut handle = provider.checkout(false).await.unwrap();
        handle.begin_async().await.unwrap();
        insert(handle.connection().unwrap(), 1).await.unwrap();
        let aborter = handle.aborter();
        let conn = handle.connection().unwrap();
        let endless = sqlx::query_scalar::<_, i64>(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
             SELECT count(*) FROM c",
        )
        .fetch_one(conn);
        let (result, ()) = tokio::join!(endless, async move {
            tokio::task::yield_now().await;
            aborter.abort();
        });
        let err = result.unwrap_err();
        assert!(err.to_string().contains("interrupted"), "{err}");
        let err = handle.commit_async().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "db provider `sqlx`: the handle was aborted, commit refused"
        );
        let _ = handle.rollback_async().await;
        handle.close_async().await.unwrap();
        assert_eq!(provider.checked_out(), 0);
        assert_the_pool_is_clean(&db, &provider, 2).await;
    });
}

#[test]
fn close_restores_the_read_only_state_the_pool_handed_out() {
    let db = Db::new();
    let provider = db.provider("sqlx", 1, 1);
    db.runtime.block_on(async {
        let query_only = async |conn: &mut SqliteConnection| -> bool {
            sqlx::query_scalar("PRAGMA query_only")
                .fetch_one(conn)
                .await
                .unwrap()
        };
        let mut reader = provider.checkout(true).await.unwrap();
        assert!(query_only(reader.connection().unwrap()).await);
        assert!(insert(reader.connection().unwrap(), 1).await.is_err());
        reader.close_async().await.unwrap();
        let mut conn = provider.pool().acquire().await.unwrap();
        assert!(!query_only(&mut conn).await);
        sqlx::query("PRAGMA query_only = ON")
            .execute(&mut *conn)
            .await
            .unwrap();
        conn.return_to_pool().await;
        drop(conn);
        let mut writer = provider.checkout(false).await.unwrap();
        insert(writer.connection().unwrap(), 2).await.unwrap();
        writer.close_async().await.unwrap();
        let mut conn = provider.pool().acquire().await.unwrap();
        assert!(query_only(&mut conn).await);
        conn.return_to_pool().await;
        assert_eq!(db.rows_async().await, [2]);
    });
}
