//! One `tracing` span per admission (`admit`, `admit_blocking`): target `admission`, name
//! `admit`, level DEBUG, with the job (`job_id`, `job_name`, `tenant`), the accounts asked of
//! (`accounts`, their names in demand order), and, once it ends, how long it waited
//! (`waited_ms`: on the monitor's clock for a grant, a timeout or a cancellation, as the grant
//! or the error says; on the system clock otherwise) and its `outcome` (`granted`, `abandoned`
//! for a future dropped while it waited, or the refusal's reason: `timed_out`, `cancelled`,
//! `circuit_blocked`, `shutdown`, `aborted`, `closed`). An admission granted or refused at once
//! has a span too.
//!
//! A span costs one check of the dispatcher's interest when nothing listens at that level, and
//! nothing more: the accounts' names are joined, and the clock read, only for an enabled span.

use std::time::{Duration, Instant};

use tracing::Span;

use crate::{AdmitError, Demand, Grant, JobContext};

/// An admission's span, and when it began (for an enabled span only).
pub(crate) struct AdmissionSpan {
    span: Span,
    began: Option<Instant>,
}

impl AdmissionSpan {
    /// The span of `ctx`'s admission of `demand`, begun now.
    pub(crate) fn begin(ctx: &JobContext, demand: &Demand) -> AdmissionSpan {
        let job = ctx.snapshot();
        let span = tracing::debug_span!(
            target: "admission",
            "admit",
            job_id = job.id,
            job_name = &*job.name,
            tenant = job.tenant.as_deref(),
            accounts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if span.is_disabled() {
            return AdmissionSpan { span, began: None };
        }
        let accounts = demand
            .entries()
            .iter()
            .map(|entry| entry.account().name())
            .collect::<Vec<_>>()
            .join(",");
        span.record("accounts", accounts.as_str());
        AdmissionSpan {
            span,
            began: Some(Instant::now()),
        }
    }

    /// The span itself, to enter while the admission runs.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Records how `outcome` ended the admission.
    pub(crate) fn end(&self, outcome: &Result<Grant, AdmitError>) {
        let waited = match outcome {
            Ok(grant) => Some(grant.wall_wait()),
            Err(AdmitError::TimedOut { waited, .. } | AdmitError::Cancelled { waited, .. }) => {
                Some(*waited)
            }
            Err(_) => None,
        };
        let outcome = match outcome {
            Ok(_) => "granted",
            Err(error) => error.reason().as_str(),
        };
        self.finish(outcome, waited);
    }

    /// Records that the admission was given up while it waited (its future dropped).
    pub(crate) fn abandon(&self) {
        self.finish("abandoned", None);
    }

    fn finish(&self, outcome: &'static str, waited: Option<Duration>) {
        let Some(began) = self.began else {
            return;
        };
        let waited = waited.unwrap_or_else(|| began.elapsed());
        self.span
            .record("waited_ms", waited.as_secs_f64() * 1e3)
            .record("outcome", outcome);
    }
}
