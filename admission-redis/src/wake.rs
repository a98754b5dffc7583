//! Telling waiters of their grants, at a cost that does not grow with the fleet.
//!
//! Each provider has an instance id of its own, sent with every acquisition that may join the
//! line. When the hand-off grants a waiter, the script writes a notice to the stream of the
//! waiter's instance (`<tag>:to:<instance>`, in the cell's slot). One reader per provider
//! (`XREAD BLOCK` on a connection of its own) reads only those notices, from the stream's start,
//! and hands each to the local waiter whose acquisition (its nonce) it names. So a release on any
//! instance wakes the one instance whose waiter it admitted, in one round trip, and no instance
//! reads what concerns the others.
//!
//! A cell with rates also tells the head of its line, when the line's walk stops at it for want
//! of rate alone, the server instant the rates will serve it (a `ready` notice): nobody else's
//! call would grant it then, so it asks again itself at that instant.
//!
//! A notice names its acquisition, so reading one twice (a reader whose connection failed reads
//! from the start again) or after its waiter left hands nothing to anyone else. When the reader
//! fails, every local waiter asks again at once. A notice that never arrives (the server
//! restarted, or it was trimmed unread) costs its waiter only time: the waiter asks again at its
//! own computed deadlines (its timeout, the earliest lease expiry, its ticket's liveness renewal),
//! and that call claims the grant.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::streams::StreamReadReply;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::connection::blocking_connection;
use crate::script::{Cell, Occupancy, StreamId};

/// How many times the reader failed: each wakes every waiter, whose next attempt then fails
/// closed, succeeds, or waits again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    failures: u64,
}

/// A grant the hand-off made to a local waiter, as its notice says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    pub(crate) token: u64,
    pub(crate) policy_version: u64,
    pub(crate) occupancy: Occupancy,
    /// The server's clock at the grant, read against the waiter's own refusal to place the
    /// lease's beginning on the local clock.
    pub(crate) time_ms: u64,
    /// When the grant expires unless renewed, on the server's clock: at most one TTL after
    /// `time_ms`, earlier when the waiter's liveness ran out sooner (the hand-off never grants
    /// past it). `None` from a notice that does not say (one lease TTL).
    pub(crate) expiry_ms: Option<u64>,
}

/// What a notice tells a waiter.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Notice {
    /// The hand-off granted it.
    Granted(Granted),
    /// It heads the line and the rates serve it at server ms `at_ms` (the notice was written
    /// at server ms `time_ms`).
    Ready { at_ms: u64, time_ms: u64 },
}

/// How a wait for the line ended.
pub(crate) enum Woken {
    Granted(Granted),
    /// Ask again at this instant (or sooner, at the waiter's own deadlines).
    ReadyAt(Instant),
    /// Ask again now: the reader failed, or the wait's own deadline passed.
    AskAgain,
}

/// Local waiters by the nonce of their acquisition. A few notices may queue for a waiter (a
/// grant, instants); one that finds the queue full is dropped: its waiter still asks again at its
/// own deadlines.
type Slots = Arc<Mutex<HashMap<String, mpsc::Sender<Notice>>>>;

/// The provider's instance id, its one reader (started by the first waiter) and its local
/// waiters.
pub(crate) struct Wakeups {
    instance: String,
    reader: Mutex<Option<Reader>>,
    slots: Slots,
}

impl Default for Wakeups {
    fn default() -> Wakeups {
        Wakeups {
            instance: instance_id(),
            reader: Mutex::default(),
            slots: Slots::default(),
        }
    }
}

/// 32 hex digits no other provider chooses: a digest of this process, the time, a counter and
/// std's per-process random hashing keys.
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut digest = Sha256::new();
    digest.update(std::process::id().to_le_bytes());
    digest.update(nanos.to_le_bytes());
    digest.update(random.finish().to_le_bytes());
    digest.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A local waiter's place for its grant; leaves the table when dropped.
pub(crate) struct Slot {
    slots: Slots,
    nonce: String,
    notices: mpsc::Receiver<Notice>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().remove(&self.nonce);
    }
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

impl Wakeups {
    /// This provider's instance id, which an acquisition sends so that the hand-off's notice of
    /// its grant comes here.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// Registers the acquisition `nonce` for a grant from the line.
    pub(crate) fn register(&self, nonce: &str) -> Slot {
        let (tx, notices) = mpsc::channel(4);
        self.slots.lock().insert(nonce.to_owned(), tx);
        Slot {
            slots: self.slots.clone(),
            nonce: nonce.to_owned(),
            notices,
        }
    }

    /// Waits until the reader hands `slot` a notice, the reader fails, or `until` passes.
    pub(crate) async fn wait_grant(
        &self,
        cell: &Arc<Cell>,
        slot: &mut Slot,
        until: Instant,
    ) -> Woken {
        let mut seen = self.subscribe(cell);
        let failures = seen.borrow().failures;
        tokio::select! {
            notice = slot.notices.recv() => match notice {
                Some(Notice::Granted(granted)) => Woken::Granted(granted),
                // The server's instant, placed on the local clock from the notice's own time:
                // just after it, so the rates have refilled when the call arrives.
                Some(Notice::Ready { at_ms, time_ms }) => Woken::ReadyAt(
                    Instant::now() + Duration::from_millis(at_ms.saturating_sub(time_ms) + 1),
                ),
                None => Woken::AskAgain,
            },
            _ = seen.wait_for(|s| s.failures != failures) => Woken::AskAgain,
            () = tokio::time::sleep_until(until) => Woken::AskAgain,
        }
    }

    /// The running reader's news, starting it if none runs. A reader started now reads the
    /// notices from the stream's start: it sees every grant made to a waiter registered before.
    fn subscribe(&self, cell: &Arc<Cell>) -> watch::Receiver<Seen> {
        let mut reader = self.reader.lock();
        if let Some(r) = reader.as_ref().filter(|r| !r.task.is_finished()) {
            return r.seen.clone();
        }
        let (tx, rx) = watch::channel(Seen::default());
        let key = cell.notices_key(&self.instance);
        // The reader holds only a weak reference: it ends with the provider's last clone.
        let task = tokio::spawn(read(Arc::downgrade(cell), key, self.slots.clone(), tx));
        *reader = Some(Reader {
            seen: rx.clone(),
            task,
        });
        rx
    }
}

/// The longest one blocking read waits for news.
const BLOCK: Duration = Duration::from_secs(5);

async fn read(cell: std::sync::Weak<Cell>, key: String, slots: Slots, seen: watch::Sender<Seen>) {
    let mut conn = None;
    let mut last = StreamId::default();
    loop {
        let Some(strong) = cell.upgrade() else {
            return;
        };
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
                for record in reply.keys.into_iter().flat_map(|stream| stream.ids) {
                    last = last.max(StreamId::parse(&record.id));
                    let field = |name: &str| record.get::<String>(name).unwrap_or_default();
                    let time_ms = field("time_ms").parse().unwrap_or(0);
                    if let Some(at_ms) = record.get::<String>("at") {
                        let waiter = slots.lock().get(&field("nonce")).cloned();
                        if let Some(waiter) = waiter {
                            let at_ms = at_ms.parse().unwrap_or(0);
                            let _ = waiter.try_send(Notice::Ready { at_ms, time_ms });
                        }
                        continue;
                    }
                    let waiter = slots.lock().remove(&field("nonce"));
                    if let Some(waiter) = waiter {
                        let numbers: Vec<String> =
                            field("occupancy").split(' ').map(str::to_string).collect();
                        let _ = waiter.try_send(Notice::Granted(Granted {
                            token: field("token").parse().unwrap_or(0),
                            policy_version: field("policy").parse().unwrap_or(0),
                            occupancy: Occupancy::from_fields(&numbers),
                            time_ms,
                            expiry_ms: field("expiry").parse().ok(),
                        }));
                    }
                }
            }
            Ok(None) => {}
            Err(error) => {
                conn = None;
                // The server may have restarted (its clock and the stream with it): read from
                // the start again; a notice read twice finds no waiter the second time.
                last = StreamId::default();
                failed(&seen, &error);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn failed(seen: &watch::Sender<Seen>, error: &redis::RedisError) {
    tracing::debug!(%error, "admission-redis: notices reader failed; waiters re-ask");
    seen.send_modify(|s| s.failures += 1);
}
