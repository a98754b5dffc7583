//! HTTP statuses for refusals (feature `http`): the mapping
//! [`AdmissionLayer::http_responses`](crate::AdmissionLayer::http_responses) installs, and its
//! parts for a handler of one's own.
//!
//! | reason | status | `Retry-After` |
//! |---|---|---|
//! | timed out, open circuit, monitor failing or stopped, job cancelled | 503 | when known |
//! | quota | 429 | when known |
//! | a demand that can never fit an account counting bytes | 413 | no |
//! | a demand that can never fit any other account | 503 | no |
//! | no demand could be built from the request | 400 | no |
//! | a demand lacking a required account (the service is built wrong) | 500 | no |
//!
//! `Retry-After` is in whole seconds, rounded up, and never 0.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::error::{Reason, Refused};

/// The status a refusal maps to (see the module's table).
pub fn status(refused: &Refused) -> StatusCode {
    match refused.reason() {
        Reason::Quota => StatusCode::TOO_MANY_REQUESTS,
        Reason::TooLargeBytes => StatusCode::PAYLOAD_TOO_LARGE,
        Reason::Invalid => StatusCode::BAD_REQUEST,
        Reason::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The `Retry-After` value, in whole seconds rounded up (at least 1), when the refusal knows one.
pub fn retry_after(refused: &Refused) -> Option<HeaderValue> {
    refused.retry_after_secs().map(HeaderValue::from)
}

/// The default response: [`status`], [`retry_after`] when known, and a one-line plain-text body
/// naming the reason (the refusal itself, with the account and the numbers, is in the response's
/// extensions for logging, never in the body a client sees).
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
    let mut response = Response::new(format!("admission refused: {}\n", refused.reason()));
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
