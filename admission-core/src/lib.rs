//! The admission contract and its monitor.
//!
//! A job declares everything it needs as one [`Demand`] (amounts on [`Account`]s: connection
//! permits, a model's tokens and requests, ...) and the [`Monitor`] grants all of it in one step,
//! or the job waits in one fair line holding nothing. Waiting jobs are woken by events (a give, a
//! capacity change, a cancellation) and by computed deadlines, never by polling. A [`Grant`] is an
//! RAII value that gives back what it holds when dropped.
//!
//! This crate owns the contract and the monitor only: it knows no account family, no database and
//! no async runtime. Time is read only through [`Clock`]; accounts never block; only the monitor
//! emits [`Event`]s.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod amount;
mod clock;
mod context;
mod contract;
mod demand;
mod error;
pub mod event;
mod fair;
mod machine;
mod monitor;
mod shim;
mod sync;

use account::mute;
use contract::{account, gate};

pub use account::{
    Account, AccountRef, AccountStatus, Answer, Ask, Capability, Category, Refusal, RefusalKind,
    Replenishment, WakeSlot,
};
pub use amount::Amount;
pub use clock::{Clock, Instant, Reading, SystemClock, Timer, WakeFn};
pub use context::{Cancelled, JobContext, JobSnapshot};
pub use demand::{Demand, Entry};
pub use error::{AdmitError, StartError, TryAdmitError};
pub use event::{Event, EventKind, EventSink, RejectReason};
pub use fair::{FairShares, Level, LevelError, Levels, WeightError};
pub use gate::{Gate, GateAnswer, GateView};
pub use monitor::{Admit, Monitor, MonitorBuilder};
pub use monitor::{BorrowedGrant, Grant};
#[cfg(feature = "test-util")]
pub use sync::LockHolds;
