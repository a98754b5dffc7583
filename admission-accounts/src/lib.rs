//! The account families: the limits a [`Demand`](admission_core::Demand) draws from.
//!
//! - [`CountingGate`]: permits that come back on release (connections, concurrency).
//! - [`TokenBucket`]: a model's tokens and requests per minute, clocked, with an adaptive throttle.
//! - [`ElasticWindow`]: a sliding log of calls whose window stretches under pressure, with a
//!   circuit breaker that refuses everyone while an upstream is down.
//! - [`FixedWindow`]: a standalone fixed-window rate limiter that is also an account.
//! - [`MemoryGate`]: admission by memory pressure, drained one job at a time.
//!
//! Every family answers without blocking, reads time only through its injected
//! [`Clock`](admission_core::Clock), and passes the test-kit's account contract suite. The
//! families carry no HTTP header parser and no catalog loader: what turns them into an LLM
//! service's limits lives in `admission-llm`.
//!
//! The crate starts no thread. Its one feature, `tokio` (off by default), lends the fixed
//! window's async wait the timer of the tokio runtime that polls it when no
//! [`Sleeper`](fixed_window::Sleeper) was given; see
//! [`FixedWindow::with_sleeper`](fixed_window::FixedWindow::with_sleeper).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
pub mod counting_gate;
pub mod elastic_window;
pub mod fixed_window;
pub mod memory_gate;
mod status;
pub mod token_bucket;

pub use config::ConfigError;
pub use counting_gate::{CountingGate, SemaphoreStatus};
pub use elastic_window::{CircuitState, ElasticWindow, ElasticWindowStatus};
pub use fixed_window::{FixedWindow, FixedWindowStatus};
pub use memory_gate::{MemoryGate, MemoryStatus, MemoryZone};
pub use token_bucket::{TokenBucket, TokenBucketStatus};
