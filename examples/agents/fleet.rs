//! The monitor strategy: every step asks for its whole demand in one admission.
//!
//! An agent's step is one [`Demand`](admission_core::Demand) — HTTP connection, the model's
//! tokens and one request, the model gate and window where the catalog has them, and sometimes a
//! database connection and a search call — admitted by the one [`Monitor`] or not at all. A job
//! that cannot have everything waits in the monitor's line holding *nothing*, so a model-b call
//! never waits behind a connection that a model-a call holds while it waits for tokens.
//!
//! The database part is a permit on the results provider's gate (`results.rs`). Once granted, the
//! step checks its connection out of the provider, makes its call, stores its result in one
//! committed transaction and gives the connection back, all before its grant gives the permit
//! back. The provider's verbs block: tasks run them with `spawn_blocking`.
//!
//! Most agents are tokio tasks awaiting [`Monitor::admit`]; some run on blocking threads and call
//! [`Monitor::admit_blocking`]. Both stand in the same line. Every admission carries a timeout,
//! and a cancelled [`JobContext`] (Ctrl-C) withdraws a waiter at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use admission_core::{AdmitError, Grant, JobContext, Monitor};
use admission_db::r2d2_sqlite::SqliteHandle;
use admission_llm::CallReservation;
use admission_llm::spend::SpendGate;

use crate::cells::StepReport;
use crate::provider_http::HttpAnswer;
use crate::results::Results;
use crate::stats::{Holding, JobOutcome, add_duration};
use crate::workload::{JobPlan, StepPlan};
use crate::world::{Next, World, result_row, settle, step_report};

/// What an admission error means for the job.
enum Failure {
    /// End the job with this outcome.
    End(JobOutcome),
    /// An account refuses everyone for now (the model's window has its circuit open): wait about
    /// this long and try again.
    CircuitOpen(Duration),
}

fn classify(error: AdmitError) -> Failure {
    match error {
        AdmitError::TimedOut { .. } => Failure::End(JobOutcome::TimedOut),
        AdmitError::Cancelled { .. } | AdmitError::Shutdown => Failure::End(JobOutcome::Cancelled),
        AdmitError::Refused { ref refusal, .. } if !refusal.is_permanent() => {
            Failure::CircuitOpen(error.retry_after().unwrap_or_default())
        }
        other => Failure::End(JobOutcome::Failed(other.to_string())),
    }
}

/// What happened to one admitted attempt, once its grant is given back.
enum Attempt {
    Next(Stepped),
    Fail(JobOutcome),
}

/// An attempt that went on: what the job does next, and what the call (if one was made) tells
/// the fleet's cell of its model when the step's lease is released.
pub struct Stepped {
    pub next: Next,
    pub report: Option<StepReport>,
}

impl Stepped {
    /// An attempt that made no call (an open circuit refused it).
    fn without_call(next: Next) -> Stepped {
        Stepped { next, report: None }
    }
}

/// The part of an attempt between the grant and the call, the same for both APIs: record the
/// wait, enter the gauges. Returns the holding and when the grant came.
fn begin_call<'w>(
    world: &'w World,
    job: &JobPlan,
    step: &StepPlan,
    grant: &Grant,
) -> (Holding<'w>, Duration) {
    let granted_at = world.now();
    world.metrics.record_grant(
        job,
        step.input_tokens + step.max_output_tokens,
        grant.wall_wait(),
        granted_at,
    );
    let holding = world
        .metrics
        .hold(grant.entries().iter().map(|e| e.account().name()));
    (holding, granted_at)
}

/// A call that could not be made (the provider unreachable): the job fails.
fn call_failed(error: anyhow::Error) -> JobOutcome {
    JobOutcome::Failed(format!("{error:#}"))
}

/// Runs one agent as a tokio task.
pub async fn run_job(world: Arc<World>, monitor: Monitor, job: Arc<JobPlan>, ctx: JobContext) {
    let budget = world.budget(&job);
    let outcome = job_steps(&world, &monitor, &job, &ctx, &*budget).await;
    world.job_spent(&budget);
    if let Some(cells) = &world.cells {
        cells.job_ended(&job.name, &outcome);
    }
    world.metrics.job_ended(job.model, &outcome, world.now());
}

async fn job_steps(
    world: &World,
    monitor: &Monitor,
    job: &JobPlan,
    ctx: &JobContext,
    budget: &dyn SpendGate,
) -> JobOutcome {
    let clock = &world.clock;
    if world.stop.sleep(clock.to_real(job.start_after)).await {
        return JobOutcome::Cancelled;
    }
    for (index, step) in job.steps.iter().enumerate() {
        let mut attempt = 0;
        loop {
            // Priced against the workflow's cap first: a step it refuses ends the job before
            // it waits for anything.
            let (demand, reservation) = match world.step_demand(job, step, budget) {
                Ok(priced) => priced,
                Err(outcome) => return outcome,
            };
            // In a fleet run, the model's fleet lease first, held while the local demand is
            // admitted and the call runs; nothing local is held while it waits.
            let lease = match &world.cells {
                Some(cells) => match cells
                    .acquire(&world.stop, clock, job, index, attempt, step)
                    .await
                {
                    Ok(lease) => lease,
                    Err(outcome) => return outcome,
                },
                None => None,
            };
            let timeout = Some(world.settings.admit_timeout);
            let work = async {
                match monitor.admit(demand, ctx, timeout).await {
                    Ok(grant) => {
                        match attempt_call(world, job, index, attempt, step, grant, reservation)
                            .await
                        {
                            Attempt::Next(stepped) => Ok(stepped),
                            Attempt::Fail(outcome) => Err(outcome),
                        }
                    }
                    Err(error) => refused(world, job, error).map(Stepped::without_call),
                }
            };
            // A step stops when its fleet lease is lost: what it holds may be someone else's
            // by then (the local grant is given back as the work is dropped).
            let result = match &lease {
                Some(held) => {
                    let lost = held.lost();
                    tokio::select! {
                        result = work => result,
                        reason = lost => Err(JobOutcome::Failed(format!(
                            "the fleet lease was lost: {reason}"
                        ))),
                    }
                }
                None => work.await,
            };
            if let (Some(cells), Some(lease)) = (&world.cells, lease) {
                let report = result.as_ref().ok().map(|s| s.report);
                cells.release(&world.stop, lease, report).await;
            }
            let next = match result {
                Ok(stepped) => stepped.next,
                Err(outcome) => return outcome,
            };
            match retry(world, &mut attempt, next) {
                Ok(None) => break,
                Ok(Some(after)) => {
                    if world.stop.sleep(clock.to_real(after)).await {
                        return JobOutcome::Cancelled;
                    }
                }
                Err(outcome) => return outcome,
            }
        }
    }
    JobOutcome::Completed
}

async fn attempt_call(
    world: &World,
    job: &JobPlan,
    index: usize,
    attempt: u32,
    step: &StepPlan,
    grant: Grant,
    reservation: CallReservation,
) -> Attempt {
    let db = match open_results(world, step).await {
        Ok(db) => db,
        Err(outcome) => return Attempt::Fail(outcome),
    };
    let (holding, granted_at) = begin_call(world, job, step, &grant);
    // The server holds the answer for the call's latency: the grant is held meanwhile.
    let response: HttpAnswer = match world.call(job, index, attempt, step).await {
        Ok(response) => response,
        Err(error) => return Attempt::Fail(call_failed(error)),
    };
    settle(reservation, step, &response);
    let next = world.feedback(job.model, &response, attempt);
    if next == Next::Done {
        world.clock.sleep(step.tool_time).await;
    }
    if let Some((results, handle)) = db {
        let row = result_row(job, index, attempt, step, &response, world.now());
        let stored = tokio::task::spawn_blocking(move || results.store(handle, &row))
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("the results task failed: {e}")));
        if let Err(outcome) = count_stored(world, stored) {
            return Attempt::Fail(outcome);
        }
    }
    let report = step_report(&response);
    holding.leave();
    add_duration(
        &world.metrics.http_held_ns,
        world.now().saturating_sub(granted_at),
    );
    drop(grant); // the connection, the gate slot and the database permit come back
    Attempt::Next(Stepped {
        next,
        report: Some(report),
    })
}

/// The step's results connection, checked out of the provider under the grant's permit on a
/// blocking thread; `None` for a step without the database.
async fn open_results(
    world: &World,
    step: &StepPlan,
) -> Result<Option<(Arc<Results>, SqliteHandle)>, JobOutcome> {
    let Some(results) = world.results.clone().filter(|_| step.uses_db) else {
        return Ok(None);
    };
    let opener = results.clone();
    let opened = tokio::task::spawn_blocking(move || opener.open())
        .await
        .unwrap_or_else(|e| Err(anyhow::anyhow!("the results task failed: {e}")));
    match opened {
        Ok(handle) => Ok(Some((results, handle))),
        Err(error) => Err(JobOutcome::Failed(format!("{error:#}"))),
    }
}

/// Counts a stored result, or ends the job with the failure.
fn count_stored(world: &World, stored: anyhow::Result<()>) -> Result<(), JobOutcome> {
    match stored {
        Ok(()) => {
            world.metrics.results_stored.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(error) => Err(JobOutcome::Failed(format!("{error:#}"))),
    }
}

/// What a step does after its admission failed: retry after an open circuit's cooldown, or end
/// the job with the outcome the error means.
fn refused(world: &World, job: &JobPlan, error: AdmitError) -> Result<Next, JobOutcome> {
    match classify(error) {
        Failure::End(outcome) => Err(outcome),
        Failure::CircuitOpen(retry_after) => {
            if let Some(tally) = world.metrics.model(job.model) {
                tally.circuit_refusals.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Next::Retry(world.circuit_backoff(retry_after)))
        }
    }
}

/// After an attempt: `None` when the step is done, the wait before the next attempt, or the
/// job gives up once its retries are spent.
fn retry(world: &World, attempt: &mut u32, next: Next) -> Result<Option<Duration>, JobOutcome> {
    match next {
        Next::Done => Ok(None),
        Next::Retry(after) => {
            *attempt += 1;
            if *attempt > world.settings.retries {
                return Err(JobOutcome::GaveUp);
            }
            world.metrics.retries.fetch_add(1, Ordering::Relaxed);
            Ok(Some(after))
        }
    }
}

/// Runs one agent on a blocking thread, admitting with [`Monitor::admit_blocking`].
pub fn run_job_blocking(world: Arc<World>, monitor: Monitor, job: Arc<JobPlan>, ctx: JobContext) {
    let budget = world.budget(&job);
    let outcome = job_steps_blocking(&world, &monitor, &job, &ctx, &*budget);
    world.job_spent(&budget);
    if let Some(cells) = &world.cells {
        cells.job_ended(&job.name, &outcome);
    }
    world.metrics.job_ended(job.model, &outcome, world.now());
}

fn job_steps_blocking(
    world: &World,
    monitor: &Monitor,
    job: &JobPlan,
    ctx: &JobContext,
    budget: &dyn SpendGate,
) -> JobOutcome {
    let clock = &world.clock;
    if world.stop.sleep_blocking(clock.to_real(job.start_after)) {
        return JobOutcome::Cancelled;
    }
    for (index, step) in job.steps.iter().enumerate() {
        let mut attempt = 0;
        loop {
            // Priced against the workflow's cap first: a step it refuses ends the job before
            // it waits for anything.
            let (demand, reservation) = match world.step_demand(job, step, budget) {
                Ok(priced) => priced,
                Err(outcome) => return outcome,
            };
            let lease = match &world.cells {
                Some(cells) => {
                    match cells.acquire_blocking(&world.stop, clock, job, index, attempt, step) {
                        Ok(lease) => lease,
                        Err(outcome) => return outcome,
                    }
                }
                None => None,
            };
            let timeout = Some(world.settings.admit_timeout);
            // A blocking step cannot be interrupted: it does not start on a lease already lost.
            let result = match lease.as_ref().and_then(|held| held.loss()) {
                Some(reason) => Err(JobOutcome::Failed(format!(
                    "the fleet lease was lost: {reason}"
                ))),
                None => attempt_blocking(
                    world,
                    monitor,
                    ctx,
                    job,
                    (index, attempt, step),
                    (demand, reservation),
                    timeout,
                ),
            };
            if let (Some(cells), Some(lease)) = (&world.cells, lease) {
                let report = result.as_ref().ok().map(|s| s.report);
                cells.release_blocking(&world.stop, lease, report);
            }
            let next = match result {
                Ok(stepped) => stepped.next,
                Err(outcome) => return outcome,
            };
            match retry(world, &mut attempt, next) {
                Ok(None) => break,
                Ok(Some(after)) => {
                    if world.stop.sleep_blocking(clock.to_real(after)) {
                        return JobOutcome::Cancelled;
                    }
                }
                Err(outcome) => return outcome,
            }
        }
    }
    JobOutcome::Completed
}

/// One attempt of a step on a blocking thread: the local admission, the call, the result stored;
/// what the job does next, or how it ends.
#[allow(clippy::too_many_arguments)]
fn attempt_blocking(
    world: &World,
    monitor: &Monitor,
    ctx: &JobContext,
    job: &JobPlan,
    (index, attempt, step): (usize, u32, &StepPlan),
    (demand, reservation): (admission_core::Demand, CallReservation),
    timeout: Option<Duration>,
) -> Result<Stepped, JobOutcome> {
    let clock = &world.clock;
    let grant = match monitor.admit_blocking(demand, ctx, timeout) {
        Ok(grant) => grant,
        Err(error) => return refused(world, job, error).map(Stepped::without_call),
    };
    let db = match world.results.as_ref().filter(|_| step.uses_db) {
        Some(results) => match results.open() {
            Ok(handle) => Some((results, handle)),
            Err(error) => return Err(JobOutcome::Failed(format!("{error:#}"))),
        },
        None => None,
    };
    let (holding, granted_at) = begin_call(world, job, step, &grant);
    let response = world
        .call_blocking(job, index, attempt, step)
        .map_err(call_failed)?;
    settle(reservation, step, &response);
    let next = world.feedback(job.model, &response, attempt);
    if next == Next::Done {
        std::thread::sleep(clock.to_real(step.tool_time));
    }
    if let Some((results, handle)) = db {
        let row = result_row(job, index, attempt, step, &response, world.now());
        count_stored(world, results.store(handle, &row))?;
    }
    let report = step_report(&response);
    holding.leave();
    add_duration(
        &world.metrics.http_held_ns,
        world.now().saturating_sub(granted_at),
    );
    drop(grant);
    Ok(Stepped {
        next,
        report: Some(report),
    })
}
