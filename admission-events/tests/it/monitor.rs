//! The sinks installed on a real [`Monitor`]: what a job's passage records, and a failing sink
//! that admission never notices.

use std::io;
use std::sync::Arc;

use admission_core::event::{EventKind, EventSink, amount_of};
use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Demand, JobContext, Monitor, Refusal,
    Replenishment, WakeFn, WakeSlot,
};
use admission_events::{Fanout, JsonLinesSink, Recorder};
use parking_lot::Mutex;

/// The smallest counting account: `capacity` permits returned on release.
struct Counter {
    capacity: u64,
    /// Permits taken and not given back.
    in_use: Mutex<u64>,
    wake: WakeSlot,
}

impl Counter {
    fn new(capacity: u64) -> Arc<Counter> {
        Arc::new(Counter {
            capacity,
            in_use: Mutex::new(0),
            wake: WakeSlot::new(),
        })
    }

    fn in_use(&self) -> u64 {
        *self.in_use.lock()
    }

    fn check(&self, in_use: u64, mine: Amount, reserved: Amount) -> Result<bool, Refusal> {
        if mine.primary() > self.capacity {
            return Err(Refusal::new("more permits than exist"));
        }
        Ok(mine.primary() + reserved.primary() + in_use <= self.capacity)
    }
}

#[derive(Debug, serde::Serialize)]
struct CounterStatus {
    in_use: u64,
    capacity: u64,
}

impl AccountStatus for CounterStatus {
    fn name(&self) -> &str {
        "counter"
    }
    fn category(&self) -> Category {
        Category::custom("semaphore")
    }
    fn summary(&self) -> String {
        format!("counter: {} of {} in use", self.in_use, self.capacity)
    }
}

impl Account for Counter {
    fn name(&self) -> &str {
        "counter"
    }
    fn category(&self) -> Category {
        Category::custom("semaphore")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let mut in_use = self.in_use.lock();
        match self.check(*in_use, mine, ask.reserved_ahead()) {
            Ok(true) => {
                if ask.takes() {
                    *in_use += mine.primary();
                }
                Answer::Taken
            }
            Ok(false) => Answer::NotNow(None),
            Err(refusal) => Answer::Never(refusal),
        }
    }
    fn give(&self, amount: Amount) {
        {
            let mut in_use = self.in_use.lock();
            *in_use = in_use.saturating_sub(amount.primary());
        }
        self.wake.notify();
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(CounterStatus {
            in_use: self.in_use(),
            capacity: self.capacity,
        })
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

/// A writer that fails every write.
struct Broken;

impl io::Write for Broken {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::other("disk full"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_fast_path_grant_records_granted_immediate_then_released() {
    let recorder = Arc::new(Recorder::new());
    let monitor = Monitor::builder()
        .manual_passes()
        .sink(recorder.clone())
        .build();
    let counter = Counter::new(2);
    let ctx = JobContext::new("j");

    let demand = Demand::new().with(counter.clone(), Amount::ONE);
    let grant = monitor.admit_blocking(demand, &ctx, None).unwrap();
    assert_eq!(counter.in_use(), 1);
    drop(grant);
    assert_eq!(counter.in_use(), 0);

    assert_eq!(recorder.kinds(), ["granted_immediate", "released"]);
    let events = recorder.for_job(ctx.id());
    assert_eq!(events.len(), 2);
    assert_eq!(&*events[0].job.name, "j");
    assert_eq!(events[0].entries[0].account, "counter");
    assert_eq!(events[0].entries[0].category, Category::custom("semaphore"));
    assert_eq!(amount_of(&events[0]), 1);
    assert_eq!(events[1].kind, EventKind::Released { rolled_back: false });
}

#[test]
fn a_refusal_records_a_circuit_blocked_rejection() {
    let recorder = Arc::new(Recorder::new());
    let monitor = Monitor::builder()
        .manual_passes()
        .sink(recorder.clone())
        .build();
    let counter = Counter::new(2);

    let demand = Demand::new().with(counter.clone(), Amount::units(3));
    assert!(
        monitor
            .admit_blocking(demand, &JobContext::new("too big"), None)
            .is_err()
    );

    assert_eq!(recorder.kinds(), ["rejected"]);
    assert_eq!(recorder.count("rejected"), 1);
}

#[test]
fn a_failing_sink_is_dropped_and_admission_goes_on() {
    let monitor = Monitor::builder()
        .manual_passes()
        .sink(Arc::new(JsonLinesSink::new(Broken)))
        .build();
    let counter = Counter::new(1);

    for _ in 0..3 {
        let demand = Demand::new().with(counter.clone(), Amount::ONE);
        let grant = monitor.admit_blocking(demand, &JobContext::new("j"), None);
        assert!(grant.is_ok());
    }
    assert_eq!(counter.in_use(), 0);
}

#[test]
fn a_fanout_keeps_recording_after_a_member_fails() {
    let recorder = Arc::new(Recorder::new());
    let fanout = Fanout::new()
        .with(Arc::new(JsonLinesSink::new(Broken)) as Arc<dyn EventSink>)
        .with(recorder.clone());
    let monitor = Monitor::builder()
        .manual_passes()
        .sink(Arc::new(fanout))
        .build();
    let counter = Counter::new(1);

    for _ in 0..2 {
        let demand = Demand::new().with(counter.clone(), Amount::ONE);
        drop(
            monitor
                .admit_blocking(demand, &JobContext::new("j"), None)
                .unwrap(),
        );
    }
    assert_eq!(
        recorder.kinds(),
        [
            "granted_immediate",
            "released",
            "granted_immediate",
            "released"
        ]
    );
}
