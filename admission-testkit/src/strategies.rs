//! Proptest strategies for random demands over random accounts, for "never overdraw, every waiter
//! is granted" properties.
//!
//! A scenario is two independent draws: a list of accounts ([`accounts`], a random mix of the
//! [`reference`](crate::reference) accounts, each with a random capacity) and a list of jobs
//! ([`demand_shapes`]), each job a list of `(account index, units)` pairs. Shapes are plain data
//! so that they shrink well and print readably; [`demand`] turns one into a [`Demand`].
//!
//! Every account holds at least [`MIN_CAPACITY`] units and [`demand_shapes`] never asks more than
//! that of one account, so any shape drawn for `n` accounts fits any account list of length `n`
//! on its own: no job is refused as never fitting. A job names each account at most once and is
//! sometimes empty (an orchestrator's demand).
//!
//! # Examples
//!
//! ```
//! use admission_testkit::FakeClock;
//! use admission_testkit::strategies::{self, MIN_CAPACITY};
//! use proptest::prelude::*;
//!
//! let clock = FakeClock::new();
//! let scenario = strategies::accounts(clock).prop_flat_map(|accounts| {
//!     let n = accounts.len();
//!     (Just(accounts), strategies::demand_shapes(n))
//! });
//! proptest!(|((accounts, jobs) in scenario)| {
//!     for shape in &jobs {
//!         let demand = strategies::demand(&accounts, shape);
//!         prop_assert_eq!(demand.len(), shape.len());
//!         for entry in demand.entries() {
//!             prop_assert!(entry.amount().primary() <= MIN_CAPACITY);
//!         }
//!     }
//! });
//! ```

use std::sync::Arc;

use admission_core::{Account, Amount, Demand, Replenishment};
use proptest::prelude::*;
use proptest::sample::subsequence;

use crate::FakeClock;
use crate::reference::{Meter, Permits};

/// The least capacity of any account drawn here, and the most a drawn demand asks of one account.
pub const MIN_CAPACITY: u64 = 4;
/// The largest capacity of an account drawn here.
pub const MAX_CAPACITY: u64 = 16;
/// The most accounts in one draw of [`accounts`].
pub const MAX_ACCOUNTS: usize = 4;
/// The most jobs in one draw of [`demand_shapes`].
pub const MAX_JOBS: usize = 12;

/// What one job asks: `(index into the account list, units of the primary dimension)`, each
/// index at most once. Empty for an orchestrator.
pub type Shape = Vec<(usize, u64)>;

/// One account to build: which reference account, and its numbers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AccountSpec {
    /// A [`Permits`] gate ([`Replenishment::Release`]).
    Permits {
        /// Permits in all.
        capacity: u64,
    },
    /// A [`Meter`] ([`Replenishment::Time`]), full when built.
    Meter {
        /// Units when full.
        capacity: u64,
        /// Units refilled per second of the fake clock; at least one, so time always helps.
        per_second: u64,
    },
}

impl AccountSpec {
    /// The most the account holds.
    pub fn capacity(&self) -> u64 {
        match *self {
            AccountSpec::Permits { capacity } | AccountSpec::Meter { capacity, .. } => capacity,
        }
    }

    /// How the account gets its capacity back.
    pub fn replenishment(&self) -> Replenishment {
        match self {
            AccountSpec::Permits { .. } => Replenishment::Release,
            AccountSpec::Meter { .. } => Replenishment::Time,
        }
    }

    /// A fresh account named `name`; a meter reads `clock`.
    pub fn build(&self, name: impl Into<String>, clock: &FakeClock) -> Arc<dyn Account> {
        match *self {
            AccountSpec::Permits { capacity } => Arc::new(Permits::new(name, capacity)),
            AccountSpec::Meter {
                capacity,
                per_second,
            } => Arc::new(Meter::new(name, capacity, per_second, clock.shared())),
        }
    }
}

/// One account spec: a gate or a meter, evenly, with a capacity in
/// [`MIN_CAPACITY`]`..=`[`MAX_CAPACITY`] and a meter's rate between one and its capacity.
pub fn account_spec() -> impl Strategy<Value = AccountSpec> {
    prop_oneof![
        (MIN_CAPACITY..=MAX_CAPACITY).prop_map(|capacity| AccountSpec::Permits { capacity }),
        (MIN_CAPACITY..=MAX_CAPACITY)
            .prop_flat_map(|capacity| (Just(capacity), 1..=capacity))
            .prop_map(|(capacity, per_second)| AccountSpec::Meter {
                capacity,
                per_second
            }),
    ]
}

/// One to [`MAX_ACCOUNTS`] account specs.
pub fn account_specs() -> impl Strategy<Value = Vec<AccountSpec>> {
    prop::collection::vec(account_spec(), 1..=MAX_ACCOUNTS)
}

/// Fresh accounts for `specs`, in order, named `permits-<i>` or `meter-<i>` after their index;
/// the meters read `clock`.
pub fn build(specs: &[AccountSpec], clock: &FakeClock) -> Vec<Arc<dyn Account>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let kind = match spec {
                AccountSpec::Permits { .. } => "permits",
                AccountSpec::Meter { .. } => "meter",
            };
            spec.build(format!("{kind}-{i}"), clock)
        })
        .collect()
}

/// One to [`MAX_ACCOUNTS`] fresh accounts, a random mix of [`Permits`] and [`Meter`]s on `clock`
/// (see [`account_spec`] for the numbers).
///
/// Each generated value builds new accounts, so a shrinking run never sees the counters a
/// previous case left behind.
pub fn accounts(clock: FakeClock) -> impl Strategy<Value = Vec<Arc<dyn Account>>> {
    account_specs().prop_map(move |specs| build(&specs, &clock))
}

/// One job over `n_accounts` accounts: a random subset of the indices, in increasing order, each
/// asking one to [`MIN_CAPACITY`] units; empty about one time in five, and always when
/// `n_accounts` is zero.
pub fn demand_shape(n_accounts: usize) -> BoxedStrategy<Shape> {
    shape_within(vec![MIN_CAPACITY; n_accounts])
}

/// One to [`MAX_JOBS`] jobs over `n_accounts` accounts, each drawn by [`demand_shape`].
pub fn demand_shapes(n_accounts: usize) -> impl Strategy<Value = Vec<Shape>> {
    prop::collection::vec(demand_shape(n_accounts), 1..=MAX_JOBS)
}

/// Like [`demand_shapes`], but each account `i` may be asked anything up to `capacities[i]`
/// units; accounts of capacity zero are never named.
pub fn demand_shapes_within(capacities: &[u64]) -> impl Strategy<Value = Vec<Shape>> + use<> {
    prop::collection::vec(shape_within(capacities.to_vec()), 1..=MAX_JOBS)
}

fn shape_within(capacities: Vec<u64>) -> BoxedStrategy<Shape> {
    let usable: Vec<usize> = (0..capacities.len())
        .filter(|&i| capacities[i] > 0)
        .collect();
    if usable.is_empty() {
        return Just(Vec::new()).boxed();
    }
    let n = usable.len();
    let some = subsequence(usable, 1..=n).prop_flat_map(move |indices| {
        indices
            .into_iter()
            .map(|i| (Just(i), 1..=capacities[i]))
            .collect::<Vec<_>>()
    });
    prop_oneof![1 => Just(Vec::new()), 4 => some].boxed()
}

/// The [`Demand`] a shape describes over `accounts`: `units` of the primary dimension on each
/// named account.
///
/// # Panics
///
/// When the shape names an index past the end of `accounts`.
pub fn demand(accounts: &[Arc<dyn Account>], shape: &[(usize, u64)]) -> Demand {
    let mut demand = Demand::new();
    for &(i, units) in shape {
        demand.add(accounts[i].clone(), Amount::units(units));
    }
    demand
}
