//! The line's state: everything under the monitor lock, and the waiters in it.
//!
//! Only code holding the monitor lock (`Shared::state`) reads or writes a [`State`]. The line is
//! a map from arrival sequence number to [`Waiter`], so iteration is arrival order and leaving
//! from anywhere is a removal by key.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::account::Account;
use crate::clock::Instant;
use crate::context::JobContext;
use crate::demand::Demand;
use crate::sync::thread;

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
    pub(crate) timeout: Option<Duration>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) cell: Arc<Cell>,
    /// The accounts (by key; [`Hold::GATE`] for the gate) this waiter has been held on. Feeds
    /// `Held` events and `Grant::wait_times`.
    pub(crate) held: Vec<Hold>,
    /// True while the gate is what holds this waiter.
    pub(crate) on_gate: bool,
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
    /// The line, in arrival order (the key is the arrival sequence number).
    pub(crate) queue: BTreeMap<u64, Waiter>,
    pub(crate) next_seq: u64,
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
            queue: BTreeMap::new(),
            next_seq: 0,
            evaluator: None,
            watched: HashMap::default(),
            planned_wake: None,
            pass_running: false,
            pass_again: false,
        }
    }

    /// How many waiters the gate holds now.
    pub(crate) fn on_gate(&self) -> usize {
        self.queue.values().filter(|w| w.on_gate).count()
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
