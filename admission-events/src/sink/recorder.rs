//! [`Recorder`]: an in-memory sink, for tests, debugging and small dashboards.

use std::collections::VecDeque;
use std::fmt;

use admission_core::event::{Event, EventSink, SinkError};
use parking_lot::Mutex;

/// Keeps every event it receives, in arrival order, behind a lock shared by all threads.
///
/// [`Recorder::new`] keeps everything, which suits a test but grows without limit in a long-running
/// process; [`Recorder::with_capacity`] keeps only the most recent `n` events, dropping the oldest
/// first. Recording never fails, so the monitor never drops a recorder.
///
/// The readers ([`events`](Recorder::events), [`kinds`](Recorder::kinds), ...) return copies taken
/// under the lock, so they never see half an emission and never hold the lock after they return.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_core::{Instant, JobSnapshot};
/// use admission_core::event::{Event, EventKind, EventSink};
/// use admission_events::Recorder;
///
/// let recorder = Arc::new(Recorder::new());
/// let sink: Arc<dyn EventSink> = recorder.clone();
/// let job = JobSnapshot { id: 7, name: "summarize".into(), workflow: None, tenant: None, level: None };
/// let event = Event {
///     kind: EventKind::GrantedImmediate,
///     at: Instant::from_nanos(1_000),
///     job,
///     entries: Vec::new(),
/// };
/// sink.emit(&event)?;
/// assert_eq!(recorder.kinds(), ["granted_immediate"]);
/// assert_eq!(recorder.for_job(7), [event]);
/// # Ok::<(), admission_core::event::SinkError>(())
/// ```
pub struct Recorder {
    /// The most events kept; `None` keeps everything.
    capacity: Option<usize>,
    /// The events in arrival order; never longer than `capacity`.
    events: Mutex<VecDeque<Event>>,
}

impl Recorder {
    /// A recorder that keeps every event (unbounded: meant for tests and short runs).
    pub fn new() -> Recorder {
        Recorder {
            capacity: None,
            events: Mutex::new(VecDeque::new()),
        }
    }

    /// A recorder that keeps only the last `capacity` events; the oldest go first.
    ///
    /// A capacity of zero keeps nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{Instant, JobSnapshot};
    /// use admission_core::event::{Event, EventKind, EventSink};
    /// use admission_events::Recorder;
    ///
    /// let recorder = Recorder::with_capacity(2);
    /// for id in 1..=3 {
    ///     let job = JobSnapshot { id, name: "j".into(), workflow: None, tenant: None, level: None };
    ///     let kind = EventKind::GrantedImmediate;
    ///     recorder.emit(&Event { kind, at: Instant::ZERO, job, entries: Vec::new() })?;
    /// }
    /// let ids: Vec<u64> = recorder.events().iter().map(|e| e.job.id).collect();
    /// assert_eq!(ids, [2, 3]);
    /// # Ok::<(), admission_core::event::SinkError>(())
    /// ```
    pub fn with_capacity(capacity: usize) -> Recorder {
        Recorder {
            capacity: Some(capacity),
            events: Mutex::new(VecDeque::with_capacity(capacity.min(1_024))),
        }
    }

    /// The most events kept, `None` when unbounded.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// A copy of the events kept, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().iter().cloned().collect()
    }

    /// The wire names of the kept events' kinds ([`EventKind::as_str`](admission_core::event::EventKind::as_str)),
    /// oldest first.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.events.lock().iter().map(|e| e.kind.as_str()).collect()
    }

    /// How many kept events have the kind whose wire name is `kind` (`"held"`, `"released"`, ...).
    pub fn count(&self, kind: &str) -> usize {
        self.events
            .lock()
            .iter()
            .filter(|e| e.kind.as_str() == kind)
            .count()
    }

    /// A copy of the kept events about the job with id `id`, oldest first.
    pub fn for_job(&self, id: u64) -> Vec<Event> {
        self.events
            .lock()
            .iter()
            .filter(|e| e.job.id == id)
            .cloned()
            .collect()
    }

    /// How many events are kept.
    pub fn len(&self) -> usize {
        self.events.lock().len()
    }

    /// True when no event is kept.
    pub fn is_empty(&self) -> bool {
        self.events.lock().is_empty()
    }

    /// Forgets every event kept so far.
    pub fn clear(&self) {
        self.events.lock().clear();
    }
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder::new()
    }
}

impl EventSink for Recorder {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        if self.capacity == Some(0) {
            return Ok(());
        }
        // Cloned before locking, so the lock is held only for the push.
        let event = event.clone();
        let mut events = self.events.lock();
        if let Some(capacity) = self.capacity {
            while events.len() >= capacity {
                events.pop_front();
            }
        }
        events.push_back(event);
        Ok(())
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}
