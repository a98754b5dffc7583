//! Parsers for single rate-limit header values: integers, reset values in every form providers
//! use (Go-style durations, bare seconds, RFC 3339 instants) and `retry-after` seconds. None of
//! them panics on any input; arithmetic is checked and saturates or fails with a typed error.
//!
//! Private to the crate: callers read headers through [`RateLimitInfo`](super::RateLimitInfo).
//! The exact answers of each parser are held by the unit tests beside them (`parse/tests.rs`).

use std::time::{Duration, SystemTime};

/// Nanoseconds in one second.
const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Fraction digits beyond this many are ignored (they are below a nanosecond for every unit).
const MAX_FRACTION_DIGITS: usize = 18;

/// Why a reset value could not be read as a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResetParseError {
    /// The value was empty or only whitespace.
    #[error("reset value {value:?} is empty")]
    Empty {
        /// The value as received.
        value: String,
    },
    /// The value was negative; a reset lies in the future or now.
    #[error("reset value {value:?} is negative")]
    Negative {
        /// The value as received.
        value: String,
    },
    /// The value does not fit in a `Duration`.
    #[error("reset value {value:?} is too large for a duration")]
    Overflow {
        /// The value as received.
        value: String,
    },
    /// The value is neither a duration such as `6m0s`, a number of seconds, nor an RFC 3339 instant.
    #[error(
        "reset value {value:?} is neither a duration (\"6m0s\"), a number of seconds, nor an RFC 3339 instant"
    )]
    Malformed {
        /// The value as received.
        value: String,
    },
}

/// Reads a header value as a non-negative integer.
///
/// Surrounding whitespace is trimmed. Answers `None` when the value is missing, empty, negative,
/// fractional, too large for `u64` or not a number at all.
pub(crate) fn parse_int(value: Option<&str>) -> Option<u64> {
    value?.trim().parse().ok()
}

/// Reads a reset value as the time left until the limit resets.
///
/// Accepted forms, after trimming:
/// - a Go-style duration, one or more number-unit pairs with units `h`, `m`, `s`, `ms`, `us`
///   (or `µs`) and `ns`, numbers possibly fractional: `1s`, `6m0s`, `20ms`, `1h2m3.5s`;
/// - a bare number of seconds, integer or decimal: `30`, `0.5`;
/// - an RFC 3339 instant, in UTC or with a numeric offset (`2026-01-01T00:01:00Z`,
///   `2026-01-01T01:01:00+01:00`): the answer is the time from `now` to it, zero when the
///   instant has already passed. `now` is the wall-clock time given by the caller; nothing here
///   reads a clock.
///
/// # Errors
///
/// A [`ResetParseError`] naming the value: empty, negative, too large, or none of the forms.
pub(crate) fn parse_reset(value: &str, now: SystemTime) -> Result<Duration, ResetParseError> {
    let trimmed = value.trim();
    let owned = || value.to_owned();
    if trimmed.is_empty() {
        return Err(ResetParseError::Empty { value: owned() });
    }
    if trimmed.starts_with('-') {
        return Err(ResetParseError::Negative { value: owned() });
    }
    let unsigned = trimmed.strip_prefix('+').unwrap_or(trimmed);
    let nanos = if is_decimal(unsigned) {
        decimal_nanos(unsigned, NANOS_PER_SEC)
    } else if let Some(nanos) = go_duration_nanos(unsigned) {
        nanos
    } else if let Some(instant) = rfc3339_instant(trimmed) {
        return Ok(instant.duration_since(now).unwrap_or(Duration::ZERO));
    } else {
        return Err(ResetParseError::Malformed { value: owned() });
    };
    nanos
        .and_then(duration_from_nanos)
        .ok_or_else(|| ResetParseError::Overflow { value: owned() })
}

/// Reads a `retry-after` value: whole seconds (`20`), or an HTTP-date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`, read by [`httpdate`]) answered as the time from `now` to
/// it, zero when it has passed. Anything else, and a missing value, answers `None`.
///
/// `now` is the wall-clock time the answer arrived, given by the caller: nothing here reads a
/// clock.
pub(crate) fn parse_retry_after(value: Option<&str>, now: SystemTime) -> Option<Duration> {
    let value = value?;
    if let Some(seconds) = parse_int(Some(value)) {
        return Some(Duration::from_secs(seconds));
    }
    let instant = httpdate::parse_http_date(value.trim()).ok()?;
    Some(instant.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An RFC 3339 instant, in UTC (`Z`) or with a numeric offset (`+02:00`, `-05:30`).
///
/// `humantime` reads the UTC form; an offset is taken off by hand (the local time minus the
/// offset is UTC) so that no calendar crate is needed.
fn rfc3339_instant(value: &str) -> Option<SystemTime> {
    if let Ok(instant) = humantime::parse_rfc3339_weak(value) {
        return Some(instant);
    }
    // `...T12:00:00+02:00`: the offset is the last six bytes, after the time part.
    let split = value.len().checked_sub(6)?;
    let (local, offset) = (value.get(..split)?, value.get(split..)?);
    if !local.contains(['T', 't', ' ']) {
        return None;
    }
    let bytes = offset.as_bytes();
    let sign = match bytes[0] {
        b'+' => 1i64,
        b'-' => -1i64,
        _ => return None,
    };
    if bytes[3] != b':' || ![1, 2, 4, 5].iter().all(|&i| bytes[i].is_ascii_digit()) {
        return None;
    }
    let digit = |i: usize| i64::from(bytes[i] - b'0');
    let (hours, minutes) = (digit(1) * 10 + digit(2), digit(4) * 10 + digit(5));
    if hours > 23 || minutes > 59 {
        return None;
    }
    let local = humantime::parse_rfc3339_weak(&format!("{local}Z")).ok()?;
    let shift = Duration::from_secs(u64::try_from((hours * 60 + minutes) * 60).ok()?);
    if sign > 0 {
        local.checked_sub(shift)
    } else {
        local.checked_add(shift)
    }
}

/// True for `digits`, `digits.digits`, `digits.` or `.digits`.
fn is_decimal(s: &str) -> bool {
    let mut parts = s.splitn(2, '.');
    let whole = parts.next().unwrap_or("");
    let fraction = parts.next().unwrap_or("");
    (!whole.is_empty() || !fraction.is_empty())
        && whole.bytes().all(|b| b.is_ascii_digit())
        && fraction.bytes().all(|b| b.is_ascii_digit())
}

/// Converts a decimal number (checked by [`is_decimal`]) in units of `unit` nanoseconds to
/// nanoseconds, truncating below one nanosecond; `None` on overflow.
fn decimal_nanos(number: &str, unit: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut total: u128 = 0;
    for digit in whole.bytes() {
        total = total
            .checked_mul(10)?
            .checked_add(u128::from(digit - b'0'))?;
    }
    total = total.checked_mul(unit)?;
    let fraction = &fraction[..fraction.len().min(MAX_FRACTION_DIGITS)];
    let mut numerator: u128 = 0;
    let mut denominator: u128 = 1;
    for digit in fraction.bytes() {
        numerator = numerator * 10 + u128::from(digit - b'0');
        denominator *= 10;
    }
    // numerator < 10^18 and unit <= 3.6 * 10^12, so the product fits easily in u128.
    total.checked_add(numerator * unit / denominator)
}

/// Reads a Go-style duration (`1h2m3.5s`, `20ms`) as nanoseconds: `None` when it is not one,
/// `Some(None)` when it is one but overflows.
fn go_duration_nanos(s: &str) -> Option<Option<u128>> {
    let mut rest = s;
    let mut total: Option<u128> = Some(0);
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest
            .bytes()
            .position(|b| !(b.is_ascii_digit() || b == b'.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if !is_decimal(number) {
            return None;
        }
        let unit_len = after
            .char_indices()
            .find(|&(_, c)| c.is_ascii_digit() || c == '.')
            .map_or(after.len(), |(i, _)| i);
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "h" => 3_600 * NANOS_PER_SEC,
            "m" => 60 * NANOS_PER_SEC,
            "s" => NANOS_PER_SEC,
            "ms" => 1_000_000,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        total = total.and_then(|sum| sum.checked_add(decimal_nanos(number, unit_nanos)?));
        rest = after;
    }
    Some(total)
}

/// A `Duration` of `nanos` nanoseconds, `None` when the seconds overflow `u64`.
fn duration_from_nanos(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    let sub = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, sub))
}

#[cfg(test)]
mod tests;
