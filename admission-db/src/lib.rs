//! Database providers whose connections are bounded by an admission permit.
//!
//! A [`DbResourceProvider`] exposes its bound as an account ([`DbResourceProvider::admission`], a
//! [`CountingGate`](admission_accounts::CountingGate) named `db:<name>`). The monitor takes one
//! permit on it as part of the job's whole demand; only then does the job call
//! [`acquire`](DbResourceProvider::acquire), which materializes a [`DbHandle`] under that permit
//! and never waits for one. The permit stays in the job's [`Grant`](admission_core::Grant); the
//! handle holds the connection and its transaction state, never the permit. A [`JobDb`] is a job's
//! set of handles: it commits them in order, rolls back the rest on a failure, and gives every
//! connection back to its pool before the permits go back.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "contract")]
pub mod contract;
mod counting;
#[cfg(feature = "deadpool-postgres")]
pub mod deadpool_postgres;
mod error;
mod metrics;
#[cfg(any(
    feature = "r2d2-sqlite",
    feature = "r2d2-postgres",
    feature = "deadpool-postgres"
))]
pub mod pooled;
mod provider;
#[cfg(any(feature = "r2d2-sqlite", feature = "r2d2-postgres"))]
mod r2d2_connect;
#[cfg(feature = "r2d2-postgres")]
pub mod r2d2_postgres;
#[cfg(feature = "r2d2-sqlite")]
pub mod r2d2_sqlite;
mod registry;
mod session;
#[cfg(any(feature = "sqlx-sqlite", feature = "sqlx-postgres"))]
pub mod sqlx_pool;
#[cfg(feature = "sqlx-postgres")]
pub mod sqlx_postgres;
#[cfg(feature = "sqlx-sqlite")]
pub mod sqlx_sqlite;

pub use counting::{CountingDbHandle, CountingDbResourceProvider};
pub use error::{DbError, DbErrors, RegistryError};
pub use provider::{Aborter, DbHandle, DbResourceProvider, ProviderId};
pub use registry::DbResourceProviders;
pub use session::{DbPlan, ForceClose, JobDb};
