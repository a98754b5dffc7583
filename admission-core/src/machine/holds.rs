//! What held a parked waiter, and for how long: the holds its record keeps ([`Hold`], [`Holds`]),
//! the same as bits for the pass's one comparison ([`Holding`]), and what a grant keeps of them
//! ([`Waits`]).

use std::time::Duration;

use smallvec::SmallVec;

use crate::clock::Instant;

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
}
