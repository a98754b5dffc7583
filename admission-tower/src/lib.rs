//! A tower layer that admits each request's whole demand before the inner service sees it.
//!
//! [`AdmissionLayer`] wraps any `tower` service over `http` requests. For each request a function
//! the user gives builds the job's [`Demand`](admission_core::Demand) and
//! [`JobContext`](admission_core::JobContext); the service asks the
//! [`Monitor`](admission_core::Monitor) for all of it at once, calls the inner service only once
//! granted, and keeps the [`Grant`](admission_core::Grant) inside the response body
//! ([`AdmittedBody`]) until the body ends, fails or is dropped: a streamed body keeps its permits
//! to the last byte. A request whose client goes away while it waits leaves the line. A refusal
//! is a typed [`Refused`] with [`retry_after`](Refused::retry_after) (the refuser's own, or the
//! layer's estimate from the drain it measures: [`RetryEstimate`]); features `http` and `grpc`
//! turn it into a response instead, and a handler of the user's own can replace either mapping.
//! The time a request waited reaches the handler as the [`Waited`] request extension. With a
//! [`LineBound`] the layer refuses at once a request the line would keep too long, and sheds a
//! waiter the line can no longer serve within the bound. A demand that can never fit is a
//! client error on every path (413 or 422, gRPC `INVALID_ARGUMENT`), never a 503 or a 429 that
//! a client would retry.
//!
//! # Cancel safety
//!
//! A request's future dropped while it waits (its client hung up) withdraws it from the line;
//! dropped while the inner service runs, or with its response body unfinished, it releases the
//! grant. No path keeps a permit after the request is gone.
//!
//! # Examples
//!
//! An axum service where each request holds one of 64 worker permits until its body is sent, and
//! a refusal is a 503 or a 429 with `Retry-After`:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use admission_accounts::CountingGate;
//! use admission_core::{Amount, Demand, JobContext, Monitor};
//! use admission_tower::{AdmissionLayer, DemandError, Waited};
//! use axum::{Router, extract::Request, routing::get};
//!
//! let monitor = Monitor::new();
//! let workers = Arc::new(CountingGate::new("workers", 64, monitor.clock().clone())?);
//! let demand = move |request: &Request| {
//!     let ctx = JobContext::new(request.uri().path().to_owned());
//!     Ok::<_, DemandError>((Demand::new().with(workers.clone(), Amount::ONE), ctx))
//! };
//! let app: Router = Router::new()
//!     .route("/", get(|request: Request| async move {
//!         let waited = request.extensions().get::<Waited>().map(|w| w.0);
//!         format!("waited {waited:?}")
//!     }))
//!     .layer(AdmissionLayer::new(monitor, demand).timeout(Duration::from_secs(10)).http_responses());
//! // axum::serve(listener, app).await?;
//! # drop(app);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod body;
mod error;
#[cfg(feature = "fleet")]
pub mod fleet;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod guides;
#[cfg(feature = "http")]
pub mod http;
mod layer;
mod line;
mod policy;
mod retry;
mod service;

pub use body::AdmittedBody;
pub use error::{AdmissionError, Cause, DemandError, NeverFits, Reason, Refused, Waited};
#[cfg(feature = "fleet")]
pub use fleet::{Quota, QuotaBody, QuotaBodyError, QuotaLayer};
pub use layer::AdmissionLayer;
pub use policy::{OnRefusal, Propagate, Respond, RespondFn};
pub use retry::{LineBound, LineFull, RetryAfter, RetryEstimate};
pub use service::{Admission, ResponseFuture};
