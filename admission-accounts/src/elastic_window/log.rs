//! The sliding log: when each request still counted by the window was taken.
//!
//! A sliding-log limiter keeps one stamp per request and counts the stamps younger than the
//! window. Stored naively that is one entry per request, so a demand of a million requests would
//! hold a million entries. Here requests taken at the same instant share one run, and each run
//! carries the running total of requests up to and including it. Counting the requests inside a
//! window and finding the k-th oldest of them are then two binary searches over the runs, and the
//! log never holds more requests than the window's `max_requests`.
//!
//! Counting is the hot path (every ask counts), and the log can hold many runs that are outside
//! the present window but still inside the widest one a throttle could stretch it to. So the
//! log remembers where the window began at the last count (a [`Mark`]): with the same or a
//! narrower window and a later instant, no run before that place can be inside again, and the
//! boundary is found by stepping forward from it a few runs at most, falling back to the binary
//! search when it has moved further. Each run is stepped over once per window length, so a count
//! is amortised O(1) while time only moves forward, as it does under the window's lock.
//!
//! Everything here is plain data, touched only under the window's lock; it reads no clock.

use std::collections::VecDeque;

use admission_core::Instant;

/// The instant a request stamped `at` leaves a window of `window` nanoseconds: it counts while
/// `now < at + window` and no longer from `at + window` on.
pub(super) fn leaves(at: Instant, window: u64) -> Instant {
    Instant::from_nanos(at.as_nanos().saturating_add(window))
}

/// Runs of request stamps, oldest first.
#[derive(Debug, Default)]
pub(super) struct Log {
    /// The running total just before the oldest run: the oldest run holds `end - floor` requests.
    /// Never above the oldest run's `end`.
    floor: u64,
    /// `(stamp, end)`: requests taken at `stamp`, `end` being the running total through this
    /// run. Stamps strictly increase (a request taken at the newest run's instant joins it) and
    /// ends strictly increase, every end above `floor`; no run is empty.
    runs: VecDeque<(Instant, u64)>,
    /// Where the window began at the last count: a hint, never needed for correctness.
    mark: Mark,
}

/// A place in the log known to be at or before the oldest run inside a window.
///
/// Every run before `index` has left a window of `window` nanoseconds by `now`, so it has left
/// any window at most that long at any instant from `now` on. Kept true as the log changes: a
/// run leaving the front moves `index` down by one, runs leaving the back clamp it to the
/// length, and new runs only ever join at the back.
#[derive(Clone, Copy, Debug, Default)]
struct Mark {
    /// Runs before this index have left the window.
    index: usize,
    /// The instant of the count that set the mark.
    now: Instant,
    /// The window of that count, in nanoseconds.
    window: u64,
}

/// How many runs a count steps forward from the mark before it searches instead.
const STEPS: usize = 8;

impl Log {
    /// An empty log.
    pub(super) fn new() -> Log {
        Log::default()
    }

    /// The running total just before run `i` (`floor` for the oldest).
    fn start_of(&self, i: usize) -> u64 {
        match i.checked_sub(1) {
            Some(prev) => self.runs.get(prev).map_or(self.floor, |r| r.1),
            None => self.floor,
        }
    }

    /// The running total through the newest run (`floor` when empty).
    fn end(&self) -> u64 {
        self.runs.back().map_or(self.floor, |r| r.1)
    }

    /// Every request the log holds, inside the present window or not.
    pub(super) fn len(&self) -> u64 {
        self.end().saturating_sub(self.floor)
    }

    /// Forgets runs that have left a window of `widest` nanoseconds by `now`: no throttle can
    /// stretch the window far enough to count them again.
    pub(super) fn expire(&mut self, now: Instant, widest: u64) {
        while let Some(&(at, end)) = self.runs.front() {
            if leaves(at, widest) > now {
                break;
            }
            self.pop_front();
            self.floor = end;
        }
    }

    /// Drops the oldest run, keeping the mark on the same run.
    fn pop_front(&mut self) {
        self.runs.pop_front();
        self.mark.index = self.mark.index.saturating_sub(1);
    }

    /// Drops the newest run, keeping the mark within the log.
    fn pop_back(&mut self) {
        self.runs.pop_back();
        self.mark.index = self.mark.index.min(self.runs.len());
    }

    /// The index of the oldest run still inside a window of `window` nanoseconds at `now`, and
    /// the mark moved there.
    fn first_inside(&mut self, now: Instant, window: u64) -> usize {
        let outside = |&(at, _): &(Instant, u64)| leaves(at, window) <= now;
        let mark = self.mark;
        let mut first = if now >= mark.now && window <= mark.window {
            mark.index.min(self.runs.len())
        } else {
            0
        };
        let mut steps = 0;
        while self.runs.get(first).is_some_and(outside) {
            if steps == STEPS {
                first = self.runs.partition_point(outside);
                break;
            }
            first += 1;
            steps += 1;
        }
        self.mark = Mark {
            index: first,
            now,
            window,
        };
        first
    }

    /// Requests counted by a window of `window` nanoseconds at `now`.
    pub(super) fn in_use(&mut self, now: Instant, window: u64) -> u64 {
        let first = self.first_inside(now, window);
        self.end().saturating_sub(self.start_of(first))
    }

    /// The instant the `k`-th oldest request inside the window leaves it (`k` counts from 1);
    /// `None` when fewer than `k` requests are inside or `k` is zero.
    pub(super) fn kth_leaves(&mut self, now: Instant, window: u64, k: u64) -> Option<Instant> {
        if k == 0 {
            return None;
        }
        let first = self.first_inside(now, window);
        let target = self.start_of(first).checked_add(k)?;
        let run = self.runs.partition_point(|&(_, end)| end < target);
        self.runs.get(run).map(|&(at, _)| leaves(at, window))
    }

    /// Records `n` requests at `at`, keeping at most `cap` requests in all by forgetting the
    /// oldest first.
    ///
    /// The caller has checked that the requests inside the present window plus `n` fit `cap`,
    /// so only requests outside the window are ever forgotten here. `at` earlier than the newest
    /// stamp is recorded at the newest stamp, so stamps never go back.
    pub(super) fn push(&mut self, at: Instant, n: u64, cap: u64) {
        if n == 0 {
            return;
        }
        let room = cap.saturating_sub(self.len());
        let excess = n.saturating_sub(room);
        self.forget_oldest(excess);
        let end = match self.end().checked_add(n) {
            Some(end) => end,
            None => {
                // The running total would pass u64::MAX: count from the floor again. The log
                // holds at most `cap - n` requests now, so the new end fits.
                self.rebase();
                self.end().saturating_add(n)
            }
        };
        match self.runs.back_mut() {
            Some(back) if back.0 >= at => back.1 = end,
            _ => self.runs.push_back((at, end)),
        }
    }

    /// Forgets the oldest `n` requests (all of them when the log holds fewer).
    fn forget_oldest(&mut self, mut n: u64) {
        while n > 0 {
            let Some(&(_, end)) = self.runs.front() else {
                return;
            };
            let count = end.saturating_sub(self.floor);
            if count <= n {
                self.pop_front();
                self.floor = end;
                n -= count;
            } else {
                self.floor = self.floor.saturating_add(n);
                n = 0;
            }
        }
    }

    /// Forgets the newest `n` requests; answers how many there were to forget.
    pub(super) fn drop_newest(&mut self, n: u64) -> u64 {
        let mut left = n;
        while left > 0 {
            let last = self.runs.len().saturating_sub(1);
            let start = self.start_of(last);
            let Some(back) = self.runs.back_mut() else {
                break;
            };
            let count = back.1.saturating_sub(start);
            if count <= left {
                self.pop_back();
                left -= count;
            } else {
                back.1 -= left;
                left = 0;
            }
        }
        n - left
    }

    /// Makes the running totals count from zero again.
    fn rebase(&mut self) {
        let floor = self.floor;
        for run in &mut self.runs {
            run.1 = run.1.saturating_sub(floor);
        }
        self.floor = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Instant {
        Instant::from_nanos(secs * 1_000_000_000)
    }

    const TEN_S: u64 = 10_000_000_000;

    #[test]
    fn counts_only_the_requests_inside_the_window() {
        let mut log = Log::new();
        log.push(at(0), 2, 10);
        log.push(at(3), 1, 10);
        log.push(at(3), 1, 10);
        assert_eq!(log.runs.len(), 2);
        assert_eq!(log.in_use(at(9), TEN_S), 4);
        assert_eq!(log.in_use(at(10), TEN_S), 2);
        assert_eq!(log.in_use(at(13), TEN_S), 0);
        assert_eq!(log.len(), 4);
    }

    #[test]
    fn the_kth_oldest_request_inside_the_window_is_found() {
        let mut log = Log::new();
        log.push(at(0), 2, 10);
        log.push(at(3), 1, 10);
        log.push(at(5), 3, 10);
        assert_eq!(log.kth_leaves(at(1), TEN_S, 1), Some(at(10)));
        assert_eq!(log.kth_leaves(at(1), TEN_S, 2), Some(at(10)));
        assert_eq!(log.kth_leaves(at(1), TEN_S, 3), Some(at(13)));
        assert_eq!(log.kth_leaves(at(1), TEN_S, 6), Some(at(15)));
        assert_eq!(log.kth_leaves(at(1), TEN_S, 7), None);
        assert_eq!(log.kth_leaves(at(11), TEN_S, 1), Some(at(13)));
        assert_eq!(log.kth_leaves(at(1), TEN_S, 0), None);
    }

    #[test]
    fn newest_requests_are_dropped_first() {
        let mut log = Log::new();
        log.push(at(0), 2, 10);
        log.push(at(3), 3, 10);
        assert_eq!(log.drop_newest(4), 4);
        assert_eq!(log.len(), 1);
        assert_eq!(log.kth_leaves(at(0), TEN_S, 1), Some(at(10)));
        assert_eq!(log.drop_newest(5), 1);
        assert_eq!(log.len(), 0);
    }

    #[test]
    fn expiry_and_the_cap_forget_the_oldest() {
        let mut log = Log::new();
        log.push(at(0), 3, 4);
        log.push(at(20), 3, 4);
        assert_eq!(log.len(), 4);
        assert_eq!(log.in_use(at(20), TEN_S), 3);
        log.expire(at(20), 2 * TEN_S);
        assert_eq!(log.len(), 3);
    }

    /// Requests inside the window counted the slow way: every run, no mark.
    fn in_use_by_scan(log: &Log, now: Instant, window: u64) -> u64 {
        let first = log
            .runs
            .iter()
            .position(|&(at, _)| leaves(at, window) > now)
            .unwrap_or(log.runs.len());
        log.end().saturating_sub(log.start_of(first))
    }

    #[test]
    fn the_mark_steps_forward_with_time_and_is_dropped_when_the_window_widens() {
        let mut log = Log::new();
        for s in 0..20 {
            log.push(at(s), 1, 100);
        }
        // Ten runs past the boundary: more than the steps allowed, so this one searches.
        assert_eq!(log.in_use(at(19), TEN_S), 10);
        assert_eq!(log.mark.index, 10);
        // One step forward.
        assert_eq!(log.in_use(at(20), TEN_S), 9);
        assert_eq!(log.mark.index, 11);
        // A narrower window starts from the mark; a wider one cannot.
        assert_eq!(log.in_use(at(20), TEN_S / 2), 4);
        assert_eq!(log.mark.index, 16);
        assert_eq!(log.in_use(at(20), TEN_S), 9);
        assert_eq!(log.mark.index, 11);
        // Going back in time cannot start from the mark either.
        assert_eq!(log.in_use(at(12), TEN_S), 17);
        assert_eq!(log.mark.index, 3);
        // Runs leaving at either end keep the mark on its run or within the log.
        log.expire(at(20), 2 * TEN_S - 1);
        assert_eq!(log.mark.index, 2);
        assert_eq!(log.in_use(at(20), TEN_S), 9);
        assert_eq!(log.drop_newest(15), 15);
        assert_eq!(log.mark.index, 4);
        assert_eq!(log.in_use(at(20), TEN_S), 0);
        log.push(at(21), 2, 100);
        assert_eq!(log.in_use(at(21), TEN_S), 2);
    }

    #[test]
    fn counting_from_the_mark_agrees_with_a_full_scan() {
        // A small xorshift generator: the same sequence on every run.
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        let windows = [TEN_S / 4, TEN_S / 2, TEN_S, 2 * TEN_S];
        let widest = 2 * TEN_S;
        let cap = 40;
        let mut log = Log::new();
        let mut now = 0_u64;
        for _ in 0..20_000 {
            // Mostly forward in small steps, sometimes a long jump, sometimes back.
            match next(10) {
                0 => now += TEN_S,
                1 => now = now.saturating_sub(next(TEN_S)),
                _ => now += next(TEN_S / 8),
            }
            let t = Instant::from_nanos(now);
            let window = windows[usize::try_from(next(4)).unwrap()];
            match next(6) {
                0 => log.expire(t, widest),
                1 => {
                    log.drop_newest(next(4));
                }
                2 | 3 => {
                    let room = cap - in_use_by_scan(&log, t, window);
                    if room > 0 {
                        log.push(t, 1 + next(room), cap);
                    }
                }
                _ => {}
            }
            let expected = in_use_by_scan(&log, t, window);
            assert_eq!(
                log.in_use(t, window),
                expected,
                "at {now} ns, window {window}"
            );
            assert!(log.mark.index <= log.runs.len());
        }
    }

    #[test]
    fn running_totals_rebase_instead_of_overflowing() {
        let mut log = Log::new();
        log.push(at(0), u64::MAX, u64::MAX);
        log.expire(at(10), TEN_S);
        log.push(at(10), u64::MAX, u64::MAX);
        assert_eq!(log.len(), u64::MAX);
        assert_eq!(log.in_use(at(10), TEN_S), u64::MAX);
        log.push(at(21), 5, u64::MAX);
        assert_eq!(log.len(), u64::MAX);
        assert_eq!(log.in_use(at(21), TEN_S), 5);
    }
}
