//! All four families in one demand, through a real monitor on a fake clock: the whole demand or
//! nothing, held once per short account, granted when the last short account frees up.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::elastic_window::ElasticWindowConfig;
use admission_accounts::token_bucket::TokenBucketConfig;
use admission_accounts::{CountingGate, ElasticWindow, FixedWindow, TokenBucket};
use admission_core::{AccountRef, AdmitError, Amount, Demand, JobContext, Monitor};
use admission_events::Recorder;
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;

struct Fleet {
    clock: FakeClock,
    monitor: Monitor,
    recorder: Arc<Recorder>,
    http: Arc<CountingGate>,
    model: Arc<TokenBucket>,
    search: Arc<ElasticWindow>,
    crm: Arc<FixedWindow>,
}

fn fleet() -> Fleet {
    let clock = FakeClock::new();
    let recorder = Arc::new(Recorder::new());
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .sink(recorder.clone())
        .build();
    Fleet {
        http: Arc::new(CountingGate::http(2, clock.shared()).unwrap()),
        // 6,000 tokens and 60 requests a minute: 100 tokens and one request a second.
        model: Arc::new(
            TokenBucket::new("model", TokenBucketConfig::new(6_000, 60), clock.shared()).unwrap(),
        ),
        search: Arc::new(
            ElasticWindow::new(
                "search",
                ElasticWindowConfig::new(2, Duration::from_secs(10)),
                clock.shared(),
            )
            .unwrap(),
        ),
        crm: Arc::new(
            FixedWindow::of("crm", 3, Duration::from_secs(1))
                .unwrap()
                .with_clock(clock.shared()),
        ),
        clock,
        monitor,
        recorder,
    }
}

impl Fleet {
    /// One call: a connection, 2,000 tokens and a request, a search slot, a CRM permit.
    fn call(&self) -> Demand {
        Demand::new()
            .with(self.http.clone(), Amount::ONE)
            .with(self.model.clone(), Amount::pair(2_000, 1))
            .with(self.search.clone(), Amount::ONE)
            .with(self.crm.clone(), Amount::ONE)
    }
}

#[test]
fn a_demand_over_all_four_families_is_granted_whole_when_its_last_short_account_frees() {
    let f = fleet();
    let first = f
        .monitor
        .admit_blocking(f.call(), &JobContext::new("first"), None)
        .unwrap();
    let second = f
        .monitor
        .admit_blocking(f.call(), &JobContext::new("second"), None)
        .unwrap();
    assert_eq!(f.http.in_use(), 2);
    assert_eq!(f.model.level(), 2_000);
    assert_eq!(f.search.in_use(), 2);
    assert_eq!(f.crm.snapshot().used, 2);

    // The third call is short on the connection gate and the search window.
    let ctx = JobContext::new("third");
    let mut third = Box::pin(f.monitor.admit(f.call(), &ctx, None));
    assert!(poll_once(&mut third).is_none());
    f.monitor.pass_now();
    assert_eq!(f.model.level(), 2_000, "a waiter holds nothing");
    assert_eq!(f.crm.snapshot().used, 2);

    f.clock.advance(Duration::from_secs(4));
    drop(first); // the connection comes back; the search slot stays spent until its window passes
    assert!(poll_once(&mut third).is_none());
    assert_eq!(f.http.in_use(), 1);

    f.clock.advance(Duration::from_secs(6)); // t = 10 s: the oldest search stamps leave
    f.monitor.pass_now();
    let grant = poll_once(&mut third).unwrap().unwrap();
    assert_eq!(grant.wall_wait(), Duration::from_secs(10));
    let wait_times = grant.wait_times();
    let waits: Vec<(&str, Duration)> = wait_times.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        waits,
        [
            ("http", Duration::from_secs(4)),
            ("search", Duration::from_secs(10))
        ]
    );
    // 2,000 left at t = 0, plus 1,000 refilled over 10 s, less this call's 2,000.
    assert_eq!(f.model.level(), 1_000);
    assert_eq!(f.http.in_use(), 2);
    assert_eq!(f.search.in_use(), 1);
    assert_eq!(f.crm.snapshot().used, 1, "a new CRM window");

    let kinds: Vec<String> = f
        .recorder
        .for_job(ctx.id())
        .iter()
        .map(|e| format!("{}:{}", e.kind.as_str(), e.entries.len()))
        .collect();
    assert_eq!(kinds, ["held:1", "held:1", "granted_from_hold:4"]);

    // A rollback returns the metered debits too; a release only the connection.
    let mut grant = grant;
    grant.rollback();
    assert_eq!(f.model.level(), 3_000);
    assert_eq!(f.http.in_use(), 1);
    assert_eq!(f.search.in_use(), 0);
    drop(second);
    assert_eq!(f.http.in_use(), 0);
    assert_eq!(
        f.model.level(),
        3_000,
        "a release keeps metered debits spent"
    );
}

#[test]
fn a_window_without_its_http_gate_and_a_demand_above_a_budget_are_refused_at_once() {
    let f = fleet();
    let search: AccountRef = f.search.clone();
    let alone = Demand::new().with(search, Amount::ONE);
    let error = f
        .monitor
        .admit_blocking(alone, &JobContext::new("no-connection"), None)
        .unwrap_err();
    assert!(matches!(error, AdmitError::Unmet { .. }), "{error}");

    let too_many_tokens = Demand::new()
        .with(f.http.clone(), Amount::ONE)
        .with(f.model.clone(), Amount::pair(6_001, 1));
    let error = f
        .monitor
        .admit_blocking(too_many_tokens, &JobContext::new("greedy"), None)
        .unwrap_err();
    match error {
        AdmitError::Refused { account, .. } => assert_eq!(account, "model"),
        other => panic!("expected a refusal, got {other}"),
    }
    assert_eq!(f.http.in_use(), 0, "nothing was kept");
    assert_eq!(f.model.level(), 6_000);
}
