//! The fleet's results database: a real SQLite file (WAL) behind an r2d2 pool, reached only
//! through an [`R2d2SqliteProvider`] whose gate (`db:results`) is the database part of a step's
//! demand.
//!
//! A step that needs the database takes one permit on that gate inside its whole demand; once
//! granted it checks a connection out of the provider ([`Results::open`], never a wait for a
//! permit), makes its call, then stores its result in the `results` table inside one transaction
//! and gives the connection back ([`Results::store`]) before the grant gives the permit back.
//! The pool has [`HOST_CONNECTIONS`] more connections than the bound: the host's own, for the
//! schema and for the row count read back at the end.
//!
//! The provider's verbs block (rusqlite), so async agents call them through
//! `tokio::task::spawn_blocking`; blocking agents call them directly.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::Clock;
use admission_db::r2d2_sqlite::{R2d2SqliteProvider, SqliteHandle, SqliteManager};
use admission_db::{DbHandle as _, DbResourceProvider as _};
use anyhow::Context as _;
use r2d2_sqlite::SqliteConnectionManager;

/// The provider's name; its gate is `db:results`.
pub const PROVIDER: &str = "results";
/// Connections the pool keeps beyond the bound, for the host (schema, final count).
pub const HOST_CONNECTIONS: u32 = 2;
/// How long a writer waits for SQLite's write lock, in real milliseconds.
const BUSY_TIMEOUT_MS: u32 = 5_000;

/// One step's result, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The agent's name (`agent-007`).
    pub agent: String,
    /// The step's index in the agent's plan.
    pub step: usize,
    /// The attempt of the step (0 first, then retries).
    pub attempt: u32,
    /// The model called.
    pub model: &'static str,
    /// Prompt tokens plus produced tokens (0 when the call was refused).
    pub tokens: u64,
    /// `ok`, `rate-limited` or `overloaded`.
    pub outcome: &'static str,
    /// Simulated time the result was stored at.
    pub at: Duration,
}

/// The results database and its provider.
pub struct Results {
    path: PathBuf,
    provider: Arc<R2d2SqliteProvider>,
}

impl Results {
    /// A fresh database at `path` (any earlier file is removed), in WAL mode with the `results`
    /// table, and a provider letting `bound` steps hold a connection at once, its gate on `clock`.
    ///
    /// # Errors
    ///
    /// When the file cannot be replaced, the pool cannot connect, or the bound is zero.
    pub fn create(path: &Path, bound: u64, clock: Arc<dyn Clock>) -> anyhow::Result<Results> {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("removing {}", Path::new(&file).display()));
                }
            }
        }
        let manager = SqliteConnectionManager::file(path).with_init(|c| {
            c.execute_batch(&format!(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                 PRAGMA busy_timeout = {BUSY_TIMEOUT_MS};"
            ))
        });
        let jobs = u32::try_from(bound).context("the database bound is too large for a pool")?;
        let pool = r2d2::Pool::builder()
            .max_size(jobs.saturating_add(HOST_CONNECTIONS))
            .min_idle(Some(0))
            .build(SqliteManager::new(manager))
            .with_context(|| format!("opening {}", path.display()))?;
        pool.get()
            .context("a connection for the schema")?
            .execute_batch(
                "CREATE TABLE results (
                    id INTEGER PRIMARY KEY,
                    agent TEXT NOT NULL,
                    step INTEGER NOT NULL,
                    attempt INTEGER NOT NULL,
                    model TEXT NOT NULL,
                    tokens INTEGER NOT NULL,
                    outcome TEXT NOT NULL,
                    simulated_ms INTEGER NOT NULL
                )",
            )
            .context("creating the results table")?;
        let provider = R2d2SqliteProvider::new(PROVIDER, bound, pool, clock)
            .context("building the results provider")?;
        Ok(Results {
            path: path.to_owned(),
            provider: Arc::new(provider),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The provider's bound as an account: one permit per step that needs the database.
    pub fn gate(&self) -> &Arc<CountingGate> {
        self.provider.admission()
    }

    /// Connections of the pool checked out now.
    pub fn checked_out(&self) -> u64 {
        u64::from(self.provider.checked_out())
    }

    /// A connection under the permit the step's grant holds. Blocks (briefly: the pool is
    /// larger than the bound).
    ///
    /// # Errors
    ///
    /// When the pool gives no connection in time.
    pub fn open(&self) -> anyhow::Result<SqliteHandle> {
        self.provider
            .checkout(false)
            .context("checking out a results connection")
    }

    /// Stores `row` in one transaction, commits, and gives the connection back (on a failure
    /// too: closing rolls back). Blocks.
    ///
    /// # Errors
    ///
    /// When a statement, the commit or the close fails.
    pub fn store(&self, mut handle: SqliteHandle, row: &Row) -> anyhow::Result<()> {
        let written = insert(&mut handle, row);
        let closed = self
            .provider
            .close(&mut handle)
            .context("closing the results connection");
        written.and(closed)
    }

    /// Rows in the `results` table, read on a host connection.
    ///
    /// # Errors
    ///
    /// When the pool or the query fails.
    pub fn count(&self) -> anyhow::Result<u64> {
        let conn = self
            .provider
            .pool()
            .get()
            .context("a connection to count the results")?;
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM results", [], |r| r.get(0))
            .context("counting the results")?;
        Ok(u64::try_from(rows).unwrap_or(0))
    }
}

fn insert(handle: &mut SqliteHandle, row: &Row) -> anyhow::Result<()> {
    handle
        .begin()
        .context("beginning the results transaction")?;
    let conn = handle.connection()?;
    conn.execute(
        "INSERT INTO results (agent, step, attempt, model, tokens, outcome, simulated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        rusqlite::params![
            row.agent,
            i64::try_from(row.step).unwrap_or(i64::MAX),
            row.attempt,
            row.model,
            i64::try_from(row.tokens).unwrap_or(i64::MAX),
            row.outcome,
            i64::try_from(row.at.as_millis()).unwrap_or(i64::MAX),
        ],
    )
    .context("inserting a result")?;
    handle.commit().context("committing the result")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use admission_core::{Amount, Demand, JobContext, Monitor};

    use super::*;

    #[test]
    fn a_stored_row_is_counted_and_its_connection_is_back() {
        let dir = std::env::temp_dir().join(format!("agents-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let monitor = Monitor::new();
        let results = Results::create(&dir.join("r.sqlite"), 2, monitor.clock().clone()).unwrap();
        let mut demand = Demand::new();
        demand.add(results.gate().clone(), Amount::ONE);
        let grant = monitor
            .admit_blocking(demand, &JobContext::new("t"), None)
            .unwrap();
        assert_eq!(results.gate().name(), crate::world::DB);
        let handle = results.open().unwrap();
        assert_eq!(results.checked_out(), 1);
        let row = Row {
            agent: "agent-000".to_owned(),
            step: 0,
            attempt: 0,
            model: "model-a",
            tokens: 10,
            outcome: "ok",
            at: Duration::from_secs(1),
        };
        results.store(handle, &row).unwrap();
        drop(grant);
        assert_eq!((results.count().unwrap(), results.checked_out()), (1, 0));
        assert_eq!(results.gate().in_use(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
