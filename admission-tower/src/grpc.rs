//! gRPC statuses for refusals (feature `grpc`): the mapping
//! [`AdmissionLayer::grpc_responses`](crate::AdmissionLayer::grpc_responses) installs, as a
//! trailers-only response (HTTP 200, `grpc-status` and `grpc-message` in the headers), so no
//! gRPC library is needed.
//!
//! | reason | code |
//! |---|---|
//! | quota | `RESOURCE_EXHAUSTED` (8) |
//! | timed out, shed (the line past its [`LineBound`](crate::LineBound)), open circuit, monitor failing or stopped | `UNAVAILABLE` (14) |
//! | job cancelled | `CANCELLED` (1) |
//! | a demand that can never fit (past the line bound and on a quota account too), no demand could be built from the request | `INVALID_ARGUMENT` (3) |
//! | a demand lacking a required account | `INTERNAL` (13) |
//!
//! A demand that can never fit is `INVALID_ARGUMENT` rather than `OUT_OF_RANGE` or
//! `RESOURCE_EXHAUSTED`: the request is wrong whatever the state of the service (the limit is
//! the account's configuration, not what is free now), which is what `INVALID_ARGUMENT` means
//! in gRPC, and clients and retry policies do not retry it. Its `grpc-message` is `too_large: ` (or `too_large_bytes: `) and the
//! [`NeverFits`](crate::NeverFits) line naming the account, what was asked and what it can
//! ever grant, percent-encoded as gRPC requires; every other `grpc-message` is the reason's
//! name.
//!
//! Whenever the refusal has a retry time (see [`Refused::retry_after`]: every `UNAVAILABLE`
//! and `CANCELLED` one, a quota's when its reset is known), `grpc-retry-pushback-ms` says it in
//! milliseconds (the header gRPC clients read for server pushback); an estimate is whole
//! seconds.

use http::{HeaderValue, Response};

use crate::error::{Reason, Refused};

/// `CANCELLED`.
pub const CANCELLED: u16 = 1;
/// `INVALID_ARGUMENT`.
pub const INVALID_ARGUMENT: u16 = 3;
/// `RESOURCE_EXHAUSTED`.
pub const RESOURCE_EXHAUSTED: u16 = 8;
/// `INTERNAL`.
pub const INTERNAL: u16 = 13;
/// `UNAVAILABLE`.
pub const UNAVAILABLE: u16 = 14;

/// The gRPC status code a refusal maps to (see the module's table).
pub fn code(refused: &Refused) -> u16 {
    match refused.reason() {
        Reason::Quota => RESOURCE_EXHAUSTED,
        Reason::Cancelled => CANCELLED,
        Reason::Invalid | Reason::TooLarge | Reason::TooLargeBytes => INVALID_ARGUMENT,
        Reason::Misconfigured => INTERNAL,
        _ => UNAVAILABLE,
    }
}

/// The `grpc-message` a refusal maps to, before percent-encoding: the reason's name, and for a
/// demand that can never fit, `: ` and its [`NeverFits`](crate::NeverFits) line.
pub fn message(refused: &Refused) -> String {
    match refused.never_fits() {
        Some(never) => format!("{}: {never}", refused.reason()),
        None => refused.reason().as_str().to_owned(),
    }
}

/// `text` percent-encoded as `grpc-message` requires: every byte outside printable ASCII
/// (space to `~`), and `%` itself, becomes `%XX`.
///
/// # Examples
///
/// ```
/// assert_eq!(admission_tower::grpc::percent_encode("100% `é`"), "100%25 `%C3%A9`");
/// ```
pub fn percent_encode(text: &str) -> String {
    use std::fmt::Write as _;

    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (b' '..=b'~').contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The default response: HTTP 200 with `content-type: application/grpc`, `grpc-status`
/// ([`code`]), `grpc-message` ([`message`], percent-encoded), `grpc-retry-pushback-ms` when the
/// refusal has a retry time, and no body.
pub fn response(refused: &Refused) -> Response<String> {
    let mut response = Response::new(String::new());
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code(refused)));
    let message = HeaderValue::try_from(percent_encode(&message(refused)))
        .unwrap_or_else(|_| HeaderValue::from_static(refused.reason().as_str()));
    headers.insert("grpc-message", message);
    if let Some(after) = refused.retry_after() {
        let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(millis));
    }
    response
}
