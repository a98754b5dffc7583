//! The [`Account`] contract: what every limit must answer, and the few types it answers with.
//!
//! An account answers questions about amounts and moves its own counters; it never parks anyone.
//! Waiting belongs to the monitor alone, which asks every account of a demand under one exclusion
//! (Reed and Kanodia's simultaneous P: a blocking acquire on any one limit would be a wait inside
//! the very exclusion that taking several limits at once needs).

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use serde::Serialize;

use crate::amount::Amount;
use crate::clock::{Clock, Instant, Reading, WakeFn};
use mute::{muted, wake_key};

/// How an account gets its capacity back.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Replenishment {
    /// Capacity returns when the job gives it back ([`Grant::release`](crate::Grant::release)):
    /// connection pools, concurrency permits.
    Release,
    /// Capacity returns as time passes (rate windows, token buckets). A release gives nothing back;
    /// only a rollback does.
    Time,
}

/// What kind of limit an account is: a short, stable, machine-readable name.
///
/// Each family names its own (the counting gate's is `semaphore`, the token bucket's
/// `token_bucket`, ...), as a third party names its own, with [`Category::custom`].
#[derive(Copy, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Category(&'static str);

impl Category {
    /// A category of the caller's own.
    pub const fn custom(name: &'static str) -> Category {
        Category(name)
    }

    /// The category's name.
    pub const fn as_str(&self) -> &'static str {
        self.0
    }
}

impl fmt::Debug for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// What kind of "never" a [`Refusal`] is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// The amount asked is more than the account can ever hold as configured.
    TooLarge {
        /// What the demand asked of this account.
        asked: Amount,
        /// The most the account can ever grant at once.
        max: Amount,
    },
    /// The account refuses everyone for now (an open circuit) and expects to accept again in
    /// about `retry_after`.
    RefusingAll {
        /// When to try again.
        retry_after: Duration,
    },
    /// Another reason, in the account's own words.
    Other,
}

/// An account's "never": the asking amount can never fit, or the account refuses everyone now.
///
/// The message is meant for whoever chose the demand, possibly a model choosing tools, so it says
/// what was asked, what the limit is and what to do instead. The monitor adds the account's name.
/// [`kind`](Refusal::kind) carries the same facts as values.
#[derive(Clone, Debug)]
pub struct Refusal {
    /// Boxed: a refusal is rare, and the errors that carry one stay small.
    inner: Box<RefusalInner>,
}

#[derive(Clone, Debug)]
struct RefusalInner {
    kind: RefusalKind,
    message: String,
    cause: Option<Arc<dyn Error + Send + Sync + 'static>>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.message)
    }
}

impl Error for Refusal {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.inner
            .cause
            .as_deref()
            .map(|cause| cause as &(dyn Error + 'static))
    }
}

impl Refusal {
    /// A refusal in the account's own words ([`RefusalKind::Other`]): the demand can never fit
    /// this account as configured.
    pub fn new(message: impl Into<String>) -> Refusal {
        Refusal::of(RefusalKind::Other, message.into())
    }

    fn of(kind: RefusalKind, message: String) -> Refusal {
        Refusal {
            inner: Box::new(RefusalInner {
                kind,
                message,
                cause: None,
            }),
        }
    }

    /// `asked` is more than the `max` the account can ever grant at once
    /// ([`RefusalKind::TooLarge`]). The message names both; replace it with
    /// [`with_message`](Refusal::with_message) to say more.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{Amount, Refusal, RefusalKind};
    ///
    /// let refusal = Refusal::too_large(Amount::units(20), Amount::units(16));
    /// assert_eq!(
    ///     refusal.kind(),
    ///     RefusalKind::TooLarge { asked: Amount::units(20), max: Amount::units(16) }
    /// );
    /// assert_eq!(refusal.to_string(), "asks 20, more than the 16 it can ever grant at once");
    /// ```
    pub fn too_large(asked: Amount, max: Amount) -> Refusal {
        Refusal::of(
            RefusalKind::TooLarge { asked, max },
            format!("asks {asked}, more than the {max} it can ever grant at once"),
        )
    }

    /// A refusal that holds for now only ([`RefusalKind::RefusingAll`]): the account refuses
    /// everyone (a circuit breaker's cooldown) and expects to accept again in about
    /// `retry_after`. The job is still refused rather than parked: waiting in the line behind
    /// an outage would hold the line for nothing, so the caller decides whether to retry later
    /// or go elsewhere.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::Refusal;
    ///
    /// let open = Refusal::temporary("upstream down", Duration::from_secs(30));
    /// assert!(!open.is_permanent());
    /// assert_eq!(open.retry_after(), Some(Duration::from_secs(30)));
    /// assert!(Refusal::new("never fits").is_permanent());
    /// ```
    pub fn temporary(message: impl Into<String>, retry_after: Duration) -> Refusal {
        Refusal::of(RefusalKind::RefusingAll { retry_after }, message.into())
    }

    /// Replaces the message, keeping the kind.
    pub fn with_message(mut self, message: impl Into<String>) -> Refusal {
        self.inner.message = message.into();
        self
    }

    /// What kind of refusal this is, with its numbers.
    pub fn kind(&self) -> RefusalKind {
        self.inner.kind
    }

    /// For a [`temporary`](Refusal::temporary) refusal, when the account expects to accept
    /// again; `None` for a demand that can never fit.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.inner.kind {
            RefusalKind::RefusingAll { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// True for a demand that can never fit as the account is configured; false for a
    /// [`temporary`](Refusal::temporary) refusal.
    pub fn is_permanent(&self) -> bool {
        self.retry_after().is_none()
    }

    /// Attaches the underlying error (an upstream failure, a bug in the account).
    pub fn with_cause(mut self, cause: impl Error + Send + Sync + 'static) -> Refusal {
        self.inner.cause = Some(Arc::new(cause));
        self
    }

    /// The readable message.
    pub fn message(&self) -> &str {
        &self.inner.message
    }
}

/// Who asks an account, whether to take, and when.
///
/// The monitor asks each account of a demand once per attempt. The head of the line (or a job
/// meeting an empty line) asks with [`Ask::HEAD`]: a privilege reserved to the head, such as the
/// elastic window's one probe, is its to use. A waiter behind the head asks with
/// [`Ask::behind`] and the head's amount on this account, which it must leave (EASY
/// backfilling's reservation; [`Amount::ZERO`] when the head does not use this account, which
/// does not make the asker the head): [`head_reserved`](Ask::head_reserved). On a monitor with
/// priority levels ([`Levels`](crate::Levels)), an asker also leaves the other levels' reserves
/// on the account, the head too. [`reserved_ahead`](Ask::reserved_ahead) is everything to leave:
/// what an account compares with its room. Once one account of a demand says "not now", the
/// monitor asks the rest with [`look`](Ask::look), so that it learns every account the job is
/// short on without taking from them.
///
/// **When.** An ask happens at one instant, the same for every account of the demand: the
/// monitor's [`Reading`], read at most once however many accounts need it. An account that
/// needs the time takes it from [`now`](Ask::now) (never from its own clock while an instant is
/// given), and answers a "not now" with a deadline counted from it; one that only stamps
/// activity takes [`coarse_now`](Ask::coarse_now), which reads nothing when no instant was read
/// yet. An ask made outside a monitor ([`Ask::HEAD`] called directly, as tests do) carries no
/// instant, and both read the clock the account passes in; [`at`](Ask::at) fixes one.
///
/// # Examples
///
/// ```
/// use admission_core::{Amount, Ask, Clock, Instant, Reading, SystemClock};
///
/// let clock = SystemClock::new();
/// // Asked directly: the account's own clock tells the time.
/// assert!(Ask::HEAD.now(&clock) <= clock.now());
/// // A fixed instant wins over any clock.
/// let at = Instant::from_nanos(5);
/// assert_eq!(Ask::HEAD.at(at).now(&clock), at);
/// // A monitor's reading: read once, shared by every account asked with it.
/// let reading = Reading::new(&clock);
/// let ask = Ask::behind(Amount::units(2)).with(&reading);
/// assert_eq!(ask.now(&clock), reading.taken().unwrap());
/// ```
#[derive(Copy, Clone)]
pub struct Ask<'a> {
    /// Everything to leave aside: the head's amount and the other levels' reserves.
    reserved_ahead: Amount,
    /// The head's amount alone.
    head_reserved: Amount,
    head: bool,
    take: bool,
    at: At<'a>,
}

/// Where an [`Ask`]'s instant comes from.
#[derive(Copy, Clone)]
enum At<'a> {
    /// None given: the account's own clock.
    Own,
    /// A fixed instant.
    Fixed(Instant),
    /// A monitor's reading, read at most once.
    Reading(&'a Reading<'a>),
}

impl Ask<'static> {
    /// The head of the line asks, and takes if it fits.
    pub const HEAD: Ask<'static> = Ask {
        reserved_ahead: Amount::ZERO,
        head_reserved: Amount::ZERO,
        head: true,
        take: true,
        at: At::Own,
    };

    /// A waiter behind the head asks, leaving `reserved_ahead` (the head's amount on this
    /// account) aside, and takes if it fits.
    pub const fn behind(reserved_ahead: Amount) -> Ask<'static> {
        Ask {
            reserved_ahead,
            head_reserved: reserved_ahead,
            head: false,
            take: true,
            at: At::Own,
        }
    }
}

impl<'a> Ask<'a> {
    /// The same question, leaving `reserves` (other priority levels') aside as well.
    pub(crate) const fn also_leaving(self, reserves: Amount) -> Ask<'a> {
        Ask {
            reserved_ahead: self.reserved_ahead.saturating_add(reserves),
            ..self
        }
    }

    /// The same question, answered without taking anything: [`Answer::Taken`] then means "it
    /// would have been taken", and nothing changed.
    pub const fn look(self) -> Ask<'a> {
        Ask {
            take: false,
            ..self
        }
    }

    /// The same question asked at `instant`.
    pub const fn at(self, instant: Instant) -> Ask<'a> {
        Ask {
            at: At::Fixed(instant),
            ..self
        }
    }

    /// The same question asked at `reading`'s instant (read when the first account needs it).
    pub fn with<'b>(self, reading: &'b Reading<'b>) -> Ask<'b> {
        Ask {
            reserved_ahead: self.reserved_ahead,
            head_reserved: self.head_reserved,
            head: self.head,
            take: self.take,
            at: At::Reading(reading),
        }
    }

    /// What the asker must leave on this account: the head's amount, plus, on a monitor with
    /// priority levels, the other levels' reserves. An account fits `mine` only with this much
    /// room beside it.
    pub const fn reserved_ahead(&self) -> Amount {
        self.reserved_ahead
    }

    /// The head's amount on this account alone ([`Amount::ZERO`] for the head itself, and when
    /// the head does not use the account): what says whether the head needs this account, as
    /// the elastic window's probe asks.
    pub const fn head_reserved(&self) -> Amount {
        self.head_reserved
    }

    /// True when the asker is the head of the line (or meets an empty one).
    pub const fn is_head(&self) -> bool {
        self.head
    }

    /// True when a fitting amount is to be taken; false for a [`look`](Ask::look).
    pub const fn takes(&self) -> bool {
        self.take
    }

    /// The instant this question is asked at: the one given (a monitor's reading, read now if
    /// no account of the demand has read it yet, or a fixed instant), else `own`'s reading.
    /// Deadlines in a "not now" count from it.
    #[inline]
    pub fn now(&self, own: &dyn Clock) -> Instant {
        match self.at {
            At::Own => own.now(),
            At::Fixed(at) => at,
            At::Reading(reading) => reading.get(),
        }
    }

    /// The instant to within about a millisecond, for an activity stamp: the given instant when
    /// it is known, else a [coarse reading](Clock::coarse_now) (of the monitor's clock, or of
    /// `own` for an ask that gives none), which a clock may answer more cheaply than an exact
    /// one (the system clock answers it exactly: the library keeps no clock thread).
    #[inline]
    pub fn coarse_now(&self, own: &dyn Clock) -> Instant {
        match self.at {
            At::Own => own.coarse_now(),
            At::Fixed(at) => at,
            At::Reading(reading) => reading.coarse(),
        }
    }
}

impl fmt::Debug for Ask<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Ask");
        d.field("reserved_ahead", &self.reserved_ahead)
            .field("head_reserved", &self.head_reserved)
            .field("head", &self.head)
            .field("take", &self.take);
        match self.at {
            At::Own => d.field("at", &"own clock"),
            At::Fixed(at) => d.field("at", &at),
            At::Reading(reading) => d.field("at", reading),
        };
        d.finish()
    }
}

/// Two asks are the same question when they agree on who asks and whether to take; when they
/// are asked is not compared.
impl PartialEq for Ask<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.reserved_ahead == other.reserved_ahead
            && self.head_reserved == other.head_reserved
            && self.head == other.head
            && self.take == other.take
    }
}

impl Eq for Ask<'_> {}

/// An account's one answer to an [`Ask`], as governor's `check_n` answers: yes, not until, or
/// never.
#[derive(Clone, Debug)]
#[must_use = "an answer of Taken means the account was debited"]
pub enum Answer {
    /// It fits and was taken: the account was debited by exactly the amount asked (for a
    /// [`look`](Ask::look): it would have been, and nothing changed).
    Taken,
    /// Not now; nothing changed. `Some(instant)`: the earliest instant at which time alone could
    /// make it fit (an instant in the past means "ask again now"); `None`: only an event (a give,
    /// a capacity change) can. A demand that fits the account alone but not beside the head's
    /// reservation is "not now", never a refusal.
    NotNow(Option<Instant>),
    /// Never, as the account is now; nothing changed. The job is refused at once.
    Never(Refusal),
}

impl Answer {
    /// True for [`Answer::Taken`].
    pub fn is_taken(&self) -> bool {
        matches!(self, Answer::Taken)
    }

    /// For [`Answer::NotNow`], the instant time alone could change it (`Some(None)`: only an
    /// event); `None` for the other answers.
    pub fn not_now(&self) -> Option<Option<Instant>> {
        match self {
            Answer::NotNow(at) => Some(*at),
            _ => None,
        }
    }

    /// For [`Answer::Never`], the refusal.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Answer::Never(refusal) => Some(refusal),
            _ => None,
        }
    }
}

/// A point-in-time status record of one account: serializable, with a one-line summary.
///
/// Each family ships its own record (see `admission-events`); the trait is what the monitor and
/// dashboards need of any of them.
pub trait AccountStatus: erased_serde::Serialize + fmt::Debug + Send + Sync {
    /// The account's name.
    fn name(&self) -> &str;
    /// The account's category.
    fn category(&self) -> Category;
    /// `None` when nominal, else a short word such as `blocked`, `probing`, `throttle:2.0x`.
    fn indicator(&self) -> Option<String> {
        None
    }
    /// One line naming the numbers, for logs.
    fn summary(&self) -> String;
}

erased_serde::serialize_trait_object!(AccountStatus);

/// A limit that a demand can draw from.
///
/// An account answers about amounts and moves counters; **it never blocks**. The monitor calls
/// every method below while holding its own lock, so each must return promptly and must not call
/// back into the monitor.
///
/// The monitor asks an account one question per attempt, [`ask`](Account::ask), and gets one
/// [`Answer`] (as governor's `check_n` answers):
/// - [`Answer::Taken`]: it fits, and was debited.
/// - [`Answer::NotNow`]: not now, with the earliest instant time alone could change that (or
///   none: only an event can). `mine` fits the configuration but not the present level together
///   with the head's reservation; the job waits.
/// - [`Answer::Never`]: `mine` exceeds what the account can ever hold, or the account is
///   refusing everyone (an open circuit). The job is refused at once instead of parking forever.
///
/// [`Ask`] says who asks: the head of the line, or a waiter behind it that must leave the head's
/// amount on this account aside (EASY backfilling's head reservation), and whether to take or
/// only [`look`](Ask::look).
///
/// The test-kit's contract suite (`admission_testkit::contract`) checks every rule here against any
/// implementation in a few lines.
pub trait Account: Send + Sync + 'static {
    /// A stable name; events and wait times are keyed by it.
    fn name(&self) -> &str;

    /// What kind of limit this is.
    fn category(&self) -> Category;

    /// How capacity comes back. Deliberately without a default: every account must say.
    fn replenishment(&self) -> Replenishment;

    /// What the account holds when full, as configured now (a bucket's tokens and requests, a
    /// window's limit, a pool's size), if it knows; `None` (the default) if it does not. On a
    /// [`Replenishment::Time`] account it is what lets a priority level with a reserve there
    /// take its share while a higher level waits for the refill
    /// ([`Level::reserve`](crate::Level::reserve)), dimension by dimension. The contract suite
    /// holds it to exactly what a fresh account grants at once.
    fn capacity(&self) -> Option<Amount> {
        None
    }

    /// The one question: does `mine` fit now, as `ask` says who asks, and if so (and
    /// [`ask.takes()`](Ask::takes)) take it, in one step under the account's own lock. "Now" is
    /// the instant the ask carries: an account that needs the time reads
    /// [`ask.now(&clock)`](Ask::now), never its clock directly, so that every account of a
    /// demand answers for the same instant and the clock is read once.
    ///
    /// On [`Answer::Taken`] for a taking ask the account has been debited by exactly `mine`;
    /// every other answer, and every answer to a look, changes nothing.
    fn ask(&self, mine: Amount, ask: Ask) -> Answer;

    /// Credits `amount` back: at release for [`Replenishment::Release`] accounts, at rollback and
    /// as compensation for every account. A give that grows capacity calls the wake slot.
    fn give(&self, amount: Amount);

    /// A status record read at this instant.
    fn status(&self) -> Box<dyn AccountStatus>;

    /// `None` when nominal, else a short word (`blocked`, `probing`, `throttle:<n>x`).
    fn status_indicator(&self) -> Option<String> {
        None
    }

    /// Installs (`Some`) or clears (`None`) the one callback this account calls whenever its
    /// capacity grows. The monitor installs its wake-up here; a later install replaces an earlier
    /// one. [`WakeSlot`] implements the slot for you.
    fn on_capacity_change(&self, wake: Option<WakeFn>);

    /// Clears the wake slot only if it still holds `wake` (the same `Arc`): a monitor that stops
    /// takes back its own callback and never one that another monitor sharing this account
    /// installed since. [`WakeSlot::clear_if`] does it for you.
    ///
    /// The default keeps the callback, which is harmless (a stopped monitor's callback wakes
    /// nobody) but holds it until the next install; every account built on a [`WakeSlot`]
    /// should forward here.
    fn forget_capacity_change(&self, wake: &WakeFn) {
        let _ = wake;
    }

    /// A capability this account stands for, if any (the HTTP connection gate provides
    /// [`Capability::HTTP_CONNECTION`]).
    fn provides(&self) -> Option<Capability> {
        None
    }

    /// A capability that must be provided by another account of the same demand (a provider's
    /// rate window requires [`Capability::HTTP_CONNECTION`]: a call cannot be made without a
    /// connection). A demand that lacks it is refused at once with
    /// [`AdmitError::Unmet`](crate::AdmitError::Unmet).
    ///
    /// A demand reads it once, when the account is added, and remembers whether any of its
    /// accounts requires something (so that most admissions check nothing): the answer must
    /// not change over the account's life.
    fn requires(&self) -> Option<Capability> {
        None
    }
}

/// Something an account stands for, so that another account can require it in the same demand.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(transparent)]
pub struct Capability(&'static str);

impl Capability {
    /// A connection to an upstream over HTTP.
    pub const HTTP_CONNECTION: Capability = Capability("http_connection");

    /// A capability of the caller's own.
    pub const fn custom(name: &'static str) -> Capability {
        Capability(name)
    }

    /// Its name.
    pub const fn as_str(&self) -> &'static str {
        self.0
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for dyn Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("name", &self.name())
            .field("category", &self.category())
            .finish_non_exhaustive()
    }
}

/// A shared handle to any account: what a [`Demand`](crate::Demand) holds.
pub type AccountRef = Arc<dyn Account>;

/// The one wake slot an account holds for the monitor.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use admission_core::WakeSlot;
///
/// let slot = WakeSlot::new();
/// let calls = Arc::new(AtomicUsize::new(0));
/// let seen = calls.clone();
/// slot.install(Some(Arc::new(move || { seen.fetch_add(1, Ordering::SeqCst); })));
/// slot.notify();
/// slot.install(None);
/// slot.notify();
/// assert_eq!(calls.load(Ordering::SeqCst), 1);
/// ```
#[derive(Default)]
pub struct WakeSlot {
    /// The installed callback. Only cloned, stored and taken under this lock: it is called and
    /// dropped after the lock is released.
    wake: parking_lot::Mutex<Option<WakeFn>>,
    /// The installed callback's address (0: none), written under the lock: lets a give the
    /// monitor is already answering (its grant's release, an attempt's give-back) skip the lock.
    key: AtomicUsize,
}

impl WakeSlot {
    /// An empty slot.
    pub fn new() -> WakeSlot {
        WakeSlot::default()
    }

    /// Installs or clears the callback. The callback it replaces is dropped after the slot's
    /// lock is released.
    pub fn install(&self, wake: Option<WakeFn>) {
        let replaced = {
            let mut slot = self.wake.lock();
            self.key
                .store(wake.as_ref().map_or(0, wake_key), AtomicOrdering::Release);
            std::mem::replace(&mut *slot, wake)
        };
        drop(replaced);
    }

    /// Clears the slot if it holds `wake` (compared by address, [`Arc::ptr_eq`]); returns
    /// whether it did. A callback installed by someone else since is left alone.
    pub fn clear_if(&self, wake: &WakeFn) -> bool {
        let cleared = {
            let mut slot = self.wake.lock();
            if !slot.as_ref().is_some_and(|held| Arc::ptr_eq(held, wake)) {
                return false;
            }
            self.key.store(0, AtomicOrdering::Release);
            slot.take()
        };
        drop(cleared);
        true
    }

    /// True when a callback is installed.
    pub fn is_installed(&self) -> bool {
        self.wake.lock().is_some()
    }

    /// Calls the callback, if any. Safe to call while holding the account's own lock.
    ///
    /// The callback runs after the slot's lock is released (the slot hands out a reference
    /// count to it), so a callback may install into this same slot, and one that a concurrent
    /// [`install`](WakeSlot::install) replaces may still be called once by a notify that began
    /// before it. A give that a monitor makes while it is already looking at its line
    /// (releasing a grant, giving back an attempt) calls nothing and takes no lock when the slot
    /// holds that monitor's own callback, which it mutes on that thread for the duration, or
    /// holds none: the monitor looks at its line right after such gives, and the slot knows the
    /// callback it holds by address.
    pub fn notify(&self) {
        let muted = muted();
        if muted != 0 {
            let key = self.key.load(AtomicOrdering::Acquire);
            if key == muted || key == 0 {
                return;
            }
        }
        let wake = self.wake.lock().clone();
        if let Some(wake) = wake {
            wake();
        }
    }
}

impl fmt::Debug for WakeSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeSlot")
            .field("installed", &self.is_installed())
            .finish()
    }
}

/// The address of an account, for identity comparisons (two handles to one account are equal).
pub(crate) fn account_key(account: &AccountRef) -> usize {
    Arc::as_ptr(account) as *const () as usize
}

/// Muting a wake-up callback on this thread: how a monitor's hand-off keeps the accounts it gives
/// back to from waking its own evaluator.
///
/// A thread that gives a grant back runs that monitor's pass right after (`Owner::settle` in
/// `monitor/shell.rs`), and the pass covers every waiter of that monitor; the wake-ups the
/// accounts send while taking the give (through their [`WakeSlot`]s) would only wake its
/// evaluator for a second, useless pass. So the giver names that monitor's callback, by key, as
/// muted on its thread for the time of the give, and a [`WakeSlot::notify`] holding that very
/// callback skips the call. Another monitor's callback, reached through an account the two share,
/// is not muted.
///
/// It sits on the account side of the crate, beside the wake slot that reads it; the monitor's
/// engine (the evaluator's doorbell) sets it.
pub(crate) mod mute {
    use std::cell::Cell;

    use crate::clock::WakeFn;

    #[cfg(not(admission_loom))]
    std::thread_local! {
        /// The key ([`wake_key`]) of the callback muted on this thread; 0 for none. Initialized
        /// constantly, so a read is one load (no first-use check).
        static MUTED: Cell<usize> = const { Cell::new(0) };
    }

    #[cfg(admission_loom)]
    loom::thread_local! {
        // loom's `thread_local!` does not accept the `const` form.
        #[allow(clippy::missing_const_for_thread_local)]
        static MUTED: Cell<usize> = Cell::new(0);
    }

    /// The callback of one key muted on this thread while this guard lives; the key muted before is
    /// muted again when it is dropped, even while a panic unwinds.
    #[must_use = "the callback is muted only while the guard lives"]
    pub(crate) struct Muted(usize);

    impl Muted {
        /// Mutes the callback of key `key` on this thread.
        #[inline]
        pub(crate) fn on(key: usize) -> Muted {
            Muted(MUTED.with(|m| m.replace(key)))
        }
    }

    impl Drop for Muted {
        #[inline]
        fn drop(&mut self) {
            let previous = self.0;
            MUTED.with(|m| m.set(previous));
        }
    }

    /// The key of the callback muted on this thread (0: none).
    pub(crate) fn muted() -> usize {
        MUTED.with(|m| m.get())
    }

    /// A wake-up callback's key: its address.
    pub(crate) fn wake_key(wake: &WakeFn) -> usize {
        std::sync::Arc::as_ptr(wake) as *const () as usize
    }
}
