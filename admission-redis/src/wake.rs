//! Telling waiters of their grants: one reader per process (`XREAD BLOCK` on a connection of its
//! own) reads the cell's events stream and hands each `admitted` record of the line's hand-off
//! to the local waiter it names, so a release on any instance admits the waiters of every
//! instance without a polling loop and without one connection per waiter.
//!
//! A waiter registers its lease id before it first asks, and its refusal carries the id of the
//! stream's record at that moment (its `queued` record). The reader starts after the first
//! waiter's record; a waiter whose record is older than where the running reader started asks
//! again once, which claims a grant the reader could not see, so no grant is missed. The reader numbers what it reads (`seq`): a gap means trimming
//! dropped records it never saw, and every local waiter asks again, as it does when the reader
//! fails. Besides, a waiter asks again at its own computed deadlines (its timeout, the earliest
//! lease expiry, its ticket's liveness renewal).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::streams::StreamReadReply;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::connection::blocking_connection;
use crate::script::{Cell, Occupancy, StreamId};

/// How many times the reader failed or saw a gap: each wakes every waiter, whose next attempt
/// then fails closed, succeeds, or waits again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    failures: u64,
}

/// A grant the hand-off made to a local waiter, as its `admitted` record says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    pub(crate) token: u64,
    pub(crate) policy_version: u64,
    pub(crate) occupancy: Occupancy,
    /// The server's clock at the grant, read against the waiter's own refusal to place the
    /// lease's beginning on the local clock.
    pub(crate) time_ms: u64,
}

/// Local waiters by lease id, each with the generation of its registration.
type Slots = Arc<Mutex<HashMap<String, (u64, oneshot::Sender<Granted>)>>>;

/// The process's one reader, started by the first waiter, and the local waiters by lease id.
#[derive(Default)]
pub(crate) struct Wakeups {
    reader: Mutex<Option<Reader>>,
    slots: Slots,
}

/// A local waiter's place for its grant; leaves the table when dropped.
pub(crate) struct Slot {
    slots: Slots,
    id: String,
    generation: u64,
    grant: oneshot::Receiver<Granted>,
    /// Whether it already asked again because the reader started after its refusal.
    asked_again: bool,
    /// Whether its sender is gone (a later registration of the same id replaced it).
    closed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Only its own registration: another acquisition of the same id may have replaced it.
        let mut slots = self.slots.lock();
        if slots
            .get(&self.id)
            .is_some_and(|(generation, _)| *generation == self.generation)
        {
            slots.remove(&self.id);
        }
    }
}

struct Reader {
    seen: watch::Receiver<Seen>,
    task: JoinHandle<()>,
    /// The record the reader started after: it never sees records up to this one.
    start: StreamId,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Wakeups {
    /// Registers waiter `id` for a grant from the line. While another acquisition of the same
    /// id is registered (a duplicate, which the script refuses), the new slot is born closed and
    /// the first keeps its place.
    pub(crate) fn register(&self, id: &str) -> Slot {
        static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, grant) = oneshot::channel();
        let mut slots = self.slots.lock();
        let closed = slots.contains_key(id);
        if !closed {
            slots.insert(id.to_string(), (generation, tx));
        }
        Slot {
            slots: self.slots.clone(),
            id: id.to_string(),
            generation,
            grant,
            asked_again: false,
            closed,
        }
    }

    /// Waits until the reader hands `slot` its grant (returned), the reader fails or sees a
    /// gap, or `until` passes (both `None`: ask again). The reader starts from `after` at the
    /// latest.
    pub(crate) async fn wait_grant(
        &self,
        cell: &Arc<Cell>,
        slot: &mut Slot,
        after: StreamId,
        until: Instant,
    ) -> Option<Granted> {
        let (mut seen, late) = self.subscribe(cell, after);
        if late && !slot.asked_again {
            // The running reader started after this waiter's refusal: a grant recorded in
            // between is one it will never see. Ask again (once): that claims such a grant, or
            // refuses with a record the reader does see. (Once: a server whose clock went back
            // after a restart must not make this a loop; the waiter's deadlines still hold.)
            slot.asked_again = true;
            return None;
        }
        let failures = seen.borrow().failures;
        let woken = seen.wait_for(|s| s.failures != failures);
        tokio::pin!(woken);
        if !slot.closed {
            tokio::select! {
                granted = &mut slot.grant => match granted {
                    Ok(granted) => return Some(granted),
                    // Replaced by another acquisition of the same id: no grant comes this way.
                    Err(_) => slot.closed = true,
                },
                _ = &mut woken => return None,
                () = tokio::time::sleep_until(until) => return None,
            }
        }
        tokio::select! {
            _ = &mut woken => None,
            () = tokio::time::sleep_until(until) => None,
        }
    }

    /// The running reader's news, starting it from `from` if none runs, and whether the one
    /// running started after `from`.
    fn subscribe(&self, cell: &Arc<Cell>, from: StreamId) -> (watch::Receiver<Seen>, bool) {
        let mut reader = self.reader.lock();
        if let Some(r) = reader.as_ref().filter(|r| !r.task.is_finished()) {
            return (r.seen.clone(), from < r.start);
        }
        let (tx, rx) = watch::channel(Seen::default());
        // The reader holds only a weak reference: it ends with the provider's last clone.
        let task = tokio::spawn(read(Arc::downgrade(cell), self.slots.clone(), from, tx));
        *reader = Some(Reader {
            seen: rx.clone(),
            task,
            start: from,
        });
        (rx, false)
    }
}

/// The longest one blocking read waits for news.
const BLOCK: Duration = Duration::from_secs(5);

async fn read(
    cell: std::sync::Weak<Cell>,
    slots: Slots,
    mut last: StreamId,
    seen: watch::Sender<Seen>,
) {
    let mut conn = None;
    let mut last_seq: Option<u64> = None;
    loop {
        let Some(strong) = cell.upgrade() else {
            return;
        };
        let key = strong.events_key().to_owned();
        let retry = strong.config.connect_timeout;
        if conn.is_none() {
            match blocking_connection(&strong.clients, &strong.config, BLOCK).await {
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
        let mut command = redis::cmd("XREAD");
        command
            .arg("COUNT")
            .arg(256)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&key)
            .arg(last.render());
        let reply: redis::RedisResult<Option<StreamReadReply>> = c.query(&command).await;
        match reply {
            Ok(Some(reply)) => {
                let mut gap = false;
                for stream in reply.keys {
                    for record in stream.ids {
                        last = last.max(StreamId::parse(&record.id));
                        let field = |name: &str| record.get::<String>(name).unwrap_or_default();
                        let seq: u64 = field("seq").parse().unwrap_or(0);
                        gap |= last_seq.is_some_and(|l| seq != l + 1);
                        last_seq = Some(seq);
                        if field("kind") == "admitted" && field("outcome") == "handoff" {
                            let waiter = slots.lock().remove(&field("lease"));
                            if let Some((_, waiter)) = waiter {
                                let numbers: Vec<String> =
                                    field("occupancy").split(' ').map(str::to_string).collect();
                                let _ = waiter.send(Granted {
                                    token: field("token").parse().unwrap_or(0),
                                    policy_version: field("policy").parse().unwrap_or(0),
                                    occupancy: Occupancy::from_fields(&numbers),
                                    time_ms: field("time_ms").parse().unwrap_or(0),
                                });
                            }
                        }
                    }
                }
                if gap {
                    seen.send_modify(|s| s.failures += 1);
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
