//! What a fixed window tells its listener ([`FixedWindowEvent`]) and its callers
//! ([`FixedWindowError`]).

use std::time::Duration;

use admission_core::Instant;

use super::MissingTimer;

/// One outcome of an acquire on the standalone API, handed to the limiter's listener.
///
/// Each call of [`try_acquire`](super::FixedWindow::try_acquire),
/// [`acquire`](super::FixedWindow::acquire), [`acquire_async`](super::FixedWindow::acquire_async)
/// and the `call` helpers reports exactly one event when it ends in a permit or a rejection; a
/// cancelled wait, and an async wait that found no timer ([`FixedWindowError::NoTimer`]), report
/// none. Takes made through the [`Account`](admission_core::Account) implementation report
/// nothing here: inside a demand, the monitor is the one that emits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FixedWindowEvent {
    /// The call won a permit and goes ahead.
    Permitted {
        /// When, on the limiter's clock.
        at: Instant,
        /// The limiter's name.
        name: &'static str,
        /// Permits left in the current window after this one.
        remaining: u64,
    },
    /// The call found no permit in time (its window spent, the next one beyond its max wait)
    /// and does not run.
    Rejected {
        /// When, on the limiter's clock.
        at: Instant,
        /// The limiter's name.
        name: &'static str,
        /// Time until the next window opens, when the next permit is likely; [`Duration::MAX`]
        /// when no later window fits on the clock.
        estimated_wait: Duration,
    },
}

impl FixedWindowEvent {
    /// The name of the limiter that reported it.
    pub fn name(&self) -> &'static str {
        match self {
            FixedWindowEvent::Permitted { name, .. } | FixedWindowEvent::Rejected { name, .. } => {
                name
            }
        }
    }

    /// When it happened, on the limiter's clock.
    pub fn at(&self) -> Instant {
        match self {
            FixedWindowEvent::Permitted { at, .. } | FixedWindowEvent::Rejected { at, .. } => *at,
        }
    }
}

/// Why an acquire on a fixed window ended without a permit. The operation never ran.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FixedWindowError {
    /// Every permit of the window is used and the next window does not open within the max wait
    /// (or never opens on this clock). Not a fault: retry later, or raise the max wait.
    #[error(
        "fixed window `{name}` rejected the call: its {limit} permits per {period:?} are used up \
         and no window opens within the max wait of {max_wait:?}"
    )]
    Rejected {
        /// The limiter's name.
        name: &'static str,
        /// Permits per window.
        limit: u64,
        /// The window's length.
        period: Duration,
        /// How long a call may wait for a later window.
        max_wait: Duration,
    },
    /// The wait for a permit was cancelled through its [`CancelToken`](super::CancelToken);
    /// nothing was taken and nothing is retried.
    #[error("fixed window `{name}`: the wait for a permit was cancelled")]
    Cancelled {
        /// The limiter's name.
        name: &'static str,
    },
    /// An async acquire had to wait for a later window, but no sleeper was given and there is
    /// no timer to wait on where it was polled: no tokio runtime there, or no `tokio` feature
    /// (`missing` says which). Nothing was taken. A fault of the setup, not of the load: poll
    /// the call on a tokio runtime with the feature on, or give the limiter a [`Sleeper`] on
    /// your runtime's timer ([`FixedWindow::with_sleeper`]).
    ///
    /// [`Sleeper`]: super::Sleeper
    /// [`FixedWindow::with_sleeper`]: super::FixedWindow::with_sleeper
    #[error(
        "fixed window `{name}` must wait {wait:?} for its next window but has no timer to wait \
         on: {missing}, and no sleeper was given; poll the call on a tokio runtime with \
         admission-accounts' `tokio` feature on, or pass your runtime's timer to \
         `FixedWindow::with_sleeper`"
    )]
    NoTimer {
        /// The limiter's name.
        name: &'static str,
        /// How long the call had to wait for the next window to open.
        wait: Duration,
        /// What is missing.
        missing: MissingTimer,
    },
}
