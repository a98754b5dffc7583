//! When a refused request may try again: [`RetryAfter`] (known or estimated), the
//! [`RetryEstimate`] settings, and the drain the layer measures to estimate from; and when a
//! request is not let into the line at all ([`LineBound`], refused with [`LineFull`]).

use std::fmt;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Waker};
use std::time::Duration;

use admission_core::{Clock, Grant, Instant};

use crate::line::{Line, Shed};

/// When a refused request may try again, and where the figure comes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RetryAfter {
    /// Whoever refused knows: an open circuit's cooldown, a quota's reset.
    Known(Duration),
    /// The layer's estimate, for a refusal by the monitor's line that carries no instant of its
    /// own (see [`RetryEstimate`]). Always whole seconds, at least one.
    Estimated(Duration),
}

impl RetryAfter {
    /// The wait, whichever its source.
    pub fn duration(self) -> Duration {
        match self {
            RetryAfter::Known(after) | RetryAfter::Estimated(after) => after,
        }
    }

    /// True for [`RetryAfter::Estimated`].
    pub fn is_estimate(self) -> bool {
        matches!(self, RetryAfter::Estimated(_))
    }
}

/// How the layer estimates when to retry a refusal that has no exact instant, set with
/// [`AdmissionLayer::retry_estimate`](crate::AdmissionLayer::retry_estimate).
///
/// A request that timed out in the monitor's line, whose job was cancelled, or that met a
/// stopped or failing monitor is refused without any account saying when things get better
/// (`AdmitError::retry_after` is `None`). For those refusals, and for a request shed by a
/// [`LineBound::Waiters`] bound (and only those: a quota without a known reset and a demand
/// that can never fit get no estimate; a request shed by [`LineBound::ExpectedWait`] is told its
/// own expected wait, within step 4's bounds) the layer works out how long the line it leaves
/// behind takes to drain, from what it sees itself:
///
/// 1. **Completions.** Every grant the layer held going back (the response body ended, failed or
///    was dropped, or the inner service failed) is counted on the monitor's clock. The count
///    covers the last [`window`](RetryEstimate::window), kept in ten buckets of a tenth of it
///    each (so it covers between nine tenths of the window and all of it), and no more than the
///    time since the layer was built.
/// 2. **Waiting.** How many of the layer's requests were waiting for their grant when this one
///    was refused, itself included.
/// 3. **Drain.** With `c` completions over that span `s`, the estimate is `waiting × s / c`: the
///    time the layer's waiters take to be served at the measured rate, which a retry, joining
///    the line at its back, waits behind. With no completion in the span nothing is draining,
///    and the estimate is how long the refused request itself waited.
/// 4. **Bounds.** The result is raised to [`floor`](RetryEstimate::floor), lowered to
///    [`ceiling`](RetryEstimate::ceiling) (the ceiling wins if the two cross), then rounded up
///    to whole seconds, never below one.
///
/// Jobs admitted on the same monitor by anything but this layer are not counted, neither as
/// waiting nor as completions.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_tower::RetryEstimate;
///
/// let estimate = RetryEstimate::new()
///     .floor(Duration::from_secs(2))
///     .ceiling(Duration::from_secs(30))
///     .window(Duration::from_secs(20));
/// assert_eq!(estimate.get_floor(), Duration::from_secs(2));
/// assert_eq!(RetryEstimate::default().get_floor(), Duration::from_secs(1));
/// assert_eq!(RetryEstimate::default().get_ceiling(), Duration::from_secs(60));
/// assert_eq!(RetryEstimate::default().get_window(), Duration::from_secs(10));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RetryEstimate {
    floor: Duration,
    ceiling: Duration,
    window: Duration,
}

impl RetryEstimate {
    /// The defaults: a floor of 1 s, a ceiling of 60 s, a window of 10 s.
    pub const fn new() -> RetryEstimate {
        RetryEstimate {
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(60),
            window: Duration::from_secs(10),
        }
    }

    /// The shortest estimate (default 1 s). Below one second it still rounds up to 1.
    pub const fn floor(mut self, floor: Duration) -> RetryEstimate {
        self.floor = floor;
        self
    }

    /// The longest estimate (default 60 s); it wins over the floor if the two cross.
    pub const fn ceiling(mut self, ceiling: Duration) -> RetryEstimate {
        self.ceiling = ceiling;
        self
    }

    /// How far back completions are counted (default 10 s). A longer window steadies the
    /// measured rate; a shorter one follows a change of pace sooner. Zero counts nothing, so
    /// every estimate is then the refused request's own wait.
    pub const fn window(mut self, window: Duration) -> RetryEstimate {
        self.window = window;
        self
    }

    /// The floor.
    pub const fn get_floor(&self) -> Duration {
        self.floor
    }

    /// The ceiling.
    pub const fn get_ceiling(&self) -> Duration {
        self.ceiling
    }

    /// The window.
    pub const fn get_window(&self) -> Duration {
        self.window
    }

    /// Steps 3 and 4 of the computation: `waiting` requests, `completions` over `span`, the
    /// refused request having waited `waited`.
    fn compute(
        &self,
        waiting: u64,
        completions: u64,
        span: Duration,
        waited: Duration,
    ) -> Duration {
        let raw = if completions == 0 {
            waited
        } else {
            let nanos = u128::from(waiting.max(1)) * span.as_nanos() / u128::from(completions);
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        };
        self.bounded(raw)
    }

    /// Step 4 alone: `raw` raised to the floor, lowered to the ceiling, in whole seconds.
    fn bounded(&self, raw: Duration) -> Duration {
        let bounded = raw.max(self.floor).min(self.ceiling);
        Duration::from_secs(crate::Refused::whole_seconds(bounded))
    }
}

impl Default for RetryEstimate {
    fn default() -> RetryEstimate {
        RetryEstimate::new()
    }
}

/// When the layer refuses a request at once instead of letting it wait, set with
/// [`AdmissionLayer::shed`](crate::AdmissionLayer::shed).
///
/// Without a bound every request joins the monitor's line and, under an overload, most wait the
/// whole timeout only to be refused: the client learns nothing for that long and holds a
/// connection for it. With one, a request that arrives when the line ahead of it is already
/// too long is refused before it waits ([`Reason::Shed`](crate::Reason::Shed), HTTP 503 and
/// gRPC `UNAVAILABLE`, with `Retry-After`), unless the monitor can grant its whole demand at
/// that moment, and a demand that can never fit is refused as such (413 or 422, never 503).
///
/// Only the layer's own requests count: jobs admitted on the same monitor by anything else are
/// neither waiters nor grants of this line. The count is exact: the check and the joining are
/// one step under the layer's lock.
///
/// # Examples
///
/// ```
/// use std::num::NonZeroU64;
/// use std::time::Duration;
/// use admission_tower::LineBound;
///
/// // Shed what would time out anyway: the line ahead takes longer than 4.5 s, with a 5 s
/// // timeout (the half second keeps a grant due at the end clear of the timeout).
/// let bound = LineBound::ExpectedWait(Duration::from_millis(4_500));
/// // Or at most 100 waiting requests, whatever the pace.
/// let bound = LineBound::Waiters(NonZeroU64::new(100).unwrap());
/// # let _ = bound;
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LineBound {
    /// At most this many of the layer's requests wait: one that arrives while this many wait is
    /// refused, with the layer's [`RetryEstimate`] as `Retry-After`.
    Waiters(NonZeroU64),
    /// The line ahead may take at most this long: a request is refused when it is expected to
    /// wait longer than this for its grant, at the pace the layer measures on its own line.
    ///
    /// **The pace.** The layer times the intervals between grants to its requests that had to
    /// wait, counting only the time someone waited (an average that takes a slower interval at
    /// once and a faster one over about eight grants; a request granted at once is no measure
    /// of the line, so a burst the accounts' stock served does not make an empty bucket look
    /// fast), and the *gap*: how long its waiters have now gone without anyone being served.
    /// Behind `w` waiters a request expects `(w + 1) × I − g` for an interval `I` and a gap
    /// `g ≤ I`, and `(w + 1) × g − I` once the gap is longer than an interval. Before any
    /// interval is known (a cold start) `I` is zero and the waiters' time waited so far is all
    /// there is: the second in line expects twice the gap, and so on. In a stall of the
    /// backend the gap grows until every arrival is refused, the head of an empty line too once
    /// the gap passes the bound; the gap ends at the next grant, including a request the
    /// monitor grants at once while the line is past its bound.
    ///
    /// **Waiters the line can no longer serve in time.** The bound holds for a request's whole
    /// wait, not only on arrival: a request already waiting whose time waited so far and
    /// expected wait together pass the bound (the pace slowed down after it joined: a bucket's
    /// stock ran out, the backend stalled) is refused at once with the same reason, instead of
    /// waiting on towards its timeout. This is looked at from the back of the line whenever one
    /// of the layer's requests arrives, is granted or leaves; the layer starts no timer, so with
    /// no such event a waiter waits on (at most until its timeout).
    ///
    /// A request refused by this bound is told to retry after its own expected wait (within the
    /// [`RetryEstimate`]'s floor and ceiling, in whole seconds): by then the line ahead of it has
    /// been served.
    ///
    /// Set it a little under the layer's [`timeout`](crate::AdmissionLayer::timeout): a request
    /// admitted with a grant due at the very end of its timeout races that timeout.
    ExpectedWait(Duration),
}

impl fmt::Display for LineBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineBound::Waiters(most) => write!(f, "at most {most} waiting"),
            LineBound::ExpectedWait(most) => write!(f, "a line of at most {most:?}"),
        }
    }
}

/// A request refused because the line was past its [`LineBound`]: when it arrived, or, under
/// [`LineBound::ExpectedWait`], while it waited and could no longer be served within the bound.
/// The cause of a [`Reason::Shed`](crate::Reason::Shed) refusal.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_tower::{Cause, Reason, Refused};
///
/// fn log(refused: &Refused) {
///     if let Cause::Shed(full) = refused.cause() {
///         assert_eq!(refused.reason(), Reason::Shed);
///         eprintln!("shed: {full}; retry in {:?}", refused.retry_after());
///     }
/// }
/// # let _ = log;
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{waiting} requests waiting ahead{}, past the bound of {bound}{}", match .expected_wait {
    Some(wait) => format!(", {wait:?} until its grant"),
    None => String::new(),
}, match .waited {
    Some(waited) => format!(" after waiting {waited:?}"),
    None => String::new(),
})]
pub struct LineFull {
    waiting: u64,
    expected_wait: Option<Duration>,
    bound: LineBound,
    waited: Option<Duration>,
}

impl LineFull {
    pub(crate) fn new(waiting: u64, expected_wait: Option<Duration>, bound: LineBound) -> Self {
        LineFull {
            waiting,
            expected_wait,
            bound,
            waited: None,
        }
    }

    /// A waiter shed from the line after waiting `waited`.
    pub(crate) fn after_waiting(mut self, waited: Duration) -> Self {
        self.waited = Some(waited);
        self
    }

    /// How many of the layer's requests were waiting ahead of this one.
    pub fn waiting(&self) -> u64 {
        self.waiting
    }

    /// How long this request was expected to wait for its grant, for an
    /// [`ExpectedWait`](LineBound::ExpectedWait) bound.
    pub fn expected_wait(&self) -> Option<Duration> {
        self.expected_wait
    }

    /// The bound that was passed.
    pub fn bound(&self) -> LineBound {
        self.bound
    }

    /// For a request shed while it waited: how long it had waited (which, with its expected
    /// wait, passed the bound). `None` for a request refused on arrival.
    pub fn waited(&self) -> Option<Duration> {
        self.waited
    }
}

/// How many buckets the window is counted in.
const BUCKETS: usize = 10;

/// Completions in one bucket of the window: `epoch` is the bucket's start in bucket widths
/// since the clock's origin.
#[derive(Copy, Clone, Default)]
struct Bucket {
    epoch: u64,
    count: u64,
}

/// What the layer measures: its completions over the window (for [`RetryEstimate`]), and its
/// line (the waiting requests and their pace, for [`LineBound`]). One per layer, shared by
/// every service it builds.
pub(crate) struct Drain {
    settings: RetryEstimate,
    clock: Arc<dyn Clock>,
    /// The layer's bound.
    bound: Option<LineBound>,
    /// When the layer was built: completions are not looked for before it.
    since: Instant,
    /// One bucket's width in nanoseconds; 0 for a zero window (nothing counted).
    width: u64,
    buckets: Mutex<[Bucket; BUCKETS]>,
    /// The waiting requests, each with the slot its future is told through when it is shed.
    line: Mutex<Line<Arc<Slot>>>,
}

impl Drain {
    /// A drain measured on `clock` from now on, estimating with `settings`, bounding the line
    /// with `bound`.
    pub(crate) fn new(
        clock: Arc<dyn Clock>,
        settings: RetryEstimate,
        bound: Option<LineBound>,
    ) -> Drain {
        let window = u64::try_from(settings.window.as_nanos()).unwrap_or(u64::MAX);
        let since = clock.now();
        Drain {
            settings,
            clock,
            bound,
            since,
            width: window / BUCKETS as u64,
            buckets: Mutex::new([Bucket::default(); BUCKETS]),
            line: Mutex::new(Line::new()),
        }
    }

    /// The settings it estimates with.
    pub(crate) fn settings(&self) -> RetryEstimate {
        self.settings
    }

    /// The clock it measures on.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// One grant of the layer went back now.
    fn completed(&self) {
        if self.width == 0 {
            return;
        }
        let epoch = self.clock.now().as_nanos() / self.width;
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = &mut buckets[(epoch % BUCKETS as u64) as usize];
        if bucket.epoch != epoch {
            *bucket = Bucket { epoch, count: 0 };
        }
        bucket.count = bucket.count.saturating_add(1);
    }

    /// The completions counted now, and the span they were counted over.
    fn completions(&self) -> (u64, Duration) {
        if self.width == 0 {
            return (0, Duration::ZERO);
        }
        let now = self.clock.now();
        let epoch = now.as_nanos() / self.width;
        // The oldest bucket still in the window, and where it starts.
        let oldest = epoch.saturating_sub(BUCKETS as u64 - 1);
        let from = Instant::from_nanos(oldest.saturating_mul(self.width)).max(self.since);
        let buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let count = buckets
            .iter()
            .filter(|b| (oldest..=epoch).contains(&b.epoch))
            .map(|b| b.count)
            .fold(0, u64::saturating_add);
        (count, now.saturating_duration_since(from))
    }

    /// How many of the layer's requests wait now.
    fn waiting_now(&self) -> u64 {
        self.lock_line().len() as u64
    }

    /// The estimate for a request refused now after waiting `waited` (see [`RetryEstimate`]).
    pub(crate) fn estimate(&self, waited: Duration) -> Duration {
        let (completions, span) = self.completions();
        let waiting = self.waiting_now();
        self.settings.compute(waiting, completions, span, waited)
    }

    /// The `Retry-After` of a request shed from (or before) the line: its own expected wait
    /// for an [`ExpectedWait`](LineBound::ExpectedWait) bound, within the floor and the
    /// ceiling; the estimate otherwise.
    pub(crate) fn retry_after_shed(&self, full: &LineFull) -> Duration {
        match full.expected_wait() {
            Some(expected) => self.settings.bounded(expected),
            None => self.estimate(Duration::ZERO),
        }
    }

    fn lock_line(&self) -> std::sync::MutexGuard<'_, Line<Arc<Slot>>> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request arriving now: it joins the line ([`Waiting`] until dropped or granted), or
    /// the line is past the layer's bound. Either way, waiters now past the bound are shed.
    pub(crate) fn arrive(self: &Arc<Self>) -> Result<Waiting, LineFull> {
        let slot = Arc::new(Slot::default());
        let (joined, shed) = {
            let mut line = self.lock_line();
            let now = self.clock.now();
            let joined = line.arrive(now, self.bound, slot.clone());
            (joined, line.shed_doomed(now, self.bound))
        };
        wake(shed);
        joined.map(|number| Waiting {
            drain: self.clone(),
            number,
            slot,
            settled: false,
        })
    }

    /// A request that was past the bound was granted at once anyway: the backend serves.
    pub(crate) fn served_at_once(&self) {
        let shed = {
            let mut line = self.lock_line();
            let now = self.clock.now();
            line.served(now);
            line.shed_doomed(now, self.bound)
        };
        wake(shed);
    }

    /// `grant`, counted as a completion when it goes back.
    pub(crate) fn hold(self: &Arc<Self>, grant: Grant) -> Held {
        Held {
            grant,
            drain: self.clone(),
        }
    }

    /// Request `number` was granted (after waiting, or at once) or left the line.
    fn settle(&self, number: u64, granted: Option<bool>) {
        let shed = {
            let mut line = self.lock_line();
            let now = self.clock.now();
            match granted {
                Some(waited) => line.granted(number, now, waited),
                None => line.left(number, now),
            }
            line.shed_doomed(now, self.bound)
        };
        wake(shed);
    }
}

/// Tells each shed waiter, outside the line's lock.
fn wake(shed: Vec<Shed<Arc<Slot>>>) {
    for (slot, full) in shed {
        slot.shed(full);
    }
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("settings", &self.settings)
            .field("bound", &self.bound)
            .field("waiting", &self.waiting_now())
            .finish_non_exhaustive()
    }
}

/// Where the line tells a waiting request's future that it was shed.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    shed: Option<LineFull>,
    waker: Option<Waker>,
}

impl Slot {
    fn shed(&self, full: LineFull) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.shed = Some(full);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A request of the layer in its line: it leaves when dropped, or when granted.
pub(crate) struct Waiting {
    drain: Arc<Drain>,
    number: u64,
    slot: Arc<Slot>,
    /// Granted: it left the line already.
    settled: bool,
}

impl Waiting {
    /// The drain it counts in.
    pub(crate) fn drain(&self) -> &Arc<Drain> {
        &self.drain
    }

    /// Whether the line shed it; if not, `cx`'s waker is told when it does.
    pub(crate) fn poll_shed(&mut self, cx: &Context<'_>) -> Option<LineFull> {
        let mut state = self
            .slot
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(full) = state.shed.take() {
            return Some(full);
        }
        match &state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => state.waker = Some(cx.waker().clone()),
        }
        None
    }

    /// Granted `grant` (after waiting, when `waited`): it leaves the line, and the grant is
    /// held until it goes back.
    pub(crate) fn granted(mut self, grant: Grant, waited: bool) -> Held {
        self.settled = true;
        self.drain.settle(self.number, Some(waited));
        self.drain.hold(grant)
    }
}

impl fmt::Debug for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiting")
            .field("number", &self.number)
            .finish_non_exhaustive()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.settled {
            self.drain.settle(self.number, None);
        }
    }
}

/// A grant the layer holds for a request: released when dropped, and counted as a completion.
pub(crate) struct Held {
    grant: Grant,
    drain: Arc<Drain>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.grant.release();
        self.drain.completed();
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Held").field(&self.grant).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use admission_testkit::FakeClock;

    const SEC: Duration = Duration::from_secs(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_formula_drains_the_waiters_at_the_measured_rate_within_its_bounds() {
        let e = RetryEstimate::new();
        // 6 waiting, 4 completions over 2 s: 2 a second, 3 s to drain.
        assert_eq!(e.compute(6, 4, 2 * SEC, ms(10)), 3 * SEC);
        // Rounded up, never below the floor.
        assert_eq!(e.compute(5, 4, 2 * SEC, ms(10)), 3 * SEC);
        assert_eq!(e.compute(1, 1_000, SEC, ms(10)), SEC);
        // Nothing drained: the request's own wait.
        assert_eq!(e.compute(3, 0, 10 * SEC, ms(4_200)), 5 * SEC);
        assert_eq!(e.compute(3, 0, Duration::ZERO, Duration::ZERO), SEC);
        // The ceiling, and the ceiling over a crossing floor.
        assert_eq!(e.compute(1_000, 1, 10 * SEC, SEC), 60 * SEC);
        let crossed = e.floor(10 * SEC).ceiling(3 * SEC);
        assert_eq!(crossed.compute(1, 100, SEC, SEC), 3 * SEC);
        // A floor under a second still rounds up to one.
        assert_eq!(e.floor(Duration::ZERO).compute(1, 100, SEC, ms(0)), SEC);
        assert_eq!(e.floor(5 * SEC).compute(1, 100, SEC, ms(0)), 5 * SEC);
    }

    /// Over a steady drain of `r` completions a second, `w` waiting requests are estimated at
    /// `w / r`, off by at most one completion at either edge of the counted span (nine tenths
    /// of the window at least, so `n = 9 r` completions), then rounded up: within
    /// `[w/r × n/(n+1), w/r × n/(n−1) + 1 s]`, clamped to the floor and the ceiling.
    #[test]
    fn the_estimate_follows_a_steady_drain() {
        for per_second in [1u64, 2, 5, 20, 250] {
            let clock = FakeClock::new();
            let drain = Arc::new(Drain::new(clock.shared(), RetryEstimate::new(), None));
            let gap = Duration::from_nanos(1_000_000_000 / per_second);
            // 30 s of completions: three windows, so old ones have left the count.
            for _ in 0..30 * per_second {
                clock.advance(gap);
                drain.completed();
            }
            // A moment after the last one, at the drain's own pace.
            clock.advance(gap / 3);
            let n = 9.0 * per_second as f64;
            for waiting in [1u64, 7, 40, 300] {
                let guards: Vec<_> = (0..waiting).map(|_| drain.arrive().unwrap()).collect();
                let got = drain.estimate(Duration::from_secs(5)).as_secs_f64();
                let drains_in = waiting as f64 / per_second as f64;
                let low = (drains_in * n / (n + 1.0)).clamp(1.0, 60.0);
                let high = (drains_in * n / (n - 1.0) + 1.0).clamp(1.0, 60.0);
                assert!(
                    (low..=high).contains(&got),
                    "{waiting} waiting at {per_second}/s: {got} s, not within [{low}, {high}]"
                );
                drop(guards);
            }
        }
    }

    #[test]
    fn old_completions_leave_the_count_and_a_stalled_line_estimates_its_own_wait() {
        let clock = FakeClock::new();
        let drain = Arc::new(Drain::new(clock.shared(), RetryEstimate::new(), None));
        let waiter = drain.arrive().unwrap();
        for _ in 0..20 {
            drain.completed();
            clock.advance(ms(500));
        }
        // At 10 s: 20 completions over 10 s, 1 waiting: half a second, so the floor.
        assert_eq!(drain.estimate(ms(300)), SEC);
        // 15 s later none of them is in the window any more: the request's wait counts.
        clock.advance(15 * SEC);
        assert_eq!(drain.completions().0, 0);
        assert_eq!(drain.estimate(ms(7_500)), 8 * SEC);
        drop(waiter);
        assert_eq!(drain.waiting_now(), 0);
    }

    #[test]
    fn a_zero_window_counts_nothing() {
        let clock = FakeClock::new();
        let settings = RetryEstimate::new().window(Duration::ZERO);
        let drain = Drain::new(clock.shared(), settings, None);
        drain.completed();
        clock.advance(SEC);
        assert_eq!(drain.completions(), (0, Duration::ZERO));
        assert_eq!(drain.estimate(ms(2_500)), 3 * SEC);
    }

    #[test]
    fn the_line_bound_counts_the_waiters_and_sheds_one_it_can_no_longer_serve_in_time() {
        let clock = FakeClock::new();
        let three = Some(LineBound::Waiters(NonZeroU64::new(3).unwrap()));
        let drain = Arc::new(Drain::new(clock.shared(), RetryEstimate::new(), three));
        let mut guards: Vec<_> = (0..3).map(|_| drain.arrive().unwrap()).collect();
        let full = drain.arrive().unwrap_err();
        assert_eq!((full.waiting(), full.expected_wait()), (3, None));
        assert_eq!(
            full.to_string(),
            "3 requests waiting ahead, past the bound of at most 3 waiting"
        );
        // Nothing completed: the floor.
        assert_eq!(drain.retry_after_shed(&full), SEC);
        guards.pop();
        assert_eq!(drain.arrive().map(|_| ()), Ok(()));

        // A line of at most 5 s: nothing known of the pace, two wait; at 2.5 s the second,
        // having waited 1.5 s, expects 5 s more and is shed at the next arrival, which itself
        // expects 7.5 s and is refused.
        let bound = Some(LineBound::ExpectedWait(5 * SEC));
        let drain = Arc::new(Drain::new(clock.shared(), RetryEstimate::new(), bound));
        let mut first = drain.arrive().unwrap();
        clock.advance(SEC);
        let mut second = drain.arrive().unwrap();
        let waker = std::task::Waker::noop();
        let cx = Context::from_waker(waker);
        assert_eq!(second.poll_shed(&cx), None);
        clock.advance(ms(1_500));
        let full = drain.arrive().unwrap_err();
        assert_eq!(full.expected_wait(), Some(ms(7_500)));
        assert_eq!(drain.retry_after_shed(&full), 8 * SEC);
        let shed = second.poll_shed(&cx).expect("shed");
        assert_eq!(
            shed.to_string(),
            "1 requests waiting ahead, 5s until its grant, past the bound of a line of at most \
             5s after waiting 1.5s"
        );
        assert_eq!(first.poll_shed(&cx), None);
        assert_eq!(drain.waiting_now(), 1);
        drop(second);
        assert_eq!(drain.waiting_now(), 1);
        drop(first);
        assert_eq!(drain.waiting_now(), 0);
    }

    #[test]
    fn the_public_types_are_send_and_sync() {
        fn is<T: Send + Sync>() {}
        is::<RetryAfter>();
        is::<RetryEstimate>();
        is::<LineBound>();
        is::<LineFull>();
        is::<Drain>();
        is::<Held>();
    }
}
