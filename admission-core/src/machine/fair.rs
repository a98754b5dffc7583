//! Start-time fair queuing of the line ([`FairShares`]): the tag a waiter is placed by.
//!
//! Each priority level (a rank of the line) is queued on its own: a job of tenant `t` costing `c`
//! starts at `S = max(V, F[t])` and finishes at `F[t] = S + c * SCALE / weight(t)`; `V`, the
//! level's virtual time, is the smallest start tag of its level still waiting (the line keeps
//! the waiters of a level behind its head in order of their start tags, arrival order among
//! equal tags). So over a busy period
//! each backlogged tenant is served its weight's share of the cost, a tenant whose jobs are
//! granted at once is charged for them all the same, and a tenant that was idle starts at `V`
//! beside the earliest waiters: it banks no credit. Everything starts again from zero when the
//! level has nobody parked. `V` moves only with the line: a waiter granted out of its turn (a backfill)
//! does not lift every other tenant's next start.

use std::collections::HashMap;
use std::sync::Arc;

use crate::account::{AccountRef, Answer, Ask, Replenishment};
use crate::amount::Amount;
use crate::clock::Reading;
use crate::context::JobContext;
use crate::demand::{Demand, Entry};
use crate::error::AdmitError;
use crate::fair::{FairShares, Levels};

use super::ask::{aborted, asked};
use super::line::{MAX_RANKS, Tag};

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
    /// One map per rank (priority level), made when the level first parks a job.
    finish: Vec<HashMap<Option<Arc<str>>, u128>>,
}

impl Tags {
    pub(crate) fn new(shares: FairShares) -> Tags {
        Tags {
            shares,
            finish: Vec::new(),
        }
    }

    /// Whether the amounts asked of `account` count in a job's cost.
    pub(crate) fn counts(&self, account: &AccountRef) -> bool {
        self.shares.counts(account.name())
    }

    /// The start tag of `demand` for `ctx`'s tenant at `rank`, with that level's virtual time
    /// `level` (`None`: nobody of the level is parked), `parked` waiters of the level, and
    /// whether a tenant has any parked at the rank; charges the tenant its cost.
    pub(crate) fn start(
        &mut self,
        demand: &Demand,
        ctx: &JobContext,
        rank: u8,
        level: Option<Tag>,
        parked: usize,
        has_parked: &dyn Fn(&Option<Arc<str>>) -> bool,
    ) -> Tag {
        let rank = usize::from(rank);
        if self.finish.len() <= rank {
            self.finish.resize_with(rank + 1, HashMap::new);
        }
        let weight = u128::from(self.shares.weight_of(ctx.snapshot().tenant.as_deref()));
        let cost = cost_of(demand, &self.shares);
        let finish = &mut self.finish[rank];
        let Some(virtual_time) = level.map(Tag::get) else {
            // A busy period of the level begins: nobody's history matters any more.
            finish.clear();
            return charge(finish, cost, ctx, weight, 0);
        };
        let most = 2 * parked + 64;
        if finish.len() > most {
            finish.retain(|_, finish| *finish > virtual_time);
        }
        if finish.len() > most {
            // Still too many (the virtual time stands while many tenants are served at once):
            // keep every tenant with a waiter parked (its next job must follow them) and the 32
            // others furthest ahead; the rest start at the virtual time again.
            let (mut kept, mut others): (Vec<_>, Vec<_>) =
                finish.drain().partition(|(tenant, _)| has_parked(tenant));
            others.sort_unstable_by_key(|&(_, finish)| std::cmp::Reverse(finish));
            others.truncate(32);
            kept.extend(others);
            finish.extend(kept);
        }
        charge(finish, cost, ctx, weight, virtual_time)
    }
}

/// Charges `ctx`'s tenant `cost` in the finish tags of its level, and returns the job's start
/// tag.
fn charge(
    finish: &mut HashMap<Option<Arc<str>>, u128>,
    cost: u64,
    ctx: &JobContext,
    weight: u128,
    virtual_time: u128,
) -> Tag {
    let finish = finish.entry(ctx.snapshot().tenant.clone()).or_insert(0);
    let start = (*finish).max(virtual_time);
    *finish = start.saturating_add(u128::from(cost) * SCALE / weight);
    Tag::from(start)
}

/// The priority levels as the machine reads them: a job's rank, and what it leaves aside for the
/// other levels' reserves.
#[derive(Clone)]
pub(crate) struct Ranks {
    levels: Levels,
    /// Whether any level reserves anything (else nothing is ever left aside).
    reserving: bool,
    /// Each account some level reserves, by name, with every level's reserve on it (by rank):
    /// one lookup of an account's name per entry, however many levels there are.
    reserves: Vec<(Arc<str>, [Amount; MAX_RANKS])>,
}

impl Ranks {
    pub(crate) fn new(levels: Levels) -> Ranks {
        let mut reserves: Vec<(Arc<str>, [Amount; MAX_RANKS])> = Vec::new();
        for (rank, level) in levels.iter().enumerate().take(MAX_RANKS) {
            for (account, amount) in level.iter_reserves() {
                if amount.is_zero() {
                    continue;
                }
                let at = match reserves.iter().position(|(a, _)| &**a == account) {
                    Some(at) => at,
                    None => {
                        reserves.push((account.into(), [Amount::ZERO; MAX_RANKS]));
                        reserves.len() - 1
                    }
                };
                reserves[at].1[rank] = amount;
            }
        }
        Ranks {
            reserving: levels.reserves_any(),
            levels,
            reserves,
        }
    }

    /// Whether any level reserves anything.
    pub(crate) fn reserving(&self) -> bool {
        self.reserving
    }

    /// The rank of `ctx`'s level, or the refusal of a job naming a level there is not.
    pub(crate) fn rank(&self, ctx: &JobContext) -> Result<u8, AdmitError> {
        let level = ctx.snapshot().level.as_deref();
        match self.levels.rank_of(level) {
            // At most `Levels::MAX_LEVELS` (16) levels.
            Some(rank) => Ok(rank as u8),
            None => Err(AdmitError::UnknownLevel {
                job: ctx.id(),
                level: ctx.snapshot().level.clone().unwrap_or_default(),
                known: self.levels.known(),
            }),
        }
    }

    /// Whether the level of `rank` reserves anything: when its last waiter leaves, the others
    /// may borrow again.
    pub(crate) fn lends(&self, rank: u8) -> bool {
        self.reserving
            && self
                .levels
                .get(usize::from(rank))
                .is_some_and(|level| level.iter_reserves().any(|(_, amount)| !amount.is_zero()))
    }

    /// The refusal of a demand of `rank` that can never fit once the reserves the other levels
    /// always keep (on accounts refilled by time) are left aside: each such account asked, as
    /// the head would be, for the demand's amount and the reserves together, taking nothing. The
    /// refusal names the account and both amounts; an account that panics is the job's
    /// `Aborted`, as on every other ask.
    pub(crate) fn never_beside_reserves(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        rank: u8,
        now: &Reading<'_>,
    ) -> Option<AdmitError> {
        if !self.reserving {
            return None;
        }
        let parked = [0; MAX_RANKS];
        demand.entries().iter().find_map(|entry| {
            let account = entry.account();
            let aside = self.aside(rank, account, &parked, true);
            if aside.is_zero() {
                return None;
            }
            let both = entry.amount().saturating_add(aside);
            match asked(account, both, Ask::HEAD.look().with(now)) {
                Ok(Answer::Never(refusal)) => {
                    let message = format!(
                        "{} can never fit beside the {} reserved for other priority levels; \
                         asked for both, the account says: {}",
                        entry.amount(),
                        aside,
                        refusal.message()
                    );
                    Some(AdmitError::Refused {
                        account: account.name().to_owned(),
                        refusal: refusal.with_message(message),
                    })
                }
                Ok(_) => None,
                Err(panic) => Some(aborted(account, ctx, &*panic)),
            }
        })
    }

    /// Whether a head of `rank`, short on `entry`'s account, claims it: it does unless it would
    /// fit there leaving aside only the reserves kept always, that is unless only the reserve a
    /// waiting level may borrow stands in its way. Such an account is left to the waiters behind
    /// (they leave the head's amount aside): else a waiter of the reserving level, which only
    /// the head keeps from its reserve, and the head, which waits for that level to stop
    /// waiting, would wait for each other. Asked with a look, as the head.
    pub(crate) fn claims(&self, rank: u8, entry: &Entry, now: &Reading<'_>) -> bool {
        let account = entry.account();
        let kept = self.aside(rank, account, &[0; MAX_RANKS], true);
        let ask = Ask::HEAD.also_leaving(kept).look().with(now);
        !matches!(asked(account, entry.amount(), ask), Ok(Answer::Taken))
    }

    /// Whether a waiter of `rank` behind a head of another level that claims the account of
    /// `entry` may take its amount there out of its own level's reserve (a *dip*): the account
    /// is refilled by time and names its capacity, and on every dimension the amount asks of
    /// (a bucket's tokens, its requests) the level reserves some, and what it dipped there, less
    /// what it earned back since, leaves room for this amount. Such a waiter asks the account
    /// leaving aside the other levels' reserves, not the head's amount; see [`Dips`].
    pub(crate) fn may_dip(&self, dips: &Dips, rank: u8, entry: &Entry) -> bool {
        let Some((at, _)) = self.dip_table(entry.account()) else {
            return false;
        };
        let reserve = self.reserves[at].1[usize::from(rank)];
        if reserve.is_zero() {
            return false;
        }
        let spent = dips.spent.get(at).map(|spent| &spent[usize::from(rank)]);
        (0..Amount::DIMENSIONS).all(|d| {
            let asked = u128::from(entry.amount().get(d)) * Dips::ONE;
            let spent = spent.map_or(0, |spent| spent[d]);
            asked == 0 || spent.saturating_add(asked) <= u128::from(reserve.get(d)) * Dips::ONE
        })
    }

    /// Whether some level may take from its reserve on `account` while a head of another level
    /// is short on it (see [`Ranks::may_dip`]).
    pub(crate) fn dippable(&self, account: &AccountRef) -> bool {
        self.dip_table(account).is_some()
    }

    /// For an account some level may dip into (refilled by time, reserved by a level, naming
    /// its capacity): its place in the reserves table, and its capacity.
    fn dip_table(&self, account: &AccountRef) -> Option<(usize, Amount)> {
        if !self.reserving || account.replenishment() != Replenishment::Time {
            return None;
        }
        let name = account.name();
        let at = self.reserves.iter().position(|(a, _)| &**a == name)?;
        Some((at, account.capacity()?))
    }

    /// Books a grant of `entries` to a job of `rank`: on each account refilled by time that a
    /// level reserves, an entry `dipped` says was taken out of the level's reserve adds to what
    /// that level has spent there, and every other entry earns the other levels that reserve
    /// the account back their share of it, dimension by dimension: `amount * reserve /
    /// (capacity - reserve)` (the whole reserve when the capacity is no more than it, or the
    /// product past 128 bits). So while several levels want the account, a level gets `reserve
    /// / capacity` of what it grants, and a level that waits for nothing there has its reserve
    /// whole again once the others were granted the rest. True when a level earned anything
    /// back (a waiter may dip now that could not before).
    pub(crate) fn book(
        &self,
        dips: &mut Dips,
        rank: u8,
        entries: &[Entry],
        dipped: impl Fn(usize) -> bool,
    ) -> bool {
        if !self.reserving {
            return false;
        }
        let mut earned = false;
        for (i, entry) in entries.iter().enumerate() {
            let Some((at, capacity)) = self.dip_table(entry.account()) else {
                continue;
            };
            if dips.spent.len() <= at {
                dips.spent
                    .resize(self.reserves.len(), [[0; Amount::DIMENSIONS]; MAX_RANKS]);
            }
            let spent = &mut dips.spent[at];
            if dipped(i) {
                for (d, spent) in spent[usize::from(rank)].iter_mut().enumerate() {
                    *spent = spent.saturating_add(u128::from(entry.amount().get(d)) * Dips::ONE);
                }
                dips.any = true;
                continue;
            }
            for (other, reserve) in self.reserves[at].1.iter().enumerate() {
                if other == usize::from(rank) || reserve.is_zero() {
                    continue;
                }
                for (d, spent) in spent[other].iter_mut().enumerate() {
                    let (amount, reserve) = (entry.amount().get(d), reserve.get(d));
                    if *spent == 0 || amount == 0 || reserve == 0 {
                        continue;
                    }
                    let back = capacity
                        .get(d)
                        .checked_sub(reserve)
                        .filter(|&rest| rest > 0)
                        .and_then(|rest| {
                            let product = u128::from(amount)
                                .checked_mul(u128::from(reserve))?
                                .checked_mul(Dips::ONE)?;
                            Some(product / u128::from(rest))
                        });
                    *spent = back.map_or(0, |back| spent.saturating_sub(back));
                    earned = true;
                }
            }
        }
        earned
    }

    /// Whether the level of `rank` reserves some of `account`.
    pub(crate) fn reserves(&self, rank: u8, account: &AccountRef) -> bool {
        let name = account.name();
        self.reserves
            .iter()
            .find(|(a, _)| &**a == name)
            .is_some_and(|(_, reserved)| !reserved[usize::from(rank)].is_zero())
    }

    /// What a job of `rank` leaves aside on `account` only for waiting levels that lend it (the
    /// reserves given back when released, of levels with a waiter `parked`).
    pub(crate) fn lendable(
        &self,
        rank: u8,
        account: &AccountRef,
        parked: &[u32; MAX_RANKS],
    ) -> Amount {
        self.aside(rank, account, parked, false)
            .saturating_sub(self.aside(rank, account, &[0; MAX_RANKS], true))
    }

    /// What a job of `rank` leaves aside on `account` for the other levels: each one's reserve
    /// on it, always on an account refilled by time, and on one refilled by releases while a
    /// waiter of that level is parked (`parked`, by rank). Nothing for an exempt level. With
    /// `always_only`, only what is always left aside (what decides whether a demand can ever fit).
    pub(crate) fn aside(
        &self,
        rank: u8,
        account: &AccountRef,
        parked: &[u32; MAX_RANKS],
        always_only: bool,
    ) -> Amount {
        if !self.reserving
            || self
                .levels
                .get(usize::from(rank))
                .is_none_or(|level| level.is_exempt())
        {
            return Amount::ZERO;
        }
        let name = account.name();
        let Some((_, reserved)) = self.reserves.iter().find(|(a, _)| &**a == name) else {
            return Amount::ZERO;
        };
        let kept = account.replenishment() == Replenishment::Time;
        let mut aside = Amount::ZERO;
        for (other, reserved) in reserved.iter().enumerate() {
            if other == usize::from(rank) || reserved.is_zero() {
                continue;
            }
            if kept || (!always_only && parked[other] > 0) {
                aside = aside.saturating_add(*reserved);
            }
        }
        aside
    }
}

/// What each level has taken out of its own reserve on an account refilled by time while a
/// head of another level claimed that account (its *dips*), less what it earned back as the
/// others were granted there ([`Ranks::book`]): a level dips only as far as its reserve, so a
/// head that waits for the refill is delayed by at most each other level's reserve (and its
/// share of what higher levels are granted meanwhile). In units of 2^-16 of an amount, by
/// account (as [`Ranks`] lists them), rank and dimension. Forgotten when the line empties.
#[derive(Default)]
pub(crate) struct Dips {
    spent: Vec<[[u128; Amount::DIMENSIONS]; MAX_RANKS]>,
    /// Whether anything was ever dipped since the last [`Dips::forget`].
    any: bool,
}

impl Dips {
    /// One unit of an amount.
    const ONE: u128 = 1 << 16;

    /// Forgets every dip: a busy period of the line ended.
    pub(crate) fn forget(&mut self) {
        if std::mem::take(&mut self.any) {
            self.spent.clear();
        }
    }
}

/// Cost units of a whole capacity, in a dominant share ([`FairShares::capacity`]).
const WHOLE: u128 = 1 << 20;

/// What a demand costs, at least 1: the primary amounts of its entries on the accounts `shares`
/// counts, summed; or, with capacities named, its dominant share: the largest of its amounts
/// over their account's capacity, in `WHOLE`s (rounded up, so any amount costs something).
pub(crate) fn cost_of(demand: &Demand, shares: &FairShares) -> u64 {
    let entries = demand.entries().iter();
    if shares.dominant() {
        return entries
            .filter_map(|e| {
                let capacity = shares.capacity_of(e.account().name())?;
                let share =
                    (u128::from(e.amount().primary()) * WHOLE).div_ceil(u128::from(capacity.get()));
                Some(u64::try_from(share).unwrap_or(u64::MAX))
            })
            .max()
            .unwrap_or(0)
            .max(1);
    }
    entries
        .filter(|e| shares.counts(e.account().name()))
        .fold(0u64, |sum, e| sum.saturating_add(e.amount().primary()))
        .max(1)
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    /// An account that is only a name (a cost reads nothing else).
    struct Named(&'static str);

    impl crate::Account for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn category(&self) -> crate::Category {
            crate::Category::custom("named")
        }
        fn replenishment(&self) -> Replenishment {
            Replenishment::Release
        }
        fn ask(&self, _: Amount, _: Ask) -> Answer {
            Answer::Taken
        }
        fn give(&self, _: Amount) {}
        fn status(&self) -> Box<dyn crate::AccountStatus> {
            unreachable!("a cost reads no status")
        }
        fn on_capacity_change(&self, _: Option<crate::WakeFn>) {}
    }

    /// A demand's cost: summed over the counted accounts, or with capacities its dominant
    /// share, in 2^20ths of a whole capacity, rounded up.
    #[test]
    fn a_demands_cost_is_the_sum_or_with_capacities_its_dominant_share() {
        let tokens: AccountRef = Arc::new(Named("tokens"));
        let http: AccountRef = Arc::new(Named("http"));
        let db: AccountRef = Arc::new(Named("db"));
        let demand = Demand::new()
            .with(tokens.clone(), Amount::units(300))
            .with(http.clone(), Amount::units(2))
            .with(db.clone(), Amount::units(1));
        assert_eq!(cost_of(&demand, &FairShares::new()), 303);
        assert_eq!(cost_of(&demand, &FairShares::new().scarce("tokens")), 300);
        let per = |n| std::num::NonZeroU64::new(n).expect("not 0");
        // 300 of 1,000 tokens is 0.3 of a share, 2 of 8 permits 0.25: the tokens dominate.
        let shares = FairShares::new()
            .capacity("tokens", per(1_000))
            .capacity("http", per(8));
        assert_eq!(cost_of(&demand, &shares), (3u64 << 20).div_ceil(10));
        // 2 of 4 permits, 0.5, dominates; `db`, named scarce without a capacity, counts nothing.
        let shares = shares.capacity("http", per(4)).scarce("db");
        assert_eq!(cost_of(&demand, &shares), 1 << 19);
        // A demand on none of them costs the least.
        let other = Demand::new().with(db, Amount::units(50));
        assert_eq!(cost_of(&other, &shares), 1);
        // An amount far beyond the capacity saturates, never wraps.
        let huge = Demand::new().with(tokens, Amount::units(u64::MAX));
        assert_eq!(cost_of(&huge, &shares), u64::MAX);
    }

    /// Tenants never seen again do not pile up: with 10 parked, the tags of 10,000 tenants each
    /// charged once while the virtual time stands still stay within twice the parked plus 65 (the
    /// bound is kept before each charge), and a tenant with a waiter parked keeps its tag.
    #[test]
    fn the_finish_tags_stay_bounded_by_the_parked_waiters() {
        let mut tags = Tags::new(FairShares::new());
        let demand = Demand::new();
        for t in 0..10_000 {
            let ctx = JobContext::new("job").with_tenant(format!("tenant-{t}"));
            tags.start(&demand, &ctx, 0, Some(Tag::ZERO), 10, &|tenant| {
                tenant.as_deref() == Some("tenant-0")
            });
            assert!(
                tags.finish[0].len() <= 2 * 10 + 64 + 1,
                "{}",
                tags.finish[0].len()
            );
        }
        assert!(
            tags.finish[0].contains_key(&Some("tenant-0".into())),
            "a tenant with a waiter parked keeps its tag"
        );
    }
}
