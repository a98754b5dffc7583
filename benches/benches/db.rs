//! Criterion benches of a database provider beside the bare pool checkout it wraps (issue 12):
//! the r2d2 SQLite provider (`admission_db::r2d2_sqlite`) against `r2d2::Pool::get` on the same
//! pool settings, a SQLite WAL file in a temporary directory, [`POOL`] connections opened before
//! the first iteration and never more.
//!
//! - `db_acquire_close/provider`: `acquire(false)` and `close()` of a handle, outside the
//!   monitor. The permit is the monitor's business (it takes one as part of the job's whole
//!   demand, before `acquire`), so this row is what the provider itself adds to a checkout:
//!   the handle's abort state, the `Arc`s it shares, boxing the handle; then clearing the stop
//!   flag, the autocommit check and the return. (The `query_only` state the pool hands out is
//!   read by `SqliteManager`'s checkout test, which runs `PRAGMA query_only` where
//!   `r2d2_sqlite`'s runs `SELECT 1`.)
//! - `db_acquire_close/provider_pool_get`: `pool.get()` and drop on the provider's own pool (over
//!   `SqliteManager`), to tell what the manager's checkout test costs beside `r2d2_sqlite`'s from
//!   what the handle adds.
//! - `db_whole_job/monitor_plan`: the whole job as a user writes it, for context: a
//!   [`DbPlan`]'s demand admitted with `admit_blocking` (the provider's `admission()` gate, one
//!   permit), `open` (the acquire), `close` (the handle, then the grant's release).
//! - `bare_pool_get` in both groups, the peer: `pool.get()` and the drop that returns it, on a
//!   pool built the same way over `r2d2_sqlite`'s own manager.
//!
//! Report the ratio of each row to the peer of its group. Run with
//! `cargo bench -p admission-benches --bench db`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{Demand, JobContext, Monitor};
use admission_db::r2d2_sqlite::{R2d2SqliteProvider, SqliteManager};
use admission_db::{DbPlan, DbResourceProvider};
use criterion::{Criterion, criterion_group, criterion_main};
use r2d2::{ManageConnection, Pool};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;
use tempfile::TempDir;

/// The pool's size on both sides, and the provider's bound.
const POOL: u32 = 4;
/// The checkout timeout on both sides (the provider's default).
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A SQLite file in WAL mode, removed with its directory when dropped.
struct WalFile {
    dir: TempDir,
}

impl WalFile {
    fn new() -> WalFile {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let conn = Connection::open(dir.path().join("bench.db")).expect("the file opens");
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .expect("WAL mode");
        assert_eq!(mode, "wal");
        conn.execute_batch("CREATE TABLE jobs (id INTEGER PRIMARY KEY)")
            .expect("the table");
        WalFile { dir }
    }

    /// `r2d2_sqlite`'s manager over the file, with a busy timeout on each connection.
    fn manager(&self) -> SqliteConnectionManager {
        SqliteConnectionManager::file(self.dir.path().join("bench.db"))
            .with_init(|c| c.execute_batch("PRAGMA busy_timeout = 5000;"))
    }

    /// The pool settings of both sides: [`POOL`] connections, all opened by `build` (r2d2 waits
    /// for `min_idle` of them), r2d2's default test on checkout.
    fn pool<M: ManageConnection>(&self, manager: M) -> Pool<M> {
        let pool = Pool::builder()
            .max_size(POOL)
            .min_idle(Some(POOL))
            .connection_timeout(CHECKOUT_TIMEOUT)
            .build(manager)
            .expect("the pool opens its connections");
        assert_eq!(pool.state().idle_connections, POOL, "pre-opened");
        pool
    }
}

fn db(c: &mut Criterion) {
    let file = WalFile::new();
    let bare = file.pool(file.manager());
    let monitor = Monitor::new();
    let provider = Arc::new(
        R2d2SqliteProvider::new(
            "bench",
            u64::from(POOL),
            file.pool(SqliteManager::new(file.manager())),
            monitor.clock().clone(),
        )
        .expect("a bound above zero"),
    );

    let bare_get = |b: &mut criterion::Bencher<'_>| {
        b.iter(|| drop(black_box(bare.get().expect("an idle connection"))))
    };

    let mut group = c.benchmark_group("db_acquire_close");
    group.bench_function("provider", |b| {
        b.iter(|| {
            let mut handle = provider.acquire(black_box(false)).expect("acquired");
            handle.close().expect("closed");
            drop(black_box(handle));
        })
    });
    group.bench_function("bare_pool_get", bare_get);
    group.bench_function("provider_pool_get", |b| {
        b.iter(|| {
            drop(black_box(
                provider.pool().get().expect("an idle connection"),
            ))
        })
    });
    group.finish();

    let plan = DbPlan::new().with(provider.clone(), false);
    let job = JobContext::new("bench");
    let mut group = c.benchmark_group("db_whole_job");
    group.bench_function("monitor_plan", |b| {
        b.iter(|| {
            let grant = monitor
                .admit_blocking(plan.demand(Demand::new()), &job, None)
                .expect("an uncontended demand is granted");
            let handles = plan.open(grant).expect("opened");
            handles.close().expect("closed");
        })
    });
    group.bench_function("bare_pool_get", bare_get);
    group.finish();

    assert_eq!(provider.checked_out(), 0);
    assert_eq!(provider.admission().in_use(), 0);
}

criterion_group!(benches, db);
criterion_main!(benches);
