//! The line's state machine: every decision the monitor makes, and nothing else.
//!
//! [`Machine`] owns the line (the parked waiters, in arrival order) and decides what becomes of
//! each job: an arrival taken, refused or parked; a pass down the line with the head's
//! reservation and backfill; a waiter leaving by cancellation, timeout or stop; what an account's
//! change makes possible. It is given the instant (a [`Reading`] the caller made), asks the
//! accounts and the gate, and hands back what must happen as values: decisions kept in the
//! waiters' slots for their owners to collect, whom to wake ([`Effects::wake`]), the events to
//! emit, accounts it no longer watches and memory to free, whether a pass is due.
//!
//! It takes no lock, reads no clock of its own, spawns nothing and wakes nothing: the shell
//! (`monitor/shell.rs`) holds it under the monitor lock, reads the clock once per operation,
//! and carries out the effects once the lock is released. The one thing it writes that other
//! threads read is the published count of parked waiters ([`Published`]), at the exact points the
//! wake-up argument needs (see `sync.rs`). This is the sans-IO split of quinn-proto and rustls.
//!
//! # The rules
//!
//! One FIFO line with the head's reservation (EASY backfilling, Lifka 1995): a pass asks every
//! waiter in arrival order; the first not granted is the head, and every waiter behind it is
//! asked with the head's amounts set aside on each account they share, so the head is never
//! overtaken while disjoint demands flow past it. Two sharper rules follow from what a head waits
//! for:
//! - while the head is short on an account, nobody behind it takes from that account: it is only
//!   looked at, for a "never" (a demand it can never grant is refused, not left behind the head
//!   until the head is served), and any other answer counts as short. On a
//!   [`Time`](crate::Replenishment::Time) account every unit taken would postpone the head's
//!   grant by as much, so even an account that ignores reservations must not be drawn from, and
//!   the head's own deadline covers every follower's wake-up;
//! - while the gate holds the head, every waiter with entries is held by the gate too, with the
//!   head's deadline, so the next wake-up starts again from the head.
//!
//! A pass ends with the earliest instant at which time alone could change an answer (an
//! account's "not now" instant, the gate's hold, a waiter's deadline); there is no periodic
//! timer. A newcomer to a line is asked once at the line's tail, behind the head's reservation,
//! rather than with a pass over everyone: since the last pass, every change that could grant an
//! earlier waiter (a give, a relaxed limit) runs or rings for a pass of its own.

mod ask;
mod fair;
mod line;
#[cfg(test)]
mod model;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use crate::account::{Account, AccountRef, Answer, Ask, Category, account_key};
use crate::amount::Amount;
use crate::clock::{Instant, Reading, WakeFn};
use crate::context::JobContext;
use crate::demand::{Demand, Entry};
use crate::error::{AdmitError, TryAdmitError};
use crate::event::{Event, EventEntry, EventKind};
use crate::fair::{FairShares, Levels};
use crate::gate::{Gate, GateAnswer, GateView};
use crate::sync::Published;

pub(crate) use ask::{Whole, give_back, panic_message, refusal_of, take_whole};
pub(crate) use fair::Ranks;
pub(crate) use line::{Done, Emptied, MAX_RANKS, Notify, Place, Waits};

use ask::{Aside, Attempt, Claims, Dip, Head, Learn, Short, ask_demand, asked, earlier};
use fair::{Dips, Tags};
use line::{Hold, Holding, Line, Tag, Waiter};

/// The shortest sleep after a pass whose computed wake-up was already due.
const MIN_RECHECK: Duration = Duration::from_millis(1);

/// Waiters a pass visits before it may pause to let others in (a monitor without a gate): a
/// release that grants a million waiters stalls an admit for one batch, not for the whole walk
/// (a batch of grants holds the lock for about 30-60 us on this project's 2-core machine; `cargo
/// bench --bench long_line` measures it).
pub(crate) const PASS_BATCH: usize = 64;

/// Past a full batch, how many waiters a walk visits between two looks for someone to let in.
const RECHECK_EVERY: usize = 8;

/// Where the monitor is in its life.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    Open,
    Stopped,
    Closed(Arc<str>),
}

/// The events an operation built, in order: `None` when no sink was installed as it began, and
/// then no event is ever built. The whole of what the lock-free paths leave behind.
#[derive(Default)]
pub(crate) struct Events(pub(crate) Option<Vec<Event>>);

impl Events {
    /// No events yet; built from now on only if `build` (a sink is installed).
    #[inline]
    pub(crate) fn new(build: bool) -> Events {
        Events(build.then(Vec::new))
    }

    /// True when events are being built.
    #[inline]
    pub(crate) fn wanted(&self) -> bool {
        self.0.is_some()
    }

    /// Records an event of `kind` for job `ctx` on `entries`, at the operation's instant; built
    /// only when a sink is installed.
    #[inline]
    pub(crate) fn event(
        &mut self,
        kind: EventKind,
        ctx: &JobContext,
        at: &Reading<'_>,
        entries: impl FnOnce() -> Vec<EventEntry>,
    ) {
        if let Some(list) = &mut self.0 {
            push_event(list, kind, ctx, at, entries);
        }
    }

    /// Records the refusal of `demand` for job `ctx` with `error`.
    pub(crate) fn rejected(
        &mut self,
        ctx: &JobContext,
        demand: &Demand,
        error: &AdmitError,
        at: &Reading<'_>,
    ) {
        if self.wanted() {
            let kind = EventKind::Rejected {
                reason: error.reason(),
                message: error.to_string(),
            };
            self.event(kind, ctx, at, || entry_events(demand.entries()));
        }
    }
}

/// What an operation under the lock leaves for the shell to do once the lock is released.
#[derive(Default)]
pub(crate) struct Effects {
    /// The events built, in order.
    pub(crate) events: Events,
    /// Whom to wake: waiters whose decision landed. In place for the one or two a hand-off most
    /// often decides: no allocation.
    pub(crate) wake: SmallVec<[Notify; 2]>,
    /// Accounts no longer watched: dropped once the lock is released (dropping the last handle
    /// to one runs code that is not ours).
    pub(crate) unwatched: Vec<AccountRef>,
    /// A long line's slab, freed once the lock is released.
    pub(crate) emptied: Option<Emptied>,
    /// Set when this operation closed admission, with the cause (the shell reports it).
    pub(crate) closed: Option<Arc<str>>,
}

impl Effects {
    /// No effects yet; events are built when `events` says a sink is installed.
    pub(crate) fn new(events: bool) -> Effects {
        Effects {
            events: Events::new(events),
            ..Effects::default()
        }
    }

    /// True when events are being built.
    #[inline]
    pub(crate) fn wants_events(&self) -> bool {
        self.events.wanted()
    }

    /// [`Events::event`].
    #[inline]
    pub(crate) fn event(
        &mut self,
        kind: EventKind,
        ctx: &JobContext,
        at: &Reading<'_>,
        entries: impl FnOnce() -> Vec<EventEntry>,
    ) {
        self.events.event(kind, ctx, at, entries);
    }

    /// [`Events::rejected`].
    pub(crate) fn rejected(
        &mut self,
        ctx: &JobContext,
        demand: &Demand,
        error: &AdmitError,
        at: &Reading<'_>,
    ) {
        self.events.rejected(ctx, demand, error, at);
    }

    /// True when carrying the effects out would wake someone (events alone do not count).
    pub(crate) fn has_wakes(&self) -> bool {
        !self.wake.is_empty()
    }
}

/// [`Effects::event`] once a sink is installed.
#[inline(never)]
fn push_event(
    list: &mut Vec<Event>,
    kind: EventKind,
    ctx: &JobContext,
    at: &Reading<'_>,
    entries: impl FnOnce() -> Vec<EventEntry>,
) {
    list.push(Event {
        kind,
        at: at.get(),
        job: ctx.snapshot().clone(),
        entries: entries(),
    });
}

/// The event entries of a demand's entries.
pub(crate) fn entry_events(entries: &[Entry]) -> Vec<EventEntry> {
    entries
        .iter()
        .map(|e| EventEntry {
            account: e.account().name().to_owned(),
            category: e.account().category(),
            amount: e.amount(),
        })
        .collect()
}

/// A job arriving under the lock (the unlocked fast path, if it ran, did not settle it).
pub(crate) struct Arrival<'a> {
    pub(crate) demand: Demand,
    pub(crate) ctx: &'a JobContext,
    pub(crate) timeout: Option<Duration>,
    /// An account already said "not now" on the unlocked fast path: the arrival parks without
    /// a second fast path (its ask at the line's tail follows).
    pub(crate) asked: bool,
    /// Whom to wake once it is decided, if it parks.
    pub(crate) notify: Notify,
}

/// What an arrival under the lock made of a job.
pub(crate) enum Arrived {
    /// Granted whole, here: the demand is the grant's; `ring` when a pass must run for those
    /// still parked (see [`AtTheTail::Granted`]).
    Granted { demand: Demand, ring: bool },
    /// Refused at once; the demand goes back to be dropped outside the lock.
    Refused { demand: Demand, error: AdmitError },
    /// Parked at `place`; `ring` when a pass must run for it (the evaluator's doorbell).
    Parked {
        place: Place,
        /// When it times out, on the monitor's clock.
        deadline: Option<Instant>,
        ring: bool,
    },
}

/// What asking a newcomer at the line's tail made of it.
enum AtTheTail {
    /// Granted on arrival (its demand does not touch what the head needs). `ring`: it took from
    /// an account on which a waiting level's reserve may now hold the head back, so that the
    /// head no longer claims it all from those behind: a pass asks them.
    Granted {
        ring: bool,
    },
    /// Held; `due` is the earliest instant time alone could change that. `lenders`: its level
    /// reserves, so from now on the others leave that reserve aside, which may change what the
    /// head claims of those behind it (less a lendable reserve that holds it back) and whether
    /// it borrows: a pass asks the line.
    Held {
        due: Option<Instant>,
        lenders: bool,
    },
    /// Not asked: the head lacks nothing but reserves that waiting levels lend, and whether it
    /// borrows them depends on whether those levels' waiters can use them, which this newcomer
    /// may change (taking from them, its turns, its level's reserve): park and ring for a pass,
    /// which asks the newcomer too.
    Ring,
    Refused(AdmitError),
    /// Not asked: the head could go now, so a pass is due; park and let that pass ask.
    Deferred,
}

/// What a pass is for.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// Ask everyone: the evaluator's passes, and any pass that must see the whole line.
    Full,
    /// A grant gave these entries back, on the giver's thread. The pass may stop early: once the
    /// head is short on every account the pass has touched (given back here, or named by a
    /// waiter that left the line in it), everyone further back either needs one of them, and is
    /// held by the head's claim on it, or needs none, and would answer as at its last ask.
    Released(&'a [Entry]),
}

/// Where a pass got to.
pub(crate) enum Passed {
    /// The walk is over: the instant to wake at (`None`: only an event helps), and whether
    /// another pass asked to run while this one was paused (the line is to be walked again).
    Done { wake: Option<Instant>, again: bool },
    /// A full batch is walked and someone waits to be let in (a thread blocked on the lock, or
    /// waiters this walk decided): carry out the effects with the lock let go, then
    /// [`Machine::resume`].
    Paused,
}

/// Why a waiter leaves the line outside a pass.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Leaving {
    /// Its context was cancelled: the waiter is told so.
    Cancelled,
    /// Its owner is gone (a dropped future, an unwinding call): nobody is left to tell.
    Abandoned,
    /// Its own timer says its deadline has passed (checked again here, at the given instant).
    Expired,
}

/// What a waiter's leaving asks of the line next.
pub(crate) enum Next {
    /// Nothing: it was behind the head.
    Nothing,
    /// A full pass by the evaluator (a gate may count who it holds).
    Ring,
    /// The pass a give of the head's demand gets, on the leaving thread.
    Pass(Demand),
    /// A full pass on the leaving thread: the last waiter of a level that reserves left, so
    /// the others may borrow its reserves on any account.
    FullPass,
}

/// What [`Machine::leave`] did: what comes next, and what the waiter left behind.
pub(crate) struct Left {
    pub(crate) next: Next,
    /// An abandoned waiter's remains, to drop outside the lock: its record, or the decision that
    /// landed before it could leave (a grant in it is to be rolled back).
    pub(crate) remains: Remains,
}

/// See [`Left::remains`].
pub(crate) enum Remains {
    Nothing,
    Record(#[allow(dead_code, reason = "held only to be dropped")] Box<RecordRemains>),
    Decided(Done),
}

/// What an abandoned waiter's record held that is the caller's to drop.
pub(crate) struct RecordRemains {
    #[allow(dead_code, reason = "held only to be dropped")]
    demand: Demand,
    #[allow(dead_code, reason = "held only to be dropped")]
    notify: Notify,
}

/// The order a line serves its waiters in, besides arrival: tenants in fair shares, priority
/// levels (`None` for either: not configured).
#[derive(Clone, Default)]
pub(crate) struct LineOrder {
    pub(crate) fair: Option<FairShares>,
    pub(crate) levels: Option<Levels>,
}

/// The state machine: the line, the accounts it watches, and the wake-up it planned.
pub(crate) struct Machine {
    phase: Phase,
    line: Line,
    /// Accounts whose wake slot holds the monitor's wake-up (`kick`), so that stopping can clear
    /// them.
    watched: HashMap<usize, Weak<dyn Account>, BuildHasherDefault<AddressHasher>>,
    /// The wake-up the latest pass computed (`None`: only an event helps). Some pass runs by
    /// then: an arrival whose own deadline is no earlier need not ring.
    planned_wake: Option<Instant>,
    /// A pass paused between two batches (see [`Passed::Paused`]).
    walk: Option<Walk>,
    /// Set by a pass that found another paused: the paused one walks the line again when done.
    pass_again: bool,
    /// One buffer for every waiter's short list: a pass over a long line allocates nothing per
    /// waiter that is still held.
    short: Short,
    gate: Option<Arc<dyn Gate>>,
    /// The monitor's wake-up, installed in the accounts' wake slots.
    kick: WakeFn,
    /// The identity under which `kick` is muted while this machine gives back what it took.
    mute: usize,
    /// The count of parked waiters, as the lock-free fast path and the givers read it.
    published: Arc<Published>,
    /// Waiters a pass visits before it may pause.
    batch: usize,
    /// Fair shares' tags (`None`: arrival order).
    tags: Option<Tags>,
    /// The priority levels (`None`: one level).
    ranks: Option<Ranks>,
    /// The head, by place, that the next walk lets borrow the reserves of waiting levels that
    /// hold it back: the walk before found none of those levels' waiters able to use them (see
    /// [`Walk::in_use`]). A head changed meanwhile (a newcomer before it, the head gone) does
    /// not match, and is assessed afresh.
    borrow: Option<Place>,
    /// What each level took out of its reserve on accounts refilled by time while a head of
    /// another level claimed them ([`Dips`]).
    dips: Dips,
}

/// Under fair shares, what the waiters a pass asked so far, behind the head, leave for the
/// waiters after them on each account a job's cost counts ([`FairShares::counts`]): the amounts
/// of every one short there (less the reserves of waiting levels that lend the account, which
/// hold it back as they hold back a head), summed by account. Every waiter asked later in the
/// pass leaves them aside, as it leaves the head's amounts: among the waiters short on a scarce
/// account the line's order holds, so a tenant of many small jobs does not take, out of its
/// turn, what an earlier waiter of another tenant is short on (the share of a backlogged tenant
/// would else go to whoever asks the smallest amounts). Accounts the head is short on are its
/// own already (nobody behind takes from them). Kept only by passes: a newcomer is asked once
/// behind the head alone, as in arrival order.
///
/// [`FairShares::counts`]: crate::FairShares::counts
#[derive(Default)]
struct Turns(SmallVec<[(usize, Amount); 2]>);

impl Turns {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What the waiters asked so far leave aside on `account`.
    #[inline]
    fn of(&self, account: &AccountRef) -> Amount {
        if self.0.is_empty() {
            return Amount::ZERO;
        }
        let key = account_key(account);
        self.0
            .iter()
            .find(|&&(k, _)| k == key)
            .map_or(Amount::ZERO, |&(_, amount)| amount)
    }

    /// Adds the turns of a waiter held behind `head`, short on the entries `short` names of
    /// `entries`: its amount on each account the cost counts that it is short on and the head
    /// is not, less `lent(account)`.
    fn keep(
        &mut self,
        tags: &Tags,
        head: Option<&Head>,
        entries: &[Entry],
        short: &Short,
        lent: &dyn Fn(&AccountRef) -> Amount,
    ) {
        for i in short.iter().flatten() {
            let entry = &entries[i];
            let account = entry.account();
            let key = account_key(account);
            if head.is_some_and(|h| h.is_short_on(key)) || !tags.counts(account) {
                continue;
            }
            let amount = entry.amount().saturating_sub(lent(account));
            match self.0.iter_mut().find(|(k, _)| *k == key) {
                Some((_, sum)) => *sum = sum.saturating_add(amount),
                None => self.0.push((key, amount)),
            }
        }
    }
}

/// One pass's walk down the line: what it has learnt so far.
struct Walk {
    now: Instant,
    /// The accounts whose answers may have changed since the last ask, tracked only when the
    /// pass may stop early (a release, and no gate, whose count reads the whole line). In place
    /// for a few accounts: a hand-off pass allocates nothing.
    touched: Option<SmallVec<[usize; 4]>>,
    stopped_early: bool,
    /// The earliest wake-up any waiter asked so far needs ([`Instant::MAX`]: none yet).
    wake: Instant,
    head: Option<Head>,
    /// How many waiters the gate holds (counted only with a gate).
    on_gate: usize,
    /// Under fair shares, the turns kept so far: see [`Turns`].
    turns: Turns,
    /// The head allowed to borrow in this walk ([`Machine::borrow`]): asked as the head, it
    /// leaves aside only the reserves kept always.
    borrowing: Option<Place>,
    /// A waiter behind the head, of another level that reserves an account the head lacks only
    /// for such reserves, has room there: its level may use its reserve, so the head does not
    /// borrow it.
    in_use: bool,
    /// The head's rank and place, once there is a head.
    head_rank: u8,
    head_place: Option<Place>,
    /// Whether this walk decided anyone (a grant, a refusal, a timeout).
    decided: bool,
}

impl Walk {
    /// Adds the accounts of `demand`, whose waiter leaves the line in this pass, to the
    /// `touched` set: what it reserved or asked for is no longer set aside.
    fn touch(&mut self, demand: &Demand) {
        if let Some(touched) = &mut self.touched {
            for entry in demand.entries() {
                let key = account_key(entry.account());
                if !touched.contains(&key) {
                    touched.push(key);
                }
            }
        }
    }

    /// True once the head is short on every account this pass touched (see [`Scope::Released`]).
    #[inline]
    fn may_stop(&self) -> bool {
        match (&self.touched, &self.head) {
            (Some(touched), Some(head)) => touched.iter().all(|&key| head.is_short_on(key)),
            _ => false,
        }
    }
}

impl Machine {
    /// An open machine with an empty line. `kick` is installed in every account a waiter parks
    /// on; `mute` is its identity for muting (`account::mute`); `published` is where the count
    /// of parked waiters goes; a pass visits `batch` waiters (at least one) before it may pause;
    /// `order` says whether the line serves tenants in fair shares and by priority level.
    pub(crate) fn new(
        gate: Option<Arc<dyn Gate>>,
        kick: WakeFn,
        mute: usize,
        published: Arc<Published>,
        batch: usize,
        order: LineOrder,
    ) -> Machine {
        let LineOrder { fair, levels } = order;
        let mut machine = Machine {
            phase: Phase::Open,
            line: Line::default(),
            watched: HashMap::default(),
            planned_wake: None,
            walk: None,
            pass_again: false,
            short: Short::new(),
            gate,
            kick,
            mute,
            published,
            batch: batch.max(1),
            tags: None,
            ranks: levels.map(Ranks::new),
            borrow: None,
            dips: Dips::default(),
        };
        if let Some(shares) = fair {
            machine.tags = Some(Tags::new(shares));
        }
        if machine.tags.is_some() || machine.ranks.is_some() {
            machine.line.order_by_tag();
        }
        machine
    }

    /// The rank of `ctx`'s priority level (0 without levels).
    fn rank(&self, ctx: &JobContext) -> Result<u8, AdmitError> {
        self.ranks.as_ref().map_or(Ok(0), |ranks| ranks.rank(ctx))
    }

    /// The refusal of a demand of `rank` that can never fit beside the reserves the other levels
    /// always keep ([`Ranks::never_beside_reserves`]).
    fn never_beside_reserves(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        rank: u8,
        now: &Reading<'_>,
    ) -> Option<AdmitError> {
        self.ranks
            .as_ref()?
            .never_beside_reserves(demand, ctx, rank, now)
    }

    /// How many waiters are parked in the line.
    pub(crate) fn len(&self) -> usize {
        self.line.len()
    }

    /// True while admission is open.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open)
    }

    /// The error every admit gets now, `None` while open.
    pub(crate) fn phase_error(&self) -> Option<AdmitError> {
        match &self.phase {
            Phase::Open => None,
            Phase::Stopped => Some(AdmitError::Shutdown),
            Phase::Closed(cause) => Some(AdmitError::Closed {
                cause: cause.clone(),
            }),
        }
    }

    /// The gate's name, as holds and events report it.
    fn gate_name(&self) -> &str {
        self.gate.as_ref().map_or("gate", |g| g.name())
    }

    /// Publishes the line's length (always: the arrival's half of the wake-up argument).
    fn publish(&self, parked: usize) {
        self.published.publish(parked);
    }

    /// Publishes the line's length if it changed (a pass's end: an unchanged count is not
    /// written again, since a sequentially consistent store costs a line other cores read).
    fn publish_if_changed(&self) {
        if self.published.get() != self.line.len() {
            self.publish(self.line.len());
        }
    }

    /// Hands a long line's emptied slab to the effects, to be freed after the lock.
    fn emptied(&mut self, fx: &mut Effects) {
        if let Some(emptied) = self.line.take_emptied() {
            fx.emptied = Some(emptied);
        }
    }

    // ---- arrivals ------------------------------------------------------------------------

    /// A job arrives under the lock: granted or refused here, or parked.
    pub(crate) fn arrive(
        &mut self,
        arrival: Arrival<'_>,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> Arrived {
        let Arrival {
            demand,
            ctx,
            timeout,
            asked,
            notify,
        } = arrival;
        let refused = |fx: &mut Effects, demand: Demand, error: AdmitError| {
            fx.rejected(ctx, &demand, &error, now);
            Arrived::Refused { demand, error }
        };
        if ctx.is_cancelled() {
            let error = AdmitError::Cancelled {
                job: ctx.id(),
                waited: Duration::ZERO,
            };
            return refused(fx, demand, error);
        }
        if let Err(error) = demand.check_requirements() {
            return refused(fx, demand, error);
        }
        if let Some(error) = self.phase_error() {
            return refused(fx, demand, error);
        }
        let rank = match self.rank(ctx) {
            Ok(rank) => rank,
            Err(error) => return refused(fx, demand, error),
        };
        if let Some(error) = self.never_beside_reserves(&demand, ctx, rank, now) {
            return refused(fx, demand, error);
        }
        // True when the waiter about to park is behind the gate: the gate held it on the fast
        // path, or the head of the line is held on the gate (the sharp rule, applied here).
        let mut gate_held = false;
        if self.line.is_empty() && self.ranks.is_some() {
            // A busy period of the line begins: every level's reserve is whole.
            self.dips.forget();
        }
        if self.line.is_empty() && !asked {
            match self.fast_path(&demand, ctx, rank, now, &mut gate_held, fx) {
                Ok(true) => {
                    fx.event(EventKind::GrantedImmediate, ctx, now, || {
                        entry_events(demand.entries())
                    });
                    return Arrived::Granted {
                        demand,
                        ring: false,
                    };
                }
                Ok(false) => {}
                Err(error) => return refused(fx, demand, error),
            }
        }
        if self.gate.is_some() && !demand.is_empty() {
            // With a gate a pass asks the waiter, but a demand that can never fit is refused here
            // and now (a fast path that the gate held looked for that already).
            let looked = gate_held;
            if !gate_held {
                gate_held = self.line.head().is_some_and(|head| head.on_gate);
            }
            if !looked && let Some(error) = refusal_of(demand.entries(), ctx, now) {
                return refused(fx, demand, error);
            }
        }
        self.park(demand, ctx, rank, timeout, notify, gate_held, now, fx)
    }

    /// The fast path, for an empty line: the gate, then every account asked once as the head.
    /// `Ok(false)` is "not now", with `gate_held` set when the gate said so. An account's panic
    /// is a refusal of this job; the gate's closes admission.
    fn fast_path(
        &mut self,
        demand: &Demand,
        ctx: &JobContext,
        rank: u8,
        now: &Reading<'_>,
        gate_held: &mut bool,
        fx: &mut Effects,
    ) -> Result<bool, AdmitError> {
        // Only a gate, or an account that needs the time, reads the clock here.
        let view = GateView::at(match self.gate {
            Some(_) => now.get(),
            None => Instant::ZERO,
        });
        match catch_unwind(AssertUnwindSafe(|| {
            self.take_now(demand, ctx, rank, view, now, gate_held)
        })) {
            Ok(taken) => taken,
            Err(panic) => {
                // Only the gate can panic out of `take_now` (accounts are guarded): a defect.
                let cause = format!("the gate panicked: {}", panic_message(&*panic));
                Err(self.close(cause, now, fx))
            }
        }
    }

    fn take_now(
        &self,
        demand: &Demand,
        ctx: &JobContext,
        rank: u8,
        view: GateView,
        now: &Reading<'_>,
        gate_held: &mut bool,
    ) -> Result<bool, AdmitError> {
        if demand.is_empty() {
            return Ok(true);
        }
        if let Some(gate) = &self.gate
            && let GateAnswer::Hold { .. } = gate.check(view)
        {
            // The gate holds it, but an account that can never grant it still refuses it.
            if let Some(error) = refusal_of(demand.entries(), ctx, now) {
                return Err(error);
            }
            *gate_held = true;
            return Ok(false);
        }
        // An empty line: only the reserves kept always are left aside.
        let ranks = self.ranks.as_ref().filter(|r| r.reserving());
        let aside = |account: &AccountRef| {
            ranks.map_or(Amount::ZERO, |r| {
                r.aside(rank, account, &[0; MAX_RANKS], true)
            })
        };
        let aside: Aside<'_> = ranks.map(|_| &aside as &dyn Fn(&AccountRef) -> Amount);
        match take_whole(self.mute, demand.entries(), ctx, aside, now) {
            Whole::Taken => {}
            Whole::Short(_) => return Ok(false),
            Whole::Refused(error) => return Err(*error),
        }
        if let Some(gate) = &self.gate {
            gate.passed(view);
        }
        Ok(true)
    }

    /// Parks a job that could not go on the fast path, asking it first at the line's tail
    /// (without a gate; with one, a pass asks).
    #[expect(
        clippy::too_many_arguments,
        reason = "the arrival's state, passed down the one path that parks"
    )]
    fn park(
        &mut self,
        demand: Demand,
        ctx: &JobContext,
        rank: u8,
        timeout: Option<Duration>,
        notify: Notify,
        gate_held: bool,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> Arrived {
        let at = now.get();
        let mut waiter = Waiter::new(demand, ctx.clone(), at, timeout, gate_held, notify);
        waiter.rank = rank;
        if let Some(timeout) = timeout
            && waiter.is_due(at)
        {
            let error = AdmitError::TimedOut {
                job: ctx.id(),
                waited: Duration::ZERO,
                timeout,
            };
            fx.rejected(ctx, &waiter.demand, &error, now);
            return Arrived::Refused {
                demand: waiter.demand,
                error,
            };
        }
        for entry in waiter.demand.entries() {
            self.watch(entry.account());
        }
        let ring = match self.gate {
            Some(_) => true,
            None => {
                // Published before the ask, so a give that the ask misses finds someone waiting
                // and runs a pass (the wake-up argument, `sync.rs`).
                self.publish(self.line.len() + 1);
                match self.ask_at_the_tail(&mut waiter, now, fx) {
                    AtTheTail::Granted { ring } => {
                        self.publish(self.line.len());
                        self.tag(&waiter, ctx);
                        fx.event(EventKind::GrantedImmediate, ctx, now, || {
                            entry_events(waiter.demand.entries())
                        });
                        return Arrived::Granted {
                            demand: waiter.demand,
                            ring,
                        };
                    }
                    AtTheTail::Refused(error) => {
                        self.publish(self.line.len());
                        fx.rejected(ctx, &waiter.demand, &error, now);
                        return Arrived::Refused {
                            demand: waiter.demand,
                            error,
                        };
                    }
                    // The head could go now: whatever made it so (a give, a relaxed limit, time,
                    // its own first ask) runs or rings for a pass, which will ask this waiter too.
                    AtTheTail::Deferred => false,
                    AtTheTail::Held { due, lenders } => {
                        lenders || before_planned(due, self.planned_wake)
                    }
                    AtTheTail::Ring => true,
                }
            }
        };
        let tag = self.tag(&waiter, ctx);
        let deadline = waiter.deadline();
        let place = self.line.push(waiter, tag);
        // A newcomer of a higher level placed before the head is the head now: the old head's
        // claims are lifted, and the waiters behind may go, so a pass asks them.
        let new_head = self.line.len() > 1 && self.line.is_head(place);
        let ring = ring || new_head;
        if new_head && let Some(walk) = &mut self.walk {
            // A paused pass knows the old head: what it set aside, what it is short on. It
            // resumes from the new head instead, learning its claims before it asks anyone
            // behind it again (and the turns of those it asked already, again).
            walk.head = None;
            walk.turns = Turns::default();
            walk.in_use = false;
            walk.borrowing = None;
            self.line.hold_cursor(Some(place));
        } else if self.walk.is_some() && self.line.walked_past(place) {
            // Placed by its tag before a paused pass's cursor: that pass walks the line again
            // once done, so it asks the newcomer too.
            self.pass_again = true;
        }
        // Without a gate the count was published before the ask, and is this already.
        self.publish(self.line.len());
        Arrived::Parked {
            place,
            deadline,
            ring,
        }
    }

    /// Under fair shares, the start tag of newcomer `w`, its tenant charged (a newcomer granted
    /// at once is charged too); zero in arrival order.
    fn tag(&mut self, w: &Waiter, ctx: &JobContext) -> Tag {
        let Some(tags) = &mut self.tags else {
            return Tag::ZERO;
        };
        let line = &self.line;
        let rank = w.rank;
        let parked = line.parked_at(rank) as usize;
        tags.start(
            &w.demand,
            ctx,
            rank,
            line.least_tag(rank),
            parked,
            &|tenant| line.has_parked(rank, tenant),
        )
    }

    /// Asks newcomer `w` what a pass would ask at the line's tail: every account, with the
    /// head's amounts set aside and the accounts the head is short on untouchable (first in
    /// line, it is the head). Held, its `Held` events are built.
    fn ask_at_the_tail(
        &mut self,
        w: &mut Waiter,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> AtTheTail {
        // The line as a pass will find it once the newcomer parks: its level has a waiter
        // parked, so the others (the head too) leave that level's reserves aside.
        let mut parked = self.line.parked_by_rank();
        parked[usize::from(w.rank)] += 1;
        let ranks = self.ranks.as_ref().filter(|r| r.reserving());
        let aside_of = |rank: u8| {
            move |account: &AccountRef| {
                ranks.map_or(Amount::ZERO, |r| r.aside(rank, account, &parked, false))
            }
        };
        let (head_aside, own_aside) = (
            aside_of(self.line.head().map_or(0, |h| h.rank)),
            aside_of(w.rank),
        );
        let (head_aside, own_aside): (Aside<'_>, Aside<'_>) = match ranks {
            Some(_) => (Some(&head_aside), Some(&own_aside)),
            None => (None, None),
        };
        // Behind a line, the head as it stands now; first in line (a line of lower levels only
        // counts as empty), nobody's amounts to respect.
        let head = match self.line.head().filter(|head| head.rank <= w.rank) {
            Some(first) => match Head::now_of(&first.demand, head_aside, now) {
                Some(mut head) => {
                    if let Some(ranks) = ranks {
                        let entries = first.demand.entries();
                        head.claim_only(
                            |i| ranks.claims(first.rank, &entries[i], now),
                            |i| ranks.lendable(first.rank, entries[i].account(), &parked),
                        );
                    }
                    if head.lent_only() {
                        return match refusal_of(w.demand.entries(), &w.ctx, now) {
                            Some(error) => AtTheTail::Refused(error),
                            None => AtTheTail::Ring,
                        };
                    }
                    Some(head)
                }
                // A demand that can never fit is refused now, not after the head's pass.
                None => match refusal_of(w.demand.entries(), &w.ctx, now) {
                    Some(error) => return AtTheTail::Refused(error),
                    None => return AtTheTail::Deferred,
                },
            },
            None => None,
        };
        let mut short = std::mem::take(&mut self.short);
        let first_rank = self.line.head().map_or(w.rank, |h| h.rank);
        let dips = &self.dips;
        let may_dip =
            |i: usize| ranks.is_some_and(|r| r.may_dip(dips, w.rank, &w.demand.entries()[i]));
        let dip: Dip<'_> = (ranks.is_some() && first_rank != w.rank).then_some(&may_dip);
        let attempt = ask_demand(
            self.mute,
            w.demand.entries(),
            &w.ctx,
            head.as_ref(),
            own_aside,
            dip,
            Learn::EveryShort,
            now,
            &mut short,
        );
        if let (Attempt::Granted, Some(ranks)) = (&attempt, ranks) {
            // What was taken out of the level's reserve, as asked (nothing moved since).
            let dipped = Claims::dipped(w.demand.entries(), head.as_ref(), dip);
            ranks.book(&mut self.dips, w.rank, w.demand.entries(), |i| {
                i < 64 && dipped & (1 << i) != 0
            });
        }
        let result = match attempt {
            Attempt::Granted => AtTheTail::Granted {
                // With levels that reserve, what the first waiter claims, and whether the
                // lenders behind it can use their reserves, may change with this grant: a pass
                // asks the line again (`Head::lent_only`, `Walk::in_use`).
                ring: ranks.is_some() && !self.line.is_empty(),
            },
            Attempt::Refused(error) => AtTheTail::Refused(*error),
            Attempt::Held { wake } => {
                self.note_held(fx, w, &short, now);
                AtTheTail::Held {
                    due: earlier(wake, w.deadline()),
                    lenders: ranks.is_some_and(|r| r.lends(w.rank)),
                }
            }
        };
        self.short = short;
        result
    }

    /// Installs the monitor's wake-up in `account`'s wake slot, once per account.
    fn watch(&mut self, account: &AccountRef) {
        let key = account_key(account);
        if self.watched.contains_key(&key) {
            return;
        }
        if self.watched.len() >= 64 && self.watched.len().is_power_of_two() {
            self.watched.retain(|_, weak| weak.strong_count() > 0);
        }
        account.on_capacity_change(Some(self.kick.clone()));
        self.watched.insert(key, Arc::downgrade(account));
    }

    /// Takes `demand` now or not at all under the lock, never parking (`Monitor::try_admit` when
    /// the lock-free path leaves it to the lock: a gate, a line, a phase or the job's state).
    pub(crate) fn try_take(
        &mut self,
        demand: &Demand,
        ctx: &JobContext,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> Result<(), TryAdmitError> {
        let refused = |fx: &mut Effects, error: AdmitError| {
            fx.rejected(ctx, demand, &error, now);
            Err(TryAdmitError::Admit(error))
        };
        if ctx.is_cancelled() {
            let error = AdmitError::Cancelled {
                job: ctx.id(),
                waited: Duration::ZERO,
            };
            return refused(fx, error);
        }
        if let Err(error) = demand.check_requirements() {
            return refused(fx, error);
        }
        if let Some(error) = self.phase_error() {
            return refused(fx, error);
        }
        let rank = match self.rank(ctx) {
            Ok(rank) => rank,
            Err(error) => return refused(fx, error),
        };
        if let Some(error) = self.never_beside_reserves(demand, ctx, rank, now) {
            return refused(fx, error);
        }
        if !self.line.is_empty() {
            // Never overtaking the line, but "never" wins over "not now": a demand no account
            // can ever grant is refused, not told to wait.
            if let Some(error) = refusal_of(demand.entries(), ctx, now) {
                return refused(fx, error);
            }
            return Err(TryAdmitError::WouldWait {
                job: ctx.id(),
                waiting: self.line.len(),
                short: None,
            });
        }
        let mut gate_held = false;
        match self.fast_path(demand, ctx, rank, now, &mut gate_held, fx) {
            Ok(true) => {
                fx.event(EventKind::GrantedImmediate, ctx, now, || {
                    entry_events(demand.entries())
                });
                Ok(())
            }
            Ok(false) => match (!gate_held)
                .then(|| refusal_of(demand.entries(), ctx, now))
                .flatten()
            {
                // The fast path stopped at the first "not now"; a later account's "never" wins
                // (a gate's hold looked for one already).
                Some(error) => refused(fx, error),
                None => Err(TryAdmitError::WouldWait {
                    job: ctx.id(),
                    waiting: 0,
                    short: gate_held.then(|| self.gate_name().to_owned()),
                }),
            },
            Err(error) => refused(fx, error),
        }
    }

    // ---- passes --------------------------------------------------------------------------

    /// Starts a pass over the line at the instant `now` holds (read). It walks at most one batch
    /// of waiters before it may pause ([`Passed::Paused`]); a pass started while another is
    /// paused leaves a note for that one (which walks the line again once done) and returns
    /// at once.
    pub(crate) fn pass(
        &mut self,
        scope: Scope<'_>,
        now: &Reading<'_>,
        fx: &mut Effects,
        contended: &dyn Fn() -> bool,
    ) -> Passed {
        let done = Passed::Done {
            wake: None,
            again: false,
        };
        if !self.is_open() {
            return done;
        }
        if self.walk.is_some() {
            // Another pass is between two batches: it walks the line again when done.
            self.pass_again = true;
            return done;
        }
        if self.line.is_empty() {
            if let Some(gate) = &self.gate {
                gate.holding(0);
            }
            self.planned_wake = None;
            return done;
        }
        let touched = match scope {
            // A waiter may take from its level's reserve on an account the head is short on
            // (a dip): such an account does not let the pass stop early.
            Scope::Released(entries)
                if self.gate.is_none()
                    && !entries
                        .iter()
                        .any(|e| self.ranks.as_ref().is_some_and(|r| r.dippable(e.account()))) =>
            {
                Some(entries.iter().map(|e| account_key(e.account())).collect())
            }
            _ => None,
        };
        let walk = Walk {
            now: now.get(),
            touched,
            stopped_early: false,
            wake: Instant::MAX,
            head: None,
            turns: Turns::default(),
            borrowing: std::mem::take(&mut self.borrow),
            in_use: false,
            head_rank: 0,
            head_place: None,
            decided: false,
            // Only a gate needs the count (and counting reads the whole line).
            on_gate: if self.gate.is_some() {
                self.line.on_gate()
            } else {
                0
            },
        };
        let first = self.line.first();
        self.walk_from(walk, first, now, fx, contended)
    }

    /// Goes on with a paused pass (`Passed::Done` with nothing if it was abandoned meanwhile,
    /// by a stop).
    pub(crate) fn resume(
        &mut self,
        now: &Reading<'_>,
        fx: &mut Effects,
        contended: &dyn Fn() -> bool,
    ) -> Passed {
        let Some(walk) = self.walk.take() else {
            return Passed::Done {
                wake: None,
                again: std::mem::take(&mut self.pass_again),
            };
        };
        let next = self.line.resume();
        self.walk_from(walk, next, now, fx, contended)
    }

    /// Walks the line from `place` on, for at most one batch past which it pauses if someone
    /// waits to be let in.
    fn walk_from(
        &mut self,
        mut walk: Walk,
        mut place: Option<Place>,
        now: &Reading<'_>,
        fx: &mut Effects,
        contended: &dyn Fn() -> bool,
    ) -> Passed {
        // Only a monitor without a gate walks in batches (the gate's count is the whole line's).
        let batch = if self.gate.is_some() {
            usize::MAX
        } else {
            self.batch
        };
        let mut visited = 0;
        while let Some(at) = place {
            // A full batch ends when ending it helps someone: a thread blocked on the lock, or
            // waiters this walk decided, to wake. A walk over waiters that all stay (a deadline's
            // pass over a long line nobody else wants) runs on.
            if visited >= batch {
                if fx.has_wakes() || contended() {
                    // The batch's decisions stand (its leavers left the line as they were
                    // decided); the line keeps the walk's place meanwhile (a waiter leaving
                    // moves it on, one arriving at the end is visited).
                    self.publish_if_changed();
                    self.emptied(fx);
                    self.line.hold_cursor(Some(at));
                    self.walk = Some(walk);
                    return Passed::Paused;
                }
                // Nobody to let in yet: look again a few waiters on, not at every one.
                visited -= RECHECK_EVERY.min(visited);
            }
            visited += 1;
            let (next, stop) = self.visit(&mut walk, at, now, fx);
            place = next;
            if stop {
                walk.stopped_early = true;
                break;
            }
        }
        // A head short only for reserves of waiting levels whose waiters, all asked in this walk,
        // cannot use them: it borrows them, in a walk again (else it and a waiter asking more
        // than its level's reserve would wait for each other).
        // A waiter that had room when asked may have none after the grants behind it, so a walk
        // that decided anyone asks again before it concludes the reserve is in use.
        if !walk.stopped_early
            && walk.head.as_ref().is_some_and(Head::lent_only)
            && (!walk.in_use || walk.decided)
        {
            self.borrow = walk.head_place.filter(|_| !walk.in_use);
            self.pass_again = true;
        }
        let wake = self.end_pass(walk, fx);
        Passed::Done {
            wake,
            again: std::mem::take(&mut self.pass_again),
        }
    }

    /// Asks the waiter at `place` in this pass; returns the place after it, and true when the
    /// pass may stop here.
    fn visit(
        &mut self,
        walk: &mut Walk,
        place: Place,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> (Option<Place>, bool) {
        let ranks = self.ranks.as_ref().filter(|r| r.reserving());
        let parked = match ranks {
            Some(_) => self.line.parked_by_rank(),
            None => [0; MAX_RANKS],
        };
        let (next, w) = self.line.step(place);
        let rank = w.rank;
        // Leavers first: a late waiter times out (a cancelled one left when it was cancelled).
        if w.is_due(walk.now) {
            let error = timed_out(w, walk.now);
            walk.touch(&w.demand);
            walk.decided = true;
            self.refuse(place, error, &mut walk.on_gate, now, fx);
            return (next, self.lent_again(rank));
        }
        walk.wake = walk.wake.min(w.deadline_or_max());
        let is_head = walk.head.is_none();
        // Only a gate is shown the waiter; without one this costs nothing.
        let view = self.gate.is_some().then(|| gate_view(w, is_head, walk));
        // The short list's buffer is reused from waiter to waiter (borrowed, not moved: it is
        // as big as its inline room).
        let short = &mut self.short;
        let turns = &walk.turns;
        // The head this walk lets borrow leaves aside only what is kept always.
        let borrows = is_head && walk.borrowing == Some(place);
        let aside = |account: &AccountRef| {
            let levels = ranks.map_or(Amount::ZERO, |r| r.aside(rank, account, &parked, borrows));
            levels.saturating_add(turns.of(account))
        };
        let dips = &self.dips;
        let may_dip =
            |i: usize| ranks.is_some_and(|r| r.may_dip(dips, rank, &w.demand.entries()[i]));
        let dip: Dip<'_> = (ranks.is_some() && !is_head && rank != walk.head_rank)
            .then_some(&may_dip as &dyn Fn(usize) -> bool);
        let attempt = attempt(
            self.gate.as_ref(),
            self.mute,
            w,
            walk.head.as_ref(),
            (ranks.is_some() || !turns.is_empty())
                .then_some(&aside as &dyn Fn(&AccountRef) -> Amount),
            dip,
            view,
            now,
            short,
        );
        let stop = match attempt {
            Attempt::Granted => {
                walk.touch(&w.demand);
                walk.decided = true;
                if let Some(ranks) = ranks {
                    // What was taken out of the level's reserve, as asked (nothing moved since).
                    let dipped = Claims::dipped(w.demand.entries(), walk.head.as_ref(), dip);
                    let earned = ranks.book(&mut self.dips, rank, w.demand.entries(), |i| {
                        i < 64 && dipped & (1 << i) != 0
                    });
                    if earned {
                        // A waiter behind may dip now, on an account the head is short on:
                        // this walk does not stop early.
                        walk.touched = None;
                    }
                }
                // Granted behind the head from an account a waiting level lends: the head may
                // lack it now only for that reserve, and claim less from those behind than this
                // walk's head says, so the line is walked again (as for a grant at the tail).
                let relaxes = walk.head.is_some()
                    && ranks.is_some_and(|r| {
                        w.demand
                            .entries()
                            .iter()
                            .any(|e| !r.lendable(walk.head_rank, e.account(), &parked).is_zero())
                    });
                self.grant(place, &mut walk.on_gate, now, fx);
                if relaxes {
                    self.pass_again = true;
                }
                self.lent_again(rank)
            }
            Attempt::Refused(error) => {
                walk.touch(&w.demand);
                walk.decided = true;
                self.refuse(place, *error, &mut walk.on_gate, now, fx);
                self.lent_again(rank)
            }
            Attempt::Held { wake: at } => {
                let gate_held = short.contains(None);
                if gate_held != w.on_gate {
                    w.on_gate = gate_held;
                    if gate_held {
                        walk.on_gate += 1;
                    } else {
                        walk.on_gate -= 1;
                    }
                }
                note_held(self.gate.as_deref(), fx, w, short, now);
                if is_head {
                    let mut head = Head::of(&w.demand, short);
                    if let Some(ranks) = ranks {
                        let entries = w.demand.entries();
                        head.claim_only(
                            |i| ranks.claims(rank, &entries[i], now),
                            |i| match borrows {
                                true => Amount::ZERO,
                                false => ranks.lendable(rank, entries[i].account(), &parked),
                            },
                        );
                    }
                    head.gate_hold = gate_held.then_some(at);
                    walk.head = Some(head);
                    walk.head_rank = rank;
                    walk.head_place = Some(place);
                } else if let (Some(ranks), Some(head)) = (ranks, walk.head.as_ref())
                    && !walk.in_use
                    && rank != walk.head_rank
                    && !gate_held
                    && head.lent_only()
                {
                    // Room on an account the head lacks only for its level's reserve, and short
                    // elsewhere only on what the head's amounts do not hold back (else the head
                    // would wait for its level and it for the head).
                    let entries = w.demand.entries();
                    walk.in_use = entries.iter().enumerate().any(|(i, entry)| {
                        let account = entry.account();
                        !short.contains(Some(i))
                            && head.is_lent_on(account_key(account))
                            && ranks.reserves(rank, account)
                    }) && short.iter().flatten().all(|j| {
                        let (account, amount) = (entries[j].account(), entries[j].amount());
                        let ask = Ask::behind(Amount::ZERO).also_leaving(aside(account));
                        !matches!(
                            asked(account, amount, ask.look().with(now)),
                            Ok(Answer::Taken)
                        )
                    });
                }
                if !is_head && let Some(tags) = self.tags.as_ref().filter(|_| short.answered()) {
                    let lent = |account: &AccountRef| {
                        ranks.map_or(Amount::ZERO, |r| r.lendable(rank, account, &parked))
                    };
                    walk.turns
                        .keep(tags, walk.head.as_ref(), w.demand.entries(), short, &lent);
                }
                walk.wake = walk.wake.min(at.unwrap_or(Instant::MAX));
                walk.may_stop()
            }
        };
        (next, stop)
    }

    /// After a waiter of `rank` left the line in a pass: when it was the last of a level that
    /// reserves, the others may borrow its reserves again, which a waiter already asked in this
    /// pass did not know, so the line is walked again; and the head's amounts, less that
    /// level's reserves while it waited, are no longer what the waiters behind must leave, so
    /// this walk stops here (true) rather than ask anyone else against them.
    fn lent_again(&mut self, rank: u8) -> bool {
        let lent = self.ranks_lend(rank);
        if lent {
            self.pass_again = true;
        }
        lent
    }

    /// Whether the level of `rank` just lent its reserves: it reserves, has nobody parked now,
    /// and others wait.
    fn ranks_lend(&self, rank: u8) -> bool {
        self.ranks.as_ref().is_some_and(|r| r.lends(rank))
            && self.line.parked_at(rank) == 0
            && !self.line.is_empty()
    }

    /// Ends a pass: publishes the line's new size and plans the next wake-up.
    fn end_pass(&mut self, walk: Walk, fx: &mut Effects) -> Option<Instant> {
        self.emptied(fx);
        if let Some(gate) = &self.gate {
            gate.holding(walk.on_gate);
        }
        self.publish_if_changed();
        if self.line.is_empty() {
            self.planned_wake = None;
            return None;
        }
        // An instant in the past means "now"; an account that keeps answering so while refusing
        // must not spin the evaluator, so such a wake-up is asked again a millisecond later.
        let now = walk.now;
        let wake = (walk.wake != Instant::MAX).then_some(walk.wake).map(|at| {
            if at <= now {
                now.saturating_add(MIN_RECHECK)
            } else {
                at
            }
        });
        if walk.stopped_early {
            // The waiters not asked keep the wake-up planned for them; only an earlier one from
            // the waiters asked here is news for the evaluator.
            let planned = self.planned_wake;
            self.planned_wake = earlier(planned, wake);
            return if before_planned(wake, planned) {
                wake
            } else {
                None
            };
        }
        self.planned_wake = wake;
        wake
    }

    /// Grants the waiter at `place`, whose whole demand was just taken: it leaves the line with
    /// its grant's waits, to be woken.
    fn grant(&mut self, place: Place, on_gate: &mut usize, now: &Reading<'_>, fx: &mut Effects) {
        let Some(w) = self.line.get_mut(place) else {
            return;
        };
        let was_on_gate = w.on_gate;
        // The pass's instant, at which every account was asked: a waiter that parked after it
        // was read reports a wait of zero. The holds move into the grant as they are; it reads
        // them only when asked.
        let waits = Waits {
            holds: std::mem::take(&mut w.held),
            asked_at: w.asked_at,
            granted_at: now.get(),
        };
        let event = fx.wants_events().then(|| {
            (
                w.ctx.clone(),
                waits.wall_wait(),
                entry_events(w.demand.entries()),
            )
        });
        let done = Done {
            demand: std::mem::take(&mut w.demand),
            outcome: Ok(waits),
        };
        let notify = self.line.decide(place, done);
        if let Some((ctx, wait, entries)) = event {
            let kind = EventKind::GrantedFromHold {
                wait,
                waiters: self.line.len(),
            };
            fx.event(kind, &ctx, now, || entries);
        }
        if was_on_gate {
            *on_gate -= 1;
        }
        fx.wake.extend(notify);
    }

    /// Refuses the waiter at `place` with `error`: it leaves the line with the refusal, to be
    /// woken.
    fn refuse(
        &mut self,
        place: Place,
        error: AdmitError,
        on_gate: &mut usize,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) {
        let Some(w) = self.line.get_mut(place) else {
            return;
        };
        let was_on_gate = w.on_gate;
        fx.rejected(&w.ctx, &w.demand, &error, now);
        let done = Done {
            demand: std::mem::take(&mut w.demand),
            outcome: Err(error),
        };
        let notify = self.line.decide(place, done);
        if was_on_gate {
            *on_gate -= 1;
        }
        fx.wake.extend(notify);
    }

    // ---- leaving and collecting ------------------------------------------------------------

    /// Takes the waiter at `place` out of the line for `why`, at `now` (an expiry only if it is
    /// due by then).
    ///
    /// What follows depends on what the leaver can change. A waiter behind the head held
    /// nothing and set nothing aside, so the line answers as before without it: nothing is
    /// asked again (a wake-up computed from its deadline is at worst a pass with nothing to do),
    /// and emptying a long line one withdrawal at a time costs no pass over it, with two
    /// exceptions that get the pass the head leaving gets: under fair shares a waiter that was
    /// short on an account the cost counts (it may have kept a turn there), and a waiter of a
    /// level that reserves (it may have kept the head from borrowing that reserve). The head leaving
    /// frees what it set aside, as a give of its demand would: [`Next::Pass`] asks for the pass
    /// a give gets, which may stop once the new head is short on every account the leaver named.
    /// With a gate, whose answer may count the waiters it holds, the evaluator is rung for a
    /// full pass whenever the head or a waiter the gate held leaves.
    pub(crate) fn leave(
        &mut self,
        place: Place,
        why: Leaving,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> Left {
        let nothing = |remains| Left {
            next: Next::Nothing,
            remains,
        };
        let Some(w) = self.line.get(place) else {
            // Not in the line: an abandoned waiter's decision may be waiting for it.
            return match why {
                Leaving::Abandoned => match self.line.collect(place) {
                    Some(done) => {
                        self.emptied(fx);
                        nothing(Remains::Decided(done))
                    }
                    None => nothing(Remains::Nothing),
                },
                _ => nothing(Remains::Nothing),
            };
        };
        let at = now.get();
        if matches!(why, Leaving::Expired) && !w.is_due(at) {
            return nothing(Remains::Nothing);
        }
        let was_head = self.line.is_head(place);
        let was_on_gate = w.on_gate;
        let rank = w.rank;
        let others_remain = self.line.len() > 1;
        // Under fair shares a waiter behind the head may hold turns (see `Turns`): the waiters
        // behind it leave its amounts aside until a pass finds it gone. A waiter of a level
        // that reserves may have been what kept the head from borrowing that reserve (see
        // `Walk::in_use`).
        let short_on_counted = self.tags.as_ref().is_some_and(|tags| {
            !w.holding.is_exact()
                || w.holding.entries().any(|i| {
                    w.demand
                        .entries()
                        .get(i)
                        .is_some_and(|e| tags.counts(e.account()))
                })
        });
        let held_turns = (short_on_counted || self.ranks.as_ref().is_some_and(|r| r.lends(rank)))
            && others_remain;
        let pass = ((was_head || held_turns) && others_remain && self.gate.is_none())
            .then(|| w.demand.clone());
        let error = left_with(w, why, at);
        let remains = match why {
            Leaving::Abandoned => {
                let mut gone = self.line.remove(place).expect("in the line, checked above");
                fx.rejected(&gone.ctx, &gone.demand, &error, now);
                Remains::Record(Box::new(RecordRemains {
                    demand: std::mem::take(&mut gone.demand),
                    notify: std::mem::take(&mut gone.notify),
                }))
            }
            Leaving::Cancelled | Leaving::Expired => {
                let mut on_gate = usize::from(was_on_gate);
                self.refuse(place, error, &mut on_gate, now, fx);
                Remains::Nothing
            }
        };
        self.emptied(fx);
        self.publish(self.line.len());
        if was_on_gate && let Some(gate) = &self.gate {
            gate.holding(self.line.on_gate());
        }
        let next = match (&self.gate, pass) {
            // The last waiter of a level that reserves: the others may borrow again.
            (None, _) if self.ranks_lend(rank) => Next::FullPass,
            (Some(_), _) if self.ranks_lend(rank) => Next::Ring,
            (Some(_), _) if was_head || was_on_gate || held_turns => Next::Ring,
            (None, Some(demand)) => Next::Pass(demand),
            _ => Next::Nothing,
        };
        Left { next, remains }
    }

    /// The decision kept for the waiter at `place`, collected (its slot freed); `None` while it
    /// is still in the line.
    pub(crate) fn collect(&mut self, place: Place, fx: &mut Effects) -> Option<Done> {
        let done = self.line.collect(place)?;
        self.emptied(fx);
        Some(done)
    }

    /// Whom the waiter at `place` will be woken through, to change (`None`: it is not in the
    /// line).
    pub(crate) fn notify_mut(&mut self, place: Place) -> Option<&mut Notify> {
        self.line.get_mut(place).map(|w| &mut w.notify)
    }

    /// Refuses the waiter just parked at `place` with `error` (the shell could not give it an
    /// evaluator): it leaves the line at once and its demand comes back.
    pub(crate) fn unserved(
        &mut self,
        place: Place,
        error: &AdmitError,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> Option<Demand> {
        let mut w = self.line.remove(place)?;
        self.emptied(fx);
        self.publish(self.line.len());
        fx.rejected(&w.ctx, &w.demand, error, now);
        Some(std::mem::take(&mut w.demand))
    }

    // ---- stopping ----------------------------------------------------------------------------

    /// Stops admission: every waiter is refused with [`AdmitError::Shutdown`], and the monitor's
    /// wake-up is taken back from every account. Returns false when it was not open (a second
    /// stop, or one after a close: the accounts are still let go of).
    pub(crate) fn stop(&mut self, now: &Reading<'_>, fx: &mut Effects) -> bool {
        let was_open = self.is_open();
        if was_open {
            self.phase = Phase::Stopped;
            self.drain(&AdmitError::Shutdown, now, fx);
        }
        self.unwatch(fx);
        was_open
    }

    /// Closes admission for good because of a defect; every waiter fails with the cause
    /// (reported through [`Effects::closed`]). Returns the error every admit now gets.
    pub(crate) fn close(
        &mut self,
        cause: String,
        now: &Reading<'_>,
        fx: &mut Effects,
    ) -> AdmitError {
        if let Some(error) = self.phase_error() {
            return error;
        }
        let cause: Arc<str> = Arc::from(cause);
        self.phase = Phase::Closed(cause.clone());
        fx.closed = Some(cause.clone());
        let error = AdmitError::Closed { cause };
        self.drain(&error, now, fx);
        self.unwatch(fx);
        error
    }

    /// Refuses every waiter with `error` and empties the line.
    fn drain(&mut self, error: &AdmitError, now: &Reading<'_>, fx: &mut Effects) {
        self.walk = None;
        self.pass_again = false;
        self.line.drop_cursor();
        let mut on_gate = self.line.on_gate();
        for place in self.line.places() {
            self.refuse(place, error.clone(), &mut on_gate, now, fx);
        }
        self.emptied(fx);
        self.publish(0);
    }

    /// Takes the monitor's wake-up back from every account it watched, leaving alone a slot
    /// that another monitor sharing the account has taken over since.
    fn unwatch(&mut self, fx: &mut Effects) {
        for (_, weak) in self.watched.drain() {
            if let Some(account) = weak.upgrade() {
                account.forget_capacity_change(&self.kick);
                // Maybe the last handle now: dropped once the lock is released.
                fx.unwatched.push(account);
            }
        }
    }

    /// Records that the accounts in `short` hold waiter `w` ([`note_held`] with this machine's
    /// gate).
    fn note_held(&self, fx: &mut Effects, w: &mut Waiter, short: &Short, now: &Reading<'_>) {
        note_held(self.gate.as_deref(), fx, w, short, now);
    }
}

/// Asks the gate and every account about waiter `w`, and takes its whole demand if it fits.
#[expect(
    clippy::too_many_arguments,
    reason = "one waiter's ask, with what the pass knows of the line"
)]
fn attempt(
    gate: Option<&Arc<dyn Gate>>,
    mute: usize,
    w: &Waiter,
    head: Option<&Head>,
    aside: Aside<'_>,
    dip: Dip<'_>,
    view: Option<GateView>,
    now: &Reading<'_>,
    short: &mut Short,
) -> Attempt {
    short.clear();
    let demand = w.demand.entries();
    if demand.is_empty() {
        return Attempt::Granted;
    }
    if let (Some(gate), Some(view)) = (gate, view) {
        let held = match head {
            Some(Head {
                gate_hold: Some(until),
                ..
            }) => Some(*until),
            _ => match gate.check(view) {
                GateAnswer::Hold { until } => Some(until),
                _ => None,
            },
        };
        if let Some(wake) = held {
            // The gate holds it, but an account that can never grant it still refuses it.
            if let Some(error) = refusal_of(demand, &w.ctx, now) {
                return Attempt::Refused(Box::new(error));
            }
            short.push(None);
            return Attempt::Held { wake };
        }
    }
    let attempt = ask_demand(
        mute,
        demand,
        &w.ctx,
        head,
        aside,
        dip,
        Learn::EveryShort,
        now,
        short,
    );
    if let (Attempt::Granted, Some(gate), Some(view)) = (&attempt, gate, view) {
        gate.passed(view);
    }
    attempt
}

/// Records that the accounts in `short` (`None`: the gate) hold waiter `w` now: holds that
/// ended are closed, new ones opened with a `Held` event.
#[inline]
fn note_held(
    gate: Option<&dyn Gate>,
    fx: &mut Effects,
    w: &mut Waiter,
    short: &Short,
    now: &Reading<'_>,
) {
    // The same accounts short as last time, all still holding: nothing to record (one
    // comparison for the common case).
    let holding = short.holding();
    if holding == w.holding && holding.is_exact() {
        return;
    }
    record_held(gate, fx, w, short, now);
}

/// [`note_held`] past its first comparison. Out of line: a pass rarely gets here.
#[inline(never)]
fn record_held(
    gate: Option<&dyn Gate>,
    fx: &mut Effects,
    w: &mut Waiter,
    short: &Short,
    now: &Reading<'_>,
) {
    let at = now.get();
    let gate_only = short.is_gate_only();
    // Held by the gate again, whatever else held it before: the gate asked nothing else.
    if gate_only && w.holding.has_gate() && w.holding.is_exact() {
        return;
    }
    if !gate_only {
        // Every account was asked: those no longer short stopped holding the waiter now.
        for hold in &mut w.held {
            if short.contains(hold.entry()) {
                hold.reopen();
            } else {
                hold.end(at);
            }
        }
    }
    for s in short.iter() {
        if let Some(hold) = w.held.iter_mut().find(|h| h.entry() == s) {
            hold.reopen();
            continue;
        }
        // The first hold sits in the record; past it, room for exactly one more at a time: a
        // waiter is held by one or two accounts.
        w.held.reserve_exact(1);
        w.held.push(Hold::new(s, at));
        let entry = s.map(|i| &w.demand.entries()[i]);
        fx.event(EventKind::Held, &w.ctx, now, || match entry {
            Some(e) => vec![EventEntry {
                account: e.account().name().to_owned(),
                category: e.account().category(),
                amount: e.amount(),
            }],
            None => vec![EventEntry {
                account: gate.map_or("gate", |g| g.name()).to_owned(),
                category: gate.map_or(Category::custom("gate"), |g| g.category()),
                amount: Amount::ZERO,
            }],
        });
    }
    w.holding = Holding::now_of(&w.held);
}

/// What the gate is shown of waiter `w`.
fn gate_view(w: &Waiter, is_head: bool, walk: &Walk) -> GateView {
    let elsewhere = !w.on_gate && w.holding.has_account();
    let view = GateView::at(walk.now)
        .with_held(walk.on_gate - usize::from(w.on_gate))
        .with_on_gate(w.on_gate)
        .with_elsewhere(elsewhere);
    if is_head {
        view
    } else {
        view.behind_the_head()
    }
}

/// The error of waiter `w`, whose deadline passed by `now` (a late waiter leaves before it is
/// asked).
///
/// A cancelled job is not looked for by a pass: cancelling runs the listener the waiter
/// registered on its context, which takes it out of the line at once, so the pass never reads
/// the job's context for it.
#[cold]
fn timed_out(w: &Waiter, now: Instant) -> AdmitError {
    AdmitError::TimedOut {
        job: w.ctx.id(),
        waited: now.saturating_duration_since(w.asked_at),
        timeout: w.timeout.unwrap_or_default(),
    }
}

/// The error a waiter leaving for `why` at `now` is refused with.
fn left_with(w: &Waiter, why: Leaving, now: Instant) -> AdmitError {
    let waited = now.saturating_duration_since(w.asked_at);
    match why {
        Leaving::Cancelled | Leaving::Abandoned => AdmitError::Cancelled {
            job: w.ctx.id(),
            waited,
        },
        Leaving::Expired => AdmitError::TimedOut {
            job: w.ctx.id(),
            waited,
            timeout: w.timeout.unwrap_or(Duration::ZERO),
        },
    }
}

/// True when `at` is an instant that comes before the wake-up `planned` by the last pass
/// (`None` planned: only an event would wake the evaluator, so any instant comes first).
fn before_planned(at: Option<Instant>, planned: Option<Instant>) -> bool {
    match (at, planned) {
        (None, _) => false,
        (Some(at), Some(planned)) => at < planned,
        (Some(_), None) => true,
    }
}

/// The hasher of the `watched` map, whose keys are account addresses: one multiply (Fibonacci
/// hashing, high bits first) is hash enough, and the lookup runs on every admit that parks.
#[derive(Default, Clone, Copy)]
struct AddressHasher(u64);

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
