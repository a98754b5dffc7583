//! The provider layer: one limiter per spec and per type, `update_limits`, the registry facade,
//! a call's whole demand through a real monitor, and feedback from the upstream's answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, SystemTime};

use admission_accounts::CountingGate;
use admission_core::{Account, AdmitError, Amount, Answer, Ask, Instant, JobContext, Monitor};
use admission_llm::RateLimitInfo;
use admission_llm::model_spec::{ModelCatalog, ModelSpec};
use admission_llm::provider::{HttpGate, LimiterFactory, LimitsUpdate, ProviderError, Registry};
use admission_llm::spend::Money;
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;

const SECOND: u64 = 1_000_000_000;

fn sonnet() -> ModelSpec {
    ModelSpec::new("sonnet", "claude-sonnet-4-5", 60_000)
        .with_requests_per_minute(30)
        .with_max_concurrent(2)
        .with_prices(3_000_000, 15_000_000)
}

fn haiku() -> ModelSpec {
    ModelSpec::new("haiku", "claude-haiku-4-5", 90_000)
}

fn search() -> ModelSpec {
    ModelSpec::new("search", "search-v1", 1_000_000).with_window(2, Duration::from_secs(10))
}

fn registry(clock: &FakeClock) -> Registry {
    let registry = Registry::new(clock.shared())
        .with_http_connections(3)
        .unwrap();
    for spec in [sonnet(), haiku(), search()] {
        registry.register(spec).unwrap();
    }
    registry
}

#[test]
fn one_bucket_per_spec_id_seeded_from_its_budgets() {
    let clock = FakeClock::new();
    let factory = LimiterFactory::new(clock.shared());
    let bucket = factory.bucket(&sonnet()).unwrap();
    assert!(Arc::ptr_eq(&bucket, &factory.bucket(&sonnet()).unwrap()));
    assert_eq!(bucket.name(), "sonnet");
    assert_eq!(bucket.config().tokens_per_minute, 60_000);
    assert_eq!(bucket.config().requests_per_minute, 30);
    assert_eq!(bucket.level(), 60_000);
    // No published rpm: tpm / 1000.
    assert_eq!(
        factory
            .bucket(&haiku())
            .unwrap()
            .config()
            .requests_per_minute,
        90
    );
}

#[test]
fn endpoint_variants_of_one_wire_model_keep_separate_buckets() {
    let clock = FakeClock::new();
    let factory = LimiterFactory::new(clock.shared());
    let us = ModelSpec::new("gpt-4o", "gpt-4o", 30_000);
    let eu = ModelSpec::new("gpt-4o-eu", "gpt-4o", 10_000);
    let (a, b) = (factory.bucket(&us).unwrap(), factory.bucket(&eu).unwrap());
    assert!(!Arc::ptr_eq(&a, &b));
    assert!(matches!(
        a.ask(Amount::pair(30_000, 1), Ask::HEAD),
        Answer::Taken
    ));
    assert_eq!((a.level(), b.level()), (0, 10_000));
}

#[test]
fn an_invalid_spec_builds_nothing() {
    let clock = FakeClock::new();
    let factory = LimiterFactory::new(clock.shared());
    let error = factory
        .bucket(&ModelSpec::new("bad", "x", 0))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "model spec `bad`: `tokens_per_minute` must be positive, was 0"
    );
    assert!(factory.existing_bucket("bad").is_none());
    assert!(factory.status().is_empty());
}

#[test]
fn a_model_gate_per_spec_that_declares_max_concurrent() {
    let clock = FakeClock::new();
    let factory = LimiterFactory::new(clock.shared());
    let gate = factory.gate(&sonnet()).unwrap();
    assert!(Arc::ptr_eq(&gate, &factory.gate(&sonnet()).unwrap()));
    assert_eq!(gate.name(), "sonnet:concurrency");
    assert_eq!(gate.capacity(), 2);

    let refused = factory.gate(&haiku()).map(|_| ()).unwrap_err();
    assert_eq!(
        refused,
        ProviderError::NoModelGate {
            model: "haiku".into()
        }
    );
    assert_eq!(
        refused.to_string(),
        "model spec `haiku` declares no max_concurrent, so it has no model gate (its account is its token bucket)"
    );
}

/// Threads racing for one shared instance.
const RACERS: usize = 8;

/// A construction that holds on until every racer is asking (`asking` counts the threads that
/// have called into the factory), then lets them run a while: the widest window a second
/// construction could use.
fn hold_the_race_open(asking: &AtomicUsize) {
    while asking.load(Ordering::SeqCst) < RACERS {
        thread::yield_now();
    }
    for _ in 0..1_000 {
        thread::yield_now();
    }
}

/// `RACERS` threads released together by a barrier, each counting itself in `asking` and then
/// asking `ask`; their answers.
fn race<T: Send + Sync + 'static>(
    factory: &Arc<LimiterFactory>,
    asking: &'static AtomicUsize,
    ask: fn(&LimiterFactory) -> Arc<T>,
) -> Vec<Arc<T>> {
    let start = Arc::new(Barrier::new(RACERS));
    let handles: Vec<_> = (0..RACERS)
        .map(|_| {
            let (factory, start) = (factory.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                asking.fetch_add(1, Ordering::SeqCst);
                ask(&factory)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn one_shared_instance_per_type_built_exactly_once_under_a_race() {
    static BUILT: AtomicUsize = AtomicUsize::new(0);
    static ASKING: AtomicUsize = AtomicUsize::new(0);
    struct Counted;
    impl Default for Counted {
        fn default() -> Counted {
            BUILT.fetch_add(1, Ordering::SeqCst);
            hold_the_race_open(&ASKING);
            Counted
        }
    }
    #[derive(Default)]
    struct Other(#[allow(dead_code)] u8);

    let clock = FakeClock::new();
    let factory = Arc::new(LimiterFactory::new(clock.shared()));
    let all = race(&factory, &ASKING, |f| f.shared::<Counted>());
    assert!(all.iter().all(|one| Arc::ptr_eq(one, &all[0])));
    assert_eq!(
        BUILT.load(Ordering::SeqCst),
        1,
        "constructions of the shared type"
    );
    assert!(Arc::ptr_eq(&all[0], &factory.shared::<Counted>()));
    assert_eq!(BUILT.load(Ordering::SeqCst), 1);

    let http = factory
        .shared_with(|| HttpGate::new(4, clock.shared()))
        .unwrap();
    let _ = factory.shared::<Other>();

    // Installing a second instance of a type answers the one already there.
    let second = Arc::new(HttpGate::new(5, clock.shared()).unwrap());
    let kept = factory.insert_shared(second).unwrap_err();
    assert!(Arc::ptr_eq(&kept, &http));
}

#[test]
fn a_fallible_shared_limiter_is_built_exactly_once_under_a_race() {
    static BUILT: AtomicUsize = AtomicUsize::new(0);
    static ASKING: AtomicUsize = AtomicUsize::new(0);
    struct Counted;
    fn build() -> Result<Counted, admission_accounts::ConfigError> {
        BUILT.fetch_add(1, Ordering::SeqCst);
        hold_the_race_open(&ASKING);
        Ok(Counted)
    }
    let factory = Arc::new(LimiterFactory::new(FakeClock::new().shared()));
    let all = race(&factory, &ASKING, |f| f.shared_with(build).unwrap());
    assert!(all.iter().all(|one| Arc::ptr_eq(one, &all[0])));
    assert_eq!(
        BUILT.load(Ordering::SeqCst),
        1,
        "constructions of the shared type"
    );
}

#[test]
fn a_shared_limiter_s_builder_may_ask_the_factory_for_other_limiters() {
    #[derive(Default)]
    struct Inner;
    struct Outer(Arc<Inner>, u64);
    let factory = LimiterFactory::new(FakeClock::new().shared());
    let outer = factory
        .shared_with(|| {
            let bucket = factory.bucket(&sonnet())?;
            Ok::<Outer, ProviderError>(Outer(factory.shared::<Inner>(), bucket.level()))
        })
        .unwrap();
    assert!(Arc::ptr_eq(&outer.0, &factory.shared::<Inner>()));
    assert_eq!(outer.1, 60_000);
}

#[test]
fn a_shared_limiter_that_cannot_be_built_is_refused_naming_its_type_and_kept_nowhere() {
    let clock = FakeClock::new();
    let factory = LimiterFactory::new(clock.shared());
    let refused = factory
        .shared_with(|| HttpGate::new(0, clock.shared()))
        .map(|_| ())
        .unwrap_err();
    match &refused {
        ProviderError::Unbuildable {
            limiter,
            reason,
            source,
        } => {
            assert_eq!(*limiter, "admission_llm::provider::HttpGate");
            assert_eq!(
                reason,
                "invalid counting gate configuration: `capacity` must be positive, was 0 (a gate \
                 without permits would refuse everyone)"
            );
            assert_eq!(source.to_string(), *reason);
            let config = source.downcast_ref::<admission_accounts::ConfigError>();
            assert_eq!(config.map(|c| c.field), Some("capacity"));
        }
        other => panic!("expected Unbuildable, got {other:?}"),
    }
    assert!(std::error::Error::source(&refused).is_some());

    // Nothing was kept: the next call builds, and the one after reuses without building.
    let built = factory
        .shared_with(|| HttpGate::new(5, clock.shared()))
        .unwrap();
    assert_eq!(built.capacity(), 5);
    let again = factory
        .shared_with::<HttpGate, admission_accounts::ConfigError>(|| {
            panic!("an existing instance is not built again")
        })
        .unwrap();
    assert!(Arc::ptr_eq(&built, &again));
}

#[test]
fn update_limits_applies_in_place_and_keeps_the_throttle() {
    let clock = FakeClock::new();
    let factory = LimiterFactory::new(clock.shared());
    let bucket = factory.bucket(&sonnet()).unwrap();
    assert!(matches!(
        bucket.ask(Amount::pair(10_000, 1), Ask::HEAD),
        Answer::Taken
    ));
    bucket.record_429();
    bucket.record_429();
    assert_eq!(bucket.throttle(), 1.0);

    assert_eq!(
        factory.update_limits("sonnet", 40_000, 20),
        LimitsUpdate::Applied
    );
    assert!(Arc::ptr_eq(
        &bucket,
        &factory.existing_bucket("sonnet").unwrap()
    ));
    assert_eq!(bucket.config().tokens_per_minute, 40_000);
    assert_eq!(bucket.config().requests_per_minute, 20);
    assert_eq!(
        bucket.level(),
        40_000,
        "50,000 left, clamped to the new budget"
    );
    assert_eq!(bucket.throttle(), 1.0, "the adaptive state is kept");
}

#[test]
fn update_limits_creates_a_missing_bucket_and_ignores_zero() {
    let clock = FakeClock::new();
    let factory = LimiterFactory::new(clock.shared());
    assert_eq!(
        factory.update_limits("new", 12_000, 6),
        LimitsUpdate::Created
    );
    let created = factory.existing_bucket("new").unwrap();
    assert_eq!(
        (created.config().tokens_per_minute, created.level()),
        (12_000, 12_000)
    );
    for (tpm, rpm) in [(0, 6), (12_000, 0), (0, 0)] {
        assert_eq!(
            factory.update_limits("new", tpm, rpm),
            LimitsUpdate::Ignored
        );
        assert_eq!(
            factory.update_limits("absent", tpm, rpm),
            LimitsUpdate::Ignored
        );
    }
    assert_eq!(created.config().tokens_per_minute, 12_000);
    assert!(factory.existing_bucket("absent").is_none());
}

#[test]
fn the_registry_names_what_is_registered_when_a_model_is_unknown() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    let error = registry.demand_for("opus", 10, 10).map(|_| ()).unwrap_err();
    assert_eq!(
        error,
        ProviderError::UnknownModel {
            model: "opus".into(),
            known: vec!["haiku".into(), "search".into(), "sonnet".into()],
        }
    );
    assert_eq!(
        error.to_string(),
        "no model spec `opus` is registered (registered: haiku, search, sonnet)"
    );
    let empty = Registry::new(clock.shared());
    assert_eq!(
        empty.bucket("x").map(|_| ()).unwrap_err().to_string(),
        "no model spec `x` is registered (registered: none)"
    );
}

#[test]
fn the_registry_serves_the_factory_s_instances() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    assert!(Arc::ptr_eq(
        &registry.bucket("sonnet").unwrap(),
        &registry.factory().bucket(&sonnet()).unwrap()
    ));
    assert!(Arc::ptr_eq(&registry.http(), &registry.http()));
    assert_eq!(registry.http().capacity(), 3);
    assert_eq!(*registry.spec("sonnet").unwrap(), sonnet());
    assert_eq!(registry.models(), ["haiku", "search", "sonnet"]);
    assert!(registry.window("haiku").unwrap().is_none());
    assert_eq!(
        registry.window("search").unwrap().unwrap().name(),
        "search:window"
    );
    assert_eq!(
        registry.price("sonnet", 1_000, 1_000).unwrap(),
        Money::from_micros(18_000)
    );
}

#[test]
fn a_catalog_registers_all_or_nothing() {
    let clock = FakeClock::new();
    let registry = Registry::new(clock.shared());
    let good = ModelCatalog {
        models: vec![sonnet(), haiku()],
    };
    registry.register_catalog(&good).unwrap();
    assert_eq!(registry.models(), ["haiku", "sonnet"]);
    let bad = ModelCatalog {
        models: vec![search(), ModelSpec::new("zero", "z", 0)],
    };
    assert!(registry.register_catalog(&bad).is_err());
    assert_eq!(
        registry.models(),
        ["haiku", "sonnet"],
        "nothing of it registered"
    );
    assert!(registry.register(ModelSpec::new("", "z", 5)).is_err());
}

const SONNET_TAKEN: &str = "model spec `sonnet` is already registered (its limiters are built \
                            from that spec: register a changed spec under a new id, or apply \
                            a provider's ceilings with update_limits)";

#[test]
fn registering_an_id_twice_is_refused_naming_it_and_changes_nothing() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    let bucket = registry.bucket("sonnet").unwrap();
    assert!(matches!(
        bucket.ask(Amount::pair(1_000, 1), Ask::HEAD),
        Answer::Taken
    ));
    let gate = registry.gate("sonnet").unwrap();

    let changed = ModelSpec::new("sonnet", "claude-sonnet-4-5", 1_000).with_max_concurrent(9);
    let refused = registry.register(changed);
    assert_eq!(
        refused,
        Err(ProviderError::Duplicate {
            model: "sonnet".to_owned()
        })
    );
    assert_eq!(
        refused.map_err(|e| e.to_string()),
        Err(SONNET_TAKEN.to_owned())
    );
    // The same spec again is refused too: an id is registered once.
    assert_eq!(
        registry.register(sonnet()).map_err(|e| e.to_string()),
        Err(SONNET_TAKEN.to_owned())
    );

    assert_eq!(*registry.spec("sonnet").unwrap(), sonnet());
    assert!(Arc::ptr_eq(&bucket, &registry.bucket("sonnet").unwrap()));
    assert_eq!(
        (bucket.config().tokens_per_minute, bucket.level()),
        (60_000, 59_000)
    );
    assert!(Arc::ptr_eq(&gate, &registry.gate("sonnet").unwrap()));
    assert_eq!(gate.capacity(), 2);
    let call = registry.demand_for("sonnet", 10, 10).unwrap();
    assert_eq!(call.price, Money::from_micros(180));
}

#[test]
fn a_catalog_naming_a_registered_id_is_refused_whole() {
    let clock = FakeClock::new();
    let registry = Registry::new(clock.shared());
    registry.register(sonnet()).unwrap();
    let catalog = ModelCatalog {
        models: vec![
            haiku(),
            ModelSpec::new("sonnet", "claude-sonnet-4-5", 1_000),
        ],
    };
    assert_eq!(
        registry
            .register_catalog(&catalog)
            .map_err(|e| e.to_string()),
        Err(SONNET_TAKEN.to_owned())
    );
    assert_eq!(registry.models(), ["sonnet"], "nothing of it registered");
    assert_eq!(*registry.spec("sonnet").unwrap(), sonnet());
}

#[test]
fn demand_for_builds_the_whole_call() {
    let clock = FakeClock::new();
    let registry = registry(&clock);

    let call = registry.demand_for("sonnet", 1_200, 800).unwrap();
    assert_eq!(call.model(), "sonnet");
    assert_eq!(call.wire_model(), "claude-sonnet-4-5");
    assert_eq!(call.tokens, 2_000);
    assert_eq!(call.price, Money::from_micros(3_600 + 12_000));
    let entries: Vec<(String, Amount)> = call
        .demand
        .entries()
        .iter()
        .map(|e| (e.account().name().to_owned(), e.amount()))
        .collect();
    assert_eq!(
        entries,
        [
            ("http".to_owned(), Amount::ONE),
            ("sonnet".to_owned(), Amount::pair(2_000, 1)),
            ("sonnet:concurrency".to_owned(), Amount::ONE),
        ]
    );

    // No gate, no window: the HTTP connection and the bucket only.
    let plain = registry.demand_for("haiku", 10, 20).unwrap();
    assert_eq!(plain.demand.len(), 2);
    assert_eq!(plain.price, Money::ZERO);
    // A window: its call is part of the demand.
    let windowed = registry.demand_for("search", 10, 0).unwrap();
    let names: Vec<&str> = windowed
        .demand
        .entries()
        .iter()
        .map(|e| e.account().name())
        .collect();
    assert_eq!(names, ["http", "search", "search:window"]);
    // The demand satisfies the window's HTTP requirement.
    assert!(windowed.demand.check_requirements().is_ok());
    // Saturates rather than overflowing.
    assert_eq!(
        registry.demand_for("haiku", u64::MAX, 5).unwrap().tokens,
        u64::MAX
    );
}

#[test]
fn a_call_is_granted_whole_and_its_tokens_stay_spent() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let bucket = registry.bucket("sonnet").unwrap();
    let gate = registry.gate("sonnet").unwrap();

    let call = |n: &str| {
        let demand = registry.demand_for("sonnet", 20_000, 5_000).unwrap().demand;
        Box::pin(monitor.admit(demand, &JobContext::new(n.to_owned()), None))
    };
    let first = poll_once(&mut call("a")).unwrap().unwrap();
    let second = poll_once(&mut call("b")).unwrap().unwrap();
    assert_eq!(
        (registry.http().in_use(), gate.in_use(), bucket.level()),
        (2, 2, 10_000)
    );

    // The model gate is full: the third waits holding nothing, though tokens would not fit
    // either (25,000 asked, 10,000 left).
    let mut third = call("c");
    assert!(poll_once(&mut third).is_none());
    assert_eq!(registry.http().in_use(), 2);

    drop(first);
    assert_eq!((registry.http().in_use(), gate.in_use()), (1, 1));
    // The gate is free again; tokens are short by 15,000 at 60,000 a minute: 15 s.
    assert_eq!(monitor.pass_now(), Some(Instant::from_nanos(15 * SECOND)));
    clock.advance(Duration::from_secs(15));
    monitor.pass_now();
    let third = poll_once(&mut third).expect("granted at 15 s").unwrap();
    assert_eq!(
        (registry.http().in_use(), gate.in_use(), bucket.level()),
        (2, 2, 0)
    );
    drop((second, third));
    assert_eq!((registry.http().in_use(), gate.in_use()), (0, 0));
    assert_eq!(bucket.level(), 0, "the tokens stay spent");
}

#[test]
fn a_call_larger_than_the_budget_is_refused_at_once() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    let monitor = Monitor::builder()
        .manual_passes()
        .clock(clock.shared())
        .build();
    let call = registry.demand_for("sonnet", 50_000, 10_001).unwrap();
    let outcome = monitor.admit_blocking(call.demand, &JobContext::new("huge"), None);
    assert!(
        matches!(outcome, Err(AdmitError::Refused { .. })),
        "{outcome:?}"
    );
    assert_eq!(registry.http().in_use(), 0);
    assert_eq!(registry.bucket("sonnet").unwrap().level(), 60_000);
}

#[test]
fn feedback_reaches_the_bucket_and_the_window() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    // Build the limiters first: feedback touches only what exists.
    registry.demand_for("search", 1, 1).unwrap();
    registry.demand_for("sonnet", 1, 1).unwrap();
    let (bucket, window) = (
        registry.bucket("search").unwrap(),
        registry.window("search").unwrap().unwrap(),
    );

    registry.on_rate_limit_error("search", &RateLimitInfo::rate_limited("search"));
    assert_eq!(bucket.throttle(), 0.5, "a 429 is one increment");
    assert_eq!(window.throttle(), 1.0);
    assert_eq!(
        bucket.config().tokens_per_minute,
        1_000_000,
        "a bare 429 carries no ceilings"
    );

    registry.on_overload("search", "529 overloaded");
    assert_eq!(bucket.throttle(), 2.0, "an overload is three increments");
    assert_eq!(window.throttle(), 2.0);
    assert_eq!(window.last_failure().as_deref(), Some("529 overloaded"));

    for _ in 0..3 {
        registry.on_success("search");
    }
    assert_eq!(bucket.throttle(), 1.8);
    assert_eq!(window.throttle(), 1.8);

    // Feedback on a model without limiters changes nothing and does not panic.
    registry.on_success("unknown");
    registry.on_rate_limit_error("unknown", &RateLimitInfo::rate_limited("unknown"));
    assert!(registry.factory().existing_bucket("unknown").is_none());
}

#[test]
fn a_429_with_ceilings_and_a_capacity_reading_update_the_limits() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    let bucket = registry.bucket("sonnet").unwrap();

    let limited = RateLimitInfo::rate_limited_from_pairs(
        "sonnet",
        [
            ("x-ratelimit-limit-tokens", "40000"),
            ("x-ratelimit-limit-requests", "20"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("retry-after", "7"),
        ],
        SystemTime::UNIX_EPOCH,
    );
    registry.on_rate_limit_error("sonnet", &limited);
    assert_eq!(bucket.throttle(), 0.5);
    assert_eq!(
        (
            bucket.config().tokens_per_minute,
            bucket.config().requests_per_minute
        ),
        (40_000, 20)
    );

    let reading = RateLimitInfo::from_pairs(
        "sonnet",
        [
            ("anthropic-ratelimit-tokens-limit", "80000"),
            ("anthropic-ratelimit-requests-limit", "50"),
        ],
        SystemTime::UNIX_EPOCH,
    );
    assert_eq!(registry.observe(&reading), LimitsUpdate::Applied);
    assert_eq!(bucket.config().tokens_per_minute, 80_000);
    assert_eq!(bucket.throttle(), 0.5, "the adaptive state is kept");

    // Only tokens known: not a pair, ignored.
    let half = RateLimitInfo::from_pairs(
        "sonnet",
        [("x-ratelimit-limit-tokens", "1")],
        SystemTime::UNIX_EPOCH,
    );
    assert_eq!(registry.observe(&half), LimitsUpdate::Ignored);
    // A reading about a model without a spec creates its bucket.
    let other = RateLimitInfo::from_pairs(
        "gpt-4o",
        [
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-limit-requests", "500"),
        ],
        SystemTime::UNIX_EPOCH,
    );
    assert_eq!(registry.observe(&other), LimitsUpdate::Created);
    assert_eq!(registry.bucket("gpt-4o").unwrap().level(), 30_000);
}

#[test]
fn status_covers_everything_and_clear_empties_it() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    for model in ["sonnet", "search", "haiku"] {
        registry.demand_for(model, 1, 1).unwrap();
    }
    let names: Vec<String> = registry
        .status()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "http",
            "haiku",
            "search",
            "search:window",
            "sonnet",
            "sonnet:concurrency"
        ]
    );
    let old = registry.bucket("sonnet").unwrap();

    registry.clear();
    assert!(registry.models().is_empty());
    assert!(registry.factory().status().is_empty());
    assert!(registry.bucket("sonnet").is_err());
    assert_eq!(
        registry.http().capacity(),
        3,
        "the configured capacity stays"
    );
    registry.register(sonnet()).unwrap();
    assert!(!Arc::ptr_eq(&old, &registry.bucket("sonnet").unwrap()));
}

#[test]
fn the_http_gate_reads_the_registry_s_clock() {
    let clock = FakeClock::new();
    let registry = Registry::new(clock.shared());
    clock.advance(Duration::from_secs(7));
    let http = registry.http();
    assert_eq!(http.capacity(), HttpGate::DEFAULT_CAPACITY);
    assert!(matches!(http.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    assert_eq!(
        http.last_activity(),
        Some(Instant::from_nanos(7 * SECOND)),
        "stamped on the registry's clock"
    );
    http.give(Amount::ONE);
}

#[test]
fn clear_keeps_the_configured_http_gate_s_capacity_and_clock() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    assert_eq!(registry.http().capacity(), 3);
    registry.clear();
    clock.advance(Duration::from_secs(2));
    let http = registry.http();
    assert_eq!(http.capacity(), 3, "not reverted to the default");
    assert!(matches!(http.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    assert_eq!(http.last_activity(), Some(Instant::from_nanos(2 * SECOND)));
    http.give(Amount::ONE);
    assert!(Arc::ptr_eq(&http, &registry.http()));
}

#[test]
fn the_provider_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Registry>();
    send_sync::<LimiterFactory>();
    send_sync::<HttpGate>();
    send_sync::<ProviderError>();
    send_sync::<CountingGate>();
}

/// A `MakeWriter` target that appends to a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_429_logs_the_upstream_s_reading_at_warn() {
    let clock = FakeClock::new();
    let registry = registry(&clock);
    registry.bucket("sonnet").unwrap();
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .without_time()
        .finish();
    let info = RateLimitInfo::rate_limited_from_pairs(
        "sonnet",
        [
            ("x-ratelimit-limit-tokens", "40000"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("retry-after", "7"),
        ],
        SystemTime::UNIX_EPOCH,
    );
    tracing::subscriber::with_default(subscriber, || {
        registry.on_rate_limit_error("sonnet", &info);
    });
    let logged = String::from_utf8(out.0.lock().clone()).unwrap();
    assert_eq!(
        logged.trim_end(),
        " WARN admission_llm::provider: upstream rate limited a call model=\"sonnet\" \
         reading=sonnet rate limited kind=tokens tokens=0/40000 retry-after 7s"
    );
}
