//! The provider contract: [`DbResourceProvider`] (the bound as an account, `acquire` under a held
//! permit) and [`DbHandle`] (one connection's transaction verbs).

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use admission_accounts::CountingGate;
use admission_core::Clock;

use crate::DbError;

static NEXT_PROVIDER: AtomicU64 = AtomicU64::new(1);

/// A provider's identity: its name and a process-unique serial, carried by every handle it makes
/// so that a handle of another provider (even one of the same name) is recognized.
#[derive(Clone)]
pub struct ProviderId {
    name: Arc<str>,
    serial: u64,
}

impl ProviderId {
    /// A fresh identity named `name`.
    pub fn new(name: impl Into<Arc<str>>) -> ProviderId {
        ProviderId {
            name: name.into(),
            serial: NEXT_PROVIDER.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the provider's gate: `db:<name>`.
    pub fn gate_name(&self) -> String {
        format!("db:{}", self.name)
    }

    /// The provider's gate: `db:<name>` with `bound` permits on `clock`.
    ///
    /// # Errors
    ///
    /// [`DbError::Config`] for a bound of zero.
    pub fn gate(&self, bound: u64, clock: Arc<dyn Clock>) -> Result<Arc<CountingGate>, DbError> {
        CountingGate::new(self.gate_name(), bound, clock)
            .map(Arc::new)
            .map_err(|e| DbError::Config {
                provider: self.name().to_owned(),
                reason: e.to_string(),
            })
    }
}

impl PartialEq for ProviderId {
    fn eq(&self, other: &ProviderId) -> bool {
        self.serial == other.serial
    }
}

impl Eq for ProviderId {}

impl fmt::Debug for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.name, self.serial)
    }
}

/// A database whose connections a job may hold only under an admission permit.
///
/// - [`name`](DbResourceProvider::name) is stable for the provider's life.
/// - [`admission`](DbResourceProvider::admission) is the bound, as an account: a
///   [`CountingGate`] named `db:<name>` with a positive capacity. A demand of more than the
///   capacity is refused at once by the gate; permits come back by release only. The bound must
///   not exceed the connections the host's pool reserves for jobs: the pool's size is the host's,
///   and no bound is ever inferred from it.
/// - [`acquire`](DbResourceProvider::acquire) is called by a job that already holds one permit on
///   that gate for each handle (in its [`Grant`](admission_core::Grant)); it materializes the
///   handle and never waits for a permit. The handle never holds the permit.
pub trait DbResourceProvider: Any + Send + Sync {
    /// The provider's identity; its name is stable.
    fn id(&self) -> &ProviderId;

    /// The provider's name.
    fn name(&self) -> &str {
        self.id().name()
    }

    /// The provider's bound: the gate a job's demand takes one permit on per handle.
    fn admission(&self) -> &Arc<CountingGate>;

    /// A handle under a permit the job already holds; in autocommit, read-only if asked.
    ///
    /// # Errors
    ///
    /// [`DbError::Checkout`] (or [`DbError::PoolTimeout`]) when the pool, full, gives no
    /// connection in time; [`DbError::Connect`] when it cannot open one; or a driver error.
    fn acquire(&self, read_only: bool) -> Result<Box<dyn DbHandle>, DbError>;

    /// Closes `handle` ([`DbHandle::close`]) if this provider made it.
    ///
    /// # Errors
    ///
    /// [`DbError::ForeignHandle`] for another provider's handle (left untouched), else what the
    /// close reports.
    fn close(&self, handle: &mut dyn DbHandle) -> Result<(), DbError> {
        if handle.provider() != self.id() {
            return Err(DbError::ForeignHandle {
                provider: self.name().to_owned(),
                owner: handle.provider().name().to_owned(),
            });
        }
        handle.close()
    }
}

/// One connection held under a permit, and its transaction state.
///
/// Outside a transaction the connection is in autocommit; [`begin`](DbHandle::begin) opens one,
/// [`commit`](DbHandle::commit) or [`rollback`](DbHandle::rollback) ends it, and several may run
/// one after another on the same handle. [`close`](DbHandle::close) gives the connection back.
/// Dropping a handle closes it: a connection never goes back to its pool inside a transaction.
pub trait DbHandle: Any + Send {
    /// The provider that made this handle.
    fn provider(&self) -> &ProviderId;

    /// Whether the handle was acquired read-only.
    fn read_only(&self) -> bool;

    /// Opens a transaction.
    ///
    /// # Errors
    ///
    /// Inside a transaction, on a closed or aborted handle, or a driver error.
    fn begin(&mut self) -> Result<(), DbError>;

    /// Commits the open transaction; the connection is in autocommit again.
    ///
    /// # Errors
    ///
    /// Outside a transaction, on a closed or aborted handle, or a driver error.
    fn commit(&mut self) -> Result<(), DbError>;

    /// Returns once the last commit is visible to other connections. A no-op (documented as
    /// such by the implementation) where a commit is visible as soon as it returns.
    ///
    /// # Errors
    ///
    /// A driver error.
    fn await_completion(&mut self) -> Result<(), DbError>;

    /// Rolls back the open transaction; nothing to do outside one, on a closed handle or twice.
    ///
    /// # Errors
    ///
    /// A driver error.
    fn rollback(&mut self) -> Result<(), DbError>;

    /// Rolls back, restores the autocommit and read-only state the pool handed out, gives the
    /// connection back, then reports the first failure. Idempotent; after an
    /// [`abort`](DbHandle::abort) it still gives the connection back.
    ///
    /// # Errors
    ///
    /// The first failure of the steps above; the connection went back (or, when it could not be
    /// brought out of its transaction, was discarded) all the same.
    fn close(&mut self) -> Result<(), DbError>;

    /// What aborts this handle from another thread.
    fn aborter(&self) -> Aborter;

    /// Interrupts what runs on the connection and refuses every later verb but `rollback` and
    /// `close`. Never blocks; idempotent.
    fn abort(&self) {
        self.aborter().abort();
    }

    /// Whether a transaction is open.
    fn in_transaction(&self) -> bool;

    /// Whether the handle was closed.
    fn is_closed(&self) -> bool;
}

/// Aborts one handle from any thread, without blocking ([`DbHandle::abort`]).
#[derive(Clone)]
pub struct Aborter(Arc<dyn Fn() + Send + Sync>);

impl Aborter {
    /// An aborter that calls `abort`, which must never block and may be called many times.
    pub fn new(abort: impl Fn() + Send + Sync + 'static) -> Aborter {
        Aborter(Arc::new(abort))
    }

    /// An aborter with nothing to interrupt.
    pub fn noop() -> Aborter {
        Aborter::new(|| {})
    }

    /// Aborts the handle.
    pub fn abort(&self) {
        (self.0)();
    }
}

impl fmt::Debug for Aborter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Aborter")
    }
}
