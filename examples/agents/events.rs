//! Where the monitor's events go: every event to a JSON-lines file (`JsonLinesSink`), and a
//! [`Tally`] that counts them by kind, by the account a waiter was held on, and by rejection
//! reason for the summary — two sinks behind one `Fanout`, three with `--metrics` (the
//! `MetricsSink` of `metrics.rs`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use admission_core::event::SinkError;
use admission_core::{Event, EventKind, EventSink};
use admission_events::{Fanout, FlushPolicy, JsonLinesSink};
use anyhow::Context as _;

/// Counts of what the monitor reported.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Counts {
    /// Events by kind (`granted_immediate`, `held`, ...).
    pub kinds: BTreeMap<&'static str, u64>,
    /// `held` events by the account (or gate) that held the waiter.
    pub held_on: BTreeMap<String, u64>,
    /// `rejected` events by reason.
    pub rejected: BTreeMap<&'static str, u64>,
}

/// An [`EventSink`] that only counts.
#[derive(Debug, Default)]
pub struct Tally {
    counts: Mutex<Counts>,
}

impl Tally {
    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl EventSink for Tally {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.kinds.entry(event.kind.as_str()).or_default() += 1;
        match &event.kind {
            EventKind::Held => {
                for entry in &event.entries {
                    *counts.held_on.entry(entry.account.clone()).or_default() += 1;
                }
            }
            EventKind::Rejected { reason, .. } => {
                *counts.rejected.entry(reason.as_str()).or_default() += 1;
            }
            _ => {}
        }
        Ok(())
    }
}

/// The JSON-lines file sink as created here.
pub type FileSink = JsonLinesSink<BufWriter<File>>;

/// The sinks of a monitor run: the tally, the file, and the fanout the monitor is given.
pub struct Sinks {
    /// Counts by kind.
    pub tally: Arc<Tally>,
    /// The events file, flushed at the end of the run.
    pub file: Arc<FileSink>,
    /// Both, as one sink.
    pub fanout: Arc<Fanout>,
}

impl Sinks {
    /// A tally and a JSON-lines file at `path` (truncated if it exists), and `extra` (the
    /// metrics sink) behind the same fanout.
    ///
    /// # Errors
    ///
    /// When the file cannot be created.
    pub fn create(path: &Path, extra: Option<Arc<dyn EventSink>>) -> anyhow::Result<Sinks> {
        let file = Arc::new(
            JsonLinesSink::create(path)
                .with_context(|| format!("creating the events file {}", path.display()))?
                // Buffered: the file is flushed once at the end, not on the grant path.
                .with_flush(FlushPolicy::Manual),
        );
        let tally = Arc::new(Tally::default());
        let mut fanout = Fanout::new().with(tally.clone()).with(file.clone());
        if let Some(extra) = extra {
            fanout = fanout.with(extra);
        }
        let fanout = Arc::new(fanout);
        Ok(Sinks {
            tally,
            file,
            fanout,
        })
    }
}
