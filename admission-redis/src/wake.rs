//! Waking waiters from the cell's events stream: one reader per process (`XREAD BLOCK` on a
//! connection of its own), so a release on any instance wakes the waiters of every instance
//! without a polling loop.
//!
//! A waiter's refusal carries the id of the stream's last record at the moment of the refusal
//! (read in the same script call), so a release recorded after it is never missed: the waiter
//! sleeps until the reader has seen a capacity-freeing record past that id, its own deadline, or
//! the earliest lease expiry (reaping is lazy: the next call reaps it).

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::streams::{StreamReadOptions, StreamReadReply};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::coordinator::{Inner, blocking_connection};

/// A stream record id, `ms-seq`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct StreamId(pub(crate) u64, pub(crate) u64);

impl StreamId {
    pub(crate) fn parse(text: &str) -> StreamId {
        let mut parts = text.splitn(2, '-');
        let ms = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let seq = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        StreamId(ms, seq)
    }

    fn render(self) -> String {
        format!("{}-{}", self.0, self.1)
    }
}

/// What the reader has seen: the last capacity-freeing record, and how many times the reader
/// failed (a failure wakes every waiter, whose next attempt then fails closed or succeeds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    freeing: StreamId,
    failures: u64,
}

/// The process's one reader, started by the first waiter.
#[derive(Default)]
pub(crate) struct Wakeups {
    reader: Mutex<Option<Reader>>,
}

struct Reader {
    seen: watch::Receiver<Seen>,
    task: JoinHandle<()>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Record kinds that can make room.
const FREEING: [&str; 6] = [
    "completed",
    "failed",
    "interrupted",
    "expired",
    "policy_changed",
    "timed_out",
];

impl Wakeups {
    /// Sleeps until a capacity-freeing record after `after` is seen, the reader fails, or
    /// `until` passes.
    pub(crate) async fn wait_after(&self, inner: &Arc<Inner>, after: StreamId, until: Instant) {
        let mut seen = self.subscribe(inner, after);
        let failures = seen.borrow().failures;
        let woken =
            seen.wait_for(|s| s.freeing.cmp(&after) == Ordering::Greater || s.failures != failures);
        let _ = tokio::time::timeout_at(until, woken).await;
    }

    fn subscribe(&self, inner: &Arc<Inner>, from: StreamId) -> watch::Receiver<Seen> {
        let mut reader = self.reader.lock();
        if let Some(r) = reader.as_ref().filter(|r| !r.task.is_finished()) {
            return r.seen.clone();
        }
        let (tx, rx) = watch::channel(Seen {
            freeing: from,
            failures: 0,
        });
        // The reader holds only a weak reference: it ends with the provider's last clone.
        let task = tokio::spawn(read(Arc::downgrade(inner), from, tx));
        *reader = Some(Reader {
            seen: rx.clone(),
            task,
        });
        rx
    }
}

async fn read(inner: std::sync::Weak<Inner>, mut last: StreamId, seen: watch::Sender<Seen>) {
    let mut conn = None;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let key = strong.events_key.clone();
        let retry = strong.config.connect_timeout;
        if conn.is_none() {
            match blocking_connection(&strong).await {
                Ok(c) => conn = Some(c),
                Err(error) => {
                    drop(strong);
                    failed(&seen, &error);
                    tokio::time::sleep(retry).await;
                    continue;
                }
            }
        }
        drop(strong);
        let Some(c) = conn.as_mut() else { continue };
        // Block for a bounded time so that a provider dropped meanwhile ends the reader.
        let options = StreamReadOptions::default().block(5_000).count(256);
        let reply: redis::RedisResult<Option<StreamReadReply>> =
            redis::AsyncCommands::xread_options(c, &[&key], &[last.render()], &options).await;
        match reply {
            Ok(Some(reply)) => {
                let mut freeing = None;
                for stream in reply.keys {
                    for record in stream.ids {
                        let id = StreamId::parse(&record.id);
                        last = last.max(id);
                        let kind: Option<String> = record.get("kind");
                        if kind.is_some_and(|k| FREEING.contains(&k.as_str())) {
                            freeing = Some(id);
                        }
                    }
                }
                if let Some(id) = freeing {
                    seen.send_modify(|s| s.freeing = s.freeing.max(id));
                }
            }
            Ok(None) => {}
            Err(error) => {
                conn = None;
                failed(&seen, &error);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn failed(seen: &watch::Sender<Seen>, error: &redis::RedisError) {
    tracing::debug!(%error, "admission-redis: events reader failed; waiters re-ask");
    seen.send_modify(|s| s.failures += 1);
}
