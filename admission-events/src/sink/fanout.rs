//! [`Fanout`]: one sink that feeds several, dropping each member that fails on its own.

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use admission_core::event::{Event, EventSink, SinkError};
use parking_lot::Mutex;

/// Sends every event to each of its members, in the order they were added.
///
/// A member that returns an error or panics is removed and never called again; the others go on
/// receiving. The fanout itself fails only when it has no member left after an event, at which
/// point the monitor drops it too. The panic is caught here, so one broken member never costs the
/// others their event.
///
/// Members are called outside the fanout's lock, so a member may be slow without blocking
/// [`push`](Fanout::push) or another thread's emission.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_core::Monitor;
/// use admission_events::{Fanout, Recorder, TracingSink};
///
/// let recorder = Arc::new(Recorder::with_capacity(10_000));
/// let fanout = Fanout::new()
///     .with(recorder.clone())
///     .with(Arc::new(TracingSink::new()));
/// assert_eq!(fanout.len(), 2);
/// let monitor = Monitor::builder().sink(Arc::new(fanout)).build();
/// # drop(monitor);
/// ```
#[derive(Default)]
pub struct Fanout {
    /// The live members, in the order they were added. Cloned out before they are called.
    members: Mutex<Vec<Arc<dyn EventSink>>>,
}

impl Fanout {
    /// A fanout with no members yet.
    pub fn new() -> Fanout {
        Fanout::default()
    }

    /// The same fanout with `sink` added as its last member.
    pub fn with(self, sink: Arc<dyn EventSink>) -> Fanout {
        self.push(sink);
        self
    }

    /// Adds `sink` as the last member.
    pub fn push(&self, sink: Arc<dyn EventSink>) {
        self.members.lock().push(sink);
    }

    /// How many members are live.
    pub fn len(&self) -> usize {
        self.members.lock().len()
    }

    /// True when no member is live.
    pub fn is_empty(&self) -> bool {
        self.members.lock().is_empty()
    }
}

impl FromIterator<Arc<dyn EventSink>> for Fanout {
    fn from_iter<I: IntoIterator<Item = Arc<dyn EventSink>>>(sinks: I) -> Fanout {
        Fanout {
            members: Mutex::new(sinks.into_iter().collect()),
        }
    }
}

impl EventSink for Fanout {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        let members = self.members.lock().clone();
        let mut failures = Vec::new();
        for member in &members {
            let failure = match catch_unwind(AssertUnwindSafe(|| member.emit(event))) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("the sink panicked: {}", panic_message(&*panic)),
            };
            tracing::warn!(%failure, "an admission event fanout dropped a member");
            failures.push((member.clone(), failure));
        }
        if failures.is_empty() {
            return if members.is_empty() {
                Err(SinkError("the fanout has no member".into()))
            } else {
                Ok(())
            };
        }
        let mut live = self.members.lock();
        live.retain(|m| !failures.iter().any(|(f, _)| Arc::ptr_eq(m, f)));
        if live.is_empty() {
            let causes: Vec<_> = failures.into_iter().map(|(_, why)| why).collect();
            return Err(SinkError(format!(
                "every member of the fanout failed: {}",
                causes.join("; ")
            )));
        }
        Ok(())
    }
}

impl fmt::Debug for Fanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fanout")
            .field("members", &self.len())
            .finish()
    }
}

/// The text of a panic payload, when it is a string.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a non-string payload"
    }
}
