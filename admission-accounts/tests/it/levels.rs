//! Priority levels through a real monitor on a fake clock: a higher level stands before a lower
//! level's head, the other levels leave a level's reserve aside (always on a token bucket, on a
//! gate only while the level has a waiter parked), an exempt level ignores reserves, and a job
//! naming a level the monitor does not have, or one that can never fit beside the reserves, is
//! refused at once.

use std::sync::Arc;

use admission_accounts::token_bucket::TokenBucketConfig;
use admission_accounts::{CountingGate, TokenBucket};
use admission_core::{
    AdmitError, Amount, Demand, Grant, JobContext, Level, Levels, Monitor, TryAdmitError,
};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;

/// A monitor with manual passes and the levels `health` (exempt), `interactive` (reserving
/// `tokens` of `model` and `permits` of `http`) and `batch`.
fn monitor(clock: &FakeClock, tokens: u64, permits: u64) -> Monitor {
    let levels = Levels::new()
        .level(Level::new("health").exempt())
        .and_then(|l| {
            l.level(
                Level::new("interactive")
                    .reserve("model", Amount::pair(tokens, 0))
                    .reserve("http", Amount::units(permits)),
            )
        })
        .and_then(|l| l.level(Level::new("batch")))
        .expect("valid levels");
    Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .levels(levels)
        .build()
}

/// A monitor with manual passes and the levels `interactive` and `batch`, the batch level
/// reserving `amount` of the account named `account`.
fn batch_reserving(clock: &FakeClock, account: &str, amount: Amount) -> Monitor {
    let levels = Levels::new()
        .level(Level::new("interactive"))
        .and_then(|l| l.level(Level::new("batch").reserve(account, amount)))
        .expect("valid levels");
    Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .levels(levels)
        .build()
}

/// 6,000 tokens a minute (100 a second), the bucket full.
fn model(clock: &FakeClock) -> Arc<TokenBucket> {
    let config = TokenBucketConfig::new(6_000, 6_000);
    Arc::new(TokenBucket::new("model", config, clock.shared()).expect("a valid config"))
}

fn job(level: &str) -> JobContext {
    JobContext::new(format!("{level} job")).with_level(level)
}

fn tokens(model: &Arc<TokenBucket>, n: u64) -> Demand {
    Demand::new().with(model.clone(), Amount::pair(n, 1))
}

fn permits(http: &Arc<CountingGate>, n: u64) -> Demand {
    Demand::new().with(http.clone(), Amount::units(n))
}

/// `try_admit`, its grant owned (so that the demand and the job may be temporaries).
fn try_hold(monitor: &Monitor, demand: &Demand, ctx: &JobContext) -> Result<Grant, TryAdmitError> {
    monitor
        .try_admit(demand, ctx)
        .map(|grant| grant.into_owned())
}

#[test]
fn a_newcomer_of_a_higher_level_stands_before_a_lower_levels_head() {
    let clock = FakeClock::new();
    let monitor = monitor(&clock, 0, 0);
    let http = Arc::new(CountingGate::http(1, clock.shared()).expect("a valid gate"));
    let holder = try_hold(&monitor, &permits(&http, 1), &job("batch")).expect("a free permit");
    let mut first_batch = monitor.admit(permits(&http, 1), &job("batch"), None);
    let mut second_batch = monitor.admit(permits(&http, 1), &job("batch"), None);
    let mut interactive = monitor.admit(permits(&http, 1), &job("interactive"), None);
    assert!(poll_once(&mut first_batch).is_none());
    assert!(poll_once(&mut second_batch).is_none());
    assert!(poll_once(&mut interactive).is_none());
    assert_eq!(monitor.queue_size(), 3);
    drop(holder);
    let granted = poll_once(&mut interactive)
        .expect("the interactive job goes first")
        .expect("granted");
    assert!(poll_once(&mut first_batch).is_none());
    drop(granted);
    let granted = poll_once(&mut first_batch)
        .expect("then the batch head")
        .expect("granted");
    assert!(poll_once(&mut second_batch).is_none());
    drop(granted);
    assert!(poll_once(&mut second_batch).expect("and the last").is_ok());
}

#[test]
fn the_other_levels_always_leave_a_reserve_on_a_token_bucket() {
    let clock = FakeClock::new();
    let monitor = monitor(&clock, 1_000, 0);
    let model = model(&clock);
    // 5,500 tokens can never fit beside the interactive level's 1,000: refused, not told to
    // wait, even on the lock-free path (nobody waits).
    match try_hold(&monitor, &tokens(&model, 5_500), &job("batch")) {
        Err(TryAdmitError::Admit(AdmitError::Refused { account, .. })) => {
            assert_eq!(account, "model")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let first = try_hold(&monitor, &tokens(&model, 1_000), &job("batch")).expect("room");
    // 4,500 of the 5,000 left would leave 500 of the reserve: not now, even with nobody waiting
    // (the lock-free path leaves the reserve too).
    match try_hold(&monitor, &tokens(&model, 4_500), &job("batch")) {
        Err(TryAdmitError::WouldWait { short, .. }) => assert_eq!(short.as_deref(), Some("model")),
        other => panic!("expected to wait, got {other:?}"),
    }
    drop(first);
    clock.advance(std::time::Duration::from_secs(10));
    let batch = try_hold(&monitor, &tokens(&model, 5_000), &job("batch"))
        .expect("5,000 leaves the reserve whole");
    // A job of no level is of the default level (the last: batch).
    match try_hold(&monitor, &tokens(&model, 1), &JobContext::new("no level")) {
        Err(TryAdmitError::WouldWait { .. }) => {}
        other => panic!("expected to wait, got {other:?}"),
    }
    let interactive = try_hold(&monitor, &tokens(&model, 1_000), &job("interactive"))
        .expect("the reserve is the interactive level's to take");
    drop((batch, interactive));
    // A parked batch job waits for its tokens plus the reserve: 500 + 1,000 at 100 a second.
    let mut parked = monitor.admit(tokens(&model, 500), &job("batch"), None);
    assert!(poll_once(&mut parked).is_none());
    clock.advance(std::time::Duration::from_millis(14_990));
    monitor.pass_now();
    assert!(
        poll_once(&mut parked).is_none(),
        "1,499 tokens are not enough"
    );
    clock.advance(std::time::Duration::from_millis(10));
    monitor.pass_now();
    assert!(poll_once(&mut parked).expect("1,500 tokens").is_ok());
}

#[test]
fn a_gate_reserve_is_lent_while_its_level_has_nobody_parked() {
    let clock = FakeClock::new();
    let monitor = monitor(&clock, 0, 1);
    let model = model(&clock);
    let http = Arc::new(CountingGate::http(3, clock.shared()).expect("a valid gate"));
    // Nobody of the interactive level waits: the batch level borrows its permit.
    let borrowed: Vec<_> = (0..3)
        .map(|_| try_hold(&monitor, &permits(&http, 1), &job("batch")).expect("lent"))
        .collect();
    drop(borrowed);
    let drained =
        try_hold(&monitor, &tokens(&model, 6_000), &job("interactive")).expect("the full bucket");
    let held = try_hold(&monitor, &permits(&http, 1), &job("batch")).expect("a free permit");
    // An interactive job short on tokens (not on permits) waits at the head ...
    let both = permits(&http, 1).with(model.clone(), Amount::pair(100, 1));
    let mut interactive = monitor.admit(both, &job("interactive"), None);
    assert!(poll_once(&mut interactive).is_none());
    // ... and while it waits, a batch job leaves its reserved permit aside: with 2 free and the
    // head's 1 set aside, the last free one is the interactive level's.
    let mut batch = monitor.admit(permits(&http, 1), &job("batch"), None);
    assert!(
        poll_once(&mut batch).is_none(),
        "the reserved permit is not lent"
    );
    assert_eq!(http.available(), 2);
    // The interactive job withdraws: its level lends the permit again, and the withdrawal asks
    // the line itself (no pass of the test's).
    drop(interactive);
    assert!(poll_once(&mut batch).expect("lent again").is_ok());
    drop((drained, held));
}

#[test]
fn an_exempt_level_takes_what_the_others_reserve() {
    let clock = FakeClock::new();
    let monitor = monitor(&clock, 1_000, 0);
    let model = model(&clock);
    let batch = try_hold(&monitor, &tokens(&model, 5_000), &job("batch"))
        .expect("5,000 leaves the reserve whole");
    let health = try_hold(&monitor, &tokens(&model, 1_000), &job("health"))
        .expect("exempt: the reserve is no obstacle");
    drop((batch, health));
}

#[test]
fn a_job_naming_a_level_the_monitor_lacks_or_never_fitting_beside_reserves_is_refused() {
    let clock = FakeClock::new();
    let monitor = monitor(&clock, 1_000, 0);
    let model = model(&clock);
    let mut unknown = monitor.admit(tokens(&model, 1), &job("nightly"), None);
    match poll_once(&mut unknown) {
        Some(Err(error @ AdmitError::UnknownLevel { .. })) => assert_eq!(
            error.to_string(),
            format!(
                "job {} asks for the priority level `nightly`, which this monitor does not have (it has: health, interactive, batch)",
                match &error {
                    AdmitError::UnknownLevel { job, .. } => *job,
                    _ => unreachable!(),
                }
            )
        ),
        other => panic!("expected an unknown level, got {other:?}"),
    }
    // 5,500 tokens fit the bucket, but never beside the interactive level's 1,000.
    let mut never = monitor.admit(tokens(&model, 5_500), &job("batch"), None);
    match poll_once(&mut never) {
        Some(Err(AdmitError::Refused { account, refusal })) => {
            assert_eq!(account, "model");
            assert!(
                refusal.message().starts_with(
                    "5500+1 can never fit beside the 1000 reserved for other priority levels; asked for both, the account says: `model` allows 6000 tokens"
                ),
                "{}",
                refusal.message()
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(monitor.queue_size(), 0, "nothing parked");
}

/// A level's reserve on an elastic window is not the head's amount: after the cooldown, a job
/// behind a head that does not use the window waits for the probe's turn (the head may leave,
/// and it may become the head) instead of being refused as though the probe were out.
#[test]
fn a_reserve_on_an_elastic_window_does_not_make_the_head_claim_its_probe() {
    use admission_accounts::ElasticWindow;
    use admission_accounts::elastic_window::{CircuitState, ElasticWindowConfig};
    use std::time::Duration;

    let clock = FakeClock::new();
    let levels = Levels::new()
        .level(Level::new("interactive").reserve("search", Amount::ONE))
        .and_then(|l| l.level(Level::new("batch")))
        .expect("valid levels");
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .levels(levels)
        .build();
    let config = ElasticWindowConfig::new(60, Duration::from_secs(60)).with_max_throttle(0.0);
    let search =
        Arc::new(ElasticWindow::new("search", config, clock.shared()).expect("a valid config"));
    for _ in 0..3 {
        search.record_failure("HTTP 503");
    }
    assert_eq!(search.circuit_state(), CircuitState::Blocked);
    clock.advance(Duration::from_secs(30));
    // The head waits on a gate with nothing free, and does not use the window.
    let http = Arc::new(CountingGate::http(1, clock.shared()).expect("a valid gate"));
    let holder = try_hold(&monitor, &permits(&http, 1), &job("batch")).expect("free");
    let mut head = monitor.admit(permits(&http, 1), &job("batch"), None);
    assert!(poll_once(&mut head).is_none());
    // A window requires a connection: another gate's, which the head does not use either.
    let other_http = Arc::new(CountingGate::http(1, clock.shared()).expect("a valid gate"));
    let one_search = permits(&other_http, 1).with(search.clone(), Amount::ONE);
    let mut behind = monitor.admit(one_search, &job("batch"), None);
    assert!(
        poll_once(&mut behind).is_none(),
        "behind a head that does not use the window, the probe is not refused"
    );
    assert_eq!(monitor.queue_size(), 2);
    drop(holder);
}

/// A lower level reserving a gate, its waiter parked behind a higher level's head that wants the
/// gate too and is short on it only for that reserve: the head does not claim the gate, so the
/// waiter takes from its reserve (leaving the head's permit aside), its level stops waiting, and
/// the head is granted after it. Were the gate claimed, each would wait for the other.
#[test]
fn a_head_short_only_for_a_lower_levels_lendable_reserve_does_not_block_that_level() {
    let clock = FakeClock::new();
    let monitor = batch_reserving(&clock, "pool", Amount::units(2));
    let pool = Arc::new(CountingGate::new("pool", 2, clock.shared()).expect("a valid gate"));
    let other = Arc::new(CountingGate::new("other", 1, clock.shared()).expect("a valid gate"));
    let holder = try_hold(&monitor, &permits(&other, 1), &job("batch")).expect("free");
    let both = permits(&pool, 1).with(other.clone(), Amount::ONE);
    let mut batch = monitor.admit(both, &job("batch"), None);
    assert!(poll_once(&mut batch).is_none(), "short on the other gate");
    let mut interactive = monitor.admit(permits(&pool, 1), &job("interactive"), None);
    assert!(
        poll_once(&mut interactive).is_none(),
        "the batch level's reserve is the whole pool while it waits"
    );
    drop(holder);
    let batch_grant = poll_once(&mut batch)
        .expect("the batch job takes from its reserve")
        .expect("granted");
    let interactive_grant = poll_once(&mut interactive)
        .expect("then nobody of the batch level waits: the head goes")
        .expect("granted");
    assert_eq!(pool.available(), 0);
    drop((batch_grant, interactive_grant));
}

/// A pool of 100 whose batch level reserves 30, 50 of it held by a batch job, an interactive
/// head of 80 (held back by that reserve while batch waits) and a batch waiter of `batch` behind
/// it: once the 50 come back, which of the two is granted first and what the pool has left
/// then, and the same for the other once the first gives back (never both at once).
fn head_of_80_and_a_batch_waiter_of(batch: u64) -> [(&'static str, u64); 2] {
    let clock = FakeClock::new();
    let levels = Levels::new()
        .level(Level::new("interactive"))
        .and_then(|l| l.level(Level::new("batch").reserve("pool", Amount::units(30))))
        .expect("valid levels");
    let monitor = Monitor::builder()
        .clock(clock.shared())
        .levels(levels)
        .build();
    let pool = Arc::new(CountingGate::new("pool", 100, clock.shared()).expect("a valid gate"));
    let holder = try_hold(&monitor, &permits(&pool, 50), &job("batch")).expect("free");
    let mut waiters = [
        (
            "interactive",
            monitor.admit(permits(&pool, 80), &job("interactive"), None),
        ),
        (
            "batch",
            monitor.admit(permits(&pool, batch), &job("batch"), None),
        ),
    ];
    for (name, admit) in &mut waiters {
        assert!(poll_once(admit).is_none(), "{name} waits");
    }
    drop(holder);
    let mut served = Vec::new();
    for _ in 0..2 {
        let mut granted: Vec<_> = waiters
            .iter_mut()
            .filter(|(name, _)| served.iter().all(|(s, _)| s != name))
            .filter_map(|(name, admit)| Some((*name, poll_once(admit)?.expect("granted"))))
            .collect();
        assert_eq!(granted.len(), 1, "one at a time: 80 + {batch} > 100");
        let (name, grant) = granted.remove(0);
        served.push((name, pool.available()));
        drop(grant);
    }
    [served[0], served[1]]
}

/// The batch waiter asks 30, its own reserve: it leaves aside only the part of the head's
/// demand beyond that reserve (50), so it goes; then its level waits no more and the head goes
/// once it gives back. Leaving the head's whole demand, each would wait for the other with the
/// pool empty.
#[test]
fn a_lower_levels_waiter_within_its_reserve_goes_before_a_head_that_reserve_holds_back() {
    assert_eq!(
        head_of_80_and_a_batch_waiter_of(30),
        [("batch", 70), ("interactive", 20)]
    );
}

/// The batch waiter asks 60, more than its reserve: it cannot go beside the head's 80 less
/// that reserve (60 + 50 > 100), and nobody else is asked for the reserve. The head borrows
/// it: it goes, and the waiter goes once it gives back. Else each would wait for the other
/// with the pool empty, for good.
#[test]
fn a_head_borrows_a_lower_levels_reserve_that_levels_waiters_cannot_use() {
    assert_eq!(
        head_of_80_and_a_batch_waiter_of(60),
        [("interactive", 20), ("batch", 40)]
    );
}

/// A lower level reserving part of a token bucket takes from that reserve while a higher
/// level's head waits for the refill, as far as the reserve, and earns it back as the higher
/// level is granted there: `reserve / (capacity - reserve)` of each grant (here 1,200 of 6,000,
/// so a quarter). Before, the batch level got nothing of its reserve for as long as the
/// interactive level kept a head waiting on the bucket. The level reserves requests too: a dip
/// takes only from the dimensions the level reserves.
#[test]
fn a_lower_level_takes_its_token_reserve_while_a_higher_head_waits_for_the_refill() {
    use std::time::Duration;
    let clock = FakeClock::new();
    let monitor = batch_reserving(&clock, "model", Amount::pair(1_200, 20));
    let model = model(&clock);
    // The interactive level takes all but the batch level's 1,200.
    let first = try_hold(&monitor, &tokens(&model, 4_800), &job("interactive")).expect("room");
    let mut i1 = monitor.admit(tokens(&model, 2_000), &job("interactive"), None);
    let mut i2 = monitor.admit(tokens(&model, 2_000), &job("interactive"), None);
    assert!(poll_once(&mut i1).is_none() && poll_once(&mut i2).is_none());
    // 1,000 of the reserve, at once, though the head waits for the bucket.
    let mut b1 = monitor.admit(tokens(&model, 1_000), &job("batch"), None);
    let b1 = poll_once(&mut b1)
        .expect("taken from the batch level's reserve")
        .expect("granted");
    assert_eq!(model.level(), 200);
    // 500 more would be past the reserve: held, even once the bucket holds 500.
    let mut b2 = monitor.admit(tokens(&model, 500), &job("batch"), None);
    assert!(poll_once(&mut b2).is_none());
    clock.advance(Duration::from_secs(3));
    monitor.pass_now();
    assert_eq!(model.level(), 500);
    assert!(
        poll_once(&mut b2).is_none(),
        "1,000 + 500 is past the 1,200 reserved"
    );
    assert!(poll_once(&mut i1).is_none());
    // The head waits for its 2,000 and the 1,200 it leaves aside, from the 200 left: 30 s, 10 s
    // more than without the batch level's 1,000 (its bound: the reserve over the rate).
    clock.advance(Duration::from_millis(26_990));
    monitor.pass_now();
    assert!(poll_once(&mut i1).is_none(), "3,199 tokens are not enough");
    clock.advance(Duration::from_millis(10));
    monitor.pass_now();
    let i1 = poll_once(&mut i1).expect("3,200 tokens").expect("granted");
    // The head's 2,000 earned the batch level back 500 of its reserve: its 500 goes beside the
    // next interactive head (1,000 - 500 + 500 is within 1,200).
    let b2 = poll_once(&mut b2)
        .expect("500 of the reserve earned back")
        .expect("granted");
    assert_eq!(model.level(), 700);
    assert!(poll_once(&mut i2).is_none());
    // 300 more is past the reserve again (1,000 + 300): held, and the second head is served at
    // 55 s, from 700 at 100 a second.
    let mut b3 = monitor.admit(tokens(&model, 300), &job("batch"), None);
    assert!(poll_once(&mut b3).is_none());
    clock.advance(Duration::from_millis(24_990));
    monitor.pass_now();
    assert!(poll_once(&mut i2).is_none());
    clock.advance(Duration::from_millis(10));
    monitor.pass_now();
    assert!(poll_once(&mut i2).expect("3,200 tokens again").is_ok());
    drop((first, i1, b1, b2));
}

/// A dip takes only from the dimensions a level reserves: a batch level reserving tokens but no
/// requests does not take the requests a higher head waits for (else its jobs of no tokens
/// would take every request the bucket refills, and the head would wait for good).
#[test]
fn a_lower_level_does_not_dip_into_a_dimension_it_does_not_reserve() {
    use std::time::Duration;
    let clock = FakeClock::new();
    let monitor = batch_reserving(&clock, "model", Amount::pair(1_200, 0));
    // One request a second.
    let config = TokenBucketConfig::new(6_000, 60);
    let model = Arc::new(TokenBucket::new("model", config, clock.shared()).expect("valid"));
    let ask = |tokens: u64, requests: u64| {
        Demand::new().with(model.clone(), Amount::pair(tokens, requests))
    };
    let first = try_hold(&monitor, &ask(100, 60), &job("interactive")).expect("every request");
    let mut head = monitor.admit(ask(100, 2), &job("interactive"), None);
    assert!(poll_once(&mut head).is_none());
    let mut batch = monitor.admit(ask(0, 1), &job("batch"), None);
    assert!(poll_once(&mut batch).is_none());
    clock.advance(Duration::from_secs(1));
    monitor.pass_now();
    assert!(
        poll_once(&mut batch).is_none(),
        "the one request refilled is the head's: the batch level reserves no requests"
    );
    assert!(poll_once(&mut head).is_none());
    clock.advance(Duration::from_secs(1));
    monitor.pass_now();
    let head = poll_once(&mut head)
        .expect("two requests at 2 s")
        .expect("granted");
    assert!(poll_once(&mut batch).is_none());
    clock.advance(Duration::from_secs(1));
    monitor.pass_now();
    assert!(poll_once(&mut batch).expect("then the batch job").is_ok());
    drop((first, head));
}

/// A pass run by a release may stop once the head is short on every account it touched; a
/// grant in it that earns a lower level back part of its reserve does not let it stop there,
/// since that level's waiter may take from it now beside the next head. Here the http permit's
/// release grants the interactive head (its 2,000 tokens earning the batch level 500), and the
/// batch level's 500 goes in the same pass, though the next head is short on both accounts.
#[test]
fn a_release_pass_that_earns_a_lower_level_its_reserve_back_asks_that_levels_waiters() {
    use std::time::Duration;
    let clock = FakeClock::new();
    let monitor = batch_reserving(&clock, "model", Amount::pair(1_200, 20));
    let model = model(&clock);
    let http = Arc::new(CountingGate::http(1, clock.shared()).expect("a valid gate"));
    let call = || {
        Demand::new()
            .with(http.clone(), Amount::ONE)
            .with(model.clone(), Amount::pair(2_000, 1))
    };
    let holder = try_hold(&monitor, &permits(&http, 1), &job("interactive")).expect("a permit");
    let first = try_hold(&monitor, &tokens(&model, 4_800), &job("interactive")).expect("room");
    let mut h1 = monitor.admit(call(), &job("interactive"), None);
    let mut h2 = monitor.admit(call(), &job("interactive"), None);
    assert!(poll_once(&mut h1).is_none() && poll_once(&mut h2).is_none());
    let mut b1 = monitor.admit(tokens(&model, 1_000), &job("batch"), None);
    let b1 = poll_once(&mut b1)
        .expect("from the reserve")
        .expect("granted");
    let mut b2 = monitor.admit(tokens(&model, 500), &job("batch"), None);
    assert!(poll_once(&mut b2).is_none(), "past the reserve");
    // The bucket refills to 3,200 with no pass; the permit's release runs one.
    clock.advance(Duration::from_secs(30));
    drop(holder);
    let h1 = poll_once(&mut h1).expect("the head").expect("granted");
    assert!(
        poll_once(&mut b2).is_some_and(|granted| granted.is_ok()),
        "the batch job goes in the release's pass, beside the next head"
    );
    assert!(poll_once(&mut h2).is_none());
    assert_eq!(model.level(), 700);
    drop((first, h1, b1));
}
