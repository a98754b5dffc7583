//! [`Shared`]: what one provider instance, its leases and its background tasks share: the cell's
//! script client, the renewal schedule, the events reader's waiters, and the give-backs in
//! flight. It owns the renewal task (closed when the last provider clone and the last lease are
//! gone) and the events reader.

use std::sync::Arc;

use crate::pending::Pending;
use crate::renewal::Renewals;
use crate::script::Cell;
use crate::wake::Wakeups;

pub(crate) struct Shared {
    pub(crate) cell: Arc<Cell>,
    pub(crate) renewals: Arc<Renewals>,
    pub(crate) wakeups: Wakeups,
    pub(crate) pending: Arc<Pending>,
    /// The runtime `connect` ran on: renewals and the spawned give-backs run there.
    pub(crate) runtime: tokio::runtime::Handle,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.renewals.close();
    }
}
