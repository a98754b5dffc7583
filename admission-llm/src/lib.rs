//! The LLM provider layer: what turns the account families into the limits of calls to a model.
//!
//! - [`ModelSpec`]s say what each model endpoint allows and costs; a [`ModelCatalog`] loads them
//!   from JSON or TOML and refuses a bad one naming the model and the field ([`SpecError`]).
//! - The [`Registry`] (over its [`LimiterFactory`]) builds one call's whole
//!   [`Demand`](admission_core::Demand) (HTTP connection, the model's tokens and one request,
//!   its concurrency slot and window) and closes the loop with the upstream's answers.
//! - [`RateLimitInfo`] reads a provider's rate-limit headers; reading never panics.
//! - The spend cap ([`CostLedger`], a [`SpendGate`]) judges a call's price before admission and
//!   never interrupts work; [`Registry::demand_within`] puts it in the call path (a
//!   [`BudgetedCall`] whose [`CallReservation`] settles with the answer's usage, or a
//!   [`CallError::OverBudget`] carrying the numbers).
//!
//! Everything here builds on `admission-accounts` and reads time only through the clock it is
//! given; nothing here blocks but the monitor's own admit.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod budgeted;
pub mod model_spec;
pub mod provider;
pub mod rate_limit_info;
pub mod spend;

/// The README's examples, compiled and run as doc tests so they stay true (here, where the core,
/// the test-kit's reference accounts and the provider layer are all in reach).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

pub use budgeted::{BudgetedCall, CallError, CallReservation};
pub use model_spec::{ModelCatalog, ModelRef, ModelSpec, SpecError};
pub use provider::{HttpGate, LimiterFactory, ModelCall, ProviderError, Registry};
pub use rate_limit_info::RateLimitInfo;
pub use spend::{CostLedger, Money, Reservation, SpendGate, SpendRefused};
