//! A job's handles: materialized under the grant, committed in order, closed before the permits
//! go back. Providers here are scripted to fail on cue and to log every verb.

use std::sync::Arc;

use admission_accounts::CountingGate;
use admission_core::{AdmitError, Amount, Clock, Demand, Grant, JobContext, Monitor, SystemClock};
use admission_db::{
    Aborter, CountingDbResourceProvider, DbError, DbHandle, DbPlan, DbResourceProvider, ProviderId,
};
use parking_lot::Mutex;

type Log = Arc<Mutex<Vec<String>>>;

/// A provider whose handles log their verbs, and fail the verbs named in `fail`.
struct Scripted {
    id: ProviderId,
    gate: Arc<CountingGate>,
    log: Log,
    fail: &'static [&'static str],
}

impl Scripted {
    fn new(name: &str, log: &Log, fail: &'static [&'static str]) -> Arc<Scripted> {
        let id = ProviderId::new(name);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        Arc::new(Scripted {
            gate: id.gate(4, clock).unwrap(),
            id,
            log: log.clone(),
            fail,
        })
    }
}

struct ScriptedHandle {
    id: ProviderId,
    gate: Arc<CountingGate>,
    log: Log,
    fail: &'static [&'static str],
    in_tx: bool,
    closed: bool,
}

impl ScriptedHandle {
    fn verb(&mut self, verb: &'static str) -> Result<(), DbError> {
        self.log.lock().push(format!("{} {verb}", self.id.name()));
        if self.fail.contains(&verb) {
            return Err(DbError::database(self.id.name(), verb, "scripted"));
        }
        Ok(())
    }
}

impl DbResourceProvider for Scripted {
    fn id(&self) -> &ProviderId {
        &self.id
    }
    fn admission(&self) -> &Arc<CountingGate> {
        &self.gate
    }
    fn acquire(&self, _read_only: bool) -> Result<Box<dyn DbHandle>, DbError> {
        self.log.lock().push(format!(
            "{} acquire (gate in use {})",
            self.id.name(),
            self.gate.in_use()
        ));
        if self.fail.contains(&"acquire") {
            return Err(DbError::database(self.id.name(), "acquire", "scripted"));
        }
        Ok(Box::new(ScriptedHandle {
            id: self.id.clone(),
            gate: self.gate.clone(),
            log: self.log.clone(),
            fail: self.fail,
            in_tx: false,
            closed: false,
        }))
    }
}

impl DbHandle for ScriptedHandle {
    fn provider(&self) -> &ProviderId {
        &self.id
    }
    fn read_only(&self) -> bool {
        false
    }
    fn begin(&mut self) -> Result<(), DbError> {
        self.verb("begin")?;
        self.in_tx = true;
        Ok(())
    }
    fn commit(&mut self) -> Result<(), DbError> {
        self.verb("commit")?;
        self.in_tx = false;
        Ok(())
    }
    fn await_completion(&mut self) -> Result<(), DbError> {
        Ok(())
    }
    fn rollback(&mut self) -> Result<(), DbError> {
        if !self.in_tx {
            return Ok(());
        }
        self.in_tx = false;
        self.verb("rollback")
    }
    fn close(&mut self) -> Result<(), DbError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.rollback()?;
        self.log.lock().push(format!(
            "{} close (gate in use {})",
            self.id.name(),
            self.gate.in_use()
        ));
        Ok(())
    }
    fn aborter(&self) -> Aborter {
        let (log, name) = (self.log.clone(), self.id.name().to_owned());
        Aborter::new(move || log.lock().push(format!("{name} abort")))
    }
    fn in_transaction(&self) -> bool {
        self.in_tx
    }
    fn is_closed(&self) -> bool {
        self.closed
    }
}

fn admit(monitor: &Monitor, plan: &DbPlan) -> Grant {
    monitor
        .admit_blocking(plan.demand(Demand::new()), &JobContext::new("job"), None)
        .unwrap()
}

fn taken(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock())
}

#[test]
fn commit_all_commits_in_order_and_rolls_back_the_uncommitted_rest_in_reverse() {
    let log = Log::default();
    let (a, b, c) = (
        Scripted::new("a", &log, &[]),
        Scripted::new("b", &log, &["commit"]),
        Scripted::new("c", &log, &[]),
    );
    let monitor = Monitor::new();
    let plan = DbPlan::new()
        .with(a.clone(), false)
        .with(b.clone(), false)
        .with(c.clone(), false);
    let job = plan.open(admit(&monitor, &plan)).unwrap();
    job.begin_all().unwrap();
    taken(&log);
    let errors = job.commit_all().unwrap_err();
    assert_eq!(
        errors.to_string(),
        "1 database error(s): db provider `b`: commit failed: scripted"
    );
    assert_eq!(
        taken(&log),
        ["a commit", "b commit", "c rollback", "b rollback"]
    );
    job.rollback_all().unwrap();
    assert_eq!(taken(&log), Vec::<String>::new());
    job.close().unwrap();
    assert_eq!(
        taken(&log),
        [
            "c close (gate in use 1)",
            "b close (gate in use 1)",
            "a close (gate in use 1)"
        ]
    );
    assert_eq!(
        (a.gate.in_use(), b.gate.in_use(), c.gate.in_use()),
        (0, 0, 0)
    );
}

#[test]
fn rollback_all_goes_in_reverse_and_passes_over_what_committed() {
    let log = Log::default();
    let (a, b) = (Scripted::new("a", &log, &[]), Scripted::new("b", &log, &[]));
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(a.clone(), false).with(b.clone(), false);
    let job = plan.open(admit(&monitor, &plan)).unwrap();
    job.begin_all().unwrap();
    job.commit_all().unwrap();
    job.with(1, |h| h.begin()).unwrap();
    job.with(0, |h| h.begin()).unwrap();
    taken(&log);
    job.rollback_all().unwrap();
    job.rollback_all().unwrap();
    assert_eq!(taken(&log), ["b rollback", "a rollback"]);
}

#[test]
fn a_failed_materialization_closes_what_was_taken_in_reverse_and_rolls_the_grant_back() {
    let log = Log::default();
    let (a, b, c) = (
        Scripted::new("a", &log, &[]),
        Scripted::new("b", &log, &[]),
        Scripted::new("c", &log, &["acquire"]),
    );
    let monitor = Monitor::new();
    let plan = DbPlan::new()
        .with(a.clone(), false)
        .with(b.clone(), false)
        .with(c.clone(), false);
    let errors = plan.open(admit(&monitor, &plan)).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "1 database error(s): db provider `c`: acquire failed: scripted"
    );
    assert_eq!(
        taken(&log),
        [
            "a acquire (gate in use 1)",
            "b acquire (gate in use 1)",
            "c acquire (gate in use 1)",
            "b close (gate in use 1)",
            "a close (gate in use 1)"
        ]
    );
    assert_eq!(
        (a.gate.in_use(), b.gate.in_use(), c.gate.in_use()),
        (0, 0, 0)
    );
}

#[test]
fn a_grant_without_a_permit_for_every_handle_opens_nothing() {
    let log = Log::default();
    let a = Scripted::new("a", &log, &[]);
    let monitor = Monitor::new();
    let one = DbPlan::new().with(a.clone(), false);
    let two = DbPlan::new().with(a.clone(), false).with(a.clone(), true);
    let errors = two.open(admit(&monitor, &one)).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "1 database error(s): db provider `a`: the grant holds 1 permit(s) on `db:a`, and 2 \
         handle(s) were asked (add one permit per handle to the job's demand)"
    );
    assert_eq!(taken(&log), Vec::<String>::new());
    assert_eq!(a.gate.in_use(), 0);
    let job = two.open(admit(&monitor, &two)).unwrap();
    assert_eq!((job.len(), a.gate.in_use()), (2, 2));
}

#[test]
fn force_close_aborts_closes_and_releases_once_even_against_a_concurrent_close() {
    let log = Log::default();
    let (a, b) = (Scripted::new("a", &log, &[]), Scripted::new("b", &log, &[]));
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(a.clone(), false).with(b.clone(), false);
    for _ in 0..50 {
        let job = plan.open(admit(&monitor, &plan)).unwrap();
        job.begin_all().unwrap();
        let closer = job.force_closer();
        taken(&log);
        std::thread::scope(|s| {
            s.spawn(|| closer.force_close().unwrap());
            s.spawn(|| job.close().unwrap());
        });
        let mut got = taken(&log);
        got.retain(|l| !l.ends_with("abort"));
        assert_eq!(
            got,
            [
                "b rollback",
                "b close (gate in use 1)",
                "a rollback",
                "a close (gate in use 1)"
            ]
        );
        closer.force_close().unwrap();
        assert_eq!((a.gate.in_use(), b.gate.in_use()), (0, 0));
    }
}

#[test]
fn connections_go_back_before_the_permit() {
    let log = Log::default();
    let a = Scripted::new("a", &log, &[]);
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(a.clone(), false).with(a.clone(), false);
    let job = plan.open(admit(&monitor, &plan)).unwrap();
    job.with(0, |h| h.begin()).unwrap();
    taken(&log);
    drop(job);
    assert_eq!(
        taken(&log),
        [
            "a close (gate in use 2)",
            "a rollback",
            "a close (gate in use 2)"
        ]
    );
    assert_eq!(a.gate.in_use(), 0);
}

#[test]
fn a_handle_from_another_provider_is_refused() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let one = CountingDbResourceProvider::new("one", 1, clock.clone()).unwrap();
    let two = CountingDbResourceProvider::new("one", 1, clock).unwrap();
    let mut handle = two.acquire(false).unwrap();
    let err = one.close(handle.as_mut()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "db provider `one` refused a handle of provider `one`"
    );
    assert!(!handle.is_closed());
    two.close(handle.as_mut()).unwrap();
    assert!(handle.is_closed());
}

#[test]
fn a_demand_over_the_bound_is_refused_at_once() {
    let monitor = Monitor::new();
    let db = CountingDbResourceProvider::new("orders", 2, monitor.clock().clone()).unwrap();
    let demand = Demand::new().with(db.admission().clone(), Amount::units(3));
    let err = monitor
        .admit_blocking(demand, &JobContext::new("big"), None)
        .unwrap_err();
    assert!(
        matches!(err, AdmitError::Refused { ref account, .. } if account == "db:orders"),
        "{err}"
    );
}

#[test]
fn a_failed_begin_rolls_back_those_begun_before_it_in_reverse() {
    let log = Log::default();
    let (a, b, c) = (
        Scripted::new("a", &log, &[]),
        Scripted::new("b", &log, &[]),
        Scripted::new("c", &log, &["begin"]),
    );
    let monitor = Monitor::new();
    let plan = DbPlan::new().with(a, false).with(b, false).with(c, false);
    let job = plan.open(admit(&monitor, &plan)).unwrap();
    taken(&log);
    let errors = job.begin_all().unwrap_err();
    assert_eq!(errors.errors().len(), 1);
    assert_eq!(errors.errors()[0].provider(), "c");
    assert_eq!(
        taken(&log),
        ["a begin", "b begin", "c begin", "b rollback", "a rollback"]
    );
}
