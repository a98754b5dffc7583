//! [`TokenBucket`]: a model's tokens and requests per minute, clocked, with an adaptive throttle.
//!
//! The bucket is the Generic Cell Rate Algorithm's continuous form: no thread refills it. Each
//! time it is read, the level becomes the stored level plus what the rate produced since the last
//! read, capped at the budget, and the instant a shortfall closes is computed rather than polled
//! for (the instant of an [`Answer::NotNow`]), so the monitor sleeps exactly until then. One
//! [`Account::ask`] settles, checks and debits in one step at the moment of the grant, which
//! is also the moment the call is sent, so the local level charges the same minute the
//! provider's quota does.
//!
//! That step holds the bucket's one lock (`cells.rs`, which also says why the exact levels cannot
//! be moved by one compare-and-swap instead) for arithmetic only: a take reads the clock before it
//! takes the lock, then reads only the budgets, the throttle and the levels, and writes back only
//! the levels; budget and throttle changes take the same lock and rewrite the whole state.
//!
//! An [`Amount`] asks two things of a bucket: dimension 0 is tokens, dimension 1 is requests
//! (`Amount::pair(tokens, 1)` for one call). Both refill continuously at their per-minute rate
//! and both must be there for a take; the later of the two decides the deadline.
//!
//! # Never and not now
//!
//! A demand for more tokens than the budget or more requests than the per-minute budget can
//! never fit: [`ask`](Account::ask) answers [`Answer::Never`] with a
//! [`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge) naming the demand and both
//! budgets. That is judged against the budgets in force at each ask, so lowering a budget under
//! an amount already waiting refuses it at the next ask, which
//! [`set_config`](TokenBucket::set_config) makes happen at once by calling the wake slot. An
//! amount that fits the budgets but not the levels now (beside the head's reservation) is
//! [`Answer::NotNow`] with the instant the refill makes room, or with `None` when only the
//! reservation makes it more than a full bucket. Dimensions 2 and 3 of an amount are ignored.
//!
//! # The adaptive throttle
//!
//! Rate-limit signals from the upstream slow the refill: [`record_429`](TokenBucket::record_429)
//! and [`record_backpressure`](TokenBucket::record_backpressure) raise the throttle by
//! 0.5 per increment up to 9.0 (refills then run at a tenth of the configured rate);
//! [`record_success`](TokenBucket::record_success) lowers it (0.2 every third success, or 0.5
//! per success once five minutes have passed without backpressure). Lowering calls the wake slot; raising never does: a deadline
//! computed at the faster rate merely has the monitor look again a little early.
//!
//!
//! Levels are integers (see `level.rs`); the throttle is counted in tenths (see `throttle.rs`).

mod cells;
mod level;
#[cfg(test)]
mod reference;
mod status;
mod throttle;

pub use status::TokenBucketStatus;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Clock, Instant, Refusal, Replenishment,
    SystemClock, WakeFn, WakeSlot,
};

use crate::ConfigError;
use cells::{Cells, Locked};
use level::Level;
use throttle::Throttle;

/// The family name used in configuration errors.
const LIMITER: &str = "token bucket";

/// A token bucket's limits: its token budget and its request budget, both per minute.
///
/// The bucket holds at most one minute's worth of each, and refills each continuously at its
/// rate. Both must be positive ([`TokenBucketConfig::validate`]).
///
/// # Examples
///
/// ```
/// use admission_accounts::token_bucket::TokenBucketConfig;
///
/// let config = TokenBucketConfig::new(90_000, 60);
/// assert!(config.validate().is_ok());
/// let refused = TokenBucketConfig::new(90_000, 0).validate().unwrap_err();
/// assert_eq!(refused.field, "requests_per_minute");
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenBucketConfig {
    /// Tokens per minute: the budget (the most the bucket holds) and the refill rate.
    pub tokens_per_minute: u64,
    /// Requests per minute: the request budget and its refill rate.
    pub requests_per_minute: u64,
}

impl TokenBucketConfig {
    /// A configuration of `tokens_per_minute` and `requests_per_minute`.
    pub const fn new(tokens_per_minute: u64, requests_per_minute: u64) -> TokenBucketConfig {
        TokenBucketConfig {
            tokens_per_minute,
            requests_per_minute,
        }
    }

    /// True when `want` is more than the budgets could ever hold.
    #[inline]
    fn exceeded_by(&self, want: Amount) -> bool {
        want.get(TOKENS) > self.tokens_per_minute || want.get(REQUESTS) > self.requests_per_minute
    }

    /// Checks that both budgets are positive.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `tokens_per_minute` or `requests_per_minute`, whichever is zero
    /// (the first if both are).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("tokens_per_minute", self.tokens_per_minute),
            ("requests_per_minute", self.requests_per_minute),
        ] {
            if value == 0 {
                return Err(ConfigError::new(
                    LIMITER,
                    field,
                    "must be positive, was 0 (the bucket would never hold a call)",
                ));
            }
        }
        Ok(())
    }
}

/// Everything that moves, kept together under the bucket's one lock (its words are in
/// `cells.rs`).
#[derive(Clone, Copy, Debug)]
struct State {
    /// The budgets; changed only by `set_config`, which settles the levels first.
    config: TokenBucketConfig,
    /// The levels and the instant they were settled at.
    levels: Levels,
    /// The adaptive throttle. Changed only after the levels are settled at the old rate, so
    /// time already passed is credited at the rate that was in force.
    throttle: Throttle,
}

impl State {
    /// Brings both levels up to `now` at the configured rates, stretched by the throttle.
    fn settle(&mut self, now: Instant) {
        self.levels.settle(now, self.config, self.throttle.tenths());
    }
}

/// The two levels and when they were last brought up to date: all that a take reads besides the
/// budgets and the throttle, and all that it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Levels {
    /// Tokens available as of `settled_at`; never above `config.tokens_per_minute` tokens.
    tokens: Level,
    /// Requests available as of `settled_at`; never above `config.requests_per_minute`.
    requests: Level,
    /// The instant the levels were last brought up to date; never goes backwards.
    settled_at: Instant,
}

impl Levels {
    /// Brings both levels up to `now` at `config`'s rates, stretched by a throttle of `tenths`.
    ///
    /// Settling is invisible: settling at any instants in between and then at `now` ends where
    /// settling at `now` alone does (`level.rs`), so a caller may settle, or not, whenever it
    /// reads.
    #[inline]
    fn settle(&mut self, now: Instant, config: TokenBucketConfig, tenths: u32) {
        let elapsed = now.as_nanos().saturating_sub(self.settled_at.as_nanos());
        let TokenBucketConfig {
            tokens_per_minute: tpm,
            requests_per_minute: rpm,
        } = config;
        self.tokens.refill(elapsed, tpm, tenths, tpm);
        self.requests.refill(elapsed, rpm, tenths, rpm);
        self.settled_at = self.settled_at.max(now);
    }

    /// True when `want` (tokens, requests) is available now.
    #[inline]
    fn holds(&self, want: Amount) -> bool {
        self.tokens.holds(want.get(TOKENS)) && self.requests.holds(want.get(REQUESTS))
    }

    /// The instant the refill alone makes both levels hold `want` (the later of the two) at
    /// `config`'s rates under a throttle of `tenths`; `None` when `want` is more than a full
    /// bucket, which time alone never makes room for.
    ///
    /// Kept out of line: its divisions would crowd the registers of the take's path.
    #[inline(never)]
    fn holds_at(&self, want: Amount, config: TokenBucketConfig, tenths: u32) -> Option<Instant> {
        if config.exceeded_by(want) {
            return None;
        }
        let TokenBucketConfig {
            tokens_per_minute,
            requests_per_minute,
        } = config;
        let wait = self
            .tokens
            .nanos_until(want.get(TOKENS), tokens_per_minute, tenths)
            .max(
                self.requests
                    .nanos_until(want.get(REQUESTS), requests_per_minute, tenths),
            );
        Some(self.settled_at.saturating_add(Duration::from_nanos(wait)))
    }

    /// A throttle change: the pending fractions counted in the old divisor are dropped.
    fn throttle_changed(&mut self) {
        self.tokens.forget_fraction();
        self.requests.forget_fraction();
    }
}

/// The dimension of an [`Amount`] that counts tokens.
pub const TOKENS: usize = 0;
/// The dimension of an [`Amount`] that counts requests.
pub const REQUESTS: usize = 1;

/// A clocked token bucket of tokens and requests per minute, as an [`Account`].
///
/// # The level
///
/// Each dimension (tokens in [`TOKENS`], requests in [`REQUESTS`]) starts full at its
/// per-minute budget and refills continuously at `budget / minute / (1 + throttle)`. The level is
/// computed from the clock whenever the bucket is asked; nothing runs in between. Levels are kept
/// in integer fractions of a token, so no rounding accumulates: 100 tokens short at 6,000 a
/// minute is a wait of exactly one second, one request short at 2 a minute exactly thirty.
///
/// # Fairness
///
/// The bucket is not a queue: an ask debits now or answers "not now". The monitor's one line
/// decides who is asked first, and [`Ask::reserved_ahead`] keeps the head's amount aside.
///
/// # Panics
///
/// Never: all arithmetic saturates, whatever the amounts, budgets or clock readings.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
/// use admission_core::{Account, Amount, Answer, Ask, Instant, RefusalKind};
/// use admission_testkit::FakeClock;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::new();
/// let bucket = TokenBucket::new("gpt", TokenBucketConfig::new(6_000, 60), clock.shared())?;
///
/// let call = Amount::pair(5_900, 1); // 5,900 tokens and one request
/// assert!(matches!(bucket.ask(call, Ask::HEAD), Answer::Taken));
/// assert_eq!(bucket.level(), 100);
///
/// // 200 more tokens are 100 short: at 6,000 a minute that is one second.
/// let next = Amount::pair(200, 1);
/// let one_s = Instant::from_nanos(1_000_000_000);
/// assert_eq!(bucket.ask(next, Ask::HEAD.look()).not_now(), Some(Some(one_s)));
///
/// // Two 429s double the wait.
/// bucket.record_429();
/// bucket.record_429();
/// assert_eq!(bucket.status_indicator().as_deref(), Some("throttle:2.0x"));
/// let two_s = Instant::from_nanos(2_000_000_000);
/// assert_eq!(bucket.ask(next, Ask::HEAD).not_now(), Some(Some(two_s)));
///
/// clock.advance(Duration::from_secs(2));
/// assert!(matches!(bucket.ask(next, Ask::HEAD), Answer::Taken));
///
/// // More than a minute's budget is never granted.
/// let never = bucket.ask(Amount::pair(6_001, 1), Ask::HEAD);
/// assert_eq!(
///     never.refusal().map(|r| r.kind()),
///     Some(RefusalKind::TooLarge { asked: Amount::pair(6_001, 1), max: Amount::pair(6_000, 60) })
/// );
/// # Ok(())
/// # }
/// ```
pub struct TokenBucket {
    /// The name events and statuses carry (usually the model's).
    name: String,
    /// The only source of time.
    clock: Arc<dyn Clock>,
    /// Levels, budgets and throttle, in atomic words only touched under their lock, so a check
    /// and its debit, or a budget change and its clamp, are each one step.
    state: Cells,
    /// The monitor's wake-up: called on a give, a relaxed throttle and a budget change.
    wake: WakeSlot,
}

impl TokenBucket {
    /// The category this family reports: a clocked token bucket.
    pub const CATEGORY: Category = Category::custom("token_bucket");

    /// A full bucket named `name` with `config`'s budgets, reading time from `clock`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when a budget is zero ([`TokenBucketConfig::validate`]).
    pub fn new(
        name: impl Into<String>,
        config: TokenBucketConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<TokenBucket, ConfigError> {
        config.validate()?;
        let now = clock.now();
        Ok(TokenBucket {
            name: name.into(),
            clock,
            state: Cells::new(&State {
                config,
                levels: Levels {
                    tokens: Level::full(config.tokens_per_minute),
                    requests: Level::full(config.requests_per_minute),
                    settled_at: now,
                },
                throttle: Throttle::default(),
            }),
            wake: WakeSlot::new(),
        })
    }

    /// A full bucket on the operating system's clock, counting from now.
    ///
    /// The bucket only compares its own readings, so its clock need not be the monitor's; the
    /// instant of an [`Answer::NotNow`] is on this clock's scale, though, so a bucket that
    /// sits in a monitor's demands should share the monitor's clock ([`TokenBucket::new`] with
    /// `monitor.clock().clone()`).
    ///
    /// # Errors
    ///
    /// As [`TokenBucket::new`].
    pub fn on_system_clock(
        name: impl Into<String>,
        config: TokenBucketConfig,
    ) -> Result<TokenBucket, ConfigError> {
        TokenBucket::new(name, config, Arc::new(SystemClock::new()))
    }

    /// The bucket's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The budgets in force.
    pub fn config(&self) -> TokenBucketConfig {
        self.state.hold().config()
    }

    /// Whole tokens available now, read from the clock.
    pub fn level(&self) -> u64 {
        self.settled().levels.tokens.whole()
    }

    /// Whole request slots available now, read from the clock.
    pub fn requests_available(&self) -> u64 {
        self.settled().levels.requests.whole()
    }

    /// The adaptive throttle: zero when healthy; refills run at the configured rate divided by
    /// `1 + throttle`.
    pub fn throttle(&self) -> f64 {
        self.state.lock().throttle.value()
    }

    /// Replaces the budgets in place.
    ///
    /// The levels are first brought up to now at the old rates; a budget that shrank lowers its
    /// level to the new budget; the throttle is kept. Any change calls the wake slot: after a
    /// budget grew the monitor recomputes its deadlines at the faster rate, and after one shrank
    /// it refuses at once a parked demand that the new budget can never hold. The same budgets
    /// again change nothing and call nothing.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when a budget is zero; the bucket is then left as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let bucket = TokenBucket::on_system_clock("gpt", TokenBucketConfig::new(10_000, 60))?;
    /// bucket.set_config(TokenBucketConfig::new(4_000, 60))?;
    /// assert_eq!(bucket.level(), 4_000);
    /// assert!(bucket.set_config(TokenBucketConfig::new(0, 60)).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_config(&self, config: TokenBucketConfig) -> Result<(), ConfigError> {
        config.validate()?;
        let now = self.clock.now();
        {
            let mut state = self.state.lock();
            if state.config == config {
                return Ok(());
            }
            state.settle(now);
            state.config = config;
            state.levels.tokens.clamp(config.tokens_per_minute);
            state.levels.requests.clamp(config.requests_per_minute);
        }
        // Either way the monitor must ask again: a larger budget refills faster (earlier
        // deadlines), a smaller one may make a parked amount one that can never fit, which is
        // refused now rather than at the deadline computed under the old budget.
        self.wake.notify();
        Ok(())
    }

    /// The upstream answered 429 (too many requests): one backpressure increment,
    /// 0.5 more throttle. Never calls the wake slot.
    pub fn record_429(&self) {
        self.record_backpressure(1);
    }

    /// The upstream asked the fleet to yield with weight `increments`: the throttle rises by
    /// `increments` x 0.5, up to 9.0.
    ///
    /// The caller weighs the signal by how hard it asks: say 3 for an explicit overload status,
    /// 1 for a 429, and 0 for a plain server error, which says nothing about load. Zero is no
    /// signal at all: it changes nothing and does not restart the quiet period. Any positive
    /// weight restarts both the quiet period and the count of successes towards the next
    /// relief. Never calls the wake slot.
    pub fn record_backpressure(&self, increments: u32) {
        if increments == 0 {
            return;
        }
        let now = self.clock.now();
        let mut state = self.state.lock();
        state.settle(now);
        if state.throttle.tighten(increments, now) {
            state.levels.throttle_changed();
        }
    }

    /// A call succeeded: relieves the throttle by the rule in the type's docs.
    ///
    /// On a healthy bucket (throttle zero) this does nothing. While backpressure is recent,
    /// every third success takes 0.2 off; once five minutes have passed since the last
    /// backpressure, every success takes 0.5 off; never below zero. Each relief calls the wake slot.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let bucket = TokenBucket::on_system_clock("gpt", TokenBucketConfig::new(10_000, 60))?;
    /// bucket.record_backpressure(3); // an overload signal, weighted 3
    /// assert_eq!(bucket.throttle(), 1.5);
    /// for _ in 0..3 {
    ///     bucket.record_success();
    /// }
    /// assert_eq!(bucket.throttle(), 1.3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn record_success(&self) {
        let now = self.clock.now();
        let relaxed = {
            let mut state = self.state.lock();
            if state.throttle.tenths() == 0 {
                return;
            }
            state.settle(now);
            let relaxed = state.throttle.relieve(now);
            if relaxed {
                state.levels.throttle_changed();
            }
            relaxed
        };
        if relaxed {
            self.wake.notify();
        }
    }

    /// The status record, typed (what [`Account::status`] boxes), with the levels read from the
    /// clock at this instant.
    pub fn token_status(&self) -> TokenBucketStatus {
        // Copied out, so the lock is not held while the name is cloned.
        let state: State = *self.settled();
        TokenBucketStatus {
            name: self.name.clone(),
            capacity: state.config.tokens_per_minute,
            level: state.levels.tokens.whole(),
            requests_per_minute: state.config.requests_per_minute,
            requests_available: state.levels.requests.whole(),
            throttle: state.throttle.value(),
        }
    }

    /// The state, locked and brought up to now.
    ///
    /// The clock is read before the lock is taken, to keep the critical section short; a reading
    /// that another thread has already overtaken settles nothing (the levels never go back).
    fn settled(&self) -> Locked<'_> {
        let now = self.clock.now();
        let mut state = self.state.lock();
        state.settle(now);
        state
    }

    /// The "never" of `mine`, an amount beyond the budgets in force.
    #[cold]
    #[inline(never)]
    fn too_large(&self, config: TokenBucketConfig, mine: Amount) -> Refusal {
        let TokenBucketConfig {
            tokens_per_minute,
            requests_per_minute,
        } = config;
        let max = Amount::pair(tokens_per_minute, requests_per_minute);
        Refusal::too_large(mine, max).with_message(format!(
            "`{}` allows {tokens_per_minute} tokens and {requests_per_minute} requests per \
             minute; a demand of {} tokens and {} requests can never fit: split it into smaller \
             calls or use a model with a larger budget",
            self.name,
            mine.get(TOKENS),
            mine.get(REQUESTS),
        ))
    }
}

impl Account for TokenBucket {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        TokenBucket::CATEGORY
    }

    fn replenishment(&self) -> Replenishment {
        Replenishment::Time
    }

    /// A minute's budgets: the tokens (the primary dimension) and requests the bucket holds full.
    fn capacity(&self) -> Option<Amount> {
        let config = self.config();
        let mut dims = [0; Amount::DIMENSIONS];
        dims[TOKENS] = config.tokens_per_minute;
        dims[REQUESTS] = config.requests_per_minute;
        Some(Amount::from_dimensions(dims))
    }

    /// One lock: `mine` is refused if it exceeds the budgets; otherwise the levels are brought
    /// up to now, then `mine` is taken if both levels hold it beside the head's reservation, or
    /// answered "not now" with the instant the refill makes room.
    ///
    /// Only the words a take moves are read and written: the budgets and the throttle are read,
    /// the levels read, settled, debited and stored.
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let now = ask.now(&*self.clock);
        let mut hold = self.state.hold();
        let config = hold.config();
        if config.exceeded_by(mine) {
            drop(hold);
            return Answer::Never(self.too_large(config, mine));
        }
        let tenths = hold.tenths();
        let mut levels = hold.levels();
        levels.settle(now, config, tenths);
        let want = mine.saturating_add(ask.reserved_ahead());
        let answer = if !levels.holds(want) {
            Answer::NotNow(levels.holds_at(want, config, tenths))
        } else {
            if ask.takes() {
                levels.tokens.take(mine.get(TOKENS));
                levels.requests.take(mine.get(REQUESTS));
            }
            Answer::Taken
        };
        hold.set_levels(&levels);
        answer
    }

    fn give(&self, amount: Amount) {
        let (tokens, requests) = (amount.get(TOKENS), amount.get(REQUESTS));
        if tokens == 0 && requests == 0 {
            return;
        }
        {
            // No clock read: a refill capped at the budget and a credit capped at the budget
            // commute (both end at min(level + refill + credit, budget)), so the credit can land
            // on the stored level and the next read adds the refill.
            let mut hold = self.state.hold();
            let config = hold.config();
            let mut levels = hold.levels();
            levels.tokens.give(tokens, config.tokens_per_minute);
            levels.requests.give(requests, config.requests_per_minute);
            hold.set_levels(&levels);
        }
        self.wake.notify();
    }

    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(self.token_status())
    }

    fn status_indicator(&self) -> Option<String> {
        let throttle = self.state.lock().throttle;
        throttle.indicator()
    }

    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }
    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TokenBucket");
        d.field("name", &self.name);
        // `try_lock`: formatting must never wait, nor deadlock inside a caller holding the lock.
        // Copied out, so the lock is not held while formatting.
        match self.state.try_lock().map(|state| *state) {
            Some(state) => d
                .field("config", &state.config)
                .field("tokens", &state.levels.tokens.whole())
                .field("requests", &state.levels.requests.whole())
                .field("settled_at", &state.levels.settled_at)
                .field("throttle", &state.throttle.value()),
            None => d.field("state", &format_args!("<locked>")),
        };
        d.field("clock", &self.clock)
            .field("wake", &self.wake)
            .finish()
    }
}
