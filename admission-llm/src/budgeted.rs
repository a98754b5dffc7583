//! The spend cap in the call path: [`Registry::demand_within`] prices a call between building its
//! demand and admitting it.
//!
//! The price is the call's input tokens at the spec's input price plus its declared most output
//! at the output price ([`ModelSpec::price`]). The workflow's [`SpendGate`] answers at once:
//! - an unaffordable call is refused with [`CallError::OverBudget`], a [`SpendRefused`] carrying
//!   the price (`requested`), what was spent, what siblings hold in flight (`committed`), the cap
//!   and the workflow, before the call waits for anything (no limiter is asked, nothing is
//!   queued);
//! - an affordable call comes back as a [`BudgetedCall`]: the [`ModelCall`] to admit and a
//!   [`CallReservation`] counted against the cap while the call is in flight. Settle it with what
//!   the answer says was really used ([`CallReservation::settle`]); the difference goes back. A
//!   reservation dropped unsettled (the call was never made: refused by the monitor, timed out,
//!   cancelled) frees everything and spends nothing.
//!
//! # Examples
//!
//! ```
//! use admission_llm::model_spec::ModelSpec;
//! use admission_llm::provider::Registry;
//! use admission_llm::spend::{CostLedger, Money, SpendGate};
//! use admission_llm::CallError;
//! use admission_testkit::FakeClock;
//!
//! let registry = Registry::new(FakeClock::new().shared());
//! registry
//!     .register(ModelSpec::new("sonnet", "claude-sonnet-4-5", 400_000).with_prices(3_000_000, 15_000_000))
//!     .unwrap();
//! let budget = CostLedger::new("nightly-review", Money::from_micros(20_000));
//!
//! // 1,200 in at 3 per million + 800 out at 15 per million: 0.015600 reserved.
//! let call = registry.demand_within("sonnet", 1_200, 800, &*budget).unwrap();
//! assert_eq!(call.reservation.amount(), Money::from_micros(15_600));
//! assert_eq!(budget.committed(), Money::from_micros(15_600));
//!
//! // A second such call would pass the cap: refused at once, with the numbers.
//! let Err(CallError::OverBudget(refused)) = registry.demand_within("sonnet", 1_200, 800, &*budget)
//! else { panic!("expected a refusal") };
//! assert_eq!((refused.requested, refused.committed), (Money::from_micros(15_600), Money::from_micros(15_600)));
//!
//! // The answer says 1,200 in and 300 out: 0.008100 is spent, 0.007500 goes back.
//! let (demand, reservation) = (call.call.demand, call.reservation);
//! drop(demand); // (admitted and sent here)
//! let settlement = reservation.settle(1_200, 300);
//! assert_eq!(settlement.under(), Money::from_micros(7_500));
//! assert_eq!((budget.spent(), budget.committed()), (Money::from_micros(8_100), Money::ZERO));
//! ```

use std::fmt;
use std::sync::Arc;

use crate::model_spec::ModelSpec;
use crate::provider::{ModelCall, ProviderError, Registry};
use crate::spend::{Money, Reservation, Settlement, SpendGate, SpendRefused};

/// Why [`Registry::demand_within`] built no call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The model is unknown or its limiters cannot be built (as [`Registry::demand_for`]).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The workflow's cap refused the call's price; nothing was reserved and nothing waited.
    #[error(transparent)]
    OverBudget(#[from] SpendRefused),
}

impl CallError {
    /// The spend refusal, when the cap refused the call.
    pub fn over_budget(&self) -> Option<&SpendRefused> {
        match self {
            CallError::OverBudget(refused) => Some(refused),
            CallError::Provider(_) => None,
        }
    }
}

/// A priced, affordable call: its demand and the reservation it holds against the workflow's cap.
///
/// The two parts are separate fields so the demand can be moved into an admission while the
/// reservation stays with the job until the answer settles it.
#[derive(Debug)]
#[must_use = "dropping the call frees its reservation at once"]
pub struct BudgetedCall {
    /// The call's demand, spec, tokens and price, as [`Registry::demand_for`] builds them.
    pub call: ModelCall,
    /// The call's price, counted against the cap until settled or dropped.
    pub reservation: CallReservation,
}

impl BudgetedCall {
    /// Settles the reservation with the tokens the answer says were used; see
    /// [`CallReservation::settle`].
    pub fn settle(self, input_tokens: u64, output_tokens: u64) -> Settlement {
        self.reservation.settle(input_tokens, output_tokens)
    }
}

/// A call's [`Reservation`] with the spec that prices its settlement.
///
/// `Send + Sync`; it holds no borrow, so it travels with its job. Dropped unsettled it frees the
/// reservation and spends nothing.
#[must_use = "dropping the reservation frees it at once; settle it with the answer's usage"]
pub struct CallReservation {
    spec: Arc<ModelSpec>,
    reservation: Reservation,
}

impl CallReservation {
    /// The amount reserved: the call's price.
    pub fn amount(&self) -> Money {
        self.reservation.amount()
    }

    /// The model the call is for.
    pub fn model(&self) -> &str {
        &self.spec.id
    }

    /// The answer said `input_tokens` in and `output_tokens` out were billed: that, at the spec's
    /// prices, becomes spend, and the rest of the reservation goes back (or the overshoot is
    /// recorded, if the answer used more than was declared).
    pub fn settle(self, input_tokens: u64, output_tokens: u64) -> Settlement {
        let actual = self.spec.price(input_tokens, output_tokens);
        self.reservation.settle(actual)
    }

    /// Settles with an amount already priced (a provider that invoices in money).
    pub fn settle_amount(self, actual: Money) -> Settlement {
        self.reservation.settle(actual)
    }
}

impl fmt::Debug for CallReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallReservation")
            .field("model", &self.spec.id)
            .field("reservation", &self.reservation)
            .finish()
    }
}

impl Registry {
    /// [`demand_for`](Registry::demand_for) within a workflow's spend cap: prices the call
    /// (`input_tokens` at the input price plus `max_output_tokens` at the output price), reserves
    /// the price on `budget`, then builds the demand.
    ///
    /// The cap is judged before anything waits: a refusal comes back at once, and an affordable
    /// call's reservation is part of the returned [`BudgetedCall`], so it is counted while the
    /// call waits and runs and freed if the call is never made.
    ///
    /// # Errors
    ///
    /// [`CallError::OverBudget`] when `spent + committed + price > cap`, with those numbers;
    /// [`CallError::Provider`] as for [`demand_for`](Registry::demand_for) (an unknown model is
    /// reported before the cap is asked). Either way nothing stays reserved.
    pub fn demand_within(
        &self,
        model: &str,
        input_tokens: u64,
        max_output_tokens: u64,
        budget: &dyn SpendGate,
    ) -> Result<BudgetedCall, CallError> {
        let spec = self.spec(model)?;
        let reservation = budget.reserve(spec.price(input_tokens, max_output_tokens))?;
        // A failure here drops the reservation: nothing stays reserved.
        let call = self.demand_for(model, input_tokens, max_output_tokens)?;
        Ok(BudgetedCall {
            call,
            reservation: CallReservation { spec, reservation },
        })
    }
}
