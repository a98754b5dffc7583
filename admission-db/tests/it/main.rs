//! The integration tests of `admission-db`: one binary, one module per part.

#[cfg(all(feature = "contract", feature = "r2d2-sqlite"))]
mod contract_self_test;
#[cfg(all(
    feature = "contract",
    any(
        feature = "r2d2-sqlite",
        feature = "sqlx-sqlite",
        feature = "sqlx-postgres",
        all(feature = "r2d2-postgres", feature = "deadpool-postgres")
    )
))]
mod contract_suite;
#[cfg(all(feature = "contract", feature = "r2d2-sqlite", feature = "metrics"))]
mod metrics;
#[cfg(all(
    feature = "contract",
    feature = "r2d2-postgres",
    feature = "deadpool-postgres",
    feature = "sqlx-postgres"
))]
mod pg_outage;
#[cfg(all(
    feature = "contract",
    feature = "r2d2-postgres",
    feature = "deadpool-postgres"
))]
mod postgres;
mod registry;
mod session;
#[cfg(all(feature = "contract", feature = "r2d2-sqlite"))]
mod sqlite;
#[cfg(all(feature = "contract", feature = "sqlx-postgres"))]
mod sqlx_postgres;
#[cfg(all(feature = "contract", feature = "sqlx-sqlite"))]
mod sqlx_sqlite;
