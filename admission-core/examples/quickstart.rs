//! A small runnable tour: eight jobs share three HTTP connections and a model's token meter, each
//! asking for both at once, and every transition the monitor makes is printed as it happens.
//!
//! Run it with `cargo run --example quickstart`.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use admission_core::event::{EventKind, SinkError};
use admission_core::{Amount, Clock, Demand, Event, EventSink, JobContext, Monitor, SystemClock};
use admission_testkit::reference::{Meter, Permits};

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let monitor = Monitor::builder()
        .clock(clock.clone())
        .sink(Arc::new(Print))
        .build();
    monitor.start()?;

    // Three connections; a model allowing bursts of 2,000 tokens refilled at 4,000 a second.
    let http = Arc::new(Permits::new("http", 3));
    let model = Arc::new(Meter::new("model-tokens", 2_000, 4_000, clock));

    let jobs: Vec<_> = (1..=8)
        .map(|i| {
            let (monitor, http, model) = (monitor.clone(), http.clone(), model.clone());
            thread::spawn(move || {
                let ctx = JobContext::new(format!("job-{i}"));
                let demand = Demand::new()
                    .with(http, Amount::ONE)
                    .with(model, Amount::units(700));
                let grant = monitor.admit_blocking(demand, &ctx, Some(Duration::from_secs(10)))?;
                thread::sleep(Duration::from_millis(50)); // the "call"
                drop(grant); // the connection comes back; the tokens stay spent
                Ok::<_, admission_core::AdmitError>(())
            })
        })
        .collect();
    for job in jobs {
        job.join().expect("a job panicked")?;
    }

    // A demand that can never fit is refused at once instead of waiting forever.
    let too_big = Demand::new().with(http.clone(), Amount::units(4));
    let refused = monitor.admit_blocking(too_big, &JobContext::new("greedy"), None);
    println!("a demand for 4 of 3 connections: {}", refused.unwrap_err());

    monitor.stop();
    println!("all jobs done; {} connections free", http.available());
    Ok(())
}
