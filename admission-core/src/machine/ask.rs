//! The one ask-and-take: every account of a demand asked once, the whole demand taken or nothing.
//!
//! The fast path, an arrival and every pass attempt a demand through [`ask_demand`]. Accounts are
//! asked in the demand's order, each with one [`Account::ask`](crate::Account::ask): taking while
//! everything so far fit, and only looking once one account said "not now", so that the monitor
//! learns every account the job is short on (each gets its `Held` event and its wait time) without
//! taking from them, and so that one account's "never" wins over another's "not now": a demand
//! that can never fit is refused at once on every path, never parked. What was taken before a "not now" or a "never" is given back at once, with
//! the monitor's own wake-up muted on this thread (the pass that gives it back is the pass that would run).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::account::{AccountRef, Answer, Ask, account_key};
use crate::amount::Amount;
use crate::clock::{Instant, Reading};
use crate::context::JobContext;
use crate::demand::{Demand, Entry};
use crate::error::AdmitError;

use crate::mute;

use super::line::Holding;

/// What holds one job: the entries of its demand it is short on (indices into the demand), or the
/// gate (`None`). A set of bits for the gate and the first [`Holding`]'s worth of entries, so
/// that the pass, which fills one for every waiter it asks under the monitor lock, does so
/// without a heap allocation or a length check; an entry past them (a demand of more than 62
/// accounts) goes to a list as well, in the order asked.
///
/// Filled in the demand's order, so its entries iterate in increasing index; the gate is never
/// in one set with an entry (a job the gate holds is not asked anything else).
#[derive(Default, Clone)]
pub(crate) struct Short {
    bits: Holding,
    later: Vec<usize>,
    /// Whether an account answered "not now" ([`ask_demand`] sets it): the set holds more
    /// than the accounts the head claims.
    answered: bool,
}

impl Short {
    pub(crate) fn new() -> Short {
        Short::default()
    }

    /// Empties the set.
    #[inline]
    pub(crate) fn clear(&mut self) {
        self.bits = Holding::default();
        self.answered = false;
        if !self.later.is_empty() {
            self.later.clear();
        }
    }

    /// Adds the entry `short` (`None`: the gate).
    #[inline]
    pub(crate) fn push(&mut self, short: Option<usize>) {
        self.bits = self.bits.with(short);
        if let Some(i) = short.filter(|&i| !Holding::has_bit(Some(i))) {
            self.later.push(i);
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.bits == Holding::default()
    }

    /// Adds the entry `i`.
    #[inline]
    pub(crate) fn push_entry(&mut self, i: usize) {
        if Holding::has_bit(Some(i)) {
            self.bits = self.bits.with(Some(i));
        } else {
            self.push(Some(i));
        }
    }

    /// True when `short` (`None`: the gate) is in the set.
    #[inline]
    pub(crate) fn contains(&self, short: Option<usize>) -> bool {
        if Holding::has_bit(short) {
            self.bits.contains(short)
        } else {
            short.is_some_and(|i| self.later.contains(&i))
        }
    }

    /// True when an account itself answered "not now" to the ask that filled the set (not only
    /// the head's claims held it).
    #[inline]
    pub(crate) fn answered(&self) -> bool {
        self.answered
    }

    /// True when the set is the gate alone.
    #[inline]
    pub(crate) fn is_gate_only(&self) -> bool {
        self.bits == Holding::default().with(None)
    }

    /// The set as a waiter's record keeps it.
    #[inline]
    pub(crate) fn holding(&self) -> Holding {
        self.bits
    }

    /// The set's members: the entries in increasing index, then the gate.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Option<usize>> + '_ {
        let gate = self.bits.has_gate();
        self.bits
            .entries()
            .chain(self.later.iter().copied())
            .map(Some)
            .chain(gate.then_some(None))
    }
}

/// What the head of the line asks for, as the waiters behind it must respect: its demand's
/// entries, shared with its record (one reference count, not a copy of every amount), and the
/// entries it is short on.
#[derive(Default)]
pub(crate) struct Head {
    /// The head's entries (`None`: an empty demand, which is never held).
    entries: Option<Arc<Vec<Entry>>>,
    /// The first [`Head::KEYED`] entries' account keys, in order (0 past the last entry; no
    /// account has key 0): what a waiter behind looks its accounts up by, without reading the
    /// entries. Entries past them are looked up in the entries.
    keys: [usize; Head::KEYED],
    /// The entries the head is short on (never the gate): nobody behind is asked about their
    /// accounts or takes from them.
    short: Short,
    /// `Some(until)` while the gate holds the head.
    pub(crate) gate_hold: Option<Option<Instant>>,
    /// The entries the head lacks only for the reserves of waiting levels that lend them (not
    /// claimed), with those reserves: a waiter behind leaves aside the head's amount less them
    /// (a waiter of such a level leaves its own level's reserve aside for nobody, and the others
    /// leave it for that level anyway), so a level's waiters are never kept from its own
    /// reserve by a head that reserve holds back. Empty but for levels that lend.
    lent: Vec<(usize, Amount)>,
}

impl Head {
    /// The head as the waiter of `demand` makes it, short on the entries `short` names (indices
    /// into the demand; `None`, the gate, is not an account).
    pub(crate) fn of(demand: &Demand, short: &Short) -> Head {
        Head {
            entries: demand.shared_entries().cloned(),
            keys: {
                let mut keys = [0; Head::KEYED];
                for (key, entry) in keys.iter_mut().zip(demand.entries()) {
                    *key = account_key(entry.account());
                }
                keys
            },
            // The gate, when in it, is alone in it (never asked about by entry).
            short: short.clone(),
            gate_hold: None,
            lent: Vec::new(),
        }
    }

    /// The head of the line as a pass would find it now: each of its accounts looked at afresh
    /// (an account consumed outside the monitor may have drained since the last pass). `None`
    /// when it is short on nothing: a pass is due that will grant it, after which another waiter
    /// is the head, so the caller leaves the asking to that pass.
    /// `aside` is what the head leaves for other priority levels on an account.
    pub(crate) fn now_of(demand: &Demand, aside: Aside<'_>, now: &Reading<'_>) -> Option<Head> {
        let mut short = Short::new();
        for (i, entry) in demand.entries().iter().enumerate() {
            let account = entry.account();
            let ask = match aside {
                Some(aside) => Ask::HEAD.also_leaving(aside(account)),
                None => Ask::HEAD,
            };
            // A refusal or a panic is the pass's to report; here it only means "not granted".
            let answer = asked(account, entry.amount(), ask.look().with(now));
            if !matches!(answer, Ok(Answer::Taken)) {
                short.push(Some(i));
            }
        }
        (!short.is_empty()).then(|| Head::of(demand, &short))
    }

    /// Keeps among the entries the head is short on only those `claims` says it claims: the
    /// others' accounts a waiter behind may take from, leaving aside the head's amount less
    /// `lendable(i)`, the reserves of waiting levels that hold the head back there.
    pub(crate) fn claim_only(
        &mut self,
        claims: impl Fn(usize) -> bool,
        lendable: impl Fn(usize) -> Amount,
    ) {
        let mut kept = Short::new();
        for short in self.short.iter() {
            match short {
                Some(i) if !claims(i) => {
                    let lent = lendable(i);
                    if !lent.is_zero() {
                        self.lent.push((i, lent));
                    }
                }
                short => kept.push(short),
            }
        }
        self.short = kept;
    }

    /// True when the head is short on nothing but what the reserves of waiting levels that lend
    /// hold back (and the gate does not hold it): borrowing them, it would go.
    pub(crate) fn lent_only(&self) -> bool {
        self.short.is_empty() && !self.lent.is_empty() && self.gate_hold.is_none()
    }

    /// True when the head lacks the account of key `key` only for lendable reserves.
    pub(crate) fn is_lent_on(&self, key: usize) -> bool {
        self.entry_of(key)
            .is_some_and(|i| self.lent.iter().any(|&(at, _)| at == i))
    }

    /// How many entries' keys a head keeps at hand.
    const KEYED: usize = 4;

    /// The index of the head's entry on the account of key `key`.
    #[inline]
    fn entry_of(&self, key: usize) -> Option<usize> {
        if let Some(i) = self.keys.iter().position(|&k| k == key) {
            return Some(i);
        }
        let entries = self.entries.as_deref()?;
        entries
            .get(Head::KEYED..)?
            .iter()
            .position(|e| account_key(e.account()) == key)
            .map(|i| i + Head::KEYED)
    }

    /// What the head asks of the account of key `key` (nothing when it names no such account).
    fn reserved(&self, key: usize) -> Amount {
        match (self.entry_of(key), &self.entries) {
            (Some(i), Some(entries)) => {
                let amount = entries[i].amount();
                match self.lent.iter().find(|&&(at, _)| at == i) {
                    Some(&(_, lent)) => amount.saturating_sub(lent),
                    None => amount,
                }
            }
            _ => Amount::ZERO,
        }
    }

    /// True when the head is short on the account of key `key`.
    pub(crate) fn is_short_on(&self, key: usize) -> bool {
        self.entry_of(key)
            .is_some_and(|i| self.short.contains(Some(i)))
    }
}

/// What a waiter leaves aside on an account for the other priority levels' reserves (`None`: no
/// level reserves anything).
pub(crate) type Aside<'a> = Option<&'a dyn Fn(&AccountRef) -> Amount>;

/// Which of a waiter's entries (by index, below 64) on an account the head claims it may take out
/// of its own level's reserve, leaving aside only the other levels' reserves (`None`: none;
/// see [`Dips`](super::fair::Dips)).
pub(crate) type Dip<'a> = Option<&'a dyn Fn(usize) -> bool>;

/// One attempt's result.
pub(crate) enum Attempt {
    /// The whole demand was taken.
    Granted,
    /// Short on the entries left in the caller's `short` buffer (indices into the demand;
    /// `None` for the gate); nothing taken. Ask again at `wake` (`None`: only an event helps).
    Held { wake: Option<Instant> },
    /// An account can never grant the demand, or panicked; nothing taken. Boxed: a refusal is
    /// rare, and an attempt's result, moved on every ask of every pass, stays two words.
    Refused(Box<AdmitError>),
}

/// How much an attempt that is not granted should learn.
#[derive(Copy, Clone, PartialEq, Eq)]
pub(crate) enum Learn {
    /// Stop at the first account that says "not now": the fast path, whose caller either asks
    /// again at the line's tail (an admit) or looks for a "never" itself (a try).
    FirstShort,
    /// Ask every account, so that every one the job is short on is known, and a "never" from
    /// any of them wins over another's "not now".
    EveryShort,
}

/// The latest of two wake-ups, where `None` ("only an event") dominates: time alone will not
/// help while any account waits for an event.
pub(crate) fn later(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

/// The earliest of two wake-ups, where `None` means "no wake-up from this side".
pub(crate) fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Asks every account of `demand` once, behind `head` (`None`: the asker is the head, or meets
/// an empty line), and takes the whole demand if every account says so, every account asked at
/// the instant `now` (read at most once, by the first that needs it). Under the monitor lock.
///
/// `short` is cleared, then holds the entries the job is short on when it is held. With
/// [`Learn::EveryShort`], "never" wins over "not now": every account is asked even after one
/// said "not now" (the rest with a [`look`](Ask::look)), so a demand that one account can never
/// grant is refused whatever the others answer. An account the head is short on is only looked at, and whatever it answers
/// but "never" counts as short: nobody behind the head takes from it (see `pass.rs`), but for
/// the entries `dip` names, which are asked leaving the head's amount out.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "the one ask of every pass, inlined: a struct of its arguments would be built per waiter"
)]
pub(crate) fn ask_demand(
    mute: usize,
    entries: &[Entry],
    ctx: &JobContext,
    head: Option<&Head>,
    aside: Aside<'_>,
    dip: Dip<'_>,
    learn: Learn,
    now: &Reading<'_>,
    short: &mut Short,
) -> Attempt {
    short.clear();
    let claims = Claims::of(entries, head, dip);
    // The head's own deadline on an account it claims (or the event it waits for) covers this
    // waiter's wake-up.
    let mut wake = if claims.any {
        None
    } else {
        Some(Instant::ZERO)
    };
    let mut taken = 0;
    for (i, entry) in entries.iter().enumerate() {
        let account = entry.account();
        let (mut ask, claimed) = match head {
            None => (Ask::HEAD.with(now), false),
            Some(head) => {
                let key = account_key(account);
                let claimed = claims.any && claims.has(i, head, key);
                let ahead = match i < 64 && claims.dips & (1 << i) != 0 {
                    true => Amount::ZERO,
                    false => head.reserved(key),
                };
                (Ask::behind(ahead).with(now), claimed)
            }
        };
        if let Some(aside) = aside {
            ask = ask.also_leaving(aside(account));
        }
        if claims.any || !short.is_empty() {
            ask = ask.look();
        }
        let answer = match asked(account, entry.amount(), ask) {
            Ok(answer) => answer,
            Err(panic) => {
                give_back(mute, &entries[..taken]);
                return Attempt::Refused(Box::new(aborted(account, ctx, &*panic)));
            }
        };
        match answer {
            Answer::Never(refusal) => {
                give_back(mute, &entries[..taken]);
                return Attempt::Refused(Box::new(AdmitError::Refused {
                    account: account.name().to_owned(),
                    refusal,
                }));
            }
            // The head is short on it: not this waiter's to have, whatever it says now.
            _ if claimed => short.push_entry(i),
            Answer::Taken => {
                if ask.takes() {
                    taken = i + 1;
                }
            }
            Answer::NotNow(at) => {
                short.push_entry(i);
                short.answered = true;
                wake = later(wake, at);
                if learn == Learn::FirstShort {
                    break;
                }
            }
        }
    }
    if short.is_empty() {
        return Attempt::Granted;
    }
    give_back(mute, &entries[..taken]);
    Attempt::Held { wake }
}

/// What [`take_whole`] made of a demand.
pub(crate) enum Whole {
    /// Every account took its amount.
    Taken,
    /// Nothing is taken: entry `.0` said "not now" (the accounts after it were not asked).
    Short(usize),
    /// Nothing is taken: an account said "never" or panicked.
    Refused(Box<AdmitError>),
}

/// The fast path's ask, with an empty line: every account asked in order, as the head (leaving
/// aside only what `aside` says: the other priority levels' reserves kept always), taking; at
/// the first that does not take, what was taken is given back (muted). [`ask_demand`] with no
/// head and [`Learn::FirstShort`], without what only a line needs (the head's claims, the set of
/// accounts short, the earliest wake-up).
#[inline(always)]
pub(crate) fn take_whole(
    mute: usize,
    entries: &[Entry],
    ctx: &JobContext,
    aside: Aside<'_>,
    now: &Reading<'_>,
) -> Whole {
    for (i, entry) in entries.iter().enumerate() {
        let account = entry.account();
        let ask = match aside {
            Some(aside) => Ask::HEAD.also_leaving(aside(account)),
            None => Ask::HEAD,
        };
        let refused = match asked(account, entry.amount(), ask.with(now)) {
            Ok(Answer::Taken) => continue,
            Ok(Answer::NotNow(_)) => None,
            Ok(Answer::Never(refusal)) => Some(AdmitError::Refused {
                account: account.name().to_owned(),
                refusal,
            }),
            Err(panic) => Some(aborted(account, ctx, &*panic)),
        };
        give_back(mute, &entries[..i]);
        return match refused {
            None => Whole::Short(i),
            Some(error) => Whole::Refused(Box::new(error)),
        };
    }
    Whole::Taken
}

/// Looks at every account of `demand` for a "never", taking nothing: the refusal of a demand
/// that can never fit (or of an account that panicked), for a path that does not ask the
/// accounts otherwise (a line whose head is about to go, a gate that holds the line, a try
/// behind a line). Under the monitor lock, or on the unlocked path.
pub(crate) fn refusal_of(
    entries: &[Entry],
    ctx: &JobContext,
    now: &Reading<'_>,
) -> Option<AdmitError> {
    entries.iter().find_map(|entry| {
        let account = entry.account();
        match asked(
            account,
            entry.amount(),
            Ask::behind(Amount::ZERO).look().with(now),
        ) {
            Ok(Answer::Never(refusal)) => Some(AdmitError::Refused {
                account: account.name().to_owned(),
                refusal,
            }),
            Ok(_) => None,
            Err(panic) => Some(aborted(account, ctx, &*panic)),
        }
    })
}

/// The entries of a demand on accounts the head of the line is short on: those are not asked at
/// all, and with one of them in the demand nothing will be taken, so every other account is only
/// looked at. The first 64 entries are a bit mask; any further ones are looked up as asked.
pub(crate) struct Claims {
    any: bool,
    mask: u64,
    /// The entries on accounts the head is short on that the waiter may take out of its own
    /// level's reserve ([`Dip`]): not claimed, and asked without the head's amount.
    dips: u64,
}

impl Claims {
    #[inline]
    fn of(entries: &[Entry], head: Option<&Head>, dip: Dip<'_>) -> Claims {
        let mut claims = Claims {
            any: false,
            mask: 0,
            dips: 0,
        };
        let Some(head) = head.filter(|h| !h.short.is_empty()) else {
            return claims;
        };
        for (i, entry) in entries.iter().enumerate() {
            if head.is_short_on(account_key(entry.account())) {
                if i < 64 && dip.is_some_and(|dip| dip(i)) {
                    claims.dips |= 1 << i;
                    continue;
                }
                claims.any = true;
                if i < 64 {
                    claims.mask |= 1 << i;
                }
            }
        }
        claims
    }

    #[inline]
    fn has(&self, i: usize, head: &Head, key: usize) -> bool {
        if i < 64 {
            self.mask & (1 << i) != 0
        } else {
            head.is_short_on(key)
        }
    }

    /// The entries of `entries` (below 64) that `dip` lets take out of their level's reserve
    /// behind `head`, as a mask: what [`ask_demand`] asked that way.
    pub(crate) fn dipped(entries: &[Entry], head: Option<&Head>, dip: Dip<'_>) -> u64 {
        Claims::of(entries, head, dip).dips
    }
}

/// Gives back what an attempt took before it was held or refused. The accounts' wake-ups to this
/// monitor stay quiet: the give restores what the attempt found, which is no news to it.
pub(crate) fn give_back(mute: usize, taken: &[Entry]) {
    if taken.is_empty() {
        return;
    }
    let _muted = mute::Muted::on(mute);
    for entry in taken {
        entry.account().give(entry.amount());
    }
}

/// Asks `account`, catching a panic: the account is at fault, not the job, and the monitor goes
/// on.
#[inline(always)]
pub(crate) fn asked(
    account: &AccountRef,
    mine: Amount,
    ask: Ask<'_>,
) -> Result<Answer, Box<dyn std::any::Any + Send>> {
    catch_unwind(AssertUnwindSafe(|| account.ask(mine, ask)))
}

/// The error for an account that panicked while asked about job `ctx`.
#[cold]
#[inline(never)]
pub(crate) fn aborted(
    account: &AccountRef,
    ctx: &JobContext,
    panic: &(dyn std::any::Any + Send),
) -> AdmitError {
    AdmitError::Aborted {
        account: account.name().to_owned(),
        job: ctx.id(),
        panic: panic_message(panic),
    }
}

/// A panic's message, when it has one.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::Short;

    #[test]
    fn a_short_set_keeps_every_entry_in_the_order_asked_past_its_bits() {
        let mut short = Short::new();
        assert!(short.is_empty());
        for i in [0, 5, 61, 62, 70] {
            short.push(Some(i));
        }
        assert!(!short.is_empty());
        assert_eq!(
            short.iter().collect::<Vec<_>>(),
            [Some(0), Some(5), Some(61), Some(62), Some(70)]
        );
        assert_eq!(short.iter().next(), Some(Some(0)));
        // 62 and 63 share the bit for later entries; the list tells them apart.
        assert!(short.contains(Some(62)) && short.contains(Some(70)));
        assert!(!short.contains(Some(63)) && !short.contains(Some(1)) && !short.contains(None));
        assert!(
            !short.holding().is_exact(),
            "a set past the bits is not exact"
        );
        assert!(!short.is_gate_only());

        short.clear();
        assert!(short.is_empty() && !short.contains(Some(70)));
        assert_eq!(short.iter().next(), None);
        short.push(None);
        assert!(short.is_gate_only() && short.contains(None));
        assert_eq!(short.iter().collect::<Vec<_>>(), [None]);
        assert!(short.holding().has_gate() && !short.holding().has_account());
    }
}
