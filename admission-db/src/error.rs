//! The typed errors of the database providers: every one names the provider it comes from.
//!
//! A [`DbError`]'s message says what this layer knows, once; the driver's or pool's error it
//! wraps is its [`source`](StdError::source), never repeated in the message. So a report that
//! walks the chain (`{:#}` with anyhow, `tracing`'s `error = &e as &dyn Error`) shows each
//! thing once, and a caller can downcast the source to the driver's error
//! (`tokio_postgres::Error`, `sqlx::Error`, `rusqlite::Error`) for its SQLSTATE or code.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// What a provider or a handle could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The provider's configuration was refused (a bound of zero).
    #[error("db provider `{provider}`: {reason}")]
    Config {
        /// The provider's name.
        provider: String,
        /// What was wrong.
        reason: String,
    },
    /// The pool gave no connection within the checkout timeout while it was full: under a permit
    /// this means the bound exceeds the connections the host's pool reserves for jobs. A pool
    /// that timed out because it could not open a connection reports [`DbError::Connect`]
    /// instead.
    #[error(
        "db provider `{provider}`: no pooled connection within {timeout:?} (pool of at most \
         {max_size}: {size} open, {idle} idle): {message}; the bound must not exceed the \
         connections the pool reserves for jobs"
    )]
    Checkout {
        /// The provider's name.
        provider: String,
        /// Connections the pool holds now, in use or idle.
        size: u32,
        /// Idle connections in the pool now.
        idle: u32,
        /// The pool's configured maximum.
        max_size: u32,
        /// How long the checkout waited.
        timeout: Duration,
        /// The pool's own words.
        message: String,
    },
    /// A pool that counts its waiters (deadpool) gave no connection within the checkout timeout,
    /// waiting for a slot. Under a permit this means the bound exceeds the connections the host's
    /// pool reserves for jobs. A connection the pool could not open is [`DbError::Connect`].
    #[error(
        "db provider `{provider}`: no pooled connection within {timeout:?} (pool of at most \
         {max_size}: {size} open, {available} available, {waiting} waiting): {message}; the \
         bound must not exceed the connections the pool reserves for jobs"
    )]
    PoolTimeout {
        /// The provider's name.
        provider: String,
        /// Connections the pool holds now, in use or idle.
        size: usize,
        /// Connections ready to be handed out now.
        available: usize,
        /// Checkouts waiting for a connection now.
        waiting: usize,
        /// The pool's configured maximum.
        max_size: usize,
        /// How long the checkout waited.
        timeout: Duration,
        /// The pool's own words.
        message: String,
    },
    /// The pool could not open a connection to the database: the server is down, restarting,
    /// refusing connections (PostgreSQL's `57P03`, "the database system is shutting down"), or
    /// the connection's setup failed. Not a matter of pool size: the pool had room.
    ///
    /// The source is the driver's error (`tokio_postgres::Error` for deadpool and r2d2 over
    /// PostgreSQL, `sqlx::Error` for sqlx, `rusqlite::Error` for r2d2 over SQLite), or the
    /// pool's own where the pool reports no driver error (a deadpool create timeout; an r2d2
    /// pool whose provider never held a connection, whose `r2d2::Error` keeps only the text).
    #[error("db provider `{provider}`: {backend} could not connect to the database")]
    Connect {
        /// The provider's name.
        provider: String,
        /// The pool and driver: `deadpool-postgres`, `sqlx-postgres`, `sqlx-sqlite`,
        /// `r2d2-postgres` or `r2d2-sqlite`.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The database refused a statement. The message names the verb; the driver's error is the
    /// source.
    #[error("db provider `{provider}`: {operation} failed")]
    Database {
        /// The provider's name.
        provider: String,
        /// The verb that failed (`begin`, `commit`, ...).
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The handle was closed; only `close` (a no-op) and `rollback` (likewise) are accepted.
    #[error("db provider `{provider}`: the handle is closed, {operation} refused")]
    Closed {
        /// The provider's name.
        provider: String,
        /// The refused verb.
        operation: &'static str,
    },
    /// The handle was aborted; only `rollback` and `close` are accepted.
    #[error("db provider `{provider}`: the handle was aborted, {operation} refused")]
    Aborted {
        /// The provider's name.
        provider: String,
        /// The refused verb.
        operation: &'static str,
    },
    /// `begin` inside a transaction, or `commit` outside one.
    #[error("db provider `{provider}`: {operation} refused: {reason}")]
    Transaction {
        /// The provider's name.
        provider: String,
        /// The refused verb.
        operation: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A handle made by another provider was passed to this one.
    #[error("db provider `{provider}` refused a handle of provider `{owner}`")]
    ForeignHandle {
        /// The refusing provider's name.
        provider: String,
        /// The name of the provider the handle belongs to.
        owner: String,
    },
    /// The job's grant holds fewer permits on the provider's gate than handles were asked.
    #[error(
        "db provider `{provider}`: the grant holds {held} permit(s) on `{gate}`, and {wanted} \
         handle(s) were asked (add one permit per handle to the job's demand)"
    )]
    NoPermit {
        /// The provider's name.
        provider: String,
        /// The provider's gate.
        gate: String,
        /// Permits the grant holds on it.
        held: u64,
        /// Handles asked of the provider.
        wanted: u64,
    },
    /// A job asked for a handle by index that it does not hold, or as another type.
    #[error("db provider `{provider}`: the job's handle {index} is not a `{asked}`")]
    WrongHandle {
        /// The provider's name (empty when the index is out of range).
        provider: String,
        /// The index asked.
        index: usize,
        /// The type asked.
        asked: &'static str,
    },
}

impl DbError {
    /// The name of the provider this error comes from.
    pub fn provider(&self) -> &str {
        match self {
            DbError::Config { provider, .. }
            | DbError::Checkout { provider, .. }
            | DbError::PoolTimeout { provider, .. }
            | DbError::Connect { provider, .. }
            | DbError::Database { provider, .. }
            | DbError::Closed { provider, .. }
            | DbError::Aborted { provider, .. }
            | DbError::Transaction { provider, .. }
            | DbError::ForeignHandle { provider, .. }
            | DbError::NoPermit { provider, .. }
            | DbError::WrongHandle { provider, .. } => provider,
        }
    }

    /// A connection `backend`'s pool of `provider` could not open, for the driver's `source`.
    pub fn connect(
        provider: &str,
        backend: &'static str,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> DbError {
        DbError::Connect {
            provider: provider.to_owned(),
            backend,
            source: source.into(),
        }
    }

    /// A driver error from `operation` on `provider`.
    pub fn database(
        provider: &str,
        operation: &'static str,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> DbError {
        DbError::Database {
            provider: provider.to_owned(),
            operation,
            source: source.into(),
        }
    }
}

/// Several handles' errors from one job-wide step (`commit_all`, `rollback_all`, a close), in
/// the order they happened; never empty.
///
/// Its message lists every error with its causes (`db provider `b`: commit failed: db error:
/// ERROR: ...`), so it has no [`source`](StdError::source) of its own: each error, and its
/// driver error, is reached through [`errors`](DbErrors::errors).
#[derive(Debug)]
pub struct DbErrors(Vec<DbError>);

impl DbErrors {
    /// Wraps `errors`; `None` when there are none.
    pub(crate) fn from_vec(errors: Vec<DbError>) -> Option<DbErrors> {
        (!errors.is_empty()).then_some(DbErrors(errors))
    }

    /// `Ok` for no errors, else all of them.
    pub(crate) fn result(errors: Vec<DbError>) -> Result<(), DbErrors> {
        DbErrors::from_vec(errors).map_or(Ok(()), Err)
    }

    /// The errors, first to last.
    pub fn errors(&self) -> &[DbError] {
        &self.0
    }

    /// The errors, owned.
    pub fn into_vec(self) -> Vec<DbError> {
        self.0
    }
}

impl fmt::Display for DbErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} database error(s)", self.0.len())?;
        for (i, e) in self.0.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            write_chain(f, e)?;
        }
        Ok(())
    }
}

/// Every error's message is in this one's: no source, so a report does not repeat them.
impl StdError for DbErrors {}

/// `error`, then each of its sources, joined by `: `.
fn write_chain(f: &mut fmt::Formatter<'_>, error: &(dyn StdError + 'static)) -> fmt::Result {
    write!(f, "{error}")?;
    let mut source = error.source();
    while let Some(cause) = source {
        write!(f, ": {cause}")?;
        source = cause.source();
    }
    Ok(())
}

/// What the provider registry refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Another instance is registered under the name.
    #[error("a different db provider is already registered as `{name}`")]
    AlreadyRegistered {
        /// The name.
        name: String,
    },
    /// Nothing is registered under the name.
    #[error("no db provider is registered as `{name}` (registered: {registered:?})")]
    NotRegistered {
        /// The name asked.
        name: String,
        /// The names registered, sorted.
        registered: Vec<String>,
    },
    /// The provider registered under the name is of another type.
    #[error("db provider `{name}` is a `{registered}`, not a `{asked}`")]
    WrongType {
        /// The name.
        name: String,
        /// The registered provider's type.
        registered: &'static str,
        /// The type asked for.
        asked: &'static str,
    },
    /// `unregister` was given another instance than the one registered under its name.
    #[error("db provider `{name}` is registered as another instance; not unregistered")]
    NotSameInstance {
        /// The name.
        name: String,
    },
    /// The default provider could not be built.
    #[error(transparent)]
    Provider(#[from] DbError),
}

/// Test helpers shared by the providers' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::error::Error as StdError;

    /// The messages of `error` and of each of its sources, outermost first.
    pub(crate) fn chain(error: &(dyn StdError + 'static)) -> Vec<String> {
        let mut messages = vec![error.to_string()];
        let mut source = error.source();
        while let Some(cause) = source {
            messages.push(cause.to_string());
            source = cause.source();
        }
        messages
    }

    /// Asserts that `error`'s message repeats no message further down its chain (each of this
    /// crate's layers says its own words; its cause is its source), and that no message appears
    /// twice in the chain. (A driver's own error may still quote its cause: sqlx's does.)
    pub(crate) fn assert_says_each_thing_once(error: &(dyn StdError + 'static)) {
        let messages = chain(error);
        for inner in &messages[1..] {
            assert!(
                !messages[0].contains(inner.as_str()),
                "`{}` repeats its cause `{inner}`: {messages:?}",
                messages[0]
            );
        }
        for (i, message) in messages.iter().enumerate() {
            assert!(
                !messages[i + 1..].contains(message),
                "`{message}` appears twice: {messages:?}"
            );
        }
    }

    /// Asserts that `error` is provider `pg`'s [`DbError::Connect`](super::DbError::Connect)
    /// from `backend` for a refused connection: the message says it once, the driver's error
    /// (of type `D`) is the source, and the refused connection is that error's source. Returns
    /// the driver's error.
    #[allow(dead_code)] // Only the PostgreSQL backends' tests call it.
    pub(crate) fn assert_refused_connect<'a, D: StdError + 'static>(
        error: &'a super::DbError,
        backend: &str,
    ) -> &'a D {
        assert_eq!(
            error.to_string(),
            format!("db provider `pg`: {backend} could not connect to the database")
        );
        assert!(
            matches!(error, super::DbError::Connect { provider, backend: b, .. }
                if provider == "pg" && *b == backend),
            "{error:?}"
        );
        let driver = error
            .source()
            .and_then(|s| s.downcast_ref::<D>())
            .expect("the driver's error is the source");
        let io = driver
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the refusal under it");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        assert_says_each_thing_once(error);
        driver
    }

    /// A loopback port nothing listens on (bound, read back, released).
    #[allow(dead_code)] // Only the PostgreSQL backends' tests call it.
    pub(crate) fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::testing::{assert_says_each_thing_once, chain};
    use super::*;

    #[test]
    fn a_connection_failure_says_who_could_not_connect_and_keeps_the_cause_as_its_source() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        let error = DbError::connect("shop", "deadpool-postgres", refused);
        assert_eq!(
            error.to_string(),
            "db provider `shop`: deadpool-postgres could not connect to the database"
        );
        assert_eq!(error.provider(), "shop");
        let source = error.source().unwrap().downcast_ref::<io::Error>().unwrap();
        assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused);
        assert_says_each_thing_once(&error);
    }

    #[test]
    fn a_refused_statement_names_the_verb_once_and_its_cause_once() {
        let error = DbError::database("shop", "commit", "could not serialize access");
        assert_eq!(error.to_string(), "db provider `shop`: commit failed");
        assert_eq!(
            chain(&error),
            [
                "db provider `shop`: commit failed",
                "could not serialize access"
            ]
        );
        assert_says_each_thing_once(&error);
    }

    #[test]
    fn several_errors_are_listed_with_their_causes_and_repeat_none() {
        let errors = DbErrors::from_vec(vec![
            DbError::database("a", "commit", "disk full"),
            DbError::connect("b", "sqlx-postgres", "connection refused"),
        ])
        .unwrap();
        assert_eq!(
            errors.to_string(),
            "2 database error(s): db provider `a`: commit failed: disk full; db provider `b`: \
             sqlx-postgres could not connect to the database: connection refused"
        );
        assert!(errors.source().is_none());
        assert_says_each_thing_once(&errors);
    }
}
