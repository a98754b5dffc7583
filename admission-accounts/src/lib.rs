//! The account families: the limits a [`Demand`](admission_core::Demand) draws from.
//!
//! - [`CountingGate`]: permits that come back on release (connections, concurrency).
//! - [`TokenBucket`]: a model's tokens and requests per minute, clocked, with an adaptive throttle.
//! - [`ElasticWindow`]: a sliding log of calls whose window stretches under pressure, with a
//!   circuit breaker that refuses everyone while an upstream is down.
//! - [`FixedWindow`]: a standalone fixed-window rate limiter that is also an account.
//! - [`MemoryGate`]: admission by memory pressure, drained one job at a time.
//!
//! On top of the families, the provider layer turns them into what an LLM service plugs in:
//! [`ModelSpec`]s (loaded from JSON or TOML), the [`Registry`] that builds a call's whole demand
//! and feeds the upstream's answers back ([`RateLimitInfo`]), and the spend cap
//! ([`spend::CostLedger`]).
//!
//! Every family answers without blocking, reads time only through its injected
//! [`Clock`](admission_core::Clock), and passes the test-kit's account contract suite.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
pub mod counting_gate;
pub mod elastic_window;
pub mod fixed_window;
pub mod memory_gate;
pub mod model_spec;
pub mod provider;
pub mod rate_limit_info;
pub mod spend;
mod status;
pub mod token_bucket;

/// The README's examples, compiled and run as doc tests so they stay true (here, where both the
/// core and the provider layer are in reach).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

pub use config::ConfigError;
pub use counting_gate::{CountingGate, SemaphoreStatus};
pub use elastic_window::{CircuitState, ElasticWindow, ElasticWindowStatus};
pub use fixed_window::{FixedWindow, FixedWindowStatus};
pub use memory_gate::{MemoryGate, MemoryStatus, MemoryZone};
pub use model_spec::{ModelCatalog, ModelSpec, SpecError};
pub use provider::{HttpGate, LimiterFactory, ModelCall, ProviderError, Registry};
pub use rate_limit_info::RateLimitInfo;
pub use spend::{CostLedger, Money, Reservation, SpendGate, SpendRefused};
pub use token_bucket::{TokenBucket, TokenBucketStatus};
