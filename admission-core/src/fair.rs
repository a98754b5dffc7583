//! Fair shares between tenants and priority levels: the configuration a monitor is built with
//! ([`MonitorBuilder::fair_shares`](crate::MonitorBuilder::fair_shares),
//! [`MonitorBuilder::levels`](crate::MonitorBuilder::levels)).

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;

use crate::amount::Amount;

/// The tenants' weights, for a monitor that serves its line in fair shares instead of arrival
/// order.
///
/// A job's tenant is its context's ([`JobContext::with_tenant`](crate::JobContext::with_tenant));
/// a job without one counts as one tenant of its own, "no tenant". A tenant not named here weighs
/// [`default_weight`](FairShares::default_weight) (1 unless set).
///
/// While the line is busy, waiters are served in order of a start tag each gets when it parks
/// (start-time fair queuing): a tenant's job starts where its previous job finished, or at the
/// line's virtual time if that is later, and finishes its cost divided by its tenant's weight
/// later. A tenant that keeps a backlog is served its weight's share of the line's cost; one
/// that asks less than its share is served as it asks; one that was idle starts at the virtual
/// time, so it banks no credit. The head of the line keeps its place and its reservation: a
/// newcomer is placed by its tag among the waiters behind the head, never ahead of it. The tags
/// start again from zero each time the line empties.
///
/// A job's cost is what it asks of its accounts, summed over its entries' primary amounts (a
/// model's tokens, a gate's units); with accounts named scarce ([`scarce`](FairShares::scarce)),
/// what it asks of those alone, so that the tenants share those by their weights whatever else
/// their jobs ask.
///
/// # Examples
///
/// ```
/// use admission_core::{FairShares, Monitor};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let shares = FairShares::new().weight("acme", 3)?.weight("globex", 1)?;
/// assert_eq!(shares.weight_of(Some("acme")), 3);
/// assert_eq!(shares.weight_of(Some("initech")), 1); // not named: the default
/// let monitor = Monitor::builder().fair_shares(shares).build();
/// # drop(monitor);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct FairShares {
    weights: HashMap<Arc<str>, u32>,
    default_weight: u32,
    /// The accounts whose amounts a job's cost counts, by name (empty: every account).
    scarce: Vec<Arc<str>>,
    /// The capacities named ([`FairShares::capacity`]): with any, a job's cost is its dominant
    /// share of them.
    capacities: Vec<(Arc<str>, NonZeroU64)>,
}

/// A weight that cannot be used: zero, or above [`FairShares::MAX_WEIGHT`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the weight of {tenant} must be 1 to {max}, was {weight}")]
pub struct WeightError {
    /// The tenant named (`the default` for the default weight).
    pub tenant: String,
    /// The weight given.
    pub weight: u32,
    /// The largest weight accepted.
    pub max: u32,
}

impl FairShares {
    /// The largest weight: a million to one between two tenants.
    pub const MAX_WEIGHT: u32 = 1_000_000;

    /// Every tenant of weight 1.
    pub fn new() -> FairShares {
        FairShares {
            weights: HashMap::new(),
            default_weight: 1,
            scarce: Vec::new(),
            capacities: Vec::new(),
        }
    }

    /// Counts the amounts asked of the account named `account` (as it names itself) in a job's
    /// cost; once an account is named, the amounts asked of accounts not named count nothing
    /// (a job asking none of them costs the least, one unit). Name the account the tenants
    /// contend for (a model's tokens): a job's cost then weighs only what it takes of it, and
    /// a tenant's jobs on other accounts do not count against its share of this one. Naming
    /// several sums their amounts, whatever their units.
    ///
    /// The counted accounts also keep the line's order among the waiters short on them: a
    /// waiter behind the head that one of them cannot serve keeps its turn there, and the
    /// waiters after it (any tenant's, of any level) take from that account only beside its
    /// amount, as beside the head's. So a tenant of many small jobs does not take, out of
    /// turn, what an earlier waiter of another tenant waits for. A newcomer's first ask, on
    /// arrival, is behind the head alone.
    ///
    /// ```
    /// use admission_core::FairShares;
    ///
    /// let shares = FairShares::new().scarce("gpt-4o").scarce("claude");
    /// assert!(shares.counts("gpt-4o") && !shares.counts("http"));
    /// assert!(FairShares::new().counts("http"), "with none named, every account counts");
    /// ```
    pub fn scarce(mut self, account: impl Into<Arc<str>>) -> FairShares {
        let account = account.into();
        if !self.scarce.contains(&account) {
            self.scarce.push(account);
        }
        self
    }

    /// Names the account `account` scarce with its capacity: the amount that makes one whole
    /// share of it (a model's tokens per minute, a gate's permits). Once any capacity is named a
    /// job's cost is its *dominant share*: the largest fraction of a capacity it asks of any
    /// account that has one (as in dominant resource fair queuing), so tenants share each
    /// account in its own units, and a tenant asking mostly one account is charged for that one,
    /// not for the sum of amounts in unrelated units. Accounts without a capacity count nothing
    /// then, those named only [`scarce`](FairShares::scarce) included. The last capacity named
    /// for an account is the one kept.
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use admission_core::FairShares;
    ///
    /// let per = |n| NonZeroU64::new(n).unwrap();
    /// let shares = FairShares::new().capacity("gpt-4o", per(60_000)).capacity("http", per(8));
    /// assert!(shares.counts("gpt-4o") && shares.counts("http") && !shares.counts("db"));
    /// assert_eq!(shares.capacity_of("http"), Some(per(8)));
    /// ```
    pub fn capacity(mut self, account: impl Into<Arc<str>>, capacity: NonZeroU64) -> FairShares {
        let account = account.into();
        self.capacities.retain(|(a, _)| *a != account);
        self.capacities.push((account.clone(), capacity));
        self.scarce(account)
    }

    /// The capacity named for the account `account`, if any.
    pub fn capacity_of(&self, account: &str) -> Option<NonZeroU64> {
        self.capacities
            .iter()
            .find(|(a, _)| &**a == account)
            .map(|(_, c)| *c)
    }

    /// Whether any capacity is named: a job's cost is then its dominant share.
    pub(crate) fn dominant(&self) -> bool {
        !self.capacities.is_empty()
    }

    /// Whether the amounts asked of the account named `account` count in a job's cost.
    pub fn counts(&self, account: &str) -> bool {
        if self.dominant() {
            return self.capacity_of(account).is_some();
        }
        self.scarce.is_empty() || self.scarce.iter().any(|a| &**a == account)
    }

    /// Gives `tenant` the weight `weight`.
    ///
    /// # Errors
    ///
    /// [`WeightError`] when `weight` is 0 or above [`FairShares::MAX_WEIGHT`].
    pub fn weight(
        mut self,
        tenant: impl Into<Arc<str>>,
        weight: u32,
    ) -> Result<FairShares, WeightError> {
        let tenant = tenant.into();
        check(&tenant, weight)?;
        self.weights.insert(tenant, weight);
        Ok(self)
    }

    /// Gives every tenant not named the weight `weight`.
    ///
    /// # Errors
    ///
    /// [`WeightError`] when `weight` is 0 or above [`FairShares::MAX_WEIGHT`].
    pub fn default_weight(mut self, weight: u32) -> Result<FairShares, WeightError> {
        check("the default", weight)?;
        self.default_weight = weight;
        Ok(self)
    }

    /// The weight of `tenant` (`None`: a job without a tenant).
    pub fn weight_of(&self, tenant: Option<&str>) -> u32 {
        tenant
            .and_then(|t| self.weights.get(t).copied())
            .unwrap_or(self.default_weight)
    }

    /// Every tenant given a weight, with it, in the order of their names.
    ///
    /// ```
    /// use admission_core::FairShares;
    ///
    /// let shares = FairShares::new().weight("globex", 3)?.weight("acme", 1)?;
    /// assert_eq!(shares.iter().collect::<Vec<_>>(), [("acme", 1), ("globex", 3)]);
    /// # Ok::<(), admission_core::WeightError>(())
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (&str, u32)> {
        let mut weights: Vec<(&str, u32)> = self.weights.iter().map(|(t, w)| (&**t, *w)).collect();
        weights.sort_unstable();
        weights.into_iter()
    }

    /// The accounts named [`scarce`](FairShares::scarce), in the order they were named (none:
    /// every account counts).
    pub fn iter_scarce(&self) -> impl Iterator<Item = &str> {
        self.scarce.iter().map(|a| &**a)
    }
}

fn check(tenant: &str, weight: u32) -> Result<(), WeightError> {
    if weight == 0 || weight > FairShares::MAX_WEIGHT {
        return Err(WeightError {
            tenant: tenant.to_owned(),
            weight,
            max: FairShares::MAX_WEIGHT,
        });
    }
    Ok(())
}

impl Default for FairShares {
    fn default() -> FairShares {
        FairShares::new()
    }
}

impl fmt::Debug for FairShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairShares")
            .field("weights", &self.iter().collect::<Vec<_>>())
            .field("default_weight", &self.default_weight)
            .field("scarce", &self.scarce)
            .field("capacities", &self.capacities)
            .finish()
    }
}

/// One priority level: its name, what it reserves of which accounts, and whether it is exempt.
///
/// See [`Levels`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Level {
    name: Arc<str>,
    exempt: bool,
    reserves: Vec<(Arc<str>, Amount)>,
}

impl Level {
    /// A level named `name`, reserving nothing.
    pub fn new(name: impl Into<Arc<str>>) -> Level {
        Level {
            name: name.into(),
            exempt: false,
            reserves: Vec::new(),
        }
    }

    /// Reserves `amount` of the account named `account` for this level: jobs of every other
    /// level leave it aside. On an account whose capacity comes back with time (a token bucket,
    /// a rate window) they always do, which costs them burst, never rate: what this level does
    /// not take flows to them as the account refills. There, while a job of a higher level waits
    /// at the head of the line for the refill, this level's jobs still take from their reserve,
    /// up to the whole of it, and earn it back by `amount / (capacity - amount)` of every grant
    /// to the other levels there: so this level gets `amount / capacity` of the account while
    /// both keep it busy (the capacity is [`Account::capacity`](crate::Account::capacity); an
    /// account that does not name it leaves the head's claim first). That counts dimension by
    /// dimension, and a job asking of a dimension the reserve leaves at zero (a bucket's
    /// requests, say) does not take from the reserve: reserve every dimension the jobs ask. On an account whose capacity comes back
    /// when released (a gate, a pool) they leave it only while a job of this level is parked,
    /// and borrow it otherwise, returning it as their grants are released. A second reserve on
    /// the same account replaces the first.
    pub fn reserve(mut self, account: impl Into<Arc<str>>, amount: Amount) -> Level {
        let account = account.into();
        self.reserves.retain(|(a, _)| *a != account);
        self.reserves.push((account, amount));
        self
    }

    /// Makes the level exempt (health checks, control traffic): its jobs leave nothing aside for
    /// the other levels' reserves. An exempt level comes before every other.
    pub fn exempt(mut self) -> Level {
        self.exempt = true;
        self
    }

    /// The level's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the level is exempt.
    pub fn is_exempt(&self) -> bool {
        self.exempt
    }

    /// What the level reserves, by account name.
    pub fn iter_reserves(&self) -> impl Iterator<Item = (&str, Amount)> {
        self.reserves.iter().map(|(a, amount)| (&**a, *amount))
    }

    /// What the level reserves of the account named `account` (zero: nothing).
    pub fn reserved(&self, account: &str) -> Amount {
        self.reserves
            .iter()
            .find(|(a, _)| &**a == account)
            .map_or(Amount::ZERO, |(_, amount)| *amount)
    }
}

/// Priority levels, highest first, for a monitor whose line serves urgent work before the rest
/// ([`MonitorBuilder::levels`](crate::MonitorBuilder::levels)).
///
/// A job names its level with [`JobContext::with_level`](crate::JobContext::with_level); a job
/// that names none is of the default level (the last declared, unless
/// [`default_level`](Levels::default_level) says otherwise), and one naming a level the monitor
/// does not have is refused at once ([`AdmitError::UnknownLevel`](crate::AdmitError::UnknownLevel)).
///
/// - **Order.** The line keeps its waiters by level: a newcomer stands before every waiter of a
///   lower level, the head included (a lower level's head keeps its reservation once it is first
///   again, and stays first of its level meanwhile), and among the waiters of its own level by
///   its fair-share tag, or in arrival order. A pass asks the waiters in that order, the first
///   that cannot go being the head: a waiter behind the head may still be granted before a
///   waiter ahead of it, of any level, when it fits beside the head's reservation (backfill).
///   Strict priority is this order: no level shares an account with another by weight.
/// - **Reserves.** A level may reserve an amount of an account ([`Level::reserve`]); the other
///   levels' jobs leave it aside, so the level's jobs find it even while a lower level floods
///   the account, and lend it when they do not need it. Reserves name accounts as the accounts
///   name themselves: a name no account has reserves nothing, and accounts sharing a name share
///   the reserve.
/// - **Within a level**, tenants share by their weights when the monitor has
///   [`FairShares`], else in arrival order.
/// - **Exempt** levels ([`Level::exempt`]) ignore the others' reserves.
///
/// # Examples
///
/// ```
/// use admission_core::{Amount, Level, Levels, Monitor};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let levels = Levels::new()
///     .level(Level::new("health").exempt())?
///     .level(Level::new("interactive").reserve("gpt-4o tokens", Amount::units(6_000)))?
///     .level(Level::new("batch"))?;
/// assert_eq!(levels.rank_of(Some("interactive")), Some(1));
/// assert_eq!(levels.rank_of(None), Some(2)); // no level named: the last declared
/// let monitor = Monitor::builder().levels(levels).build();
/// # drop(monitor);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Levels {
    levels: Vec<Level>,
    default: Option<usize>,
}

/// A priority level configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LevelError {
    /// Two levels of one name.
    #[error("the priority level `{name}` is declared twice")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// More levels than a monitor tells apart.
    #[error("at most {max} priority levels; `{name}` would be level {count}")]
    TooMany {
        /// The level that did not fit.
        name: String,
        /// How many it would make.
        count: usize,
        /// The most there can be.
        max: usize,
    },
    /// An exempt level declared after one that is not.
    #[error(
        "the exempt level `{name}` must come before every level that is not exempt (`{after}`)"
    )]
    ExemptAfterOthers {
        /// The exempt level.
        name: String,
        /// The first level that is not exempt.
        after: String,
    },
    /// A level without a name.
    #[error("a priority level's name must not be empty")]
    EmptyName,
    /// A default level that is not declared.
    #[error("no priority level is named `{name}` (declared: {known})")]
    Unknown {
        /// The name given.
        name: String,
        /// The levels declared, comma-separated.
        known: String,
    },
}

impl Levels {
    /// The most levels a monitor tells apart.
    pub const MAX_LEVELS: usize = 16;

    /// No levels yet.
    pub fn new() -> Levels {
        Levels::default()
    }

    /// Declares `level` below every level declared before it.
    ///
    /// # Errors
    ///
    /// [`LevelError`] when the name is empty or taken, when there would be more than
    /// [`Levels::MAX_LEVELS`], or when an exempt level follows one that is not.
    pub fn level(mut self, level: Level) -> Result<Levels, LevelError> {
        if level.name.is_empty() {
            return Err(LevelError::EmptyName);
        }
        if self.levels.iter().any(|l| l.name == level.name) {
            return Err(LevelError::Duplicate {
                name: level.name.to_string(),
            });
        }
        if self.levels.len() == Levels::MAX_LEVELS {
            return Err(LevelError::TooMany {
                name: level.name.to_string(),
                count: self.levels.len() + 1,
                max: Levels::MAX_LEVELS,
            });
        }
        if level.exempt
            && let Some(other) = self.levels.iter().find(|l| !l.exempt)
        {
            return Err(LevelError::ExemptAfterOthers {
                name: level.name.to_string(),
                after: other.name.to_string(),
            });
        }
        self.levels.push(level);
        Ok(self)
    }

    /// Makes `name` the level of jobs that name none.
    ///
    /// # Errors
    ///
    /// [`LevelError::Unknown`] when no level of that name is declared.
    pub fn default_level(mut self, name: &str) -> Result<Levels, LevelError> {
        match self.levels.iter().position(|l| &*l.name == name) {
            Some(rank) => {
                self.default = Some(rank);
                Ok(self)
            }
            None => Err(LevelError::Unknown {
                name: name.to_owned(),
                known: self.known(),
            }),
        }
    }

    /// The levels, highest first.
    pub fn iter(&self) -> impl Iterator<Item = &Level> {
        self.levels.iter()
    }

    /// How many levels there are.
    pub fn len(&self) -> usize {
        self.levels.len()
    }

    /// True when no level is declared.
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// The rank (0 for the highest) of the level `name` names; `None` for a name not declared.
    /// A job naming no level (`None`) is of the default level.
    pub fn rank_of(&self, name: Option<&str>) -> Option<usize> {
        match name {
            Some(name) => self.levels.iter().position(|l| &*l.name == name),
            None => self
                .default
                .or_else(|| self.levels.len().checked_sub(1))
                .or(Some(0)),
        }
    }

    /// The level of rank `rank`.
    pub fn get(&self, rank: usize) -> Option<&Level> {
        self.levels.get(rank)
    }

    /// The levels' names, comma-separated.
    pub(crate) fn known(&self) -> String {
        let names: Vec<&str> = self.levels.iter().map(|l| &*l.name).collect();
        names.join(", ")
    }

    /// True when a level reserves anything.
    pub(crate) fn reserves_any(&self) -> bool {
        self.levels
            .iter()
            .any(|l| l.reserves.iter().any(|(_, amount)| !amount.is_zero()))
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_weight_out_of_range_is_refused_with_the_tenant_and_the_numbers() {
        let error = FairShares::new().weight("acme", 0).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the weight of acme must be 1 to 1000000, was 0"
        );
        let error = FairShares::new().default_weight(1_000_001).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the weight of the default must be 1 to 1000000, was 1000001"
        );
        assert_eq!(FairShares::new().weight_of(None), 1);
    }

    #[test]
    fn a_level_configuration_that_cannot_work_is_refused_naming_the_level() {
        let levels = Levels::new().level(Level::new("a")).unwrap();
        assert_eq!(
            levels
                .clone()
                .level(Level::new("a"))
                .unwrap_err()
                .to_string(),
            "the priority level `a` is declared twice"
        );
        assert_eq!(
            levels
                .clone()
                .level(Level::new("h").exempt())
                .unwrap_err()
                .to_string(),
            "the exempt level `h` must come before every level that is not exempt (`a`)"
        );
        assert_eq!(
            levels.clone().default_level("b").unwrap_err().to_string(),
            "no priority level is named `b` (declared: a)"
        );
        assert_eq!(
            Levels::new().level(Level::new("")).unwrap_err(),
            LevelError::EmptyName
        );
        let full = (0..16).fold(Levels::new(), |l, i| {
            l.level(Level::new(format!("l{i}"))).unwrap()
        });
        assert_eq!(
            full.level(Level::new("l16")).unwrap_err().to_string(),
            "at most 16 priority levels; `l16` would be level 17"
        );
    }

    #[test]
    fn a_job_without_a_level_is_of_the_default_level() {
        let levels = Levels::new()
            .level(Level::new("interactive"))
            .unwrap()
            .level(Level::new("batch"))
            .unwrap();
        assert_eq!(levels.rank_of(None), Some(1));
        assert_eq!(levels.rank_of(Some("interactive")), Some(0));
        assert_eq!(levels.rank_of(Some("nightly")), None);
        let levels = levels.default_level("interactive").unwrap();
        assert_eq!(levels.rank_of(None), Some(0));
        let reserving = Level::new("i")
            .reserve("tokens", Amount::units(5))
            .reserve("tokens", Amount::units(7));
        assert_eq!(reserving.reserved("tokens"), Amount::units(7));
        assert_eq!(reserving.reserved("gate"), Amount::ZERO);
    }
}
