//! The line: the parked waiters in arrival order (or behind the head in order of their fair-share
//! tags), each in a slot of a slab the state machine owns.
//!
//! A waiter's whole record ([`Waiter`]: its demand, job, deadline, holds and whom to wake) sits in
//! its slot, and the caller keeps only its [`Place`]. When a waiter is decided (granted or
//! refused) it leaves the line but keeps its slot, holding the decision ([`Done`]) until its owner
//! collects it; a place names its slot and its arrival number, so a place whose waiter is gone
//! finds nothing, even in a slot reused since.
//!
//! Everything is O(1) but the walk: parking at the tail, leaving from anywhere, finding the head.
//! Under fair shares parking and leaving keep an index of the waiters behind the head by tag,
//! O(log n).
//! A pass that stops between batches parks a cursor here ([`Line::hold_cursor`]); a waiter
//! leaving meanwhile moves it on, and one parking at the end when it had reached the end is
//! where it resumes.
//!
//! What held a parked waiter, and for how long, is kept here too: the holds of its record
//! ([`Hold`], [`Holds`]), the same as bits for the pass's one comparison ([`Holding`]), and what a
//! grant keeps of them ([`Waits`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use smallvec::SmallVec;

use crate::clock::Instant;
use crate::context::{JobContext, WaiterKey};
use crate::demand::Demand;
use crate::error::AdmitError;
use crate::sync::thread;

/// Who to wake when a waiter's decision lands.
#[derive(Default)]
pub(crate) enum Notify {
    /// Nobody (a blocking waiter not parked yet, or a decision its owner already holds).
    #[default]
    Nobody,
    /// A task, through its waker.
    Task(Waker),
    /// A thread blocked in `admit_blocking`, through its handle.
    Thread(thread::Thread),
}

impl Notify {
    /// Wakes whoever this names. Only the shell calls it, with no lock held.
    pub(crate) fn wake(self) {
        match self {
            Notify::Nobody => {}
            Notify::Task(waker) => waker.wake(),
            Notify::Thread(thread) => thread.unpark(),
        }
    }
}

/// A job parked in the line.
///
/// Laid out in declaration order (`repr(C)`), what every pass reads first: the demand's handle,
/// the deadline, which accounts hold it and whether the gate does. With the slot's tag, its
/// arrival number and the node's links in front of them, these fall in the slot's first 64 bytes.
#[repr(C)]
pub(crate) struct Waiter {
    pub(crate) demand: Demand,
    /// Its deadline ([`Instant::MAX`]: none).
    deadline: Instant,
    /// Which of `held` hold the waiter now, so that a pass finding the same accounts short as
    /// last time records nothing.
    pub(crate) holding: Holding,
    /// True while the gate is what holds it.
    pub(crate) on_gate: bool,
    /// Its priority level's rank (0 first; 0 for every waiter without levels): the line keeps
    /// the waiters in order of their ranks, then of their tags.
    pub(crate) rank: u8,
    pub(crate) asked_at: Instant,
    pub(crate) ctx: JobContext,
    /// The timeout it was parked with (its deadline, `asked_at` plus this, is `deadline`).
    pub(crate) timeout: Option<Duration>,
    /// The accounts (by entry; the gate too) that have held it. Feeds `Held` events and
    /// `Grant::wait_times`.
    pub(crate) held: Holds,
    /// Whom to wake when it is decided.
    pub(crate) notify: Notify,
}

/// A start tag under fair shares (`machine/fair.rs`): within a rank, the line keeps the waiters
/// behind its head in the order of these. Kept beside the slab, by slot, only by a line in fair
/// shares or levels, so that a plain line's slots do not carry it; 128 bits as two words (a
/// `u128` would align the table to 16). Ordered as the number it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Tag {
    high: u64,
    low: u64,
}

impl Tag {
    pub(crate) const ZERO: Tag = Tag { high: 0, low: 0 };

    pub(crate) const fn get(self) -> u128 {
        ((self.high as u128) << 64) | self.low as u128
    }
}

impl From<u128> for Tag {
    fn from(tag: u128) -> Tag {
        Tag {
            high: (tag >> 64) as u64,
            low: tag as u64,
        }
    }
}

/// Where a waiter stands among the others behind the head: its rank; false for a head a newcomer
/// of a higher level displaced (it stays first of its rank, whatever its tag, to be the head
/// again); its tag; its arrival.
type Key = (u8, bool, Tag, u64);

impl Waiter {
    /// A waiter about to park at `asked_at`, with `timeout` (held by the gate or not).
    pub(crate) fn new(
        demand: Demand,
        ctx: JobContext,
        asked_at: Instant,
        timeout: Option<Duration>,
        on_gate: bool,
        notify: Notify,
    ) -> Waiter {
        Waiter {
            demand,
            ctx,
            asked_at,
            timeout,
            deadline: timeout.map_or(Instant::MAX, |t| asked_at.saturating_add(t)),
            holding: Holding::default(),
            on_gate,
            rank: 0,
            held: Holds::new(),
            notify,
        }
    }

    /// The waiter's deadline (`None`: no timeout, or one too long to be reached).
    #[inline]
    pub(crate) fn deadline(&self) -> Option<Instant> {
        (self.deadline != Instant::MAX).then_some(self.deadline)
    }

    /// The waiter's deadline, [`Instant::MAX`] for none.
    #[inline]
    pub(crate) fn deadline_or_max(&self) -> Instant {
        self.deadline
    }

    /// True once the waiter's deadline is at or before `now`.
    #[inline]
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.deadline <= now && self.deadline != Instant::MAX
    }
}

/// What was decided for a waiter that left the line, kept in its slot until its owner collects
/// it. The demand goes back to the owner either way: a grant is made of it, and a refused one is
/// dropped by the owner, outside the monitor's lock.
pub(crate) struct Done {
    pub(crate) demand: Demand,
    /// The grant's waits, or why it was refused.
    pub(crate) outcome: Result<Waits, AdmitError>,
}

/// Where a waiter stands: its slot and its arrival number. A slot is reused once its waiter's
/// decision was collected; an arrival number never is, so a stale place finds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    slot: u32,
    seq: u64,
}

impl Place {
    /// The place of the first waiter ever parked in a line (for the models, which expire it).
    #[cfg(all(test, admission_loom))]
    pub(crate) const FIRST: Place = Place { slot: 0, seq: 0 };

    /// The place as its job's context keeps it, for the listener that takes the waiter out of
    /// the line when the job is cancelled.
    pub(crate) fn waiter_key(self) -> WaiterKey {
        WaiterKey(u64::from(self.slot), self.seq)
    }

    /// The place a listener's key names; `None` for a key no place of a line makes.
    pub(crate) fn of_waiter_key(key: WaiterKey) -> Option<Place> {
        Some(Place {
            slot: u32::try_from(key.0).ok()?,
            seq: key.1,
        })
    }
}

/// No slot: the end of the line.
const END: u32 = u32::MAX;

/// Above this many slots an emptied slab gives its memory back.
const KEEP_EMPTY_SLOTS: usize = 4096;

/// Slots per chunk of the slab.
const CHUNK: usize = 256;

/// A waiter in the line, with its neighbours in arrival order (links first: see [`Waiter`]).
#[repr(C)]
struct Node {
    prev: u32,
    next: u32,
    waiter: Waiter,
}

/// One slot of the slab.
#[repr(C, u32)]
enum Slot {
    /// Free, linked to the next free slot.
    Vacant { next_free: u32 },
    /// A waiter in the line.
    Waiting { seq: u64, node: Node },
    /// A waiter that left the line, its decision not collected yet.
    Decided { seq: u64, done: Done },
}

/// The slab: fixed-size chunks, so a line longer than any before grows by one chunk and never
/// copies the slots it has (a vector that doubles would copy them all under the monitor lock: at
/// a million waiters, over 100 MB). Free slots form a list, last freed first, so a busy line
/// keeps reusing the same warm slots. Each chunk serves one priority level (rank), with a free
/// list of its own: a level's waiters sit together, so a pass, which walks the line a level at
/// a time, walks the slab in order whatever order the levels arrived in (a line without levels
/// has one rank, 0).
#[derive(Default)]
struct Slots {
    chunks: Vec<Box<[Slot]>>,
    /// The rank each chunk serves.
    ranks: Vec<u8>,
    /// The first free slot of each rank.
    free: [Option<u32>; MAX_RANKS],
    /// Slots in use (waiting or decided).
    used: usize,
}

impl Slots {
    fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    fn slot(&self, slot: u32) -> Option<&Slot> {
        let slot = slot as usize;
        self.chunks
            .get(slot / CHUNK)
            .map(|chunk| &chunk[slot % CHUNK])
    }

    fn slot_mut(&mut self, slot: u32) -> Option<&mut Slot> {
        let slot = slot as usize;
        self.chunks
            .get_mut(slot / CHUNK)
            .map(|chunk| &mut chunk[slot % CHUNK])
    }

    /// The node in `slot`, which holds a waiter.
    fn node(&self, slot: u32) -> &Node {
        match self.slot(slot) {
            Some(Slot::Waiting { node, .. }) => node,
            _ => unreachable!("slot {slot} holds a waiter"),
        }
    }

    /// The node in `slot`, which holds a waiter.
    fn node_mut(&mut self, slot: u32) -> &mut Node {
        match self.slot_mut(slot) {
            Some(Slot::Waiting { node, .. }) => node,
            _ => unreachable!("slot {slot} holds a waiter"),
        }
    }

    /// Stores `value` in a free slot of `rank` (a new chunk when none is free) and returns the
    /// slot.
    ///
    /// # Panics
    ///
    /// With 2^32 - 1 slots in use at once (each is a job holding a thread or a future).
    fn insert(&mut self, value: Slot, rank: u8) -> u32 {
        let rank = usize::from(rank);
        let slot = match self.free[rank] {
            Some(slot) => slot,
            None => self.grow(rank),
        };
        let entry = self.slot_mut(slot).expect("a free slot is in a chunk");
        let Slot::Vacant { next_free } = *entry else {
            unreachable!("the free list holds free slots")
        };
        *entry = value;
        self.free[rank] = (next_free != END).then_some(next_free);
        self.used += 1;
        slot
    }

    /// Adds a chunk of `rank` whose slots are all free and returns its first.
    fn grow(&mut self, rank: usize) -> u32 {
        let base = u32::try_from(self.capacity())
            .ok()
            .filter(|base| base.checked_add(CHUNK as u32).is_some_and(|end| end < END))
            .expect("fewer than 2^32 - 1 waiters parked at once");
        let chunk = (1..=CHUNK as u32)
            .map(|i| Slot::Vacant {
                next_free: if i < CHUNK as u32 { base + i } else { END },
            })
            .collect();
        self.chunks.push(chunk);
        // At most `MAX_RANKS` (16) ranks.
        self.ranks.push(rank as u8);
        base
    }

    /// Frees `slot`, which is in use, to its chunk's rank, and returns what it held.
    fn free(&mut self, slot: u32) -> Slot {
        let rank = usize::from(self.ranks[slot as usize / CHUNK]);
        let next_free = self.free[rank].unwrap_or(END);
        let entry = self.slot_mut(slot).expect("a slot of a chunk");
        let held = std::mem::replace(entry, Slot::Vacant { next_free });
        self.free[rank] = Some(slot);
        self.used -= 1;
        held
    }
}

/// The slab of a line that emptied after it had grown long: to be freed once the monitor lock is
/// let go (giving a hundred megabytes back to the system takes milliseconds).
pub(crate) struct Emptied(
    #[allow(dead_code, reason = "held only to be dropped")] Vec<Box<[Slot]>>,
    #[allow(dead_code, reason = "held only to be dropped")] Vec<Tag>,
);

/// The line: parked waiters in arrival order (by rank, then tag, under priority levels or fair
/// shares), and the decisions not collected yet.
#[derive(Default)]
pub(crate) struct Line {
    /// Under priority levels or fair shares, the index that places a newcomer and the parked
    /// counts (`None`: arrival order).
    fair: Option<Fair>,
    slots: Slots,
    /// Waiters in the line (not counting decided ones).
    len: usize,
    head: Option<u32>,
    tail: Option<u32>,
    next_seq: u64,
    /// The next slot a resuming pass visits (`Some(END)`: the end), while one is between batches.
    cursor: Option<u32>,
    /// The slab of a long line that emptied, until [`Line::take_emptied`].
    emptied: Option<Emptied>,
}

/// What a line by rank and tag keeps beside its links.
struct Fair {
    /// The waiters behind the head by rank, tag and arrival number, to place a newcomer in
    /// O(log n). The head is not in it: it keeps its place whatever its tag (only a newcomer of
    /// a higher level goes before it, and the head it displaced stays first of its rank).
    behind_head: BTreeMap<Key, u32>,
    /// By rank, the slot of the head a newcomer of a higher level displaced, while it waits
    /// behind (`END`: none).
    displaced: [u32; MAX_RANKS],
    /// How many waiters of each tenant are parked, by rank.
    tenants: HashMap<(u8, Option<Arc<str>>), u32>,
    /// How many waiters of each rank are parked.
    ranks: [u32; MAX_RANKS],
    /// Each parked waiter's tag, by slot.
    tags: Vec<Tag>,
}

impl Default for Fair {
    fn default() -> Fair {
        Fair {
            behind_head: BTreeMap::new(),
            displaced: [END; MAX_RANKS],
            tenants: HashMap::new(),
            ranks: [0; MAX_RANKS],
            tags: Vec::new(),
        }
    }
}

impl Fair {
    fn tag(&self, slot: u32) -> Tag {
        self.tags.get(slot as usize).copied().unwrap_or(Tag::ZERO)
    }

    /// The index key of the waiter of `rank` and arrival `seq` in `slot`.
    fn key(&self, slot: u32, rank: u8, seq: u64) -> Key {
        let displaced = self.displaced[usize::from(rank)] == slot;
        (rank, !displaced, self.tag(slot), seq)
    }

    /// Takes the waiter of `rank` and arrival `seq` in `slot` out of the index.
    fn unindex(&mut self, slot: u32, rank: u8, seq: u64) {
        let key = self.key(slot, rank, seq);
        self.behind_head.remove(&key);
        if !key.1 {
            self.displaced[usize::from(rank)] = END;
        }
    }
}

/// The most priority levels a line tells apart.
pub(crate) const MAX_RANKS: usize = 16;

impl Line {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Parks `waiter` at the tail; by rank and tag, behind the last waiter of its rank whose tag
    /// is no later than its own, never ahead of the head unless its rank is higher (a smaller
    /// number) than the head's: O(1) in arrival order, O(log n) by rank and tag.
    ///
    /// # Panics
    ///
    /// With 2^32 - 1 slots in use at once (each is a job holding a thread or a future).
    pub(crate) fn push(&mut self, waiter: Waiter, tag: Tag) -> Place {
        let seq = self.next_seq;
        self.next_seq += 1;
        let rank = waiter.rank;
        let after = match (&self.fair, self.head) {
            (None, _) | (_, None) => self.tail,
            (Some(_), Some(head)) if rank < self.slots.node(head).waiter.rank => None,
            (Some(fair), Some(head)) => Some(
                fair.behind_head
                    .range(..=(rank, true, tag, u64::MAX))
                    .next_back()
                    .map_or(head, |(_, &slot)| slot),
            ),
        };
        let next = match after {
            Some(at) => self.slots.node(at).next,
            None => self.head.unwrap_or(END),
        };
        let node = Node {
            prev: after.unwrap_or(END),
            next,
            waiter,
        };
        if let Some(fair) = &mut self.fair {
            *fair
                .tenants
                .entry((rank, node.waiter.ctx.snapshot().tenant.clone()))
                .or_insert(0) += 1;
            fair.ranks[usize::from(rank)] += 1;
        }
        let slot = self.slots.insert(Slot::Waiting { seq, node }, rank);
        if let Some(fair) = &mut self.fair {
            let at = slot as usize;
            if fair.tags.len() <= at {
                fair.tags.resize(at + 1, Tag::ZERO);
            }
            fair.tags[at] = tag;
            match after {
                Some(_) => {
                    fair.behind_head.insert((rank, true, tag, seq), slot);
                }
                // Before the head: the head stands behind it now, in the index.
                None => {
                    if let Some(Slot::Waiting { seq, node }) = self.slots.slot(next) {
                        let rank = node.waiter.rank;
                        fair.displaced[usize::from(rank)] = next;
                        fair.behind_head.insert(fair.key(next, rank, *seq), next);
                    }
                }
            }
        }
        match after {
            None => self.head = Some(slot),
            Some(at) => self.slots.node_mut(at).next = slot,
        }
        match next {
            END => self.tail = Some(slot),
            next => self.slots.node_mut(next).prev = slot,
        }
        self.len += 1;
        if self.cursor == Some(END) && next == END {
            self.cursor = Some(slot);
        }
        Place { slot, seq }
    }

    /// The smallest tag among the waiters of `rank` (`None`: none is parked): the head's, if of
    /// that rank, or that of the first of that rank behind it, the line keeping them in order.
    pub(crate) fn least_tag(&self, rank: u8) -> Option<Tag> {
        let fair = self.fair.as_ref()?;
        let slot = self.head?;
        let head = self.slots.node(slot);
        // The first of the rank behind the head, and the one after it if that first is a
        // displaced head (first whatever its tag): the others are in order of their tags.
        let mut of_rank = fair
            .behind_head
            .range((rank, false, Tag::ZERO, 0)..)
            .take_while(|((r, ..), _)| *r == rank)
            .map(|((_, in_order, tag, _), _)| (*in_order, *tag));
        let first = of_rank.next();
        let second = first
            .filter(|(in_order, _)| !in_order)
            .and_then(|_| of_rank.next());
        let own = (head.waiter.rank == rank).then(|| fair.tag(slot));
        [own, first.map(|f| f.1), second.map(|s| s.1)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Keeps the waiters in order of their ranks and tags from now on, and counts each rank's
    /// and each tenant's (a line under levels or fair shares, still empty).
    pub(crate) fn order_by_tag(&mut self) {
        debug_assert!(self.is_empty());
        self.fair = Some(Fair::default());
    }

    /// Whether a waiter of `tenant` at `rank` is parked (false when tenants are not counted).
    pub(crate) fn has_parked(&self, rank: u8, tenant: &Option<Arc<str>>) -> bool {
        self.fair.as_ref().is_some_and(|fair| {
            // A lookup by a borrowed pair would need a key type of its own; a tenant's name is
            // one reference count to clone.
            fair.tenants.contains_key(&(rank, tenant.clone()))
        })
    }

    /// How many waiters of `rank` are parked (0 when ranks are not counted).
    pub(crate) fn parked_at(&self, rank: u8) -> u32 {
        self.fair
            .as_ref()
            .map_or(0, |fair| fair.ranks[usize::from(rank)])
    }

    /// How many waiters of each rank are parked (all 0 when ranks are not counted).
    pub(crate) fn parked_by_rank(&self) -> [u32; MAX_RANKS] {
        self.fair.as_ref().map_or([0; MAX_RANKS], |fair| fair.ranks)
    }

    /// Whether the waiter at `place` stands where a paused pass has already walked: before its
    /// cursor (a newcomer placed by its tag), so that pass would not ask it.
    pub(crate) fn walked_past(&self, place: Place) -> bool {
        let Some(waiter) = self.get(place) else {
            return false;
        };
        let key = |slot: u32, waiter: &Waiter| {
            let seq = match self.slots.slot(slot) {
                Some(Slot::Waiting { seq, .. }) => *seq,
                _ => 0,
            };
            self.fair
                .as_ref()
                .map_or((waiter.rank, true, Tag::ZERO, seq), |fair| {
                    fair.key(slot, waiter.rank, seq)
                })
        };
        match self.cursor {
            None => false,
            Some(END) => self.slots.node(place.slot).next != END,
            // A newcomer of a higher level placed before the head stands before every cursor.
            Some(_) if self.head == Some(place.slot) => true,
            Some(cursor) if Some(cursor) == self.head => false,
            // Behind the head, the waiters are in the order of their keys.
            Some(cursor) => key(cursor, &self.slots.node(cursor).waiter) > key(place.slot, waiter),
        }
    }

    /// The waiter at `place`, if it is in the line.
    pub(crate) fn get(&self, place: Place) -> Option<&Waiter> {
        match self.slots.slot(place.slot)? {
            Slot::Waiting { seq, node } if *seq == place.seq => Some(&node.waiter),
            _ => None,
        }
    }

    /// The waiter at `place`, to change, if it is in the line.
    pub(crate) fn get_mut(&mut self, place: Place) -> Option<&mut Waiter> {
        match self.slots.slot_mut(place.slot)? {
            Slot::Waiting { seq, node } if *seq == place.seq => Some(&mut node.waiter),
            _ => None,
        }
    }

    /// True when the waiter at `place` is the head.
    pub(crate) fn is_head(&self, place: Place) -> bool {
        self.head == Some(place.slot) && self.get(place).is_some()
    }

    /// The head of the line.
    pub(crate) fn head(&self) -> Option<&Waiter> {
        self.head.map(|slot| &self.slots.node(slot).waiter)
    }

    /// How many waiters the gate holds.
    pub(crate) fn on_gate(&self) -> usize {
        let mut slot = self.head;
        let mut count = 0;
        while let Some(at) = slot {
            let node = self.slots.node(at);
            count += usize::from(node.waiter.on_gate);
            slot = (node.next != END).then_some(node.next);
        }
        count
    }

    /// Takes the waiter at `place` out of the line, if it is there, and frees its slot: a waiter
    /// whose owner is gone.
    pub(crate) fn remove(&mut self, place: Place) -> Option<Waiter> {
        self.get(place)?;
        let node = self.unlink(place.slot);
        self.slots.free(place.slot);
        self.shrink_if_empty();
        Some(node)
    }

    /// Takes the waiter at `place` out of the line, if it is there, keeping `done` in its slot
    /// for its owner to collect; returns whom to wake.
    pub(crate) fn decide(&mut self, place: Place, done: Done) -> Option<Notify> {
        let waiter = self.get_mut(place)?;
        let notify = std::mem::take(&mut waiter.notify);
        let _ = self.unlink(place.slot);
        *self.slots.slot_mut(place.slot).expect("a slot of a chunk") = Slot::Decided {
            seq: place.seq,
            done,
        };
        Some(notify)
    }

    /// Unlinks the node in `slot` (a waiting one) and hands its waiter out; the slot is left
    /// holding a placeholder for the caller to overwrite or free.
    fn unlink(&mut self, slot: u32) -> Waiter {
        let placeholder = Slot::Vacant { next_free: END };
        let Slot::Waiting { seq, node } = std::mem::replace(
            self.slots.slot_mut(slot).expect("a slot of a chunk"),
            placeholder,
        ) else {
            unreachable!("slot {slot} holds a waiter")
        };
        if let Some(fair) = &mut self.fair {
            if node.prev == END {
                // The head leaves: the waiter behind it is the head now, out of the index.
                if let Some(Slot::Waiting { seq, node: next }) = self.slots.slot(node.next) {
                    let (rank, seq) = (next.waiter.rank, *seq);
                    fair.unindex(node.next, rank, seq);
                }
            } else {
                fair.unindex(slot, node.waiter.rank, seq);
            }
        }
        match node.prev {
            END => self.head = (node.next != END).then_some(node.next),
            prev => self.slots.node_mut(prev).next = node.next,
        }
        match node.next {
            END => self.tail = (node.prev != END).then_some(node.prev),
            next => self.slots.node_mut(next).prev = node.prev,
        }
        if self.cursor == Some(slot) {
            self.cursor = Some(node.next);
        }
        self.len -= 1;
        if let Some(fair) = &mut self.fair {
            let key = (node.waiter.rank, node.waiter.ctx.snapshot().tenant.clone());
            if let Some(count) = fair.tenants.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    fair.tenants.remove(&key);
                }
            }
            fair.ranks[usize::from(node.waiter.rank)] -= 1;
        }
        node.waiter
    }

    /// Whether a decision waits in `place`'s slot for its owner.
    pub(crate) fn is_decided(&self, place: Place) -> bool {
        matches!(self.slots.slot(place.slot), Some(Slot::Decided { seq, .. }) if *seq == place.seq)
    }

    /// Collects the decision kept at `place`, freeing its slot (`None`: nothing decided there).
    pub(crate) fn collect(&mut self, place: Place) -> Option<Done> {
        if !self.is_decided(place) {
            return None;
        }
        let Slot::Decided { done, .. } = self.slots.free(place.slot) else {
            unreachable!("checked above")
        };
        self.shrink_if_empty();
        Some(done)
    }

    /// Gives a long line's slab back once nothing is in it.
    fn shrink_if_empty(&mut self) {
        if self.slots.used == 0 && self.slots.capacity() > KEEP_EMPTY_SLOTS {
            let chunks = std::mem::take(&mut self.slots.chunks);
            let tags = self
                .fair
                .as_mut()
                .map_or_else(Vec::new, |fair| std::mem::take(&mut fair.tags));
            self.slots.free = Default::default();
            self.slots.ranks.clear();
            self.emptied = Some(Emptied(chunks, tags));
            self.cursor = self.cursor.map(|_| END);
        }
    }

    /// The slab a long line left behind when it emptied, for the caller to drop once the monitor
    /// lock is let go.
    pub(crate) fn take_emptied(&mut self) -> Option<Emptied> {
        self.emptied.take()
    }

    /// The waiters, first to last.
    #[cfg(all(test, not(admission_loom)))]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Waiter> {
        let mut slot = self.head;
        std::iter::from_fn(move || {
            let node = self.slots.node(slot?);
            slot = (node.next != END).then_some(node.next);
            Some(&node.waiter)
        })
    }

    /// The places of the waiters, first to last.
    pub(crate) fn places(&self) -> Vec<Place> {
        let mut places = Vec::with_capacity(self.len);
        let mut slot = self.head;
        while let Some(at) = slot {
            let Some(Slot::Waiting { seq, node }) = self.slots.slot(at) else {
                unreachable!("a linked slot holds a waiter")
            };
            places.push(Place {
                slot: at,
                seq: *seq,
            });
            slot = (node.next != END).then_some(node.next);
        }
        places
    }

    /// The first place of a walk from the head (`None` for an empty line).
    pub(crate) fn first(&self) -> Option<Place> {
        self.head.map(|slot| self.place_of(slot))
    }

    fn place_of(&self, slot: u32) -> Place {
        match self.slots.slot(slot) {
            Some(Slot::Waiting { seq, .. }) => Place { slot, seq: *seq },
            _ => unreachable!("slot {slot} holds a waiter"),
        }
    }

    /// The waiter at `place` (one a walk reached: from [`Line::first`], [`Line::resume`] or a
    /// previous step) and the place after it.
    #[inline]
    pub(crate) fn step(&mut self, place: Place) -> (Option<Place>, &mut Waiter) {
        let next = self.slots.node(place.slot).next;
        let next = (next != END).then(|| self.place_of(next));
        (next, &mut self.slots.node_mut(place.slot).waiter)
    }

    /// Parks a walk's cursor at `next` (the place it visits next, `None`: the end) while it
    /// lets go of the lock.
    pub(crate) fn hold_cursor(&mut self, next: Option<Place>) {
        self.cursor = Some(next.map_or(END, |place| place.slot));
    }

    /// Where a walk whose cursor was parked resumes (`None`: nothing left to visit).
    pub(crate) fn resume(&mut self) -> Option<Place> {
        self.cursor
            .take()
            .filter(|&slot| slot != END)
            .map(|slot| self.place_of(slot))
    }

    /// Forgets a parked cursor (the walk it belonged to was abandoned).
    pub(crate) fn drop_cursor(&mut self) {
        self.cursor = None;
    }
}

/// A set of holds as bits: the hold of the demand's entry `i` is bit `i` (for the first
/// [`Holding::ENTRY_BITS`] entries), any later entry's is [`Holding::LATER`], the gate's
/// [`Holding::GATE`]. A set with [`Holding::LATER`] is not exact: read the holds themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holding(u64);

impl Holding {
    const ENTRY_BITS: usize = 62;
    const LATER: u64 = 1 << 62;
    const GATE: u64 = 1 << 63;

    /// The bit of the hold of entry `entry` (`None`: the gate's).
    #[inline]
    fn bit(entry: Option<usize>) -> u64 {
        match entry {
            None => Holding::GATE,
            Some(i) if i < Holding::ENTRY_BITS => 1 << i,
            Some(_) => Holding::LATER,
        }
    }

    /// The holds of the entries in `short` (`None`: the gate).
    #[cfg(all(test, not(admission_loom)))]
    fn of(short: &[Option<usize>]) -> Holding {
        short.iter().fold(Holding(0), |bits, &s| bits.with(s))
    }

    /// The set with the hold of `entry` (`None`: the gate) added.
    #[inline]
    pub(crate) fn with(self, entry: Option<usize>) -> Holding {
        Holding(self.0 | Holding::bit(entry))
    }

    /// True when `entry` (`None`: the gate) has a bit of its own.
    #[inline]
    pub(crate) fn has_bit(entry: Option<usize>) -> bool {
        entry.is_none_or(|i| i < Holding::ENTRY_BITS)
    }

    /// True when the hold of `entry` (`None`: the gate), which has a bit of its own, is in the set.
    #[inline]
    pub(crate) fn contains(self, entry: Option<usize>) -> bool {
        self.0 & Holding::bit(entry) != 0
    }

    /// The entries whose bits are in the set, in increasing index.
    pub(crate) fn entries(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0 & ((1 << Holding::ENTRY_BITS) - 1);
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                i
            })
        })
    }

    /// The holds among `held` that hold now.
    pub(crate) fn now_of(held: &[Hold]) -> Holding {
        Holding(
            held.iter()
                .filter(|h| h.until().is_none())
                .fold(0, |bits, h| bits | Holding::bit(h.entry())),
        )
    }

    /// True when the set is exact (no entry past the bits).
    pub(crate) fn is_exact(self) -> bool {
        self.0 & Holding::LATER == 0
    }

    /// True when an account's hold (not the gate's) is in the set.
    pub(crate) fn has_account(self) -> bool {
        self.0 & !Holding::GATE != 0
    }

    /// True when the gate's hold is in the set.
    pub(crate) fn has_gate(self) -> bool {
        self.0 & Holding::GATE != 0
    }
}

/// One account's hold on a waiter, kept for [`Grant::wait_times`]: 24 bytes. The one hold most
/// waiters get sits in the waiter's record ([`Holds`]), so parking allocates nothing for it; a
/// grant copies it into room its pass made before taking the lock.
pub(crate) struct Hold {
    /// The held entry's index in the waiter's demand (a demand has one entry per account, so
    /// the index names the account), or [`Hold::GATE`] for the gate. Names are looked up only
    /// when a grant reports its waits, so holding costs no copy.
    entry: u32,
    /// When the account first refused the waiter.
    since: Instant,
    /// When it last stopped refusing ([`Instant::MAX`] while it still refuses).
    until: Instant,
}

impl Hold {
    /// The index under which the gate appears among a waiter's holds.
    const GATE: u32 = u32::MAX;

    /// A hold by the demand's entry `entry` (`None`: the gate) since `since`, still holding.
    /// (An index past `u32::MAX - 1`, in a demand of four billion accounts, shares the last.)
    pub(crate) fn new(entry: Option<usize>, since: Instant) -> Hold {
        Hold {
            entry: entry.map_or(Hold::GATE, |i| {
                u32::try_from(i).map_or(Hold::GATE - 1, |i| i.min(Hold::GATE - 1))
            }),
            since,
            until: Instant::MAX,
        }
    }

    /// When the account first refused the waiter.
    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    /// When the account last stopped refusing; `None` while it still refuses.
    pub(crate) fn until(&self) -> Option<Instant> {
        (self.until != Instant::MAX).then_some(self.until)
    }

    /// The account refuses again (or still): the hold is open.
    pub(crate) fn reopen(&mut self) {
        self.until = Instant::MAX;
    }

    /// The account stopped refusing at `at`, unless it had already (the first end counts).
    /// An end at [`Instant::MAX`] itself (a clock at its very end) keeps the hold open.
    pub(crate) fn end(&mut self, at: Instant) {
        if self.until == Instant::MAX {
            self.until = at;
        }
    }

    /// The held entry's index in the waiter's demand; `None` for the gate.
    pub(crate) fn entry(&self) -> Option<usize> {
        (self.entry != Hold::GATE).then_some(self.entry as usize)
    }
}

/// A waiter's holds: room for one in place (most waiters are held by one account at a time).
pub(crate) type Holds = SmallVec<[Hold; 1]>;

/// The holds a waiter collected in the line, moved into its grant unread, and the two instants
/// its wait ran between.
pub(crate) struct Waits {
    /// The record's [`Holds`], moved as they are: the one hold most waiters have stays in place,
    /// so granting a waiter allocates nothing.
    pub(crate) holds: Holds,
    /// When the job asked (parked).
    pub(crate) asked_at: Instant,
    /// The instant of the grant: where a hold still open at the end ends.
    pub(crate) granted_at: Instant,
}

impl Waits {
    /// An immediate grant's: nothing held it, and it waited for nothing.
    pub(crate) fn none() -> Waits {
        Waits {
            holds: Holds::new(),
            asked_at: Instant::ZERO,
            granted_at: Instant::ZERO,
        }
    }

    /// From asking to granted.
    pub(crate) fn wall_wait(&self) -> Duration {
        self.granted_at.saturating_duration_since(self.asked_at)
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_holding_set_is_exact_for_the_first_62_entries_and_the_gate() {
        let hold = |entry: Option<usize>, until: Option<Instant>| {
            let mut hold = Hold::new(entry, Instant::ZERO);
            if let Some(until) = until {
                hold.end(until);
            }
            hold
        };
        let short = [Some(0), None, Some(61)];
        let held = [
            hold(Some(0), None),
            hold(Some(5), Some(Instant::ZERO)),
            hold(None, None),
            hold(Some(61), None),
        ];
        assert_eq!(
            Holding::of(&short),
            Holding::now_of(&held),
            "the ended hold is out"
        );
        assert!(Holding::of(&short).is_exact());
        assert!(Holding::of(&short).has_gate() && Holding::of(&short).has_account());
        assert!(!Holding::of(&[None]).has_account());
        assert!(!Holding::of(&[Some(3)]).has_gate());
        // Entries 62 and 63 share one bit: such a set is not exact.
        assert_eq!(Holding::of(&[Some(62)]), Holding::of(&[Some(63)]));
        assert!(!Holding::of(&[Some(62)]).is_exact());
        assert!(Holding::of(&[Some(62)]).has_account());
    }

    /// Parks a waiter named `name` at the tail.
    fn park(line: &mut Line, name: &str) -> Place {
        line.push(waiter(name), Tag::ZERO)
    }

    fn waiter(name: &str) -> Waiter {
        Waiter::new(
            Demand::new(),
            JobContext::new(name),
            Instant::ZERO,
            None,
            false,
            Notify::Nobody,
        )
    }

    fn names(line: &Line) -> Vec<String> {
        line.iter()
            .map(|w| w.ctx.snapshot().name.to_string())
            .collect()
    }

    fn refused() -> Done {
        Done {
            demand: Demand::new(),
            outcome: Err(AdmitError::Shutdown),
        }
    }

    #[test]
    fn waiters_leave_from_anywhere_and_the_rest_keep_their_order() {
        let mut line = Line::default();
        let places: Vec<Place> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| park(&mut line, n))
            .collect();
        assert!(line.is_head(places[0]));
        assert_eq!(
            line.remove(places[2])
                .map(|w| w.ctx.snapshot().name.to_string()),
            Some("c".into())
        );
        assert!(line.decide(places[0], refused()).is_some());
        assert_eq!(names(&line), ["b", "d"]);
        assert!(line.is_head(places[1]));
        assert_eq!(
            line.head().map(|w| w.ctx.snapshot().name.to_string()),
            Some("b".into())
        );
        park(&mut line, "e");
        assert_eq!(names(&line), ["b", "d", "e"]);
        assert_eq!(line.len(), 3);
        assert!(line.remove(places[3]).is_some());
        assert_eq!(names(&line), ["b", "e"]);
        assert!(
            matches!(
                line.collect(places[0]),
                Some(Done {
                    outcome: Err(AdmitError::Shutdown),
                    ..
                })
            ),
            "the decision waits in its slot until collected"
        );
        assert!(line.collect(places[0]).is_none(), "collected once");
    }

    /// Each level parks in chunks of its own, and a slot freed by a level goes back to it: the
    /// levels arriving in turn still sit together, so a pass walks each level's in slab order.
    #[test]
    fn each_level_parks_in_chunks_of_its_own_and_reuses_its_own_freed_slots() {
        let mut line = Line::default();
        line.order_by_tag();
        let park_at = |line: &mut Line, name: &str, rank: u8| {
            let mut waiter = waiter(name);
            waiter.rank = rank;
            line.push(waiter, Tag::ZERO)
        };
        let places: Vec<Place> = (0..6u8)
            .map(|i| park_at(&mut line, &format!("w{i}"), i % 3))
            .collect();
        let chunk = |place: Place| place.slot as usize / CHUNK;
        assert_eq!(
            places.iter().map(|&p| chunk(p)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        assert_eq!(places[3].slot, places[0].slot + 1, "rank 0's next slot");
        assert_eq!(names(&line), ["w0", "w3", "w1", "w4", "w2", "w5"]);
        // Rank 1's freed slot is not rank 0's to take; rank 1's next waiter takes it.
        assert!(line.remove(places[1]).is_some());
        let zero = park_at(&mut line, "x0", 0);
        assert_eq!((chunk(zero), zero.slot), (0, places[3].slot + 1));
        let one = park_at(&mut line, "x1", 1);
        assert_eq!(one.slot, places[1].slot);
        assert_eq!(names(&line), ["w0", "w3", "x0", "w4", "x1", "w2", "w5"]);
    }

    #[test]
    fn a_place_whose_waiter_left_finds_nothing_even_in_a_reused_slot() {
        let mut line = Line::default();
        let first = park(&mut line, "first");
        assert!(line.remove(first).is_some());
        let second = park(&mut line, "second");
        assert_eq!(second.slot, first.slot, "the slab reuses the slot");
        assert!(line.get(first).is_none());
        assert!(!line.is_head(first));
        assert!(line.remove(first).is_none());
        assert!(line.decide(first, refused()).is_none());
        assert!(line.collect(first).is_none());
        assert_eq!(names(&line), ["second"]);
    }

    #[test]
    fn a_held_cursor_moves_on_when_its_waiter_leaves_and_picks_up_an_arrival_at_the_end() {
        let mut line = Line::default();
        let a = park(&mut line, "a");
        let b = park(&mut line, "b");
        let first = line.first().expect("a waiter");
        assert_eq!(first, a);
        let (next, _) = line.step(first);
        line.hold_cursor(next);
        assert!(line.remove(b).is_some(), "the walk's next waiter leaves");
        let c = park(&mut line, "c");
        let resumed = line.resume().expect("the arrival is visited");
        assert_eq!(resumed, c);
        line.hold_cursor(None);
        assert_eq!(line.resume(), None, "nothing arrived after the end");
        line.hold_cursor(None);
        let d = park(&mut line, "d");
        assert_eq!(line.resume(), Some(d), "an arrival at the end is visited");
    }

    #[test]
    fn the_slab_grows_by_chunks_and_reuses_the_last_freed_slot_first() {
        let mut line = Line::default();
        let _first = park(&mut line, "first");
        let places: Vec<Place> = (1..=CHUNK)
            .map(|i| park(&mut line, &format!("w{i}")))
            .collect();
        assert_eq!(line.slots.capacity(), 2 * CHUNK, "one more chunk");
        assert!(line.remove(places[10]).is_some());
        assert!(line.remove(places[20]).is_some());
        let again = park(&mut line, "again");
        assert_eq!(again.slot, places[20].slot, "the last freed slot first");
        let once_more = park(&mut line, "once more");
        assert_eq!(once_more.slot, places[10].slot);
        assert_eq!(line.len(), CHUNK + 1);
        assert_eq!(line.iter().count(), CHUNK + 1);
        assert_eq!(line.places().len(), CHUNK + 1);
    }

    #[test]
    fn an_emptied_long_line_gives_its_slab_back_once_every_decision_is_collected() {
        let mut line = Line::default();
        let places: Vec<Place> = (0..KEEP_EMPTY_SLOTS + 1)
            .map(|i| park(&mut line, &format!("w{i}")))
            .collect();
        assert!(line.slots.capacity() > KEEP_EMPTY_SLOTS);
        let (last, rest) = places.split_last().expect("waiters");
        for &place in rest {
            assert!(line.remove(place).is_some());
        }
        assert!(line.decide(*last, refused()).is_some());
        assert!(line.is_empty());
        assert!(
            line.take_emptied().is_none(),
            "a decision not collected keeps the slab"
        );
        assert!(line.collect(*last).is_some());
        assert_eq!(line.slots.capacity(), 0);
        let emptied = line
            .take_emptied()
            .expect("the long line's slab, to free later");
        assert!(emptied.0.len() * CHUNK > KEEP_EMPTY_SLOTS);
        assert!(line.take_emptied().is_none());
        let short: Vec<Place> = (0..8).map(|i| park(&mut line, &format!("v{i}"))).collect();
        let capacity = line.slots.capacity();
        for place in short {
            assert!(line.remove(place).is_some());
        }
        assert_eq!(
            line.slots.capacity(),
            capacity,
            "a short line keeps its slots"
        );
        assert!(line.take_emptied().is_none());
    }
}
