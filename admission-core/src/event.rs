//! The event vocabulary: what the monitor reports about each job's passage through admission.
//!
//! Only the monitor emits; no account reports for itself. Events are built only when a sink is
//! installed, and a sink that fails or panics is dropped without admission ever noticing. The sinks
//! people use (an in-memory recorder, a `tracing` sink, a JSON-lines writer) live in
//! `admission-events`, which re-exports this module.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::account::Category;
use crate::amount::Amount;
use crate::clock::Instant;
use crate::context::JobSnapshot;

/// Why a waiter was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RejectReason {
    /// The job was cancelled through its context, or its admit future was dropped.
    Cancelled,
    /// An account refused the demand outright (it can never fit, or the account refuses everyone
    /// now, like an open circuit); the message is meant for whoever chose the demand.
    CircuitBlocked,
    /// An account panicked while asked about the demand.
    Aborted,
    /// The monitor was stopped.
    Shutdown,
    /// The job's deadline passed while it waited.
    TimedOut,
    /// Admission was closed by a defect; the message is its cause.
    Closed,
}

impl RejectReason {
    /// The reason's wire name (`cancelled`, `circuit_blocked`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectReason::Cancelled => "cancelled",
            RejectReason::CircuitBlocked => "circuit_blocked",
            RejectReason::Aborted => "aborted",
            RejectReason::Shutdown => "shutdown",
            RejectReason::TimedOut => "timed_out",
            RejectReason::Closed => "closed",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The whole demand was granted on arrival; a fast path emits this and nothing else.
    GrantedImmediate,
    /// The waiter was short on one account (or held by the gate). Emitted once per account per wait.
    Held,
    /// A waiter was granted after waiting.
    GrantedFromHold {
        /// From asking to granted.
        #[serde(with = "duration_ms")]
        wait: Duration,
        /// How many waiters remain parked after this grant.
        waiters: usize,
    },
    /// The job was refused.
    Rejected {
        /// Why.
        reason: RejectReason,
        /// The readable detail (an account's refusal, a panic message, a cause).
        message: String,
    },
    /// A grant was given back.
    Released {
        /// True for a rollback (everything returned, metered debits included).
        rolled_back: bool,
    },
}

impl EventKind {
    /// The kind's wire name (`granted_immediate`, `held`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::GrantedImmediate => "granted_immediate",
            EventKind::Held => "held",
            EventKind::GrantedFromHold { .. } => "granted_from_hold",
            EventKind::Rejected { .. } => "rejected",
            EventKind::Released { .. } => "released",
        }
    }
}

/// One account an event is about, with the amount the job asked of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventEntry {
    /// The account's name.
    pub account: String,
    /// The account's category.
    pub category: Category,
    /// The amount asked.
    pub amount: Amount,
}

/// One transition of one job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
    /// When, on the monitor's clock.
    pub at: Instant,
    /// The job it happened to.
    pub job: JobSnapshot,
    /// The accounts concerned: the whole demand, or for [`EventKind::Held`] the one account.
    pub entries: Vec<EventEntry>,
}

/// The sum of the amounts an event names: each entry's primary quantity, or one for an entry whose
/// amount has no quantity (a marker, such as the gate's).
pub fn amount_of(event: &Event) -> u64 {
    event
        .entries
        .iter()
        .map(|e| {
            if e.amount.is_zero() {
                1
            } else {
                e.amount.primary()
            }
        })
        .fold(0u64, u64::saturating_add)
}

/// A sink failed to record one event; the monitor loses that event and goes on.
#[derive(Debug, thiserror::Error)]
#[error("event sink failed: {0}")]
pub struct SinkError(pub String);

/// Where events go. Called outside every admission lock, on whichever thread made the transition.
///
/// A sink that returns an error or panics loses that one event (the monitor logs the failure at
/// `warn` and hands the sink the next event as usual); admission never fails because of a sink.
pub trait EventSink: Send + Sync + 'static {
    /// Records one event.
    fn emit(&self, event: &Event) -> Result<(), SinkError>;
}

mod duration_ms {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn entry(amount: Amount) -> EventEntry {
        EventEntry {
            account: "a".into(),
            category: Category::custom("permits"),
            amount,
        }
    }

    #[test]
    fn amount_of_sums_quantities_and_counts_one_per_marker() {
        let event = Event {
            kind: EventKind::GrantedImmediate,
            at: Instant::ZERO,
            job: JobSnapshot {
                id: 1,
                name: Arc::from("j"),
                workflow: None,
                tenant: None,
                level: None,
            },
            entries: vec![
                entry(Amount::units(3)),
                entry(Amount::pair(100, 1)),
                entry(Amount::ZERO),
            ],
        };
        assert_eq!(amount_of(&event), 104);
    }
}
