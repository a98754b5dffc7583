//! The contract suite's self-test: one planted flaw per provider rule, each caught by its rule.
//! The flawed provider wraps the r2d2 provider and breaks one promise.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use admission_accounts::CountingGate;
use admission_core::{Account, Amount, Ask};
use admission_db::contract::{self, DbSubject, TransactionalSubject};
use admission_db::r2d2_sqlite::{R2d2SqliteProvider, SqliteHandle};
use admission_db::{Aborter, DbError, DbHandle, DbResourceProvider, ProviderId};

use crate::sqlite::{Db, clock, insert};

#[derive(Clone, Copy, PartialEq)]
enum Flaw {
    /// `acquire` takes a permit of its own.
    TakesAPermit,
    /// `close` keeps the connection.
    KeepsTheConnection,
    /// `rollback` commits.
    RollbackCommits,
    /// `close` on the provider accepts any handle.
    AcceptsForeignHandles,
    /// A job holds a second pooled connection besides its handle's.
    JobsHoldTwoConnections,
}

struct Flawed {
    inner: R2d2SqliteProvider,
    flaw: Flaw,
}

struct FlawedHandle {
    inner: SqliteHandle,
    flaw: Flaw,
    closed: bool,
}

impl DbResourceProvider for Flawed {
    fn id(&self) -> &ProviderId {
        self.inner.id()
    }
    fn admission(&self) -> &Arc<CountingGate> {
        self.inner.admission()
    }
    fn acquire(&self, read_only: bool) -> Result<Box<dyn DbHandle>, DbError> {
        if self.flaw == Flaw::TakesAPermit {
            let _ = self.inner.admission().ask(Amount::ONE, Ask::HEAD);
        }
        let inner = self.inner.checkout(read_only)?;
        Ok(Box::new(FlawedHandle {
            inner,
            flaw: self.flaw,
            closed: false,
        }))
    }
    fn close(&self, handle: &mut dyn DbHandle) -> Result<(), DbError> {
        if self.flaw == Flaw::AcceptsForeignHandles {
            return handle.close();
        }
        if handle.provider() != self.id() {
            return Err(DbError::ForeignHandle {
                provider: self.name().to_owned(),
                owner: handle.provider().name().to_owned(),
            });
        }
        handle.close()
    }
}

impl DbHandle for FlawedHandle {
    fn provider(&self) -> &ProviderId {
        self.inner.provider()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn begin(&mut self) -> Result<(), DbError> {
        self.inner.begin()
    }
    fn commit(&mut self) -> Result<(), DbError> {
        self.inner.commit()
    }
    fn await_completion(&mut self) -> Result<(), DbError> {
        self.inner.await_completion()
    }
    fn rollback(&mut self) -> Result<(), DbError> {
        if self.flaw == Flaw::RollbackCommits && self.inner.in_transaction() {
            return self.inner.commit();
        }
        self.inner.rollback()
    }
    fn close(&mut self) -> Result<(), DbError> {
        self.closed = true;
        if self.flaw == Flaw::KeepsTheConnection {
            return Ok(());
        }
        self.inner.close()
    }
    fn aborter(&self) -> Aborter {
        self.inner.aborter()
    }
    fn in_transaction(&self) -> bool {
        self.inner.in_transaction()
    }
    fn is_closed(&self) -> bool {
        self.closed
    }
}

struct Subject {
    db: Db,
    provider: Arc<Flawed>,
}

fn subject(flaw: Flaw, bound: u64) -> Subject {
    let db = Db::new();
    let inner = R2d2SqliteProvider::new("flawed", bound, db.pool(12), clock()).unwrap();
    Subject {
        db,
        provider: Arc::new(Flawed { inner, flaw }),
    }
}

fn sqlite(handle: &mut dyn DbHandle) -> &mut SqliteHandle {
    let flawed = (handle as &mut dyn Any)
        .downcast_mut::<FlawedHandle>()
        .unwrap();
    &mut flawed.inner
}

impl DbSubject for Subject {
    fn provider(&self) -> Arc<dyn DbResourceProvider> {
        self.provider.clone()
    }
    fn checked_out(&self) -> u32 {
        self.provider.inner.checked_out()
    }
    fn job(
        &self,
        handle: &mut dyn DbHandle,
        row: i64,
        commit: bool,
        while_connected: &mut dyn FnMut(),
    ) -> Result<(), DbError> {
        let second = (self.provider.flaw == Flaw::JobsHoldTwoConnections)
            .then(|| self.provider.inner.pool().get().unwrap());
        while_connected();
        drop(second);
        handle.begin()?;
        self.insert(handle, row)?;
        if commit {
            handle.commit()
        } else {
            handle.rollback()
        }
    }
    fn rows(&self) -> Vec<i64> {
        self.db.rows()
    }
}

impl TransactionalSubject for Subject {
    fn insert(&self, handle: &mut dyn DbHandle, row: i64) -> Result<(), DbError> {
        let conn = sqlite(handle).connection()?;
        insert(conn, row)
            .map(drop)
            .map_err(|e| DbError::database("flawed", "insert", e))
    }
}

/// Runs `rule` and returns its panic's message; fails when it does not panic.
fn caught(rule: impl FnOnce()) -> String {
    let panic = catch_unwind(AssertUnwindSafe(rule)).expect_err("the rule missed the flaw");
    match panic.downcast::<String>() {
        Ok(message) => *message,
        Err(panic) => panic
            .downcast::<&str>()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    }
}

#[test]
fn a_provider_whose_acquire_takes_a_permit_is_caught() {
    let message = caught(|| {
        contract::acquire_takes_no_permit_and_close_is_idempotent(&subject(Flaw::TakesAPermit, 2))
    });
    assert!(message.contains("left: 1\n right: 0"), "{message}");
}

#[test]
fn a_provider_whose_close_keeps_the_connection_is_caught() {
    let message = caught(|| {
        contract::a_close_after_abort_still_gives_the_connection_back(&subject(
            Flaw::KeepsTheConnection,
            2,
        ))
    });
    assert!(
        message.contains("left: (true, 1)\n right: (true, 0)"),
        "{message}"
    );
}

#[test]
fn a_provider_whose_rollback_commits_is_caught() {
    let message = caught(|| {
        contract::one_handle_runs_several_transactions(&subject(Flaw::RollbackCommits, 2))
    });
    assert!(
        message.contains("left: [1, 2, 3]\n right: [1, 3]"),
        "{message}"
    );
}

#[test]
fn a_provider_accepting_a_foreign_handle_is_caught() {
    let message = caught(|| {
        contract::a_handle_from_another_provider_is_refused(&subject(
            Flaw::AcceptsForeignHandles,
            2,
        ))
    });
    assert!(
        message.starts_with("another provider's handle was not refused: Ok(())"),
        "{message}"
    );
}

#[test]
fn jobs_holding_more_connections_than_the_bound_are_caught() {
    let message = caught(|| {
        contract::jobs_sharing_a_bound_never_hold_more_connections_than_the_bound(
            &subject(Flaw::JobsHoldTwoConnections, 1),
            4,
        )
    });
    assert_eq!(
        message,
        "the most connections out at once were 2, under a bound of 1"
    );
}
