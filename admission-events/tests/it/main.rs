//! The one integration-test binary of `admission-events`: sinks, status records, and the sinks
//! under a real monitor. Shared event builders live here.

mod fanout;
mod json_lines;
mod metrics;
mod monitor;
mod recorder;
mod tracing_sink;

use std::time::Duration;

use admission_core::event::{Event, EventEntry, EventKind, RejectReason};
use admission_core::{Amount, Category, Instant, JobSnapshot};

/// A job snapshot with no workflow or tenant.
pub fn job(id: u64, name: &str) -> JobSnapshot {
    JobSnapshot {
        id,
        name: name.into(),
        workflow: None,
        tenant: None,
        level: None,
    }
}

/// One entry on a semaphore account.
pub fn entry(account: &str, amount: Amount) -> EventEntry {
    EventEntry {
        account: account.into(),
        category: Category::custom("semaphore"),
        amount,
    }
}

/// An event of `kind` about job `id`, at one second, on one permit of `http`.
pub fn event(kind: EventKind, id: u64) -> Event {
    Event {
        kind,
        at: Instant::from_nanos(1_000_000_000),
        job: job(id, "job"),
        entries: vec![entry("http", Amount::ONE)],
    }
}

/// A rejection for `reason` with a fixed message.
pub fn rejected(reason: RejectReason) -> EventKind {
    EventKind::Rejected {
        reason,
        message: "no way".into(),
    }
}

/// A grant after a wait of `ms` milliseconds with `waiters` left.
pub fn from_hold(ms: u64, waiters: usize) -> EventKind {
    EventKind::GrantedFromHold {
        wait: Duration::from_millis(ms),
        waiters,
    }
}
