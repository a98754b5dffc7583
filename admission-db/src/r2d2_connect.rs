//! What an r2d2 checkout that timed out means, for the r2d2 providers.
//!
//! r2d2 opens connections on threads of its own, retries a failed one until the checkout's
//! timeout, and then reports only the text of its last error (an `r2d2::Error`): the driver's
//! error, with PostgreSQL's SQLSTATE, stays behind. So a checkout that timed out is a connection
//! failure ([`DbError::Connect`]) when r2d2 recorded an error or the pool had room to open a
//! connection, and the provider then opens one connection itself, with the opener its pool's
//! manager gave the connections it handed out, to report the driver's own error. A provider that
//! has handed out no connection yet has no opener: the source is then the `r2d2::Error`.

use std::error::Error as StdError;

use crate::DbError;

/// r2d2's words for a checkout that timed out with no connection error on record; with one, its
/// message goes on with `: ` and the error's text.
const BARE_TIMEOUT: &str = "timed out waiting for connection";

/// [`DbError::Connect`] for a checkout of `provider` that ended in `error` when that was a
/// connection failure (r2d2 recorded an error, or `room` says the pool could have opened a
/// connection and `probe`, one connection attempt, fails); else `error` back, a pool timeout.
pub(crate) fn connect_failure<E>(
    provider: &str,
    backend: &'static str,
    error: r2d2::Error,
    room: bool,
    probe: Option<impl FnOnce() -> Result<(), E>>,
) -> Result<DbError, r2d2::Error>
where
    E: StdError + Send + Sync + 'static,
{
    let recorded = error.to_string() != BARE_TIMEOUT;
    if !recorded && !room {
        return Err(error);
    }
    if let Some(probe) = probe
        && let Err(driver) = probe()
    {
        return Ok(DbError::connect(provider, backend, driver));
    }
    if recorded {
        Ok(DbError::connect(provider, backend, error))
    } else {
        Err(error)
    }
}
