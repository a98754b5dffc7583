//! Where admission events go.
//!
//! The monitor in `admission-core` is the only emitter of [`Event`]s; this crate re-exports that
//! vocabulary and adds what consumes it. A sink is any [`EventSink`]: the [`Recorder`] keeps events
//! in memory for tests and dashboards, [`TracingSink`] turns them into `tracing` events,
//! [`JsonLinesSink`] writes one JSON object per line, and [`Fanout`] feeds several sinks at once.
//! Sinks run outside every admission lock; one that errs or panics is dropped by whoever calls it,
//! and admission itself never fails because of a sink.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod sink;

pub use admission_core::event::{
    Event, EventEntry, EventKind, EventSink, RejectReason, SinkError, amount_of,
};
pub use sink::{Fanout, FlushPolicy, JsonLinesSink, Recorder, TracingSink};
