//! [`JsonLinesSink`]: one JSON object per event, one event per line, on any writer.

use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::num::NonZeroUsize;
use std::path::Path;

use admission_core::event::{Event, EventSink, SinkError};
use parking_lot::Mutex;

/// When a [`JsonLinesSink`] flushes its writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FlushPolicy {
    /// After every line (the default): a reader tailing the file sees each event at once.
    #[default]
    EveryLine,
    /// After every `n` lines, and whenever [`JsonLinesSink::flush`] is called.
    EveryLines(NonZeroUsize),
    /// Only when [`JsonLinesSink::flush`] is called, or when the writer flushes itself (a
    /// [`BufWriter`] does when it is full and when it is dropped).
    Manual,
}

/// Writes each event as one line of JSON (the [`Event`]'s `Serialize` form) to a writer.
///
/// Each line is serialized in full before it is written with one `write_all`, so a serialization
/// error never leaves half a line behind. An I/O error is returned as a [`SinkError`], whereupon
/// the monitor (or a [`Fanout`](crate::Fanout)) drops the sink; the sink also refuses every later
/// event, since the writer may hold a partial line.
///
/// The writer sits behind a lock: concurrent emitters write whole lines, one at a time.
///
/// # Examples
///
/// ```
/// use admission_core::{Instant, JobSnapshot};
/// use admission_core::event::{Event, EventKind, EventSink};
/// use admission_events::JsonLinesSink;
///
/// let sink = JsonLinesSink::new(Vec::new());
/// let job = JobSnapshot { id: 3, name: "j".into(), workflow: None, tenant: None, level: None };
/// let kind = EventKind::Released { rolled_back: false };
/// sink.emit(&Event { kind, at: Instant::from_nanos(5), job, entries: Vec::new() })?;
/// let text = String::from_utf8(sink.into_inner()).unwrap();
/// assert_eq!(
///     text,
///     r#"{"type":"released","rolled_back":false,"at":5,"job":{"id":3,"name":"j","workflow":null,"tenant":null},"entries":[]}"#
///         .to_owned() + "\n"
/// );
/// # Ok::<(), admission_core::event::SinkError>(())
/// ```
pub struct JsonLinesSink<W: Write + Send> {
    flush: FlushPolicy,
    /// The writer and its bookkeeping; every line is written and flushed under this lock.
    inner: Mutex<Inner<W>>,
}

struct Inner<W> {
    writer: W,
    /// Lines written since the last flush.
    unflushed: usize,
    /// Set by the first I/O error; the sink refuses everything afterwards.
    failed: bool,
}

impl<W: Write + Send> JsonLinesSink<W> {
    /// A sink writing to `writer`, flushing after every line.
    pub fn new(writer: W) -> JsonLinesSink<W> {
        JsonLinesSink {
            flush: FlushPolicy::EveryLine,
            inner: Mutex::new(Inner {
                writer,
                unflushed: 0,
                failed: false,
            }),
        }
    }

    /// The same sink with another flush policy.
    pub fn with_flush(mut self, flush: FlushPolicy) -> JsonLinesSink<W> {
        self.flush = flush;
        self
    }

    /// The flush policy.
    pub fn flush_policy(&self) -> FlushPolicy {
        self.flush
    }

    /// Flushes the writer now.
    ///
    /// # Errors
    ///
    /// The writer's error; the sink then refuses every later event.
    pub fn flush(&self) -> io::Result<()> {
        let mut inner = self.inner.lock();
        let result = inner.writer.flush();
        match result {
            Ok(()) => inner.unflushed = 0,
            Err(_) => inner.failed = true,
        }
        result
    }

    /// The writer back, without a final flush (a [`BufWriter`] flushes itself when dropped).
    pub fn into_inner(self) -> W {
        self.inner.into_inner().writer
    }

    fn write_line(&self, line: &[u8]) -> io::Result<()> {
        let mut inner = self.inner.lock();
        if inner.failed {
            return Err(io::Error::other("an earlier write failed"));
        }
        let result = inner.write_line(line, self.flush);
        if result.is_err() {
            inner.failed = true;
        }
        result
    }
}

impl<W: Write> Inner<W> {
    /// Writes one whole line, then flushes if `policy` says it is due.
    fn write_line(&mut self, line: &[u8], policy: FlushPolicy) -> io::Result<()> {
        self.writer.write_all(line)?;
        self.unflushed += 1;
        let due = match policy {
            FlushPolicy::EveryLine => true,
            FlushPolicy::EveryLines(n) => self.unflushed >= n.get(),
            FlushPolicy::Manual => false,
        };
        if due {
            self.writer.flush()?;
            self.unflushed = 0;
        }
        Ok(())
    }
}

impl JsonLinesSink<BufWriter<File>> {
    /// A sink writing to a new file at `path` (an existing file is truncated), buffered, flushing
    /// after every line.
    ///
    /// # Errors
    ///
    /// The error from creating the file.
    pub fn create(path: impl AsRef<Path>) -> io::Result<JsonLinesSink<BufWriter<File>>> {
        Ok(JsonLinesSink::new(BufWriter::new(File::create(path)?)))
    }
}

impl<W: Write + Send + 'static> EventSink for JsonLinesSink<W> {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        let mut line = serde_json::to_vec(event).map_err(|e| {
            SinkError(format!(
                "serializing a `{}` event failed: {e}",
                event.kind.as_str()
            ))
        })?;
        line.push(b'\n');
        self.write_line(&line).map_err(|e| {
            SinkError(format!(
                "writing a `{}` event as a JSON line failed: {e}",
                event.kind.as_str()
            ))
        })
    }
}

impl<W: Write + Send> fmt::Debug for JsonLinesSink<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("JsonLinesSink")
            .field("flush", &self.flush)
            .field("unflushed", &inner.unflushed)
            .field("failed", &inner.failed)
            .finish_non_exhaustive()
    }
}
