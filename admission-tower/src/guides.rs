//! Guides for the services this layer fronts: the same pages as `docs/guides/` at the
//! workspace root, built here so that they are part of the API docs (and checked with them).

/// Why not chain `governor` and a semaphore: what a chain of single limits leaks and holds
/// hostage, measured in this workspace, and what admitting the whole demand does instead.
#[doc = include_str!("../../docs/guides/why-not-chain.md")]
pub mod why_not_chain {}

/// Running a fleet on Redis: cells, fencing and its limits, fail closed versus fail open,
/// `noeviction`, lease timing, the fleet line, tenant mode, sizing a pool against the bound.
#[doc = include_str!("../../docs/guides/running-a-fleet.md")]
pub mod running_a_fleet {}

/// Fair shares between tenants: the order of a monitor's line under `FairShares`, what it
/// guarantees (the tenants' shares, no banked credit, the head's bound) and what is not built yet.
#[doc = include_str!("../../docs/guides/fair-shares-and-priorities.md")]
pub mod fair_shares_and_priorities {}

/// The driver crates, servers and Rust versions the workspace is tested with.
#[doc = include_str!("../../docs/guides/versions.md")]
pub mod versions {}
