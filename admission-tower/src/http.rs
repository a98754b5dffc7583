//! HTTP statuses for refusals (feature `http`): the mapping
//! [`AdmissionLayer::http_responses`](crate::AdmissionLayer::http_responses) installs, and its
//! parts for a handler of one's own.
//!
//! | reason | status | `Retry-After` |
//! |---|---|---|
//! | timed out, shed (the line past its [`LineBound`](crate::LineBound)), open circuit, monitor failing or stopped, job cancelled | 503 | always |
//! | quota | 429 | when its reset is known |
//! | a demand that can never fit an account counting bytes (the request's size) | 413 | no |
//! | a demand that can never fit any other account (what the request declares it needs), a quota account included | 422 | no |
//! | no demand could be built from the request | 400 | no |
//! | a demand lacking a required account (the service is built wrong) | 500 | no |
//!
//! `Retry-After` is in whole seconds, rounded up, and never 0. On a 503 it is the refuser's own
//! time when it has one (an open circuit's cooldown), and otherwise the layer's estimate of how
//! long its line takes to drain ([`RetryEstimate`](crate::RetryEstimate)), so every 503 carries
//! one.
//!
//! A demand that can never fit is a client error, not an outage: a client that retries a 503
//! (or a 429) would send it again and again. It is answered as such on every path: when the
//! line is past the layer's [`LineBound`](crate::LineBound) (the demand is looked at before the
//! request is shed) and on an account named a quota (a demand past what the quota can ever
//! grant at once is no spent quota). The body says which account, what was asked and what it
//! can ever grant ([`NeverFits`](crate::NeverFits)), so the caller can shrink the request.
//!
//! 413 or 422 depends on what can never fit. **413 (Content Too Large)** when it is the
//! request's own size: an account counting the request's bytes refused
//! ([`AdmissionLayer::bytes_account`](crate::AdmissionLayer::bytes_account)); RFC 9110 gives
//! 413 to content larger than the server will process, and clients and proxies know it as
//! "send less". **422 (Unprocessable Content)** when it is what the request declares it will
//! use (tokens, connections, a permit count, read from a header or a parameter): the request is
//! well-formed and its size acceptable, but what it asks for cannot be granted as the service is
//! configured, which is what 422 says; a 413 there would tell the client to shrink a body that
//! is not the problem.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::error::{Reason, Refused};

/// The status a refusal maps to (see the module's table).
pub fn status(refused: &Refused) -> StatusCode {
    match refused.reason() {
        Reason::Quota => StatusCode::TOO_MANY_REQUESTS,
        Reason::TooLargeBytes => StatusCode::PAYLOAD_TOO_LARGE,
        Reason::TooLarge => StatusCode::UNPROCESSABLE_ENTITY,
        Reason::Invalid => StatusCode::BAD_REQUEST,
        Reason::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The `Retry-After` value, in whole seconds rounded up (at least 1), when the refusal has one
/// ([`Refused::retry_after`]: known or estimated).
pub fn retry_after(refused: &Refused) -> Option<HeaderValue> {
    refused.retry_after_secs().map(HeaderValue::from)
}

/// The one-line plain-text body of [`response`]: `admission refused: {reason}`, followed, for a
/// demand that can never fit, by `: ` and its [`NeverFits`](crate::NeverFits) line (account,
/// asked, capacity, the account's words).
///
/// # Examples
///
/// ```text
/// admission refused: timed_out
/// admission refused: too_large: account `workers` asked 2, capacity 1: `workers` has 1 permits in all; ...
/// ```
pub fn body(refused: &Refused) -> String {
    match refused.never_fits() {
        Some(never) => format!("admission refused: {}: {never}\n", refused.reason()),
        None => format!("admission refused: {}\n", refused.reason()),
    }
}

/// The default response: [`status`], [`retry_after`] when there is one, and the plain-text
/// [`body`]. Only a demand that can never fit names its account and numbers in the body; the
/// refusal itself is in the response's extensions for logging.
///
/// # Examples
///
/// A handler of one's own that changes one case and keeps the rest:
///
/// ```
/// use admission_tower::{Reason, Refused};
///
/// fn my_responses(refused: &Refused) -> http::Response<String> {
///     if refused.reason() == Reason::Quota {
///         let mut response = http::Response::new("buy more\n".to_owned());
///         *response.status_mut() = http::StatusCode::PAYMENT_REQUIRED;
///         return response;
///     }
///     admission_tower::http::response(refused)
/// }
/// # let _ = my_responses;
/// ```
pub fn response(refused: &Refused) -> Response<String> {
    let mut response = Response::new(body(refused));
    *response.status_mut() = status(refused);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some(after) = retry_after(refused) {
        headers.insert(RETRY_AFTER, after);
    }
    response
}
