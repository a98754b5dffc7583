//! [`TracingSink`]: admission events as `tracing` events, for whatever subscriber the process runs.

use admission_core::event::{Event, EventKind, EventSink, RejectReason, SinkError, amount_of};

/// The `tracing` target every event is emitted under.
const TARGET: &str = "admission";

/// Emits each admission event as one `tracing` event with target `admission`.
///
/// Levels: `warn` for a rejection whose reason is [`RejectReason::Closed`] or
/// [`RejectReason::Aborted`] (a defect somewhere), `info` for every other rejection, `debug` for
/// everything else (grants, holds, releases), so a production filter at `info` sees only refusals.
///
/// Fields, all structured:
///
/// | field | on | value |
/// |---|---|---|
/// | `kind` | all | [`EventKind::as_str`] |
/// | `job_id`, `job_name` | all | the job's snapshot |
/// | `workflow`, `tenant`, `level` | all, when set | the job's snapshot |
/// | `accounts` | all | the account names, comma separated, in demand order |
/// | `amount` | all | [`amount_of`] |
/// | `at_ns` | all | the monitor clock's reading, in nanoseconds |
/// | `wait_ms`, `waiters` | `granted_from_hold` | the wait and the waiters left parked |
/// | `reason`, `detail` | `rejected` | [`RejectReason::as_str`] and the readable message |
/// | `rolled_back` | `released` | whether the grant was rolled back |
///
/// The rejection's message is recorded as `detail` because `message` is the field `tracing`
/// reserves for an event's own text. Emission never fails.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_core::Monitor;
/// use admission_events::TracingSink;
///
/// let monitor = Monitor::builder().sink(Arc::new(TracingSink::new())).build();
/// # drop(monitor);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TracingSink {
    _private: (),
}

impl TracingSink {
    /// A sink that writes to the current `tracing` dispatcher.
    pub fn new() -> TracingSink {
        TracingSink { _private: () }
    }
}

/// One `tracing::event!` at `$level` with the fields every event carries, then `$extra` fields.
macro_rules! emit_at {
    ($level:expr, $event:expr, $accounts:expr, $text:literal $(, $($extra:tt)+)?) => {
        tracing::event!(
            target: TARGET,
            $level,
            kind = $event.kind.as_str(),
            job_id = $event.job.id,
            job_name = &*$event.job.name,
            workflow = $event.job.workflow.as_deref(),
            tenant = $event.job.tenant.as_deref(),
            level = $event.job.level.as_deref(),
            accounts = $accounts,
            amount = amount_of($event),
            at_ns = $event.at.as_nanos(),
            $($($extra)+,)?
            $text
        )
    };
}

impl EventSink for TracingSink {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        use tracing::Level;

        let accounts = event
            .entries
            .iter()
            .map(|e| e.account.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let accounts = accounts.as_str();
        match &event.kind {
            EventKind::GrantedImmediate => {
                emit_at!(Level::DEBUG, event, accounts, "job granted on arrival")
            }
            EventKind::Held => emit_at!(Level::DEBUG, event, accounts, "job held"),
            EventKind::GrantedFromHold { wait, waiters } => emit_at!(
                Level::DEBUG,
                event,
                accounts,
                "job granted after waiting",
                wait_ms = wait.as_secs_f64() * 1_000.0,
                waiters = *waiters as u64
            ),
            EventKind::Rejected { reason, message } => {
                let reason_str = reason.as_str();
                let detail = message.as_str();
                if matches!(reason, RejectReason::Closed | RejectReason::Aborted) {
                    emit_at!(
                        Level::WARN,
                        event,
                        accounts,
                        "job rejected",
                        reason = reason_str,
                        detail = detail
                    )
                } else {
                    emit_at!(
                        Level::INFO,
                        event,
                        accounts,
                        "job rejected",
                        reason = reason_str,
                        detail = detail
                    )
                }
            }
            EventKind::Released { rolled_back } => emit_at!(
                Level::DEBUG,
                event,
                accounts,
                "grant released",
                rolled_back = *rolled_back
            ),
            // A kind added to the vocabulary later still reaches the log, with the common fields.
            _ => emit_at!(Level::DEBUG, event, accounts, "admission event"),
        }
        Ok(())
    }
}
