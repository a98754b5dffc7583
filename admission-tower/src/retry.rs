//! When a refused request may try again: [`RetryAfter`] (known or estimated), the
//! [`RetryEstimate`] settings, and the drain the layer measures to estimate from; and when a
//! request is not let into the line at all ([`LineBound`], refused with [`LineFull`]).

use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use admission_core::{Clock, Grant, Instant};

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
/// (`AdmitError::retry_after` is `None`). For those refusals (and only those: a quota without a
/// known reset and a demand that can never fit get no estimate) the layer works out how long the
/// line it leaves behind takes to drain, from what it sees itself:
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
/// gRPC `UNAVAILABLE`), with `Retry-After` from the same drain as every estimate
/// ([`RetryEstimate`]): the time the requests already waiting take to be served.
///
/// Only the layer's own requests count, as for the estimate. The check reads two counters
/// without a lock, so under a burst of arrivals a few more than the bound may get in.
///
/// # Examples
///
/// ```
/// use std::num::NonZeroU64;
/// use std::time::Duration;
/// use admission_tower::LineBound;
///
/// // Shed what would time out anyway: the line ahead takes longer than the 5 s timeout.
/// let bound = LineBound::ExpectedWait(Duration::from_secs(5));
/// // Or at most 100 waiting requests, whatever the pace.
/// let bound = LineBound::Waiters(NonZeroU64::new(100).unwrap());
/// # let _ = bound;
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LineBound {
    /// At most this many of the layer's requests wait: one that arrives while this many wait is
    /// refused.
    Waiters(NonZeroU64),
    /// The line ahead may take at most this long: a request is refused when the layer's waiting
    /// requests, served at the rate of its completions over the estimate's
    /// [`window`](RetryEstimate::window), take longer than this. Nobody waiting means no wait,
    /// so with this bound a request that finds nobody waiting is never refused; with no
    /// completion in the window the pace is unknown and nothing is refused either. Set it to
    /// the layer's timeout to refuse at once what would time out anyway.
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

/// A request refused at once because the line was past its [`LineBound`]: the cause of a
/// [`Reason::Shed`](crate::Reason::Shed) refusal.
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
#[error("{waiting} requests waiting{}, past the bound of {bound}", match .expected_wait {
    Some(wait) => format!(", {wait:?} to serve them"),
    None => String::new(),
})]
pub struct LineFull {
    waiting: u64,
    expected_wait: Option<Duration>,
    bound: LineBound,
}

impl LineFull {
    /// How many of the layer's requests were waiting.
    pub fn waiting(&self) -> u64 {
        self.waiting
    }

    /// How long they were expected to take, for an [`ExpectedWait`](LineBound::ExpectedWait)
    /// bound.
    pub fn expected_wait(&self) -> Option<Duration> {
        self.expected_wait
    }

    /// The bound that was passed.
    pub fn bound(&self) -> LineBound {
        self.bound
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

/// What the layer measures for its estimates: its completions over the window, and how many of
/// its requests wait now. One per layer, shared by every service it builds.
pub(crate) struct Drain {
    settings: RetryEstimate,
    clock: Arc<dyn Clock>,
    /// When the layer was built: completions are not looked for before it.
    since: Instant,
    /// One bucket's width in nanoseconds; 0 for a zero window (nothing counted).
    width: u64,
    buckets: Mutex<[Bucket; BUCKETS]>,
    waiting: AtomicU64,
}

impl Drain {
    /// A drain measured on `clock` from now on, estimating with `settings`.
    pub(crate) fn new(clock: Arc<dyn Clock>, settings: RetryEstimate) -> Drain {
        let window = u64::try_from(settings.window.as_nanos()).unwrap_or(u64::MAX);
        let since = clock.now();
        Drain {
            settings,
            clock,
            since,
            width: window / BUCKETS as u64,
            buckets: Mutex::new([Bucket::default(); BUCKETS]),
            waiting: AtomicU64::new(0),
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

    /// The estimate for a request refused now after waiting `waited` (see [`RetryEstimate`]).
    pub(crate) fn estimate(&self, waited: Duration) -> Duration {
        let (completions, span) = self.completions();
        let waiting = self.waiting.load(Ordering::Relaxed);
        self.settings.compute(waiting, completions, span, waited)
    }

    /// Whether a request arriving now is past `bound` (see [`LineBound`]).
    pub(crate) fn past(&self, bound: LineBound) -> Option<LineFull> {
        let waiting = self.waiting.load(Ordering::Relaxed);
        let full = |expected_wait| LineFull {
            waiting,
            expected_wait,
            bound,
        };
        match bound {
            LineBound::Waiters(most) => (waiting >= most.get()).then(|| full(None)),
            LineBound::ExpectedWait(most) => {
                let (completions, span) = self.completions();
                if waiting == 0 || completions == 0 {
                    return None;
                }
                let nanos = u128::from(waiting) * span.as_nanos() / u128::from(completions);
                let expected = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
                (expected > most).then(|| full(Some(expected)))
            }
        }
    }

    /// Counts a request as waiting until the guard is dropped.
    pub(crate) fn waiting(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(self.clone())
    }

    /// `grant`, counted as a completion when it goes back.
    pub(crate) fn hold(self: &Arc<Self>, grant: Grant) -> Held {
        Held {
            grant,
            drain: self.clone(),
        }
    }
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("settings", &self.settings)
            .field("waiting", &self.waiting.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A request of the layer waiting for its grant; it stops counting when dropped.
pub(crate) struct Waiting(Arc<Drain>);

impl Waiting {
    /// The drain it counts in.
    pub(crate) fn drain(&self) -> &Arc<Drain> {
        &self.0
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
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
            let drain = Arc::new(Drain::new(clock.shared(), RetryEstimate::new()));
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
                let guards: Vec<_> = (0..waiting).map(|_| drain.waiting()).collect();
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
        let drain = Arc::new(Drain::new(clock.shared(), RetryEstimate::new()));
        let waiter = drain.waiting();
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
        assert_eq!(drain.waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_zero_window_counts_nothing() {
        let clock = FakeClock::new();
        let settings = RetryEstimate::new().window(Duration::ZERO);
        let drain = Drain::new(clock.shared(), settings);
        drain.completed();
        clock.advance(SEC);
        assert_eq!(drain.completions(), (0, Duration::ZERO));
        assert_eq!(drain.estimate(ms(2_500)), 3 * SEC);
    }

    #[test]
    fn the_line_bound_counts_the_waiters_and_their_expected_wait() {
        let clock = FakeClock::new();
        let drain = Arc::new(Drain::new(clock.shared(), RetryEstimate::new()));
        let three = LineBound::Waiters(NonZeroU64::new(3).unwrap());
        let short = LineBound::ExpectedWait(ms(700));
        let nothing = LineBound::ExpectedWait(Duration::ZERO);
        // Nobody waiting: no expected wait, whatever the bound.
        assert_eq!(drain.past(nothing), None);
        let mut guards: Vec<_> = (0..2).map(|_| drain.waiting()).collect();
        assert_eq!(drain.past(three), None);
        // No completion yet: the pace is unknown, nothing is shed on it.
        assert_eq!(drain.past(nothing), None);
        guards.push(drain.waiting());
        let full = drain.past(three).expect("three waiting");
        assert_eq!((full.waiting(), full.expected_wait()), (3, None));
        assert_eq!(
            full.to_string(),
            "3 requests waiting, past the bound of at most 3 waiting"
        );
        // Four completions a second for 10 s: at 10 s the window holds the 37 from 1 s on, over
        // 9 s, so the three waiting take 27/37 s.
        for _ in 0..40 {
            clock.advance(ms(250));
            drain.completed();
        }
        let full = drain.past(short).expect("over 700 ms");
        assert_eq!(
            full.expected_wait(),
            Some(Duration::from_nanos(729_729_729))
        );
        assert_eq!(full.bound(), short);
        assert_eq!(
            full.to_string(),
            "3 requests waiting, 729.729729ms to serve them, past the bound of a line of at \
             most 700ms"
        );
        assert_eq!(drain.past(LineBound::ExpectedWait(ms(730))), None);
        drop(guards);
        assert_eq!(drain.past(nothing), None);
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
