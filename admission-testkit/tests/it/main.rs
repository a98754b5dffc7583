//! The test-kit's integration tests: one binary, one module per part of the kit.
//!
//! - `architecture`: ARCHITECTURE.md's counts (contract rules, loom models) are the code's.
//! - `reference_accounts`: both reference accounts pass every rule of the contract suite.
//! - `self_test`: a deliberately flawed account makes the matching rule fail, so the suite can
//!   fail at all.
//! - `gate_self_test`: the same for the gate suite.
//! - `strategies`: the proptest strategies keep their promises (bounds, distinct accounts,
//!   orchestrators).

mod architecture;
mod gate_self_test;
mod reference_accounts;
mod self_test;
mod strategies;
