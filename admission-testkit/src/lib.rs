//! The test-kit every admission account and monitor test uses.
//!
//! - [`FakeClock`]: time that moves only on `advance()`, waking monitors parked on deadlines.
//! - [`reference`](mod@reference): two small accounts, one
//!   [`Release`](admission_core::Replenishment::Release) and one
//!   [`Time`](admission_core::Replenishment::Time).
//! - [`contract`]: the account contract suite, one plain function per rule of
//!   [`Account`](admission_core::Account); any implementation runs all of them with
//!   [`contract::run_all`] and a factory of fresh [`contract::Subject`]s.
//! - [`gate_contract`]: the same for a [`Gate`](admission_core::Gate), with a
//!   [`gate_contract::GateSubject`] saying how to press and relieve it.
//! - [`monitor`]: helpers for monitor tests (waiters on threads and tasks, waiting for a queue size).
//! - `strategies` (feature `proptest`): proptest strategies for random demands over random
//!   accounts.
//! - [`services`]: where the real Redis and PostgreSQL of the tests are, or why a test skips.
//! - `redis_servers` (feature `redis-servers`): private `redis-server`s that die with their
//!   caller, and a private six-node Redis Cluster, for tests, benches and examples.
//!
//! Both optional dependencies are default features: `default-features = false` leaves a third
//! party's tests with neither tokio nor proptest.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
pub mod contract;
pub mod gate_contract;
pub mod monitor;
#[cfg(feature = "redis-servers")]
pub mod redis_servers;
pub mod reference;
pub mod services;
#[cfg(feature = "proptest")]
pub mod strategies;

pub use clock::FakeClock;
