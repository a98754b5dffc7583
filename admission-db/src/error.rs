//! The typed errors of the database providers: every one names the provider it comes from.

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
    /// The pool gave no connection within the checkout timeout. Under a permit this means the
    /// bound exceeds the connections the host's pool reserves for jobs.
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
    /// A pool that counts its waiters (deadpool) gave no connection within the checkout timeout.
    /// Under a permit this means the bound exceeds the connections the host's pool reserves for
    /// jobs.
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
    /// The database refused a statement.
    #[error("db provider `{provider}`: {operation} failed: {source}")]
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
            | DbError::Database { provider, .. }
            | DbError::Closed { provider, .. }
            | DbError::Aborted { provider, .. }
            | DbError::Transaction { provider, .. }
            | DbError::ForeignHandle { provider, .. }
            | DbError::NoPermit { provider, .. }
            | DbError::WrongHandle { provider, .. } => provider,
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
            write!(f, "{} {e}", if i == 0 { ":" } else { ";" })?;
        }
        Ok(())
    }
}

impl StdError for DbErrors {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.first().map(|e| e as &(dyn StdError + 'static))
    }
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
