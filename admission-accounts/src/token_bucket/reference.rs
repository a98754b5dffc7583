//! The bucket as it was before its state moved to `cells.rs`: one `parking_lot` mutex around a
//! plain state, with its own copy of the fixed-point level as it was. Kept for tests only: a
//! property test holds the bucket to it, answer for answer.

mod level;

use std::time::Duration;

use admission_core::{Amount, Answer, Ask, Instant};
use parking_lot::Mutex;

use super::throttle::Throttle;
use super::{REQUESTS, TOKENS, TokenBucketConfig};
use level::Level;

#[derive(Debug)]
struct State {
    config: TokenBucketConfig,
    tokens: Level,
    requests: Level,
    settled_at: Instant,
    throttle: Throttle,
}

impl State {
    fn settle(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.settled_at).as_nanos();
        let elapsed = u64::try_from(elapsed).unwrap_or(u64::MAX);
        let TokenBucketConfig {
            tokens_per_minute: tpm,
            requests_per_minute: rpm,
        } = self.config;
        let tenths = self.throttle.tenths();
        self.tokens.refill(elapsed, tpm, tenths, tpm);
        self.requests.refill(elapsed, rpm, tenths, rpm);
        self.settled_at = self.settled_at.max(now);
    }

    fn holds(&self, want: Amount) -> bool {
        self.tokens.holds(want.get(TOKENS)) && self.requests.holds(want.get(REQUESTS))
    }

    fn exceeds_budget(&self, want: Amount) -> bool {
        want.get(TOKENS) > self.config.tokens_per_minute
            || want.get(REQUESTS) > self.config.requests_per_minute
    }

    fn holds_at(&self, want: Amount) -> Option<Instant> {
        if self.exceeds_budget(want) {
            return None;
        }
        let TokenBucketConfig {
            tokens_per_minute,
            requests_per_minute,
        } = self.config;
        let tenths = self.throttle.tenths();
        let wait = self
            .tokens
            .nanos_until(want.get(TOKENS), tokens_per_minute, tenths)
            .max(
                self.requests
                    .nanos_until(want.get(REQUESTS), requests_per_minute, tenths),
            );
        Some(self.settled_at.saturating_add(Duration::from_nanos(wait)))
    }

    fn throttle_changed(&mut self) {
        self.tokens.forget_fraction();
        self.requests.forget_fraction();
    }
}

/// The old bucket, without its name, clock, wake slot or status: each operation is given the
/// clock's reading, and answers what the old one answered (`Never` without its message).
#[derive(Debug)]
pub(super) struct Reference {
    state: Mutex<State>,
}

/// What an operation changed that the caller can see: whether the wake slot would be called.
pub(super) type Woke = bool;

impl Reference {
    pub(super) fn new(config: TokenBucketConfig, now: Instant) -> Reference {
        Reference {
            state: Mutex::new(State {
                config,
                tokens: Level::full(config.tokens_per_minute),
                requests: Level::full(config.requests_per_minute),
                settled_at: now,
                throttle: Throttle::default(),
            }),
        }
    }

    pub(super) fn config(&self) -> TokenBucketConfig {
        self.state.lock().config
    }

    pub(super) fn levels(&self, now: Instant) -> (u64, u64) {
        let mut state = self.state.lock();
        state.settle(now);
        (state.tokens.whole(), state.requests.whole())
    }

    pub(super) fn throttle(&self) -> f64 {
        self.state.lock().throttle.value()
    }

    pub(super) fn set_config(&self, config: TokenBucketConfig, now: Instant) -> Woke {
        let mut state = self.state.lock();
        if state.config == config {
            return false;
        }
        state.settle(now);
        state.config = config;
        state.tokens.clamp(config.tokens_per_minute);
        state.requests.clamp(config.requests_per_minute);
        true
    }

    pub(super) fn record_backpressure(&self, increments: u32, now: Instant) -> Woke {
        if increments == 0 {
            return false;
        }
        let mut state = self.state.lock();
        state.settle(now);
        if state.throttle.tighten(increments, now) {
            state.throttle_changed();
        }
        false
    }

    pub(super) fn record_success(&self, now: Instant) -> Woke {
        let mut state = self.state.lock();
        if state.throttle.tenths() == 0 {
            return false;
        }
        state.settle(now);
        let relaxed = state.throttle.relieve(now);
        if relaxed {
            state.throttle_changed();
        }
        relaxed
    }

    pub(super) fn ask(&self, mine: Amount, ask: Ask, now: Instant) -> Answer {
        let mut state = self.state.lock();
        state.settle(now);
        if state.exceeds_budget(mine) {
            return Answer::Never(admission_core::Refusal::too_large(
                mine,
                Amount::pair(
                    state.config.tokens_per_minute,
                    state.config.requests_per_minute,
                ),
            ));
        }
        let want = mine.saturating_add(ask.reserved_ahead());
        if !state.holds(want) {
            return Answer::NotNow(state.holds_at(want));
        }
        if ask.takes() {
            state.tokens.take(mine.get(TOKENS));
            state.requests.take(mine.get(REQUESTS));
        }
        Answer::Taken
    }

    pub(super) fn give(&self, amount: Amount) -> Woke {
        let (tokens, requests) = (amount.get(TOKENS), amount.get(REQUESTS));
        if tokens == 0 && requests == 0 {
            return false;
        }
        let mut state = self.state.lock();
        let config = state.config;
        state.tokens.give(tokens, config.tokens_per_minute);
        state.requests.give(requests, config.requests_per_minute);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use admission_core::{Account, Clock, WakeFn};
    use admission_testkit::FakeClock;
    use proptest::prelude::*;

    use super::*;
    use crate::token_bucket::TokenBucket;

    #[derive(Clone, Debug)]
    enum Op {
        /// Tokens, requests, and how it asks: 0 the head taking, 1 a look, 2 behind a
        /// reservation of (tokens, requests).
        Ask(u64, u64, u8, (u64, u64)),
        Give(u64, u64),
        Advance(u64),
        SetConfig(u64, u64),
        Backpressure(u32),
        Success,
        Levels,
    }

    fn nanos() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            1..1_000u64,
            1..10_000_000u64,
            1..5_000_000_000u64,
            Just(301_000_000_000u64),
            Just(u64::MAX / 3),
        ]
    }

    fn small(max: u64) -> impl Strategy<Value = u64> {
        prop_oneof![0..=max, Just(max.saturating_add(1)), Just(u64::MAX)]
    }

    fn op(tokens: u64, requests: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (small(tokens), small(requests), 0..3u8, (0..tokens, 0..requests))
                .prop_map(|(t, r, how, reserved)| Op::Ask(t, r, how, reserved)),
            2 => (small(tokens), small(requests)).prop_map(|(t, r)| Op::Give(t, r)),
            4 => nanos().prop_map(Op::Advance),
            1 => (1..=tokens.saturating_mul(2), 1..=requests.saturating_mul(2))
                .prop_map(|(t, r)| Op::SetConfig(t, r)),
            1 => prop_oneof![0..4u32, Just(u32::MAX)].prop_map(Op::Backpressure),
            2 => Just(Op::Success),
            1 => Just(Op::Levels),
        ]
    }

    /// Budgets: small and awkward ones (a token not a whole number of nanoseconds), and some
    /// near the top of the range, where the levels need all of their 128 bits.
    fn budgets() -> impl Strategy<Value = (u64, u64)> {
        prop_oneof![
            (1..2_000u64, 1..15u64),
            (1..200_000u64, 1..20_000u64),
            Just((90_000, 7)),
            Just((u64::MAX / 4, u64::MAX / 4)),
            Just((u64::MAX, u64::MAX)),
        ]
    }

    fn counting_wake() -> (Arc<AtomicUsize>, WakeFn) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let wake: WakeFn = Arc::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        (calls, wake)
    }

    /// The same answer, comparing a refusal by its kind (the reference does not word it).
    fn same(bucket: &Answer, reference: &Answer) -> bool {
        match (bucket, reference) {
            (Answer::Taken, Answer::Taken) => true,
            (Answer::NotNow(a), Answer::NotNow(b)) => a == b,
            (Answer::Never(a), Answer::Never(b)) => a.kind() == b.kind(),
            _ => false,
        }
    }

    fn run(budget: (u64, u64), ops: Vec<Op>) -> Result<(), TestCaseError> {
        let clock = FakeClock::new();
        clock.advance(Duration::from_nanos(1_234_567));
        let config = TokenBucketConfig::new(budget.0, budget.1);
        let bucket = TokenBucket::new("gpt", config, clock.shared()).unwrap();
        let reference = Reference::new(config, clock.now());
        let (wakes, wake) = counting_wake();
        bucket.on_capacity_change(Some(wake));
        let mut expected_wakes = 0;
        for op in ops {
            let now = clock.now();
            match op {
                Op::Ask(tokens, requests, how, reserved) => {
                    let mine = Amount::pair(tokens, requests);
                    let ask = match how {
                        0 => Ask::HEAD,
                        1 => Ask::HEAD.look(),
                        _ => Ask::behind(Amount::pair(reserved.0, reserved.1)),
                    };
                    let got = bucket.ask(mine, ask);
                    let want = reference.ask(mine, ask, now);
                    prop_assert!(
                        same(&got, &want),
                        "{:?} {:?}: {:?} vs {:?}",
                        mine,
                        ask,
                        got,
                        want
                    );
                }
                Op::Give(tokens, requests) => {
                    let amount = Amount::pair(tokens, requests);
                    bucket.give(amount);
                    expected_wakes += usize::from(reference.give(amount));
                }
                Op::Advance(nanos) => clock.advance(Duration::from_nanos(nanos)),
                Op::SetConfig(tokens, requests) => {
                    let config = TokenBucketConfig::new(tokens, requests);
                    bucket.set_config(config).unwrap();
                    expected_wakes += usize::from(reference.set_config(config, now));
                }
                Op::Backpressure(increments) => {
                    bucket.record_backpressure(increments);
                    expected_wakes += usize::from(reference.record_backpressure(increments, now));
                }
                Op::Success => {
                    bucket.record_success();
                    expected_wakes += usize::from(reference.record_success(now));
                }
                Op::Levels => prop_assert_eq!(
                    (bucket.level(), bucket.requests_available()),
                    reference.levels(now)
                ),
            }
            prop_assert_eq!(bucket.config(), reference.config());
            prop_assert_eq!(bucket.throttle(), reference.throttle());
            prop_assert_eq!(wakes.load(Ordering::SeqCst), expected_wakes);
        }
        let now = clock.now();
        prop_assert_eq!(
            (bucket.level(), bucket.requests_available()),
            reference.levels(now)
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1_000, .. ProptestConfig::default() })]

        /// The bucket grants, refuses, defers to the same instant, wakes and reports exactly as
        /// the bucket before it did, whatever the sequence of takes, looks, reservations, gives,
        /// clock steps, budget changes and throttle signals.
        #[test]
        fn the_bucket_answers_exactly_as_the_old_one(
            (budget, ops) in budgets().prop_flat_map(|(tokens, requests)| {
                (Just((tokens, requests)), proptest::collection::vec(op(tokens, requests), 1..80))
            })
        ) {
            run(budget, ops)?;
        }
    }
}
