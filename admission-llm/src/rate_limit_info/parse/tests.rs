//! The header-value parsers' exact answers: every reset form and why an unreadable one is
//! refused, integers, `retry-after` seconds and HTTP-dates, and property tests showing no parser
//! panics on any input.

use std::time::{Duration, SystemTime};

use proptest::prelude::{any, prop_assert, proptest};

use super::{ResetParseError, parse_int, parse_reset, parse_retry_after};

/// 2026-01-01T00:00:00Z.
fn fixed_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn every_reset_form_parses() {
    let now = fixed_now();
    assert_eq!(parse_reset("1s", now), Ok(secs(1)));
    assert_eq!(parse_reset("6m0s", now), Ok(secs(360)));
    assert_eq!(parse_reset("20ms", now), Ok(Duration::from_millis(20)));
    assert_eq!(
        parse_reset("1h2m3.5s", now),
        Ok(Duration::from_millis(3_723_500))
    );
    assert_eq!(parse_reset("250us", now), Ok(Duration::from_micros(250)));
    assert_eq!(parse_reset("7ns", now), Ok(Duration::from_nanos(7)));
    assert_eq!(parse_reset("0.5", now), Ok(Duration::from_millis(500)));
    assert_eq!(parse_reset("30", now), Ok(secs(30)));
    assert_eq!(parse_reset(" 30 ", now), Ok(secs(30)));
    assert_eq!(parse_reset("2026-01-01T00:01:00Z", now), Ok(secs(60)));
    assert_eq!(
        parse_reset("2026-01-01T00:00:00.250Z", now),
        Ok(Duration::from_millis(250))
    );
    assert_eq!(parse_reset("2025-12-31T23:00:00Z", now), Ok(Duration::ZERO));
}

#[test]
fn unreadable_resets_say_why() {
    let now = fixed_now();
    let cases = [
        (
            "",
            ResetParseError::Empty {
                value: String::new(),
            },
        ),
        (
            "   ",
            ResetParseError::Empty {
                value: "   ".into(),
            },
        ),
        (
            "-1s",
            ResetParseError::Negative {
                value: "-1s".into(),
            },
        ),
        (
            "soon",
            ResetParseError::Malformed {
                value: "soon".into(),
            },
        ),
        ("5x", ResetParseError::Malformed { value: "5x".into() }),
        (
            "1.2.3s",
            ResetParseError::Malformed {
                value: "1.2.3s".into(),
            },
        ),
        ("s", ResetParseError::Malformed { value: "s".into() }),
        (
            "2026-13-45T00:00:00Z",
            ResetParseError::Malformed {
                value: "2026-13-45T00:00:00Z".into(),
            },
        ),
        (
            "99999999999999999999999999h",
            ResetParseError::Overflow {
                value: "99999999999999999999999999h".into(),
            },
        ),
        (
            "999999999999999999999999999999999999999999",
            ResetParseError::Overflow {
                value: "999999999999999999999999999999999999999999".into(),
            },
        ),
    ];
    for (value, expected) in cases {
        assert_eq!(parse_reset(value, now), Err(expected), "{value:?}");
    }
    let message = parse_reset("soon", now).map_err(|e| e.to_string());
    assert_eq!(
        message,
        Err("reset value \"soon\" is neither a duration (\"6m0s\"), a number of seconds, nor an RFC 3339 instant".into())
    );
}

#[test]
fn integers_trim_and_answer_none_for_anything_else() {
    assert_eq!(parse_int(Some("42")), Some(42));
    assert_eq!(parse_int(Some("  42\t")), Some(42));
    assert_eq!(parse_int(Some("18446744073709551615")), Some(u64::MAX));
    assert_eq!(parse_int(None), None);
    assert_eq!(parse_int(Some("")), None);
    assert_eq!(parse_int(Some("abc")), None);
    assert_eq!(parse_int(Some("-1")), None);
    assert_eq!(parse_int(Some("1.5")), None);
    assert_eq!(parse_int(Some("18446744073709551616")), None);
}

#[test]
fn retry_after_reads_seconds_and_http_dates() {
    assert_eq!(parse_retry_after(Some(" 20 "), fixed_now()), Some(secs(20)));
    assert_eq!(parse_retry_after(None, fixed_now()), None);
    assert_eq!(parse_retry_after(Some("soon"), fixed_now()), None);
    assert_eq!(parse_retry_after(Some("-5"), fixed_now()), None);
    // fixed_now() is 2026-01-01T00:00:00Z.
    assert_eq!(
        parse_retry_after(Some("Thu, 01 Jan 2026 00:01:30 GMT"), fixed_now()),
        Some(secs(90))
    );
    // A date already passed: retry now.
    assert_eq!(
        parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), fixed_now()),
        Some(Duration::ZERO)
    );
}

#[test]
fn resets_read_rfc3339_offsets() {
    let now = fixed_now(); // 2026-01-01T00:00:00Z
    assert_eq!(parse_reset("2026-01-01T01:00:30+01:00", now), Ok(secs(30)));
    assert_eq!(parse_reset("2025-12-31T19:31:00-04:30", now), Ok(secs(60)));
    assert_eq!(parse_reset("2026-01-01T00:00:45+00:00", now), Ok(secs(45)));
    assert_eq!(
        parse_reset("2026-01-01T00:00:45.5Z", now),
        Ok(Duration::from_millis(45_500))
    );
    // Passed already: zero.
    assert_eq!(
        parse_reset("2026-01-01T00:00:00+05:00", now),
        Ok(Duration::ZERO)
    );
    for bad in [
        "2026-01-01T01:00:30+25:00",
        "2026-01-01T01:00:30+01-00",
        "2026-01-01+01:00",
    ] {
        assert_eq!(
            parse_reset(bad, now),
            Err(ResetParseError::Malformed { value: bad.into() }),
            "{bad}"
        );
    }
}

proptest! {
    #[test]
    fn parsers_never_panic_on_any_string(value in any::<String>(), offset in any::<u32>()) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(offset));
        let _ = parse_int(Some(&value));
        let _ = parse_retry_after(Some(&value), now);
        if let Err(error) = parse_reset(&value, now) {
            let quoted = format!("{value:?}");
            prop_assert!(error.to_string().contains(&quoted));
        }
    }

    #[test]
    fn parsers_never_panic_on_duration_like_strings(value in "[0-9.hmsun -]{0,24}") {
        let _ = parse_reset(&value, fixed_now());
    }
}
