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
    /// time means the same as none, so such entries are dropped when the map grows: it holds
    /// about twice the parked waiters' tenants at most, plus 64.
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
        if self.finish.len() > 2 * parked + 64 {
            self.finish.retain(|_, finish| *finish > virtual_time);
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
