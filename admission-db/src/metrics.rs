//! Pool metrics under the OpenTelemetry database-client names as a Prometheus exporter writes
//! them (a counter ends in `_total`, a duration in its unit, `_seconds`), through the `metrics`
//! facade.
//!
//! With feature `metrics`, each provider reports its pool at checkout, close and checkout
//! timeout; without it, [`PoolMetrics`]'s hooks are empty and nothing is recorded. Every series
//! carries the label `pool.name` = the provider's name (bounded: provider names only, never job
//! ids):
//!
//! | name | kind | unit | labels |
//! |---|---|---|---|
//! | `db.client.connection.count` | gauge | connections | `state` = `idle` \| `used` |
//! | `db.client.connection.max` | gauge | connections | |
//! | `db.client.connection.pending_requests` | gauge | requests | only where the pool counts its waiters: the deadpool-postgres provider reports deadpool's `waiting`; r2d2 and sqlx count none, so their providers omit it |
//! | `db.client.connection.wait_time_seconds` | histogram | seconds | how long a successful checkout waited |
//! | `db.client.connection.use_time_seconds` | histogram | seconds | checkout to close |
//! | `db.client.connection.timeouts_total` | counter | checkouts | checkouts that timed out |
//!
//! The gauges are set to the pool's state read right after each checkout, close and timeout.
//! Where a close gives the connection back on a task (a sqlx handle closed or dropped inside a
//! runtime), the gauges may still count it used until the next report.
//! Durations are read on the provider's [`Clock`] (the monitor's), never on the OS clock.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::sync::Arc;

use admission_core::Clock;

/// `db.client.connection.count`, label `state` = `idle` | `used`.
pub const CONNECTION_COUNT: &str = "db.client.connection.count";
/// `db.client.connection.max`: the most connections the pool opens.
pub const CONNECTION_MAX: &str = "db.client.connection.max";
/// `db.client.connection.pending_requests`: checkouts waiting, where the pool counts them.
pub const PENDING_REQUESTS: &str = "db.client.connection.pending_requests";
/// `db.client.connection.wait_time_seconds`: how long a successful checkout waited.
pub const WAIT_TIME: &str = "db.client.connection.wait_time_seconds";
/// `db.client.connection.use_time_seconds`: from checkout to close.
pub const USE_TIME: &str = "db.client.connection.use_time_seconds";
/// `db.client.connection.timeouts_total`: checkouts that timed out.
pub const TIMEOUTS: &str = "db.client.connection.timeouts_total";
/// The label every series carries: the provider's name.
pub const POOL_NAME: &str = "pool.name";

/// A pool's state as its provider reads it, for the gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub(crate) idle: u32,
    pub(crate) used: u32,
    pub(crate) max: u32,
    /// Checkouts waiting; `None` where the pool does not count them (r2d2, sqlx).
    pub(crate) pending: Option<u32>,
}

/// An instant on the provider's clock, where a duration starts (a checkout, a handed-out
/// connection); without feature `metrics` it holds nothing and reading it costs nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamp {
    #[cfg(feature = "metrics")]
    at: admission_core::Instant,
}

/// One provider's metrics hook: the providers call it at checkout, close and timeout. The pool's
/// state is passed as a closure, read only when something records it: without feature `metrics`
/// a hook neither reads the clock nor locks the pool.
#[derive(Clone)]
pub(crate) struct PoolMetrics {
    /// The `pool.name` label.
    name: Arc<str>,
    /// Where durations are read (the monitor's clock).
    clock: Arc<dyn Clock>,
}

impl PoolMetrics {
    /// The hook for the provider named `name`, timing on `clock`; describes the metrics.
    pub(crate) fn new(name: Arc<str>, clock: Arc<dyn Clock>) -> PoolMetrics {
        #[cfg(feature = "metrics")]
        describe();
        PoolMetrics { name, clock }
    }

    /// The instant a checkout starts or a connection is handed out.
    pub(crate) fn now(&self) -> Stamp {
        Stamp {
            #[cfg(feature = "metrics")]
            at: self.clock.now(),
        }
    }

    /// A checkout that began at `started` succeeded; the pool is now in `state()`.
    pub(crate) fn checked_out(&self, started: Stamp, state: impl FnOnce() -> PoolState) {
        #[cfg(feature = "metrics")]
        {
            let waited = self.clock.now().saturating_duration_since(started.at);
            ::metrics::histogram!(WAIT_TIME, POOL_NAME => self.name.clone()).record(waited);
            self.gauges(state());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (started, state);
    }

    /// A checkout timed out; the pool is now in `state()`.
    pub(crate) fn timed_out(&self, state: impl FnOnce() -> PoolState) {
        #[cfg(feature = "metrics")]
        {
            ::metrics::counter!(TIMEOUTS, POOL_NAME => self.name.clone()).increment(1);
            self.gauges(state());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = state;
    }

    /// A connection handed out at `handed_out` went back (or was discarded); the pool is now in
    /// `state()`.
    pub(crate) fn closed(&self, handed_out: Stamp, state: impl FnOnce() -> PoolState) {
        #[cfg(feature = "metrics")]
        {
            let used = self.clock.now().saturating_duration_since(handed_out.at);
            ::metrics::histogram!(USE_TIME, POOL_NAME => self.name.clone()).record(used);
            self.gauges(state());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (handed_out, state);
    }

    #[cfg(feature = "metrics")]
    fn gauges(&self, state: PoolState) {
        use ::metrics::gauge;
        let name = &self.name;
        gauge!(CONNECTION_COUNT, POOL_NAME => name.clone(), "state" => "idle")
            .set(f64::from(state.idle));
        gauge!(CONNECTION_COUNT, POOL_NAME => name.clone(), "state" => "used")
            .set(f64::from(state.used));
        gauge!(CONNECTION_MAX, POOL_NAME => name.clone()).set(f64::from(state.max));
        if let Some(pending) = state.pending {
            gauge!(PENDING_REQUESTS, POOL_NAME => name.clone()).set(f64::from(pending));
        }
    }
}

impl std::fmt::Debug for PoolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMetrics")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Describes each metric with its unit, to whichever recorder is current.
#[cfg(feature = "metrics")]
fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        CONNECTION_COUNT,
        Unit::Count,
        "Connections of the pool, by state (idle or used)."
    );
    describe_gauge!(
        CONNECTION_MAX,
        Unit::Count,
        "The most connections the pool opens."
    );
    describe_gauge!(
        PENDING_REQUESTS,
        Unit::Count,
        "Checkouts waiting for a connection of the pool."
    );
    describe_histogram!(
        WAIT_TIME,
        Unit::Seconds,
        "How long a checkout waited for a connection."
    );
    describe_histogram!(
        USE_TIME,
        Unit::Seconds,
        "How long a connection was held, from checkout to close."
    );
    describe_counter!(
        TIMEOUTS,
        Unit::Count,
        "Checkouts that timed out waiting for a connection."
    );
}
