//! [`SemaphoreStatus`]: the record of a counting gate (a semaphore of permits).

use admission_core::{AccountStatus, Category, Instant};
use serde::Serialize;

use crate::status::since_origin;

/// A counting gate's permits at one instant.
///
/// # Examples
///
/// ```
/// use admission_core::{AccountStatus, Instant};
/// use admission_accounts::counting_gate::SemaphoreStatus;
///
/// let status = SemaphoreStatus {
///     name: "http".into(),
///     max_concurrent: 8,
///     available_permits: 5,
///     last_activity: Some(Instant::from_nanos(2_000_000_000)),
/// };
/// assert_eq!(status.active_count(), 3);
/// assert_eq!(status.summary(), "http [semaphore]: 3 of 8 permits in use, 5 available, last activity at 2s");
/// assert_eq!(status.indicator(), None);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SemaphoreStatus {
    /// The account's name.
    pub name: String,
    /// The gate's capacity: how many permits exist.
    pub max_concurrent: u64,
    /// Permits free now.
    pub available_permits: u64,
    /// The last take or give, on the monitor's clock; `None` if there was none yet.
    pub last_activity: Option<Instant>,
}

impl SemaphoreStatus {
    /// Permits held now: the capacity less what is free (zero, never an underflow, if the numbers
    /// disagree).
    pub fn active_count(&self) -> u64 {
        self.max_concurrent.saturating_sub(self.available_permits)
    }
}

impl AccountStatus for SemaphoreStatus {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        crate::CountingGate::CATEGORY
    }

    fn summary(&self) -> String {
        let last = match self.last_activity {
            Some(at) => format!("last activity at {:?}", since_origin(at)),
            None => "no activity yet".to_owned(),
        };
        format!(
            "{} [{}]: {} of {} permits in use, {} available, {last}",
            self.name,
            crate::CountingGate::CATEGORY,
            self.active_count(),
            self.max_concurrent,
            self.available_permits,
        )
    }
}
