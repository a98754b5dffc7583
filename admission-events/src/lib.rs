//! Where admission events go.
//!
//! The monitor in `admission-core` is the only emitter of
//! [`Event`](admission_core::event::Event)s, and the vocabulary is core's
//! ([`admission_core::event`]); this crate holds what consumes it. A sink is any
//! [`EventSink`](admission_core::event::EventSink): the [`Recorder`] keeps events in memory for
//! tests and dashboards, [`TracingSink`] turns them into `tracing` events, [`JsonLinesSink`]
//! writes one JSON object per line, [`Fanout`] feeds several sinks at once, and (feature
//! `metrics`) `MetricsSink` records series through the `metrics` facade. Sinks run outside
//! every admission lock; one that errs or panics loses that event only, and admission itself
//! never fails because of a sink.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "metrics")]
pub mod metrics;
pub mod sink;

#[cfg(feature = "metrics")]
pub use crate::metrics::MetricsSink;
pub use sink::{Fanout, FlushPolicy, JsonLinesSink, Recorder, TracingSink};
