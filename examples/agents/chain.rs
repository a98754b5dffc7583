//! The hold-and-wait strategy: the chain of single-limit waits that services write today, and
//! that admission's design rules out.
//!
//! Each step takes its limits one after another, in a fixed order (which at least avoids
//! deadlock) and keeps each one while it waits for the next: a tokio [`Semaphore`] permit for the
//! HTTP connection, then the model gate's permit, then the model's tokens (a loop of one `ask`
//! and a sleep until the instant its "not now" names), the model's window, a database permit and the
//! search API's window. The limiters are the same families the monitor strategy uses; only the
//! way of waiting differs. While a model-a step waits minutes for tokens it holds an HTTP
//! connection nobody else can use, and model-b steps queue behind it at the semaphore. The
//! example measures that: connection time spent holding while waiting, and what it does to the
//! plentiful model's throughput.
//!
//! Every wait still has a deadline (the same admit timeout) and ends on Ctrl-C. All agents run as
//! tasks here: the chain is async code.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use admission_core::{Account, Amount, Answer, Ask, Clock, Instant};
use admission_llm::spend::SpendGate;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::stats::{Holding, JobOutcome, add_duration};
use crate::workload::{JobPlan, StepPlan};
use crate::world::{DB, HTTP, Next, World, settle};

/// The chain's own semaphores and its line counters.
#[derive(Debug)]
pub struct Chain {
    /// HTTP connections.
    pub http: Arc<Semaphore>,
    /// Model gates, by model id.
    pub gates: BTreeMap<String, Arc<Semaphore>>,
    /// Database connections.
    pub db: Arc<Semaphore>,
    /// Steps still acquiring their limits (the chain's "line").
    pub acquiring: AtomicU64,
    /// Of those, steps that hold an HTTP connection while they wait for a later limit.
    pub holding_while_waiting: AtomicU64,
}

impl Chain {
    /// Semaphores of the same sizes as the world's limits.
    pub fn new(world: &World) -> Chain {
        let gates = world
            .registry
            .models()
            .into_iter()
            .filter_map(|model| {
                let spec = world.registry.spec(&model).ok()?;
                let cap = usize::try_from(spec.max_concurrent?).ok()?;
                Some((model, Arc::new(Semaphore::new(cap))))
            })
            .collect();
        Chain {
            http: Arc::new(Semaphore::new(permits(world.settings.http_connections))),
            gates,
            db: Arc::new(Semaphore::new(permits(world.settings.db_connections))),
            acquiring: AtomicU64::new(0),
            holding_while_waiting: AtomicU64::new(0),
        }
    }
}

fn permits(n: u64) -> usize {
    usize::try_from(n)
        .unwrap_or(usize::MAX)
        .min(Semaphore::MAX_PERMITS)
}

/// Counts up while alive.
struct Counted<'a>(&'a AtomicU64);

impl<'a> Counted<'a> {
    fn new(counter: &'a AtomicU64) -> Counted<'a> {
        counter.fetch_add(1, Ordering::AcqRel);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a finished acquisition holds.
struct Held<'w> {
    permits: Vec<OwnedSemaphorePermit>,
    holding: Holding<'w>,
    http_at: Duration,
}

/// Runs one agent through the chain.
pub async fn run_job(world: Arc<World>, chain: Arc<Chain>, job: Arc<JobPlan>) {
    let budget = world.budget(&job);
    let outcome = job_steps(&world, &chain, &job, &*budget).await;
    world.job_spent(&budget);
    world.metrics.job_ended(job.model, &outcome, world.now());
}

async fn job_steps(
    world: &World,
    chain: &Chain,
    job: &JobPlan,
    budget: &dyn SpendGate,
) -> JobOutcome {
    let clock = &world.clock;
    if world.stop.sleep(clock.to_real(job.start_after)).await {
        return JobOutcome::Cancelled;
    }
    for (index, step) in job.steps.iter().enumerate() {
        let mut attempt = 0;
        loop {
            // The same price and cap as the monitor's steps, judged before any wait (the chain
            // takes its own limits, so only the reservation of the priced call is kept).
            let reservation = match world.price_step(job, step, budget) {
                Ok((_, reservation)) => reservation,
                Err(outcome) => return outcome,
            };
            let held = match acquire(world, chain, job, step).await {
                Ok(held) => held,
                Err(outcome) => return outcome,
            };
            // The server holds the answer for the call's latency, every permit held meanwhile.
            let response = match world.call(job, index, attempt, step).await {
                Ok(response) => response,
                Err(error) => return JobOutcome::Failed(format!("{error:#}")),
            };
            settle(reservation, step, &response);
            let next = world.feedback(job.model, &response, attempt);
            if next == Next::Done {
                clock.sleep(step.tool_time).await;
            }
            held.holding.leave();
            add_duration(
                &world.metrics.http_held_ns,
                world.now().saturating_sub(held.http_at),
            );
            drop(held.permits);
            match next {
                Next::Done => break,
                Next::Retry(after) => {
                    attempt += 1;
                    if attempt > world.settings.retries {
                        return JobOutcome::GaveUp;
                    }
                    world.metrics.retries.fetch_add(1, Ordering::Relaxed);
                    if world.stop.sleep(clock.to_real(after)).await {
                        return JobOutcome::Cancelled;
                    }
                }
            }
        }
    }
    JobOutcome::Completed
}

/// Takes the step's limits one by one, holding each while waiting for the next.
async fn acquire<'w>(
    world: &'w World,
    chain: &Chain,
    job: &JobPlan,
    step: &StepPlan,
) -> Result<Held<'w>, JobOutcome> {
    let asked_at = world.now();
    let deadline = world
        .clock
        .now()
        .saturating_add(world.settings.admit_timeout);
    let _line = Counted::new(&chain.acquiring);
    let mut permits = Vec::with_capacity(3);

    permits.push(acquire_permit(world, &chain.http, deadline).await?);
    let http_at = world.now();
    let waiting_while_holding = Counted::new(&chain.holding_while_waiting);
    // The holding enters each gauge as its permit is won, and leaves them all when the step
    // ends or fails.
    let mut holding = world.metrics.hold([HTTP]);

    if let Some(gate) = chain.gates.get(job.model) {
        permits.push(acquire_permit(world, gate, deadline).await?);
        holding.enter(&format!("{}:concurrency", job.model));
    }
    let tokens = step.input_tokens + step.max_output_tokens;
    let bucket = world
        .registry
        .bucket(job.model)
        .map_err(|e| JobOutcome::Failed(e.to_string()))?;
    wait_account(world, &*bucket, Amount::pair(tokens, 1), deadline).await?;
    // From here on the tokens are spent: a later timeout strands them.
    let stranded = |outcome: JobOutcome| {
        if outcome == JobOutcome::TimedOut {
            world
                .metrics
                .tokens_stranded
                .fetch_add(tokens, Ordering::Relaxed);
        }
        outcome
    };
    let window = world
        .registry
        .window(job.model)
        .map_err(|e| JobOutcome::Failed(e.to_string()))?;
    if let Some(window) = window {
        wait_account(world, &*window, Amount::ONE, deadline)
            .await
            .map_err(stranded)?;
    }
    if step.uses_db {
        permits.push(
            acquire_permit(world, &chain.db, deadline)
                .await
                .map_err(stranded)?,
        );
        holding.enter(DB);
    }
    if step.uses_search {
        wait_account(world, &*world.search, Amount::ONE, deadline)
            .await
            .map_err(stranded)?;
    }
    drop(waiting_while_holding);
    let now = world.now();
    add_duration(&world.metrics.http_idle_ns, now.saturating_sub(http_at));
    world
        .metrics
        .record_grant(job, tokens, now.saturating_sub(asked_at), now);
    Ok(Held {
        permits,
        holding,
        http_at,
    })
}

/// One semaphore permit, or the deadline, or Ctrl-C.
async fn acquire_permit(
    world: &World,
    semaphore: &Arc<Semaphore>,
    deadline: Instant,
) -> Result<OwnedSemaphorePermit, JobOutcome> {
    tokio::select! {
        permit = semaphore.clone().acquire_owned() => {
            permit.map_err(|_| JobOutcome::Cancelled)
        }
        () = world.clock.sleep_until(deadline) => Err(JobOutcome::TimedOut),
        () = world.stop.triggered() => Err(JobOutcome::Cancelled),
    }
}

/// Takes `amount` from a time-replenished account, asking once per try and sleeping until the
/// instant its "not now" names: the wait a single-limit rate limiter does on its own.
async fn wait_account(
    world: &World,
    account: &dyn Account,
    amount: Amount,
    deadline: Instant,
) -> Result<(), JobOutcome> {
    loop {
        let at = match account.ask(amount, Ask::HEAD) {
            Answer::Taken => return Ok(()),
            Answer::NotNow(Some(at)) => at,
            Answer::NotNow(None) => {
                return Err(JobOutcome::Failed(format!(
                    "`{}` can never grant {amount:?}",
                    account.name()
                )));
            }
            Answer::Never(refusal) => {
                return Err(JobOutcome::Failed(format!(
                    "`{}` refused: {refusal}",
                    account.name()
                )));
            }
        };
        let now = world.clock.now();
        if at > deadline {
            // It cannot fit in time: wait out the deadline, as a timed-out admission does.
            tokio::select! {
                () = world.clock.sleep_until(deadline) => return Err(JobOutcome::TimedOut),
                () = world.stop.triggered() => return Err(JobOutcome::Cancelled),
            }
        }
        if at <= now {
            // Another waiter won the race for what was there; look again a moment later.
            if world.stop.sleep(Duration::from_millis(1)).await {
                return Err(JobOutcome::Cancelled);
            }
            continue;
        }
        tokio::select! {
            () = world.clock.sleep_until(at) => {}
            () = world.stop.triggered() => return Err(JobOutcome::Cancelled),
        }
    }
}
