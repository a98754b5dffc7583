//! A tower layer that admits each request's whole demand before the inner service sees it.
//!
//! [`AdmissionLayer`] wraps any `tower` service over `http` requests. For each request a function
//! the user gives builds the job's [`Demand`](admission_core::Demand) and
//! [`JobContext`](admission_core::JobContext); the service asks the
//! [`Monitor`](admission_core::Monitor) for all of it at once, calls the inner service only once
//! granted, and keeps the [`Grant`](admission_core::Grant) inside the response body
//! ([`AdmittedBody`]) until the body ends, fails or is dropped: a streamed body keeps its permits
//! to the last byte. A request whose client goes away while it waits leaves the line. A refusal
//! is a typed [`Refused`] with [`retry_after`](Refused::retry_after); features `http` and `grpc`
//! turn it into a response instead, and a handler of the user's own can replace either mapping.
//! The time a request waited reaches the handler as the [`Waited`] request extension.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod body;
mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "http")]
pub mod http;
mod layer;
mod policy;
mod service;

pub use body::AdmittedBody;
pub use error::{AdmissionError, Cause, DemandError, Reason, Refused, Waited};
pub use layer::AdmissionLayer;
pub use policy::{OnRefusal, Propagate, Respond};
pub use service::{Admission, ResponseFuture};
