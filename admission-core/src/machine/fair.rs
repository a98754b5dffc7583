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

/// Cost units per unit of a demand's amounts: a weight divides it exactly up to
/// [`FairShares::MAX_WEIGHT`] when it is one of its divisors, and to within a millionth else.
const SCALE: u64 = FairShares::MAX_WEIGHT as u64;

/// The tags' state: the weights and each tenant's finish tag.
pub(crate) struct Tags {
    shares: FairShares,
    /// Each tenant's finish tag (`None`: jobs without a tenant). A tag at or below the virtual
    /// time means the same as none, so such entries are dropped when the map grows past twice the
    /// parked waiters plus 64; if it is still past that, only the tenants furthest ahead are kept
    /// (the parked count plus 32 of them), the others starting at the virtual time again.
    finish: HashMap<Option<Arc<str>>, u64>,
}

impl Tags {
    pub(crate) fn new(shares: FairShares) -> Tags {
        Tags {
            shares,
            finish: HashMap::new(),
        }
    }

    /// The start tag of `demand` for `ctx`'s tenant, with the line's virtual time `line` (`None`:
    /// the line is empty) and `parked` waiters; charges the tenant its cost.
    pub(crate) fn start(
        &mut self,
        demand: &Demand,
        ctx: &JobContext,
        line: Option<u64>,
        parked: usize,
    ) -> u64 {
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
            // keep the tenants furthest ahead, and forgive the rest what little they are ahead.
            let mut furthest: Vec<(Option<Arc<str>>, u64)> = self.finish.drain().collect();
            furthest.sort_unstable_by_key(|&(_, finish)| std::cmp::Reverse(finish));
            furthest.truncate(parked + 32);
            self.finish.extend(furthest);
        }
        self.charge(demand, ctx, virtual_time)
    }

    fn charge(&mut self, demand: &Demand, ctx: &JobContext, virtual_time: u64) -> u64 {
        let tenant = ctx.snapshot().tenant.clone();
        let weight = u64::from(self.shares.weight_of(tenant.as_deref()));
        let cost = cost_of(demand);
        let finish = self.finish.entry(tenant).or_insert(0);
        let start = (*finish).max(virtual_time);
        *finish = start.saturating_add(cost.saturating_mul(SCALE) / weight);
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
    /// charged once while the virtual time stands still stay within twice the parked plus 64.
    #[test]
    fn the_finish_tags_stay_bounded_by_the_parked_waiters() {
        let mut tags = Tags::new(FairShares::new());
        let demand = Demand::new();
        for t in 0..10_000 {
            let ctx = JobContext::new("job").with_tenant(format!("tenant-{t}"));
            tags.start(&demand, &ctx, Some(0), 10);
            assert!(
                tags.finish.len() <= 2 * 10 + 64 + 1,
                "{}",
                tags.finish.len()
            );
        }
    }
}
