//! Start-time fair queuing of the line ([`FairShares`]): the tag a waiter is placed by.
//!
//! A job of tenant `t` costing `c` starts at `S = max(V, F[t])` and finishes at
//! `F[t] = S + c * SCALE / weight(t)`; `V`, the line's virtual time, is the smallest start tag
//! still waiting (the head's or the one right behind it: the line keeps the waiters behind its
//! head in order of their start tags, arrival order among equal tags). So over a busy period
//! each backlogged tenant is served its weight's share of the cost, a tenant whose jobs are
//! granted at once is charged for them all the same, and a tenant that was idle starts at `V`
//! beside the earliest waiters: it banks no credit. Everything starts again from zero when the
//! line empties. `V` moves only with the line: a waiter granted out of its turn (a backfill)
//! does not lift every other tenant's next start.

use std::collections::HashMap;
use std::sync::Arc;

use crate::context::JobContext;
use crate::demand::Demand;
use crate::fair::FairShares;

/// Cost units per unit of a demand's amounts: a weight divides it exactly when it is one of its
/// divisors, and to within a millionth of a unit else.
const SCALE: u128 = FairShares::MAX_WEIGHT as u128;

/// The tags' state: the weights and each tenant's finish tag.
pub(crate) struct Tags {
    shares: FairShares,
    /// Each tenant's finish tag (`None`: jobs without a tenant), in 128 bits: a million cost units
    /// per unit asked, so a tenant asking a gibibyte a job for a year of busy line stays far from
    /// the end. A tag at or below the virtual time means the same as none, so such entries are
    /// dropped when the map grows past twice the parked waiters plus 64; if it is still past
    /// that, only the tenants with a waiter parked and the 32 others furthest ahead are kept, the
    /// rest starting at the virtual time again.
    finish: HashMap<Option<Arc<str>>, u128>,
}

impl Tags {
    pub(crate) fn new(shares: FairShares) -> Tags {
        Tags {
            shares,
            finish: HashMap::new(),
        }
    }

    /// The start tag of `demand` for `ctx`'s tenant, with the line's virtual time `line` (`None`:
    /// the line is empty), `parked` waiters, and whether a tenant has any parked; charges the
    /// tenant its cost.
    pub(crate) fn start(
        &mut self,
        demand: &Demand,
        ctx: &JobContext,
        line: Option<u128>,
        parked: usize,
        has_parked: &dyn Fn(&Option<Arc<str>>) -> bool,
    ) -> u128 {
        let Some(virtual_time) = line else {
            // A busy period begins: nobody's history matters any more.
            self.finish.clear();
            return self.charge(demand, ctx, 0);
        };
        let most = 2 * parked + 64;
        if self.finish.len() > most {
            self.finish.retain(|_, finish| *finish > virtual_time);
        }
        if self.finish.len() > most {
            // Still too many (the virtual time stands while many tenants are served at once):
            // keep every tenant with a waiter parked (its next job must follow them) and the 32
            // others furthest ahead; the rest start at the virtual time again.
            let (mut kept, mut others): (Vec<_>, Vec<_>) = self
                .finish
                .drain()
                .partition(|(tenant, _)| has_parked(tenant));
            others.sort_unstable_by_key(|&(_, finish)| std::cmp::Reverse(finish));
            others.truncate(32);
            kept.extend(others);
            self.finish.extend(kept);
        }
        self.charge(demand, ctx, virtual_time)
    }

    fn charge(&mut self, demand: &Demand, ctx: &JobContext, virtual_time: u128) -> u128 {
        let tenant = ctx.snapshot().tenant.clone();
        let weight = u128::from(self.shares.weight_of(tenant.as_deref()));
        let cost = cost_of(demand);
        let finish = self.finish.entry(tenant).or_insert(0);
        let start = (*finish).max(virtual_time);
        *finish = start.saturating_add(u128::from(cost) * SCALE / weight);
        start
    }
}

/// What a demand costs: its entries' primary amounts summed, at least 1.
pub(crate) fn cost_of(demand: &Demand) -> u64 {
    demand
        .entries()
        .iter()
        .fold(0u64, |sum, e| sum.saturating_add(e.amount().primary()))
        .max(1)
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    /// Tenants never seen again do not pile up: with 10 parked, the tags of 10,000 tenants each
    /// charged once while the virtual time stands still stay within twice the parked plus 65 (the
    /// bound is kept before each charge), and a tenant with a waiter parked keeps its tag.
    #[test]
    fn the_finish_tags_stay_bounded_by_the_parked_waiters() {
        let mut tags = Tags::new(FairShares::new());
        let demand = Demand::new();
        for t in 0..10_000 {
            let ctx = JobContext::new("job").with_tenant(format!("tenant-{t}"));
            tags.start(&demand, &ctx, Some(0), 10, &|tenant| {
                tenant.as_deref() == Some("tenant-0")
            });
            assert!(
                tags.finish.len() <= 2 * 10 + 64 + 1,
                "{}",
                tags.finish.len()
            );
        }
        assert!(
            tags.finish.contains_key(&Some("tenant-0".into())),
            "a tenant with a waiter parked keeps its tag"
        );
    }
}
