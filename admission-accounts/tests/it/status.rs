//! Status records: derived numbers, summaries, indicators, categories and serialized forms.

use std::time::Duration;

use admission_accounts::{
    CircuitState, ElasticWindowStatus, FixedWindowStatus, MemoryStatus, MemoryZone,
    SemaphoreStatus, TokenBucketStatus,
};
use admission_core::{AccountStatus, Category, Instant};

fn semaphore(max: u64, available: u64) -> SemaphoreStatus {
    SemaphoreStatus {
        name: "http".into(),
        max_concurrent: max,
        available_permits: available,
        last_activity: None,
    }
}

fn bucket(level: u64, requests_available: u64, throttle: f64) -> TokenBucketStatus {
    TokenBucketStatus {
        name: "gpt".into(),
        capacity: 90_000,
        level,
        requests_per_minute: 60,
        requests_available,
        throttle,
    }
}

fn window(circuit: CircuitState, throttle: f64) -> ElasticWindowStatus {
    ElasticWindowStatus {
        name: "search".into(),
        max_requests: 10,
        base_window: Duration::from_secs(1),
        effective_window: Duration::from_millis(1_500),
        in_use: 4,
        throttle,
        circuit,
        cooldown_remaining: Duration::from_millis(250),
    }
}

fn memory(zone: MemoryZone) -> MemoryStatus {
    MemoryStatus {
        name: "memory".into(),
        zone,
        used_bytes: 900,
        limit_bytes: 1_000,
        floor_percent: 80.0,
        penalty: 2.0,
        spacing: Duration::from_nanos(17_777_777_778),
        line: 2,
    }
}

fn fixed() -> FixedWindowStatus {
    FixedWindowStatus {
        name: "sms".into(),
        limit: 100,
        period: Duration::from_secs(60),
        used: 40,
        window_start: Instant::from_nanos(120_000_000_000),
    }
}

#[test]
fn semaphore_active_count_is_the_maximum_less_the_available() {
    assert_eq!(semaphore(8, 5).active_count(), 3);
    assert_eq!(semaphore(8, 8).active_count(), 0);
    assert_eq!(semaphore(8, 0).active_count(), 8);
    assert_eq!(semaphore(2, 5).active_count(), 0);
}

#[test]
fn semaphore_summary_names_its_numbers() {
    let mut status = semaphore(8, 5);
    assert_eq!(
        status.summary(),
        "http [semaphore]: 3 of 8 permits in use, 5 available, no activity yet"
    );
    status.last_activity = Some(Instant::from_nanos(1_500_000_000));
    assert_eq!(
        status.summary(),
        "http [semaphore]: 3 of 8 permits in use, 5 available, last activity at 1.5s"
    );
    assert_eq!(status.name(), "http");
    assert_eq!(status.category(), Category::custom("semaphore"));
    assert_eq!(status.indicator(), None);
}

#[test]
fn semaphore_serializes_its_fields_and_the_stamp_in_nanoseconds() {
    let mut status = semaphore(8, 5);
    status.last_activity = Some(Instant::from_nanos(7));
    assert_eq!(
        serde_json::to_string(&status).unwrap(),
        r#"{"name":"http","max_concurrent":8,"available_permits":5,"last_activity":7}"#
    );
}

#[test]
fn token_bucket_needs_a_request_slot_even_with_tokens() {
    assert!(!bucket(90_000, 0, 0.0).has_capacity(1));
    assert!(!bucket(90_000, 0, 0.0).has_capacity(0));
}

#[test]
fn token_bucket_has_capacity_for_exactly_its_level() {
    assert!(bucket(1_200, 1, 0.0).has_capacity(1_200));
    assert!(!bucket(1_200, 1, 0.0).has_capacity(1_201));
    assert!(bucket(0, 1, 0.0).has_capacity(0));
    assert!(!bucket(0, 1, 0.0).has_capacity(1));
}

#[test]
fn token_bucket_indicator_is_the_stretch_factor_while_throttled() {
    assert_eq!(
        bucket(0, 0, 1.0).indicator().as_deref(),
        Some("throttle:2.0x")
    );
    assert_eq!(
        bucket(0, 0, 0.5).indicator().as_deref(),
        Some("throttle:1.5x")
    );
    assert_eq!(
        bucket(0, 0, 9.0).indicator().as_deref(),
        Some("throttle:10.0x")
    );
    assert_eq!(bucket(0, 0, 0.0).indicator(), None);
}

#[test]
fn token_bucket_summary_names_its_numbers() {
    let status = bucket(1_200, 4, 0.5);
    assert_eq!(
        status.summary(),
        "gpt [token_bucket]: 1200 of 90000 tokens, 4 of 60 requests/min available, throttle 0.5"
    );
    assert_eq!(status.category(), Category::custom("token_bucket"));
    assert_eq!(status.name(), "gpt");
}

#[test]
fn token_bucket_serializes_its_fields() {
    assert_eq!(
        serde_json::to_string(&bucket(1_200, 4, 0.5)).unwrap(),
        r#"{"name":"gpt","capacity":90000,"level":1200,"requests_per_minute":60,"requests_available":4,"throttle":0.5}"#
    );
}

#[test]
fn elastic_window_indicator_puts_the_circuit_before_the_throttle() {
    assert_eq!(
        window(CircuitState::Blocked, 9.0).indicator().as_deref(),
        Some("blocked")
    );
    assert_eq!(
        window(CircuitState::Probing, 9.0).indicator().as_deref(),
        Some("probing")
    );
    assert_eq!(
        window(CircuitState::Healthy, 1.0).indicator().as_deref(),
        Some("throttle:2.0x")
    );
    assert_eq!(
        window(CircuitState::Healthy, 0.5).indicator().as_deref(),
        Some("throttle:1.5x")
    );
    assert_eq!(window(CircuitState::Healthy, 0.0).indicator(), None);
}

#[test]
fn elastic_window_serializes_durations_in_milliseconds_and_the_circuit_in_snake_case() {
    assert_eq!(
        serde_json::to_string(&window(CircuitState::Probing, 0.5)).unwrap(),
        concat!(
            r#"{"name":"search","max_requests":10,"base_window":1000.0,"effective_window":1500.0,"#,
            r#""in_use":4,"throttle":0.5,"circuit":"probing","cooldown_remaining":250.0}"#
        )
    );
    assert_eq!(
        serde_json::to_string(&CircuitState::Healthy).unwrap(),
        r#""healthy""#
    );
    assert_eq!(
        serde_json::to_string(&CircuitState::Blocked).unwrap(),
        r#""blocked""#
    );
}

#[test]
fn elastic_window_summary_names_its_numbers() {
    let status = window(CircuitState::Blocked, 0.5);
    assert_eq!(
        status.summary(),
        "search [elastic_window]: 4 of 10 requests in a 1.5s window (base 1s), throttle 0.5, \
         circuit blocked, cooldown 250ms"
    );
    assert_eq!(status.category(), Category::custom("elastic_window"));
}

#[test]
fn memory_indicator_is_the_pace_in_whole_milliseconds_except_when_green() {
    assert_eq!(memory(MemoryZone::Green).indicator(), None);
    assert_eq!(
        memory(MemoryZone::Draining).indicator().as_deref(),
        Some("pace:17777ms")
    );
    assert_eq!(
        memory(MemoryZone::Critical).indicator().as_deref(),
        Some("pace:17777ms")
    );
    let mut status = memory(MemoryZone::Draining);
    status.spacing = Duration::from_micros(50_999);
    assert_eq!(status.indicator().as_deref(), Some("pace:50ms"));
}

#[test]
fn every_indicator_speaks_the_one_vocabulary() {
    let indicators: Vec<Option<String>> = vec![
        semaphore(8, 0).indicator(),
        bucket(0, 0, 0.0).indicator(),
        bucket(0, 0, 1.5).indicator(),
        window(CircuitState::Healthy, 0.0).indicator(),
        window(CircuitState::Healthy, 0.5).indicator(),
        window(CircuitState::Blocked, 0.5).indicator(),
        window(CircuitState::Probing, 0.5).indicator(),
        memory(MemoryZone::Green).indicator(),
        memory(MemoryZone::Draining).indicator(),
        memory(MemoryZone::Critical).indicator(),
        fixed().indicator(),
    ];
    let expected: Vec<Option<String>> = [
        None,
        None,
        Some("throttle:2.5x"),
        None,
        Some("throttle:1.5x"),
        Some("blocked"),
        Some("probing"),
        None,
        Some("pace:17777ms"),
        Some("pace:17777ms"),
        None,
    ]
    .into_iter()
    .map(|i| i.map(str::to_owned))
    .collect();
    assert_eq!(indicators, expected);
}

#[test]
fn memory_zone_serializes_in_upper_case() {
    let zones = [
        MemoryZone::Green,
        MemoryZone::Draining,
        MemoryZone::Critical,
    ];
    assert_eq!(
        serde_json::to_string(&zones).unwrap(),
        r#"["GREEN","DRAINING","CRITICAL"]"#
    );
    assert_eq!(
        serde_json::to_string(&memory(MemoryZone::Critical)).unwrap(),
        concat!(
            r#"{"name":"memory","zone":"CRITICAL","used_bytes":900,"limit_bytes":1000,"#,
            r#""floor_percent":80.0,"penalty":2.0,"spacing":17777.777778,"line":2}"#
        )
    );
}

#[test]
fn memory_summary_names_its_numbers() {
    let status = memory(MemoryZone::Draining);
    assert_eq!(
        status.summary(),
        "memory [memory]: DRAINING, 900 of 1000 bytes used (90.0%), floor 80.0%, penalty 2.00, \
         spacing 17.777777778s, 2 waiting"
    );
    assert_eq!(status.category(), Category::custom("memory"));
}

#[test]
fn memory_usage_of_a_zero_limit_is_zero_percent() {
    let mut status = memory(MemoryZone::Green);
    status.limit_bytes = 0;
    assert_eq!(status.used_percent(), 0.0);
}

#[test]
fn fixed_window_counts_what_remains_and_when_it_resets() {
    let mut status = fixed();
    assert_eq!(status.remaining(), 60);
    assert_eq!(status.window_end(), Instant::from_nanos(180_000_000_000));
    status.used = 120;
    assert_eq!(status.remaining(), 0);
    status.window_start = Instant::MAX;
    assert_eq!(status.window_end(), Instant::MAX);
}

#[test]
fn fixed_window_summary_category_and_serialized_form() {
    let status = fixed();
    assert_eq!(
        status.summary(),
        "sms [fixed_window]: 40 of 100 used in the 60s window from 120s, 60 remaining"
    );
    assert_eq!(status.category(), Category::custom("fixed_window"));
    assert_eq!(status.category().as_str(), "fixed_window");
    assert_eq!(status.indicator(), None);
    assert_eq!(
        serde_json::to_string(&status).unwrap(),
        r#"{"name":"sms","limit":100,"period":60000.0,"used":40,"window_start":120000000000}"#
    );
}

#[test]
fn boxed_records_serialize_through_the_account_status_trait() {
    let statuses: Vec<Box<dyn AccountStatus>> = vec![
        Box::new(semaphore(2, 1)),
        Box::new(bucket(10, 1, 0.0)),
        Box::new(window(CircuitState::Healthy, 0.0)),
        Box::new(memory(MemoryZone::Green)),
        Box::new(fixed()),
    ];
    let categories: Vec<&str> = statuses.iter().map(|s| s.category().as_str()).collect();
    assert_eq!(
        categories,
        [
            "semaphore",
            "token_bucket",
            "elastic_window",
            "memory",
            "fixed_window"
        ]
    );
    let json = serde_json::to_value(&statuses).unwrap();
    assert_eq!(json[0]["available_permits"], 1);
    assert_eq!(json[4]["period"], 60_000.0);
}
