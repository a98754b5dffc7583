//! The shell's own behaviour seen through a `Monitor`: a long pass lets go of the lock between
//! its batches.

use std::sync::{Arc, Mutex, OnceLock};

use crate::event::{Event, EventKind, EventSink, SinkError};
use crate::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Demand, JobContext, Monitor, Refusal,
    Replenishment, WakeFn, WakeSlot,
};

/// Permits under a lock: the smallest release account.
struct Permits {
    free: Mutex<u64>,
    wake: WakeSlot,
}

#[derive(Debug, serde::Serialize)]
struct Free(u64);

impl AccountStatus for Free {
    fn name(&self) -> &str {
        "permits"
    }
    fn category(&self) -> Category {
        Category::custom("permits")
    }
    fn summary(&self) -> String {
        format!("{} free", self.0)
    }
}

impl Account for Permits {
    fn name(&self) -> &str {
        "permits"
    }
    fn category(&self) -> Category {
        Category::custom("permits")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let mut free = self.free.lock().unwrap();
        if mine.primary() > 1_000 {
            return Answer::Never(Refusal::new("too many"));
        }
        if mine.primary() + ask.reserved_ahead().primary() > *free {
            return Answer::NotNow(None);
        }
        if ask.takes() {
            *free -= mine.primary();
        }
        Answer::Taken
    }
    fn give(&self, amount: Amount) {
        *self.free.lock().unwrap() += amount.primary();
        self.wake.notify();
    }
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(Free(*self.free.lock().unwrap()))
    }
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
}

/// Records each grant from the line with the line's length seen as it is emitted: events
/// are emitted with the monitor lock free, so the sink may look at its monitor.
#[derive(Default)]
struct LineSeen {
    monitor: OnceLock<Monitor>,
    seen: Mutex<Vec<(String, usize)>>,
}

impl EventSink for LineSeen {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        if let EventKind::GrantedFromHold { .. } = event.kind {
            let waiting = self.monitor.get().map_or(usize::MAX, Monitor::queue_size);
            self.seen
                .lock()
                .unwrap()
                .push((event.job.name.to_string(), waiting));
        }
        Ok(())
    }
}

#[test]
fn a_release_granting_a_long_line_lets_go_of_the_lock_between_batches() {
    let sink = Arc::new(LineSeen::default());
    let monitor = Monitor::builder()
        .manual_passes()
        .pass_batch(2)
        .sink(sink.clone())
        .build();
    assert!(sink.monitor.set(monitor.clone()).is_ok());
    let permits = Arc::new(Permits {
        free: Mutex::new(5),
        wake: WakeSlot::new(),
    });
    let units = |n: u64| Demand::new().with(permits.clone(), Amount::units(n));
    let holder = monitor
        .admit_blocking(units(5), &JobContext::new("holder"), None)
        .unwrap();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut parked: Vec<_> = (0..5)
        .map(|i| {
            let mut admit =
                Box::pin(monitor.admit(units(1), &JobContext::new(format!("w{i}")), None));
            assert!(admit.as_mut().poll(&mut cx).is_pending());
            admit
        })
        .collect();
    // The release's pass grants the line in three critical sections of at most two waiters;
    // between them the granted leave the line and are told while the lock is free.
    drop(holder);
    let seen = sink.seen.lock().unwrap().clone();
    let expected: Vec<(String, usize)> = [("w0", 3), ("w1", 3), ("w2", 1), ("w3", 1), ("w4", 0)]
        .into_iter()
        .map(|(job, waiting)| (job.to_owned(), waiting))
        .collect();
    assert_eq!(seen, expected);
    for admit in &mut parked {
        assert!(matches!(
            admit.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Ok(_))
        ));
    }
    drop(parked);
    assert_eq!(*permits.free.lock().unwrap(), 5);
    monitor.stop();
}
