//! The typed errors of admission: "not now" never appears here, only outcomes a caller must handle.

use std::sync::Arc;
use std::time::Duration;

use crate::account::Refusal;
use crate::event::RejectReason;

/// Why an admission did not produce a grant.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdmitError {
    /// An account can never grant this demand (it exceeds the account's configuration, or the
    /// account refuses everyone now). Correct the demand or pick another resource.
    #[error("account `{account}` refused the demand: {refusal}")]
    Refused {
        /// The refusing account's name.
        account: String,
        /// The account's own words.
        #[source]
        refusal: Refusal,
    },
    /// The job was cancelled through its context while asking or waiting.
    #[error("job {job} was cancelled after waiting {waited:?}")]
    Cancelled {
        /// The job's id.
        job: u64,
        /// How long it had waited.
        waited: Duration,
    },
    /// The deadline passed before the whole demand could be granted.
    #[error("job {job} timed out after waiting {waited:?} (its timeout was {timeout:?})")]
    TimedOut {
        /// The job's id.
        job: u64,
        /// How long it waited.
        waited: Duration,
        /// The timeout it asked with.
        timeout: Duration,
    },
    /// An account of the demand requires a capability that no other account of it provides
    /// (a rate window without the HTTP connection gate). Add the missing account to the demand.
    #[error(
        "account `{account}` requires a `{requires}` in the same demand, and none of its accounts provides one"
    )]
    Unmet {
        /// The requiring account's name.
        account: String,
        /// What it requires.
        requires: crate::Capability,
    },
    /// The monitor was stopped; nothing is admitted any more.
    #[error("admission is shut down")]
    Shutdown,
    /// An account panicked while asked about this demand; the account is at fault, not the job.
    #[error("account `{account}` panicked while asked about job {job}: {panic}")]
    Aborted {
        /// The panicking account's name.
        account: String,
        /// The job's id.
        job: u64,
        /// The panic's message.
        panic: String,
    },
    /// The job had to wait, and the monitor could not start the evaluator thread that serves
    /// waiters' deadlines (the operating system refused a thread). Nothing was taken.
    #[error("job had to wait, but the evaluator could not be started: {reason}")]
    Unserved {
        /// Why the thread could not be started.
        reason: String,
    },
    /// The job names a priority level the monitor does not have
    /// ([`JobContext::with_level`](crate::JobContext::with_level), [`Levels`](crate::Levels)).
    #[error(
        "job {job} asks for the priority level `{level}`, which this monitor does not have (it has: {known})"
    )]
    UnknownLevel {
        /// The job's id.
        job: u64,
        /// The level it named.
        level: Arc<str>,
        /// The monitor's levels, comma-separated (empty: it has none).
        known: String,
    },
    /// A defect inside the monitor closed admission; every waiter and every later admit fails so.
    #[error("admission is closed: {cause}")]
    Closed {
        /// What closed it.
        cause: Arc<str>,
    },
}

impl AdmitError {
    /// For a refusal that holds for now only ([`Refusal::temporary`], an open circuit), when
    /// the account expects to accept again; `None` for every other error.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AdmitError::Refused { refusal, .. } => refusal.retry_after(),
            _ => None,
        }
    }

    /// The event reason this error is reported with.
    pub fn reason(&self) -> RejectReason {
        match self {
            AdmitError::Refused { .. }
            | AdmitError::Unmet { .. }
            | AdmitError::UnknownLevel { .. } => RejectReason::CircuitBlocked,
            AdmitError::Cancelled { .. } => RejectReason::Cancelled,
            AdmitError::TimedOut { .. } => RejectReason::TimedOut,
            AdmitError::Shutdown => RejectReason::Shutdown,
            AdmitError::Aborted { .. } => RejectReason::Aborted,
            AdmitError::Closed { .. } | AdmitError::Unserved { .. } => RejectReason::Closed,
        }
    }
}

/// Why [`Monitor::try_admit`](crate::Monitor::try_admit) granted nothing.
///
/// Unlike [`AdmitError`], this has a "not now": a try never waits, so a demand that would have
/// waited is an outcome of its own. Nothing was taken in either case.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TryAdmitError {
    /// The demand would have to wait: others are already waiting (a try never overtakes the
    /// line), or an account, or the gate, has no room for it now.
    #[error("job {job} would have to wait: {}", WouldWaitFor(*.waiting, .short.as_deref()))]
    WouldWait {
        /// The job's id.
        job: u64,
        /// How many waiters were already in the line (0 when an account was short).
        waiting: usize,
        /// The account (or gate) that had no room, when one was asked.
        short: Option<String>,
    },
    /// Waiting would not help: what [`admit`](crate::Monitor::admit) would have failed with.
    #[error(transparent)]
    Admit(#[from] AdmitError),
}

/// The reason part of [`TryAdmitError::WouldWait`]'s message.
struct WouldWaitFor<'a>(usize, Option<&'a str>);

impl std::fmt::Display for WouldWaitFor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WouldWaitFor(_, Some(short)) => write!(f, "`{short}` has no room for it now"),
            WouldWaitFor(1, None) => f.write_str("1 job is already waiting"),
            WouldWaitFor(n, None) => write!(f, "{n} jobs are already waiting"),
        }
    }
}

/// `start()` was called on a monitor whose evaluator already runs (or ran).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The monitor was stopped; a stopped monitor does not start again.
    #[error("the admission monitor was stopped and cannot start again")]
    Stopped,
    /// The operating system refused the evaluator thread.
    #[error("could not spawn the evaluator thread: {0}")]
    Spawn(String),
}
