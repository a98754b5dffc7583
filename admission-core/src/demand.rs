//! [`Demand`]: everything one job needs, declared up front and granted as one.

use std::fmt;
use std::sync::Arc;

use crate::account::{AccountRef, account_key};
use crate::amount::Amount;
use crate::error::AdmitError;

/// One account of a demand and the amount asked of it.
#[derive(Clone)]
pub struct Entry {
    account: AccountRef,
    amount: Amount,
}

impl Entry {
    /// The account drawn from.
    pub fn account(&self) -> &AccountRef {
        &self.account
    }

    /// The amount asked of it.
    pub fn amount(&self) -> Amount {
        self.amount
    }
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("account", &self.account.name())
            .field("amount", &self.amount)
            .finish()
    }
}

/// Everything a job needs: amounts on accounts, granted whole or not at all.
///
/// Adding to an account the demand already names merges the amounts (two handles to the same
/// account are the same entry); entries keep the order in which their account was first added.
/// A demand with no entries is an orchestrator's: it still takes its place in the line but never
/// meets the gate.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_accounts::token_bucket::TokenBucketConfig;
/// use admission_accounts::{CountingGate, TokenBucket};
/// use admission_core::{Amount, Demand};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let http = Arc::new(CountingGate::on_system_clock("http", 8)?);
/// let config = TokenBucketConfig::new(60_000, 60);
/// let tokens = Arc::new(TokenBucket::on_system_clock("model", config)?);
/// let demand = Demand::new()
///     .with(http.clone(), Amount::ONE)
///     .with(tokens, Amount::pair(400, 1))
///     .with(http, Amount::ONE);
/// assert_eq!(demand.len(), 2);
/// assert_eq!(demand.entries()[0].amount(), Amount::units(2));
/// # Ok(())
/// # }
/// ```
///
/// A demand admitted again and again need not be cloned each time:
/// [`Monitor::try_admit`](crate::Monitor::try_admit) borrows it. Where one is (for
/// [`Monitor::admit`](crate::Monitor::admit), which keeps it while the job waits), a clone shares
/// its entries: one reference count, no allocation. Adding to a demand whose entries a clone
/// shares copies them first, so a clone never sees another's change.
#[derive(Clone, Default)]
pub struct Demand {
    /// Shared, not copied: a clone (one per admission, for a job that admits the same demand
    /// again and again) takes one reference count, where a vector of its own would allocate and
    /// take one on every account. `None` until the first entry. Adding to a demand whose
    /// entries another clone shares copies them first, so a clone never sees another's change.
    entries: Option<Arc<Vec<Entry>>>,
    /// True once an entry's account requires a capability: only then is there anything for
    /// [`Demand::check_requirements`] to check, which every admission calls.
    requires: bool,
}

impl Demand {
    /// An empty demand (an orchestrator's, until something is added).
    pub fn new() -> Demand {
        Demand::default()
    }

    /// Adds `amount` on `account`, merging into the entry for that account if there is one.
    pub fn add(&mut self, account: AccountRef, amount: Amount) -> &mut Demand {
        let key = account_key(&account);
        let entries = Arc::make_mut(self.entries.get_or_insert_default());
        match entries.iter_mut().find(|e| account_key(&e.account) == key) {
            Some(entry) => entry.amount += amount,
            None => {
                self.requires |= account.requires().is_some();
                entries.push(Entry { account, amount });
            }
        }
        self
    }

    /// [`Demand::add`] by value, for building a demand in one expression.
    pub fn with(mut self, account: AccountRef, amount: Amount) -> Demand {
        self.add(account, amount);
        self
    }

    /// The entries, in first-add order.
    pub fn entries(&self) -> &[Entry] {
        self.entries.as_deref().map_or(&[], Vec::as_slice)
    }

    /// The entries as this demand shares them with its clones (`None`: no entry yet).
    pub(crate) fn shared_entries(&self) -> Option<&Arc<Vec<Entry>>> {
        self.entries.as_ref()
    }

    /// True for an orchestrator's demand: nothing on any account.
    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// The number of distinct accounts.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// The amount asked of `account`, zero when the demand does not name it.
    pub fn amount_on(&self, account: &AccountRef) -> Amount {
        let key = account_key(account);
        self.entries()
            .iter()
            .find(|e| account_key(&e.account) == key)
            .map_or(Amount::ZERO, |e| e.amount)
    }

    /// Checks that every capability an account requires is provided by another account here.
    ///
    /// # Errors
    ///
    /// [`AdmitError::Unmet`] naming the first account whose requirement is not met.
    #[inline]
    pub fn check_requirements(&self) -> Result<(), AdmitError> {
        if self.requires {
            self.check_each_requirement()
        } else {
            Ok(())
        }
    }

    /// [`Demand::check_requirements`] for a demand with an account that requires something.
    #[inline(never)]
    fn check_each_requirement(&self) -> Result<(), AdmitError> {
        let entries = self.entries();
        for entry in entries {
            if let Some(requires) = entry.account.requires() {
                let met = entries
                    .iter()
                    .any(|other| other.account.provides() == Some(requires));
                if !met {
                    return Err(AdmitError::Unmet {
                        account: entry.account.name().to_owned(),
                        requires,
                    });
                }
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Demand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.entries()).finish()
    }
}
