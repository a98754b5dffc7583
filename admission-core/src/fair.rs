//! Fair shares between tenants: the configuration a monitor is built with
//! ([`MonitorBuilder::fair_shares`](crate::MonitorBuilder::fair_shares)).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

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
/// model's tokens, a gate's units).
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
        }
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
        let mut weights: Vec<(&str, u32)> = self.weights.iter().map(|(t, w)| (&**t, *w)).collect();
        weights.sort_unstable();
        f.debug_struct("FairShares")
            .field("weights", &weights)
            .field("default_weight", &self.default_weight)
            .finish()
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
}
