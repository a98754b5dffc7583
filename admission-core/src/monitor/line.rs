//! The line's state: everything under the monitor lock, and the waiters in it.
//!
//! Only code holding the monitor lock (`Shared::state`) reads or writes a [`State`]. The line is
//! a [`Line`]: the waiters' records in one slab the monitor reuses, linked in arrival order, so a
//! pass walks records that sit side by side, and leaving from anywhere unlinks one record.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::account::Account;
use crate::clock::Instant;
use crate::context::JobContext;
use crate::demand::Demand;
use crate::sync::thread;

use slab::Slab;

use super::cell::Cell;
use super::grant::Hold;

/// Where the monitor is in its life.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    Open,
    Stopped,
    Closed(Arc<str>),
}

/// A job parked in the line.
pub(crate) struct Waiter {
    pub(crate) demand: Demand,
    pub(crate) ctx: JobContext,
    pub(crate) asked_at: Instant,
    /// `asked_at` plus the timeout, `None` without one.
    pub(crate) deadline: Option<Instant>,
    pub(crate) cell: Arc<Cell>,
    /// The accounts (by key; [`Hold::GATE`] for the gate) this waiter has been held on. Feeds
    /// `Held` events and `Grant::wait_times`.
    pub(crate) held: Vec<Hold>,
    /// True while the gate is what holds this waiter.
    pub(crate) on_gate: bool,
}

impl Waiter {
    /// The timeout the waiter was parked with (the span from its arrival to its deadline).
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.deadline
            .map(|deadline| deadline.saturating_duration_since(self.asked_at))
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
}

/// No slot: the end of the line.
const END: u32 = u32::MAX;

/// A waiter's record in the slab, with its neighbours in arrival order.
struct Node {
    seq: u64,
    prev: u32,
    next: u32,
    waiter: Waiter,
}

/// Above this many slots an emptied line gives its slab's memory back.
const KEEP_EMPTY_SLOTS: usize = 4096;

/// The slab of a long line that emptied: to be freed once the monitor lock is let go (giving a
/// hundred megabytes back to the system takes milliseconds).
// Read only by the unit tests: otherwise held to be dropped.
#[cfg_attr(any(not(test), admission_loom), allow(dead_code))]
pub(crate) struct Emptied(Slab<Node>);

/// The line: parked waiters in arrival order.
///
/// Their records live in one slab, reused as waiters come and go (a park allocates only when
/// the line is longer than it ever was), linked first to last. Everything is O(1) but the walk:
/// parking at the tail, leaving from anywhere, finding the head. A pass that lets go of the lock
/// between batches parks a cursor here ([`Line::hold_cursor`]); a waiter leaving meanwhile moves
/// it on, and one parking at the end when it had reached the end is where it resumes.
pub(crate) struct Line {
    nodes: Slab<Node>,
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
            nodes: Slab::new(),
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
    pub(crate) fn push(&mut self, waiter: Waiter) -> Place {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = self.nodes.insert(Node {
            seq,
            prev: self.tail,
            next: END,
            waiter,
        });
        let slot = u32::try_from(slot)
            .ok()
            .filter(|&slot| slot != END)
            .expect("fewer than 2^32 - 1 waiters parked at once");
        match self.tail {
            END => self.head = slot,
            tail => self.nodes[tail as usize].next = slot,
        }
        self.tail = slot;
        if self.cursor == Some(END) {
            self.cursor = Some(slot);
        }
        Place { slot, seq }
    }

    fn node(&self, place: Place) -> Option<&Node> {
        self.nodes
            .get(place.slot as usize)
            .filter(|node| node.seq == place.seq)
    }

    /// The waiter at `place`, if it is still in the line.
    pub(crate) fn get(&self, place: Place) -> Option<&Waiter> {
        self.node(place).map(|node| &node.waiter)
    }

    /// True when the waiter at `place` is the head.
    pub(crate) fn is_head(&self, place: Place) -> bool {
        self.head == place.slot && self.node(place).is_some()
    }

    /// The head of the line.
    pub(crate) fn head(&self) -> Option<&Waiter> {
        (self.head != END).then(|| &self.nodes[self.head as usize].waiter)
    }

    /// Takes the waiter at `place` out of the line, if it is still there.
    pub(crate) fn remove(&mut self, place: Place) -> Option<Waiter> {
        self.node(place)?;
        let node = self.nodes.remove(place.slot as usize);
        match node.prev {
            END => self.head = node.next,
            prev => self.nodes[prev as usize].next = node.next,
        }
        match node.next {
            END => self.tail = node.prev,
            next => self.nodes[next as usize].prev = node.prev,
        }
        if self.cursor == Some(place.slot) {
            self.cursor = Some(node.next);
        }
        if self.nodes.is_empty() && self.nodes.capacity() > KEEP_EMPTY_SLOTS {
            self.emptied = Some(Emptied(std::mem::take(&mut self.nodes)));
        }
        Some(node.waiter)
    }

    /// The slab a long line left behind when it emptied, for the caller to drop once the monitor
    /// lock is let go.
    pub(crate) fn take_emptied(&mut self) -> Option<Emptied> {
        self.emptied.take()
    }

    /// The waiters, first to last.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Waiter> {
        let mut slot = self.head;
        std::iter::from_fn(move || {
            let node = self.nodes.get(slot as usize)?;
            slot = node.next;
            Some(&node.waiter)
        })
    }

    /// Empties the line, handing over its waiters first to last.
    pub(crate) fn take_all(&mut self) -> Vec<Waiter> {
        let mut waiters = Vec::with_capacity(self.len());
        let mut slot = self.head;
        while slot != END {
            let node = self.nodes.remove(slot as usize);
            slot = node.next;
            waiters.push(node.waiter);
        }
        self.emptied = Some(Emptied(std::mem::take(&mut self.nodes)));
        self.head = END;
        self.tail = END;
        self.cursor = None;
        waiters
    }

    /// The first slot of a walk from the head (`None` for an empty line).
    pub(crate) fn first_slot(&self) -> Option<u32> {
        (self.head != END).then_some(self.head)
    }

    /// The waiter in `slot` (a slot a walk reached: from [`Line::first_slot`],
    /// [`Line::resume`] or a previous step), its place, and the slot after it.
    pub(crate) fn step(&mut self, slot: u32) -> (Place, Option<u32>, &mut Waiter) {
        let node = &mut self.nodes[slot as usize];
        let next = (node.next != END).then_some(node.next);
        (
            Place {
                slot,
                seq: node.seq,
            },
            next,
            &mut node.waiter,
        )
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
        self.queue.iter().filter(|w| w.on_gate).count()
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

    fn waiter(name: &str) -> Waiter {
        Waiter {
            demand: Demand::new(),
            ctx: JobContext::new(name),
            asked_at: Instant::ZERO,
            deadline: None,
            cell: Arc::new(Cell::new()),
            held: Vec::new(),
            on_gate: false,
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
            .map(|n| line.push(waiter(n)))
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
        line.push(waiter("e"));
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
        let first = line.push(waiter("first"));
        assert!(line.remove(first).is_some());
        let second = line.push(waiter("second"));
        assert_eq!(second.slot, first.slot, "the slab reuses the slot");
        assert!(line.get(first).is_none());
        assert!(!line.is_head(first));
        assert!(line.remove(first).is_none());
        assert_eq!(names(&line), ["second"]);
    }

    #[test]
    fn a_held_cursor_moves_on_when_its_waiter_leaves_and_picks_up_an_arrival_at_the_end() {
        let mut line = Line::new();
        let a = line.push(waiter("a"));
        let b = line.push(waiter("b"));
        let first = line.first_slot().expect("a waiter");
        let (place, next, _) = line.step(first);
        assert_eq!(place, a);
        line.hold_cursor(next);
        assert!(line.remove(b).is_some(), "the walk's next waiter leaves");
        let c = line.push(waiter("c"));
        let resumed = line.resume().expect("the arrival is visited");
        assert_eq!(line.step(resumed).0, c);
        line.hold_cursor(None);
        assert_eq!(line.resume(), None, "nothing arrived after the end");
        line.hold_cursor(None);
        let d = line.push(waiter("d"));
        let resumed = line.resume().expect("an arrival at the end is visited");
        assert_eq!(line.step(resumed).0, d);
    }

    #[test]
    fn an_emptied_long_line_gives_its_slab_back() {
        let mut line = Line::new();
        let places: Vec<Place> = (0..KEEP_EMPTY_SLOTS + 1)
            .map(|i| line.push(waiter(&format!("w{i}"))))
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
        let short: Vec<Place> = (0..8)
            .map(|i| line.push(waiter(&format!("v{i}"))))
            .collect();
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
        assert!(line.take_all().is_empty());
    }
}
