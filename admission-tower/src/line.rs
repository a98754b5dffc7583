//! The layer's own line: its requests waiting for their grant, in arrival order, and the pace at
//! which it is served, from which [`LineBound`] decides who joins it and who leaves it early.
//!
//! This part only decides: it takes the instant as an argument and returns what must happen
//! (a request refused, waiters to shed); the [`Drain`](crate::retry::Drain) around it locks,
//! reads the clock and wakes.
//!
//! # The pace
//!
//! The line is *busy* while at least one of the layer's requests waits. Two figures describe
//! how fast it is served:
//!
//! - the **interval** `I` between two grants to requests that had to wait, counting busy time
//!   only. Each such grant is one observation `x` (the busy time since the line's previous
//!   grant), and `I` becomes `max(x, I + (x − I) / 8)`: a slower line is believed at once, a
//!   faster one over about eight grants. A request granted at once, without waiting, says
//!   nothing of the line's pace (the bucket's stock served it, not the line) and is not an
//!   observation; this is what keeps a burst at start-up from making an empty bucket look fast.
//!   Before the first observation `I` is 0: the pace is unknown, and only the gap below counts.
//! - the **gap** `g`: the busy time since the line's last grant (of any kind). It is how long the
//!   waiters have gone without anyone being served: at a cold start, or in a stall of the
//!   backend, it is the only news, and it grows as they wait. It is kept while nobody waits (a
//!   stall is remembered when its waiters have left) and ends at the next grant, a request
//!   granted outside the line included.
//!
//! The request at position `p` of the line (1 for its head) is expected to be granted in
//! `E(p) = p × I − g` while `g ≤ I` (the interval now running is `g` done), and in
//! `E(p) = p × g − I` once `g > I` (the line has already gone longer than an interval: the
//! interval now running is taken to last as long again, and every later one as long as it). The
//! two agree at `g = I`, and in a stall `E` grows with the gap for every position.
//!
//! # The decisions
//!
//! - An arriving request, behind `w` waiters, joins the line when `E(w + 1)` is at most the
//!   [`ExpectedWait`](LineBound::ExpectedWait) bound, or when fewer than
//!   [`Waiters`](LineBound::Waiters) wait; otherwise it is refused ([`LineFull`]).
//! - Under an `ExpectedWait` bound, at every event of the line (an arrival, a grant, a request
//!   leaving), the waiters are looked at from the back: one whose whole wait, what it waited
//!   so far and `E(p)`, is now longer than the bound is shed from the line at once, instead of
//!   waiting on towards its timeout (the first one that is not ends the look: those ahead of it
//!   arrived earlier, but have less to wait for).
//!
//! Judging a line by how long its requests have waited rather than by how long it is comes from
//! CoDel (Nichols and Jacobson, *Controlling Queue Delay*, 2012), which drops by sojourn time;
//! here the request shed is the newest (it has the longest to wait), and the limit is the
//! layer's bound on a whole wait rather than a target delay. Taking the time already waited as
//! a lower bound of the interval now running is the usual reading of a censored observation.

use std::collections::BTreeMap;
use std::time::Duration;

use admission_core::Instant;

use crate::retry::{LineBound, LineFull};

/// The weight of a new interval in the line's average (a slower one is taken whole).
const WEIGHT: u32 = 8;

/// The layer's waiting requests and their pace (see the [module](self)). Only touched under the
/// drain's lock.
#[derive(Debug)]
pub(crate) struct Line<T> {
    /// The waiting requests by arrival number (their order in the monitor's line); `T` is what
    /// the shell needs to shed one.
    waiters: BTreeMap<u64, Waiter<T>>,
    /// The next arrival's number.
    next: u64,
    /// `I`: the interval between grants to requests that waited; zero until the first.
    interval: Duration,
    /// The gap accumulated before `busy_since`.
    stalled: Duration,
    /// Since when someone has been waiting, while someone is.
    busy_since: Option<Instant>,
}

#[derive(Debug)]
struct Waiter<T> {
    /// When it joined the line.
    arrived: Instant,
    handle: T,
}

/// A waiter shed from the line: its handle and why.
pub(crate) type Shed<T> = (T, LineFull);

impl<T> Line<T> {
    pub(crate) fn new() -> Line<T> {
        Line {
            waiters: BTreeMap::new(),
            next: 0,
            interval: Duration::ZERO,
            stalled: Duration::ZERO,
            busy_since: None,
        }
    }

    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.waiters.len()
    }

    /// The interval `I` (zero while unknown).
    #[cfg(test)]
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// The gap `g` at `now`.
    pub(crate) fn gap(&self, now: Instant) -> Duration {
        let running = self
            .busy_since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        self.stalled.saturating_add(running)
    }

    /// `E(p)` at `now`: when the request at position `p` (1 for the head) is expected to be
    /// granted, from now.
    pub(crate) fn expected(&self, position: u64, now: Instant) -> Duration {
        let (i, g) = (self.interval.as_nanos(), self.gap(now).as_nanos());
        let p = u128::from(position);
        let nanos = if g <= i {
            (p * i).saturating_sub(g)
        } else {
            (p * g).saturating_sub(i)
        };
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// A request arriving at `now` under `bound`: its number when it joins the line with
    /// `handle`, or why it does not.
    pub(crate) fn arrive(
        &mut self,
        now: Instant,
        bound: Option<LineBound>,
        handle: T,
    ) -> Result<u64, LineFull> {
        let waiting = self.waiters.len() as u64;
        match bound {
            Some(full @ LineBound::Waiters(most)) if waiting >= most.get() => {
                return Err(LineFull::new(waiting, None, full));
            }
            Some(full @ LineBound::ExpectedWait(most)) => {
                let expected = self.expected(waiting + 1, now);
                if expected > most {
                    return Err(LineFull::new(waiting, Some(expected), full));
                }
            }
            _ => {}
        }
        if self.waiters.is_empty() {
            self.busy_since = Some(now);
        }
        let number = self.next;
        self.next += 1;
        self.waiters.insert(
            number,
            Waiter {
                arrived: now,
                handle,
            },
        );
        Ok(number)
    }

    /// Request `number` was granted at `now`, after waiting (`waited`) or at once. A request
    /// already shed from the line is still a grant of the line.
    pub(crate) fn granted(&mut self, number: u64, now: Instant, waited: bool) {
        if waited {
            let x = self.gap(now);
            self.interval = if self.interval.is_zero() || x >= self.interval {
                x
            } else {
                self.interval - (self.interval - x) / WEIGHT
            };
        }
        self.remove(number, now);
        self.served(now);
    }

    /// A request that never joined the line (it was past the bound) was granted at `now`
    /// anyway, at once: the backend serves, so the gap ends.
    pub(crate) fn served(&mut self, now: Instant) {
        self.stalled = Duration::ZERO;
        if self.busy_since.is_some() {
            self.busy_since = Some(now);
        }
    }

    /// Request `number` left the line at `now` without a grant (it timed out, was cancelled,
    /// its client hung up, or it was shed).
    pub(crate) fn left(&mut self, number: u64, now: Instant) {
        self.remove(number, now);
    }

    fn remove(&mut self, number: u64, now: Instant) {
        if self.waiters.remove(&number).is_some() {
            self.end_if_empty(now);
        }
    }

    /// When nobody waits any more, the busy stretch ends: its time stays in the gap.
    fn end_if_empty(&mut self, now: Instant) {
        if self.waiters.is_empty()
            && let Some(since) = self.busy_since.take()
        {
            self.stalled = self
                .stalled
                .saturating_add(now.saturating_duration_since(since));
        }
    }

    /// Under `bound`, the waiters to shed at `now`: from the back of the line, each whose whole
    /// wait (waited so far, and `E(p)`) is longer than the bound, up to the first that is not.
    /// They leave the line.
    pub(crate) fn shed_doomed(&mut self, now: Instant, bound: Option<LineBound>) -> Vec<Shed<T>> {
        let mut shed = Vec::new();
        let Some(bound @ LineBound::ExpectedWait(most)) = bound else {
            return shed;
        };
        while let Some((&number, back)) = self.waiters.last_key_value() {
            let position = self.waiters.len() as u64;
            let waited = now.saturating_duration_since(back.arrived);
            let expected = self.expected(position, now);
            if waited.saturating_add(expected) <= most {
                break;
            }
            let Some(waiter) = self.waiters.remove(&number) else {
                break;
            };
            self.end_if_empty(now);
            let full = LineFull::new(position - 1, Some(expected), bound).after_waiting(waited);
            shed.push((waiter.handle, full));
        }
        shed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn at(millis: u64) -> Instant {
        Instant::from_nanos(millis * 1_000_000)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn bound(secs: u64) -> Option<LineBound> {
        Some(LineBound::ExpectedWait(Duration::from_secs(secs)))
    }

    #[test]
    fn an_unknown_pace_reads_the_gap_alone() {
        let mut line = Line::new();
        // Nobody waiting, nothing known: no wait at all.
        assert_eq!(line.expected(1, at(0)), Duration::ZERO);
        let a = line.arrive(at(0), bound(5), 'a').unwrap();
        assert_eq!(a, 0);
        // One second of waiting with no grant: the second in line, two gaps.
        assert_eq!(line.gap(at(1_000)), SEC);
        assert_eq!(line.expected(2, at(1_000)), 2 * SEC);
        line.arrive(at(1_000), bound(5), 'b').unwrap();
        // At 2 s a third would wait 3 × 2 s: refused, with the figures.
        let full = line.arrive(at(2_000), bound(5), 'c').unwrap_err();
        assert_eq!((full.waiting(), full.expected_wait()), (2, Some(6 * SEC)));
        assert_eq!(line.len(), 2);
        // A request served at once, outside the line, ends the gap.
        line.served(at(2_000));
        assert_eq!(line.gap(at(2_250)), ms(250));
    }

    #[test]
    fn a_stalled_line_sheds_its_back_once_its_whole_wait_passes_the_bound() {
        let mut line = Line::new();
        line.arrive(at(0), bound(5), 'a').unwrap();
        line.arrive(at(1_000), bound(5), 'b').unwrap();
        // At 2.5 s: `b` (second), having waited 1.5 s, expects 2 × 2.5 s = 5 s more: 6.5 s in
        // all, past 5 s: shed. `a` (head) waited 2.5 s and expects 2.5 s: 5 s, it stays.
        let shed = line.shed_doomed(at(2_500), bound(5));
        assert_eq!(shed.len(), 1);
        let (handle, full) = &shed[0];
        assert_eq!(*handle, 'b');
        assert_eq!(
            (full.waiting(), full.expected_wait(), full.waited()),
            (1, Some(5 * SEC), Some(ms(1_500)))
        );
        assert_eq!(line.len(), 1);
        assert!(line.shed_doomed(at(2_500), bound(5)).is_empty());
        // A moment later the head is past it too.
        let shed = line.shed_doomed(at(2_501), bound(5));
        assert_eq!(shed.iter().map(|s| s.0).collect::<Vec<_>>(), ['a']);
        assert_eq!(line.len(), 0);
        // The gap stays while nobody waits: a new arrival still sees the stall.
        assert_eq!(line.gap(at(9_000)), ms(2_501));
        assert_eq!(line.expected(1, at(9_000)), ms(2_501));
        // Without a bound on the expected wait, nobody is shed.
        line.arrive(at(9_000), None, 'd').unwrap();
        assert!(line.shed_doomed(at(20_000), None).is_empty());
        let one = Some(LineBound::Waiters(1.try_into().unwrap()));
        assert!(line.shed_doomed(at(20_000), one).is_empty());
    }

    #[test]
    fn the_interval_believes_a_slowdown_at_once_and_a_speedup_by_eighths() {
        /// One request arriving at `now` and granted `wait` later.
        fn grant_after(line: &mut Line<()>, now: &mut u64, wait: u64) {
            let n = line.arrive(at(*now), None, ()).unwrap();
            *now += wait;
            line.granted(n, at(*now), true);
        }
        let mut line = Line::new();
        let mut now = 0;
        grant_after(&mut line, &mut now, 800);
        assert_eq!(line.interval(), ms(800));
        grant_after(&mut line, &mut now, 1_600);
        assert_eq!(line.interval(), ms(1_600));
        grant_after(&mut line, &mut now, 0);
        assert_eq!(line.interval(), ms(1_400));
        grant_after(&mut line, &mut now, 600);
        assert_eq!(line.interval(), ms(1_300));
        // Idle time is not busy time: the gap counts only while someone waits.
        now += 10_000;
        assert_eq!(line.gap(at(now)), Duration::ZERO);
        grant_after(&mut line, &mut now, 1_300);
        assert_eq!(line.interval(), ms(1_300));
    }

    #[test]
    fn a_grant_at_once_is_no_pace_but_ends_the_gap() {
        let mut line: Line<()> = Line::new();
        // A burst served at once: sixty grants, no interval.
        for _ in 0..60 {
            let n = line.arrive(at(0), bound(5), ()).unwrap();
            line.granted(n, at(0), false);
        }
        assert_eq!(line.interval(), Duration::ZERO);
        // The bucket is empty now: the next waiter's wait is the pace.
        let n = line.arrive(at(0), bound(5), ()).unwrap();
        line.granted(n, at(1_000), true);
        assert_eq!(line.interval(), SEC);
        // Four wait behind it; with I = 1 s and no gap, a fifth expects 5 s: within 5 s, and a
        // sixth is refused.
        for _ in 0..4 {
            line.arrive(at(1_000), bound(5), ()).unwrap();
        }
        assert_eq!(line.expected(5, at(1_000)), 5 * SEC);
        line.arrive(at(1_000), bound(5), ()).unwrap();
        let full = line.arrive(at(1_000), bound(5), ()).unwrap_err();
        assert_eq!(full.expected_wait(), Some(6 * SEC));
        // 400 ms into the interval the head expects 600 ms; at 1.5 s past it (g > I) the fifth
        // expects 5 × 1.5 − 1 = 6.5 s.
        assert_eq!(line.expected(1, at(1_400)), ms(600));
        assert_eq!(line.expected(5, at(2_500)), ms(6_500));
    }

    #[test]
    fn waiters_are_counted_exactly() {
        let mut line = Line::new();
        let three = Some(LineBound::Waiters(3.try_into().unwrap()));
        let numbers: Vec<u64> = (0..3)
            .map(|i| line.arrive(at(0), three, i).unwrap())
            .collect();
        let full = line.arrive(at(0), three, 9).unwrap_err();
        assert_eq!((full.waiting(), full.expected_wait()), (3, None));
        line.left(numbers[1], at(1));
        assert_eq!(line.arrive(at(1), three, 4), Ok(3));
    }

    /// One step of the property test.
    #[derive(Clone, Debug)]
    enum Op {
        Advance(u64),
        Arrive,
        /// The waiter at this index (modulo the line's length) is granted, after waiting or not.
        Grant(usize, bool),
        Leave(usize),
        Served,
        Look,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0u64..1_500).prop_map(Op::Advance),
            Just(Op::Arrive),
            Just(Op::Arrive),
            (0usize..8, any::<bool>()).prop_map(|(i, w)| Op::Grant(i, w)),
            (0usize..8).prop_map(Op::Leave),
            Just(Op::Served),
            Just(Op::Look),
        ]
    }

    /// The line as a plain record of what happened: the waiters in order with their arrival,
    /// and every change of how many wait, from which the gap is integrated afresh each time.
    struct Reference {
        waiters: Vec<(u64, Instant)>,
        /// (instant, waiting after it) at each change, and the last grant (or served) instant.
        changes: Vec<(Instant, usize)>,
        last_grant: Instant,
        interval: u128,
    }

    impl Reference {
        /// Busy time (someone waiting) between the last grant and `now`.
        fn gap(&self, now: Instant) -> u128 {
            let mut busy = 0;
            for (i, &(at, waiting)) in self.changes.iter().enumerate() {
                let until = self.changes.get(i + 1).map_or(now, |c| c.0);
                let from = at.max(self.last_grant);
                if waiting > 0 && until > from {
                    busy += u128::from(until.as_nanos() - from.as_nanos());
                }
            }
            busy
        }

        fn expected(&self, p: u128, now: Instant) -> u128 {
            let (i, g) = (self.interval, self.gap(now));
            if g <= i {
                (p * i).saturating_sub(g)
            } else {
                (p * g).saturating_sub(i)
            }
        }

        fn changed(&mut self, now: Instant) {
            self.changes.push((now, self.waiters.len()));
        }
    }

    proptest::proptest! {
        /// The line's incremental gap, interval, joining and shedding agree with a reference
        /// that keeps the whole history and recomputes each from it.
        #[test]
        fn the_line_agrees_with_a_reference_that_recomputes_everything(
            ops in proptest::collection::vec(op(), 1..120),
            bound_kind in 0u8..3,
            most in 1u64..8,
        ) {
            let bound = match bound_kind {
                0 => None,
                1 => Some(LineBound::Waiters(most.try_into().unwrap())),
                _ => Some(LineBound::ExpectedWait(Duration::from_millis(most * 700))),
            };
            let mut line = Line::new();
            let mut reference = Reference {
                waiters: Vec::new(),
                changes: vec![(Instant::ZERO, 0)],
                last_grant: Instant::ZERO,
                interval: 0,
            };
            let mut now = Instant::ZERO;
            for op in ops {
                match op {
                    Op::Advance(millis) => now = now.saturating_add(ms(millis)),
                    Op::Arrive => {
                        let w = reference.waiters.len() as u64;
                        let refused = match bound {
                            Some(LineBound::Waiters(n)) => w >= n.get(),
                            Some(LineBound::ExpectedWait(d)) => {
                                reference.expected(u128::from(w) + 1, now) > d.as_nanos()
                            }
                            _ => false,
                        };
                        match line.arrive(now, bound, ()) {
                            Ok(number) => {
                                proptest::prop_assert!(!refused);
                                reference.waiters.push((number, now));
                                reference.changed(now);
                            }
                            Err(full) => {
                                proptest::prop_assert!(refused);
                                proptest::prop_assert_eq!(full.waiting(), w);
                            }
                        }
                    }
                    Op::Grant(i, waited) if !reference.waiters.is_empty() => {
                        let (number, _) = reference.waiters.remove(i % reference.waiters.len());
                        if waited {
                            let x = reference.gap(now);
                            let i = reference.interval;
                            reference.interval = if i == 0 || x >= i { x } else { i - (i - x) / 8 };
                        }
                        line.granted(number, now, waited);
                        reference.last_grant = now;
                        reference.changed(now);
                    }
                    Op::Leave(i) if !reference.waiters.is_empty() => {
                        let (number, _) = reference.waiters.remove(i % reference.waiters.len());
                        line.left(number, now);
                        reference.changed(now);
                    }
                    Op::Served => {
                        line.served(now);
                        reference.last_grant = now;
                    }
                    Op::Look => {
                        let mut doomed = Vec::new();
                        if let Some(LineBound::ExpectedWait(d)) = bound {
                            while let Some(&(_, arrived)) = reference.waiters.last() {
                                let p = reference.waiters.len() as u128;
                                let waited = u128::from(now.as_nanos() - arrived.as_nanos());
                                if waited + reference.expected(p, now) <= d.as_nanos() {
                                    break;
                                }
                                reference.waiters.pop();
                                doomed.push(p as u64 - 1);
                            }
                            reference.changed(now);
                        }
                        let shed: Vec<u64> = line
                            .shed_doomed(now, bound)
                            .iter()
                            .map(|(_, full)| full.waiting())
                            .collect();
                        proptest::prop_assert_eq!(shed, doomed);
                    }
                    Op::Grant(..) | Op::Leave(_) => {}
                }
                proptest::prop_assert_eq!(line.len(), reference.waiters.len());
                proptest::prop_assert_eq!(line.gap(now).as_nanos(), reference.gap(now));
                proptest::prop_assert_eq!(line.interval().as_nanos(), reference.interval);
            }
        }
    }
}
