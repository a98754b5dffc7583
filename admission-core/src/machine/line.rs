//! The line's state: everything under the monitor lock, and the waiters in it.
//!
//! Only code holding the monitor lock (`Shared::state`) reads or writes a [`State`]. The line is
//! a [`Line`]: one slot per waiter in a slab the monitor reuses, linked in arrival order, so a
//! pass walks slots that sit side by side, and leaving from anywhere unlinks one slot.
//!
//! A waiter's [`Record`] (its demand, job, timeout and holds) is not in the slot: it lives where
//! the waiter waits, beside its outcome cell (inside the pinned `Admit`, on the blocking call's
//! frame), and the slot points at it. The rule is the cell's (`cell.rs`): the monitor reads or
//! writes a record only under the monitor lock while its slot is in the line, and the owner
//! frees it only once it has seen the slot leave. So a parked waiter's only memory of the
//! monitor's is its slot: [`Slot`]'s size, 56 bytes.
//!
//! The slot keeps a copy of what a pass reads of every waiter ([`Hot`]: deadline, holding bits,
//! gate flag, the address of the demand's entries), so a pass that finds nothing new for a
//! waiter reads its slot and its entries and never its record: one cache line per waiter
//! fewer, in memory scattered over the waiters' futures.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::account::Account;
use crate::clock::Instant;
use crate::context::{JobContext, WaiterKey};
use crate::demand::{Demand, Entry};
use crate::sync::thread;

use super::cell::CellRef;
use super::grant::{Hold, Holds};

/// Where the monitor is in its life.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    Open,
    Stopped,
    Closed(Arc<str>),
}

/// A job parked in the line: what its record keeps (the pass reads it only when something
/// changes for the waiter; what it reads of every waiter is the slot's [`Hot`]).
pub(crate) struct Waiter {
    pub(crate) demand: Demand,
    pub(crate) ctx: JobContext,
    pub(crate) asked_at: Instant,
    /// The timeout the waiter was parked with (its deadline, `asked_at` plus this, is in its
    /// slot: [`Hot`]).
    pub(crate) timeout: Option<Duration>,
    /// Where the outcome goes: a cell that lives with the waiter (`cell.rs` says when it may be
    /// touched).
    pub(crate) cell: CellRef,
    /// The accounts (by key; [`Hold::GATE`] for the gate) this waiter has been held on. Feeds
    /// `Held` events and `Grant::wait_times`.
    pub(crate) held: Holds,
}

/// What a pass reads of every waiter it asks, kept in the waiter's slot in the line: a pass over
/// waiters that stay where they are reads their slots, side by side in the slab, and their
/// demands' entries, and nothing of their records.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hot {
    /// The waiter's deadline ([`Instant::MAX`]: none).
    deadline: Instant,
    /// Which of the record's holds hold the waiter now, so that a pass finding the same
    /// accounts short as last time reads nothing more (see [`Holding`]).
    pub(crate) holding: Holding,
    /// The entries of the demand in the waiter's record (set when it parks: see
    /// [`Hot::entries`]).
    entries: NonNull<Entry>,
    len: u32,
    /// True while the gate is what holds this waiter.
    pub(crate) on_gate: bool,
}

// SAFETY: `entries` points at the entries of a demand in the record of the waiter whose slot
// holds this, and is read only under the monitor lock while that slot is in the line (as the
// record is, see `RecordRef`); a `Demand` is `Send + Sync`.
unsafe impl Send for Hot {}
// SAFETY: as for `Send`.
unsafe impl Sync for Hot {}

impl Hot {
    /// A waiter about to park with `deadline`, held by the gate or not: its entries are set
    /// when it parks ([`Line::push`]).
    pub(crate) fn new(deadline: Option<Instant>, on_gate: bool) -> Hot {
        Hot {
            deadline: deadline.unwrap_or(Instant::MAX),
            holding: Holding::default(),
            entries: NonNull::dangling(),
            len: 0,
            on_gate,
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

    /// The entries of the waiter's demand (none before it parks).
    #[inline]
    pub(crate) fn entries(&self) -> &[Entry] {
        // SAFETY: `entries` and `len` were taken in `Line::push` from the demand in the waiter's
        // record, which its owner keeps in place while the slot is in the line and which the
        // monitor does not change while it is (a grant takes the demand as its slot leaves, in
        // the same critical section, and no `Hot` of a slot that left is read); before the push
        // they describe an empty slice at a dangling, aligned pointer.
        unsafe { std::slice::from_raw_parts(self.entries.as_ptr(), self.len as usize) }
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

/// Where a waiter stands in the [`Line`]: its record's slot and its arrival number. A slot is
/// reused once its waiter has left; an arrival number never is, so a stale place finds nothing.
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

/// A parked waiter's record, kept by the waiter (see the module's documentation): empty until
/// the arrival parks it, and read or written by the monitor only under the monitor lock while
/// its slot is in the line.
#[derive(Default)]
pub(crate) struct Record(UnsafeCell<Option<Waiter>>);

// SAFETY: a record is read or written only by the monitor under its lock (while the record's
// slot is in the line) or by its owner through `&mut` (before parking, after leaving): never by
// two threads at once, whoever shares a reference to the future or frame that holds it.
unsafe impl Sync for Record {}

impl Record {
    /// Drops what the record holds. Its owner calls this once it has seen the record's slot
    /// leave the line (`&mut` is then the only access there is).
    pub(crate) fn clear(&mut self) {
        *self.0.get_mut() = None;
    }
}

/// A slot's pointer to its waiter's [`Record`].
pub(crate) struct RecordRef(NonNull<Record>);

// SAFETY: the pointer is followed only under the monitor lock, by whichever thread holds it,
// while the slot is in the line; a `Waiter` is `Send`.
unsafe impl Send for RecordRef {}
// SAFETY: as for `Send`.
unsafe impl Sync for RecordRef {}

impl RecordRef {
    /// A pointer to `record` for the waiter's slot in the line.
    ///
    /// # Safety
    ///
    /// The caller owns the record, and keeps it where it is, alive and untouched, from this
    /// call until the slot made with this pointer (if any) is out of the line and the caller has
    /// seen that: it took the waiter's outcome, or its withdrawal under the monitor lock
    /// returned.
    pub(crate) unsafe fn new(record: &Record) -> RecordRef {
        RecordRef(NonNull::from(record))
    }

    /// The record's contents.
    ///
    /// # Safety
    ///
    /// The caller holds the monitor lock, and the record's slot has been in the line since the
    /// lock was taken (it may have left it in this critical section); no other reference to the
    /// record is alive while the returned one is.
    unsafe fn contents_mut<'a>(&self) -> &'a mut Option<Waiter> {
        // SAFETY: the owner keeps the record in place, alive and untouched while its slot is in
        // the line (`RecordRef::new`); the caller's lock and its promise of no other reference
        // make this one exclusive.
        unsafe { &mut *self.0.as_ref().0.get() }
    }

    /// The record's contents, to read.
    ///
    /// # Safety
    ///
    /// As for [`RecordRef::contents_mut`], except that other shared references may be alive.
    unsafe fn contents<'a>(&self) -> &'a Option<Waiter> {
        // SAFETY: as in `contents_mut`; only shared references are alive with this one.
        unsafe { &*self.0.as_ref().0.get() }
    }
}

/// A waiter's slot in the slab: what a pass reads of it, a pointer to its record, and its
/// neighbours in arrival order (56 bytes).
struct Node {
    seq: u64,
    prev: u32,
    next: u32,
    record: RecordRef,
    hot: Hot,
}

impl Node {
    /// The waiter.
    fn waiter(&self) -> &Waiter {
        // SAFETY: a node is in the slab only while its waiter is in the line, and the slab is
        // reached only under the monitor lock; a reference to the waiter lives no longer than
        // the borrow of the node, so none is alive while `waiter_mut` (which needs the node
        // borrowed mutably) hands out an exclusive one.
        unsafe { self.record.contents() }
            .as_ref()
            .unwrap_or_else(|| unreachable!("a parked record holds its waiter"))
    }

    /// The waiter, to change.
    fn waiter_mut(&mut self) -> &mut Waiter {
        // SAFETY: as in `Node::waiter`; `&mut self` makes this the only reference.
        unsafe { self.record.contents_mut() }
            .as_mut()
            .unwrap_or_else(|| unreachable!("a parked record holds its waiter"))
    }

    /// The waiter, to change, and what the pass reads of it: the record is not read here (a
    /// pass that finds nothing new for the waiter never touches it).
    #[inline]
    fn parts_mut(&mut self) -> (&mut Hot, &mut Waiter) {
        // SAFETY: as in `Node::waiter_mut`. A record is in the line only once it holds its
        // waiter (`Line::push`), and only emptied by its owner after its slot left: so the
        // option is `Some`, and not reading it keeps the record's memory untouched.
        let waiter = unsafe { self.record.contents_mut().as_mut().unwrap_unchecked() };
        (&mut self.hot, waiter)
    }
}

/// Above this many slots an emptied line gives its slab's memory back.
const KEEP_EMPTY_SLOTS: usize = 4096;

/// Slots per chunk of the slab: a chunk (14 KB) is allocated and its free list written
/// under the monitor lock, in about a microsecond.
const CHUNK: usize = 256;

/// One slot of the slab: a waiter's record, or a link in the list of free slots.
enum Slot {
    Vacant { next_free: u32 },
    Occupied(Node),
}

/// The slab of waiter records: fixed-size chunks, so a line longer than any before grows by one
/// chunk and never moves the records it has (a vector that doubles would copy them all under the
/// monitor lock: at a million waiters, a copy of over 100 MB). Free slots form a list, last
/// freed first, so a busy line keeps reusing the same warm records.
#[derive(Default)]
struct Slots {
    chunks: Vec<Box<[Slot]>>,
    /// The first free slot.
    free: Option<u32>,
    len: usize,
}

impl Slots {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many records the chunks hold room for.
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

    fn get(&self, slot: u32) -> Option<&Node> {
        match self.slot(slot)? {
            Slot::Occupied(node) => Some(node),
            Slot::Vacant { .. } => None,
        }
    }

    /// The record in `slot`, which holds one.
    fn node_mut(&mut self, slot: u32) -> &mut Node {
        match self.slot_mut(slot) {
            Some(Slot::Occupied(node)) => node,
            _ => unreachable!("slot {slot} holds a waiter"),
        }
    }

    /// The record in `slot`, which holds one.
    fn node(&self, slot: u32) -> &Node {
        self.get(slot)
            .unwrap_or_else(|| unreachable!("slot {slot} holds a waiter"))
    }

    /// Stores `node` in a free slot (a new chunk when none is free) and returns the slot.
    ///
    /// # Panics
    ///
    /// With 2^32 - 1 records stored at once (each is a job holding a thread or a future).
    fn insert(&mut self, node: Node) -> u32 {
        let slot = match self.free {
            Some(slot) => slot,
            None => self.grow(),
        };
        let entry = self.slot_mut(slot).expect("a free slot is in a chunk");
        let Slot::Vacant { next_free } = *entry else {
            unreachable!("the free list holds free slots")
        };
        *entry = Slot::Occupied(node);
        self.free = (next_free != END).then_some(next_free);
        self.len += 1;
        slot
    }

    /// Adds a chunk whose slots are all free and returns its first.
    fn grow(&mut self) -> u32 {
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
        base
    }

    /// Takes the record out of `slot`, which holds one, and frees the slot.
    fn remove(&mut self, slot: u32) -> Node {
        let next_free = self.free.unwrap_or(END);
        let entry = self.slot_mut(slot).expect("a slot of a chunk");
        let Slot::Occupied(node) = std::mem::replace(entry, Slot::Vacant { next_free }) else {
            unreachable!("slot {slot} holds a waiter")
        };
        self.free = Some(slot);
        self.len -= 1;
        node
    }
}

/// The slab of a long line that emptied: to be freed once the monitor lock is let go (giving a
/// hundred megabytes back to the system takes milliseconds).
// Read only by the unit tests: otherwise held to be dropped.
#[cfg_attr(any(not(test), admission_loom), allow(dead_code))]
pub(crate) struct Emptied(Slots);

/// The line: parked waiters in arrival order.
///
/// Their records live in one slab, reused as waiters come and go (a park allocates only when
/// the line is longer than it ever was), linked first to last. Everything is O(1) but the walk:
/// parking at the tail, leaving from anywhere, finding the head. A pass that lets go of the lock
/// between batches parks a cursor here ([`Line::hold_cursor`]); a waiter leaving meanwhile moves
/// it on, and one parking at the end when it had reached the end is where it resumes.
pub(crate) struct Line {
    nodes: Slots,
    head: u32,
    tail: u32,
    next_seq: u64,
    /// The next slot a resuming pass visits (`Some(END)`: the end), while one is between batches.
    cursor: Option<u32>,
    /// The slab of a long line that emptied, until [`Line::take_emptied`].
    emptied: Option<Emptied>,
}

impl Line {
    pub(crate) fn new() -> Line {
        Line {
            nodes: Slots::default(),
            head: END,
            tail: END,
            next_seq: 0,
            cursor: None,
            emptied: None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Parks `waiter` at the tail.
    ///
    /// # Panics
    ///
    /// With 2^32 - 1 waiters parked at once (each is a job holding a thread or a future).
    pub(crate) fn push(&mut self, record: RecordRef, waiter: Waiter, mut hot: Hot) -> Place {
        // SAFETY: `&mut self` is the monitor lock held; the record is not in the line yet, and
        // its owner (the caller of the arrival, on this thread) leaves it alone from
        // `RecordRef::new` on.
        let parked = unsafe { record.contents_mut() }.insert(waiter);
        let entries = parked.demand.entries();
        hot.entries = NonNull::from(entries).cast();
        hot.len = u32::try_from(entries.len()).expect("fewer than 2^32 entries in a demand");
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = self.nodes.insert(Node {
            seq,
            prev: self.tail,
            next: END,
            record,
            hot,
        });
        match self.tail {
            END => self.head = slot,
            tail => self.nodes.node_mut(tail).next = slot,
        }
        self.tail = slot;
        if self.cursor == Some(END) {
            self.cursor = Some(slot);
        }
        Place { slot, seq }
    }

    fn node(&self, place: Place) -> Option<&Node> {
        self.nodes
            .get(place.slot)
            .filter(|node| node.seq == place.seq)
    }

    /// The waiter at `place`, if it is still in the line.
    pub(crate) fn get(&self, place: Place) -> Option<&Waiter> {
        self.node(place).map(Node::waiter)
    }

    /// True when the waiter at `place` is in the line and its deadline is at or before `now`.
    pub(crate) fn is_due(&self, place: Place, now: Instant) -> bool {
        self.node(place).is_some_and(|node| node.hot.is_due(now))
    }

    /// True when the gate holds the waiter at `place`, which is in the line.
    pub(crate) fn is_on_gate(&self, place: Place) -> bool {
        self.node(place).is_some_and(|node| node.hot.on_gate)
    }

    /// True when the waiter at `place` is the head.
    pub(crate) fn is_head(&self, place: Place) -> bool {
        self.head == place.slot && self.node(place).is_some()
    }

    /// The head of the line.
    pub(crate) fn head(&self) -> Option<&Waiter> {
        (self.head != END).then(|| self.nodes.node(self.head).waiter())
    }

    /// True when the gate holds the head of the line.
    pub(crate) fn head_on_gate(&self) -> bool {
        self.head != END && self.nodes.node(self.head).hot.on_gate
    }

    /// How many waiters the gate holds.
    pub(crate) fn on_gate(&self) -> usize {
        let mut slot = self.head;
        let mut count = 0;
        while let Some(node) = self.nodes.get(slot) {
            count += usize::from(node.hot.on_gate);
            slot = node.next;
        }
        count
    }

    /// Takes the waiter at `place` out of the line, if it is still there. The waiter stays in its
    /// record, the owner's; the reference lets the caller tell it how it left before the
    /// monitor lock is released.
    pub(crate) fn remove(&mut self, place: Place) -> Option<&mut Waiter> {
        self.node(place)?;
        let node = self.nodes.remove(place.slot);
        match node.prev {
            END => self.head = node.next,
            prev => self.nodes.node_mut(prev).next = node.next,
        }
        match node.next {
            END => self.tail = node.prev,
            next => self.nodes.node_mut(next).prev = node.prev,
        }
        if self.cursor == Some(place.slot) {
            self.cursor = Some(node.next);
        }
        if self.nodes.is_empty() && self.nodes.capacity() > KEEP_EMPTY_SLOTS {
            self.emptied = Some(Emptied(std::mem::take(&mut self.nodes)));
        }
        // SAFETY: the slot was in the line when the caller took the lock, which it holds for as
        // long as it borrows the line; the returned reference is the only one.
        unsafe { node.record.contents_mut() }.as_mut()
    }

    /// The slab a long line left behind when it emptied, for the caller to drop once the monitor
    /// lock is let go.
    pub(crate) fn take_emptied(&mut self) -> Option<Emptied> {
        self.emptied.take()
    }

    /// The waiters, first to last.
    #[cfg(all(test, not(admission_loom)))]
    fn iter(&self) -> impl Iterator<Item = &Waiter> {
        let mut slot = self.head;
        std::iter::from_fn(move || {
            let node = self.nodes.get(slot)?;
            slot = node.next;
            Some(node.waiter())
        })
    }

    /// Empties the line, handing `each` its waiters first to last (still under the lock, as
    /// they leave).
    pub(crate) fn take_all(&mut self, mut each: impl FnMut(&mut Waiter)) {
        let mut slot = self.head;
        while slot != END {
            let mut node = self.nodes.remove(slot);
            slot = node.next;
            each(node.waiter_mut());
        }
        self.emptied = Some(Emptied(std::mem::take(&mut self.nodes)));
        self.head = END;
        self.tail = END;
        self.cursor = None;
    }

    /// The first slot of a walk from the head (`None` for an empty line).
    pub(crate) fn first_slot(&self) -> Option<u32> {
        (self.head != END).then_some(self.head)
    }

    /// The waiter in `slot` (a slot a walk reached: from [`Line::first_slot`],
    /// [`Line::resume`] or a previous step) with what a pass reads of it, its place, and the
    /// slot after it.
    #[inline]
    pub(crate) fn step(&mut self, slot: u32) -> (Place, Option<u32>, &mut Hot, &mut Waiter) {
        let node = self.nodes.node_mut(slot);
        let next = (node.next != END).then_some(node.next);
        let place = Place {
            slot,
            seq: node.seq,
        };
        let (hot, waiter) = node.parts_mut();
        (place, next, hot, waiter)
    }

    /// Parks a walk's cursor at `next` (the slot it visits next, `None`: the end) while it
    /// lets go of the lock.
    pub(crate) fn hold_cursor(&mut self, next: Option<u32>) {
        self.cursor = Some(next.unwrap_or(END));
    }

    /// Where a walk whose cursor was parked resumes (`None`: nothing left to visit).
    pub(crate) fn resume(&mut self) -> Option<u32> {
        self.cursor.take().filter(|&slot| slot != END)
    }
}

/// A value on cache lines of its own. The monitor lock is taken by every thread that admits or
/// releases; next to the `Arc`'s reference counts (which every `Admit` and `Grant` moves) the two
/// would bounce one line between cores twice as often.
#[repr(align(128))]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// The hasher of the `watched` map, whose keys are account addresses: one multiply (Fibonacci
/// hashing, high bits first) is hash enough, and the lookup runs on every admit that parks.
#[derive(Default, Clone, Copy)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*byte)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64).wrapping_mul(FIBONACCI);
    }
}

/// 2^64 divided by the golden ratio.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// Everything under the monitor lock.
pub(crate) struct State {
    pub(crate) phase: Phase,
    /// The line, in arrival order.
    pub(crate) queue: Line,
    pub(crate) evaluator: Option<(thread::JoinHandle<()>, thread::ThreadId)>,
    /// Accounts whose wake slot holds our doorbell, so `stop` can clear them.
    pub(crate) watched: HashMap<usize, Weak<dyn Account>, BuildHasherDefault<AddressHasher>>,
    /// The wake-up the latest pass computed (`None`: only an event helps). Some pass runs by
    /// then: the evaluator sleeps until it, or was rung to adopt it. An arrival whose own
    /// deadline is no earlier need not ring.
    pub(crate) planned_wake: Option<Instant>,
    /// True while a pass that let go of the lock between two batches has more of the line to
    /// walk: another pass waits for it instead of interleaving with it.
    pub(crate) pass_running: bool,
    /// Set by a pass that found another running: the running one walks the line again.
    pub(crate) pass_again: bool,
}

impl State {
    /// An open monitor's empty line.
    pub(crate) fn new() -> State {
        State {
            phase: Phase::Open,
            queue: Line::new(),
            evaluator: None,
            watched: HashMap::default(),
            planned_wake: None,
            pass_running: false,
            pass_again: false,
        }
    }

    /// How many waiters the gate holds now.
    pub(crate) fn on_gate(&self) -> usize {
        self.queue.on_gate()
    }
}

/// True when `at` is an instant that comes before the wake-up `planned` by the last pass
/// (`None` planned: only an event would wake the evaluator, so any instant comes first).
pub(crate) fn before_planned(at: Option<Instant>, planned: Option<Instant>) -> bool {
    match (at, planned) {
        (None, _) => false,
        (Some(at), Some(planned)) => at < planned,
        (Some(_), None) => true,
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;
    use crate::monitor::grant::Hold;

    /// Parks a waiter named `name` at the tail, its record leaked (it outlives the line).
    fn park(line: &mut Line, name: &str) -> Place {
        let record: &'static Record = Box::leak(Box::default());
        // SAFETY: a leaked record stays in place forever, and nothing else touches it.
        line.push(
            unsafe { RecordRef::new(record) },
            waiter(name),
            Hot::new(None, false),
        )
    }

    fn waiter(name: &str) -> Waiter {
        Waiter {
            demand: Demand::new(),
            ctx: JobContext::new(name),
            asked_at: Instant::ZERO,
            timeout: None,
            cell: CellRef::dangling(),
            held: Holds::new(),
        }
    }

    fn names(line: &Line) -> Vec<String> {
        line.iter()
            .map(|w| w.ctx.snapshot().name.to_string())
            .collect()
    }

    #[test]
    fn waiters_leave_from_anywhere_and_the_rest_keep_their_order() {
        let mut line = Line::new();
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
        assert_eq!(
            line.remove(places[0])
                .map(|w| w.ctx.snapshot().name.to_string()),
            Some("a".into())
        );
        assert_eq!(names(&line), ["b", "d"]);
        assert!(line.is_head(places[1]));
        assert_eq!(
            line.head().map(|w| w.ctx.snapshot().name.to_string()),
            Some("b".into())
        );
        park(&mut line, "e");
        assert_eq!(names(&line), ["b", "d", "e"]);
        assert_eq!(line.len(), 3);
        assert_eq!(
            line.remove(places[3])
                .map(|w| w.ctx.snapshot().name.to_string()),
            Some("d".into())
        );
        assert_eq!(names(&line), ["b", "e"]);
    }

    #[test]
    fn a_place_whose_waiter_left_finds_nothing_even_in_a_reused_slot() {
        let mut line = Line::new();
        let first = park(&mut line, "first");
        assert!(line.remove(first).is_some());
        let second = park(&mut line, "second");
        assert_eq!(second.slot, first.slot, "the slab reuses the slot");
        assert!(line.get(first).is_none());
        assert!(!line.is_head(first));
        assert!(line.remove(first).is_none());
        assert_eq!(names(&line), ["second"]);
    }

    #[test]
    fn a_held_cursor_moves_on_when_its_waiter_leaves_and_picks_up_an_arrival_at_the_end() {
        let mut line = Line::new();
        let a = park(&mut line, "a");
        let b = park(&mut line, "b");
        let first = line.first_slot().expect("a waiter");
        let (place, next, _, _) = line.step(first);
        assert_eq!(place, a);
        line.hold_cursor(next);
        assert!(line.remove(b).is_some(), "the walk's next waiter leaves");
        let c = park(&mut line, "c");
        let resumed = line.resume().expect("the arrival is visited");
        assert_eq!(line.step(resumed).0, c);
        line.hold_cursor(None);
        assert_eq!(line.resume(), None, "nothing arrived after the end");
        line.hold_cursor(None);
        let d = park(&mut line, "d");
        let resumed = line.resume().expect("an arrival at the end is visited");
        assert_eq!(line.step(resumed).0, d);
    }

    #[test]
    fn the_slab_grows_by_chunks_without_moving_a_record_and_reuses_the_last_freed_slot_first() {
        let mut line = Line::new();
        let first = park(&mut line, "first");
        let address =
            |line: &Line, place: Place| std::ptr::from_ref(line.node(place).expect("in the line"));
        let before = address(&line, first);
        let places: Vec<Place> = (1..=CHUNK)
            .map(|i| park(&mut line, &format!("w{i}")))
            .collect();
        assert_eq!(line.nodes.capacity(), 2 * CHUNK, "one more chunk");
        assert_eq!(
            address(&line, first),
            before,
            "the first record did not move"
        );
        assert!(line.remove(places[10]).is_some());
        assert!(line.remove(places[20]).is_some());
        let again = park(&mut line, "again");
        assert_eq!(again.slot, places[20].slot, "the last freed slot first");
        let once_more = park(&mut line, "once more");
        assert_eq!(once_more.slot, places[10].slot);
        assert_eq!(line.len(), CHUNK + 1);
        assert_eq!(line.iter().count(), CHUNK + 1);
    }

    #[test]
    fn a_slot_keeps_what_a_pass_reads_within_one_cache_line() {
        // Deadline, holding bits, gate flag and the entries' address beside the links and the
        // record's pointer: a pass over waiters that stay reads 56 bytes of each slot.
        assert_eq!(std::mem::size_of::<Slot>(), 56);
        assert_eq!(std::mem::size_of::<Hot>(), 32);
    }

    #[test]
    fn a_hot_part_tells_its_deadline_and_an_empty_demand_before_parking() {
        let at = Instant::ZERO.saturating_add(Duration::from_millis(5));
        let hot = Hot::new(Some(at), true);
        assert_eq!(hot.deadline_or_max(), at);
        assert!(!hot.is_due(Instant::ZERO.saturating_add(Duration::from_millis(4))));
        assert!(hot.is_due(at));
        assert!(hot.on_gate && hot.entries().is_empty());
        let never = Hot::new(None, false);
        assert_eq!(never.deadline_or_max(), Instant::MAX);
        assert!(!never.is_due(Instant::MAX), "no deadline is ever due");
    }

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

    #[test]
    fn an_emptied_long_line_gives_its_slab_back() {
        let mut line = Line::new();
        let places: Vec<Place> = (0..KEEP_EMPTY_SLOTS + 1)
            .map(|i| park(&mut line, &format!("w{i}")))
            .collect();
        assert!(line.nodes.capacity() > KEEP_EMPTY_SLOTS);
        for place in places {
            assert!(line.remove(place).is_some());
        }
        assert_eq!(line.nodes.capacity(), 0);
        let emptied = line
            .take_emptied()
            .expect("the long line's slab, to free later");
        assert!(emptied.0.capacity() > KEEP_EMPTY_SLOTS);
        assert!(line.take_emptied().is_none());
        let short: Vec<Place> = (0..8).map(|i| park(&mut line, &format!("v{i}"))).collect();
        let capacity = line.nodes.capacity();
        for place in short {
            assert!(line.remove(place).is_some());
        }
        assert_eq!(
            line.nodes.capacity(),
            capacity,
            "a short line keeps its slots"
        );
        assert!(line.take_emptied().is_none());
        let mut taken = 0;
        line.take_all(|_| taken += 1);
        assert_eq!(taken, 0);
    }
}
