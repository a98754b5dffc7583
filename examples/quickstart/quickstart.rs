//! A small runnable tour: eight jobs share three HTTP connections and a model's tokens and
//! requests per minute, each asking for all of it at once, and every transition the monitor makes
//! is printed as it happens. The accounts are the production families a service would use: a
//! `CountingGate` for the connections and a `TokenBucket` for the model.
//!
//! Run it with `cargo run --example quickstart`.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use admission_accounts::token_bucket::TokenBucketConfig;
use admission_accounts::{CountingGate, TokenBucket};
use admission_core::event::{EventKind, SinkError};
use admission_core::{AdmitError, Amount, Demand, Event, EventSink, JobContext, Monitor};

/// Prints one line per event: when, which job, what happened.
struct Print;

impl EventSink for Print {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        let accounts: Vec<&str> = event.entries.iter().map(|e| e.account.as_str()).collect();
        let what = match &event.kind {
            EventKind::Held => format!("held on {}", accounts.join(", ")),
            EventKind::GrantedFromHold { wait, waiters } => {
                format!("granted after {wait:.2?} ({waiters} still waiting)")
            }
            EventKind::Rejected { reason, message } => format!("rejected ({reason}): {message}"),
            other => other.as_str().replace('_', " "),
        };
        println!(
            "{:>8.3}s  {:<8} {what}",
            Duration::from_nanos(event.at.as_nanos()).as_secs_f64(),
            event.job.name
        );
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let monitor = Monitor::builder().sink(Arc::new(Print)).build();
    monitor.start()?;
    // Every account reads time on the monitor's clock, so its "not before" instants are the
    // monitor's too.
    let clock = monitor.clock().clone();

    // Three connections; a model allowing 24,000 tokens and 60 requests a minute, starting with
    // the minute's budget and refilling at 400 tokens a second.
    let http = Arc::new(CountingGate::http(3, clock.clone())?);
    let model = Arc::new(TokenBucket::new(
        "model",
        TokenBucketConfig::new(24_000, 60),
        clock,
    )?);
    // A call: a 2,000-token prompt, up to 1,100 tokens of answer, one request. Seven calls fit
    // the minute's budget; the eighth waits about two seconds for the refill, holding nothing.
    let call = Amount::pair(3_100, 1);

    let jobs: Vec<_> = (1..=8)
        .map(|i| {
            let (monitor, http, model) = (monitor.clone(), http.clone(), model.clone());
            thread::spawn(move || {
                let ctx = JobContext::new(format!("job-{i}"));
                let demand = Demand::new().with(http, Amount::ONE).with(model, call);
                let grant = monitor.admit_blocking(demand, &ctx, Some(Duration::from_secs(10)))?;
                thread::sleep(Duration::from_millis(50)); // the "call"
                drop(grant); // the connection comes back; the tokens stay spent
                Ok::<_, AdmitError>(())
            })
        })
        .collect();
    for job in jobs {
        job.join().expect("a job panicked")?;
    }

    // A demand that can never fit is refused at once instead of waiting forever.
    let too_big = Demand::new().with(http.clone(), Amount::units(4));
    if let Err(refused) = monitor.admit_blocking(too_big, &JobContext::new("greedy"), None) {
        println!("a demand for 4 of 3 connections: {refused}");
    }

    monitor.stop();
    println!(
        "all jobs done; {} connections free, {} tokens left",
        http.available(),
        model.level()
    );
    Ok(())
}
