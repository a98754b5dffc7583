//! The account families: the limits a [`Demand`](admission_core::Demand) draws from.
//!
//! - [`CountingGate`]: permits that come back on release (connections, concurrency).
//! - [`TokenBucket`]: a model's tokens and requests per minute, clocked, with an adaptive throttle.
//! - [`ElasticWindow`]: a sliding log of calls whose window stretches under pressure, with a
//!   circuit breaker that refuses everyone while an upstream is down.
//! - [`FixedWindow`]: a standalone fixed-window rate limiter that is also an account.
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
pub mod rate_limit_info;
pub mod token_bucket;

pub use config::ConfigError;
pub use counting_gate::CountingGate;
pub use elastic_window::ElasticWindow;
pub use fixed_window::FixedWindow;
pub use memory_gate::MemoryGate;
pub use rate_limit_info::RateLimitInfo;
pub use token_bucket::TokenBucket;
