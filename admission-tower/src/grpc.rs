//! gRPC statuses for refusals (feature `grpc`): the mapping
//! [`AdmissionLayer::grpc_responses`](crate::AdmissionLayer::grpc_responses) installs, as a
//! trailers-only response (HTTP 200, `grpc-status` and `grpc-message` in the headers), so no
//! gRPC library is needed.
//!
//! | reason | code |
//! |---|---|
//! | quota, a demand that can never fit | `RESOURCE_EXHAUSTED` (8) |
//! | timed out, open circuit, monitor failing or stopped | `UNAVAILABLE` (14) |
//! | job cancelled | `CANCELLED` (1) |
//! | no demand could be built from the request | `INVALID_ARGUMENT` (3) |
//! | a demand lacking a required account | `INTERNAL` (13) |
//!
//! When the refusal knows when to retry, `grpc-retry-pushback-ms` says it in milliseconds (the
//! header gRPC clients read for server pushback).

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
        Reason::Quota | Reason::TooLarge | Reason::TooLargeBytes => RESOURCE_EXHAUSTED,
        Reason::Cancelled => CANCELLED,
        Reason::Invalid => INVALID_ARGUMENT,
        Reason::Misconfigured => INTERNAL,
        _ => UNAVAILABLE,
    }
}

/// The default response: HTTP 200 with `content-type: application/grpc`, `grpc-status`
/// ([`code`]), `grpc-message` (the reason's name), `grpc-retry-pushback-ms` when known, and no
/// body.
pub fn response(refused: &Refused) -> Response<String> {
    let mut response = Response::new(String::new());
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code(refused)));
    headers.insert(
        "grpc-message",
        HeaderValue::from_static(refused.reason().as_str()),
    );
    if let Some(after) = refused.retry_after() {
        let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(millis));
    }
    response
}
