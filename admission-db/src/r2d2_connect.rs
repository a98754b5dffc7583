//! The r2d2 pool's side of the pooled engine ([`crate::pooled`]), for both r2d2 providers: the
//! checkout, what a checkout that timed out means, and the pool's counts.
//!
//! r2d2 opens connections on threads of its own, retries a failed one until the checkout's
//! timeout, and then reports only the text of its last error (an `r2d2::Error`): the driver's
//! error, with PostgreSQL's SQLSTATE, stays behind. So a checkout that timed out is a connection
//! failure ([`DbError::Connect`]) when r2d2 recorded an error or the pool had room to open a
//! connection, and the provider then opens one connection itself, with the opener its pool's
//! manager gave the connections it handed out, to report the driver's own error. A provider that
//! has handed out no connection yet has no opener: the source is then the `r2d2::Error`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use r2d2::{ManageConnection, Pool, PooledConnection};

use crate::DbError;
use crate::metrics::PoolState;
use crate::pooled::Failure;
use crate::pooled::sealed::Status;

/// r2d2's words for a checkout that timed out with no connection error on record; with one, its
/// message goes on with `: ` and the error's text.
const BARE_TIMEOUT: &str = "timed out waiting for connection";

/// A manager of this crate whose connections keep what opened them: how the provider opens one
/// connection itself to learn why the pool could not.
pub(crate) trait Opens: ManageConnection {
    /// What opens a connection as the pool's manager does.
    type Opener: Send + Sync;

    /// The opener `conn` was opened with.
    fn opener(conn: &Self::Connection) -> &Arc<Self::Opener>;

    /// One connection attempt with `opener`, closed at once.
    fn probe(opener: &Self::Opener) -> Result<(), Self::Error>;
}

/// A connection of `pool` within `timeout`, the opener of the first one `learned`; else a
/// connection failure (r2d2 recorded an error, or the pool had room to open a connection and an
/// attempt with the learned opener fails: its error the source) or a pool timeout.
pub(crate) fn get<M>(
    pool: &Pool<M>,
    learned: &OnceLock<Arc<M::Opener>>,
    timeout: Duration,
) -> Result<PooledConnection<M>, Failure>
where
    M: Opens,
    M::Error: Send + Sync,
{
    let error = match pool.get_timeout(timeout) {
        Ok(conn) => {
            learned.get_or_init(|| M::opener(&conn).clone());
            return Ok(conn);
        }
        Err(error) => error,
    };
    let recorded = error.to_string() != BARE_TIMEOUT;
    let room = pool.state().connections < pool.max_size();
    if !recorded && !room {
        return Err(Failure::Timeout(error.to_string()));
    }
    if let Some(opener) = learned.get()
        && let Err(driver) = M::probe(opener)
    {
        return Err(Failure::Connect(Box::new(driver)));
    }
    if recorded {
        Err(Failure::Connect(Box::new(error)))
    } else {
        Err(Failure::Timeout(error.to_string()))
    }
}

/// Connections of `pool` checked out now: its size less its idle connections.
pub(crate) fn checked_out<M: ManageConnection>(pool: &Pool<M>) -> u32 {
    pool.pool_state().used
}

/// r2d2 does not count its waiters.
impl<M: ManageConnection> crate::pooled::PoolStatus for Pool<M> {}

impl<M: ManageConnection> Status for Pool<M> {
    fn pool_state(&self) -> PoolState {
        let state = self.state();
        PoolState {
            idle: state.idle_connections,
            used: state.connections.saturating_sub(state.idle_connections),
            max: self.max_size(),
            pending: None,
        }
    }

    /// [`DbError::Checkout`], naming the pool's size and idle count.
    fn timeout_error(&self, provider: &str, timeout: Duration, message: String) -> DbError {
        let state = self.state();
        DbError::Checkout {
            provider: provider.to_owned(),
            size: state.connections,
            idle: state.idle_connections,
            max_size: self.max_size(),
            timeout,
            message,
        }
    }
}
