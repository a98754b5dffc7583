//! The pool metrics (feature `metrics`) of the r2d2 SQLite provider, the sqlx SQLite provider, and
//! the deadpool-postgres, r2d2 PostgreSQL and sqlx PostgreSQL providers (against
//! `ADMISSION_PG_URL`), read through a `DebuggingRecorder` installed for the test's thread only
//! (the sqlx providers' blocking verbs run their futures on the calling thread). A snapshot
//! drains what it reads: histograms come back empty and gauges and counters at zero until the
//! next report.

use std::sync::Arc;
use std::time::Duration;

use admission_core::SystemClock;
use admission_db::r2d2_sqlite::R2d2SqliteProvider;
use admission_db::{DbError, DbHandle};
use metrics::Unit;
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::sqlite::Db;

/// What the snapshot holds for one series: name, labels sorted, unit, value.
type Series = (String, Vec<(String, String)>, Option<Unit>, DebugValue);

/// Runs `f` with a fresh recorder current on this thread only; returns its snapshotter too.
fn recorded<T>(f: impl FnOnce(&Snapshotter) -> T) -> T {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || f(&snapshotter))
}

/// The snapshot, drained (histograms empty after it).
fn series(snapshotter: &Snapshotter) -> Vec<Series> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, _, value): (CompositeKey, _, _, _)| {
            let (_, key) = key.into_parts();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (key.name().to_owned(), labels, unit, value)
        })
        .collect()
}

fn value<'a>(all: &'a [Series], name: &str, labels: &[(&str, &str)]) -> &'a DebugValue {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    want.push(("pool.name".to_owned(), "orders".to_owned()));
    want.sort();
    let found: Vec<_> = all
        .iter()
        .filter(|(n, l, _, _)| n == name && *l == want)
        .collect();
    assert_eq!(found.len(), 1, "{name} {want:?} in {all:?}");
    &found[0].3
}

fn gauge(all: &[Series], name: &str, labels: &[(&str, &str)]) -> f64 {
    match value(all, name, labels) {
        DebugValue::Gauge(v) => v.into_inner(),
        other => panic!("{name} is not a gauge: {other:?}"),
    }
}

fn samples(all: &[Series], name: &str) -> usize {
    match value(all, name, &[]) {
        DebugValue::Histogram(v) => v.len(),
        other => panic!("{name} is not a histogram: {other:?}"),
    }
}

fn provider(db: &Db, pool: u32) -> R2d2SqliteProvider {
    R2d2SqliteProvider::new("orders", 2, db.pool(pool), Arc::new(SystemClock::new())).unwrap()
}

#[test]
fn use_time_has_one_sample_per_close() {
    let db = Db::new();
    recorded(|snapshotter| {
        let provider = provider(&db, 4);
        for _ in 0..5 {
            provider.checkout(false).unwrap().close().unwrap();
        }
        let all = series(snapshotter);
        assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 5);
        assert_eq!(samples(&all, "db.client.connection.wait_time_seconds"), 5);
    });
}

#[test]
fn used_and_idle_gauges_read_the_pool_after_checkout_and_close() {
    let db = Db::new();
    recorded(|snapshotter| {
        let provider = provider(&db, 4);
        let mut handle = provider.checkout(false).unwrap();
        let all = series(snapshotter);
        let count = "db.client.connection.count";
        assert_eq!(gauge(&all, count, &[("state", "used")]), 1.0);
        assert_eq!(gauge(&all, count, &[("state", "idle")]), 3.0);
        assert_eq!(gauge(&all, "db.client.connection.max", &[]), 4.0);

        handle.close().unwrap();
        let all = series(snapshotter);
        assert_eq!(gauge(&all, count, &[("state", "used")]), 0.0);
        assert_eq!(gauge(&all, count, &[("state", "idle")]), 4.0);
    });
}

#[test]
fn a_checkout_from_a_held_pool_of_one_counts_one_timeout() {
    let db = Db::new();
    recorded(|snapshotter| {
        let provider = provider(&db, 1).with_checkout_timeout(Duration::from_millis(10));
        let held = provider.checkout(false).unwrap();
        let err = provider.checkout(false).unwrap_err();
        assert!(matches!(err, DbError::Checkout { .. }), "{err}");
        let all = series(snapshotter);
        assert_eq!(
            value(&all, "db.client.connection.timeouts_total", &[]),
            &DebugValue::Counter(1)
        );
        assert_eq!(
            gauge(&all, "db.client.connection.count", &[("state", "used")]),
            1.0
        );
        drop(held);
    });
}

#[test]
fn every_series_names_its_pool_and_has_a_unit() {
    let db = Db::new();
    recorded(|snapshotter| {
        let provider = provider(&db, 1).with_checkout_timeout(Duration::from_millis(10));
        let held = provider.checkout(false).unwrap();
        provider.checkout(false).unwrap_err();
        drop(held);
        let all = series(snapshotter);
        let mut names: Vec<_> = all.iter().map(|(n, ..)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names,
            [
                "db.client.connection.count",
                "db.client.connection.max",
                "db.client.connection.timeouts_total",
                "db.client.connection.use_time_seconds",
                "db.client.connection.wait_time_seconds",
            ]
        );
        for (name, labels, unit, _) in &all {
            assert!(
                labels.contains(&("pool.name".to_owned(), "orders".to_owned())),
                "{name} {labels:?}"
            );
            let want = if name.ends_with("_seconds") {
                Unit::Seconds
            } else {
                Unit::Count
            };
            assert_eq!(unit.as_ref(), Some(&want), "{name}");
            // Prometheus's conventions: a counter ends in `_total`, a duration in `_seconds`.
            assert!(
                !name.contains("timeouts") || name.ends_with("_total"),
                "{name}"
            );
        }
    });
}

#[cfg(feature = "sqlx-sqlite")]
mod sqlx_sqlite {
    use std::time::Duration;

    use admission_db::{DbError, DbResourceProvider};

    use super::{gauge, recorded, samples, series, value};
    use crate::sqlx_sqlite::Db;
    use metrics_util::debugging::DebugValue;

    #[test]
    fn use_time_has_one_sample_per_close() {
        let db = Db::new();
        recorded(|snapshotter| {
            let provider = db.provider("orders", 2, 4);
            for _ in 0..5 {
                provider.acquire(false).unwrap().close().unwrap();
            }
            let all = series(snapshotter);
            assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 5);
            assert_eq!(samples(&all, "db.client.connection.wait_time_seconds"), 5);
        });
    }

    #[test]
    fn used_and_idle_gauges_read_the_pool_after_checkout_and_close() {
        let db = Db::new();
        recorded(|snapshotter| {
            let provider = db.provider("orders", 2, 4);
            let idle = |p: &admission_db::sqlx_sqlite::SqlxSqliteProvider| {
                f64::from(u32::try_from(p.pool().num_idle()).unwrap())
            };
            let mut handle = provider.acquire(false).unwrap();
            let all = series(snapshotter);
            let count = "db.client.connection.count";
            assert_eq!(gauge(&all, count, &[("state", "used")]), 1.0);
            assert_eq!(gauge(&all, count, &[("state", "idle")]), idle(&provider));
            assert_eq!(gauge(&all, "db.client.connection.max", &[]), 4.0);

            handle.close().unwrap();
            let all = series(snapshotter);
            assert_eq!(gauge(&all, count, &[("state", "used")]), 0.0);
            assert_eq!(gauge(&all, count, &[("state", "idle")]), idle(&provider));
            assert_eq!(
                gauge(&all, count, &[("state", "idle")]),
                f64::from(provider.pool().size())
            );
        });
    }

    #[test]
    fn a_checkout_from_a_held_pool_of_one_counts_one_timeout() {
        let db = Db::new();
        recorded(|snapshotter| {
            let provider = db
                .provider("orders", 2, 1)
                .with_checkout_timeout(Duration::from_millis(10));
            let held = provider.acquire(false).unwrap();
            let Err(err) = provider.acquire(false) else {
                panic!("a second checkout from a held pool of one succeeded");
            };
            assert!(matches!(err, DbError::Checkout { .. }), "{err}");
            let all = series(snapshotter);
            assert_eq!(
                value(&all, "db.client.connection.timeouts_total", &[]),
                &DebugValue::Counter(1)
            );
            drop(held);
        });
    }
}

#[cfg(all(feature = "r2d2-postgres", feature = "deadpool-postgres"))]
mod deadpool_postgres {
    use std::sync::Arc;
    use std::time::Duration;

    use admission_core::SystemClock;
    use admission_db::DbHandle;
    use admission_db::deadpool_postgres::DeadpoolPostgresProvider;
    use metrics_util::debugging::DebugValue;

    use super::{gauge, recorded, samples, series, value};
    use crate::postgres::deadpool_pg::{pool, runtime};
    use crate::postgres::{PgDb, pg_url};

    #[test]
    fn deadpool_gauges_use_time_pending_and_timeouts_follow_the_pool() {
        let url = pg_url("deadpool_gauges_use_time_pending_and_timeouts");
        let db = PgDb::new(&url);
        let runtime = runtime();
        recorded(|snapshotter| {
            let provider = DeadpoolPostgresProvider::new(
                "orders",
                2,
                pool(&db, 1),
                Arc::new(SystemClock::new()),
                runtime.handle().clone(),
            )
            .unwrap()
            .with_checkout_timeout(Duration::from_millis(50));
            let count = "db.client.connection.count";
            let pending = "db.client.connection.pending_requests";
            for _ in 0..3 {
                let mut handle = runtime.block_on(provider.checkout(false)).unwrap();
                handle.close().unwrap();
            }
            let all = series(snapshotter);
            assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 3);
            assert_eq!(gauge(&all, count, &[("state", "used")]), 0.0);
            assert_eq!(gauge(&all, count, &[("state", "idle")]), 1.0);

            let held = runtime.block_on(provider.checkout(false)).unwrap();
            let all = series(snapshotter);
            assert_eq!(gauge(&all, count, &[("state", "used")]), 1.0);
            assert_eq!(gauge(&all, count, &[("state", "idle")]), 0.0);
            assert_eq!(gauge(&all, "db.client.connection.max", &[]), 1.0);
            assert_eq!(gauge(&all, pending, &[]), 0.0);

            runtime.block_on(provider.checkout(false)).unwrap_err();
            let all = series(snapshotter);
            assert_eq!(
                value(&all, "db.client.connection.timeouts_total", &[]),
                &DebugValue::Counter(1)
            );
            drop(held);
        });
    }
}

#[cfg(all(feature = "r2d2-postgres", feature = "deadpool-postgres"))]
mod r2d2_postgres {
    use std::sync::Arc;
    use std::time::Duration;

    use admission_core::SystemClock;
    use admission_db::DbHandle;
    use admission_db::r2d2_postgres::{PgManager, R2d2PostgresProvider};
    use metrics_util::debugging::DebugValue;

    use super::{gauge, recorded, samples, series, value};
    use crate::postgres::{PgDb, pg_url};

    fn pg_provider(db: &PgDb, size: u32) -> R2d2PostgresProvider {
        let pool = r2d2::Pool::builder()
            .max_size(size)
            .build(PgManager::new(db.config.clone()))
            .unwrap();
        R2d2PostgresProvider::new("orders", 2, pool, Arc::new(SystemClock::new()))
            .unwrap()
            .with_checkout_timeout(Duration::from_millis(50))
    }

    #[test]
    fn r2d2_postgres_gauges_use_time_and_timeouts_follow_the_pool() {
        let url = pg_url("r2d2_postgres_gauges_use_time_and_timeouts");
        let db = PgDb::new(&url);
        recorded(|snapshotter| {
            let provider = pg_provider(&db, 2);
            let count = "db.client.connection.count";
            for _ in 0..3 {
                provider.checkout(false).unwrap().close().unwrap();
            }
            let all = series(snapshotter);
            assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 3);
            assert_eq!(gauge(&all, count, &[("state", "used")]), 0.0);
            assert_eq!(gauge(&all, count, &[("state", "idle")]), 2.0);
            assert!(
                all.iter()
                    .all(|(name, ..)| name != "db.client.connection.pending_requests"),
                "r2d2 counts no waiters"
            );

            let held = provider.checkout(false).unwrap();
            let all = series(snapshotter);
            assert_eq!(gauge(&all, count, &[("state", "used")]), 1.0);
            assert_eq!(gauge(&all, count, &[("state", "idle")]), 1.0);
            assert_eq!(gauge(&all, "db.client.connection.max", &[]), 2.0);
            drop(held);

            let small = pg_provider(&db, 1);
            let held = small.checkout(false).unwrap();
            small.checkout(false).unwrap_err();
            let all = series(snapshotter);
            assert_eq!(
                value(&all, "db.client.connection.timeouts_total", &[]),
                &DebugValue::Counter(1)
            );
            drop(held);
        });
    }
}

#[cfg(feature = "sqlx-postgres")]
mod sqlx_postgres {
    use std::sync::Arc;
    use std::time::Duration;

    use admission_core::SystemClock;
    use admission_db::sqlx_postgres::SqlxPgProvider;
    use admission_db::{DbError, DbResourceProvider};
    use metrics::Unit;
    use metrics_util::debugging::DebugValue;
    use sqlx::postgres::PgPoolOptions;

    use super::{gauge, recorded, samples, series, value};
    use crate::sqlx_postgres::{Db, server_url};

    /// A provider named `orders` (bound 2, checkout timeout `timeout`) over a lazy pool of
    /// `size`: no session is opened before the first checkout, so the pool's counts are exact;
    /// with `warm`, one session is opened and left idle first (through the pool itself, with
    /// sqlx's own timeout), so that a short `timeout` is never spent opening one.
    fn pg_provider(db: &Db, size: u32, timeout: Duration, warm: bool) -> SqlxPgProvider {
        let options = db.options();
        let pool = db.runtime.block_on(async {
            let pool = PgPoolOptions::new()
                .max_connections(size)
                .connect_lazy_with(options);
            if warm {
                drop(pool.acquire().await.expect("a first session opens"));
            }
            pool
        });
        SqlxPgProvider::new(
            "orders",
            2,
            pool,
            Arc::new(SystemClock::new()),
            db.runtime.handle().clone(),
        )
        .unwrap()
        .with_checkout_timeout(timeout)
    }

    #[test]
    fn sqlx_postgres_gauges_use_time_and_timeouts_follow_the_pool() {
        let url = server_url("sqlx_postgres_gauges_use_time_and_timeouts");
        let db = Db::new(&url);
        recorded(|snapshotter| {
            // Opening a session can take longer than a short timeout on a loaded machine: these
            // checkouts must succeed.
            let provider = pg_provider(&db, 2, Duration::from_secs(10), false);
            let count = "db.client.connection.count";
            let (used, idle) = (&[("state", "used")], &[("state", "idle")]);

            // Five checkouts one after the other: one session, opened by the first, reused.
            for _ in 0..5 {
                provider.acquire(false).unwrap().close().unwrap();
            }
            let all = series(snapshotter);
            assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 5);
            assert_eq!(samples(&all, "db.client.connection.wait_time_seconds"), 5);
            assert_eq!(gauge(&all, count, used), 0.0);
            assert_eq!(gauge(&all, count, idle), 1.0);
            assert_eq!(gauge(&all, "db.client.connection.max", &[]), 2.0);
            assert_eq!(provider.pool().size(), 1);

            // Two held: the idle session, then a second one opened for it.
            let mut first = provider.acquire(true).unwrap();
            let all = series(snapshotter);
            assert_eq!(gauge(&all, count, used), 1.0);
            assert_eq!(gauge(&all, count, idle), 0.0);
            let mut second = provider.acquire(false).unwrap();
            let all = series(snapshotter);
            assert_eq!(gauge(&all, count, used), 2.0);
            assert_eq!(gauge(&all, count, idle), 0.0);
            assert_eq!(samples(&all, "db.client.connection.wait_time_seconds"), 1);
            assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 0);

            // Closing each gives its session back before the gauges are read.
            second.close().unwrap();
            let all = series(snapshotter);
            assert_eq!(gauge(&all, count, used), 1.0);
            assert_eq!(gauge(&all, count, idle), 1.0);
            first.close().unwrap();
            let all = series(snapshotter);
            assert_eq!(gauge(&all, count, used), 0.0);
            assert_eq!(gauge(&all, count, idle), 2.0);
            assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 1);
            assert!(
                all.iter()
                    .all(|(name, ..)| name != "db.client.connection.timeouts_total"),
                "no checkout timed out yet"
            );
            db.runtime.block_on(provider.pool().close());

            // A pool of one, held: the next checkout times out, counted once, the gauges read
            // right after it.
            let small = pg_provider(&db, 1, Duration::from_millis(50), true);
            let mut held = small.acquire(false).unwrap();
            let Err(err) = small.acquire(false) else {
                panic!("a second checkout from a held pool of one succeeded");
            };
            assert!(matches!(err, DbError::Checkout { .. }), "{err}");
            let all = series(snapshotter);
            assert_eq!(
                value(&all, "db.client.connection.timeouts_total", &[]),
                &DebugValue::Counter(1)
            );
            assert_eq!(gauge(&all, count, used), 1.0);
            assert_eq!(gauge(&all, count, idle), 0.0);
            assert_eq!(gauge(&all, "db.client.connection.max", &[]), 1.0);
            assert_eq!(samples(&all, "db.client.connection.wait_time_seconds"), 1);
            held.close().unwrap();

            // sqlx counts no waiters: no pending_requests; every series has its unit.
            let all = series(snapshotter);
            let mut names: Vec<_> = all.iter().map(|(n, ..)| n.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(
                names,
                [
                    "db.client.connection.count",
                    "db.client.connection.max",
                    "db.client.connection.timeouts_total",
                    "db.client.connection.use_time_seconds",
                    "db.client.connection.wait_time_seconds",
                ]
            );
            for (name, _, unit, _) in &all {
                let want = if name.ends_with("_seconds") {
                    Unit::Seconds
                } else {
                    Unit::Count
                };
                assert_eq!(unit.as_ref(), Some(&want), "{name}");
            }
            assert_eq!(samples(&all, "db.client.connection.use_time_seconds"), 1);
            assert_eq!(gauge(&all, count, used), 0.0);
            assert_eq!(gauge(&all, count, idle), 1.0);
            db.runtime.block_on(small.pool().close());
        });
    }
}
