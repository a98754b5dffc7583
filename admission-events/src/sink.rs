//! The event sinks: where the monitor's [`Event`](admission_core::event::Event)s end up.
//!
//! Every sink here implements [`EventSink`](admission_core::event::EventSink) and is meant to be installed as an
//! `Arc<dyn EventSink>` (through `MonitorBuilder::sink` or `Monitor::set_sink`):
//!
//! - [`Recorder`]: keeps events in memory, optionally only the most recent ones.
//! - [`TracingSink`]: one `tracing` event per admission event, target `admission`.
//! - [`JsonLinesSink`]: one JSON object per line on any [`std::io::Write`].
//! - [`Fanout`]: several sinks behind one, each dropped on its own when it fails.

mod fanout;
mod json_lines;
mod recorder;
mod trace;

pub use fanout::Fanout;
pub use json_lines::{FlushPolicy, JsonLinesSink};
pub use recorder::Recorder;
pub use trace::TracingSink;
