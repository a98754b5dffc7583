//! [`CostLedger`]: one workflow's books (cap, spent, committed) and the [`Reservation`]s drawn on
//! them.
//!
//! The numbers live in one `Books` record under one `parking_lot` mutex. The check and the
//! debit of a reservation are one critical section, as are the free and the spend of a
//! settlement, so no interleaving of reserves, settles and drops can make the ledger disagree
//! with itself or commit past the cap. The critical sections are a few integer operations; the
//! lock is never held across anything else (no logging, no allocation).
//!
//! A reservation holds an `Arc` to the ledger's shared state, not a borrow of the ledger, so it
//! can travel with its job to any thread and free itself when dropped, even after every handle
//! to the ledger is gone.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use super::{Money, SpendGate, SpendRefused, reservations_noun};

/// The books of one workflow: a cap, what was spent, and the reservations in flight.
///
/// [`CostLedger::new`] returns an `Arc<CostLedger>`, which is what the orchestrator keeps and
/// what coerces to `Arc<dyn SpendGate>`. The reservations it grants share the ledger's state
/// through their own `Arc`, so a [`Reservation`] needs no lifetime and frees itself on drop.
///
/// The cap is fixed at construction. A cap of zero refuses every non-zero reservation.
///
/// # Fairness
///
/// None is needed: the ledger is not a queue. Reservations are judged in the order they take the
/// lock, and a refusal is final for that job (nothing waits for money to come back).
///
/// Nothing here waits. A reservation dropped at any point (a cancelled future that owned it, a
/// panic unwinding past it) frees what it held and spends nothing.
///
/// # Panics
///
/// Never. Sums are exact below `u64::MAX` micros and saturate there; a reservation that would
/// overflow the books is refused, since it would certainly pass the cap.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
///
/// use admission_llm::spend::{CostLedger, Money, SpendGate};
///
/// let ledger = CostLedger::new("nightly-review", Money::from_units(1));
///
/// // Two jobs priced at 0.4 each are admitted; together they commit 0.8 of the cap.
/// let first = ledger.reserve(Money::from_micros(400_000)).expect("0.4 of 1.0 fits");
/// let second = ledger.reserve(Money::from_micros(400_000)).expect("0.8 of 1.0 fits");
///
/// // A third at 0.3 would carry spent + in flight past the cap: refused, with the numbers.
/// let refused = ledger.reserve(Money::from_micros(300_000)).unwrap_err();
/// assert_eq!(
///     refused.to_string(),
///     "spend cap of workflow `nightly-review` refused a reservation of 0.300000: \
///      spent 0.000000 + in flight 0.800000 (2 reservations) + this 0.300000 would pass the cap 1.000000",
/// );
///
/// // The first job finishes cheaper than reserved; the difference is free again.
/// let settlement = first.settle(Money::from_micros(250_000));
/// assert_eq!(settlement.under(), Money::from_micros(150_000));
/// assert_eq!(ledger.spent(), Money::from_micros(250_000));
/// assert_eq!(ledger.committed(), Money::from_micros(400_000));
///
/// // The second job never ran: dropping its reservation frees it and spends nothing.
/// drop(second);
/// assert_eq!(ledger.committed(), Money::ZERO);
///
/// // The cap is a trait object for whoever prices jobs.
/// let gate: Arc<dyn SpendGate> = ledger.clone();
/// assert!(gate.reserve(Money::from_micros(750_000)).is_ok());
/// ```
pub struct CostLedger {
    /// The state the ledger shares with every reservation it granted.
    shared: Arc<Shared>,
}

/// What a ledger and its reservations share.
struct Shared {
    /// The workflow the cap belongs to, as named in refusals and logs.
    workflow: String,
    /// The cap; fixed for the ledger's life.
    cap: Money,
    /// The running numbers; only touched under this lock, and always all of them together.
    books: Mutex<Books>,
}

/// The running numbers of a ledger.
///
/// Invariant (under the lock): `committed` is the sum of the amounts of the `in_flight`
/// reservations, and a non-zero reservation is only added while `spent + committed` stays within
/// the cap.
#[derive(Clone, Copy, Default)]
struct Books {
    /// The actual costs of every settled reservation, saturating.
    spent: Money,
    /// The sum of the reservations in flight. Never above the cap.
    committed: Money,
    /// How many reservations are in flight (zero-amount ones included).
    in_flight: usize,
    /// How many reservations were settled (dropped ones not included).
    settled: u64,
}

impl CostLedger {
    /// A ledger for `workflow` with nothing spent and nothing in flight.
    pub fn new(workflow: impl Into<String>, cap: Money) -> Arc<CostLedger> {
        Arc::new(CostLedger {
            shared: Arc::new(Shared {
                workflow: workflow.into(),
                cap,
                books: Mutex::new(Books::default()),
            }),
        })
    }

    /// The workflow this ledger keeps the books of.
    pub fn workflow(&self) -> &str {
        &self.shared.workflow
    }

    /// How many reservations are in flight: granted, neither settled nor dropped.
    pub fn in_flight(&self) -> usize {
        self.shared.books.lock().in_flight
    }

    /// How many reservations have been settled since the ledger was made.
    pub fn settled(&self) -> u64 {
        self.shared.books.lock().settled
    }

    /// A snapshot of the ledger's numbers, all read in one critical section.
    pub fn status(&self) -> LedgerStatus {
        let books = *self.shared.books.lock();
        LedgerStatus {
            workflow: self.shared.workflow.clone(),
            cap: self.shared.cap,
            spent: books.spent,
            committed: books.committed,
            in_flight: books.in_flight,
        }
    }
}

impl SpendGate for CostLedger {
    fn reserve(&self, amount: Money) -> Result<Reservation, SpendRefused> {
        let shared = &self.shared;
        let refused = {
            let mut books = shared.books.lock();
            // Exact in 128 bits: a sum past u64::MAX is past any cap, so it is refused.
            let total = u128::from(books.spent.micros())
                + u128::from(books.committed.micros())
                + u128::from(amount.micros());
            if amount == Money::ZERO || total <= u128::from(shared.cap.micros()) {
                books.committed = books.committed.saturating_add(amount);
                books.in_flight += 1;
                None
            } else {
                Some(*books)
            }
        };
        match refused {
            None => Ok(Reservation {
                shared: Some(Arc::clone(shared)),
                amount,
            }),
            Some(books) => {
                let refusal = SpendRefused {
                    workflow: shared.workflow.clone(),
                    cap: shared.cap,
                    spent: books.spent,
                    committed: books.committed,
                    in_flight: books.in_flight,
                    requested: amount,
                };
                tracing::info!(
                    workflow = %refusal.workflow,
                    cap = %refusal.cap,
                    spent = %refusal.spent,
                    committed = %refusal.committed,
                    in_flight = refusal.in_flight,
                    requested = %refusal.requested,
                    "spend cap refused a reservation",
                );
                Err(refusal)
            }
        }
    }

    fn cap(&self) -> Money {
        self.shared.cap
    }

    fn spent(&self) -> Money {
        self.shared.books.lock().spent
    }

    fn committed(&self) -> Money {
        self.shared.books.lock().committed
    }
}

impl fmt::Debug for CostLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.status();
        f.debug_struct("CostLedger")
            .field("workflow", &status.workflow)
            .field("cap", &status.cap)
            .field("spent", &status.spent)
            .field("committed", &status.committed)
            .field("in_flight", &status.in_flight)
            .finish()
    }
}

/// The money one admitted, unfinished job holds against its workflow's cap.
///
/// An RAII value like an admission grant: it is counted in the ledger's `committed` from the
/// moment it is granted until it is [settled](Reservation::settle) or dropped, whichever comes
/// first, exactly once.
///
/// # Dropping
///
/// Dropping it anywhere frees it and spends nothing; that is the right outcome for a job that
/// never reached its provider. A job that did reach it should settle with what it cost.
#[must_use = "a reservation dropped at once frees the money it reserved; hold it while the job runs and settle it"]
pub struct Reservation {
    /// The ledger's state; `None` once the reservation has been settled (so drop frees nothing).
    shared: Option<Arc<Shared>>,
    /// What the job reserved.
    amount: Money,
}

impl Reservation {
    /// What the job reserved.
    pub fn amount(&self) -> Money {
        self.amount
    }

    /// The job finished and cost `actual`: the reservation is freed and `actual` becomes spend,
    /// in one step.
    ///
    /// `actual` is recorded exactly whether it is below, equal to or above the reservation, and
    /// even when it carries the workflow past its cap: the cap refuses new work, it never
    /// disputes the cost of work already done.
    pub fn settle(mut self, actual: Money) -> Settlement {
        let settlement = Settlement {
            reserved: self.amount,
            actual,
        };
        if let Some(shared) = self.shared.take() {
            {
                let mut books = shared.books.lock();
                books.committed = books.committed.saturating_sub(self.amount);
                books.in_flight = books.in_flight.saturating_sub(1);
                books.spent = books.spent.saturating_add(actual);
                books.settled = books.settled.saturating_add(1);
            }
            if actual > self.amount {
                tracing::debug!(
                    workflow = %shared.workflow,
                    reserved = %self.amount,
                    actual = %actual,
                    over = %settlement.over(),
                    "settled above the reservation",
                );
            }
        }
        settlement
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let mut books = shared.books.lock();
            books.committed = books.committed.saturating_sub(self.amount);
            books.in_flight = books.in_flight.saturating_sub(1);
        }
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let workflow = self.shared.as_ref().map(|shared| shared.workflow.as_str());
        f.debug_struct("Reservation")
            .field("workflow", &workflow)
            .field("amount", &self.amount)
            .finish()
    }
}

/// What a settled reservation recorded: the amount reserved and the actual cost that became
/// spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Settlement {
    /// What the job had reserved (and no longer holds).
    pub reserved: Money,
    /// What the job cost; added to the ledger's spend.
    pub actual: Money,
}

impl Settlement {
    /// How much the actual cost exceeded the reservation (zero if it did not).
    pub fn over(&self) -> Money {
        self.actual.saturating_sub(self.reserved)
    }

    /// How much of the reservation went unspent (zero if the cost reached it).
    pub fn under(&self) -> Money {
        self.reserved.saturating_sub(self.actual)
    }
}

/// A snapshot of a ledger's numbers, read in one critical section.
///
/// # Examples
///
/// ```
/// use admission_llm::spend::{CostLedger, LedgerStatus, Money, SpendGate};
///
/// let ledger = CostLedger::new("w", Money::from_units(2));
/// let _held = ledger.reserve(Money::from_micros(500_000)).unwrap();
/// assert_eq!(
///     ledger.status().summary(),
///     "workflow `w`: spent 0.000000 + in flight 0.500000 (1 reservation) of cap 2.000000, 1.500000 left",
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerStatus {
    /// The workflow.
    pub workflow: String,
    /// The cap.
    pub cap: Money,
    /// What settled jobs cost.
    pub spent: Money,
    /// The sum of the reservations in flight.
    pub committed: Money,
    /// How many reservations are in flight.
    pub in_flight: usize,
}

impl LedgerStatus {
    /// What a new reservation could still take: the cap less spent and committed, or zero.
    pub fn remaining(&self) -> Money {
        self.cap
            .saturating_sub(self.spent)
            .saturating_sub(self.committed)
    }

    /// One line naming every number.
    pub fn summary(&self) -> String {
        format!(
            "workflow `{}`: spent {} + in flight {} ({} {}) of cap {}, {} left",
            self.workflow,
            self.spent,
            self.committed,
            self.in_flight,
            reservations_noun(self.in_flight),
            self.cap,
            self.remaining(),
        )
    }
}
