//! The spend cap: a workflow's money limit, judged before admission and never enforced by
//! interrupting work.
//!
//! A job is priced before it is admitted; its price is its *reservation*. The [`SpendGate`] of the
//! workflow either grants the reservation or refuses it with a [`SpendRefused`] that carries every
//! number behind the answer. The rule compares the newcomer with what the workflow already spent
//! plus what it has *committed*, the reservations of every sibling that was admitted and has not
//! finished:
//!
//! > refuse iff `spent + committed + requested > cap` (reaching the cap exactly is allowed).
//!
//! Counting the committed reservations is what keeps a fan-out honest: a thousand jobs admitted at
//! once are a thousand reservations on the books before any of them is invoiced, so together they
//! never commit past the cap. What can still pass it is the difference between a reservation and
//! the invoice (a tokenizer that counts differently from the provider, output past what was
//! declared); that difference is bounded per job and does not grow with the number of jobs.
//!
//! The gate is a wall, not a kill switch. Work that holds a reservation runs to the end: cutting a
//! running call would throw away tokens already paid for without saving anything. A
//! [`Reservation`] ends in one of two ways, and both free it:
//! - [`Reservation::settle`] with the actual cost, which becomes spend whatever it is, more or less
//!   than reserved, even if the cap is already crossed;
//! - dropping it unsettled (the job never ran, or was abandoned), which spends nothing.
//!
//! [`CostLedger`] is the implementation: one per workflow, its numbers under one lock. Amounts are
//! [`Money`], integer micro-units, so the books add up exactly.

mod ledger;
mod money;

use serde::Serialize;
use thiserror::Error;

pub use ledger::{CostLedger, LedgerStatus, Reservation, Settlement};
pub use money::Money;

/// What a spend cap answers for a priced job: a [`Reservation`], or a refusal with the numbers.
///
/// Object safe: a workflow's cap is passed around as `Arc<dyn SpendGate>`. Implementations answer
/// at once; a spend gate never waits, because a job refused for money will not fit later by
/// waiting (money comes back only when a sibling's reservation is freed, and a refused job is
/// the orchestrator's signal to stop submitting).
pub trait SpendGate: Send + Sync {
    /// Reserves `amount` against the cap, or refuses without changing anything.
    ///
    /// A zero amount is always granted, even once the cap has been crossed: it adds nothing to
    /// the books. Any other amount is refused iff `spent + committed + amount > cap`.
    ///
    /// # Errors
    ///
    /// [`SpendRefused`] when the reservation would carry the books past the cap.
    fn reserve(&self, amount: Money) -> Result<Reservation, SpendRefused>;

    /// The cap: the most that spent plus committed may reach.
    fn cap(&self) -> Money;

    /// What settled jobs have cost so far (their actual costs, not their reservations).
    fn spent(&self) -> Money;

    /// The sum of the reservations in flight (granted, neither settled nor dropped).
    fn committed(&self) -> Money;
}

/// A reservation refused by a spend cap, with everything that went into the answer.
///
/// The numbers are read in the same critical section as the decision, so
/// `spent + committed + requested > cap` holds for them exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Error)]
#[non_exhaustive]
#[error(
    "spend cap of workflow `{workflow}` refused a reservation of {requested}: spent {spent} + in flight {committed} ({in_flight} {noun}) + this {requested} would pass the cap {cap}",
    noun = reservations_noun(*.in_flight)
)]
pub struct SpendRefused {
    /// The workflow whose cap refused.
    pub workflow: String,
    /// The cap.
    pub cap: Money,
    /// What the workflow had spent.
    pub spent: Money,
    /// The sum of the reservations its siblings held in flight.
    pub committed: Money,
    /// How many reservations were in flight.
    pub in_flight: usize,
    /// The reservation that was refused.
    pub requested: Money,
}

impl SpendRefused {
    /// How far past the cap the reservation would have carried the books (saturating at
    /// `u64::MAX` micros).
    pub fn excess(&self) -> Money {
        let total = u128::from(self.spent.micros())
            + u128::from(self.committed.micros())
            + u128::from(self.requested.micros());
        let excess = total.saturating_sub(u128::from(self.cap.micros()));
        Money::from_micros(u64::try_from(excess).unwrap_or(u64::MAX))
    }
}

/// "reservation" or "reservations", to go after a count.
fn reservations_noun(count: usize) -> &'static str {
    if count == 1 {
        "reservation"
    } else {
        "reservations"
    }
}
