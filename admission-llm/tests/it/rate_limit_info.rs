//! Rate-limit headers: the rate-limited record, capacity readings from the OpenAI-style and
//! Anthropic-style header families (as pairs and as an `http::HeaderMap`), the reset and
//! retry-after forms as a reading shows them, bad values, and property tests showing reading
//! never panics on any input. Each parser's exact answers are unit tests beside it
//! (`src/rate_limit_info/parse/tests.rs`).

use std::time::{Duration, SystemTime};

use admission_llm::RateLimitInfo;
use admission_llm::rate_limit_info::LimitKind;
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};

/// 2026-01-01T00:00:00Z.
fn fixed_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn rate_limited_knows_only_that_a_limit_was_hit() {
    let info = RateLimitInfo::rate_limited("gpt-4o");
    assert_eq!(info.model, "gpt-4o");
    assert!(info.rate_limited);
    assert_eq!(info.kind, LimitKind::Unknown);
    assert_eq!(info.retry_after, Some(secs(60)));
    assert_eq!(info.request_limit, None);
    assert_eq!(info.request_remaining, None);
    assert_eq!(info.token_limit, None);
    assert_eq!(info.token_remaining, None);
    assert_eq!(info.input_token_limit, None);
    assert_eq!(info.output_token_remaining, None);
    assert_eq!(info.request_reset, None);
    assert_eq!(info.token_reset, None);
    assert_eq!(info.requests_per_minute(), 0);
    assert_eq!(info.tokens_per_minute(), 0);
}

#[test]
fn openai_headers_are_a_capacity_reading() {
    let info = RateLimitInfo::from_pairs(
        "gpt-4o",
        [
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "29500"),
            ("x-ratelimit-reset-tokens", "1s"),
            ("content-type", "application/json"),
        ],
        fixed_now(),
    );
    assert!(!info.rate_limited);
    assert_eq!(info.model, "gpt-4o");
    assert_eq!(info.kind, LimitKind::Capacity);
    assert_eq!(info.request_limit, Some(500));
    assert_eq!(info.request_remaining, Some(499));
    assert_eq!(info.request_reset, Some(Duration::from_millis(120)));
    assert_eq!(info.token_limit, Some(30_000));
    assert_eq!(info.token_remaining, Some(29_500));
    assert_eq!(info.token_reset, Some(secs(1)));
    assert_eq!(info.retry_after, None);
    assert_eq!(info.input_token_limit, None);
    assert_eq!(info.output_token_limit, None);
    assert_eq!(info.requests_per_minute(), 500);
    assert_eq!(info.tokens_per_minute(), 30_000);
}

#[test]
fn anthropic_headers_are_a_capacity_reading() {
    let info = RateLimitInfo::from_pairs(
        "claude-sonnet",
        [
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2026-01-01T00:01:00Z"),
            ("anthropic-ratelimit-tokens-limit", "90000"),
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "2026-01-01T00:00:30Z"),
            ("anthropic-ratelimit-input-tokens-limit", "80000"),
            ("anthropic-ratelimit-input-tokens-remaining", "79000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-01-01T00:00:01Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "16000"),
            ("anthropic-ratelimit-output-tokens-remaining", "15000"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2025-12-31T23:59:00Z",
            ),
            ("retry-after", "30"),
        ],
        fixed_now(),
    );
    assert!(!info.rate_limited);
    assert_eq!(info.kind, LimitKind::Capacity);
    assert_eq!(info.request_limit, Some(50));
    assert_eq!(info.request_remaining, Some(49));
    assert_eq!(info.request_reset, Some(secs(60)));
    assert_eq!(info.token_limit, Some(90_000));
    assert_eq!(info.token_remaining, Some(0));
    assert_eq!(info.token_reset, Some(secs(30)));
    assert_eq!(info.input_token_limit, Some(80_000));
    assert_eq!(info.input_token_remaining, Some(79_000));
    assert_eq!(info.input_token_reset, Some(secs(1)));
    assert_eq!(info.output_token_limit, Some(16_000));
    assert_eq!(info.output_token_remaining, Some(15_000));
    assert_eq!(info.output_token_reset, Some(Duration::ZERO));
    assert_eq!(
        info.retry_after, None,
        "a capacity reading carries no retry-after"
    );
    assert_eq!(info.requests_per_minute(), 50);
    assert_eq!(info.tokens_per_minute(), 90_000);
    assert_eq!(info.input_tokens_per_minute(), 80_000);
    assert_eq!(info.output_tokens_per_minute(), 16_000);
}

#[test]
fn a_successful_response_s_headers_are_a_capacity_reading_with_no_retry_after() {
    let info = RateLimitInfo::from_pairs(
        "gpt-4o",
        [
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
            ("retry-after", "30"),
        ],
        fixed_now(),
    );
    assert!(!info.rate_limited);
    assert_eq!(info.kind, LimitKind::Capacity);
    assert_eq!(
        info.retry_after, None,
        "a capacity reading asks nobody to wait"
    );
    assert_eq!(
        serde_json::to_value(&info).map(|v| v["kind"].clone()).ok(),
        Some(serde_json::json!("capacity"))
    );
    assert_eq!(info.token_limit, Some(30_000));
    assert_eq!(info.token_remaining, Some(0));
    assert_eq!(info.token_reset, Some(secs(360)));
    assert_eq!(
        info.summary(),
        "gpt-4o capacity kind=capacity tokens=0/30000 reset 360s"
    );
}

#[test]
fn header_names_match_without_regard_to_case() {
    let info = RateLimitInfo::from_pairs(
        "m",
        [
            ("X-RateLimit-Limit-Requests", "7"),
            ("ANTHROPIC-RATELIMIT-TOKENS-REMAINING", "8"),
            ("Retry-After", "9"),
        ],
        fixed_now(),
    );
    assert_eq!(info.request_limit, Some(7));
    assert_eq!(info.token_remaining, Some(8));
    let hit = RateLimitInfo::rate_limited_from_pairs(
        "m",
        [("RETRY-AFTER", "9"), ("X-RateLimit-Limit-Requests", "7")],
        fixed_now(),
    );
    assert_eq!(hit.retry_after, Some(secs(9)));
    assert_eq!(hit.request_limit, Some(7));
}

#[test]
fn a_header_map_reads_like_pairs() {
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-limit-tokens", HeaderValue::from_static("1000"));
    headers.insert("X-RATELIMIT-RESET-TOKENS", HeaderValue::from_static("6m0s"));
    headers.insert(
        "anthropic-ratelimit-requests-remaining",
        HeaderValue::from_static(" 0 "),
    );
    headers.insert(
        "x-ratelimit-remaining-tokens",
        HeaderValue::from_bytes(b"\xff12").unwrap_or_else(|_| HeaderValue::from_static("")),
    );
    let info = RateLimitInfo::from_headers("m", &headers, fixed_now());
    assert!(!info.rate_limited);
    assert_eq!(info.token_limit, Some(1000));
    assert_eq!(info.token_reset, Some(secs(360)));
    assert_eq!(info.request_remaining, Some(0));
    assert_eq!(info.kind, LimitKind::Capacity);
    assert_eq!(info.token_remaining, None);
    assert_eq!(info.request_limit, None);
    assert_eq!(info.retry_after, None);
}

#[test]
fn a_reading_takes_every_reset_form_and_a_retry_after_date() {
    let now = fixed_now(); // 2026-01-01T00:00:00Z
    let info = RateLimitInfo::from_pairs(
        "m",
        [
            ("x-ratelimit-reset-requests", "1h2m3.5s"),
            ("x-ratelimit-reset-tokens", "0.5"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-01-01T01:00:30+01:00",
            ),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2025-12-31T23:00:00Z",
            ),
        ],
        now,
    );
    assert_eq!(info.request_reset, Some(Duration::from_millis(3_723_500)));
    assert_eq!(info.token_reset, Some(Duration::from_millis(500)));
    assert_eq!(info.input_token_reset, Some(secs(30)));
    assert_eq!(
        info.output_token_reset,
        Some(Duration::ZERO),
        "passed already"
    );
    let hit = RateLimitInfo::rate_limited_from_pairs(
        "m",
        [("Retry-After", "Thu, 01 Jan 2026 00:00:07 GMT")],
        now,
    );
    assert_eq!(hit.retry_after, Some(secs(7)));
}

#[test]
fn bad_values_leave_fields_none() {
    let info = RateLimitInfo::from_pairs(
        "m",
        [
            ("x-ratelimit-limit-requests", "lots"),
            ("x-ratelimit-remaining-tokens", "-3"),
            ("x-ratelimit-reset-tokens", "eventually"),
            ("anthropic-ratelimit-bogus-limit", "5"),
            ("x-ratelimit-limit-bogus", "5"),
            ("retry-after", "in a while"),
        ],
        fixed_now(),
    );
    assert_eq!(info, RateLimitInfo::from_pairs("m", [], fixed_now()));
    assert_eq!(info.request_limit, None);
    assert_eq!(info.token_remaining, None);
    assert_eq!(info.token_reset, None);
    assert_eq!(info.retry_after, None);
    assert_eq!(info.kind, LimitKind::Capacity);
}

#[test]
fn per_minute_fields_read_zero_when_absent() {
    let info = RateLimitInfo::from_pairs("m", [("x-ratelimit-limit-tokens", "100")], fixed_now());
    assert_eq!(info.requests_per_minute(), 0);
    assert_eq!(info.tokens_per_minute(), 100);
    assert_eq!(info.input_tokens_per_minute(), 0);
    assert_eq!(info.output_tokens_per_minute(), 0);
}

#[test]
fn a_missing_kind_reads_as_unknown() {
    assert_eq!(LimitKind::default(), LimitKind::Unknown);
    assert_eq!(LimitKind::from_name(None), LimitKind::Unknown);
    assert_eq!(LimitKind::from_name(Some("bananas")), LimitKind::Unknown);
    assert_eq!(LimitKind::from_name(Some("REQUESTS")), LimitKind::Requests);
    assert_eq!(LimitKind::from_name(Some("Capacity")), LimitKind::Capacity);
    assert_eq!(LimitKind::Capacity.as_str(), "capacity");
    assert_eq!(
        LimitKind::from_name(Some("output-tokens")),
        LimitKind::OutputTokens
    );
}

#[test]
fn a_reading_serializes_with_snake_case_kind() {
    let json = serde_json::to_value(RateLimitInfo::rate_limited("m")).map_err(|e| e.to_string());
    let json = json
        .as_ref()
        .map(|v| (v["kind"].clone(), v["rate_limited"].clone()));
    assert_eq!(
        json,
        Ok((serde_json::json!("unknown"), serde_json::json!(true)))
    );
}

const NAMES: [&str; 8] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "retry-after",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
];

proptest! {
    #[test]
    fn readings_never_panic_on_any_string(value in any::<String>(), offset in any::<u32>()) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(offset));
        let pairs: Vec<(&str, &str)> = NAMES.iter().map(|name| (*name, value.as_str())).collect();
        let info = RateLimitInfo::from_pairs("m", pairs.clone(), now);
        prop_assert!(!info.rate_limited);
        let hit = RateLimitInfo::rate_limited_from_pairs("m", pairs, now);
        prop_assert!(hit.rate_limited);
    }

    #[test]
    fn readings_never_panic_on_duration_like_resets(value in "[0-9.hmsun -]{0,24}") {
        let info = RateLimitInfo::from_pairs("m", [("x-ratelimit-reset-tokens", value.as_str())], fixed_now());
        prop_assert_eq!(info.model, "m");
    }

    #[test]
    fn header_maps_never_panic_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            for name in NAMES {
                headers.insert(HeaderName::from_static(name), value.clone());
            }
        }
        let info = RateLimitInfo::from_headers("m", &headers, fixed_now());
        prop_assert_eq!(info.model, "m");
    }
}

#[test]
fn a_429_s_headers_read_as_rate_limited_keeping_what_they_say() {
    let pairs = [
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-remaining-requests", "0"),
        ("retry-after", "7"),
    ];
    let hit = RateLimitInfo::rate_limited_from_pairs("m", pairs, fixed_now());
    assert!(hit.rate_limited);
    assert_eq!(hit.kind, LimitKind::Requests);
    assert_eq!(hit.request_limit, Some(500));
    assert_eq!(hit.request_remaining, Some(0));
    assert_eq!(hit.retry_after, Some(secs(7)), "a retry-after read is kept");
    assert_eq!(
        hit.summary(),
        "m rate limited kind=requests requests=0/500 retry-after 7s"
    );
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    assert_eq!(
        RateLimitInfo::rate_limited_from_headers("m", &headers, fixed_now()),
        hit
    );
    // The same headers on a successful response: a capacity reading, no retry-after.
    let capacity = RateLimitInfo::from_pairs("m", pairs, fixed_now());
    assert_eq!(
        (capacity.kind, capacity.retry_after),
        (LimitKind::Capacity, None)
    );
    let bare = RateLimitInfo::rate_limited_from_pairs("m", [], fixed_now());
    assert_eq!(bare, RateLimitInfo::rate_limited("m"));
    let unreadable =
        RateLimitInfo::rate_limited_from_pairs("m", [("retry-after", "soon")], fixed_now());
    assert_eq!(unreadable.retry_after, Some(secs(60)));
}
